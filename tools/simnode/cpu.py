"""CPUs: /proc/cpuinfo, topology, cpuidle states, cpufreq policies (and switching the driver), NUMA nodes."""

from __future__ import annotations

import os
import shutil

from .machine import ACPI_GOVERNORS, EPP_CHOICES, Preset
from .presets import PRESETS
from .tree import Tree, cpulist


def cpu_node(p: Preset, cpu: int) -> int:
    per_socket = max(p.cpus // max(p.sockets, 1), 1)
    return min(cpu // per_socket, max(p.sockets, 1) - 1)


# What an arm64 kernel prints for a Neoverse V2 (Grace) core: hwcaps instead of x86 flags, the
# MIDR fields instead of vendor_id/model name, no physical id (sockets come from NUMA/topology).
ARM64_FEATURES = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
                  "dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp "
                  "sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svebf16 i8mm bf16 dgh bti")


def _cpuinfo_entry(p: Preset, cpu: int, socket: int, per_socket: int) -> str:
    """One CPU's block of /proc/cpuinfo in the layout of the preset's architecture."""
    if p.arch == "arm64":
        return (f"processor\t: {cpu}\nBogoMIPS\t: 2000.00\nFeatures\t: {ARM64_FEATURES}\n"
                f"CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
                f"CPU part\t: 0x{p.cpu_part:03x}\nCPU revision\t: 0\n")
    return (f"processor\t: {cpu}\nvendor_id\t: {p.cpu_vendor}\ncpu family\t: {p.cpu_family}\n"
            f"model name\t: {p.cpu_model}\nphysical id\t: {socket}\ncore id\t\t: {cpu % per_socket}\n")


CPU_BASE = "sys/devices/system/cpu"


def write_cpus(t: Tree, p: Preset) -> None:
    """Every CPU (topology, idle states, cpufreq policy), /proc/cpuinfo and the node-wide CPU files."""
    all_cpus = cpulist(range(p.cpus))
    for name in ("online", "possible", "present"):
        t.write(f"{CPU_BASE}/{name}", all_cpus)
    cpuinfo = []
    per_socket = max(p.cpus // max(p.sockets, 1), 1)
    for cpu in range(p.cpus):
        d = f"{CPU_BASE}/cpu{cpu}"
        socket = cpu_node(p, cpu)
        t.write(f"{d}/topology/physical_package_id", socket)
        t.write(f"{d}/topology/core_id", cpu % per_socket)
        if cpu:
            t.write(f"{d}/online", "1")
        _write_idle_states(t, p, cpu)
        if p.freq_driver:
            _write_policy(t, p, cpu)
        cpuinfo.append(_cpuinfo_entry(p, cpu, socket, per_socket))
    t.write("proc/cpuinfo", "\n".join(cpuinfo))
    t.write(f"{CPU_BASE}/cpuidle/current_driver", p.idle_driver or "none")
    t.write(f"{CPU_BASE}/cpuidle/current_governor", "menu" if p.idle_driver else "none")
    if p.freq_driver and p.boost is not None:
        t.write(f"{CPU_BASE}/cpufreq/boost", p.boost)
    if p.amd_pstate_status:
        t.write(f"{CPU_BASE}/amd_pstate/status", p.amd_pstate_status)
    if p.intel_pstate:
        t.write(f"{CPU_BASE}/intel_pstate/status", p.intel_pstate[0])
        t.write(f"{CPU_BASE}/intel_pstate/no_turbo", p.intel_pstate[1])


def _write_idle_states(t: Tree, p: Preset, cpu: int) -> None:
    for idx, st in enumerate(p.idle_states):
        s = f"{CPU_BASE}/cpu{cpu}/cpuidle/state{idx}"
        t.write(f"{s}/name", st.name)
        t.write(f"{s}/desc", st.desc)
        t.write(f"{s}/latency", st.latency)
        t.write(f"{s}/residency", st.residency)
        t.write(f"{s}/usage", 1000 + cpu * 7 + idx * 131)
        t.write(f"{s}/time", 500000 + cpu * 991 + idx * 7919)
        t.write(f"{s}/disable", "0")
        t.write(f"{s}/default_status", "enabled")


def _write_policy(t: Tree, p: Preset, cpu: int) -> None:
    """One cpufreq policy per CPU, linked from cpuN/cpufreq as on a real kernel."""
    pol = f"{CPU_BASE}/cpufreq/policy{cpu}"
    t.write(f"{pol}/scaling_driver", p.freq_driver)
    t.write(f"{pol}/scaling_governor", p.governor)
    t.write(f"{pol}/scaling_available_governors", p.governors)
    t.write(f"{pol}/affected_cpus", cpu)
    t.write(f"{pol}/related_cpus", cpu)
    fmin, fmax, fcur = p.freq_khz
    t.write(f"{pol}/cpuinfo_min_freq", fmin)
    t.write(f"{pol}/cpuinfo_max_freq", fmax)
    t.write(f"{pol}/scaling_min_freq", fmin)
    t.write(f"{pol}/scaling_max_freq", fmax)
    t.write(f"{pol}/scaling_cur_freq", fcur)
    if p.epp is not None:
        t.write(f"{pol}/energy_performance_preference", p.epp)
        t.write(f"{pol}/energy_performance_available_preferences", EPP_CHOICES)
    t.symlink(f"../cpufreq/policy{cpu}", f"{CPU_BASE}/cpu{cpu}/cpufreq")


# The preset whose cpufreq layout each driver family has (policies, governors, EPP, boost, status files).
CPUFREQ_LAYOUT = {"acpi-cpufreq": "audited-epyc-8gpu", "amd-pstate": "epyc-pstate-epp",
                  "intel_pstate": "xeon-4gpu-switch"}
# Drivers in these modes have no energy performance preference and offer every governor.
NO_EPP_DRIVERS = ("amd-pstate", "intel_cpufreq")


def cpufreq_family(driver: str) -> str:
    """The driver family (``amd-pstate``, ``intel_pstate``, ``acpi-cpufreq``) a scaling driver belongs to."""
    if driver.startswith("amd-pstate"):
        return "amd-pstate"
    return "intel_pstate" if driver in ("intel_pstate", "intel_cpufreq") else "acpi-cpufreq"


def _online_cpus(t: Tree) -> list:
    out = []
    with open(t.path(f"{CPU_BASE}/online"), encoding="ascii") as fh:
        for part in fh.read().strip().split(","):
            first, _sep, last = part.partition("-")
            out += list(range(int(first), int(last or first) + 1))
    return out


def _clear_cpufreq(t: Tree, cpus: list) -> None:
    """The running driver's files gone: its policies, their per-CPU links, the pstate status directories."""
    for part in ("cpufreq", "amd_pstate", "intel_pstate"):
        shutil.rmtree(t.path(f"{CPU_BASE}/{part}"), ignore_errors=True)
    for cpu in cpus:
        if os.path.islink(t.path(f"{CPU_BASE}/cpu{cpu}/cpufreq")):
            os.unlink(t.path(f"{CPU_BASE}/cpu{cpu}/cpufreq"))


def set_cpufreq_driver(root: str, driver: str, mode: str | None = None) -> None:
    """Give the node the cpufreq layout of ``driver`` in ``mode`` (what the kernel shows after a boot into it).

    ``driver`` is a scaling driver name (``acpi-cpufreq``, ``amd-pstate-epp``, ``amd-pstate``, ``intel_pstate``,
    ``intel_cpufreq``); ``mode`` the pstate status (``active``, ``passive``, ``guided``; None: the layout's own).
    The policies, governors, EPP and boost files are those of the driver family's preset; passive and guided
    modes have no EPP and offer the ACPI governors.
    """
    family = cpufreq_family(driver)
    p = Preset(name=CPUFREQ_LAYOUT[family], **PRESETS[CPUFREQ_LAYOUT[family]])
    t = Tree(root)
    cpus = _online_cpus(t)
    _clear_cpufreq(t, cpus)
    for cpu in cpus:
        _write_policy(t, p, cpu)
        t.write(f"{CPU_BASE}/cpufreq/policy{cpu}/scaling_driver", driver)
        if driver in NO_EPP_DRIVERS:
            for name in ("energy_performance_preference", "energy_performance_available_preferences"):
                os.unlink(t.path(f"{CPU_BASE}/cpufreq/policy{cpu}/{name}"))
            t.write(f"{CPU_BASE}/cpufreq/policy{cpu}/scaling_available_governors", ACPI_GOVERNORS)
    if p.boost is not None:
        t.write(f"{CPU_BASE}/cpufreq/boost", p.boost)
    if family == "amd-pstate":
        t.write(f"{CPU_BASE}/amd_pstate/status", mode or p.amd_pstate_status)
    if family == "intel_pstate":
        t.write(f"{CPU_BASE}/intel_pstate/status", mode or p.intel_pstate[0])
        t.write(f"{CPU_BASE}/intel_pstate/no_turbo", p.intel_pstate[1])


def write_numa(t: Tree, p: Preset) -> None:
    nodes = max(p.sockets, 1)
    t.write("sys/devices/system/node/online", cpulist(range(nodes)))
    t.write("sys/devices/system/node/possible", cpulist(range(nodes)))
    for n in range(nodes):
        t.write(f"sys/devices/system/node/node{n}/cpulist",
                cpulist([c for c in range(p.cpus) if cpu_node(p, c) == n]))
