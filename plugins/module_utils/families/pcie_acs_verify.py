# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PCIe ACS family's verification half: its facts (the bridges on the GPUs' paths) and the rows of its
settings (pcie_acs.py is the family; a run that only applies never imports this file).
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    Node,
    cmdline_args,
    lockdown_mode,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_acs import (
    NAME,
    NO_ACS,
    gpu_paths,
    kernel_arg,
)

# tuning_info's RETURN of tuning_facts.pcie_acs (tools/generate.py writes it there).
FACTS_DOC = r"""
description:
  - The P2P path of the selected GPUs (module_utils/families/pcie_acs.py, the C(pcie_acs) family's read), C(gpus)
    each GPU's chain of bridges up to its root port, C(bridges) per bridge the ACS capability (ACSCap and ACSCtl
    decoded as SrcValid, TransBlk, ReqRedir, CmpltRedir, UpstreamFwd, EgressCtrl, DirectTrans) or no ACS
    capability, and the devices bound to vfio-pci below it, each GPU's IOMMU group and its default domain type,
    C(kernel_args) the ACS arguments of the running kernel (C(pci=disable_acs_redir=)), C(lockdown) the kernel
    lockdown mode.
returned: always
type: dict
"""


def read(node: Node, selector: pci.DeviceSelector | None = None, query: object = None) -> dict:
    """The family's facts (``facts["pcie_acs"]``): GPU paths, their bridges' ACS, vfio-pci below them, the IOMMU
    groups of the GPUs and the ACS arguments of the running kernel (``pci=disable_acs_redir=``)."""
    paths = gpu_paths(node, selector or pci.DeviceSelector(), query)
    for entry in paths["bridges"].values():
        entry.pop("path", None)
        if entry["acs"]:  # registers in hex, as lspci and the module's result show them
            entry["acs"] = dict(entry["acs"], cap="0x%04x" % entry["acs"]["cap"], ctl="0x%04x" % entry["acs"]["ctl"])
    paths["kernel_args"] = [a for a in cmdline_args(node) if "disable_acs_redir=" in a]
    paths["lockdown"] = lockdown_mode(node)
    return paths


def _redirect_text(ctl_bits: dict) -> str:
    return " ".join("%s%s" % (n, "+" if ctl_bits.get(n) else "-") for n in ("ReqRedir", "CmpltRedir", "EgressCtrl"))


DESIRED_TEXT = "ReqRedir- CmpltRedir- EgressCtrl-"


def _persisted(want: dict, ctx, arg: str | None):
    if want.get("persist") == "kernel_arg":
        return arg if arg and ctx.arg(arg)["configured"] else None
    return ctx.boot_persisted(DESIRED_TEXT)


def _bridge_row(entry: dict, want: dict, ctx, arg: str | None, lockdown: str | None) -> dict:
    bdf = entry["bdf"]
    if entry.get("error"):
        return family.setting(NAME, bdf, DESIRED_TEXT, None, "unsupported", entry["error"])
    if not entry.get("acs"):
        return family.setting(NAME, bdf, DESIRED_TEXT, None, "not_applicable", NO_ACS)
    running = _redirect_text(entry["acs"]["ctl_bits"])
    persisted = _persisted(want, ctx, arg)
    if running == DESIRED_TEXT:
        return family.setting(NAME, bdf, DESIRED_TEXT, running, "applied", "", persisted)
    if entry.get("vfio"):
        return family.setting(NAME, bdf, DESIRED_TEXT, running, "drifted", "refused: %s below it is bound to "
                              "vfio-pci (ACS isolates passthrough devices)" % ", ".join(entry["vfio"]), persisted)
    if want.get("persist") == "kernel_arg" and arg and ctx.arg(arg)["configured"] and not ctx.arg(arg)["running"]:
        return family.setting(NAME, bdf, DESIRED_TEXT, running, "pending_reboot",
                              "%s is configured for the next boot, not running" % arg, persisted)
    why = ["%s: peer-to-peer requests of GPUs %s go up to the root complex" % (running, ", ".join(entry["gpus"]))]
    if lockdown in ("integrity", "confidentiality"):
        why.append("kernel lockdown (%s) refuses config-space writes from user space" % lockdown)
    return family.setting(NAME, bdf, DESIRED_TEXT, running, "drifted", "; ".join(why), persisted)


def evaluate(facts: dict, desired: dict, ctx) -> list:
    """One row per bridge on a GPU path: redirect off is ``applied``; nothing when the mode is unmanaged."""
    want = desired.get(NAME) or {}
    if want.get("mode") != "disable_redirect":
        return []
    p2p = facts.get(NAME)  # what read() returned, under the family's name (Family.read)
    if not isinstance(p2p, dict):
        return [family.setting(NAME, "bridges", DESIRED_TEXT, None, "unsupported",
                               "the facts have no %s section (ACS was not read)" % NAME)]
    if not p2p.get("gpus"):
        return [family.setting(NAME, "bridges", DESIRED_TEXT, None, "not_applicable", "no GPU is selected")]
    bridges = [p2p["bridges"][b] for b in sorted(p2p.get("bridges") or {})]
    with_acs = [e["bdf"] for e in bridges if e.get("acs")]
    if not with_acs and not any(e.get("error") for e in bridges):
        return [family.setting(NAME, "bridges", DESIRED_TEXT, None, "not_applicable",
                               "no bridge on a GPU path has an ACS capability")]
    arg_bridges = [e["bdf"] for e in bridges if e.get("acs") and not e.get("vfio")]
    arg = kernel_arg(arg_bridges) if arg_bridges else None
    return [_bridge_row(e, want, ctx, arg, p2p.get("lockdown")) for e in bridges]


def reads_boot_config(desired: dict) -> bool:
    """Redirect persisted by kernel argument is judged against the configured one (pending_reboot)."""
    return (desired.get(NAME) or {}).get("persist") == "kernel_arg"
