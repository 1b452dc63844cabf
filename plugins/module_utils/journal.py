# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The journal of original values, kept on the node so that tuning can be rolled back.

One JSON file (root-only, default ``/var/lib/gpunode-tuning/journal.json`` below the node root)
holds, per knob family, the value each item had before this collection first changed it. A later
run never overwrites an original that is already recorded. Modules record before they write and,
with ``restore``, write the originals back and drop them from the journal.

Layout::

    {"version": 1,
     "families": {
        "pcie_mrrs": {"0000:41:00.0": {"original": 512, "recorded": "2026-11-29T15:00:00Z"}},
        "cpuidle":   {"C2": {"original": {"0": "0-127"}, "recorded": "..."}}}}

Per-CPU values are stored grouped (value -> cpulist) so a 384-CPU node stays small; merging
keeps the first-recorded value of every CPU.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from ansible_collections.gpunode.tuning.plugins.module_utils.node import (
    NodeError,
    format_cpulist,
    parse_cpulist,
)

DEFAULT_JOURNAL = "/var/lib/gpunode-tuning/journal.json"
JOURNAL_ARGUMENT_SPEC = dict(
    journal=dict(type="str"),
    restore=dict(type="bool", default=False),
)
VERSION = 1


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Journal:
    """Original values of one node. ``path`` is absolute on the node (resolved below the root)."""

    def __init__(self, node, path=DEFAULT_JOURNAL):
        if not path or not path.startswith("/"):
            raise NodeError("journal path must be absolute on the node, got %r" % (path,))
        self.node = node
        self.path = node.path(path)
        self.data = {"version": VERSION, "families": {}}
        self.dirty = False
        if os.path.exists(self.path):
            try:
                with open(self.path, encoding="utf-8") as fh:
                    self.data = json.load(fh)
            except (OSError, ValueError) as exc:
                raise NodeError("journal %s is unreadable (%s); refusing to continue so that recorded "
                                "originals are not lost" % (self.path, exc)) from exc
            if self.data.get("version") != VERSION:
                raise NodeError("journal %s has version %r; this collection reads version %d"
                                % (self.path, self.data.get("version"), VERSION))

    def entries(self, family):
        """Recorded entries of a family: ``{key: original}``."""
        return {k: v["original"] for k, v in self.data["families"].get(family, {}).items()}

    def has(self, family, key):
        return key in self.data["families"].get(family, {})

    def record(self, family, key, original):
        """Record ``original`` for ``key`` unless an original is already recorded. Returns True if new."""
        fam = self.data["families"].setdefault(family, {})
        if key in fam:
            return False
        fam[key] = {"original": original, "recorded": _now()}
        self.dirty = True
        return True

    def record_per_cpu(self, family, key, values):
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
                    "recorded": entry["recorded"] if entry else _now()}
        self.dirty = True
        return True

    @staticmethod
    def per_cpu(original):
        """Expand a grouped per-CPU original into ``{cpu: value}``."""
        out = {}
        for value, cpulist in original.items():
            for cpu in parse_cpulist(cpulist):
                out[cpu] = value
        return out

    def mark_applied(self, family):
        """Note that ``family`` changed the node now (wall clock, boot-relative time and boot id).

        Verification reads the kernel log from this point on; the boot id tells whether the
        boot-relative time still refers to the running boot.
        """
        uptime = self.node.read("proc/uptime", default="0").split()[0]
        self.data["last_applied"] = {
            "family": family,
            "time": _now(),
            "uptime": float(uptime),
            "boot_id": self.node.read("proc/sys/kernel/random/boot_id", default=""),
        }
        self.dirty = True

    def drop(self, family, key):
        fam = self.data["families"].get(family, {})
        if key in fam:
            del fam[key]
            if not fam:
                del self.data["families"][family]
            self.dirty = True

    def save(self, check_mode=False):
        """Write the journal atomically (0600 in a 0700 directory). Nothing happens in check mode.

        An empty journal removes the file (and its directory when empty) so that a full
        rollback leaves nothing behind.
        """
        if check_mode or not self.dirty:
            return False
        directory = os.path.dirname(self.path)
        if not self.data["families"]:
            # Nothing left to restore: the journal (and its marker) goes, so a full rollback
            # leaves nothing of ours behind.
            if os.path.exists(self.path):
                os.unlink(self.path)
            try:
                os.rmdir(directory)
            except OSError:
                pass
            self.dirty = False
            return True
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".journal.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self.data, fh, indent=1, sort_keys=True)
                fh.write("\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self.dirty = False
        return True


def open_journal(module, node):
    """Open the journal named by the module's ``journal`` option, or return None when unset.

    Fails the module (before any write) when the journal cannot be read, or when ``restore``
    is asked without a journal.
    """
    path = module.params.get("journal")
    if not path:
        if module.params.get("restore"):
            module.fail_json(msg="restore=true needs the journal option (the path of the journal on the node)")
        return None
    try:
        return Journal(node, path)
    except NodeError as exc:
        module.fail_json(msg=str(exc))
