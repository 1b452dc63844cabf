# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pcie_mrrs family's plan half: what the controller calls (the desired state from the role's variables, its
validation, the module's options) and what the persistent flow asks of it.

Imported when one of them is first called (``family.later`` in families/pcie_mrrs.py), never by a run that only
applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import encode_mrrs, selector_problems
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_mrrs import NAME


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
