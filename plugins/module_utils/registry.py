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
# ``FAMILIES`` (or any function here that needs every family) imports them all.
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


def of_report(report: str) -> Family | None:
    """The family that produces the report family ``report`` (None for none)."""
    return next((fam for fam in _every() if report in fam.titles), None)


def selecting_tags(fam: Family) -> tuple[str, ...]:
    """Every tag that selects ``fam``: its name and its settings' tags."""
    return (fam.name, *fam.tags)


def read_options() -> dict:
    """tuning_info facts option -> its validator, of every family's ``read`` (``Family.read_options``)."""
    out: dict = {}
    for fam in _every():
        out.update(fam.read_options or {})
    return out


def facts_options(desired: dict) -> dict:
    """The facts options every family's ``read`` needs to judge ``desired`` (``Family.facts_options``)."""
    out: dict = {}
    for fam in _every():
        if fam.facts_options is not None:
            out.update(fam.facts_options(desired))
    return out


def health_families() -> tuple[str, ...]:
    """Report families whose drifted and reset-pending rows are health findings (``Family.health``)."""
    return tuple(r for fam in _every() if fam.health for r in fam.titles)


def hotplug_families() -> list[Family]:
    """The families the udev rule re-applies for a hot-added PCI function (``Family.hotplug``), in order."""
    return [fam for fam in _every() if fam.hotplug is not None and fam.boot is not None]


def per_cpu_keys() -> dict:
    """Family -> the keys of its journal entries kept per CPU (None: every key), of the families that have some."""
    return {fam.name: None if "*" in fam.per_cpu else tuple(fam.per_cpu) for fam in _every() if fam.per_cpu}


def report_titles() -> dict[str, str]:
    """Report family -> title, in report order (the fleet summary's columns)."""
    out: dict[str, str] = {}
    for fam in _every():
        out.update(fam.titles)
    return out


def reboot_only() -> tuple[str, ...]:
    """Report families that only the persistent flow and a reboot bring."""
    return tuple(r for fam in _every() for r in fam.reboot_only)


def boot_families() -> list[tuple[str, Family]]:
    """``(desired-state key, family)`` of every family that re-applies something at boot, in order."""
    return [(fam.boot_key or fam.name, fam) for fam in _every() if fam.boot is not None]


def desired_problems(desired: dict) -> list[tuple[str, str, str]]:
    """``(desired-state key, key inside it, message)`` of every family's ``validate`` for ``desired``."""
    out = []
    for fam in _every():
        for entry, check in (fam.validate or {}).items():
            out.extend((entry, key, msg) for key, msg in check(desired.get(entry)))
    return out


def node_desired(desired: dict, node) -> dict:
    """``desired`` as a node keeps it: each family's node-dependent entries resolved for ``node``
    (``Family.on_node``)."""
    out = dict(desired or {})
    for fam in _every():
        if fam.on_node is not None:
            out = fam.on_node(out, node)
    return out


def boot_report_families() -> dict[str, str]:
    """Report family -> desired-state key of the boot family that brings it back at boot."""
    return {report: key for key, fam in boot_families()
            for report in ((fam.boot_key,) if fam.boot_key else tuple(fam.titles))}
