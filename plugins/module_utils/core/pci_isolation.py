# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What verification reads of the GPUs' isolation: the bridges that redirect peer traffic (ACS) and the IOMMU.

Apart from core/pci.py so that a run that only applies does not compile it (gpu_p2p and iommu's verification
import it).
"""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, cmdline_args
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import (
    DeviceSelector,
    bridge_chain,
    decode_acs,
    list_devices,
)

# The kernel arguments that choose the IOMMU's mode (kernel-parameters.txt).
IOMMU_ARG_PREFIXES = ("iommu=", "iommu.", "amd_iommu=", "intel_iommu=")


def redirecting_bridges(node: Node, selector: DeviceSelector, devices: list | None = None) -> dict:
    """``{device bdf: [bridge bdf, ...]}``: the bridges above each selected device with ACS ReqRedir or CmpltRedir
    on (peer traffic sent up to the root complex). A bridge whose config space cannot be read counts as not."""
    out, seen = {}, {}
    for dev in list_devices(node) if devices is None else devices:
        if not selector.matches(dev):
            continue
        for bdf, path in bridge_chain(node, dev["bdf"]):
            if bdf not in seen:
                try:
                    with open(os.path.join(path, "config"), "rb") as fh:
                        acs = decode_acs(fh.read())
                except OSError:
                    acs = None
                bits = (acs or {}).get("ctl_bits") or {}
                seen[bdf] = bool(bits.get("ReqRedir") or bits.get("CmpltRedir"))
            if seen[bdf]:
                out.setdefault(dev["bdf"], []).append(bdf)
    return out


def iommu_state(node: Node) -> dict:
    """Whether an IOMMU is active (/sys/class/iommu), its units, and the IOMMU arguments of the running kernel."""
    units = node.listdir("sys/class/iommu")
    args = [a for a in cmdline_args(node) if a.startswith(IOMMU_ARG_PREFIXES)]
    return {"active": bool(units), "units": units, "kernel_args": args}
