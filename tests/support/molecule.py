# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the Molecule scenarios' testinfra tests share (molecule/<scenario>/tests, fixtures in molecule/conftest.py):
the simulated node's shape and the reads of it in one container."""

from __future__ import annotations

import json
import os
import re
import shlex

import yaml

PRISTINE = "/var/tmp/simnode-pristine"
# The audited-epyc-8gpu preset of tools/simnode.
GPU_BDFS = sorted("0000:%s:00.0" % bus for bus in ("01", "21", "41", "61", "81", "a1", "c1", "e1"))
CPUS = 128

_DIFF_LINE = re.compile(r"^(?:Files (?P<a>\S+) and \S+ differ|Only in (?P<dir>[^:]+): (?P<name>.+)"
                        r"|File (?P<b>\S+) is a .* while file \S+ is a .*)$")


def molecule_config():
    """The scenario's merged configuration (Molecule sets ``MOLECULE_FILE``)."""
    with open(os.environ["MOLECULE_FILE"], encoding="utf-8") as stream:
        return yaml.safe_load(stream)


# The node does not change while the tests run: the expensive reads are made once per host.
_MEMO = {}


def _memoized(method):
    def wrapper(self, *args):
        key = (self.host.backend.hostname, method.__name__) + args
        if key not in _MEMO:
            _MEMO[key] = method(self, *args)
        return _MEMO[key]
    return wrapper


class SimNode:
    """Reads of the simulated node in one container, one ``podman exec`` per call."""

    def __init__(self, host, root):
        self.host = host
        self.root = root

    def path(self, rel):
        return "%s/%s" % (self.root, rel.lstrip("/"))

    def read(self, rel):
        return self.host.file(self.path(rel)).content_string

    def read_glob(self, pattern, base=None):
        """``{path relative to the root: content}`` of every file matching ``pattern``."""
        base = base or self.root
        script = ("import glob, json, os, sys\n"
                  "print(json.dumps({os.path.relpath(p, sys.argv[2]): open(p).read()"
                  " for p in glob.glob(os.path.join(sys.argv[2], sys.argv[1]))}))")
        out = self.host.check_output("python3 -c %s %s %s", script, pattern, base)
        return json.loads(out)

    def exists(self, rel):
        return self.host.file(self.path(rel)).exists

    @_memoized
    def changed_paths(self):
        """Paths (relative to the root) that differ from the pristine copy, or exist on one side."""
        cmd = self.host.run("diff -r -q --no-dereference %s %s", PRISTINE, self.root)
        assert cmd.rc in (0, 1), cmd.stderr
        changed = set()
        for line in cmd.stdout.splitlines():
            match = _DIFF_LINE.match(line)
            assert match, "unexpected diff output: %r" % line
            if match.group("dir"):
                full = "%s/%s" % (match.group("dir"), match.group("name"))
            else:
                full = match.group("a") or match.group("b")
            for prefix in (PRISTINE + "/", self.root + "/"):
                if full.startswith(prefix):
                    full = full[len(prefix):]
            changed.add(full)
        return changed

    @_memoized
    def lspci_mrrs(self, tree=None):
        """``{bdf: MaxReadReq}`` of every PCIe function, read by the real lspci from the tree."""
        tree = tree or self.root
        out = self.host.check_output("lspci -D -vv -O sysfs.path=%s 2>/dev/null",
                                     shlex.quote(tree + "/sys/bus/pci"))
        mrrs, bdf = {}, None
        for line in out.splitlines():
            if line and not line[0].isspace():
                bdf = line.split()[0]
            match = re.search(r"MaxReadReq (\d+) bytes", line)
            if match and bdf:
                mrrs[bdf] = int(match.group(1))
        return mrrs

    def journal(self):
        return json.loads(self.read("var/lib/gpunode-tuning/journal.json"))
