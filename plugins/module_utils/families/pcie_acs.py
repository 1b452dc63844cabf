# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCIe ACS on the GPU-to-GPU path: the ``pcie_acs`` module's run and the boot re-apply (facts and verification:
pcie_acs_verify.py).

How it works and why: docs/dev/node-code.md, "families/pcie_acs.py"."""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, family, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import Journal
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    SYSFS_PCI_DEVICES,
    Node,
    NodeError,
    lockdown_mode,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import (
    EXT_CAP_START,
    bridge_chain,
    decode_acs,
    device_dir,
)

NAME = "pcie_acs"
# ReqRedir, CmpltRedir, EgressCtrl: what pci=disable_acs_redir= clears too. Nothing else is written.
REDIRECT_MASK = pci.ACS_REDIRECT_MASK
bits = pci.acs_bits
describe = pci.describe_acs
SETPCI_ACS_CTRL = "ECAP_ACS+6.w"
MODES = ("disable_redirect", "unmanaged")
# How redirect survives a reboot (desired["pcie_acs"]["persist"]): the boot unit re-applies it, or
# the kernel argument pci=disable_acs_redir= (written through the command-line family).
PERSIST = ("boot_unit", "kernel_arg")
NO_ACS = "no ACS capability"

ARGUMENT_SPEC = dict(
    mode=dict(type="str", default="disable_redirect", choices=list(MODES)),
    vendor=dict(type="list", elements="str"),
    device=dict(type="str"),
    class_prefixes=dict(type="list", elements="str"),
    bdfs=dict(type="list", elements="str"),
    allow_empty=dict(type="bool", default=False),
    journal=dict(type="str"),
    restore=dict(type="bool", default=False),
    root=dict(type="path", default="/"),
    **command.ARGUMENT_SPEC,
)
# The desired-value options (what a preset may set for every node: preset_options).
DESIRED_OPTIONS = ("mode", "vendor", "device", "class_prefixes", "bdfs")
ARGUMENT_SPEC.update(family.preset_options_spec(DESIRED_OPTIONS))


# -- Decoding


def kernel_arg(bridges: list) -> str:
    """``pci=disable_acs_redir=BDF;BDF`` for the bridges (the kernel clears the same three bits at boot)."""
    return "pci=disable_acs_redir=" + ";".join(sorted(bridges))


# -- The GPU paths


def driver_of(path: str) -> str | None:
    """The driver a function's directory is bound to (its ``driver`` link's name), None when unbound."""
    try:
        return os.path.basename(os.readlink(os.path.join(path, "driver")))
    except OSError:
        return None


def vfio_below(devices: list, bridge_path: str) -> list:
    """BDFs bound to vfio-pci whose directory is below ``bridge_path``."""
    return sorted(d["bdf"] for d in devices if d["driver"] == "vfio-pci" and d["dir"].startswith(bridge_path + os.sep))


def _all_devices(node: Node, query: object = None) -> list:
    out = []
    for dev in pci.listed(node, query):
        path = device_dir(node, dev["bdf"])
        out.append(dict(dev, dir=path, driver=driver_of(path)))
    return out


def read_bridge(bridge: str, path: str) -> dict:
    """One bridge: its port type and ACS, or the error that hides them."""
    entry = {"bdf": bridge, "port_type": None, "acs": None, "acs_state": NO_ACS, "error": None}
    try:
        with open(os.path.join(path, "config"), "rb") as fh:
            cfg = fh.read()
    except OSError as exc:
        entry.update(acs_state="unreadable", error="cannot read %s/config: %s" % (path, exc.strerror or exc))
        return entry
    dead = pci.not_responding(cfg)
    if dead:  # a bridge off the bus reads all ones: never written, named with its cause
        entry.update(acs_state="unreadable", error=dead)
        return entry
    decoded = pci.decode_pcie(cfg)
    entry["port_type"] = decoded["port_type"] if decoded else None
    acs = decode_acs(cfg)
    if acs is None and len(cfg) <= EXT_CAP_START:
        entry.update(acs_state="unreadable", error="only %d bytes of config space are readable: the extended "
                     "capabilities (ACS) need root and a 4096-byte config" % len(cfg))
    elif acs is not None:
        entry.update(acs=acs, acs_state="redirect" if acs["redirect"] else "direct")
    return entry


def gpu_paths(node: Node, selector: pci.DeviceSelector, query: object = None) -> dict:
    """The selected GPUs, the bridges on their paths (ACS decoded) and the vfio-pci devices below those."""
    devices = _all_devices(node, query)
    gpus, bridges = [], {}
    for dev in devices:
        if not selector.matches(dev):
            continue
        chain = bridge_chain(node, dev["bdf"])
        group, group_type = pci.iommu_group(node, dev["bdf"])
        gpus.append({"bdf": dev["bdf"], "driver": dev["driver"], "bridges": [b for b, _p in chain],
                     "iommu_group": group, "iommu_group_type": group_type})
        for bdf, path in chain:
            if bdf not in bridges:
                bridges[bdf] = dict(read_bridge(bdf, path), path=path, gpus=[], vfio=vfio_below(devices, path))
            bridges[bdf]["gpus"].append(dev["bdf"])
    vfio = sorted({b for entry in bridges.values() for b in entry["vfio"]})
    return {"gpus": gpus, "bridges": bridges, "vfio_devices": vfio}


# -- The module's run: validate, plan, journal, write with a mask, read back


def mode_problems(want: dict) -> list:
    out = []
    mode = want.get("mode") or "disable_redirect"
    if mode not in MODES:
        out.append(("mode", "mode must be one of %s, got %r" % (", ".join(MODES), mode)))
    return out


def check_params(params: dict) -> pci.DeviceSelector:
    """Validate the options before anything is read; FamilyError naming what is allowed."""
    problems = mode_problems(params) + pci.selector_problems(params)
    if problems:
        raise family.FamilyError("invalid input, nothing was written: %s" % family.problems_text(problems),
                                 {"changed": False})
    if params.get("restore") and not params.get("journal"):
        raise family.FamilyError("restore=true needs the journal option (the path of the journal on the node)",
                                 {"changed": False})
    return pci.DeviceSelector(vendor=params.get("vendor"), device=params.get("device"),
                              class_prefixes=params.get("class_prefixes"), bdfs=params.get("bdfs"))


def _bridge_result(entry: dict) -> dict:
    ctl = entry["acs"]["ctl"] if entry["acs"] else None
    return {"bdf": entry["bdf"], "port_type": entry["port_type"], "gpus": sorted(entry["gpus"]),
            "acs": entry["acs"] is not None, "acs_cap": entry["acs"]["cap"] if entry["acs"] else None,
            "acs_ctl_before": ctl, "acs_ctl_after": ctl, "vfio_devices": entry["vfio"], "changed": False,
            "skipped": False, "failed": False, "refused": False, "reason": ""}


def _target(before: int, original: int | None) -> int:
    """ACSCtl after the write: redirect bits cleared, or (restore) the original's redirect bits back."""
    if original is None:
        return before & ~REDIRECT_MASK & 0xFFFF
    return (before & ~REDIRECT_MASK) | (original & REDIRECT_MASK)


def _plan(paths: dict, originals: dict | None) -> tuple:
    """One result per bridge on a GPU path (per journaled bridge with ``originals``) and the writes."""
    results, targets = [], {}
    for bdf, entry in sorted(paths["bridges"].items()):
        if originals is not None and bdf not in originals:
            continue
        r = _bridge_result(entry)
        results.append(r)
        if entry["error"]:
            r["failed"], r["reason"] = True, entry["error"]
            continue
        if entry["acs"] is None:
            r["skipped"], r["reason"] = True, NO_ACS
            continue
        before = entry["acs"]["ctl"]
        after = _target(before, originals.get(bdf) if originals is not None else None)
        if after == before:
            r["reason"] = "already at the recorded original" if originals is not None else "redirect already off"
            continue
        if entry["vfio"] and originals is None:
            r["failed"], r["refused"] = True, True
            r["reason"] = ("refused: %s below this bridge is bound to vfio-pci, and ACS redirect is what isolates a "
                           "passthrough device; unbind it or set mode=unmanaged" % ", ".join(entry["vfio"]))
            continue
        fault = pci.write_fault({"path": entry["path"]})
        if fault:
            r["failed"], r["reason"] = True, fault
            continue
        targets[bdf] = (entry["path"], before, after)
        r["acs_ctl_after"], r["changed"] = after, True
    return results, targets


def _assignment(after: int) -> str:
    """``ECAP_ACS+6.w=VVVV:002c``: the mask keeps setpci from writing any other ACSCtl bit."""
    return "%s=%04x:%04x" % (SETPCI_ACS_CTRL, after & REDIRECT_MASK, REDIRECT_MASK)


def _read_ctl(path: str) -> int | None:
    try:
        with open(os.path.join(path, "config"), "rb") as fh:
            acs = decode_acs(fh.read())
    except OSError:
        return None
    return acs["ctl"] if acs else None


def _setpci(call: family.Call, node: Node, targets: dict) -> tuple:
    """One setpci process writes every target; after a failed batch each one not yet written is written alone."""
    binary = node.bin_path(call.lookup, "setpci", "pciutils")
    base = [binary] + node.pciutils_args()

    def write(items):
        argv = list(base)
        for bdf, (_path, _before, after) in items:
            argv += ["-s", bdf, _assignment(after)]
        rc, _out, err = call.run_command(argv)
        return rc, (err or "").strip()

    calls, errors = 1, {}
    rc, err = write(sorted(targets.items()))
    after = {b: _read_ctl(t[0]) for b, t in targets.items()}
    if rc or err:
        for bdf, target in sorted(targets.items()):
            if after[bdf] == target[2]:
                continue
            calls += 1
            rc1, err1 = write([(bdf, target)])
            if rc1 or err1:
                errors[bdf] = "setpci rc %s: %s" % (rc1, err1 or "no message")
            after[bdf] = _read_ctl(target[0])
    return after, errors, calls


def _judge(results: list, targets: dict, after: dict, errors: dict, warnings: list) -> None:
    """Each written bridge by its read-back; a cause for each one that did not take."""
    by_bdf = {r["bdf"]: r for r in results}
    for bdf, (path, before, want) in sorted(targets.items()):
        r, got = by_bdf[bdf], after.get(bdf)
        r["acs_ctl_after"] = got
        r["changed"] = got is not None and got != before
        if got == want:
            r["reason"] = "set"
            continue
        if got is not None and (got ^ want) & REDIRECT_MASK == 0:
            r["reason"] = "set"
            warnings.append("%s: ACSCtl bits outside ReqRedir/CmpltRedir/EgressCtrl changed meanwhile "
                            "(0x%04x -> 0x%04x); not by this module, which writes with mask 0x%04x"
                            % (bdf, before, got, REDIRECT_MASK))
            continue
        r["failed"] = True
        if got is None:
            r["reason"] = "read-back failed: %s/config is gone or has no ACS capability any more" % path
        elif bdf in errors:
            r["reason"] = "write refused: %s" % errors[bdf]
        else:
            r["reason"] = ("wrote ACSCtl 0x%04x but it reads back 0x%04x (%s): the write did not take"
                           % (want, got, describe(got)))


def _hex(value: int | None) -> str | None:
    return None if value is None else "0x%04x" % value


def _public(results: list) -> list:
    """Bridge results as returned: ACS registers in hex with their lspci decoding."""
    out = []
    for r in results:
        r = dict(r)
        for key in ("acs_ctl_before", "acs_ctl_after"):
            r[key.replace("acs_ctl", "acs_ctl_decoded")] = describe(r[key]) if r[key] is not None else None
            r[key] = _hex(r[key])
        out.append(r)
    return out


def _diff(results: list) -> dict:
    diff = {"before": {}, "after": {}}
    for r in results:
        if r["acs"] and r["acs_ctl_before"] is not None:
            diff["before"][r["bdf"]] = {"ACSCtl": describe(r["acs_ctl_before"])}
            after = r["acs_ctl_after"] if r["acs_ctl_after"] is not None else r["acs_ctl_before"]
            diff["after"][r["bdf"]] = {"ACSCtl": describe(after)}
    return diff


def failure_message(result: dict, restore: bool, check_mode: bool) -> str:
    """Every failed bridge with its cause, and what happened to the others."""
    failed = [r for r in result["bridges"] if r["failed"]]
    done = [r for r in result["bridges"] if r["changed"]]
    verb = "restored" if restore else "set"
    causes = "; ".join("%s: %s" % (r["bdf"], r["reason"]) for r in failed)
    msg = "ACS redirect could not be %s on %d bridge(s): %s" % ("restored" if restore else "disabled", len(failed),
                                                                causes)
    if check_mode:
        return "check mode: a real run would fail. %s. %d other bridge(s) would be %s" % (msg, len(done), verb)
    return "%s. %d other bridge(s) were %s" % (msg, len(done), verb)


def _record(journal, results, targets, restore, check_mode) -> None:
    """Originals of what will change, saved before the first write; restore drops entries already back."""
    if journal is None or check_mode:
        return
    for r in results:
        if restore and not r["failed"] and not r["skipped"] and r["bdf"] not in targets:
            journal.drop(NAME, r["bdf"])
        elif not restore and r["bdf"] in targets:
            journal.record(NAME, r["bdf"], r["acs_ctl_before"])
    try:
        journal.save()
    except OSError as exc:
        raise family.FamilyError("cannot save the journal %s (%s); nothing was written" % (journal.path, exc),
                                 {"changed": False}) from exc


def _select_paths(node: Node, selector: pci.DeviceSelector, allow_empty: bool) -> dict:
    """The GPU paths of the selection; FamilyError (nothing written) for absent BDFs or an empty selection."""
    if selector.bdfs:
        present = set(node.listdir(SYSFS_PCI_DEVICES))
        missing = [b for b in selector.bdfs if b not in present]
        if missing:
            raise family.FamilyError("bdfs not present on the node: %s (present: %s)"
                                     % (", ".join(missing), ", ".join(sorted(present)) or "none"), {"changed": False})
    paths = gpu_paths(node, selector)
    if not paths["gpus"] and not allow_empty:
        raise family.FamilyError("no PCI device matches the selection (%s); set allow_empty: true to accept a node "
                                 "without such devices" % selector.describe(), {"changed": False})
    return paths


def _absent(bdf: str) -> dict:
    return {"bdf": bdf, "port_type": None, "gpus": [], "acs": False, "acs_cap": None, "acs_ctl_before": None,
            "acs_ctl_after": None, "vfio_devices": [], "changed": False, "skipped": True, "failed": False,
            "refused": False, "reason": "recorded in the journal but not present on the node; journal entry kept"}


def execute(call: family.Call, node: Node, selector: pci.DeviceSelector | None, journal, restore: bool) -> dict:
    """Plan, journal, write and read back (or restore the journal's originals); the result dict."""
    warnings = []
    if restore:
        from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs_restore

        originals = pcie_acs_restore.originals(journal)
        paths, absent = pcie_acs_restore.journal_bridges(node, originals)
        gpus = []
    else:
        originals, absent = None, []
        paths = _select_paths(node, selector, bool(call.params.get("allow_empty")))
        gpus = [{"bdf": g["bdf"], "bridges": g["bridges"]} for g in paths["gpus"]]
    results, targets = _plan(paths, originals)
    results += [_absent(b) for b in absent]
    warnings += ["%s: %s" % (b, _absent(b)["reason"]) for b in absent]
    with_acs = sorted(r["bdf"] for r in results if r["acs"])
    # The kernel argument never names a bridge above a vfio-pci device (the runtime write refuses it too).
    arg_bridges = [r["bdf"] for r in results if r["acs"] and not r["vfio_devices"]]
    result = {"changed": bool(targets), "gpus": gpus, "lockdown": lockdown_mode(node), "setpci_calls": 0,
              "not_applicable": not restore and not with_acs,
              "kernel_arg": kernel_arg(arg_bridges) if arg_bridges and not restore else None}
    if targets and result["lockdown"] in ("integrity", "confidentiality"):
        result.update(changed=False, bridges=_public(results), failed_bridges=sorted(targets))
        raise family.FamilyError("kernel lockdown is in %s mode: the kernel refuses PCI config-space writes from user "
                                 "space, so ACS redirect cannot be changed at runtime on %s; nothing was written. Boot "
                                 "with pci=disable_acs_redir=<those bridges> on the kernel command line, or without "
                                 "lockdown"
                                 % (result["lockdown"], ", ".join(sorted(targets))), result)
    _record(journal, results, targets, restore, call.check_mode)
    result["diff_data"] = _diff(results)
    if targets and not call.check_mode:
        after, errors, result["setpci_calls"] = _setpci(call, node, targets)
        _judge(results, targets, after, errors, warnings)
        _after_write(journal, results, targets, restore)
        result["diff_data"]["after"].update(_diff(results)["after"])
        result["changed"] = any(r["changed"] for r in results)
    for warning in warnings:
        call.warn(warning)
    if result["not_applicable"]:
        family.warn_not_applicable(call, {"mode": _not_applicable_reason(gpus)})
    result.update(bridges=_public(results), failed_bridges=sorted(r["bdf"] for r in results if r["failed"]))
    diff = result.pop("diff_data")
    if call.diff:
        result["diff"] = diff
    if result["failed_bridges"]:
        raise family.FamilyError(failure_message(result, restore, call.check_mode), result)
    return result


def _not_applicable_reason(gpus: list) -> str:
    """Why redirect cannot be disabled on the selection: no GPU, or no bridge with ACS on their paths."""
    if not gpus:
        return "no PCI device matches the selection (allow_empty)"
    return "no bridge on the path of %s has an ACS capability: redirect does not exist there" % (
        ", ".join(g["bdf"] for g in gpus))


def _after_write(journal, results: list, targets: dict, restore: bool) -> None:
    """Restored entries leave the journal; a runtime change is stamped (verification reads the log from it)."""
    if journal is None:
        return
    for r in results:
        if restore and r["bdf"] in targets and not r["failed"]:
            journal.drop(NAME, r["bdf"])
    if not restore:
        journal.mark_applied(NAME)
    journal.save()


def run(call: family.Call) -> dict:
    """The pcie_acs module: options in, the bridges' results out; FamilyError with what was done."""
    params = call.params
    selector = check_params(params)
    try:
        # An empty root is refused as every module refuses it (Node): it must never become the live "/".
        node = Node.open(params.get("root", "/"))
        journal = Journal(node, params["journal"]) if params.get("journal") else None
    except NodeError as exc:
        raise family.FamilyError(str(exc), {"changed": False}) from None
    if (params.get("mode") or "disable_redirect") == "unmanaged" and not params.get("restore"):
        return {"changed": False, "gpus": [], "bridges": [], "failed_bridges": [], "lockdown": lockdown_mode(node),
                "setpci_calls": 0, "not_applicable": False, "kernel_arg": None,
                "msg": "mode=unmanaged: ACS is left as it is"}
    try:
        return execute(call, node, selector, journal, bool(params.get("restore")))
    except NodeError as exc:  # setpci missing, a sysfs directory unreadable
        raise family.FamilyError(str(exc), {"changed": False}) from None


# -- Boot re-apply (its verification is pcie_acs_verify.py)


def summary(result: dict) -> str:
    if result.get("not_applicable"):
        return "not applicable: no bridge on a GPU path has ACS"
    bridges = result.get("bridges") or []
    changed = [b for b in bridges if b.get("changed")]
    skipped = [b for b in bridges if b.get("skipped")]
    return "redirect disabled on %d bridge(s), %d already off, %d without ACS" % (
        len(changed), len(bridges) - len(changed) - len(skipped), len(skipped))


def _plan_half():
    """The plan half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs_plan
    return pcie_acs_plan


def _verification():
    """The verification half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs_verify
    return pcie_acs_verify


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "PCIe ACS redirect"},
    module="pcie_acs",
    read=family.later(_verification, "read"),
    facts_doc=family.later(_verification, "FACTS_DOC"),
    run=run,
    evaluate=family.later(_verification, "evaluate"),
    reads_boot_config=family.later(_verification, "reads_boot_config"),
    boot=family.later(_plan_half, "boot"),
    from_role=family.later(_plan_half, "from_role"),
    role_problems=family.later(_plan_half, "role_problems"),
    runtime_options=family.later(_plan_half, "runtime_options"),
    restore_options=family.later(_plan_half, "restore_options"),
    argument_spec=ARGUMENT_SPEC,
    kernel_args=family.later(_plan_half, "kernel_args"),
    summary=summary,
    items="bridges",
    validate={NAME: family.later(_plan_half, "desired_problems")},
)
