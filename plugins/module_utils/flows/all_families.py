# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the flows and the controller ask of every family at once: reports, boot, hot-plug, validation.

A module run that only applies asks none of it, so it stays out of that run (registry.py keeps the list of
families and ``by_name``)."""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family


def of_report(report: str) -> Family | None:
    """The family that produces the report family ``report`` (None for none)."""
    return next((fam for fam in registry.FAMILIES if report in fam.titles), None)


def selecting_tags(fam: Family) -> tuple[str, ...]:
    """Every tag that selects ``fam``: its name and its settings' tags."""
    return (fam.name, *fam.tags)


def read_options() -> dict:
    """tuning_info facts option -> its validator, of every family's ``read`` (``Family.read_options``)."""
    out: dict = {}
    for fam in registry.FAMILIES:
        out.update(fam.read_options or {})
    return out


def facts_options(desired: dict) -> dict:
    """The facts options every family's ``read`` needs to judge ``desired`` (``Family.facts_options``)."""
    out: dict = {}
    for fam in registry.FAMILIES:
        if fam.facts_options is not None:
            out.update(fam.facts_options(desired))
    return out


def health_families() -> tuple[str, ...]:
    """Report families whose drifted and reset-pending rows are health findings (``Family.health``)."""
    return tuple(r for fam in registry.FAMILIES if fam.health for r in fam.titles)


def hotplug_families() -> list[Family]:
    """The families the udev rule re-applies for a hot-added PCI function (``Family.hotplug``), in order."""
    return [fam for fam in registry.FAMILIES if fam.hotplug is not None and fam.boot is not None]


def per_cpu_keys() -> dict:
    """Family -> the keys of its journal entries kept per CPU (None: every key), of the families that have some."""
    return {fam.name: None if "*" in fam.per_cpu else tuple(fam.per_cpu) for fam in registry.FAMILIES if fam.per_cpu}


def report_titles() -> dict[str, str]:
    """Report family -> title, in report order (the fleet summary's columns)."""
    out: dict[str, str] = {}
    for fam in registry.FAMILIES:
        out.update(fam.titles)
    return out


def reboot_only() -> tuple[str, ...]:
    """Report families that only the persistent flow and a reboot bring."""
    return tuple(r for fam in registry.FAMILIES for r in fam.reboot_only)


def boot_families() -> list[tuple[str, Family]]:
    """``(desired-state key, family)`` of every family that re-applies something at boot, in order."""
    return [(fam.boot_key or fam.name, fam) for fam in registry.FAMILIES if fam.boot is not None]


def desired_problems(desired: dict) -> list[tuple[str, str, str]]:
    """``(desired-state key, key inside it, message)`` of every family's ``validate`` for ``desired``."""
    out = []
    for fam in registry.FAMILIES:
        for entry, check in (fam.validate or {}).items():
            out.extend((entry, key, msg) for key, msg in check(desired.get(entry)))
    return out


def node_desired(desired: dict, node) -> dict:
    """``desired`` as a node keeps it: each family's node-dependent entries resolved for ``node``
    (``Family.on_node``)."""
    out = dict(desired or {})
    for fam in registry.FAMILIES:
        if fam.on_node is not None:
            out = fam.on_node(out, node)
    return out


def boot_report_families() -> dict[str, str]:
    """Report family -> desired-state key of the boot family that brings it back at boot."""
    return {report: key for key, fam in boot_families()
            for report in ((fam.boot_key,) if fam.boot_key else tuple(fam.titles))}
