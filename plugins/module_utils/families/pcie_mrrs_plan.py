# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pcie_mrrs family's plan half: what the controller calls (the desired state from the role's variables, its
validation, the module's options) and what the persistent flow and the boot re-apply (flows/boot.py) ask of it.

Imported when one of them is first called (``family.later`` in families/pcie_mrrs.py), never by a run that only
applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.calls import SystemLookup, run_argv
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import (
    DeviceSelector,
    Setpci,
    encode_mrrs,
    normalize_bdf,
    selector_problems,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_mrrs import NAME, failure_message, run_mrrs


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["pcie_mrrs"]``: ``{mrrs, vendor, device, class_prefixes, bdfs,
    allow_empty}``."""
    shape = contract.entry_problem(NAME, want, "mrrs, vendor, device, class_prefixes, bdfs, allow_empty")
    if shape or want is None:
        return shape
    out = []
    try:
        encode_mrrs(want.get("mrrs"))
    except ValueError as exc:
        out.append(("mrrs", str(exc)))
    return out + selector_problems(want)


def hotplug(want: dict) -> list:
    """The selected GPUs' vendor ids: a hot-added function (a GPU back after a reset) powers up at MRRS 512, and
    the udev rule runs the boot runner only for these vendors (no Python start per unrelated device)."""
    vendors = (want or {}).get("vendor")
    return [vendors] if isinstance(vendors, str) else list(vendors or [])


def from_role(v: dict, shared: dict) -> dict:
    """The desired MRRS of the role's variables: the value and the GPUs it applies to."""
    if not v["gpunode_tuning_pcie_mrrs_enabled"]:
        return {NAME: None}
    return {NAME: dict(mrrs=v["gpunode_tuning_pcie_mrrs"], allow_empty=bool(v["gpunode_tuning_gpu_allow_empty"]),
                       **shared["selector"])}


def runtime_options(desired: dict, v: dict) -> dict | None:
    """setpci_mrrs' options for the role's runtime flow (the selector's unset keys left out)."""
    want = desired.get(NAME)
    return None if want is None else {k: x for k, x in want.items() if x is not None}


def restore_options(v: dict) -> dict:
    return {"restore": True, "allow_empty": True}


def boot_selector(want: dict, bdf: str | None = None) -> DeviceSelector | None:
    """The module's selector for ``want``; with ``bdf`` (udev) restricted to it, None when not selected."""
    selector = DeviceSelector(vendor=want.get("vendor"), device=want.get("device"),
                              class_prefixes=want.get("class_prefixes"), bdfs=want.get("bdfs"))
    if bdf is None:
        return selector
    bdf = normalize_bdf(bdf)
    if selector.bdfs is not None and bdf not in selector.bdfs:
        return None
    # The default selector is resolved already (vendor 0x10de, GPU classes): keep it with the BDF.
    return DeviceSelector(vendor=selector.vendors, device=selector.device,
                          class_prefixes=selector.class_prefixes, bdfs=[bdf])


def boot(node: Node, want: dict, bdf: str | None = None) -> tuple[bool, str]:
    """``run_mrrs`` without a journal; ``bdf`` restricts it to one device (udev ACTION=add)."""
    size = want.get("mrrs")
    encode_mrrs(size)
    selector = boot_selector(want, bdf)
    if selector is None:
        return True, "%s is not one of the selected bdfs (%s): nothing to do" % (bdf, ", ".join(want["bdfs"]))

    def setpci_factory():
        return Setpci(run_argv, node.bin_path(SystemLookup(), "setpci", "pciutils"), node.pciutils_args())

    allow_empty = bdf is not None or bool(want.get("allow_empty"))
    result = run_mrrs(node, setpci_factory, None, False, mrrs=size, selector=selector,
                      allow_empty=allow_empty)
    notes = "".join("; warning: %s" % w for w in result["warnings"])
    if result["failed_devices"]:
        return False, failure_message(result, False, False) + notes
    done = [d["bdf"] for d in result["devices"] if d["changed"]]
    kept = [d["bdf"] for d in result["devices"] if not d["changed"] and not d["skipped"]]
    if not result["devices"]:
        return True, "no PCI Express device matches (%s)%s" % (selector.describe(), notes)
    return True, "MRRS %d set on %d device(s)%s, %d already at it%s" % (
        size, len(done), (" (%s)" % ", ".join(done)) if done else "", len(kept), notes)
