# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's CPU as several families see it: its vendor (/proc/cpuinfo) and the cpufreq driver family.

How it works and why: docs/dev/node-code.md, "core/cpu.py"."""

from __future__ import annotations

import itertools
from typing import Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node

# What cpu_vendor() says for an arm64 CPU, whose /proc/cpuinfo has no vendor_id.
ARM64_VENDOR = "arm64"


def vendor_from_cpuinfo(lines: Iterable[str]) -> str | None:
    """The CPU vendor in /proc/cpuinfo ``lines`` (first CPU): ``vendor_id`` on x86."""
    for line in lines:
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "vendor_id":
            return value.strip()
        if key == "CPU implementer":
            return "%s (CPU implementer %s)" % (ARM64_VENDOR, value.strip())
    return None


def cpu_vendor(node: Node) -> str | None:
    """The CPU vendor of the node's /proc/cpuinfo (``vendor_from_cpuinfo``), or None."""
    try:
        with open(node.path("proc/cpuinfo"), encoding="utf-8", errors="replace") as fh:
            return vendor_from_cpuinfo(itertools.islice(fh, 16))
    except OSError:
        return None


def driver_family(driver: str | None) -> str | None:
    """Map a scaling driver name to its family: amd-pstate, intel_pstate, acpi-cpufreq, or itself."""
    if driver in ("amd-pstate", "amd-pstate-epp"):
        return "amd-pstate"
    if driver in ("intel_pstate", "intel_cpufreq"):
        return "intel_pstate"
    return driver
