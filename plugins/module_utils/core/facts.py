# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only facts for verification: one cheap pass over a node's sysfs, procfs and kernel log.

``gather(node, ...)`` returns the ``tuning_facts`` dict documented in the tuning_info module.
Everything is read directly from files below the node root (no lspci/setpci or other process),
and per-CPU data is aggregated: a state's disabled CPUs are a count plus a cpulist, a cpufreq
setting is its most common value plus the number of CPUs that differ. Per-CPU entries appear only
with ``detail=True``. The state index -> name mapping of cpuidle is read from the first online
CPU only (cpuidle drivers register one state table for all CPUs); per CPU only the ``disable``
attribute is read, so the cost is one open per CPU and state.

Invalid options raise ``FactsError`` before anything is read; a node without a readable CPU
raises ``NodeError``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import kernel_log
from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu import vendor_from_cpuinfo
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    SYSFS_CPU,
    Node,
    NodeError,
    cmdline_args,
    format_cpulist,
    lockdown_mode,
    online_cpus,
    parse_cpulist,
    read_small,
    selected_bracket,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import (
    DeviceSelector,
    decode_pcie,
    list_devices,
    not_responding,
    pcie_bus_perf,
    read_config,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import KMOD_NAME_ALLOWED as NAME_ALLOWED
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import KMOD_NAME_RE, sysfs_name

SELECTOR_KEYS = ("vendor", "device", "class_prefixes", "bdfs")
PERSISTENCED_COMM = "nvidia-persistenced"
# The kernel truncates comm to 15 characters: a real node shows "nvidia-persiste".
_PERSISTENCED_PREFIX = PERSISTENCED_COMM[:15]
_SYSCTL_KEY = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_/:@+-]+)+$")
SYSCTL_ALLOWED = "dotted names such as vm.swappiness (letters, digits, '_', '-'; '/' for a dot inside a name)"


class FactsError(ValueError):
    """An option is invalid; the message names the allowed values."""


# ---------------------------------------------------------------------------------------------
# Cheap reads: one open and one read per attribute, no text-layer objects.
# ---------------------------------------------------------------------------------------------


def _read_all(path):
    """Whole text of a file that may exceed one read (/proc/cpuinfo), or None."""
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# Option validation
# ---------------------------------------------------------------------------------------------


def build_selector(spec: dict | None) -> DeviceSelector:
    """A ``DeviceSelector`` from the ``pci_selector`` option (None or {} = NVIDIA GPUs)."""
    spec = dict(spec or {})
    unknown = sorted(k for k in spec if k not in SELECTOR_KEYS)
    if unknown:
        raise FactsError("pci_selector: unknown key(s) %s; allowed: %s"
                         % (", ".join(unknown), ", ".join(SELECTOR_KEYS)))
    try:
        return DeviceSelector(vendor=spec.get("vendor"), device=spec.get("device"),
                              class_prefixes=spec.get("class_prefixes"), bdfs=spec.get("bdfs"))
    except ValueError as exc:
        raise FactsError("pci_selector: %s" % exc) from exc


def validate_sysctl_keys(keys: list[str] | None) -> list[str]:
    """Return the keys unchanged after checking each is a dotted sysctl name."""
    out = []
    for key in keys or []:
        # "/" stands for a dot inside a name: no component may become "." or ".." (path traversal).
        if (not isinstance(key, str) or not _SYSCTL_KEY.match(key)
                or any(c in ("", ".", "..") for c in sysctl_path(key).split("/")[2:])):
            raise FactsError("sysctls: %r is not a sysctl key; allowed: %s" % (key, SYSCTL_ALLOWED))
        out.append(key)
    return out


def validate_module_names(names: list[str] | None) -> list[str]:
    out = []
    for name in names or []:
        if not isinstance(name, str) or not KMOD_NAME_RE.fullmatch(name):
            raise FactsError("modules: %r is not a module name; allowed: %s" % (name, NAME_ALLOWED))
        out.append(name)
    return out


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


def os_facts(node: Node) -> dict:
    """``os``: id, version_id and pretty_name from /etc/os-release (or /usr/lib/os-release)."""
    text = read_small(node.path("etc/os-release"))
    if text is None:
        text = read_small(node.path("usr/lib/os-release")) or ""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("\"'")
    return {"id": values.get("ID"), "version_id": values.get("VERSION_ID"), "pretty_name": values.get("PRETTY_NAME")}


def kernel_facts(node: Node) -> dict:
    """``kernel``: release, version string, uptime, command line, lockdown mode."""
    cmdline = read_small(node.path("proc/cmdline")) or ""
    try:
        uptime = float((read_small(node.path("proc/uptime")) or "").split()[0])
    except (IndexError, ValueError):
        uptime = None
    return {
        "release": read_small(node.path("proc/sys/kernel/osrelease")),
        "version": read_small(node.path("proc/version")),
        "uptime": uptime,
        "cmdline": cmdline,
        "cmdline_args": cmdline_args(node),
        "lockdown": lockdown_mode(node),
    }


def cpu_facts(node: Node, cpus: list[int]) -> dict:
    """``cpu``: vendor, model, family, sockets, online CPUs and NUMA nodes.

    The vendor is what ``cpu.vendor_from_cpuinfo`` says (``arm64 (CPU implementer 0x41)`` on
    arm64, whose cpuinfo has no vendor_id), so verification judges the driver as cpu_freq does.
    """
    model = family = None
    packages = set()
    lines = (_read_all(node.path("proc/cpuinfo")) or "").splitlines()
    for line in lines:
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "physical id":
            packages.add(value.strip())
        elif model is None and key == "model name":
            model = value.strip()
        elif family is None and key == "cpu family":
            family = _int_or_none(value.strip())
    node_ids = parse_cpulist(read_small(node.path("sys/devices/system/node/online")) or "")
    numa = [{"node": n, "cpus": read_small(node.path("sys/devices/system/node/node%d/cpulist" % n)) or ""}
            for n in node_ids]
    return {
        "vendor": vendor_from_cpuinfo(lines),
        "model": model,
        "family": family,
        # A VM with neither topology nor "physical id" lines still has one socket.
        "sockets": package_count(node, cpus) or len(packages) or (1 if cpus else 0),
        "online_count": len(cpus),
        "online": format_cpulist(cpus),
        "numa_nodes": len(node_ids),
        "numa": numa,
    }


def package_count(node: Node, cpus: list[int]) -> int:
    """Distinct ``topology/physical_package_id`` of ``cpus`` (0 when none is readable).

    sysfs gives the package on every architecture; arm64 cpuinfo has no "physical id". -1 is
    the kernel's "unknown".
    """
    packages = set()
    for cpu in cpus:
        package = _int_or_none(read_small(node.path(SYSFS_CPU, "cpu%d/topology/physical_package_id" % cpu)))
        if package is not None and package >= 0:
            packages.add(package)
    return len(packages)


def cpuidle_facts(node: Node, cpus: list[int], detail: bool = False) -> dict:
    """``cpuidle``: driver and, per state name, latency and on how many CPUs it is disabled."""
    base = node.path(SYSFS_CPU)
    driver = read_small(os.path.join(base, "cpuidle", "current_driver"))
    governor = read_small(os.path.join(base, "cpuidle", "current_governor"))
    driver = None if driver in (None, "", "none") else driver
    governor = None if governor in (None, "", "none") else governor
    states = {}
    result = {"supported": False, "driver": driver, "governor": governor, "states": states}
    if not cpus:
        return result
    first = os.path.join(base, "cpu%d" % cpus[0], "cpuidle")
    table = []
    for entry in node.listdir(SYSFS_CPU, "cpu%d" % cpus[0], "cpuidle"):
        if entry.startswith("state") and entry[5:].isdigit():
            d = os.path.join(first, entry)
            name = read_small(os.path.join(d, "name"))
            if name:
                table.append((int(entry[5:]), entry, name, _int_or_none(read_small(os.path.join(d, "latency"))),
                              _int_or_none(read_small(os.path.join(d, "residency")))))
    table.sort()
    for index, entry, name, latency, residency in table:
        disabled = []
        missing = 0
        per_cpu = {} if detail else None
        for cpu in cpus:
            d = "%s/cpu%d/cpuidle/%s/" % (base, cpu, entry)
            value = read_small(d + "disable")
            if value is None:
                missing += 1
            elif value != "0":
                disabled.append(cpu)
            if detail:
                per_cpu[str(cpu)] = {
                    "disabled": None if value is None else value != "0",
                    "usage": _int_or_none(read_small(d + "usage")),
                    "time": _int_or_none(read_small(d + "time")),
                }
        state = {
            "index": index,
            "latency": latency,
            "residency": residency,
            "disabled_cpus": len(disabled),
            "disabled_cpulist": format_cpulist(disabled),
            "enabled_cpus": len(cpus) - len(disabled) - missing,
            "missing_cpus": missing,
        }
        if detail:
            state["per_cpu"] = per_cpu
        states[name] = state
    result["supported"] = bool(driver and states)
    return result


def aggregate(values_by_cpu: dict) -> dict:
    """Most common value of a per-CPU setting, the number of CPUs that differ, value -> cpulist.

    ``values_by_cpu`` maps CPU -> value (None for CPUs without the attribute). Ties go to the
    value of the lowest CPU. CPUs without the attribute are not listed in ``values``.
    """
    groups = {}
    for cpu in sorted(values_by_cpu):
        groups.setdefault(values_by_cpu[cpu], []).append(cpu)
    if not groups:
        return {"value": None, "cpus_differing": 0, "values": {}}
    value = max(groups, key=lambda v: (len(groups[v]), -groups[v][0]))
    return {
        "value": value,
        "cpus_differing": len(values_by_cpu) - len(groups[value]),
        "values": {v: format_cpulist(c) for v, c in sorted(groups.items(), key=lambda i: i[1][0]) if v is not None},
    }


def cpufreq_facts(node: Node, cpus: list[int], detail: bool = False) -> dict:
    """``cpufreq``: driver, governor, EPP, boost (aggregated), amd_pstate and intel_pstate state."""
    base = node.path(SYSFS_CPU)
    governors = {}
    epps = {}
    driver = None
    available_governors = available_epp = None
    for cpu in cpus:
        d = "%s/cpu%d/cpufreq/" % (base, cpu)
        governors[cpu] = read_small(d + "scaling_governor")
        epps[cpu] = read_small(d + "energy_performance_preference")
        if driver is None and governors[cpu] is not None:
            # One cpufreq driver serves the whole system: read it (and the choices) once.
            driver = read_small(d + "scaling_driver")
            available_governors = (read_small(d + "scaling_available_governors") or "").split()
            available_epp = (read_small(d + "energy_performance_available_preferences") or "").split()
    boost = read_small(os.path.join(base, "cpufreq", "boost"))
    amd_status = read_small(os.path.join(base, "amd_pstate", "status"))
    intel_status = read_small(os.path.join(base, "intel_pstate", "status"))
    no_turbo = read_small(os.path.join(base, "intel_pstate", "no_turbo"))
    result = {
        "supported": driver is not None,
        "driver": driver,
        "cpus_with_policy": sum(1 for v in governors.values() if v is not None),
        "governor": aggregate(governors),
        "epp": aggregate(epps),
        "boost": None if boost is None else boost.strip() == "1",
        "available_governors": available_governors or [],
        "available_epp": available_epp or [],
        "amd_pstate": {"present": amd_status is not None, "status": amd_status},
        "intel_pstate": {"present": intel_status is not None, "status": intel_status,
                         "no_turbo": None if no_turbo is None else no_turbo == "1"},
    }
    if detail:
        result["per_cpu"] = {str(cpu): {"governor": governors[cpu], "epp": epps[cpu]} for cpu in cpus}
    return result


def memory_facts(node: Node) -> dict:
    """``memory``: NUMA balancing, zone reclaim, transparent hugepages."""
    thp = "sys/kernel/mm/transparent_hugepage/"
    return {
        "numa_balancing": _int_or_none(read_small(node.path("proc/sys/kernel/numa_balancing"))),
        "zone_reclaim_mode": _int_or_none(read_small(node.path("proc/sys/vm/zone_reclaim_mode"))),
        "thp": {
            "enabled": selected_bracket(read_small(node.path(thp + "enabled")) or ""),
            "defrag": selected_bracket(read_small(node.path(thp + "defrag")) or ""),
        },
    }


def sysctl_path(key: str) -> str:
    """``proc/sys`` relative path of a dotted key (``/`` in a key stands for a dot in a name)."""
    return "proc/sys/" + key.replace(".", "\0").replace("/", ".").replace("\0", "/")


def sysctl_facts(node: Node, keys: list[str]) -> dict:
    """``sysctl``: key -> value with whitespace runs made single spaces (None when absent)."""
    out = {}
    for key in keys:
        value = read_small(node.path(sysctl_path(key)))
        out[key] = None if value is None else " ".join(value.split())
    return out


def pci_facts(node: Node, selector: DeviceSelector) -> dict:
    """``pci``: the selected devices with their PCIe settings, decoded from config space."""
    devices = []
    present = set()
    nvidia_gpus = []
    default = DeviceSelector()
    for dev in list_devices(node):
        present.add(dev["bdf"])
        if default.matches(dev):
            nvidia_gpus.append(dev["bdf"])
        if not selector.matches(dev):
            continue
        entry = {k: dev[k] for k in ("bdf", "vendor", "device", "class", "numa_node")}
        entry.update(pcie=False, port_type=None, mps=None, mps_supported=None, mrrs=None,
                     link_speed=None, link_width=None, link_speed_capable=None, link_width_capable=None,
                     error=None, responding=True)
        try:
            cfg = read_config(dev)
        except NodeError as exc:  # a device that vanished or is unreadable must not hide the others
            entry["error"] = str(exc)
            devices.append(entry)
            continue
        dead = not_responding(cfg)
        if dead:  # a GPU off the bus: all ones, no capability to decode
            entry.update(error=dead, responding=False)
            devices.append(entry)
            continue
        if len(cfg) < 0x100:
            entry["error"] = ("only %d bytes of config space are readable (unprivileged read): run as root "
                              "to see the PCI Express capability" % len(cfg))
        decoded = decode_pcie(cfg)
        if decoded is not None:
            entry.update(
                pcie=True,
                port_type=decoded["port_type"],
                mps=decoded["mps"],
                mps_supported=decoded["devcap_mps_max"],
                mrrs=decoded["mrrs"],
                link_speed=decoded["link_speed_current"],
                link_width=decoded["link_width_current"],
                link_speed_capable=decoded["link_speed_capable"],
                link_width_capable=decoded["link_width_capable"],
            )
        devices.append(entry)
    return {
        "selector": selector.describe(),
        "pcie_bus_perf": pcie_bus_perf(node),
        "count": len(devices),
        "missing_bdfs": [b for b in (selector.bdfs or []) if b not in present],
        "devices": devices,
        # Every NVIDIA GPU on the bus, selected or not (a GPU nvidia-smi lists that the bus no longer shows).
        "nvidia_gpus": nvidia_gpus,
    }


def modules_facts(node: Node, names: list[str]) -> dict:
    """``modules``: loaded module names (/proc/modules) and, for ``names``, state and parameters."""
    loaded = []
    for line in (_read_all(node.path("proc/modules")) or "").splitlines():
        if line.strip():
            loaded.append(line.split(None, 1)[0])
    loaded_set = set(loaded)
    by_name = {}
    for name in names:
        key = sysfs_name(name)
        base = node.path("sys/module", key)
        present = os.path.isdir(base)
        builtin = present and key not in loaded_set and not os.path.exists(os.path.join(base, "initstate"))
        params = {}
        for p in node.listdir("sys/module", key, "parameters"):
            params[p] = read_small(os.path.join(base, "parameters", p))
        by_name[name] = {"loaded": present, "builtin": builtin, "parameters": params}
    return {"loaded": sorted(loaded), "by_name": by_name}


def nvidia_facts(node: Node) -> dict:
    """``nvidia``: whether nvidia-persistenced runs (a scan of /proc/*/comm), driver version."""
    pids = []
    proc = node.path("proc")
    for entry in node.listdir("proc"):
        if entry.isdigit():
            comm = read_small(os.path.join(proc, entry, "comm"))
            if comm and comm.startswith(_PERSISTENCED_PREFIX) and PERSISTENCED_COMM.startswith(comm):
                pids.append(int(entry))
    return {
        "persistenced": {"running": bool(pids), "pids": sorted(pids)},
        "driver_version": read_small(node.path("sys/module/nvidia/version")),
    }


# ---------------------------------------------------------------------------------------------
# Everything
# ---------------------------------------------------------------------------------------------


def gather(node: Node, pci_selector: dict | None = None, sysctls: list[str] | None = None, kmsg_since: float = 0.0,
           kmsg_levels: Any = kernel_log.DEFAULT_LEVELS, kmsg_ignore: Any = None, modules: list[str] | None = None,
           detail: bool = False) -> dict:
    """Return the ``tuning_facts`` dict. Raises ``FactsError`` (bad option) before reading anything.

    Raises ``NodeError`` when the node lists no CPU (it could not be read).
    """
    selector = build_selector(pci_selector)
    sysctl_keys = validate_sysctl_keys(sysctls)
    module_names = validate_module_names(modules)
    try:
        kernel_log.select_levels(kmsg_levels)
        kernel_log.compile_ignore_rules(kmsg_ignore)
    except kernel_log.KernelLogError as exc:
        raise FactsError(str(exc)) from exc
    if kmsg_since is not None and (not isinstance(kmsg_since, (int, float)) or kmsg_since < 0):
        raise FactsError("kmsg_since must be >= 0 (seconds since boot), got %r" % (kmsg_since,))

    cpus = online_cpus(node)
    if not cpus:
        # Every Linux node lists at least one CPU: none means the node could not be read, and
        # facts full of nulls would let a verification pass it.
        raise NodeError("no CPU found below %s (neither %s/online nor cpuN directories): the root is not a "
                        "readable Linux node" % (node.root, node.path(SYSFS_CPU)))
    facts = {
        "os": os_facts(node),
        "kernel": kernel_facts(node),
        "cpu": cpu_facts(node, cpus),
        "cpuidle": cpuidle_facts(node, cpus, detail),
        "cpufreq": cpufreq_facts(node, cpus, detail),
        "memory": memory_facts(node),
        "sysctl": sysctl_facts(node, sysctl_keys),
        "pci": pci_facts(node, selector),
        "modules": modules_facts(node, module_names),
        "nvidia": nvidia_facts(node),
        "kernel_log": kernel_log.kernel_log_facts(node, kmsg_levels, kmsg_since, kmsg_ignore),
    }
    return facts
