# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Report files on the controller: written whole or not at all, and only when their content changes.

Used by the action plugin gpunode.tuning.verify_reports, which renders the verification reports
and hands the text here. Plain Python, no Ansible import: the writing is tested without a play.
A report is replaced by rename from a temporary file in the same directory, so a reader (a CI job
collecting the JUnit files, a second run) never sees half a report; an unchanged report is not
rewritten, so reruns report nothing changed and keep the file's timestamp.
"""

from __future__ import annotations

import os
import stat
import tempfile

FILE_MODE = 0o644
DIR_MODE = 0o755


class ReportError(Exception):
    """A report directory or file that cannot be written; the message names the path."""


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
               what: str = "report") -> str | None:
    """Write ``data`` to ``path`` atomically when it differs; return plan_file's verdict (None: untouched)."""
    change = plan_file(path, data, mode, what)
    if change is None or check_mode:
        return change
    if change == "mode":
        _chmod(path, mode, what)
        return change
    directory = os.path.dirname(path) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    except OSError as exc:
        raise ReportError("cannot write %s %s: %s" % (what, path, exc.strerror)) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)  # mkstemp creates 0600: reports are for everyone who reads the directory
        os.replace(tmp, path)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise ReportError("cannot write %s %s: %s" % (what, path, exc.strerror)) from exc
    return change


def _chmod(path, mode, what="report"):
    try:
        os.chmod(path, mode)
    except OSError as exc:
        raise ReportError("cannot set the mode of %s %s: %s" % (what, path, exc.strerror)) from exc


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass  # already gone; the write's own error is the one to report
