# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's one lock around a writing flow, and the directories its writes created.

How it works and why: docs/dev/node-code.md, "flows/writers.py".
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from ansible_collections.gpunode.tuning.plugins.module_utils.core import journal as journal_mod
from ansible_collections.gpunode.tuning.plugins.module_utils.core import lock
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError

DEFAULT_JOURNAL = journal_mod.DEFAULT_JOURNAL


def lock_file(node: Node, journal: str | None = None) -> str:
    """The lock's full path: ``.lock`` next to the journal (``journal``: its path on the node)."""
    try:
        return lock.next_to(journal_mod.resolve_path(node, journal or DEFAULT_JOURNAL))
    except NodeError as exc:
        raise lock.LockError(str(exc)) from None


class Writing:
    """What a writing flow hands back to ``writing``: directories its writes created (full paths)."""

    def __init__(self, held: lock.NodeLock | None):
        self.lock = held
        self.created: list = []

    def note_created(self, full_paths) -> None:
        self.created += [p for p in full_paths if p not in self.created]


def _open(node: Node, journal: str | None):
    try:
        return journal_mod.Journal(node, journal or DEFAULT_JOURNAL)
    except NodeError:
        return None  # unreadable: the families that use it say so, and nothing is recorded in it


def finish(node: Node, journal: str | None, writing: Writing) -> list:
    """Record the created directories in the journal, and remove the recorded ones that are empty now (nothing of ours
    left in them: rollback, or a concern turned off); the node paths removed."""
    jr = _open(node, journal)
    if jr is None:
        return []
    created = (writing.lock.created if writing.lock is not None else []) + writing.created
    jr.record_dirs([d for d in created if os.path.isdir(d)])
    own = set(jr.own_dirs())
    removed = journal_mod.remove_empty_dirs(node, [d for d in jr.created_dirs() if d not in own])
    jr.forget_dirs(removed + [d for d in jr.created_dirs() if d not in own and not os.path.isdir(node.path(d))])
    jr.save()
    return removed


@contextmanager
def writing(node: Node, journal: str | None, flow: str, check_mode: bool = False,
            timeout: float | None = None) -> Iterator[Writing]:
    """``with writing(node, journal, "persistent", check_mode) as w:`` the flow's writes (module docstring);
    ``timeout`` None: ``lock.DEFAULT_TIMEOUT``."""
    timeout = lock.DEFAULT_TIMEOUT if timeout is None else timeout
    if check_mode:  # check mode takes nothing and creates nothing
        yield Writing(None)
        return
    held = lock.NodeLock(lock_file(node, journal), flow, timeout=timeout).acquire()
    try:
        jr = _open(node, journal)
        if jr is not None and not held.nested:
            # The journal's own directories, as recorded now: if the journal goes in this run (a rollback),
            # they go when the lock is released, empty.
            ancestors = [node.path(d) for d in jr.removed_with_it()]
            held.remove_on_release([d for d in ancestors if held.path.startswith(d.rstrip("/") + "/")])
        out = Writing(held)
        try:
            yield out
        finally:
            finish(node, journal, out)
    finally:
        held.release()
