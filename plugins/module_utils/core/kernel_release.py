# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A kernel release as numbers (``5.15.0-91-generic`` -> ``(5, 15, 0)``): what a run that applies needs of
core/platform.py, which imports it from here."""

from __future__ import annotations

import re


def parse_release(text: str | None) -> tuple | None:
    """``(major, minor, patch)`` of a kernel release such as ``5.15.0-91-generic``; None when it has none."""
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def release_text(release: tuple | None) -> str:
    return "%d.%d" % release[:2] if release else "unknown"
