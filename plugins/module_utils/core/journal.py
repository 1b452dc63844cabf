# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The journal of original values, kept on the node so that tuning can be rolled back.

How it works and why: docs/dev/node-code.md, "core/journal.py".
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import files
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import FamilyError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    Node,
    NodeError,
    format_cpulist,
    parse_cpulist,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.registry_tables import PER_CPU_KEYS

DEFAULT_JOURNAL = "/var/lib/gpunode-tuning/journal.json"
JOURNAL_ARGUMENT_SPEC = dict(
    journal=dict(type="str"),
    restore=dict(type="bool", default=False),
)
VERSION = 1
CREATED_KEY = "created_dirs"
WRITTEN_KEY = "written"


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# Entries whose original is grouped per CPU (value -> cpulist), as record_per_cpu writes them: PER_CPU_KEYS,
# family -> keys (None: every key of the family), generated from the registry (Family.per_cpu).
WHAT_TO_DO = ("move it aside and re-run; the originals it held are lost unless restored by hand (the file "
              "shows them)")


class Journal:
    """Original values of one node. ``path`` is absolute on the node (resolved below the root)."""

    def __init__(self, node: Node, path: str = DEFAULT_JOURNAL):
        self.node = node
        self.path = resolve_path(node, path)
        self.data = {"version": VERSION, "families": {}}
        self.dirty = False
        self.loaded = os.path.exists(self.path)
        if self.loaded:
            self.data = self._load()

    def _load(self):
        """The journal's data after checking its shape; NodeError with the path and what to do otherwise."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise NodeError("journal %s is unreadable (%s); refusing to continue so that recorded originals are "
                            "not lost: %s" % (self.path, exc, WHAT_TO_DO)) from exc
        if isinstance(data, dict) and "version" in data and data["version"] != VERSION:
            raise NodeError("journal %s has version %r; this collection reads version %d: roll back with the "
                            "collection version that wrote it, or %s"
                            % (self.path, data["version"], VERSION, WHAT_TO_DO))
        problem = shape_problem(data)
        if problem:
            raise NodeError("journal %s is valid JSON but not a gpunode.tuning journal (%s); refusing to continue "
                            "so that nothing is written: %s" % (self.path, problem, WHAT_TO_DO))
        return data

    def entries(self, family: str) -> dict:
        """Recorded entries of a family: ``{key: original}``."""
        return {k: v["original"] for k, v in self.data["families"].get(family, {}).items()}

    def has(self, family: str, key: str) -> bool:
        return key in self.data["families"].get(family, {})

    def record(self, family: str, key: str, original: Any) -> bool:
        """Record ``original`` for ``key`` unless an original is already recorded. Returns True if new."""
        fam = self.data["families"].setdefault(family, {})
        if key in fam:
            return False
        fam[key] = {"original": original, "recorded": _now()}
        self.dirty = True
        return True

    def record_per_cpu(self, family: str, key: str, values: dict) -> bool:
        """Record per-CPU originals ``{cpu: value}``, keeping values already recorded for a CPU."""
        fam = self.data["families"].setdefault(family, {})
        entry = fam.get(key)
        known = {}
        if entry:
            for value, cpulist in entry["original"].items():
                for cpu in parse_cpulist(cpulist):
                    known[cpu] = value
        added = False
        for cpu, value in values.items():
            if cpu not in known:
                known[cpu] = str(value)
                added = True
        if not added:
            return False
        grouped = {}
        for cpu, value in known.items():
            grouped.setdefault(value, []).append(cpu)
        fam[key] = {"original": {v: format_cpulist(c) for v, c in sorted(grouped.items())},
                    "recorded": entry.get("recorded", _now()) if entry else _now()}
        self.dirty = True
        return True

    @staticmethod
    def per_cpu(original: dict) -> dict:
        """Expand a grouped per-CPU original into ``{cpu: value}``."""
        out = {}
        for value, cpulist in original.items():
            for cpu in parse_cpulist(cpulist):
                out[cpu] = value
        return out

    def mark_applied(self, family: str) -> None:
        """Note that ``family`` changed the node now (wall clock, boot-relative time and boot id)."""
        try:
            uptime = float(self.node.read("proc/uptime", default="0").split()[0])
        except (IndexError, ValueError):
            uptime = 0.0  # unreadable: the kernel log then counts from boot, which hides nothing
        self.data["last_applied"] = {
            "family": family,
            "time": _now(),
            "uptime": uptime,
            "boot_id": self.node.read("proc/sys/kernel/random/boot_id", default=""),
        }
        self.dirty = True

    def drop(self, family: str, key: str) -> None:
        fam = self.data["families"].get(family, {})
        if key in fam:
            del fam[key]
            if not fam:
                del self.data["families"][family]
            self.dirty = True

    # --- directories we created, files we wrote outside our directories ---

    def node_path(self, full: str) -> str:
        """``/var/lib`` of a full path below the node root."""
        rel = os.path.relpath(os.path.abspath(full), os.path.abspath(self.node.root))
        return "/" if rel == "." else "/" + rel

    def created_dirs(self) -> list:
        """Node paths of the directories our writes created, outermost first."""
        return list(self.data.get(CREATED_KEY) or [])

    def record_dirs(self, full_paths) -> bool:
        """Record directories (full paths below the root) that a write of ours just created; True if new."""
        known = list(self.data.get(CREATED_KEY) or [])
        added = [p for p in (self.node_path(full) for full in full_paths) if p != "/" and p not in known]
        if added:
            self.data[CREATED_KEY] = sorted(known + list(dict.fromkeys(added)), key=lambda p: (p.count("/"), p))
            self.dirty = True
        return bool(added)

    def forget_dirs(self, paths) -> None:
        """Drop node paths from ``created_dirs`` (removed by rollback)."""
        known = self.data.get(CREATED_KEY) or []
        left = [p for p in known if p not in set(paths)]
        if left != known:
            self.data[CREATED_KEY] = left
            self.dirty = True

    def written(self, kind: str) -> list:
        """Node paths of the files of ``kind`` we wrote (``guard_textfile``)."""
        return list((self.data.get(WRITTEN_KEY) or {}).get(kind) or [])

    def record_written(self, kind: str, path: str) -> bool:
        paths = self.data.setdefault(WRITTEN_KEY, {}).setdefault(kind, [])
        if path in paths:
            return False
        paths.append(path)
        self.dirty = True
        return True

    def forget_written(self, kind: str, path: str) -> None:
        written = self.data.get(WRITTEN_KEY) or {}
        if path in written.get(kind, []):
            written[kind].remove(path)
            if not written[kind]:
                del written[kind]
            if not written:
                self.data.pop(WRITTEN_KEY, None)
            self.dirty = True

    def own_dirs(self) -> list:
        """Recorded created directories that hold the journal (its directory and those above it)."""
        return [p for p in self.created_dirs() if self.path.startswith(self.node.path(p).rstrip("/") + "/")]

    def removed_with_it(self) -> list:
        """Node paths of the directories that go (when empty) once the journal is gone: those it recorded as
        holding it."""
        return self.own_dirs()

    def undoes_something(self) -> bool:
        """True while the journal records an original, a written file, or another created directory that exists."""
        if self.data["families"] or any(self.data.get(WRITTEN_KEY) or {}):
            return True
        own = set(self.own_dirs())
        return any(os.path.isdir(self.node.path(p)) for p in self.created_dirs() if p not in own)

    def save(self, check_mode: bool = False) -> bool:
        """Write the journal atomically (0600 in a 0700 directory). Nothing happens in check mode."""
        if check_mode or not self.dirty:
            return False
        directory = os.path.dirname(self.path)
        if not self.undoes_something():
            # Nothing left to restore: the journal (and its marker) goes, with the directories it created
            # when they are empty, so a full rollback leaves nothing of ours behind.
            if os.path.exists(self.path):
                os.unlink(self.path)
            remove_empty_dirs(self.node, self.removed_with_it())
            self.dirty = False
            return True
        if not self.loaded:
            self.data.setdefault(CREATED_KEY, [])  # written by this release: it records what it creates
        if not os.path.isdir(directory):
            self.record_dirs(files.missing_dirs(directory))
            os.makedirs(directory, mode=0o700)
        # Durable: the originals rollback restores live only here.
        files.replace_file(self.path, (json.dumps(self.data, indent=1, sort_keys=True) + "\n").encode("utf-8"),
                           0o600, fsync=True)
        self.dirty = False
        return True


def remove_empty_dirs(node: Node, paths) -> list:
    """Remove these node directories, deepest first, each only when it is an empty directory (not a link); the node
    paths removed."""
    removed = []
    for path in sorted(set(paths), key=lambda p: (-p.count("/"), p)):
        full = node.path(path)
        if path in ("", "/") or os.path.islink(full) or not os.path.isdir(full):
            continue
        try:
            os.rmdir(full)
        except OSError:
            continue
        removed.append(path)
    return removed


def resolve_path(node: Node, path: str) -> str:
    """The journal's full path below the node root; NodeError when ``path`` is not absolute or leaves the root."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise NodeError("journal path must be absolute on the node, got %r" % (path,))
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise NodeError("journal path %r contains a control character; give a path such as %s"
                        % (path, DEFAULT_JOURNAL))
    full = os.path.normpath(node.path(path))
    root = os.path.realpath(node.root)
    for candidate, base in ((full, node.root), (os.path.realpath(full), root)):
        if os.path.commonpath([candidate, base]) != base:
            raise NodeError("journal path %s resolves to %s, outside the node root %s; give a path below the "
                            "root such as %s" % (path, os.path.realpath(full), node.root, DEFAULT_JOURNAL))
    if full == node.root:
        raise NodeError("journal path %s is the node root %s itself; give a file such as %s"
                        % (path, node.root, DEFAULT_JOURNAL))
    return full


def shape_problem(data: Any) -> str | None:
    """What is wrong with the structure of loaded journal data, in words; None when it is a journal."""
    if not isinstance(data, dict):
        return "the top level is a %s, not an object" % type(data).__name__
    if data.get("version") != VERSION:
        return "no \"version\": %d" % VERSION
    families = data.get("families")
    if not isinstance(families, dict):
        return "\"families\" is %s, not an object" % ("missing" if families is None else "a " + type(families).__name__)
    if "last_applied" in data and not isinstance(data["last_applied"], dict):
        return "\"last_applied\" is not an object"
    problem = _undo_problem(data)
    if problem:
        return problem
    created = data.get(CREATED_KEY, [])
    if not isinstance(created, list) or not all(isinstance(p, str) and p.startswith("/") and ".." not in p.split("/")
                                                for p in created):
        return "\"%s\" is not a list of absolute paths" % CREATED_KEY
    written = data.get(WRITTEN_KEY, {})
    if not isinstance(written, dict) or not all(
            isinstance(v, list) and all(isinstance(p, str) and p.startswith("/") and ".." not in p.split("/")
                                        for p in v) for v in written.values()):
        return "\"%s\" is not an object of lists of absolute paths" % WRITTEN_KEY
    for family, entries in families.items():
        if not isinstance(entries, dict):
            return "family %r is a %s, not an object" % (family, type(entries).__name__)
        for key, entry in entries.items():
            problem = _entry_problem(family, key, entry)
            if problem:
                return "family %r, key %r: %s" % (family, key, problem)
    return None


def _undo_problem(data: dict) -> str | None:
    """What is wrong with ``created_dirs`` and ``written``, the optional keys of what rollback undoes."""
    created = data.get(CREATED_KEY, [])
    if not isinstance(created, list) or not all(_node_path(p) for p in created):
        return "\"%s\" is not a list of absolute paths" % CREATED_KEY
    written = data.get(WRITTEN_KEY, {})
    if not isinstance(written, dict) or not all(isinstance(v, list) and all(_node_path(p) for p in v)
                                                for v in written.values()):
        return "\"%s\" is not an object of lists of absolute paths" % WRITTEN_KEY
    return None


def _node_path(path) -> bool:
    return isinstance(path, str) and path.startswith("/") and ".." not in path.split("/")


def _entry_problem(family, key, entry):
    if not isinstance(entry, dict):
        return "the entry is a %s, not an object" % type(entry).__name__
    if "original" not in entry:
        return "the entry has no \"original\""
    if "recorded" in entry and not isinstance(entry["recorded"], str):
        return "\"recorded\" is not a time stamp"
    keys = PER_CPU_KEYS.get(family, ())
    per_cpu = keys is None or key in keys
    original = entry["original"]
    if per_cpu and not isinstance(original, dict):
        return "the per-CPU original is a %s, not an object (value -> cpulist)" % type(original).__name__
    if isinstance(original, dict):
        for value, cpulist in original.items():
            try:
                if not isinstance(cpulist, str) or not parse_cpulist(cpulist):
                    raise ValueError(cpulist)
            except ValueError:
                return "value %r has %r, not a cpulist such as 0-3,8" % (value, cpulist)
    return None


def open_journal(node: Node, params: dict) -> Journal | None:
    """Open the journal named by the ``journal`` option in ``params``, or return None when unset."""
    # Families build their node with Node.open; checking here too keeps a caller that built it
    # with plain Node() from reading or writing below a root that is not a node.
    node.check_root()
    path = params.get("journal")
    if not path:
        if params.get("restore"):
            raise NodeError("restore=true needs the journal option (the path of the journal on the node)")
        return None
    return Journal(node, path)


def open_node(params: dict) -> tuple[Node, Journal | None]:
    """A family run's node (``Node.open(params["root"])``) and journal, before anything is read or written."""
    try:
        node = Node.open(params["root"])
        return node, open_journal(node, params)
    except NodeError as exc:
        raise FamilyError(str(exc)) from None
