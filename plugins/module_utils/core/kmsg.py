# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""/dev/kmsg records parsed (``parse_kmsg``): what a run that applies needs of the kernel log (kmod reads the
records a module load wrote). Filtering, classifying and summarizing them for verification is kernel_log.py.

How it works and why: docs/dev/node-code.md, "core/kmsg.py"."""

from __future__ import annotations

import re
from typing import Iterable

# A newline followed by anything but a well-formed record head, a continuation line (leading
# space), an empty line or the end of the data: a malformed record.
_MALFORMED = re.compile(rb"\n(?![0-9]+,[0-9]+,[0-9]+,[^;\n]*;| |\n|$)")
# A record head; its SEQ and TS_USEC.
_HEAD = re.compile(rb"\n[0-9]+,([0-9]+),([0-9]+),[^;\n]*;")


def _record_regex(levels):
    """Regex of the record heads whose priority may be at one of ``levels``."""
    digits = "".join(str(level) for level in sorted(levels))
    return re.compile(rb"\n([" + digits.encode() + rb"]|[0-9]{2,}),([0-9]+),([0-9]+),[^;\n]*;([^\n]*)")


def parse_kmsg(data: bytes, levels: Iterable[int] | None = None, since_usec: int = 0) -> tuple[list, dict]:
    """Parse kmsg bytes; return ``(records, stats)``."""
    if levels is None:
        levels = frozenset(range(8))
    buf = b"\n" + data if data[:1] != b"\n" else data
    malformed = len(_MALFORMED.findall(buf))
    lines = buf.count(b"\n") - (1 if buf.endswith(b"\n") else 0)
    continuation = buf.count(b"\n ")
    empty = buf.count(b"\n\n")
    total = max(lines - continuation - empty - malformed, 0)
    records = []
    for pri, seq, usec, msg in _record_regex(levels).findall(buf):
        level = int(pri) & 7
        if level not in levels:
            continue
        usec = int(usec)
        if usec < since_usec:
            continue
        records.append((level, usec, int(seq), msg.decode("utf-8", "replace")))
    last_usec = None
    for m in _HEAD.finditer(buf, max(0, len(buf) - 65536)):  # the newest record is near the end
        last_usec = int(m.group(2))
    return records, {"total": total, "malformed": malformed, "selected": len(records), "last_usec": last_usec}
