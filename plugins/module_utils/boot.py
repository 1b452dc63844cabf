# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Boot re-apply: the runtime families of a desired-state file, by the functions the modules call.

The persistent flow writes the desired state (``/etc/gpunode-tuning/desired.json``) and installs
this package's module_utils on the node; ``gpunode-tuning-boot.service`` runs it at boot with the
node's python3, and the udev rule runs it for one hot-added PCI function::

    python3 -I -B RUNNER --desired /etc/gpunode-tuning/desired.json
    python3 -I -B RUNNER --desired /etc/gpunode-tuning/desired.json --only-mrrs --bdf 0000:41:00.0

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
import os
import shutil
import subprocess
import sys

from ansible_collections.gpunode.tuning.plugins.module_utils import cpufreq, cpuidle, pcie, tunables, validate
from ansible_collections.gpunode.tuning.plugins.module_utils.node import Node, NodeError, format_cpulist

VERSION = 1
FAMILIES = ("pcie_mrrs", "cpuidle", "cpufreq", "thp")
PREFIX = "gpunode-tuning-boot"
# systemd gives units a minimal PATH; these are where setpci and udevadm live.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The cpufreq driver is a module udev's coldplug loads, possibly after the unit started.
UDEV_SETTLE_TIMEOUT = 30


class BootError(Exception):
    """The desired state cannot be used, or a family cannot run; the message says why."""


class _Finder:
    """What ``Node.bin_path`` asks of a module: a PATH lookup (a missing binary raises BinaryNotFound)."""

    @staticmethod
    def get_bin_path(name):
        return shutil.which(name, path=SYSTEM_PATH)


def _say(line):
    """One line to stdout (journald at boot); module_utils' linters forbid print()."""
    sys.stdout.write("%s\n" % line)
    sys.stdout.flush()


def _run(argv):
    """``run(argv) -> (rc, stdout, stderr)`` as ``pcie.Setpci`` takes it, in the C locale."""
    env = dict(os.environ, LC_ALL="C", PATH=SYSTEM_PATH)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


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


# ---------------------------------------------------------------------------------------------
# One function per family: (ok, message). Each uses the same functions as its module.
# ---------------------------------------------------------------------------------------------


def mrrs_selector(want: dict, bdf: str | None = None) -> pcie.DeviceSelector | None:
    """The module's selector for ``want``; with ``bdf`` (udev) restricted to it, None when not selected."""
    selector = pcie.DeviceSelector(vendor=want.get("vendor"), device=want.get("device"),
                                   class_prefixes=want.get("class_prefixes"), bdfs=want.get("bdfs"))
    if bdf is None:
        return selector
    bdf = pcie.normalize_bdf(bdf)
    if selector.bdfs is not None and bdf not in selector.bdfs:
        return None
    # The default selector is resolved already (vendor 0x10de, GPU classes): keep it with the BDF.
    return pcie.DeviceSelector(vendor=selector.vendor, device=selector.device,
                               class_prefixes=selector.class_prefixes, bdfs=[bdf])


def apply_mrrs(node: Node, want: dict, bdf: str | None = None) -> tuple[bool, str]:
    """``pcie.run_mrrs`` without a journal; ``bdf`` restricts it to one device (udev ACTION=add)."""
    size = want.get("mrrs")
    pcie.encode_mrrs(size)
    selector = mrrs_selector(want, bdf)
    if selector is None:
        return True, "%s is not one of the selected bdfs (%s): nothing to do" % (bdf, ", ".join(want["bdfs"]))
    holder = {}

    def setpci_factory():
        holder["bin"] = node.bin_path(_Finder(), "setpci", "pciutils")
        return pcie.Setpci(_run, holder["bin"], node.pciutils_args())

    allow_empty = bdf is not None or bool(want.get("allow_empty"))
    result = pcie.run_mrrs(node, setpci_factory, None, False, mrrs=size, selector=selector,
                           allow_empty=allow_empty)
    for warning in result["warnings"]:
        _say("%s: pcie_mrrs: warning: %s" % (PREFIX, warning))
    if result["failed_devices"]:
        return False, pcie.failure_message(result, False, False)
    done = [d["bdf"] for d in result["devices"] if d["changed"]]
    kept = [d["bdf"] for d in result["devices"] if not d["changed"] and not d["skipped"]]
    if not result["devices"]:
        return True, "no PCI Express device matches (%s)" % selector.describe()
    return True, "MRRS %d set on %d device(s)%s, %d already at it" % (
        size, len(done), (" (%s)" % ", ".join(done)) if done else "", len(kept))


def apply_cstates(node: Node, want: dict) -> tuple[bool, str]:
    """cpu_cstate's plan (by names, else by the latency bound) and writes, without a journal."""
    names = validate.cstate_names(want.get("disable") or [])
    latency = want.get("max_latency_us")
    if not names and latency is None:
        return True, "no state names and no latency bound: idle states left alone"
    cpus = cpuidle.select_cpus(node, want.get("cpus"))
    if not cpuidle.idle_driver(node):
        return True, "not applicable: this node has no cpuidle driver"
    states = cpuidle.read_states(node, cpus)
    if names:
        plan = cpuidle.plan_by_names(states, names, cpuidle.DISABLED)
        what = "disable %s" % ", ".join(names)
    else:
        plan = cpuidle.plan_by_latency(states, latency)
        what = "exit latency above %d us disabled" % latency
    writes = cpuidle.plan_writes(states, plan)
    failed = cpuidle.apply_writes(node, writes)
    if failed:
        return False, cpuidle.failure_message(failed)
    return True, "%s: %d file(s) written on CPUs %s" % (what, len(writes), format_cpulist(cpus))


def _settle_udev(node):
    """On a live node without a cpufreq policy yet, wait (bounded) for udev to load the driver."""
    if not node.is_live or any(n.startswith("policy") for n in node.listdir(cpufreq.CPUFREQ)):
        return
    udevadm = shutil.which("udevadm", path=SYSTEM_PATH)
    if udevadm:
        rc, _out, err = _run([udevadm, "settle", "--timeout=%d" % UDEV_SETTLE_TIMEOUT])
        if rc:
            _say("%s: cpufreq: udev did not settle within %d s (%s); cpufreq may not be ready"
                 % (PREFIX, UDEV_SETTLE_TIMEOUT, err.strip() or "rc %d" % rc))


def apply_cpufreq(node: Node, want: dict) -> tuple[bool, str]:
    """cpu_freq's validation and writes (pstate mode, then governor, then EPP, then boost), no journal."""
    _settle_udev(node)
    changed, failure, skipped = cpufreq.reapply(node, want)
    notes = "".join("; %s not applied: %s" % (k, why) for k, why in sorted(skipped.items()))
    if failure:
        return False, failure + notes
    asked = ", ".join("%s=%s" % (k, want[k]) for k in ("governor", "epp", "boost") if want.get(k) is not None)
    return True, "%s%s%s" % (asked or "nothing asked", " (changed)" if changed else " (already set)", notes)


def apply_thp(node: Node, want: dict) -> tuple[bool, str]:
    """kernel_tunables' plan and writes of the transparent hugepage settings, without a journal."""
    items = tunables.plan_items(node, thp=want)
    results, failed = tunables.apply(node, items)
    if failed:
        return False, "; ".join("%s: %s" % (k, results[k]["reason"]) for k in failed)
    return True, ", ".join("%s=%s%s" % (k, r["after"], " (changed)" if r["changed"] else "")
                           for k, r in sorted(results.items()))


APPLY = {"pcie_mrrs": apply_mrrs, "cpuidle": apply_cstates, "cpufreq": apply_cpufreq, "thp": apply_thp}


def run_families(node: Node, desired: dict, only_mrrs: bool = False, bdf: str | None = None) -> int:
    """Apply every family of ``desired`` (only MRRS with ``only_mrrs``); a failure does not stop the others.

    Prints one line per family; returns 1 when one failed, else 0.
    """
    status = 0
    for family in FAMILIES:
        want = desired.get(family)
        if want is None or (only_mrrs and family != "pcie_mrrs"):
            continue
        try:
            ok, msg = apply_mrrs(node, want, bdf) if family == "pcie_mrrs" else APPLY[family](node, want)
        except (BootError, NodeError, ValueError, pcie.MrrsError) as exc:
            ok, msg = False, str(exc)
        except Exception as exc:  # noqa: BLE001 (a bug in one family must not stop the others at boot)
            ok, msg = False, "%s: %s" % (type(exc).__name__, exc)
        _say("%s: %s: %s%s" % (PREFIX, family, "" if ok else "FAILED: ", msg))
        status |= 0 if ok else 1
    return status


def parse_args(argv):
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
    """The boot unit's and the udev rule's entry point; returns the exit status."""
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
