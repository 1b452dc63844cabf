# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The IOMMU family's verification half: its facts (the GPUs' IOMMU groups) and its row (iommu.py is the family;
a run that does not verify never imports this file).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, pci, pci_isolation
from ansible_collections.gpunode.tuning.plugins.module_utils.core.kernel_args import iommu_kernel_args
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families.iommu import (
    NAME,
    validate,
)

# /sys/kernel/iommu_groups/N/type -> the mode it is (anything else, e.g. blocked: neither).
GROUP_MODES = {"identity": "passthrough", "DMA": "translated", "DMA-FQ": "translated"}


# tuning_info's RETURN of tuning_facts.iommu (tools/generate.py writes it there).
FACTS_DOC = r"""
description:
  - The IOMMU that translates the selected GPUs' DMA, from sysfs and the running command line.
returned: always
type: dict
contains:
  active:
    description: True when an IOMMU is active (C(/sys/class/iommu) lists a unit).
    type: bool
    returned: always
    sample: true
  units:
    description: The IOMMU units of C(/sys/class/iommu).
    type: list
    elements: str
    returned: always
    sample: [ivhd0]
  kernel_args:
    description: The IOMMU arguments of the running kernel (C(iommu=), C(iommu.), C(amd_iommu=), C(intel_iommu=)).
    type: list
    elements: str
    returned: always
    sample: [iommu=pt]
  gpus:
    description:
      - Per selected GPU its C(bdf), C(iommu_group) (null without one) and C(iommu_group_type), the group's
        default domain type (V(identity) is passthrough, V(DMA) and V(DMA-FQ) translated).
    type: list
    elements: dict
    returned: always
    sample: [{bdf: "0000:41:00.0", iommu_group: "32", iommu_group_type: identity}]
"""


def read(node: Node, selector: pci.DeviceSelector | None = None, query: object = None) -> dict:
    """The family's facts (``facts["iommu"]``): whether an IOMMU is active, its arguments running, and the IOMMU
    group (and its default domain type) of each selected GPU."""
    selector = selector or pci.DeviceSelector()
    gpus = []
    for dev in pci.listed(node, query):
        if selector.matches(dev):
            group, group_type = pci.iommu_group(node, dev["bdf"])
            gpus.append({"bdf": dev["bdf"], "iommu_group": group, "iommu_group_type": group_type})
    return dict(pci_isolation.iommu_state(node), gpus=gpus)


def _args_state(args: list, ctx: Any) -> tuple:
    """``(configured: True/False/None, running: bool, persisted text or None)`` of all of ``args``."""
    views = [ctx.arg(a) for a in args]
    if any(v["configured"] is None for v in views):
        configured = None
    else:
        configured = all(v["configured"] for v in views)
    running = all(v["running"] for v in views)
    return configured, running, " ".join(args) if configured else None


def _row(mode: str, running: Any, state: str, reason: str, persisted: Any = None) -> dict:
    return family.setting(NAME, "mode", mode, running, state, reason, persisted)


def _inactive_row(mode: str, args: list, ctx: Any) -> dict:
    """No IOMMU active: pending when the mode's arguments wait for a reboot, else nothing to judge."""
    configured, running, persisted = _args_state(args, ctx)
    text = " ".join(args)
    if configured and not running:
        return _row(mode, "no IOMMU active", "pending_reboot",
                    "%s is configured for the next boot; not on /proc/cmdline yet" % text, persisted)
    if mode == "passthrough":
        why = "no IOMMU is active (/sys/class/iommu is empty): DMA is not translated, P2P is not affected"
    else:
        why = ("no IOMMU is active (/sys/class/iommu is empty): it is disabled in the firmware (AMD-Vi / VT-d) "
               "or by the kernel; %s cannot translate DMA without it" % (text or "the mode"))
    return _row(mode, "no IOMMU active", "not_applicable", why, persisted)


def _types(gpus: list) -> dict:
    """``{group type: [GPU bdf, ...]}`` of the GPUs that are in an IOMMU group."""
    out = {}
    for g in gpus:
        if g.get("iommu_group_type"):
            out.setdefault(g["iommu_group_type"], []).append(g["bdf"])
    return out


def _active_row(mode: str, gpus: list, args: list, ctx: Any) -> dict:
    """The GPUs' group types against the mode; pending when the mode's arguments wait for a reboot."""
    types = _types(gpus)
    if not types:
        return _row(mode, None, "not_applicable", "no selected GPU is in an IOMMU group")
    running_text = "; ".join("%s on %s" % (t, ", ".join(sorted(b))) for t, b in sorted(types.items()))
    configured, running, persisted = _args_state(args, ctx)
    wrong = sorted(b for t, bdfs in types.items() if GROUP_MODES.get(t) != mode for b in bdfs)
    if not wrong:
        why = "" if configured or configured is None else \
            "%s is not configured for the next boot: the kernel's default decides after a reboot" % " ".join(args)
        return _row(mode, running_text, "applied", why, persisted)
    text = " ".join(args)
    if configured and not running:
        return _row(mode, running_text, "pending_reboot",
                    "%s is configured for the next boot; not on /proc/cmdline yet" % text, persisted)
    if running:
        why = ("%s is on /proc/cmdline but the groups of %s are not %s: a group with a driver that asks for "
               "its own domain (vfio-pci), or a kernel that ignores the argument" % (text, ", ".join(wrong), mode))
    elif configured is None:
        why = "%s is not on /proc/cmdline; the boot configuration is unknown (%s)" % (text, ctx.cmdline_error)
    else:
        why = ("the groups of %s are not %s and %s is neither on /proc/cmdline nor configured for the next boot "
               "(tune --tags persistent adds it; a reboot brings it)" % (", ".join(wrong), mode, text))
    return _row(mode, running_text, "drifted", why, persisted)


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """One ``iommu.mode`` row: the GPUs' IOMMU group types against the desired mode; none when unmanaged."""
    mode = validate((desired or {}).get(NAME))
    if mode == "unmanaged":
        return []
    mine = facts.get(NAME)
    if not isinstance(mine, dict):
        return [_row(mode, None, "unsupported", "the facts have no %s section (the IOMMU was not read)" % NAME)]
    args = iommu_kernel_args(mode, (facts.get("cpu") or {}).get("vendor")).needed
    if not mine.get("active"):
        return [_inactive_row(mode, args, ctx)]
    return [_active_row(mode, mine.get("gpus") or [], args, ctx)]


def reads_boot_config(desired: dict) -> bool:
    """A managed mode is judged against the arguments configured for the next boot."""
    return validate((desired or {}).get(NAME)) != "unmanaged"
