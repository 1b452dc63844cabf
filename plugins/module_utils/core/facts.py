# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only facts of the node itself for verification: one cheap pass over sysfs, procfs and the kernel log.

``gather(node, ...)`` returns the node-level sections of the ``tuning_facts`` dict documented in the
tuning_info module: ``os``, ``kernel``, ``cpu``, ``pci`` (the selected PCI functions, which several
families judge) and ``kernel_log``. Each knob family reads its own section (``Family.read``;
flows/verify.gather adds them). Everything is read directly from files below the node root (no
lspci/setpci or other process); ``aggregate`` is the one way a per-CPU value is summarized (its most
common value plus the number of CPUs that differ), so facts do not grow with the number of CPUs.

Invalid options raise ``FactsError`` before anything is read; a node without a readable CPU
raises ``NodeError``.
"""

from __future__ import annotations

from typing import Any

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
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import (
    DeviceSelector,
    decode_pcie,
    gpu_vendor,
    list_devices,
    not_responding,
    pcie_bus_perf,
    read_config,
)

SELECTOR_KEYS = ("vendor", "device", "class_prefixes", "bdfs")


class FactsError(ValueError):
    """An option is invalid; the message names the allowed values."""


# -- Cheap reads: one open and one read per attribute, no text-layer objects.


def read_all(path: str) -> str | None:
    """Whole text of a file that may exceed one read (/proc/cpuinfo), or None."""
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def int_or_none(text: str | None) -> int | None:
    """The integer of a sysfs or procfs value, None when it is absent or not a number."""
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


# -- Option validation


def build_selector(spec: dict | None) -> DeviceSelector:
    """A ``DeviceSelector`` from the ``pci_selector`` option (None or {} = the NVIDIA and AMD GPUs)."""
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


# -- Sections


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
    lines = (read_all(node.path("proc/cpuinfo")) or "").splitlines()
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
            family = int_or_none(value.strip())
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
        package = int_or_none(read_small(node.path(SYSFS_CPU, "cpu%d/topology/physical_package_id" % cpu)))
        if package is not None and package >= 0:
            packages.add(package)
    return len(packages)


def aggregate(values_by_cpu: dict) -> dict:
    """Most common value of a per-CPU setting, the number of CPUs that differ, value -> cpulist.

    ``values_by_cpu`` maps CPU -> value (None for CPUs without the attribute). Ties go to the
    value of the lowest CPU. CPUs without the attribute are not listed in ``values``.
    """
    groups = {}
    for cpu in sorted(values_by_cpu):
        groups.setdefault(values_by_cpu[cpu], []).append(cpu)
    if not groups:
        return {"value": None, "cpus_differing": 0, "cpulists": {}}
    value = max(groups, key=lambda v: (len(groups[v]), -groups[v][0]))
    return {
        "value": value,
        "cpus_differing": len(values_by_cpu) - len(groups[value]),
        "cpulists": {v: format_cpulist(c) for v, c in sorted(groups.items(), key=lambda i: i[1][0]) if v is not None},
    }


def pci_facts(node: Node, selector: DeviceSelector, listed: list | None = None) -> dict:
    """``pci``: the selected devices with their PCIe settings, decoded from config space (``listed``: the
    node's PCI functions when the caller listed them already)."""
    devices = []
    present = set()
    nvidia_gpus = []
    vendors = {}
    for dev in list_devices(node) if listed is None else listed:
        present.add(dev["bdf"])
        vendor = gpu_vendor(dev)
        if vendor:
            vendors[dev["bdf"]] = vendor
        if vendor == "nvidia":
            nvidia_gpus.append(dev["bdf"])
        if not selector.matches(dev):
            continue
        entry = {k: dev[k] for k in ("bdf", "vendor", "device", "class", "numa_node")}
        entry.update(gpu_vendor=vendor, pcie=False, port_type=None, mps=None, mps_supported=None, mrrs=None,
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
        # Every GPU on the bus by vendor ("nvidia", "amd"), selected or not: bdf -> vendor.
        "gpu_vendors": vendors,
    }


# -- Everything


def gather(node: Node, pci_selector: dict | None = None, kmsg_since: float = 0.0,
           kmsg_levels: Any = None, kmsg_ignore: Any = None, devices: list | None = None) -> dict:
    """The node-level sections of ``tuning_facts``. Raises ``FactsError`` (bad option) before reading anything.

    ``devices``: the node's PCI functions when the caller listed them already (``list_devices``).
    ``kmsg_levels`` None: ``kernel_log.DEFAULT_LEVELS``.

    Raises ``NodeError`` when the node lists no CPU (it could not be read).
    """
    # Imported here, not at the top: the knob families use this module's small readers in every
    # tuning_apply run, and only gathering needs the kernel log's parser and the platform's readers (issue 31:
    # the module process compiles what it imports, every run).
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import kernel_log, platform

    if kmsg_levels is None:
        kmsg_levels = kernel_log.DEFAULT_LEVELS
    selector = build_selector(pci_selector)
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
    return {
        "os": os_facts(node),
        "kernel": kernel_facts(node),
        "cpu": cpu_facts(node, cpus),
        "pci": pci_facts(node, selector, devices),
        "kernel_log": kernel_log.kernel_log_facts(node, kmsg_levels, kmsg_since, kmsg_ignore),
        "platform": platform.read(node),
    }
