# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The IOMMU mode of the GPUs' DMA: the ``iommu`` family (kernel arguments and verification only).

With the IOMMU translating DMA (default domain ``DMA`` / ``DMA-FQ``) GPU peer-to-peer traffic is
translated or blocked; passthrough (``iommu=pt``, default domain ``identity``) lets it go direct.
The mode is chosen at boot by kernel arguments, so the family has no runtime module and nothing
to re-apply at boot: the persistent flow configures ``iommu_kernel_args``' arguments through the
command-line family and a reboot brings them (``kernel_args``). Verification reads the GPUs' IOMMU
group types (``read``, ``facts["iommu"]``: iommu_verify.py).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import cpu, family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.kernel_args import MODES, iommu_kernel_args  # noqa: F401

NAME = "iommu"


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["iommu"]``: ``{mode: passthrough|translated|unmanaged}``."""
    if want is None:
        return []
    if not isinstance(want, dict):
        return [("", "iommu must be a mapping with the key mode, got %r" % (want,))]
    unknown = sorted(set(want) - {"mode"}, key=str)
    out = [("", "iommu: unknown key(s) %s; allowed: mode" % ", ".join(map(str, unknown)))] if unknown else []
    mode = want.get("mode") or "unmanaged"
    if mode not in MODES:
        out.append(("mode", "iommu.mode must be one of %s, got %r" % (", ".join(MODES), mode)))
    return out


def validate(want: Any) -> str:
    """``desired["iommu"]``: ``{mode: passthrough|translated|unmanaged}`` (None: unmanaged); the mode."""
    problems = desired_problems(want)
    if problems:
        raise family.EvaluationError(family.problems_text(problems))
    return (want or {}).get("mode") or "unmanaged"


def kernel_args(pc, remove: bool = False) -> list:
    """The mode's arguments for this node's CPU (the persistent flow adds them through the command-line family);
    with ``remove``, every argument any node may have got for the mode rollback is told (``iommu_mode``)."""
    if remove:
        return list(iommu_kernel_args(pc.settings.get("iommu_mode") or "unmanaged").removable)
    mode = validate(pc.desired.get(NAME))
    return list(iommu_kernel_args(mode, cpu.cpu_vendor(pc.node) if mode != "unmanaged" else None).needed)


# Kernel arguments only: no module, nothing to re-apply at boot; only a reboot brings the mode.
def from_role(v: dict, shared: dict) -> dict:
    mode = v["gpunode_tuning_iommu_mode"]
    return {NAME: None if mode == "unmanaged" else {"mode": mode}}


def _verification():
    """The verification half (families/iommu_verify.py), imported when verification first calls it."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import iommu_verify
    return iommu_verify


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "IOMMU mode"},
    read=family.later(_verification, "read"),
    facts_doc=family.later(_verification, "FACTS_DOC"),
    evaluate=family.later(_verification, "evaluate"),
    reads_boot_config=family.later(_verification, "reads_boot_config"),
    reboot_only=(NAME,),
    from_role=from_role,
    kernel_args=kernel_args,
    validate={NAME: desired_problems},
)
