# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PCIe Max Read Request Size family: plan, journal, write (setpci, mask 0x7000 only), read back,
restore and re-apply at boot, for the selected devices (default: the NVIDIA GPUs); verification is
pcie_mrrs_verify.py.

How it works and why: docs/dev/node-code.md, "families/pcie_mrrs.py"."""

from __future__ import annotations

from typing import Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command
from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import (
    JOURNAL_ARGUMENT_SPEC,
    Journal,
    open_node,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    Node,
    NodeError,
    lockdown_mode,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import (  # noqa: F401 (select_devices: re-exported)
    DEVCTL_MRRS_MASK,
    MRRS_CHOICES,
    DeviceSelector,
    SelectionError,
    Setpci,
    encode_mrrs,
    failure_cause,
    inspect_device,
    mrrs_of_devctl,
    pcie_bus_perf,
    select_devices,
    selector_problems,
    write_fault,
)

NAME = "pcie_mrrs"


# -- The MRRS task: plan, journal, write, read back


class MrrsError(ValueError):
    """The task cannot proceed; nothing has been written. ``result`` holds what was found."""

    def __init__(self, msg, result=None):
        super().__init__(msg)
        self.result = result or {}


def _device_result(dev, pcie):
    return {
        "bdf": dev["bdf"],
        "vendor": dev["vendor"],
        "device": dev["device"],
        "class": dev["class"],
        "numa_node": dev["numa_node"],
        "mps": pcie["mps"] if pcie else None,
        "mrrs_before": pcie["mrrs"] if pcie else None,
        "mrrs_after": pcie["mrrs"] if pcie else None,
        "changed": False,
        "skipped": False,
        "failed": False,
        "reason": "",
    }


def _plan(devices, wanted, base):
    """Inspect ``devices`` and fill ``base["devices"]``; return ``{bdf: target}`` and ``{bdf: (dev, devctl)}``."""
    targets, planned = {}, {}
    for dev in devices:
        pcie, fault = inspect_device(dev)
        r = _device_result(dev, pcie)
        base["devices"].append(r)
        planned[dev["bdf"]] = (dev, pcie["devctl"] if pcie else None)
        want = wanted[dev["bdf"]]
        if fault is None and pcie is not None and pcie["mrrs"] != want:
            fault = write_fault(dev)
        if fault:
            r["failed"], r["reason"] = True, fault
        elif pcie is None:
            r["skipped"], r["reason"] = True, "no PCI Express capability"
        elif pcie["mrrs"] == want:
            r["reason"] = "already %d" % want
        else:
            targets[dev["bdf"]] = want
            r["mrrs_after"], r["changed"] = want, True
    base["devices"].sort(key=lambda r: r["bdf"])
    return targets, planned


def _diff(results):
    diff = {"before": {}, "after": {}}
    for r in results:
        if not r["skipped"] and r["mrrs_before"] is not None:
            diff["before"][r["bdf"]] = {"mrrs": r["mrrs_before"]}
            diff["after"][r["bdf"]] = {"mrrs": r["mrrs_after"]}
    return diff


def _journal_plan(journal, restore, check_mode, base, targets):
    """Record originals of what will change, or drop restore entries that are already back."""
    if journal is None or check_mode:
        return
    for r in base["devices"]:
        if restore and not r["skipped"] and not r["failed"] and r["bdf"] not in targets:
            journal.drop(NAME, r["bdf"])
            r["reason"] = "already at the recorded original %d" % r["mrrs_before"]
        elif not restore and r["bdf"] in targets and r["mrrs_before"] is not None:
            journal.record(NAME, r["bdf"], r["mrrs_before"])  # a reserved encoding cannot be restored


def _base_result(node):
    bus_perf = pcie_bus_perf(node)
    warnings = []
    if bus_perf:
        warnings.append("the kernel command line has pci=pcie_bus_perf: it sets MRRS to MPS at boot and clamps "
                        "later requests to MPS, so MRRS set here may be lowered again; remove it for large MRRS")
    return {"lockdown": lockdown_mode(node), "pcie_bus_perf": bus_perf, "warnings": warnings, "devices": [],
            "failed_devices": [], "changed": False}


def run_mrrs(node: Node, setpci_factory: Callable[[], Setpci], journal: Journal | None, check_mode: bool,
             mrrs: int | None = None, selector: DeviceSelector | None = None, restore: bool = False,
             allow_empty: bool = False) -> dict:
    """Apply ``mrrs`` to the devices chosen by ``selector`` (or restore the journal's originals)."""
    if not restore:
        encode_mrrs(mrrs)  # ValueError naming the allowed sizes
        selector = selector or DeviceSelector()
    base = _base_result(node)
    if restore:
        from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_mrrs_restore

        wanted, devices = pcie_mrrs_restore.restore_wanted(node, journal, base)
    else:
        devices = select_devices(node, selector)
        wanted = {d["bdf"]: mrrs for d in devices}
    targets, planned = _plan(devices, wanted, base)
    base["failed_devices"] = [r["bdf"] for r in base["devices"] if r["failed"]]
    named = set(selector.bdfs or []) if not restore else set()
    base["warnings"] += ["%s: MRRS does not apply: it was named in bdfs but has no PCI Express capability (a "
                         "conventional PCI function); it was skipped" % r["bdf"]
                         for r in base["devices"] if r["skipped"] and r["bdf"] in named]
    if not restore and all(r["skipped"] for r in base["devices"]) and not allow_empty:
        raise MrrsError("no PCI Express device matches the selection (%s); set allow_empty: true to accept "
                        "a node without such devices" % selector.describe(), base)
    base["diff"] = _diff(base["devices"])
    if targets and base["lockdown"] in ("integrity", "confidentiality"):
        raise MrrsError("kernel lockdown is in %s mode: the kernel refuses PCI config-space writes from user "
                        "space, so MRRS cannot be changed at runtime on %s; nothing was written. Set MRRS in "
                        "the BIOS, or boot without lockdown" % (base["lockdown"], ", ".join(sorted(targets))), base)
    _journal_plan(journal, restore, check_mode, base, targets)
    base["changed"] = bool(targets)
    if check_mode or not targets:
        if journal is not None and not check_mode:
            journal.save()
        return base
    if journal is not None:
        try:
            journal.save()  # before the first config-space write: originals survive a crash
        except OSError as exc:
            raise MrrsError("cannot save the journal %s (%s); nothing was written" % (journal.path, exc), base) \
                from exc
    _apply(setpci_factory(), targets, planned, base, journal if restore else None)
    return base


def _write_and_read_back(setpci, targets, warnings):
    """One setpci process writes every target and one reads them back (the normal path)."""
    wrc, werr = setpci.write_mrrs(targets)
    after, read_errors = setpci.read_devctl(sorted(targets))
    if not (wrc or werr):
        return after, read_errors, {}
    retry = {b: w for b, w in targets.items() if b in after and mrrs_of_devctl(after[b]) != w}
    write_errors = {}
    for bdf, want in sorted(retry.items()):
        rc, err = setpci.write_mrrs({bdf: want})
        if rc or err:
            write_errors[bdf] = "rc %s: %s" % (rc, err or "no message")
    if retry:
        again, errors = setpci.read_devctl(sorted(retry))
        for bdf in retry:
            after.pop(bdf, None)
        after.update(again)
        read_errors.update(errors)
    if not retry and not read_errors:
        warnings.append("setpci reported an error (rc %s: %s) but every device reads back as written"
                        % (wrc, werr or "no message"))
    return after, read_errors, write_errors


def _apply(setpci, targets, planned, base, restore_journal):
    """Write ``targets``, judge each device by its read-back, name the cause of each failure."""
    after, read_errors, write_errors = _write_and_read_back(setpci, targets, base["warnings"])
    results = {r["bdf"]: r for r in base["devices"]}
    for bdf, want in sorted(targets.items()):
        (dev, devctl_before), r, got = planned[bdf], results[bdf], after.get(bdf)
        r["mrrs_after"] = mrrs_of_devctl(got) if got is not None else None
        r["changed"] = got is not None and r["mrrs_after"] != r["mrrs_before"]
        if got is None or r["mrrs_after"] != want:
            r["failed"] = True
            r["reason"] = failure_cause(dev, want, got, read_errors.get(bdf), write_errors.get(bdf))
            base["failed_devices"].append(bdf)
            continue
        r["reason"] = "restored" if restore_journal is not None else "set"
        if restore_journal is not None:
            restore_journal.drop(NAME, bdf)
        if (got & ~DEVCTL_MRRS_MASK) != (devctl_before & ~DEVCTL_MRRS_MASK):
            # Not written by us (mask 0x7000), e.g. the kernel's AER handling in between.
            base["warnings"].append("%s: Device Control bits outside MRRS changed meanwhile (0x%04x -> 0x%04x)"
                                    % (bdf, devctl_before, got))
    base["failed_devices"].sort()
    base["diff"]["after"].update({b: {"mrrs": results[b]["mrrs_after"]} for b in targets})
    if restore_journal is not None:
        restore_journal.save()
    base["changed"] = any(r["changed"] for r in base["devices"])
    base["setpci_calls"] = setpci.calls


def failure_message(result: dict, restore: bool, check_mode: bool, journal_path: str | None = None) -> str:
    """The task's closing error: every failed device with its cause, and what happened to the rest."""
    failed = [d for d in result["devices"] if d["failed"]]
    done = [d for d in result["devices"] if d["changed"]]
    verb = "restored" if restore else "set"
    msg = "MRRS could not be %s on %d device(s): %s" % (
        verb, len(failed), "; ".join("%s: %s" % (d["bdf"], d["reason"]) for d in failed))
    if check_mode:
        msg = "check mode: a real run would fail. " + msg
        tail = "%d other device(s) would be %s" % (len(done), verb)
    else:
        tail = "%d other device(s) were %s" % (len(done), verb)
    if restore and journal_path:
        tail += "; the failed entries stay in the journal %s for the next attempt" % journal_path
    return msg + ". " + tail


def run(call: contract.Call) -> dict:
    """The setpci_mrrs module: check the options, open the node, ``run_mrrs``; returns the module's result."""
    params = call.params
    if params["mrrs"] is None and not params["restore"]:
        raise contract.FamilyError("mrrs is required (one of %s bytes) unless restore=true"
                                   % ", ".join(str(c) for c in MRRS_CHOICES))
    problems = selector_problems(params)
    if params["mrrs"] is not None:
        try:
            encode_mrrs(params["mrrs"])
        except ValueError as exc:
            problems.insert(0, ("mrrs", str(exc)))
    if problems:
        raise contract.FamilyError("invalid input, nothing was written: %s" % contract.problems_text(problems))
    selector = DeviceSelector(vendor=params["vendor"], device=params["device"],
                              class_prefixes=params["class_prefixes"], bdfs=params["bdfs"])
    node, journal = open_node(params)
    try:
        setpci_bin = node.bin_path(call.lookup, "setpci", "pciutils")
    except NodeError as exc:
        raise contract.FamilyError(str(exc)) from None

    def setpci_factory():
        return Setpci(call.run_command, setpci_bin, node.pciutils_args())

    try:
        result = run_mrrs(node, setpci_factory, journal, call.check_mode, mrrs=params["mrrs"], selector=selector,
                          restore=params["restore"], allow_empty=params["allow_empty"])
    except (MrrsError, SelectionError) as exc:
        _warn(call, exc.result)
        raise contract.FamilyError(str(exc), _public(call, exc.result, changed=False)) from None
    except NodeError as exc:
        raise contract.FamilyError(str(exc), {"changed": False}) from None
    _warn(call, result)
    if result["failed_devices"]:
        raise contract.FamilyError(failure_message(result, params["restore"], call.check_mode,
                                                   journal.path if journal else None), _public(call, result))
    return _public(call, result)


def _warn(call, result):
    for warning in result.get("warnings", []):
        call.warn(warning)


def _public(call, result, **overrides):
    """The module's result keys (``warnings`` go through ``call.warn``, the diff only when asked)."""
    out = dict(
        changed=result.get("changed", False),
        devices=result.get("devices", []),
        failed_devices=result.get("failed_devices", []),
        lockdown=result.get("lockdown"),
        pcie_bus_perf=result.get("pcie_bus_perf", False),
        setpci_calls=result.get("setpci_calls", 0),
    )
    out.update(overrides)
    if call.diff and "diff" in result:
        out["diff"] = result["diff"]
    return out

# --- boot: its re-apply at boot and on hot-plug (its verification is pcie_mrrs_verify.py) ---


# The options of its module (setpci_mrrs): the flow module completes each family's options with it too.
ARGUMENT_SPEC = dict(
    mrrs=dict(type="int", choices=list(MRRS_CHOICES)),
    vendor=dict(type="list", elements="str"),
    device=dict(type="str"),
    class_prefixes=dict(type="list", elements="str"),
    bdfs=dict(type="list", elements="str"),
    allow_empty=dict(type="bool", default=False),
    **JOURNAL_ARGUMENT_SPEC,
    **NODE_ARGUMENT_SPEC,
    **command.ARGUMENT_SPEC,
)


def summary(result: dict) -> str:
    """The runtime report's line: how many devices were set, already there, skipped."""
    devices = result.get("devices") or []
    if not devices:
        return "not applicable: no matching PCIe device"
    changed = [d for d in devices if d.get("changed")]
    skipped = [d for d in devices if d.get("skipped")]
    mrrs = next((d.get("mrrs_after") for d in devices if d.get("mrrs_after")), None)
    return "%d set%s, %d already there, %d skipped" % (len(changed), " to %s" % mrrs if mrrs else "",
                                                       len(devices) - len(changed) - len(skipped), len(skipped))


def _plan_half():
    """The plan half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_mrrs_plan
    return pcie_mrrs_plan


def _verification():
    """The verification half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_mrrs_verify
    return pcie_mrrs_verify


DEFINITION = Family(
    name=NAME,
    titles={NAME: "PCIe MRRS"},
    module="setpci_mrrs",
    run=run,
    evaluate=contract.later(_verification, "evaluate"),
    boot=contract.later(_plan_half, "boot"),
    hotplug=contract.later(_plan_half, "hotplug"),
    from_role=contract.later(_plan_half, "from_role"),
    runtime_options=contract.later(_plan_half, "runtime_options"),
    restore_options=contract.later(_plan_half, "restore_options"),
    argument_spec=ARGUMENT_SPEC,
    summary=summary,
    items="devices",
    validate={NAME: contract.later(_plan_half, "desired_problems")},
)
