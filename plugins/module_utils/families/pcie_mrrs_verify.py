# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PCIe MRRS family's verification half: the rows of its settings (pcie_mrrs.py is the family; a run that
only applies never imports this file: docs/dev/adding-a-family.md, "The verification half")."""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import setting
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_mrrs import NAME


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """One setting per selected PCI device: its MRRS against ``desired['pcie_mrrs']['mrrs']``."""
    wanted = desired.get(NAME) or {}
    if wanted.get("mrrs") is None:
        return []
    pci = facts.get("pci") or {}
    want = int(wanted["mrrs"])
    lockdown = (facts.get("kernel") or {}).get("lockdown")
    out = []
    devices = pci.get("devices") or []
    if not devices:
        return [setting(NAME, "devices", want, None, "not_applicable",
                        "no PCI device matches the selector (%s)" % (pci.get("selector") or "NVIDIA GPUs"))]
    for dev in devices:
        running = dev.get("mrrs")
        persisted = ctx.boot_persisted(want)
        if running is None:
            out.append(setting(NAME, dev["bdf"], want, None, "unsupported",
                               dev.get("error") or "no PCI Express capability: MRRS does not exist on it",
                               persisted))
            continue
        if running == want:
            out.append(setting(NAME, dev["bdf"], want, running, "applied", "", persisted))
            continue
        why = ["MRRS is %d bytes, not %d" % (running, want)]
        if running == 512:
            why.append("512 is the power-up default: nobody tuned this device since it was reset")
        if pci.get("pcie_bus_perf"):
            why.append("the kernel was booted with pci=pcie_bus_perf, which clamps MRRS to MPS (%s)" % dev.get("mps"))
        if lockdown in ("integrity", "confidentiality"):
            why.append("kernel lockdown (%s) refuses config-space writes from user space" % lockdown)
        out.append(setting(NAME, dev["bdf"], want, running, "drifted", "; ".join(why), persisted))
    missing = pci.get("missing_bdfs") or []
    for bdf in missing:
        out.append(setting(NAME, bdf, want, None, "not_applicable", "the node has no device at %s" % bdf))
    return out
