# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cpufreq family's plan half: what the controller calls (the desired state from the role's variables, its
validation, the module's options) and what the persistent flow and the boot re-apply (flows/boot.py) ask of it.

Imported when one of them is first called (``family.later`` in families/cpufreq.py), never by a run that only
applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils.core.calls import SystemLookup, run_argv
from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu import cpu_vendor
from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu_freq import (
    CPUFREQ_DIR,
    NodeFreq,
    driver_kernel_args,
    validate,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Call
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families.cpufreq import (
    NAME,
    UDEV_SETTLE_TIMEOUT,
    Outcome,
    run_writes,
)


def from_role(v: dict, shared: dict) -> dict:
    """Governor, EPP, boost, the driver and its mode; unset ones (null or empty) are left alone."""
    if not v["gpunode_tuning_cpufreq_enabled"]:
        return {NAME: None}
    boost = v["gpunode_tuning_cpufreq_boost"]
    return {NAME: {
        "governor": v["gpunode_tuning_cpufreq_governor"] or None, "epp": v["gpunode_tuning_cpufreq_epp"] or None,
        "boost": None if boost is None else bool(boost), "driver": v["gpunode_tuning_cpufreq_driver"] or None,
        "amd_pstate_mode": v["gpunode_tuning_cpufreq_amd_pstate_mode"] or None,
        "intel_pstate_status": v["gpunode_tuning_cpufreq_intel_pstate_status"] or None}}


def runtime_options(desired: dict, v: dict) -> dict | None:
    """cpu_freq's options: the set ones (it only plans the driver switch)."""
    want = desired.get(NAME)
    return None if want is None else {k: x for k, x in want.items() if x is not None}


def restore_options(v: dict) -> dict:
    return {"restore": True}


def kernel_args(pc, remove: bool = False) -> list:
    """What a driver switch needs on the command line (amd_pstate=active on acpi-cpufreq), planned by cpu_freq
    in check mode; with ``remove``, every argument the desired driver may have got on any node."""
    want = pc.desired.get(NAME) or {}
    driver, mode = pc.settings.get("cpufreq_driver"), pc.settings.get("cpufreq_amd_pstate_mode")
    if remove:
        return list(driver_kernel_args(driver, mode).removable) if driver else []
    if not want:
        return []
    options = {k: want.get(k) for k in ("driver", "amd_pstate_mode", "intel_pstate_status") if want.get(k)}
    result = pc.run_family(NAME, options, check_mode=True)
    why = (result.get("unsupported") or {}).get("driver")
    if why and pc.unfit is not None:  # no argument for a driver the node cannot take, and no reboot for it
        pc.unfit["%s.driver" % NAME] = why
    return list(result.get("kernel_args") or [])


def _settle_udev(node: Node) -> str:
    """On a live node without a cpufreq policy yet, wait (bounded) for udev to load the driver; a note if not."""
    if not node.is_live or any(n.startswith("policy") for n in node.listdir(CPUFREQ_DIR)):
        return ""
    udevadm = SystemLookup.get_bin_path("udevadm")
    if not udevadm:
        return ""
    rc, _out, err = run_argv([udevadm, "settle", "--timeout=%d" % UDEV_SETTLE_TIMEOUT])
    if rc:
        return "; udev did not settle within %d s (%s): cpufreq may not have been ready" % (
            UDEV_SETTLE_TIMEOUT, err.strip() or "rc %d" % rc)
    return ""


def boot(node: Node, want: dict) -> tuple[bool, str]:
    """cpu_freq's validation and writes (pstate mode, then governor, then EPP, then boost), no journal."""
    settle = _settle_udev(node)
    changed, failure, skipped = reapply(node, want)
    notes = settle + "".join("; %s not applied: %s" % (k, why) for k, why in sorted(skipped.items()))
    if failure:
        return False, failure + notes
    asked = ", ".join("%s=%s" % (k, want[k]) for k in ("governor", "epp", "boost") if want.get(k) is not None)
    return True, "%s%s%s" % (asked or "nothing asked", " (changed)" if changed else " (already set)", notes)


def reapply(node: Node, desired: dict) -> tuple[bool, str | None, dict]:
    """Boot re-apply (``boot.py``): the module's validation and writes for ``desired``, without a journal."""
    params = dict.fromkeys(("governor", "epp", "boost", "driver", "amd_pstate_mode", "intel_pstate_status"))
    params.update((k, v) for k, v in desired.items() if k in params)
    freq = NodeFreq(node)
    if not freq.policies:
        return False, None, {"cpufreq": "this node has no cpufreq policies (/%s is empty or missing)" % CPUFREQ_DIR}
    plan = validate(params, freq, cpu_vendor(node), node)
    outcome = Outcome()
    _after, changed = run_writes(Call(params), node, None, freq, plan, outcome)
    return changed, outcome.message() or None, plan["skip"]
