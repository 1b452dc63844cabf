# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The registry: every knob family, in the order runtime, boot re-apply and the reports use.

Verification evaluates each entry's ``evaluate``, the boot runner runs each entry's ``boot``, and
the fleet summary has a column per report family of each entry. A new family is one line here
(docs/adding-a-family.md).
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family
from ansible_collections.gpunode.tuning.plugins.module_utils.families import (
    cpufreq,
    cpuidle,
    gpu_health,
    gpu_locality,
    gpu_settings,
    iommu,
    kernel_cmdline,
    kmod,
    pcie_mrrs,
    tunables,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_p2p as p2p
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs as acs

FAMILIES: tuple[Family, ...] = (
    pcie_mrrs.DEFINITION,
    acs.DEFINITION,
    iommu.DEFINITION,
    cpuidle.DEFINITION,
    cpufreq.DEFINITION,
    tunables.DEFINITION,
    kmod.DEFINITION,
    kernel_cmdline.DEFINITION,
    gpu_settings.DEFINITION,
    gpu_health.DEFINITION,
    p2p.DEFINITION,
    gpu_locality.DEFINITION,
)


def by_name(name: str) -> Family:
    """The family called ``name``; KeyError naming the known ones otherwise."""
    for fam in FAMILIES:
        if fam.name == name:
            return fam
    raise KeyError("no knob family %r; known: %s" % (name, ", ".join(f.name for f in FAMILIES)))


def report_titles() -> dict[str, str]:
    """Report family -> title, in report order (the fleet summary's columns)."""
    out: dict[str, str] = {}
    for fam in FAMILIES:
        out.update(fam.titles)
    return out


def reboot_only() -> tuple[str, ...]:
    """Report families that only the persistent flow and a reboot bring."""
    return tuple(r for fam in FAMILIES for r in fam.reboot_only)


def boot_families() -> list[tuple[str, Family]]:
    """``(desired-state key, family)`` of every family that re-applies something at boot, in order."""
    return [(fam.boot_key or fam.name, fam) for fam in FAMILIES if fam.boot is not None]


def desired_problems(desired: dict) -> list[tuple[str, str, str]]:
    """``(desired-state key, key inside it, message)`` of every family's ``validate`` for ``desired``.

    What can be judged without the node (docs/precheck.md); an entry that is absent or None has none.
    """
    out = []
    for fam in FAMILIES:
        for entry, check in (fam.validate or {}).items():
            out.extend((entry, key, msg) for key, msg in check(desired.get(entry)))
    return out


def boot_report_families() -> dict[str, str]:
    """Report family -> desired-state key of the boot family that brings it back at boot."""
    return {report: key for key, fam in boot_families()
            for report in ((fam.boot_key,) if fam.boot_key else tuple(fam.titles))}
