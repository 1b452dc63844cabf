# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pcie_aspm family's plan half: what the controller calls (the desired state from the role's variables, its
validation, the module's options) and what the persistent flow and the boot re-apply ask of it.

Imported when one of them is first called (``family.later`` in families/pcie_aspm.py), never by a run that only
applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_aspm import (
    NAME,
    PERSIST,
    POLICIES,
    device_selector,
    execute,
    params_problems,
    scan,
)


def kernel_arg(policy: str) -> str:
    """The kernel argument that sets the policy at boot."""
    return "pcie_aspm.policy=%s" % policy


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["pcie_aspm"]``: ``{policy, links, persist}`` and the PCI selector keys."""
    shape = family.entry_problem(NAME, want, "policy, links, persist and the PCI selector keys")
    if shape or want is None:
        return shape
    out = params_problems(want)
    if want.get("persist") is not None and want["persist"] not in PERSIST:
        out.append(("persist", "persist must be one of %s, got %r" % (", ".join(PERSIST), want["persist"])))
    return out + pci.selector_problems(want)


def boot(node: Node, want: dict) -> tuple:
    """Re-apply ``desired["pcie_aspm"]`` at boot (link attributes and the policy start from the kernel's defaults)."""
    params = dict(want, restore=False, journal=None, allow_empty=True)
    params.pop("persist", None)
    call = family.Call(params=params)
    try:
        result = execute(call, node, None, device_selector(params))
    except (family.FamilyError, NodeError) as exc:
        return False, str(exc)
    if result["unsupported"]:
        return True, "; ".join("%s unsupported: %s" % kv for kv in sorted(result["unsupported"].items()))
    done = [i["name"] for i in result["items"] if i["changed"]]
    return True, "set %s" % ", ".join(done) if done else "already set"


def kernel_args(pc, remove: bool = False) -> list:
    """``pcie_aspm.policy=<policy>`` with persist kernel_arg where the kernel controls ASPM; ``remove``: all."""
    if remove:
        return [kernel_arg(p) for p in POLICIES]
    want = pc.desired.get(NAME) or {}
    if want.get("persist") != "kernel_arg" or not want.get("policy"):
        return []
    facts = scan(pc.node)
    if facts["control"] != "os":
        if pc.unfit is not None:
            pc.unfit["%s.policy" % NAME] = facts["control_reason"]
        return []
    return [kernel_arg(want["policy"])]


def from_role(v: dict, shared: dict) -> dict:
    policy, links = v.get("gpunode_tuning_pcie_aspm_policy"), v.get("gpunode_tuning_pcie_aspm_links") or "keep"
    if policy is None and links == "keep":
        return {NAME: None}
    return {NAME: dict(policy=policy, links=links, persist=v.get("gpunode_tuning_pcie_aspm_persist") or "boot_unit",
                       allow_empty=True, **shared["selector"])}


def runtime_options(desired: dict, v: dict) -> dict | None:
    want = desired.get(NAME)
    if not want:
        return None
    return {k: x for k, x in want.items() if x is not None and k != "persist"}


def role_problems(values: dict) -> list:
    """The policy persisted by kernel argument needs the command-line family on."""
    if (values.get("gpunode_tuning_pcie_aspm_policy") and values.get("gpunode_tuning_pcie_aspm_persist") == "kernel_arg"
            and values.get("gpunode_tuning_kernel_cmdline_enabled") is False):
        return ["gpunode_tuning_pcie_aspm_persist: kernel_arg needs gpunode_tuning_kernel_cmdline_enabled: true (the "
                "command-line family writes pcie_aspm.policy=); set it, or gpunode_tuning_pcie_aspm_persist: boot_unit"]
    return []
