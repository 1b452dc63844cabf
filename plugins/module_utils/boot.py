# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Boot re-apply: the runtime families of a desired-state file, by the functions the modules call.

The persistent flow writes the desired state (``/etc/gpunode-tuning/desired.json``) and the runner,
which carries this package's module_utils (templates/gpunode-tuning-boot.py.j2);
``gpunode-tuning-boot.service`` runs it at boot with the node's python3, and the udev rule runs it
for one hot-added PCI function::

    python3 -I -B RUNNER --desired /etc/gpunode-tuning/desired.json
    python3 -I -B RUNNER --desired /etc/gpunode-tuning/desired.json --only-mrrs --bdf 0000:41:00.0
    python3 -I -B RUNNER guard --config /etc/gpunode-tuning/guard.json      (the guard: module_utils/guard.py)

No journal: boot re-apply is not a change to roll back (the runtime run journaled the originals).
No Ansible import, Python 3.8+, standard library only. One line per family goes to stdout
(journald); the exit status is 1 when a family failed, after every family was tried, and 2 when
the desired state or the root cannot be read.

Desired state (a family that is absent is not re-applied)::

    {"version": 1,
     "pcie_mrrs": {"mrrs": 4096, "vendor": null, "device": null, "class_prefixes": null,
                   "bdfs": null, "allow_empty": false},
     "cpuidle": {"disable": [], "max_latency_us": 100, "cpus": null},
     "cpufreq": {"governor": "performance", "epp": null, "boost": null, "driver": "native",
                 "amd_pstate_mode": "active", "intel_pstate_status": null},
     "thp": {"enabled": "madvise", "defrag": "defer+madvise"}}
"""

from __future__ import annotations

import argparse
import json
import sys

from ansible_collections.gpunode.tuning.plugins.module_utils import families, pcie
from ansible_collections.gpunode.tuning.plugins.module_utils.family import FamilyError
from ansible_collections.gpunode.tuning.plugins.module_utils.node import Node, NodeError

VERSION = 1
# The desired-state keys boot re-applies, in order (the registry's families with a boot function).
FAMILIES = tuple(key for key, _fam in families.boot_families())
PREFIX = "gpunode-tuning-boot"


class BootError(Exception):
    """The desired state cannot be used, or a family cannot run; the message says why."""


def _say(line):
    """One line to stdout (journald at boot); module_utils' linters forbid print()."""
    sys.stdout.write("%s\n" % line)
    sys.stdout.flush()


def boot_state(desired: dict) -> dict:
    """The part of a desired state that boot re-applies: ``version`` and each boot family that is set."""
    known = {fam.name for fam in families.FAMILIES} | set(FAMILIES) | set(families.report_titles())
    unknown = sorted(set(desired) - known - {"version"})
    if unknown:
        raise BootError("unknown families %s; known are %s" % (", ".join(unknown), ", ".join(sorted(known))))
    out = {"version": VERSION}
    for key in FAMILIES:
        if desired.get(key) not in (None, {}, [], ""):
            out[key] = desired[key]
    return out


def load_desired(path: str) -> dict:
    """The desired state in ``path``; BootError naming the file when it is unusable."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise BootError("cannot read the desired state %s: %s" % (path, exc)) from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise BootError("%s is not a version %d desired state (written by gpunode.tuning's persistent flow)"
                        % (path, VERSION))
    unknown = sorted(set(data) - set(FAMILIES) - {"version"})
    if unknown:
        raise BootError("%s has unknown families %s; known are %s" % (path, ", ".join(unknown), ", ".join(FAMILIES)))
    for family in FAMILIES:
        if data.get(family) is not None and not isinstance(data[family], dict):
            raise BootError("%s: %s must be an object" % (path, family))
    return data


def _boot_one(fam, node: Node, want: dict, bdf: str | None) -> tuple[bool, str]:
    """One family's re-apply; its error, expected or not, is its failure and never stops the others."""
    try:
        return fam.boot(node, want, bdf) if bdf is not None else fam.boot(node, want)
    except (BootError, NodeError, ValueError, FamilyError, pcie.MrrsError) as exc:
        return False, str(exc)
    except Exception as exc:  # noqa: BLE001 (a bug in one family must not stop the others at boot)
        return False, "%s: %s" % (type(exc).__name__, exc)


def boot_each(node: Node, desired: dict, only_mrrs: bool = False, bdf: str | None = None) -> list:
    """``[(key, ok, message)]``: every family of ``desired`` re-applied by the registry's boot functions.

    Only MRRS with ``only_mrrs``. A failure does not stop the others. The guard re-applies drifted
    families with this too (gpunode_tuning_guard_reapply).
    """
    out = []
    for key, fam in families.boot_families():
        want = desired.get(key)
        if want is None or (only_mrrs and key != pcie.FAMILY):
            continue
        ok, msg = _boot_one(fam, node, want, bdf if key == pcie.FAMILY else None)
        out.append((key, ok, msg))
    return out


def run_families(node: Node, desired: dict, only_mrrs: bool = False, bdf: str | None = None) -> int:
    """Re-apply every family of ``desired`` (``boot_each``), one line per family; 1 when one failed, else 0."""
    status = 0
    for key, ok, msg in boot_each(node, desired, only_mrrs, bdf):
        _say("%s: %s: %s%s" % (PREFIX, key, "" if ok else "FAILED: ", msg))
        status |= 0 if ok else 1
    return status


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PREFIX, description="Re-apply gpunode.tuning's runtime settings at boot.")
    parser.add_argument("--desired", required=True, help="the desired-state JSON file (below --root)")
    parser.add_argument("--root", default="/", help="the node root (a simulated node's directory in tests)")
    parser.add_argument("--only-mrrs", action="store_true", help="only PCIe MRRS (the udev rule)")
    parser.add_argument("--bdf", help="only this PCI function (with --only-mrrs)")
    args = parser.parse_args(argv)
    if args.bdf is not None and not args.only_mrrs:
        parser.error("--bdf needs --only-mrrs")
    return args


def main(argv: list[str] | None = None) -> int:
    """The boot unit's and the udev rule's entry point (the guard's with ``guard``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["guard"]:
        # The guard unit runs the same runner: `RUNNER guard --config FILE` (module_utils/guard.py).
        # Imported here: guard imports this module.
        from ansible_collections.gpunode.tuning.plugins.module_utils import guard

        return guard.main(argv[1:])
    args = parse_args(argv)
    try:
        node = Node.open(args.root)
        desired = load_desired(node.path(args.desired) if args.root != "/" else args.desired)
    except (BootError, NodeError) as exc:
        _say("%s: FAILED: %s" % (PREFIX, exc))
        return 2
    status = run_families(node, desired, args.only_mrrs, args.bdf)
    sys.stdout.flush()
    return status
