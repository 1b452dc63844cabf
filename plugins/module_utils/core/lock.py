# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One lock per node, taken by every flow that writes: runtime, persistent, rollback, the boot runner
and the guard's re-apply, around their writes and the journal.

How it works and why: docs/dev/node-code.md, "core/lock.py".
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from typing import Callable, Iterable

DEFAULT_TIMEOUT = 60.0  # seconds a second writer waits before it fails naming the holder
POLL_INTERVAL = 0.2  # seconds between two tries while waiting
FLOW_NAME_LIMIT = 64
# (pid, lock path) -> the outermost NodeLock this process holds on it (nested takes reuse it).
_HELD: dict = {}


class LockError(Exception):
    """The lock cannot be used: a bad path or flow name, or a directory or file that cannot be made."""


class LockTimeout(LockError):
    """Another writer held the lock for the whole wait; ``holder`` is its record (None when unknown)."""

    def __init__(self, message: str, path: str, holder: dict | None, waited: float):
        super().__init__(message)
        self.path, self.holder, self.waited = path, holder, waited


# -- Paths and the holder record


def next_to(journal_path: str, name: str = ".lock") -> str:
    """The lock file beside a journal whose full path is ``journal_path``."""
    return os.path.join(os.path.dirname(journal_path), name)


def holder_record(flow: str, clock: Callable[[], float] = time.time) -> dict:
    """The record the holder writes: flow, pid, host, start time (UTC, and seconds since the epoch)."""
    now = clock()
    return {"flow": flow, "pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "since": now}


# -- The lock


def _checked(flow: str, timeout: float, poll: float) -> None:
    if not isinstance(flow, str) or not flow or len(flow) > FLOW_NAME_LIMIT \
            or any(ord(c) < 32 or ord(c) == 127 for c in flow):
        raise LockError("the flow name must be 1 to %d printable characters, got %r" % (FLOW_NAME_LIMIT, flow))
    for name, value, low in (("timeout", timeout, 0), ("poll", poll, 1e-3)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
            raise LockError("the lock's %s must be a number of seconds >= %s, got %r" % (name, low, value))


class NodeLock:
    """The node's lock, for one flow; a context manager (``with NodeLock(path, "persistent"): ...``)."""

    def __init__(self, path: str, flow: str, timeout: float = DEFAULT_TIMEOUT, poll: float = POLL_INTERVAL,
                 on_wait: Callable[[dict | None], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        _checked(flow, timeout, poll)
        self.path, self.flow, self.timeout, self.poll = os.path.abspath(path), flow, float(timeout), float(poll)
        self.on_wait, self.clock, self.sleep = on_wait, clock, sleep
        self.held, self.nested, self.waited = False, False, 0.0
        self.created: list = []
        self.record: dict | None = None
        self._remove: list = []
        self._fd: int | None = None
        self._outer: NodeLock | None = None

    def __enter__(self) -> NodeLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> NodeLock:
        """Take the lock, waiting up to ``timeout``; LockTimeout naming the holder when it stays taken."""
        if self.held:
            return self
        outer = _HELD.get((os.getpid(), self.path))
        if outer is not None:
            self.held, self.nested, self.record, self._outer = True, True, outer.record, outer
            return self
        start, told = self.clock(), False
        while True:
            fd = self._open()
            state = self._try(fd)
            if state == "taken":
                break
            os.close(fd)
            self.waited = self.clock() - start
            if self.waited >= self.timeout:
                raise self._timeout()
            if state == "stale":
                continue  # the holder unlinked that file on release: open (or make) the new one at once
            if not told and self.on_wait is not None:
                told = True
                from ansible_collections.gpunode.tuning.plugins.module_utils.core import lock_holder

                self.on_wait(lock_holder.read_holder(self.path))
            self.sleep(min(self.poll, self.timeout - self.waited))
        self.waited, self._fd, self.held = self.clock() - start, fd, True
        _HELD[(os.getpid(), self.path)] = self
        self._write_record()
        return self

    def _open(self) -> int:
        """The lock file, opened (created 0600 when missing, with the missing directories above it)."""
        for _attempt in range(10):  # a releasing holder may remove the directory between our mkdir and open
            self._make_directories()
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise self._error("cannot open the lock file", self.path, exc) from None
        raise LockError("cannot open the lock file %s: its directory keeps disappearing" % self.path)

    def _make_directories(self) -> None:
        missing, directory = [], os.path.dirname(self.path)
        while directory and not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for directory in reversed(missing):
            try:
                os.mkdir(directory, 0o700 if directory == os.path.dirname(self.path) else 0o755)
            except FileExistsError:
                continue  # another writer made it first: not ours
            except OSError as exc:
                raise self._error("cannot create the lock's directory", directory, exc) from None
            if directory not in self.created:
                self.created.append(directory)

    def _try(self, fd: int) -> str:
        """``taken`` (the flock, on the file the path still names), ``busy`` or ``stale`` (unlinked file)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "busy"
        except OSError as exc:
            os.close(fd)
            raise self._error("cannot lock", self.path, exc) from None
        return "taken" if _same_file(fd, self.path) else "stale"

    def _write_record(self) -> None:
        """The holder record, in place (a rename would replace the file others lock); information only."""
        self.record = holder_record(self.flow)
        data = (json.dumps(self.record, sort_keys=True) + "\n").encode("utf-8")
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
        except OSError:
            pass  # a full disk: the lock holds all the same; messages then say the holder is unknown

    def _timeout(self) -> LockTimeout:
        from ansible_collections.gpunode.tuning.plugins.module_utils.core import lock_holder

        holder = lock_holder.read_holder(self.path)
        message = ("the node lock %s is held by %s; this %s run waited %.1f s for it and stops before writing "
                   "anything: run it again when that run has finished"
                   % (self.path, lock_holder.holder_text(holder), self.flow, self.waited))
        self._remove_directories(self.created)  # only those we made and left empty
        return LockTimeout(message, self.path, holder, self.waited)

    @staticmethod
    def _error(what: str, path: str, exc: OSError) -> LockError:
        return LockError("%s %s: %s (errno %s)" % (what, path, exc.strerror or exc,
                                                   errno.errorcode.get(exc.errno, exc.errno)))

    def remove_on_release(self, directories: Iterable[str]) -> None:
        """Also remove these directories on release (deepest first, only when empty): rollback hands over those its
        journal recorded as ours."""
        target = self._outer if self.nested else self
        for directory in directories:
            directory = os.path.abspath(directory)
            if not self.path.startswith(directory.rstrip("/") + "/"):
                raise LockError("%s is not a directory above the lock file %s; not removed" % (directory, self.path))
            if directory not in target._remove:
                target._remove.append(directory)

    def release(self) -> None:
        """Let the lock go: the lock file unlinked, our empty directories removed, then the flock dropped."""
        if not self.held:
            return
        self.held = False
        if self.nested:
            return
        try:
            if _same_file(self._fd, self.path):
                try:
                    os.unlink(self.path)
                except OSError:
                    pass  # it stays; the next writer takes it over
            self._remove_directories(self.created + self._remove)
        finally:
            os.close(self._fd)
            self._fd = None
            _HELD.pop((os.getpid(), self.path), None)

    @staticmethod
    def _remove_directories(directories: list) -> None:
        for directory in sorted(set(directories), key=len, reverse=True):
            try:
                os.rmdir(directory)
            except OSError:
                continue  # not empty (the journal is there), or already gone: it stays


def _same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
