# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who holds the node's lock, read without taking it, and in words: what a writer that waits for the lock, or gives
up, says (core/lock.py imports it only then, so that a run that finds the lock free does not compile it).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Callable

RECORD_LIMIT = 4096  # bytes of the holder record read back (it is a few dozen)


def read_holder(path: str) -> dict | None:
    """The holder record in the lock file at ``path``, without taking the lock and without creating anything; None when
    there is no file or no readable record."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        data = os.read(fd, RECORD_LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return None
    record["alive"] = _alive(record["pid"]) if record.get("host") == socket.gethostname() else None
    return record


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


def holder_text(holder: dict | None, clock: Callable[[], float] = time.time) -> str:
    """``"the persistent run (pid 4242 on node7, since 2026-11-29T15:00:00Z, 12 s ago)"`` of a record."""
    if not holder:
        return "a run that has not written its record yet"
    ago = ""
    if isinstance(holder.get("since"), (int, float)):
        ago = ", %d s ago" % max(0, round(clock() - holder["since"]))
    stale = "; that process no longer runs" if holder.get("alive") is False else ""
    return "the %s run (pid %s on %s, since %s%s%s)" % (
        holder.get("flow") or "unnamed", holder.get("pid"), holder.get("host") or "an unknown host",
        holder.get("started") or "an unknown time", ago, stale)
