# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The registry: every knob family, in the order runtime, boot re-apply and the reports use.

How it works and why: docs/dev/node-code.md, "registry.py"."""

from __future__ import annotations

import importlib

from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family

# One line per family: its name, which is its file in families/; the order is the runtime, boot and
# report order (then `tools/generate.py` writes the family into _every()'s import). A family is imported
# when it is first used (``by_name``), so that a module run pays only for the families it runs;
# ``FAMILIES`` imports them all (flows/all_families.py asks its questions of every family through it).
NAMES: tuple[str, ...] = (
    "pcie_mrrs",
    "pcie_acs",
    "iommu",
    "pcie_aspm",
    "cpuidle",
    "cpufreq",
    "tunables",
    "kmod",
    "kernel_cmdline",
    "gpu_settings",
    "gpu_health",
    "gpu_p2p",
    "gpu_locality",
)
_PACKAGE = "ansible_collections.gpunode.tuning.plugins.module_utils.families"
_LOADED: dict = {}


def _every() -> tuple[Family, ...]:
    """Every family, in registry order (each imported once)."""
    every = globals().get("FAMILIES")
    if every is None:
        # Spelled out, not imported by name: Ansible's module packer ships a module the files it finds
        # in import statements, so this statement is what puts every family into a module's payload. Written
        # from NAMES by tools/generate.py (`--check` fails when a family is missing here).
        # BEGIN GENERATED registry.imports
        from ansible_collections.gpunode.tuning.plugins.module_utils.families import (
            cpufreq,
            cpuidle,
            gpu_health,
            gpu_locality,
            gpu_p2p,
            gpu_settings,
            iommu,
            kernel_cmdline,
            kmod,
            pcie_acs,
            pcie_aspm,
            pcie_mrrs,
            tunables,
        )
        for module in (cpufreq, cpuidle, gpu_health, gpu_locality, gpu_p2p, gpu_settings, iommu, kernel_cmdline, kmod,
                       pcie_acs, pcie_aspm, pcie_mrrs, tunables):
            _LOADED.setdefault(module.DEFINITION.name, module.DEFINITION)
        # END GENERATED registry.imports
        every = globals()["FAMILIES"] = tuple(by_name(name) for name in NAMES)
    return every


def __getattr__(name: str):
    """``FAMILIES``: every family's definition, in registry order, imported on first use (PEP 562)."""
    if name == "FAMILIES":
        return _every()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def by_name(name: str) -> Family:
    """The family called ``name``, imported now if it was not yet; KeyError naming the known ones otherwise."""
    fam = _LOADED.get(name)
    if fam is None:
        if name not in NAMES:
            raise KeyError("no knob family %r; known: %s" % (name, ", ".join(NAMES)))
        fam = _LOADED[name] = importlib.import_module("%s.%s" % (_PACKAGE, name)).DEFINITION
    return fam


def loaded() -> tuple[str, ...]:
    """The names of the families imported so far, in registry order (what a run has paid for)."""
    return tuple(name for name in NAMES if name in _LOADED)
