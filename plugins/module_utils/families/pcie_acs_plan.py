# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pcie_acs family's plan half: what the controller calls (the desired state from the role's variables, its
validation, the module's options) and what the persistent flow and the boot re-apply (flows/boot.py) ask of it.

Imported when one of them is first called (``family.later`` in families/pcie_acs.py), never by a run that only
applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils.core import calls, family, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_acs import (
    NAME,
    PERSIST,
    check_params,
    execute,
    mode_problems,
)


def desired_problems(want) -> list:
    """``Family.validate`` of ``desired["pcie_acs"]``: ``{mode, persist, vendor, device, class_prefixes, bdfs,
    allow_empty}`` (the selector is setpci_mrrs's, ``pci.selector_problems``)."""
    shape = family.entry_problem(NAME, want, "mode, persist and the PCI selector keys")
    if shape or want is None:
        return shape
    out = mode_problems(want)
    if want.get("persist") is not None and want["persist"] not in PERSIST:
        out.append(("persist", "persist must be one of %s, got %r" % (", ".join(PERSIST), want["persist"])))
    return out + pci.selector_problems(want)


def from_role(v: dict, shared: dict) -> dict:
    """ACS redirect on the GPUs' paths (the GPUs of the MRRS selectors), unless unmanaged."""
    if v["gpunode_tuning_pcie_acs"] == "unmanaged":
        return {NAME: None}
    return {NAME: dict(mode=v["gpunode_tuning_pcie_acs"], persist=v["gpunode_tuning_pcie_acs_persist"],
                       allow_empty=True, **shared["selector"])}


def runtime_options(desired: dict, v: dict) -> dict | None:
    """pcie_acs' options for the runtime flow: only ``disable_redirect`` writes anything."""
    want = desired.get(NAME)
    if not want or want.get("mode") != "disable_redirect":
        return None
    return {k: x for k, x in want.items() if x is not None and k != "persist"}


def restore_options(v: dict) -> dict:
    return {"restore": True}


def kernel_args(pc, remove: bool = False) -> list:
    """``pci=disable_acs_redir=<bridges>`` when the kernel argument persists ACS, planned by pcie_acs in check
    mode (reading only); with ``remove``, the same plan whatever the variables say now, so that switching
    ACS off and rolling back still removes it (a failed plan only leaves the argument out then).

    Under kernel lockdown pcie_acs fails (no runtime write is possible) yet names the bridges: exactly the
    case the kernel argument is for, so only a failure without it counts.
    """
    want = pc.desired.get(NAME) or {}
    if not remove and not (want.get("mode") == "disable_redirect" and want.get("persist") == "kernel_arg"):
        return []
    selector = {k: pc.settings.get(k) for k in ("vendor", "device", "class_prefixes", "bdfs")}
    options = dict({k: v for k, v in selector.items() if v}, mode="disable_redirect", allow_empty=True)
    try:
        arg = pc.run_family(NAME, options, check_mode=True).get("kernel_arg")
    except family.FamilyError as exc:
        arg = exc.result.get("kernel_arg")
        if not arg and not remove:
            raise
    return [arg] if arg else []


def role_problems(values: dict) -> list:
    """ACS persisted by kernel argument needs the command-line family on: else nothing keeps it after a reboot."""
    if (values.get("gpunode_tuning_pcie_acs") == "disable_redirect"
            and values.get("gpunode_tuning_pcie_acs_persist") == "kernel_arg"
            and values.get("gpunode_tuning_kernel_cmdline_enabled") is False):
        return ["gpunode_tuning_pcie_acs_persist: kernel_arg needs gpunode_tuning_kernel_cmdline_enabled: true "
                "(the kernel argument is written by the command-line family; with it off nothing would keep ACS "
                "redirect off after a reboot); set gpunode_tuning_kernel_cmdline_enabled: true or "
                "gpunode_tuning_pcie_acs_persist: boot_unit"]
    return []


def boot(node: Node, want: dict) -> tuple:
    """Re-apply ``desired["pcie_acs"]`` at boot (firmware and the kernel set redirect again): ``(ok, message)``."""
    if (want.get("mode") or "disable_redirect") != "disable_redirect":
        return True, "mode %s: ACS is left as it is" % want.get("mode")
    call = family.Call(params=dict(want, restore=False, journal=None), run_command=calls.run_argv,
                       lookup=calls.SystemLookup())
    try:
        result = execute(call, node, check_params(call.params), None, False)
    except family.FamilyError as exc:
        return False, str(exc)
    except NodeError as exc:
        return False, str(exc)
    if result["not_applicable"]:
        return True, "no bridge on a GPU path has ACS: nothing to do"
    done = [r["bdf"] for r in result["bridges"] if r["changed"]]
    return True, "ACS redirect disabled on %s" % (", ".join(done) if done else "no bridge (already off)")
