# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A file or directory written only when it differs, saying what changed: the reports, the persistent flow's files
and topology.json (through core/files.py's atomic replace). A run that only applies writes none of them.
"""

from __future__ import annotations

import os
import stat

from ansible_collections.gpunode.tuning.plugins.module_utils.core.files import DIR_MODE, FILE_MODE, replace_file


class ReportError(Exception):
    """A directory or file (a report, a persistent flow's file) that cannot be written; the message names the path."""


def plan_file(path: str, data: bytes, mode: int = FILE_MODE, what: str = "report") -> str | None:
    """What writing ``data`` to ``path`` would change: "created", "updated", "mode" or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "created"
    except OSError as exc:
        raise ReportError("cannot read %s %s: %s" % (what, path, exc.strerror)) from exc
    if not stat.S_ISREG(st.st_mode):
        raise ReportError("%s %s exists and is not a regular file" % (what, path))
    if st.st_size != len(data) or _read(path, what) != data:
        return "updated"
    if stat.S_IMODE(st.st_mode) != mode:
        return "mode"
    return None


def _read(path, what="report"):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise ReportError("cannot read %s %s: %s" % (what, path, exc.strerror)) from exc


def ensure_dir(path: str, check_mode: bool = False, what: str = "report directory") -> bool:
    """Create the report directory (and its parents) unless it exists; True when it was (or would be) created."""
    if os.path.isdir(path):
        return False
    if os.path.exists(path):
        raise ReportError("%s %s exists and is not a directory" % (what, path))
    if not check_mode:
        try:
            os.makedirs(path, mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise ReportError("cannot create %s %s: %s" % (what, path, exc.strerror)) from exc
    return True


def write_file(path: str, data: bytes, check_mode: bool = False, mode: int = FILE_MODE,
               what: str = "report", fsync: bool = False) -> str | None:
    """Write ``data`` to ``path`` atomically when it differs; return plan_file's verdict (None: untouched)."""
    change = plan_file(path, data, mode, what)
    if change is None or check_mode:
        return change
    if change == "mode":
        _chmod(path, mode, what)
        return change
    try:
        replace_file(path, data, mode, fsync=fsync)
    except OSError as exc:
        raise ReportError("cannot write %s %s: %s" % (what, path, exc.strerror)) from exc
    return change


def _chmod(path, mode, what="report"):
    try:
        os.chmod(path, mode)
    except OSError as exc:
        raise ReportError("cannot set the mode of %s %s: %s" % (what, path, exc.strerror)) from exc
