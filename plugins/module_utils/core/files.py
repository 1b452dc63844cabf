# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Atomic file writes: the one writer of every file the collection replaces whole (core/file_updates.py writes
through it only what differs).

How it works and why: docs/dev/node-code.md, "core/files.py".
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Callable

FILE_MODE = 0o644
DIR_MODE = 0o755


def os_error(exc: OSError) -> str:
    """An OSError in words with its errno by name: ``Permission denied (errno EACCES)``."""
    name = errno.errorcode.get(exc.errno, exc.errno) if exc.errno is not None else None
    text = exc.strerror or str(exc)
    return "%s (errno %s)" % (text, name) if name is not None else text


def missing_dirs(directory: str) -> list:
    """The directories ``os.makedirs(directory)`` would create, outermost first (full paths)."""
    out = []
    current = os.path.abspath(directory)
    while not os.path.lexists(current) and os.path.dirname(current) != current:
        out.append(current)
        current = os.path.dirname(current)
    return out[::-1]


def make_dirs(directory: str, mode: int = DIR_MODE, on_created: Callable[[list], None] | None = None) -> list:
    """Create ``directory`` and its missing parents (``mode``); tell ``on_created`` which (full paths, outermost first:
    a writing flow journals them, so that rollback removes them)."""
    missing = missing_dirs(directory)
    if missing:
        os.makedirs(directory, mode=mode, exist_ok=True)
        if on_created is not None:
            on_created(missing)
    return missing


def replace_file(path: str, data: bytes, mode: int = FILE_MODE, fsync: bool = False,
                 move: Callable[[str, str], None] = os.replace) -> None:
    """Replace ``path`` by ``data`` (mode ``mode``) through a temporary file in the same directory."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # mkstemp creates 0600
        move(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if fsync:
        _fsync_directory(directory)


def _fsync_directory(directory):
    """Make a rename in ``directory`` durable; best effort: the file is in place either way, and some
    filesystems (FUSE ones) refuse to fsync a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass  # already gone; the write's own error is the one to report
