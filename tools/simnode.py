#!/usr/bin/env python
"""Build simulated GPU nodes: a directory tree laid out like a Linux node's sysfs/procfs.

The tree is what the collection's modules see through their ``root`` option, so unit tests,
Molecule scenarios, benchmarks and the demo exercise the real code paths (including the real
``lspci``/``setpci`` binaries through ``-O sysfs.path=``) without hardware and without root.

Usage::

    tools/simnode.py build --preset audited-epyc-8gpu DIR [--cpus N] [--gpus N] [--kmsg-records N]
    tools/simnode.py build --preset audited-epyc-8gpu DIR --smi-driver r470 --smi-mode hang --smi-ansi \
        --gpu-fault dead=2 --benchmark hang      # the real quirks: an older driver, a wedged GPU, ...
    tools/simnode.py list
    tools/simnode.py reboot DIR       # a boot with what the tuning left: kernel arguments, drop-ins, boot unit

Presets are x86_64 (AMD EPYC, Intel Xeon, a VM) or arm64 (``grace-arm64-4gpu``: psci_idle,
cppc_cpufreq, an arm64 /proc/cpuinfo without vendor_id, one PCI segment per root port).

The file is standard-library only so it can be copied into a container and run there. The simulated
reboot's reset of journaled values runs the collection's own tuning_apply module, so it needs the
collection and ansible-core importable by the Python that runs it (this checkout's .venv).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import uuid

import simnode_aspm  # issue 44: PCIe ASPM (policy, link attributes, Link Control)

# ---------------------------------------------------------------------------------------------
# Machine descriptions
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class IdleState:
    name: str
    desc: str
    latency: int
    residency: int


@dataclasses.dataclass
class PciFunction:
    """One PCI function. ``kind`` is endpoint, root_port, upstream or downstream."""

    bdf: str
    vendor: int
    device: int
    class_code: int  # 24-bit: base, sub, prog-if
    kind: str = "endpoint"
    numa_node: int = -1
    pcie: bool = True
    mps_supported: int = 2  # DevCap bits 2:0 -> 128 << n
    mps: int = 256
    mrrs: int = 512
    link_speed_cap: int = 5  # 1=2.5 2=5 3=8 4=16 5=32 GT/s
    link_width_cap: int = 16
    link_speed: int = 5
    link_width: int = 16
    secondary_bus: int = 0
    subordinate_bus: int = 0
    subsystem_vendor: int = 0
    subsystem_device: int = 0
    revision: int = 0xA1
    parent: str | None = None  # bdf of the upstream bridge, None for a root-complex device
    dead: bool = False  # fell off the bus: config space reads all 0xff (sysfs keeps vendor and class)


IDLE_ACPI_EPYC = [
    IdleState("POLL", "CPUIDLE CORE POLL IDLE", 0, 0),
    IdleState("C1", "ACPI FFH MWAIT 0x0", 1, 2),
    IdleState("C2", "ACPI IOPORT 0x814", 400, 800),
]
IDLE_INTEL_XEON = [
    IdleState("POLL", "CPUIDLE CORE POLL IDLE", 0, 0),
    IdleState("C1", "MWAIT 0x00", 2, 2),
    IdleState("C1E", "MWAIT 0x01", 10, 20),
    IdleState("C6", "MWAIT 0x20", 170, 600),
]

# psci_idle (arm64, device-tree idle states): WFI is state0; the deeper states carry the names of
# their idle-state nodes. Latencies (entry + exit, us) as a Neoverse V2 server's firmware gives them.
IDLE_PSCI_GRACE = [
    IdleState("WFI", "ARM WFI", 1, 1),
    IdleState("cpu-sleep-0", "cpu-sleep-0", 150, 600),
    IdleState("cluster-sleep-0", "cluster-sleep-0", 800, 2500),
]

ACPI_GOVERNORS = "conservative ondemand userspace powersave performance schedutil"
PSTATE_GOVERNORS = "performance powersave"
EPP_CHOICES = "default performance balance_performance balance_power power"

DEFAULT_SYSCTLS = {
    "kernel/numa_balancing": "1",
    "kernel/osrelease": "6.1.0-28-amd64",
    "kernel/hostname": "gpunode",
    "vm/swappiness": "60",
    "vm/zone_reclaim_mode": "0",
    "vm/dirty_ratio": "20",
    "vm/dirty_background_ratio": "10",
    "vm/max_map_count": "65530",
    "net/core/somaxconn": "4096",
    "net/core/rmem_max": "212992",
    "net/core/wmem_max": "212992",
    "net/core/netdev_max_backlog": "1000",
    "net/ipv4/tcp_rmem": "4096\t131072\t6291456",
    "net/ipv4/tcp_wmem": "4096\t16384\t4194304",
    "fs/file-max": "9223372036854775807",
}


@dataclasses.dataclass
class Preset:
    name: str
    description: str
    cpu_vendor: str | None
    cpu_model: str | None
    cpu_family: int | None
    sockets: int
    cpus: int
    idle_driver: str | None
    idle_states: list
    freq_driver: str | None
    governors: str
    governor: str
    epp: str | None
    boost: str | None  # content of cpufreq/boost, None when absent
    amd_pstate_status: str | None
    intel_pstate: tuple | None  # (status, no_turbo)
    gpus: int
    gpu_device: int
    gpu_class: int
    topology: str  # "root-ports", "switch" or "none"
    cmdline: str
    lockdown: str
    numa_balancing: str
    thp_enabled: str
    thp_defrag: str
    modules: dict
    kmsg: list  # (level, message)
    gpu_mps: int = 256
    gpu_mrrs: int = 512
    extra_devices: tuple = ("nic", "nvme", "audio")
    os_id: str = "debian"
    os_version: str = "12"
    persistenced: bool = True
    arch: str = "x86_64"  # or "arm64": /proc/cpuinfo layout, sim modprobe's loadable modules
    cpu_part: int = 0  # arm64 only: "CPU implementer" 0x41 (Arm), "CPU part" (0xd4f Neoverse V2)
    freq_khz: tuple = (1500000, 3800000, 2450000)  # cpuinfo_min, cpuinfo_max, scaling_cur
    # GPU locality (module_utils/families/gpu_locality.py): MSI/MSI-X IRQs with /proc/irq affinities, an
    # irqbalance process, NUMA nodes whose firmware publishes no proximity (numa_node -1), MSI-X
    # vectors per NIC, and a NIC under every Nth PCIe switch too (0: only the first; benchmarks).
    msi: bool = False
    irqbalance: bool = False
    numa_unknown_nodes: tuple = ()
    nic_queues: int = 16
    nics_every: int = 0
    # The GPUs' vendor and subsystem (NVIDIA by default; AMD Instinct: 0x1002), and their buses when the preset
    # has its own (else GPU_BUSES).
    gpu_vendor: int = 0x10DE
    gpu_subsystem: int = 0x204E
    gpu_buses: tuple = ()


# Root-complex buses used for GPUs, alternating between the two sockets as on real EPYC boards.
GPU_BUSES = [0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1, 0x01, 0x21]
# The 8x MI300X node of AMD's amd-smi overview (tests/data/real/amd-smi-list-text-mi300x-rocm-blogs.txt:
# 0000:05:00.0, 26, 46, ... e5): four GPUs per socket.
AMD_MI300X_BUSES = (0x05, 0x26, 0x46, 0x65, 0x85, 0xA5, 0xC5, 0xE5)
# The GPUs of either vendor, by vendor and class (as core/pci.py's default selector).
SIM_GPU_VENDORS = (0x10DE, 0x1002)
SIM_GPU_CLASSES = (0x0300, 0x0302, 0x0380, 0x1200)


def is_gpu(f) -> bool:
    """Whether a PCI function is a GPU of either vendor (NVIDIA display/3D, AMD Instinct 0380/1200)."""
    return f.kind == "endpoint" and f.vendor in SIM_GPU_VENDORS and (f.class_code >> 8) in SIM_GPU_CLASSES


PRESETS = {
    "audited-epyc-8gpu": dict(
        description="The audited node of knobs.md: 2x AMD EPYC, acpi_idle POLL/C1/C2, acpi-cpufreq, "
        "numa_balancing 1, 8 NVIDIA RTX PRO 6000 Blackwell (class 0x0302) at MRRS 512 / MPS 256 "
        "behind root ports, a ConnectX NIC, an NVMe drive and a GPU HDMI-audio function.",
        cpu_vendor="AuthenticAMD",
        cpu_model="AMD EPYC 9354 32-Core Processor",
        cpu_family=0x19,
        sockets=2,
        cpus=128,
        idle_driver="acpi_idle",
        idle_states=IDLE_ACPI_EPYC,
        freq_driver="acpi-cpufreq",
        governors=ACPI_GOVERNORS,
        governor="schedutil",
        epp=None,
        boost="1",
        amd_pstate_status=None,
        intel_pstate=None,
        gpus=8,
        gpu_device=0x2BB5,
        gpu_class=0x030200,
        topology="root-ports",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 root=UUID=3f1c2a9e-8d1b-4c52-9e0a-5b7f0c1d2e3f ro quiet",
        lockdown="[none] integrity confidentiality",
        numa_balancing="1",
        thp_enabled="[always] madvise never",
        thp_defrag="always defer defer+madvise [madvise] never",
        modules={"nvidia": {"NVreg_EnableGpuFirmware": "1"}, "nvidia_uvm": {}, "nvidia_modeset": {},
                 "nvme": {}, "mlx5_core": {}},
        kmsg=[
            (6, "Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) #1 SMP Debian 6.1.119-1"),
            (6, "Command line: BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 root=UUID=3f1c2a9e ro quiet"),
            (5, "amd_pstate: driver load is disabled, boot with specific mode to enable this"),
            (4, "ACPI: _OSC: platform retains control of PCIe features (AE_NOT_FOUND)"),
            (6, "nvidia: loading out-of-tree module taints kernel."),
            (6, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.65.06"),
            (4, "vxlan: non-ECT from 10.224.3.17 with TOS=0x2"),
            (4, "vxlan: non-ECT from 10.224.7.201 with TOS=0x2"),
        ],
    ),
    "mi300x-epyc-8gpu": dict(
        description="An AMD Instinct MI300X platform: 2x AMD EPYC (2 NUMA nodes, NPS1), acpi_idle POLL/C1/C2, "
        "acpi-cpufreq, numa_balancing 1, 8 MI300X OAM GPUs (vendor 0x1002, device 0x74a1, class 0x1200) on XGMI, "
        "4 per socket, at the BDFs of AMD's 8x MI300X example node, a ConnectX NIC, an NVMe drive; amdgpu loaded.",
        cpu_vendor="AuthenticAMD",
        cpu_model="AMD EPYC 9534 64-Core Processor",
        cpu_family=0x19,
        sockets=2,
        cpus=128,
        idle_driver="acpi_idle",
        idle_states=IDLE_ACPI_EPYC,
        freq_driver="acpi-cpufreq",
        governors=ACPI_GOVERNORS,
        governor="schedutil",
        epp=None,
        boost="1",
        amd_pstate_status=None,
        intel_pstate=None,
        gpus=8,
        gpu_device=0x74A1,
        gpu_class=0x120000,
        gpu_vendor=0x1002,
        gpu_subsystem=0x74A1,
        gpu_buses=AMD_MI300X_BUSES,
        topology="root-ports",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.8.0-79-generic root=UUID=5c2e91d4-0b7a-4f3e-a1c6-93d8e2f4b710 ro quiet",
        lockdown="[none] integrity confidentiality",
        numa_balancing="1",
        thp_enabled="[always] madvise never",
        thp_defrag="always defer defer+madvise [madvise] never",
        modules={"amdgpu": {}, "nvme": {}, "mlx5_core": {}},
        extra_devices=("nic", "nvme"),
        os_id="ubuntu",
        os_version="24.04",
        persistenced=False,
        kmsg=[
            (6, "Linux version 6.8.0-79-generic (buildd@lcy02-amd64-049) #79-Ubuntu SMP PREEMPT_DYNAMIC"),
            (6, "Command line: BOOT_IMAGE=/boot/vmlinuz-6.8.0-79-generic root=UUID=5c2e91d4 ro quiet"),
            (5, "amd_pstate: driver load is disabled, boot with specific mode to enable this"),
            (6, "[drm] amdgpu kernel modesetting enabled."),
            (6, "amdgpu 0000:05:00.0: amdgpu: Fetched VBIOS from IFWI"),
            (4, "ACPI: _OSC: platform retains control of PCIe features (AE_NOT_FOUND)"),
        ],
    ),
    "epyc-pstate-epp": dict(
        description="AMD EPYC family 1Ah node already on amd-pstate-epp (active mode), powersave governor, "
        "EPP balance_performance, 4 GPUs behind root ports.",
        cpu_vendor="AuthenticAMD",
        cpu_model="AMD EPYC 9555 64-Core Processor",
        cpu_family=0x1A,
        sockets=2,
        cpus=64,
        idle_driver="acpi_idle",
        idle_states=IDLE_ACPI_EPYC,
        freq_driver="amd-pstate-epp",
        governors=PSTATE_GOVERNORS,
        governor="powersave",
        epp="balance_performance",
        boost="1",
        amd_pstate_status="active",
        intel_pstate=None,
        gpus=4,
        gpu_device=0x2BB5,
        gpu_class=0x030200,
        topology="root-ports",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.12.9-amd64 root=UUID=77aa01c2 ro quiet amd_pstate=active",
        lockdown="[none] integrity confidentiality",
        numa_balancing="0",
        thp_enabled="always [madvise] never",
        thp_defrag="always defer [defer+madvise] madvise never",
        modules={"nvidia": {}, "nvidia_uvm": {}, "nvme": {}},
        kmsg=[
            (6, "Linux version 6.12.9-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.12.9-1"),
            (6, "amd_pstate: The CPPC feature is supported"),
        ],
        os_version="13",
    ),
    "xeon-4gpu-switch": dict(
        description="Intel Xeon node: intel_idle POLL/C1/C1E/C6, intel_pstate active, 4 NVIDIA GPUs "
        "(class 0x0300) behind a PCIe switch, an NVMe drive.",
        cpu_vendor="GenuineIntel",
        cpu_model="Intel(R) Xeon(R) Platinum 8480+",
        cpu_family=6,
        sockets=2,
        cpus=112,
        idle_driver="intel_idle",
        idle_states=IDLE_INTEL_XEON,
        freq_driver="intel_pstate",
        governors=PSTATE_GOVERNORS,
        governor="powersave",
        epp="balance_performance",
        boost=None,
        amd_pstate_status=None,
        intel_pstate=("active", "0"),
        gpus=4,
        gpu_device=0x2330,
        gpu_class=0x030000,
        topology="switch",
        cmdline="BOOT_IMAGE=/vmlinuz-5.14.0-503.el9.x86_64 root=/dev/mapper/rhel-root ro "
        "crashkernel=1G-4G:192M rhgb quiet",
        lockdown="[none] integrity confidentiality",
        numa_balancing="1",
        thp_enabled="[always] madvise never",
        thp_defrag="always defer defer+madvise [madvise] never",
        modules={"nvidia": {}, "nvidia_uvm": {}, "nvme": {}},
        kmsg=[
            (6, "Linux version 5.14.0-503.el9.x86_64 (mockbuild@x86-64-01) #1 SMP PREEMPT_DYNAMIC"),
            (6, "intel_idle: MWAIT substates: 0x2020"),
        ],
        extra_devices=("nvme",),
        os_id="rhel",
        os_version="9.5",
    ),
    "tiny-vm": dict(
        description="A small VM: no cpuidle driver, no cpufreq, no PCIe devices (virtio only).",
        cpu_vendor="GenuineIntel",
        cpu_model="Intel Xeon Processor (Icelake)",
        cpu_family=6,
        sockets=1,
        cpus=2,
        idle_driver=None,
        idle_states=[],
        freq_driver=None,
        governors="",
        governor="",
        epp=None,
        boost=None,
        amd_pstate_status=None,
        intel_pstate=None,
        gpus=0,
        gpu_device=0,
        gpu_class=0x030200,
        topology="none",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-cloud-amd64 root=/dev/vda1 ro console=ttyS0",
        lockdown="[none] integrity confidentiality",
        numa_balancing="0",
        thp_enabled="always [madvise] never",
        thp_defrag="always defer defer+madvise [madvise] never",
        modules={"virtio_net": {}},
        kmsg=[(6, "Linux version 6.1.0-28-cloud-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1")],
        extra_devices=("virtio",),
        persistenced=False,
    ),
    "locked-bus-perf": dict(
        description="An EPYC node booted with pci=pcie_bus_perf (MRRS forced down to MPS 256) and kernel "
        "lockdown in integrity mode: config-space writes from user space are refused.",
        cpu_vendor="AuthenticAMD",
        cpu_model="AMD EPYC 7763 64-Core Processor",
        cpu_family=0x19,
        sockets=2,
        cpus=64,
        idle_driver="acpi_idle",
        idle_states=IDLE_ACPI_EPYC,
        freq_driver="acpi-cpufreq",
        governors=ACPI_GOVERNORS,
        governor="schedutil",
        epp=None,
        boost="1",
        amd_pstate_status=None,
        intel_pstate=None,
        gpus=2,
        gpu_device=0x2BB5,
        gpu_class=0x030200,
        topology="root-ports",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 root=UUID=9b1f ro quiet pci=pcie_bus_perf lockdown=integrity",
        lockdown="none [integrity] confidentiality",
        numa_balancing="1",
        thp_enabled="[always] madvise never",
        thp_defrag="always defer defer+madvise [madvise] never",
        modules={"nvidia": {}, "nvme": {}},
        kmsg=[
            (6, "Linux version 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1"),
            (5, "Kernel is locked down from command line; see man kernel_lockdown.7"),
            (6, "pci 0000:41:00.0: Max Payload Size set to 256/ 512 (was  256), Max Read Rq  256"),
            (6, "pci 0000:61:00.0: Max Payload Size set to 256/ 512 (was  256), Max Read Rq  256"),
        ],
        gpu_mrrs=256,
    ),
    "grace-arm64-4gpu": dict(
        description="An arm64 GPU node: NVIDIA Grace (Neoverse V2, 72 cores), psci_idle WFI/cpu-sleep-0/"
        "cluster-sleep-0, cppc_cpufreq (schedutil, no EPP, no boost file, no amd_pstate/intel_pstate), "
        "4 NVIDIA H100 PCIe (class 0x0302) at MRRS 512, each in its own PCI segment, a ConnectX NIC, an NVMe drive.",
        # arm64 /proc/cpuinfo has no vendor_id, model name, cpu family or physical id: model and family
        # read as None, the vendor as the CPU implementer. Sockets come from topology/physical_package_id.
        cpu_vendor=None,
        cpu_model=None,
        cpu_family=None,
        sockets=1,
        cpus=72,
        idle_driver="psci_idle",
        idle_states=IDLE_PSCI_GRACE,
        freq_driver="cppc_cpufreq",
        governors=ACPI_GOVERNORS,
        governor="schedutil",
        epp=None,
        boost=None,
        amd_pstate_status=None,
        intel_pstate=None,
        gpus=4,
        gpu_device=0x2331,
        gpu_class=0x030200,
        topology="segments",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-arm64 root=UUID=c41d7e02-5a8b-4f3e-b1d9-2e6f0a7c9b14 ro quiet",
        lockdown="[none] integrity confidentiality",
        numa_balancing="1",
        thp_enabled="[always] madvise never",
        thp_defrag="always defer defer+madvise [madvise] never",
        modules={"nvidia": {}, "nvidia_uvm": {}, "nvme": {}, "mlx5_core": {}},
        kmsg=[
            (6, "Linux version 6.1.0-28-arm64 (debian-kernel@lists.debian.org) #1 SMP Debian 6.1.119-1"),
            (6, "psci: probing for conduit method from ACPI."),
            (6, "psci: PSCIv1.1 detected in firmware."),
            (6, "cpuidle: using governor menu"),
            (6, "nvidia: loading out-of-tree module taints kernel."),
            (6, "NVRM: loading NVIDIA UNIX Open Kernel Module for aarch64  580.65.06"),
        ],
        extra_devices=("nic", "nvme"),
        arch="arm64",
        cpu_part=0xD4F,
        freq_khz=(81000, 3447000, 3375000),
    ),
}

# A 2-socket PCIe-switch node for GPU locality (module_utils/families/gpu_locality.py): 8 GPUs behind 4 PCIe
# switches, each switch on its own host bridge (root complex), two per socket. Switch 0 carries a
# ConnectX-7 (InfiniBand) and an NVMe drive beside its GPUs; switch 2 (the first on socket 1) has an
# NVMe drive behind a second, nested switch; a ConnectX-6 Dx (Ethernet, RoCE) sits on its own root
# port of switch 3's host bridge. So every relation of nvidia-smi topo -m's legend occurs:
# GPU0-NIC0 PIX, GPU4-NVMe1 PXB, GPU6-NIC1 PHB, GPU2-NIC0 NODE, GPU0-NIC1 SYS. MSI-X IRQs with
# affinities in /proc/irq, some served on the other socket, and irqbalance running.
PRESETS["xeon-2s-8gpu-switches"] = dict(
    description="2x Intel Xeon (2 NUMA nodes, 112 cores, SMT off), 8 NVIDIA H100 PCIe (class 0x0302) behind 4 "
    "PCIe switches (one host bridge each, two per socket), a ConnectX-7 and an NVMe drive under switch 0, an NVMe "
    "drive behind a nested switch under switch 2, a ConnectX-6 Dx on a root port of socket 1; MSI-X IRQs in /proc/irq "
    "(some served on the other socket) and irqbalance running.",
    cpu_vendor="GenuineIntel",
    cpu_model="Intel(R) Xeon(R) Platinum 8480+",
    cpu_family=6,
    sockets=2,
    cpus=112,
    idle_driver="intel_idle",
    idle_states=IDLE_INTEL_XEON,
    freq_driver="intel_pstate",
    governors=PSTATE_GOVERNORS,
    governor="powersave",
    epp="balance_performance",
    boost=None,
    amd_pstate_status=None,
    intel_pstate=("active", "0"),
    gpus=8,
    gpu_device=0x2331,
    gpu_class=0x030200,
    topology="switches",
    cmdline="BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 root=UUID=5e2b7c1d-90aa-4f31-8c6e-2d4b1a7f0e55 ro quiet",
    lockdown="[none] integrity confidentiality",
    numa_balancing="1",
    thp_enabled="[always] madvise never",
    thp_defrag="always defer defer+madvise [madvise] never",
    modules={"nvidia": {}, "nvidia_uvm": {}, "nvme": {}, "mlx5_core": {}, "mlx5_ib": {}},
    kmsg=[
        (6, "Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) #1 SMP Debian 6.1.119-1"),
        (6, "intel_idle: MWAIT substates: 0x2020"),
        (6, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.65.06"),
    ],
    extra_devices=("nic", "nvme"),
    msi=True,
    irqbalance=True,
)
# The same node with firmware that publishes no NUMA proximity for socket 1's root complexes:
# numa_node is -1 on every function below them (local_cpulist then lists every CPU).
PRESETS["xeon-2s-8gpu-switches-nonuma"] = dict(
    PRESETS["xeon-2s-8gpu-switches"],
    description="xeon-2s-8gpu-switches whose firmware publishes numa_node -1 for socket 1's host bridges "
    "(GPUs 4-7, the nested-switch NVMe drive and the ConnectX-6 Dx).",
    numa_unknown_nodes=(1,),
)
# Zen 5 (family 0x1A) on a kernel where amd-pstate is the servers' default (Linux 6.13, active mode): it runs
# amd-pstate-epp with no amd_pstate= argument (issue 43).
PRESETS["epyc-zen5-default"] = dict(
    PRESETS["epyc-pstate-epp"],
    description="AMD EPYC family 1Ah (Zen 5) on Linux 6.14, amd-pstate-epp active by the kernel's default "
    "(no amd_pstate= argument), 4 RTX PRO 6000 Blackwell behind root ports.",
    cmdline="BOOT_IMAGE=/boot/vmlinuz-6.14.0-29-generic root=UUID=77aa01c2 ro quiet",
    kmsg=[(6, "Linux version 6.14.0-29-generic (buildd@lcy02-amd64-031) #29-Ubuntu SMP PREEMPT_DYNAMIC"),
          (6, "amd_pstate: The CPPC feature is supported")],
    os_id="ubuntu",
    os_version="25.04",
)


def build_pci_topology(p: Preset) -> list:
    """Return the list of PCI functions for a preset, bridges first."""
    funcs = []
    sockets = max(p.sockets, 1)
    if p.topology == "none":
        funcs.append(PciFunction("0000:00:03.0", 0x1AF4, 0x1041, 0x020000, pcie=False, numa_node=-1,
                                 subsystem_vendor=0x1AF4, subsystem_device=0x0001, revision=1))
        funcs.append(PciFunction("0000:00:04.0", 0x1AF4, 0x1042, 0x010000, pcie=False, numa_node=-1,
                                 subsystem_vendor=0x1AF4, subsystem_device=0x0002, revision=1))
        return funcs
    if p.topology == "segments":
        return _segment_topology(p)
    if p.topology == "switches":
        return _switches_topology(p)
    amd = p.cpu_vendor == "AuthenticAMD"
    port_vendor, port_device = (0x1022, 0x14AB) if amd else (0x8086, 0x352A)
    gpu_sub = (p.gpu_vendor, p.gpu_subsystem)
    buses = list(p.gpu_buses or GPU_BUSES)
    if p.topology == "root-ports":
        for i in range(p.gpus):
            # Beyond 8 GPUs (benchmarks), further buses in the same root complexes.
            bus = buses[i % len(buses)] + 4 * (i // len(buses))
            root_bus = bus - 1
            node = (i * sockets // max(p.gpus, 1)) if p.sockets > 1 else 0
            rp = f"0000:{root_bus:02x}:01.1"
            funcs.append(PciFunction(rp, port_vendor, port_device, 0x060400, kind="root_port", numa_node=node,
                                     mps_supported=2, mps=p.gpu_mps, mrrs=512, secondary_bus=bus,
                                     subordinate_bus=bus))
            funcs.append(PciFunction(f"0000:{bus:02x}:00.0", p.gpu_vendor, p.gpu_device, p.gpu_class,
                                     numa_node=node, mps=p.gpu_mps, mrrs=p.gpu_mrrs, parent=rp,
                                     subsystem_vendor=gpu_sub[0], subsystem_device=gpu_sub[1]))
            if i == 0 and "audio" in p.extra_devices:
                funcs.append(PciFunction(f"0000:{bus:02x}:00.1", 0x10DE, 0x22E8, 0x040300, numa_node=node,
                                         mps=p.gpu_mps, mrrs=512, parent=rp,
                                         subsystem_vendor=gpu_sub[0], subsystem_device=gpu_sub[1]))
    else:
        funcs += _switch_gpus(p, port_vendor, port_device, gpu_sub)
    last_node = sockets - 1
    if "nic" in p.extra_devices:
        rp = "0000:c0:03.1"
        funcs.append(PciFunction(rp, port_vendor, port_device, 0x060400, kind="root_port", numa_node=last_node,
                                 mps=p.gpu_mps, secondary_bus=0xC2, subordinate_bus=0xC2))
        funcs.append(PciFunction("0000:c2:00.0", 0x15B3, 0x1021, 0x020000, numa_node=last_node, mps=p.gpu_mps,
                                 mrrs=512, parent=rp, link_speed_cap=5, link_width_cap=16,
                                 subsystem_vendor=0x15B3, subsystem_device=0x0023))
    if "nvme" in p.extra_devices:
        rp = "0000:e0:03.1" if amd else "0000:a0:01.0"
        bus = 0xE3 if amd else 0xA1
        funcs.append(PciFunction(rp, port_vendor, port_device, 0x060400, kind="root_port", numa_node=last_node,
                                 mps=p.gpu_mps, secondary_bus=bus, subordinate_bus=bus))
        funcs.append(PciFunction(f"0000:{bus:02x}:00.0", 0x144D, 0xA80A, 0x010802, numa_node=last_node,
                                 mps=p.gpu_mps, mrrs=512, parent=rp, link_speed_cap=4, link_width_cap=4,
                                 link_speed=4, link_width=4, subsystem_vendor=0x144D, subsystem_device=0xA801))
    return funcs


def _switch_gpus(p: Preset, port_vendor: int, port_device: int, gpu_sub: tuple) -> list:
    """GPUs behind a PCIe switch: root port -> upstream port -> N downstream ports -> GPUs."""
    funcs = []
    rp = "0000:15:01.0"
    funcs.append(PciFunction(rp, port_vendor, port_device, 0x060400, kind="root_port", numa_node=0,
                             mps=p.gpu_mps, secondary_bus=0x16, subordinate_bus=0x16 + 1 + p.gpus))
    up = "0000:16:00.0"
    funcs.append(PciFunction(up, 0x1000, 0xC030, 0x060400, kind="upstream", numa_node=0, mps=p.gpu_mps,
                             secondary_bus=0x17, subordinate_bus=0x17 + p.gpus, parent=rp))
    for i in range(p.gpus):
        dn = f"0000:17:{i:02x}.0"
        bus = 0x18 + i
        funcs.append(PciFunction(dn, 0x1000, 0xC030, 0x060400, kind="downstream", numa_node=0,
                                 mps=p.gpu_mps, secondary_bus=bus, subordinate_bus=bus, parent=up))
        funcs.append(PciFunction(f"0000:{bus:02x}:00.0", 0x10DE, p.gpu_device, p.gpu_class, numa_node=0,
                                 mps=p.gpu_mps, mrrs=p.gpu_mrrs, parent=dn,
                                 subsystem_vendor=gpu_sub[0], subsystem_device=gpu_sub[1]))
    return funcs


def _segment_topology(p: Preset) -> list:
    """An arm64 server's PCIe: one PCI segment (domain) per root port, as on NVIDIA Grace.

    Root ports are the SoC's own (NVIDIA vendor id, bridge class 0x0604, so never selected as
    GPUs); each device sits on bus 01 of its own segment. Socket N takes segments 0xN1-0xNf;
    GPUs beyond 13 per socket (benchmarks) go to segments from 0x1000 up.
    """
    funcs = []
    sockets = max(p.sockets, 1)
    port_vendor, port_device = 0x10DE, 0x22B2
    ports = []  # (segment, numa node, endpoint kwargs)
    per_node = {}
    for i in range(p.gpus):
        node = (i * sockets // max(p.gpus, 1)) if p.sockets > 1 else 0
        n = per_node[node] = per_node.get(node, -1) + 1
        segment = 0x10 * node + 1 + n if n < 13 else 0x1000 + i
        ports.append((segment, node, dict(vendor=0x10DE, device=p.gpu_device, class_code=p.gpu_class,
                                          mrrs=p.gpu_mrrs, subsystem_vendor=0x10DE, subsystem_device=0x1839)))
    last = sockets - 1
    if "nic" in p.extra_devices:
        nic = dict(vendor=0x15B3, device=0x1021, class_code=0x020000, mrrs=512,
                   subsystem_vendor=0x15B3, subsystem_device=0x0023)
        ports.append((0x10 * last + 0xE, last, nic))
    if "nvme" in p.extra_devices:
        nvme = dict(vendor=0x144D, device=0xA80A, class_code=0x010802, mrrs=512,
                    link_speed_cap=4, link_width_cap=4, link_speed=4, link_width=4,
                    subsystem_vendor=0x144D, subsystem_device=0xA801)
        ports.append((0x10 * last + 0xF, last, nvme))
    for segment, node, endpoint in ports:
        rp = f"{segment:04x}:00:00.0"
        funcs.append(PciFunction(rp, port_vendor, port_device, 0x060400, kind="root_port", numa_node=node,
                                 mps=p.gpu_mps, mrrs=512, secondary_bus=1, subordinate_bus=1))
        funcs.append(PciFunction(f"{segment:04x}:01:00.0", numa_node=node, mps=p.gpu_mps, parent=rp, **endpoint))
    return funcs


# Vendor/device ids of the switch topology: a Broadcom PEX890xx Gen5 switch (both port types), a
# Sapphire Rapids root port, ConnectX-7 (InfiniBand), ConnectX-6 Dx (Ethernet), a Samsung NVMe drive.
SWITCH_IDS = (0x1000, 0xC030)
SPR_ROOT_PORT = (0x8086, 0x352A)
CX7_IB = dict(vendor=0x15B3, device=0x1021, class_code=0x020700, subsystem_vendor=0x15B3, subsystem_device=0x0040)
CX6DX_ETH = dict(vendor=0x15B3, device=0x101D, class_code=0x020000, subsystem_vendor=0x15B3, subsystem_device=0x0016)
NVME_DRIVE = dict(vendor=0x144D, device=0xA80A, class_code=0x010802, subsystem_vendor=0x144D, subsystem_device=0xA801,
                  link_speed_cap=4, link_width_cap=4, link_speed=4, link_width=4)


def _switch_numa(p: Preset, socket: int) -> int:
    """The numa_node a socket's functions publish: -1 where its firmware gives no proximity."""
    return -1 if socket in p.numa_unknown_nodes else socket


def _switch_port(p: Preset, bdf: str, kind: str, node: int, secondary: int, subordinate: int, parent=None):
    ids = SPR_ROOT_PORT if kind == "root_port" else SWITCH_IDS
    return PciFunction(bdf, ids[0], ids[1], 0x060400, kind=kind, numa_node=node, mps=p.gpu_mps, mrrs=512,
                       secondary_bus=secondary, subordinate_bus=subordinate, parent=parent)


def _switch_endpoint(p: Preset, bus: int, node: int, parent: str, ids: dict) -> PciFunction:
    return PciFunction(f"0000:{bus:02x}:00.0", numa_node=node, mps=p.gpu_mps, mrrs=ids.pop("mrrs", 512), parent=parent,
                       **ids)


def _switches_topology(p: Preset) -> list:
    """GPUs in pairs behind PCIe switches, one host bridge per switch, switches spread over the sockets.

    Switch i sits on host bridge ``0000:BB`` (BB = 0x10 + 0x1e * i): root port BB:01.0, the switch's
    upstream port on bus BB+1, its downstream ports on bus BB+2, endpoints on BB+3... Switch 0 (and,
    with ``nics_every``, every Nth switch) adds a ConnectX-7; switch 0 an NVMe drive; the first switch
    of the last socket an NVMe drive behind a nested switch; the last host bridge a ConnectX-6 Dx on a
    second root port.
    """
    funcs, sockets = [], max(p.sockets, 1)
    n_sw = max(1, (p.gpus + 1) // 2)
    nested_sw = next((i for i in range(n_sw) if i * sockets // n_sw == sockets - 1), n_sw - 1)
    gpu = dict(vendor=0x10DE, device=p.gpu_device, class_code=p.gpu_class, subsystem_vendor=0x10DE,
               subsystem_device=0x1839)
    for i in range(n_sw):
        hb = 0x10 + 0x1E * i
        node = _switch_numa(p, i * sockets // n_sw)
        rp, usp = f"0000:{hb:02x}:01.0", f"0000:{hb + 1:02x}:00.0"
        funcs.append(_switch_port(p, rp, "root_port", node, hb + 1, hb + 0x0F))
        funcs.append(_switch_port(p, usp, "upstream", node, hb + 2, hb + 0x0F, rp))
        ends = [dict(gpu, mrrs=p.gpu_mrrs) for _g in range(min(2, p.gpus - 2 * i))]
        if i == 0 or (p.nics_every and i % p.nics_every == 0):
            ends.append(dict(CX7_IB))
        if i == 0 and "nvme" in p.extra_devices:
            ends.append(dict(NVME_DRIVE))
        for k, ids in enumerate(ends):
            dsp = f"0000:{hb + 2:02x}:{k:02x}.0"
            funcs.append(_switch_port(p, dsp, "downstream", node, hb + 3 + k, hb + 3 + k, usp))
            funcs.append(_switch_endpoint(p, hb + 3 + k, node, dsp, ids))
        if i == nested_sw and n_sw > 1 and "nvme" in p.extra_devices:
            dsp = f"0000:{hb + 2:02x}:{len(ends):02x}.0"
            funcs.append(_switch_port(p, dsp, "downstream", node, hb + 7, hb + 9, usp))
            funcs.append(_switch_port(p, f"0000:{hb + 7:02x}:00.0", "upstream", node, hb + 8, hb + 9, dsp))
            funcs.append(_switch_port(p, f"0000:{hb + 8:02x}:00.0", "downstream", node, hb + 9, hb + 9,
                                      f"0000:{hb + 7:02x}:00.0"))
            funcs.append(_switch_endpoint(p, hb + 9, node, f"0000:{hb + 8:02x}:00.0", dict(NVME_DRIVE)))
    if "nic" in p.extra_devices:
        hb = 0x10 + 0x1E * (n_sw - 1)
        node = _switch_numa(p, sockets - 1)
        rp = f"0000:{hb:02x}:02.0"
        funcs.append(_switch_port(p, rp, "root_port", node, hb + 0x10, hb + 0x10))
        funcs.append(_switch_endpoint(p, hb + 0x10, node, rp, dict(CX6DX_ETH)))
    return funcs


# ---------------------------------------------------------------------------------------------
# PCI configuration space
# ---------------------------------------------------------------------------------------------

PCIE_PORT_TYPE = {"endpoint": 0x0, "root_port": 0x4, "upstream": 0x5, "downstream": 0x6}


def _encode_size(size: int) -> int:
    return (size // 128).bit_length() - 1


def config_space(f: PciFunction) -> bytes:  # noqa: PLR0915 (the config-space layout, capability by capability at fixed offsets)
    """Return 4096 bytes of configuration space for a function."""
    cfg = bytearray(4096)
    bridge = f.kind != "endpoint"
    struct.pack_into("<HH", cfg, 0x00, f.vendor, f.device)
    struct.pack_into("<H", cfg, 0x04, 0x0547 if bridge else 0x0546)  # IO/MEM/bus master, SERR, parity
    struct.pack_into("<H", cfg, 0x06, 0x0010)  # capability list present
    cfg[0x08] = f.revision
    cfg[0x09] = f.class_code & 0xFF
    cfg[0x0A] = (f.class_code >> 8) & 0xFF
    cfg[0x0B] = (f.class_code >> 16) & 0xFF
    cfg[0x0C] = 0x10  # cache line size
    cfg[0x0E] = 0x01 if bridge else (0x80 if f.bdf.endswith(".0") and f.vendor == 0x10DE else 0x00)
    if bridge:
        bus = int(f.bdf[5:7], 16)
        cfg[0x18] = bus
        cfg[0x19] = f.secondary_bus
        cfg[0x1A] = f.subordinate_bus
        struct.pack_into("<HH", cfg, 0x20, 0xF000, 0xF0F0)  # memory base/limit
    else:
        struct.pack_into("<I", cfg, 0x10, 0xF2000000)  # BAR0
        struct.pack_into("<I", cfg, 0x14, 0x0000000C)  # BAR1 64-bit prefetchable
        struct.pack_into("<HH", cfg, 0x2C, f.subsystem_vendor, f.subsystem_device)
        cfg[0x3C] = 0xFF
        cfg[0x3D] = 0x01
    cfg[0x34] = 0x60
    # Power management capability
    cfg[0x60] = 0x01
    cfg[0x61] = 0x68
    struct.pack_into("<H", cfg, 0x62, 0x0003)
    # MSI capability
    cfg[0x68] = 0x05
    cfg[0x69] = 0x78 if f.pcie else 0x00
    struct.pack_into("<H", cfg, 0x6A, 0x0080)
    if f.pcie:
        cap = 0x78
        cfg[cap] = 0x10
        cfg[cap + 1] = 0x00
        slot = 0x0100 if f.kind in ("root_port", "downstream") else 0
        struct.pack_into("<H", cfg, cap + 0x02, 0x0002 | (PCIE_PORT_TYPE[f.kind] << 4) | slot)
        # DevCap: MPS supported, phantom functions none, extended tag, L0s/L1 acceptable latencies,
        # role-based error reporting, FLR capable on endpoints.
        devcap = (f.mps_supported & 0x7) | 0x20 | (0x7 << 6) | (0x7 << 9) | (1 << 15)
        if f.kind == "endpoint":
            devcap |= 1 << 28
        struct.pack_into("<I", cfg, cap + 0x04, devcap)
        # DevCtl: error reporting enables, relaxed ordering, extended tags, no-snoop,
        # plus the MPS and MRRS fields.
        devctl = 0x000F | 0x0010 | 0x0100 | 0x0800 | (_encode_size(f.mps) << 5) | (_encode_size(f.mrrs) << 12)
        struct.pack_into("<H", cfg, cap + 0x08, devctl)
        struct.pack_into("<H", cfg, cap + 0x0A, 0x0000)
        port_number = int(f.bdf[8:10], 16)
        lnkcap = (f.link_speed_cap & 0xF) | ((f.link_width_cap & 0x3F) << 4) | (0x3 << 10) | (port_number << 24)
        struct.pack_into("<I", cfg, cap + 0x0C, lnkcap)
        struct.pack_into("<H", cfg, cap + 0x10, 0x0040)  # common clock
        struct.pack_into("<H", cfg, cap + 0x12, (f.link_speed & 0xF) | ((f.link_width & 0x3F) << 4) | 0x1000)
        struct.pack_into("<I", cfg, cap + 0x24, 0x0070001F)  # DevCap2
        struct.pack_into("<I", cfg, cap + 0x2C, (((1 << f.link_speed_cap) - 1) << 1))  # LnkCap2 speeds
        struct.pack_into("<H", cfg, cap + 0x30, f.link_speed_cap)  # LnkCtl2 target speed
        # Extended capabilities: AER at 0x100, ACS on ports at 0x148, Resizable BAR on GPUs at 0x148.
        acs = f.kind in ("root_port", "downstream")
        rebar = is_gpu(f)
        struct.pack_into("<I", cfg, 0x100, 0x0001 | (1 << 16) | ((0x148 if acs or rebar else 0) << 20))
        if rebar:
            pack_rebar(cfg, 0x148, gpu_bars(f))
        if acs:
            struct.pack_into("<I", cfg, 0x148, 0x000D | (1 << 16))
            struct.pack_into("<H", cfg, 0x14C, 0x005F)  # ACS capability
            struct.pack_into("<H", cfg, 0x14E, 0x001D)  # ACS control: SV, RR, CR, UF
    return bytes(cfg)


# The GPU's memory BARs (issue 44): BAR sizes in ``resource``, the Resizable BAR capability (ext. cap 0x15) in
# config space, as on real GPUs (lspci: NVIDIA "BAR 1: current size: 256MB, supported: 64MB ... 64GB", BAR0 16MB
# and BAR3 32MB fixed). With the firmware's Above 4G Decoding and Resizable BAR on, the peer BAR covers the
# memory: its size is the power of two at or above it, the largest the capability supports.
SIM_GPU_MEMORY_GIB = {0x2BB5: 96, 0x2330: 80, 0x74A1: 192}
MIB = 1 << 20
IORESOURCE_MEM_64_PREF = 0x14220C  # IORESOURCE_MEM | PREFETCH | MEM_64 | SIZEALIGN, as sysfs shows a 64-bit BAR
IORESOURCE_MEM_32 = 0x40200


def gpu_bars(f: PciFunction) -> list:
    """``[(bar index, current size, [supported sizes])]`` of a simulated GPU: NVIDIA BAR0 16 MiB, BAR1 (the
    peer BAR, resizable from 64 MiB), BAR3 32 MiB; AMD BAR0 (the VRAM BAR, from 256 MiB), BAR2 2 MiB."""
    mem = SIM_GPU_MEMORY_GIB.get(f.device, 16) << 30
    full = 1 << (mem - 1).bit_length()
    if f.vendor == 0x1002:
        return [(0, full, [256 * MIB << n for n in range((full // (256 * MIB)).bit_length())]), (2, 2 * MIB, [2 * MIB])]
    return [(0, 16 * MIB, [16 * MIB]), (1, full, [64 * MIB << n for n in range((full // (64 * MIB)).bit_length())]),
            (3, 32 * MIB, [32 * MIB])]


def pack_rebar(cfg: bytearray, pos: int, bars: list) -> None:
    """The Resizable BAR capability at ``pos`` (pci_regs.h PCI_REBAR_*): one 8-byte entry per BAR after the header,
    the capability register's bit n + 4 for a size of 1 MiB << n, the control register's index, count and size."""
    struct.pack_into("<I", cfg, pos, 0x0015 | (1 << 16))
    for i, (index, current, supported) in enumerate(bars):
        cap = 0
        for size in supported:
            cap |= 1 << (size.bit_length() - 21 + 4)
        ctrl = index | ((current.bit_length() - 21) << 8) | ((len(bars) << 5) if i == 0 else 0)
        struct.pack_into("<II", cfg, pos + 4 + 8 * i, cap, ctrl)


def resource_text(f: PciFunction) -> str:
    """sysfs ``resource``: 17 lines of ``start end flags``, a GPU's BARs at their sizes, the rest zero."""
    lines = ["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 17
    if f.kind == "endpoint":
        lines[0] = "0x00000000f2000000 0x00000000f2ffffff 0x%016x" % IORESOURCE_MEM_32
    if is_gpu(f):
        base = (0x100 + int(f.bdf[5:7], 16)) << 40  # a 1 TiB window per GPU bus, above 4 GiB
        for index, size, _supported in sorted(gpu_bars(f), key=lambda b: -b[1]):
            low = index == 0 and f.vendor != 0x1002
            start = 0xF2000000 if low else base
            lines[index] = "0x%016x 0x%016x 0x%016x" % (start, start + size - 1,
                                                        IORESOURCE_MEM_32 if low else IORESOURCE_MEM_64_PREF)
            base += 0 if low else size
    return "\n".join(lines)


def set_gpu_bar(root: str, bdf: str, index: int, size: int) -> None:
    """Resize BAR ``index`` of the GPU ``bdf`` of a built node (as firmware without Resizable BAR leaves it): its
    ``resource`` line and the capability's current size; the supported sizes stay."""
    d = os.path.realpath(os.path.join(root, "sys/bus/pci/devices", bdf))
    with open(os.path.join(d, "resource"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    start = int(lines[index].split()[0], 16)
    lines[index] = "0x%016x 0x%016x %s" % (start, start + size - 1, lines[index].split()[2])
    with open(os.path.join(d, "resource"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    with open(os.path.join(d, "config"), "r+b") as fh:
        cfg = bytearray(fh.read())
        pos = 0x148
        if int.from_bytes(cfg[pos:pos + 2], "little") != 0x15:
            raise ValueError(f"{bdf} has no Resizable BAR capability")
        count = (cfg[pos + 8] >> 5) & 7
        for i in range(count):
            ctrl = int.from_bytes(cfg[pos + 8 + 8 * i:pos + 12 + 8 * i], "little")
            if ctrl & 7 == index:
                ctrl = (ctrl & ~0x3F00) | ((size.bit_length() - 21) << 8)
                struct.pack_into("<I", cfg, pos + 8 + 8 * i, ctrl)
                break
        else:
            raise ValueError(f"{bdf}'s BAR {index} is not resizable")
        fh.seek(0)
        fh.write(bytes(cfg))


# The AER counter files (drivers/pci/pcie/aer.c), with the error names of current kernels (as fwupd's record of
# a real AMD machine shows them).
_UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
                  "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                  "PoisonTLPBlocked")
AER_FILES = (
    ("aer_dev_correctable", ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr",
                             "HeaderOF", "TOTAL_ERR_COR")),
    ("aer_dev_fatal", _UNCORRECTABLE + ("TOTAL_ERR_FATAL",)),
    ("aer_dev_nonfatal", _UNCORRECTABLE + ("TOTAL_ERR_NONFATAL",)),
)
AER_SEVERITY_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}


def aer_text(names: tuple, counts: dict) -> str:
    """An ``aer_dev_*`` file: each name with its count, the TOTAL_ERR_* line their sum."""
    total = sum(counts.get(n, 0) for n in names[:-1])
    return "".join("%s %d\n" % (n, total if n.startswith("TOTAL_ERR_") else counts.get(n, 0)) for n in names)


def set_aer(root: str, bdf: str, severity: str, counts: dict) -> None:
    """Set AER counts of ``bdf`` (a GPU or a bridge) on a built node: ``{error name: count}`` of ``severity``
    (correctable, nonfatal, fatal); the names not given keep their counts."""
    if severity not in AER_SEVERITY_FILES:
        raise ValueError(f"AER severity {severity!r} is not one of {', '.join(AER_SEVERITY_FILES)}")
    filename = AER_SEVERITY_FILES[severity]
    names = dict(AER_FILES)[filename]
    unknown = sorted(set(counts) - set(names[:-1]))
    if unknown:
        raise ValueError(f"unknown {severity} AER error(s) {', '.join(unknown)}; known: {', '.join(names[:-1])}")
    path = os.path.join(root, "sys/bus/pci/devices", bdf, filename)
    with open(path, encoding="utf-8") as fh:
        now = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in fh.read().splitlines() if line}
    now.update(counts)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(aer_text(names, now))


# ---------------------------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------------------------


class _Tree:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def write(self, rel: str, content, mode: int = 0o644) -> None:
        full = self.path(rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        data = content if isinstance(content, bytes) else (str(content) + "\n").encode()
        with open(full, "wb") as fh:
            fh.write(data)
        os.chmod(full, mode)

    def symlink(self, target: str, rel: str) -> None:
        full = self.path(rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.symlink(target, full)

    def mkdir(self, rel: str) -> None:
        os.makedirs(self.path(rel), exist_ok=True)


def _cpulist(cpus) -> str:
    """Format a sorted list of CPU numbers as a kernel cpulist ("0-3,8-11")."""
    parts = []
    start = prev = None
    for c in cpus:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = c
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(parts)


def _cpu_node(p: Preset, cpu: int) -> int:
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


def _kmsg_record(seq: int, level: int, usec: int, msg: str, facility: int = 0) -> str:
    return f"{(facility << 3) | level},{seq},{usec},-;{msg}\n"


def write_kmsg(tree: _Tree, messages, extra_records: int = 0) -> None:
    """Write the kernel log in /dev/kmsg record format (PRI,SEQ,TIMESTAMP_US,FLAGS;MESSAGE)."""
    lines = []
    usec = 0
    seq = 0
    for level, msg in messages:
        usec += 137_000
        lines.append(_kmsg_record(seq, level, usec, msg))
        seq += 1
    for i in range(extra_records):
        usec += 997
        # Mostly informational noise with a sprinkle of warnings, as on a busy node.
        if i % 50 == 49:
            src = f"10.224.{(i // 256) % 256}.{i % 256}"
            lines.append(_kmsg_record(seq, 4, usec, f"vxlan: non-ECT from {src} with TOS=0x2"))
        else:
            lines.append(_kmsg_record(seq, 6, usec, f"eth0: rx queue {i % 64} refill ok"))
        seq += 1
    tree.write("dev/kmsg", "".join(lines).encode())


def build(root: str, preset: str, cpus: int | None = None, gpus: int | None = None,  # noqa: PLR0913
          kmsg_records: int = 0, nvidia_smi: bool = False, gpu_faults: dict | None = None,
          iommu: str | None = None, vfio: list | None = None, benchmark: str | None = None,
          smi_driver: str = "current", smi_mode: str = "answer", smi_ansi: bool = False,
          amd_smi: bool = False, amd_faults: dict | None = None, amd_smi_mode: str = "answer",
          kernel: str | None = None, cppc: bool = True, nvidia_driver: str | None = None,
          aspm: str = "disabled") -> dict:
    """Write a simulated node for ``preset`` under ``root`` (which must be empty or absent).

    ``nvidia_smi``: ship a node-local nvidia-smi stand-in (``usr/bin``) answering from its own
    table; ``gpu_faults``: ``{kind: [GPU index, ...]}`` with the kinds of ``GPU_FAULTS`` (implies
    ``nvidia_smi``). ``iommu``: an active IOMMU whose groups have this default domain type
    (``identity``, ``DMA``, ``DMA-FQ``); ``vfio``: BDFs bound to vfio-pci (a ``driver`` link).
    ``benchmark``: ship the benchmark stand-in ``usr/bin/gpunode-sim-bench`` (``normal``: tuning
    raises its number; ``inverse``: tuning lowers it; ``hang``: it never answers), for the rollout's measure gate.
    ``smi_driver`` (``SMI_DRIVERS``: ``r470`` an older driver's field set), ``smi_mode`` (``SMI_MODES``: ``hang``,
    ``exit9``, ``garbled``) and ``smi_ansi`` (the ANSI-underlined topo header of drivers 590-610) shape the
    nvidia-smi stand-in and imply ``nvidia_smi``; a ``dead`` GPU fault reads all 0xff from config space.
    ``amd_smi``: ship a node-local amd-smi stand-in (AMD presets); ``amd_faults`` (``AMD_FAULTS``, GPU indices in
    bus order) and ``amd_smi_mode`` (``AMD_SMI_MODES``) shape it and imply ``amd_smi``.
    ``kernel``: the running kernel's release instead of the preset's (its config and modules.builtin have
    amd-pstate from 5.17 on); ``cppc``: False for a firmware with CPPC off (no ``cpuN/acpi_cppc/``); where the
    kernel cannot run the preset's amd-pstate (``kernel_runs_amd_pstate``) the node runs acpi-cpufreq.
    ``nvidia_driver``: ``FLAVOR:VERSION`` (``open:580.65.06``, ``proprietary:570.86.15``) writes
    ``proc/driver/nvidia/version`` and ``sys/module/nvidia/version`` as that driver does.
    Returns a short description: preset name, cpus, gpus, and the GPU BDFs.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; available: {', '.join(sorted(PRESETS))}")
    p = Preset(name=preset, **PRESETS[preset])
    if cpus is not None:
        p.cpus = cpus
    if gpus is not None:
        if p.topology == "none" and gpus:
            raise ValueError(f"preset {preset} has no PCIe devices; it cannot take gpus={gpus}")
        p.gpus = gpus
    if p.cpus < 1:
        raise ValueError("cpus must be >= 1")
    if os.path.exists(root) and os.listdir(root):
        raise ValueError(f"{root} is not empty")
    _fit_platform(p, kernel, cppc, nvidia_driver)
    funcs = build_pci_topology(p)
    faults = {k: list(v) for k, v in (gpu_faults or {}).items()}
    missing = apply_gpu_faults(p, funcs, faults)  # before the first write: a bad fault writes nothing
    _smi_driver(p, smi_driver, smi_mode, smi_ansi)  # likewise for a bad stand-in option
    amd_faults = {k: list(v) for k, v in (amd_faults or {}).items()}
    apply_amd_faults(p, funcs, amd_faults)
    if amd_smi_mode not in AMD_SMI_MODES:
        raise ValueError(f"amd_smi_mode {amd_smi_mode!r} is not one of {', '.join(AMD_SMI_MODES)}")
    check_iommu_vfio(funcs, iommu, vfio)
    simnode_aspm.check(aspm)
    if benchmark is not None and benchmark not in BENCHMARK_KINDS:
        raise ValueError(f"benchmark {benchmark!r} is not one of {', '.join(BENCHMARK_KINDS)}")
    t = _Tree(root)
    _write_identity(t, p)
    _write_cpus(t, p)
    _write_numa(t, p)
    _write_pci(t, funcs)
    _write_modules(t, p)
    _write_processes(t, p)
    write_kmsg(t, p.kmsg, extra_records=kmsg_records)
    _write_standard_dirs(t, p)
    write_reboot_command(t)
    write_modprobe(t, p)
    if nvidia_smi or faults or (smi_driver, smi_mode, smi_ansi) != ("current", "answer", False):
        write_nvidia_smi(t, p, funcs, faults, missing, smi_driver, smi_mode, smi_ansi)
    if amd_smi or amd_faults or amd_smi_mode != "answer":
        write_amd_smi(t, p, funcs, amd_faults, amd_smi_mode)
    write_iommu_vfio(t, p, funcs, iommu, vfio)
    write_locality(t, p, funcs)
    _write_platform(t, p)
    if benchmark is not None:
        write_benchmark(root, benchmark)
    simnode_aspm.write(root, funcs, aspm)
    gpu_bdfs = [f.bdf for f in funcs if is_gpu(f)]
    return {"preset": p.name, "cpus": p.cpus, "gpus": len(gpu_bdfs), "gpu_bdfs": gpu_bdfs, "root": t.root}


# The kernel release from which the simulated kernel has amd-pstate (5.17; its config then has
# CONFIG_X86_AMD_PSTATE=y): like a distribution kernel with the driver backported, it then takes every
# amd_pstate= mode, as core/platform.py judges a kernel whose configuration has the option.
AMD_PSTATE_SINCE = (5, 17)
NVIDIA_FLAVORS = ("open", "proprietary")


def _release_of(p: Preset) -> str:
    return next((m.split()[2] for _level, m in p.kmsg if m.startswith("Linux version")), "6.1.0-28-amd64")


def _release_numbers(release: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _fit_platform(p: Preset, kernel: str | None, cppc: bool, nvidia_driver: str | None) -> None:
    """Apply the platform options to the preset (before anything is written: a bad option writes nothing)."""
    if nvidia_driver is not None:
        flavor, _sep, version = nvidia_driver.partition(":")
        if flavor not in NVIDIA_FLAVORS or not re.match(r"^\d+(\.\d+)+$", version):
            raise ValueError(f"nvidia_driver {nvidia_driver!r} must be FLAVOR:VERSION with FLAVOR one of "
                             f"{', '.join(NVIDIA_FLAVORS)} (e.g. open:580.65.06)")
    if kernel is not None:
        if not re.match(r"^\d+\.\d+", kernel):
            raise ValueError(f"kernel {kernel!r} is not a release such as 5.15.0-91-generic")
        old = _release_of(p)
        p.kmsg = [(lvl, m.replace(old, kernel)) for lvl, m in p.kmsg]
        if not any(m.startswith("Linux version") for _lvl, m in p.kmsg):
            p.kmsg = [(6, f"Linux version {kernel} (simulated)")] + list(p.kmsg)
        p.cmdline = p.cmdline.replace(old, kernel)
    p.cppc = cppc and p.cpu_vendor == "AuthenticAMD"
    p.nvidia_driver = nvidia_driver
    if p.freq_driver and p.freq_driver.startswith("amd-pstate"):
        mode = p.amd_pstate_status or "active"
        if not kernel_runs_amd_pstate(_release_of(p), p.cppc, mode):
            p.freq_driver, p.governors, p.governor, p.epp, p.amd_pstate_status = (
                "acpi-cpufreq", ACPI_GOVERNORS, "schedutil", None, None)


def kernel_runs_amd_pstate(release: str, cppc: bool, mode: str | None) -> bool:
    """Whether the simulated kernel ``release`` on a CPU with (``cppc``) firmware CPPC can run amd-pstate in
    ``mode`` (None: any)."""
    return bool(cppc) and _release_numbers(release) >= AMD_PSTATE_SINCE


def _write_platform(t: _Tree, p: Preset) -> None:
    """The kernel's configuration and modules.builtin, ACPI CPPC, the NVIDIA driver's version files."""
    release = _release_of(p)
    has = _release_numbers(release) >= AMD_PSTATE_SINCE
    config = ["CONFIG_X86_ACPI_CPUFREQ=m"] + (["CONFIG_X86_AMD_PSTATE=y", "CONFIG_X86_AMD_PSTATE_DEFAULT_MODE=3"]
                                              if has else [])
    if p.arch == "x86_64":
        t.write(f"boot/config-{release}", "\n".join(["#", f"# Linux/x86 {release} Kernel Configuration", "#"]
                                                    + config) + "\n")
    builtin = ["kernel/drivers/cpufreq/amd-pstate.ko"] if has and p.arch == "x86_64" else []
    t.write(f"lib/modules/{release}/modules.builtin", "\n".join(builtin + ["kernel/drivers/pci/pcie/aspm.ko"]))
    if getattr(p, "cppc", False):
        for cpu in range(p.cpus):
            for name in ("highest_perf", "nominal_perf", "lowest_perf"):
                t.write(f"{CPU_BASE}/cpu{cpu}/acpi_cppc/{name}", {"highest_perf": 196}.get(name, 100))
    driver = getattr(p, "nvidia_driver", None)
    if driver:
        flavor, _sep, version = driver.partition(":")
        banner = ("NVIDIA UNIX Open Kernel Module for x86_64" if flavor == "open"
                  else "NVIDIA UNIX x86_64 Kernel Module")
        t.write("proc/driver/nvidia/version", f"NVRM version: {banner}  {version}  Release Build  (simulated)\n"
                "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
        t.write("sys/module/nvidia/version", version)


def _write_identity(t: _Tree, p: Preset) -> None:
    """OS release, command line, sysctls, uptime, boot id, lockdown, THP."""
    t.write("etc/os-release", f'ID={p.os_id}\nVERSION_ID="{p.os_version}"\nPRETTY_NAME="{p.os_id} {p.os_version}"')
    t.write("etc/hostname", "gpunode")
    t.write("proc/cmdline", p.cmdline)
    release = _release_of(p)
    sysctls = dict(DEFAULT_SYSCTLS)
    sysctls["kernel/numa_balancing"] = p.numa_balancing
    sysctls["kernel/osrelease"] = release
    for key, value in sysctls.items():
        t.write(f"proc/sys/{key}", value)
    t.write("proc/uptime", "86400.00 5529600.00")
    t.write("proc/sys/kernel/random/boot_id", "5f0c7a1e-3b2d-4c8e-9a61-0d2b7e4f9c13")
    t.write("proc/version", f"Linux version {release} (simulated node, preset {p.name})")
    t.write("sys/kernel/security/lockdown", p.lockdown)
    t.write("sys/kernel/mm/transparent_hugepage/enabled", p.thp_enabled)
    t.write("sys/kernel/mm/transparent_hugepage/defrag", p.thp_defrag)


CPU_BASE = "sys/devices/system/cpu"


def _write_cpus(t: _Tree, p: Preset) -> None:
    """Every CPU (topology, idle states, cpufreq policy), /proc/cpuinfo and the node-wide CPU files."""
    all_cpus = _cpulist(range(p.cpus))
    for name in ("online", "possible", "present"):
        t.write(f"{CPU_BASE}/{name}", all_cpus)
    cpuinfo = []
    per_socket = max(p.cpus // max(p.sockets, 1), 1)
    for cpu in range(p.cpus):
        d = f"{CPU_BASE}/cpu{cpu}"
        socket = _cpu_node(p, cpu)
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


def _write_idle_states(t: _Tree, p: Preset, cpu: int) -> None:
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


def _write_policy(t: _Tree, p: Preset, cpu: int) -> None:
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


def _online_cpus(t: _Tree) -> list:
    out = []
    with open(t.path(f"{CPU_BASE}/online"), encoding="ascii") as fh:
        for part in fh.read().strip().split(","):
            first, _sep, last = part.partition("-")
            out += list(range(int(first), int(last or first) + 1))
    return out


def _clear_cpufreq(t: _Tree, cpus: list) -> None:
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
    t = _Tree(root)
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


def _write_numa(t: _Tree, p: Preset) -> None:
    nodes = max(p.sockets, 1)
    t.write("sys/devices/system/node/online", _cpulist(range(nodes)))
    t.write("sys/devices/system/node/possible", _cpulist(range(nodes)))
    for n in range(nodes):
        t.write(f"sys/devices/system/node/node{n}/cpulist",
                _cpulist([c for c in range(p.cpus) if _cpu_node(p, c) == n]))


PCIE_SPEEDS = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}


def _write_pci(t: _Tree, funcs: list) -> None:
    """Each function's sysfs directory below its bridges, and its /sys/bus/pci/devices link."""
    by_bdf = {f.bdf: f for f in funcs}

    def device_dir(f: PciFunction) -> str:
        chain = []
        cur = f
        while cur is not None:
            chain.append(cur.bdf)
            cur = by_bdf.get(cur.parent) if cur.parent else None
        domain_bus = chain[-1][:7]  # "0000:41" of the top-most function
        return "sys/devices/pci" + domain_bus + "/" + "/".join(reversed(chain))

    for f in funcs:
        d = device_dir(f)
        cfg = config_space(f)
        t.write(f"{d}/config", b"\xff" * len(cfg) if f.dead else cfg)
        t.write(f"{d}/vendor", f"0x{f.vendor:04x}")
        t.write(f"{d}/device", f"0x{f.device:04x}")
        t.write(f"{d}/class", f"0x{f.class_code:06x}")
        t.write(f"{d}/subsystem_vendor", f"0x{f.subsystem_vendor:04x}")
        t.write(f"{d}/subsystem_device", f"0x{f.subsystem_device:04x}")
        t.write(f"{d}/revision", f"0x{f.revision:02x}")
        t.write(f"{d}/numa_node", f.numa_node)
        t.write(f"{d}/irq", "0" if f.kind != "endpoint" else str(100 + (int(f.bdf[5:7], 16) % 90)))
        t.write(f"{d}/resource", resource_text(f))
        if f.pcie:
            for name, counters in AER_FILES:
                t.write(f"{d}/{name}", aer_text(counters, {}))
            t.write(f"{d}/current_link_speed", PCIE_SPEEDS[f.link_speed])
            t.write(f"{d}/current_link_width", f.link_width)
            t.write(f"{d}/max_link_speed", PCIE_SPEEDS[f.link_speed_cap])
            t.write(f"{d}/max_link_width", f.link_width_cap)
        t.symlink("../../../" + d[len("sys/"):], f"sys/bus/pci/devices/{f.bdf}")


def _write_modules(t: _Tree, p: Preset) -> None:
    lines = []
    for name, params in p.modules.items():
        t.write(f"sys/module/{name}/initstate", "live")
        t.write(f"sys/module/{name}/refcnt", "0")
        for k, v in params.items():
            t.write(f"sys/module/{name}/parameters/{k}", v)
        lines.append(f"{name} 65536 0 - Live 0x0000000000000000")
    t.write("proc/modules", "\n".join(lines) if lines else b"")
    # processor (ACPI processor driver, where acpi_idle's max_cstate lives) is x86's.
    for builtin in ("pcie_aspm", "processor") if p.arch == "x86_64" else ("pcie_aspm",):
        t.mkdir(f"sys/module/{builtin}/parameters")


def _write_processes(t: _Tree, p: Preset) -> None:
    """init, and the NVIDIA persistence daemon where a preset has one."""
    if p.persistenced:
        t.write("proc/2187/comm", "nvidia-persistenced")
        t.write("proc/2187/cmdline", b"/usr/bin/nvidia-persistenced\0--user\0nvidia-persistenced\0")
    t.write("proc/1/comm", "systemd")
    t.write("proc/1/cmdline", b"/sbin/init\0")


def _write_standard_dirs(t: _Tree, p: Preset) -> None:
    """The places the persistent tuning writes to, and the directories every Debian/RHEL node has.

    With them a rollback can be compared with the original tree byte for byte, without
    "standard directory created" exceptions.
    """
    for rel in ("etc/sysctl.d", "etc/modules-load.d", "etc/modprobe.d", "etc/systemd/system",
                "etc/systemd/system/multi-user.target.wants", "etc/systemd/system/timers.target.wants",
                "etc/udev/rules.d", "var/lib",
                "usr/local/bin", "usr/local/lib", "usr/local/sbin"):
        t.mkdir(rel)
    if p.os_id in ("debian", "ubuntu"):  # Ubuntu configures GRUB the same way
        t.write("etc/default/grub", "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
                "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
                'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""')
        t.mkdir("etc/default/grub.d")


MODPROBE_SCRIPT = r"""#!/bin/sh
# Simulated modprobe of a simulated node (written by tools/simnode.py). It understands the
# subset of modprobe that the collection uses and behaves like the real tool would on the
# preset's machine: known modules load (a /sys/module entry appears), nvidia_peermem fails
# with EINVAL as on a node without MOFED, anything else is not found.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
remove=0
name=""
params=""
for arg in "$@"; do
  case "$arg" in
    -r|--remove) remove=1 ;;
    -*) ;;
    *) if [ -z "$name" ]; then name="$arg"; else params="$params $arg"; fi ;;
  esac
done
name=$(echo "$name" | tr '-' '_')
kmsg() { seq=$(wc -l < "$ROOT/dev/kmsg"); echo "3,$seq,999999999,-;$1" >> "$ROOT/dev/kmsg"; }
if [ "$remove" = 1 ]; then
  [ -d "$ROOT/sys/module/$name" ] || { echo "modprobe: FATAL: Module $name is not in kernel." >&2; exit 1; }
  rm -rf "$ROOT/sys/module/$name"; exit 0
fi
[ -d "$ROOT/sys/module/$name" ] && exit 0
case " @LOADABLE@ " in
  *" $name "*)
    mkdir -p "$ROOT/sys/module/$name/parameters"
    echo live > "$ROOT/sys/module/$name/initstate"
    for p in $params; do echo "${p#*=}" > "$ROOT/sys/module/$name/parameters/${p%%=*}"; done
    exit 0 ;;
esac
case "$name" in
  nvidia_peermem)
    echo "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument" >&2
    kmsg "nvidia-peermem nv_mem_client_init:203 ERROR: ib_register_peer_memory_client failed"
    exit 1 ;;
esac
echo "modprobe: FATAL: Module $name not found in directory /lib/modules/@RELEASE@" >&2
exit 1
"""


def write_modprobe(t: _Tree, p: Preset) -> None:
    """Install the simulated node's modprobe under <root>/usr/sbin/modprobe."""
    loadable = ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvme", "mlx5_core", "ib_core",
                "tcp_bbr", "br_netfilter", "overlay"]
    if p.arch == "x86_64":
        loadable += ["msr", "cpuid"]  # x86-only drivers
    release = open(t.path("proc/sys/kernel/osrelease")).read().strip()
    script = MODPROBE_SCRIPT.replace("@LOADABLE@", " ".join(loadable)).replace("@RELEASE@", release)
    t.write("usr/sbin/modprobe", script.encode(), mode=0o755)


# ---------------------------------------------------------------------------------------------
# GPU faults and the node-local nvidia-smi
# ---------------------------------------------------------------------------------------------

# build(gpu_faults={kind: [GPU index, ...]}): what a sick GPU looks like on this node.
GPU_FAULTS = {
    "x8": "the GPU's link trained at x8 of its x16 capability (Link Status width 8)",
    "row_remap_pending": "nvidia-smi reports a remapped row pending (a GPU reset activates it)",
    "xid79": "the kernel log has Xid 79 (GPU has fallen off the bus) for the GPU",
    "driver_missing": "the GPU is on the PCI bus but nvidia-smi does not list it",
    "dead": "the GPU fell off the bus: its config space reads all 0xff (lspci: rev ff), nvidia-smi does not list it",
}
SMI_STATE = "var/lib/simnode/nvidia-smi.json"
SMI_IDLE_CLOCK = 180  # MHz: the graphics clock of an idle, unlocked GPU in the stand-in

# Stand-in for nvidia-smi on a simulated node (written by tools/simnode.py): the subset the
# collection uses, answered from and written to the node's own table (SMI_STATE), never a GPU.
NVIDIA_SMI_SCRIPT = r'''#!/usr/bin/env python3
import json, os, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE = os.path.join(ROOT, "@STATE@")
DRIVER = json.loads(@DRIVER@)  # {fields, mode, ansi}: the driver this stand-in plays (simnode SMI_DRIVERS)
ALIASES = {"pci.bus_id": "gpu_bus_id", "name": "gpu_name", "index": "gpu_index"}
UNITS = {"power.limit": " W", "power.default_limit": " W", "power.max_limit": " W", "power.min_limit": " W",
         "utilization.gpu": " %"}
UNITS.update({k: " MHz" for k in ("clocks.current.graphics", "clocks.applications.graphics",
                                  "clocks.applications.memory", "clocks.default_applications.graphics",
                                  "clocks.default_applications.memory", "clocks.max.graphics", "clocks.max.memory")})
IDLE_CLOCK = @IDLE_CLOCK@  # MHz of an idle, unlocked GPU (simnode's table starts there)


def fail(msg, rc=2):
    sys.stderr.write(msg + "\n")
    sys.exit(rc)


def save(table):
    with open(STATE + ".tmp", "w") as fh:
        fh.write(json.dumps(table, indent=1) + "\n")  # as simnode wrote it: a rollback is byte-identical
    os.replace(STATE + ".tmp", STATE)


def selected(gpus, ids):
    if ids is None:
        return gpus
    want = ids.split(",")
    chosen = [g for g in gpus if g["index"] in want or g["pci.bus_id"].lower() in [w.lower() for w in want]]
    if len(chosen) != len(want):
        fail("No devices were found matching the ID %s" % ids, 6)
    return chosen


def query(gpus, fields, fmt, known):
    names = fields.split(",")
    for name in names:
        if name not in known:  # as the real one: the message on stdout, stderr empty, exit 2
            print('Field "%s" is not a valid field to query.' % name)
            print("")
            sys.exit(2)
    for g in gpus:
        vals = [g.get(n, "[N/A]") + ("" if "nounits" in fmt else UNITS.get(n, "")) for n in names]
        if DRIVER.get("mode") == "garbled":
            vals = vals[:-1]  # an answer that does not match the query: one column short
        print(", ".join(vals))


def help_query_gpu(known):
    """The field list in nvidia-smi's format: a quoted name (aliases joined by "or"), its description."""
    print('List of valid properties to query for the switch "--query-gpu":')
    print("")
    for name in sorted(known):
        alias = ALIASES.get(name)
        print('"%s"' % name + (' or "%s"' % alias if alias else ""))
        print("The %s of the GPU (simulated)." % name)
        print("")


def acs_redirect(bus_id):
    """Whether a bridge above the GPU has ACS ReqRedir or CmpltRedir set (the simulated P2P verdict)."""
    path = os.path.realpath(os.path.join(ROOT, "sys/bus/pci/devices", bus_id.lower()[-12:]))
    while True:
        path = os.path.dirname(path)
        if len(os.path.basename(path)) != 12 or not os.path.isfile(os.path.join(path, "config")):
            return False  # pci0000:40: the root bus, no bridge above
        with open(os.path.join(path, "config"), "rb") as fh:
            cfg = fh.read()
        pos = 0x100
        for _step in range(64):
            header = int.from_bytes(cfg[pos:pos + 4], "little") if pos + 8 <= len(cfg) else 0
            if header & 0xFFFF == 0x000D and int.from_bytes(cfg[pos + 6:pos + 8], "little") & 0x000C:
                return True
            if header & 0xFFFF in (0, 0x000D) or header >> 20 < 0x100:
                break
            pos = header >> 20


def p2p_cell(gpus, i, j, kind):
    """NVLink: not supported (PCIe GPUs); read/write: CNS where ACS redirect sends peer traffic upstream."""
    if kind == "n":
        return "NS"
    return "CNS" if acs_redirect(gpus[i]["pci.bus_id"]) or acs_redirect(gpus[j]["pci.bus_id"]) else "OK"


def affinity(g):
    """topo -m's CPU Affinity, NUMA Affinity and GPU NUMA ID cells, from the GPU's sysfs as the driver reads it."""
    d = os.path.join(ROOT, "sys/bus/pci/devices", g["pci.bus_id"].lower()[-12:])
    cells = []
    for name in ("local_cpulist", "numa_node"):
        try:
            with open(os.path.join(d, name)) as fh:
                cells.append(fh.read().strip())
        except OSError:
            cells.append("N/A")
    return [cells[0], "N/A" if cells[1].startswith("-") else cells[1], "", "N/A"]


def topo(gpus, args):
    n = len(gpus)
    kind = args[args.index("-p2p") + 1] if "-p2p" in args and args.index("-p2p") + 1 < len(args) else None
    if DRIVER.get("ansi"):
        return topo_ansi(gpus, kind)
    extra = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"] if "-m" in args else []
    print("\t" + "\t".join(["GPU%d" % i for i in range(n)] + extra))
    for i in range(n):
        print("GPU%d\t" % i + "\t".join(["X" if i == j else ("NODE" if "-m" in args else p2p_cell(gpus, i, j, kind))
                                          for j in range(n)] + (affinity(gpus[i]) if "-m" in args else [])))
    legend = "\n  OK   = Status Ok\n  CNS  = Chipset not supported\n  NS   = Not supported" if kind else ""
    print("\nLegend:\n\n  X    = Self" + legend)


def clocks(g, key, value):
    """-lgc min,max: an idle GPU then runs at min (no query shows the lock); -ac mem,gr within the maxima."""
    pair = [int(v) for v in value.split(",") if v.strip().isdigit()]
    if key in ("-lgc", "-ac") and len(pair) != 2:
        fail('Invalid clock pair "%s"' % value)
    top_gr, top_mem = int(g["clocks.max.graphics"]), int(g["clocks.max.memory"])
    if key == "-lgc":
        if not 0 < pair[0] <= pair[1] <= top_gr:
            fail("Invalid clock range %s for GPU %s (max %d MHz)" % (value, g["pci.bus_id"], top_gr))
        g["clocks.current.graphics"] = str(max(IDLE_CLOCK, pair[0]))
        print("GPU clocks set to \"(gpcClkMin %d, gpcClkMax %d)\" for GPU %s" % (pair[0], pair[1], g["pci.bus_id"]))
    elif key == "-rgc":
        g["clocks.current.graphics"] = str(IDLE_CLOCK)
        print("All done.")
    elif key == "-ac":
        if not (0 < pair[0] <= top_mem and 0 < pair[1] <= top_gr):
            fail("Specified clock combination \"(MEM %s, SM %s)\" is not supported for GPU %s"
                 % (pair[0], pair[1], g["pci.bus_id"]))
        g["clocks.applications.memory"], g["clocks.applications.graphics"] = str(pair[0]), str(pair[1])
        print("Applications clocks set to \"(MEM %d, SM %d)\" for GPU %s" % (pair[0], pair[1], g["pci.bus_id"]))
    else:
        g["clocks.applications.memory"] = g["clocks.default_applications.memory"]
        g["clocks.applications.graphics"] = g["clocks.default_applications.graphics"]
        print("All done.")


def topo_ansi(gpus, kind):
    """As drivers 590-610 print it: the header row underlined with ANSI escapes even into a pipe."""
    n = len(gpus)
    if kind is None:
        head = "\t".join("GPU%d" % i for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
        print("\t\x1b[4m" + head + "\x1b[0m")
        for i in range(n):
            print("GPU%d\t" % i + "\t".join(" X " if i == j else "NODE" for j in range(n)) + "\t"
                  + "\t".join(affinity(gpus[i])))
        print("\nLegend:\n\n  X    = Self\n  NODE = Connection traversing PCIe as well as the interconnect "
              "between PCIe Host Bridges within a NUMA node")
        return 0
    print(" \t\x1b[4m" + "\t".join("GPU%d" % i for i in range(n)) + "\t\x1b[0m")
    for i in range(n):
        print(" GPU%d\t" % i + "\t".join("X" if i == j else p2p_cell(gpus, i, j, kind) for j in range(n)) + "\t")
    print("\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n  CNS  = Chipset not supported\n  GNS  = GPU not supported"
          "\n  TNS  = Topology not supported\n  NS   = Not supported\n  DR   = Disabled by regkey\n  U    = Unknown")
    return 0


def misbehave():
    """The driver's failure modes: a wedged GPU (never answers), a driver user space cannot reach (exit 9)."""
    if DRIVER.get("mode") == "hang":
        while True:
            time.sleep(3600)
    if DRIVER.get("mode") == "exit9":
        msg = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.")
        print(msg + "\n")
        sys.stderr.write(msg + "\n")
        sys.exit(9)


def main(argv):
    misbehave()
    with open(STATE) as fh:
        table = json.load(fh)
    gpus = table["gpus"]
    known = set(DRIVER.get("fields") or (gpus[0] if gpus else {}))
    ids = fields = fmt = None
    action = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-i", "--id"):
            i += 1
            ids = argv[i]
        elif a.startswith("--id="):
            ids = a.split("=", 1)[1]
        elif a.startswith("--query-gpu="):
            fields = a.split("=", 1)[1]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a in ("-pm", "-pl", "-lgc", "-ac"):
            i += 1
            action = (a, argv[i] if i < len(argv) else "")
        elif a in ("-rgc", "-rac"):
            action = (a, "")
        elif a == "topo":
            return topo(gpus, argv[i + 1:])
        elif a == "--help-query-gpu":
            return help_query_gpu(known)
        else:
            fail("Invalid combination of input arguments: %s" % a)
        i += 1
    if fields:
        return query(selected(gpus, ids), fields, fmt or "csv", known)
    if action is None:
        fail("this stand-in answers --query-gpu, topo, -pm, -pl, -lgc, -rgc, -ac and -rac only")
    key, value = action
    for g in selected(gpus, ids):
        if key in ("-lgc", "-rgc", "-ac", "-rac"):
            clocks(g, key, value)
        elif key == "-pm":
            if value not in ("0", "1"):
                fail('Invalid value "%s" for persistence mode' % value)
            g["persistence_mode"] = "Enabled" if value == "1" else "Disabled"
            print("%s persistence mode for GPU %s." % (g["persistence_mode"], g["pci.bus_id"]))
        else:
            watts = float(value) if value.replace(".", "", 1).isdigit() else -1
            low, high = float(g["power.min_limit"]), float(g["power.max_limit"])
            if not low <= watts <= high:
                fail("Provided power limit %s W is not a valid power limit which should be between %.2f W and "
                     "%.2f W for GPU %s" % (value, low, high, g["pci.bus_id"]))
            print("Power limit for GPU %s was set to %.2f W from %s W." % (g["pci.bus_id"], watts, g["power.limit"]))
            g["power.limit"] = "%.2f" % watts
    save(table)
    return 0


sys.exit(main(sys.argv[1:]))
'''


def _driver_version(p: Preset) -> str:
    for _level, msg in p.kmsg:
        if msg.startswith("NVRM: loading NVIDIA"):
            return msg.split()[-1]
    return "580.65.06"


def gpu_table_entry(index: int, bdf: str, p: Preset) -> dict:
    """One GPU of the nvidia-smi stand-in's table: a healthy, idle RTX PRO 6000 Blackwell."""
    return {
        "index": str(index), "pci.bus_id": "0000" + bdf.upper(), "name": "NVIDIA RTX PRO 6000 Blackwell",
        "persistence_mode": "Enabled" if p.persistenced else "Disabled",
        "ecc.mode.current": "Enabled", "ecc.mode.pending": "Enabled",
        "ecc.errors.uncorrected.volatile.total": "0", "ecc.errors.uncorrected.aggregate.total": "0",
        "retired_pages.pending": "No", "remapped_rows.pending": "No", "remapped_rows.failure": "No",
        "power.limit": "600.00", "power.default_limit": "600.00", "power.max_limit": "600.00",
        "power.min_limit": "150.00", "clocks_event_reasons.active": "0x0000000000000001",
        "utilization.gpu": "0", "driver_version": _driver_version(p),
        "clocks.current.graphics": str(SMI_IDLE_CLOCK), "clocks.applications.graphics": "2430",
        "clocks.applications.memory": "14001", "clocks.default_applications.graphics": "2430",
        "clocks.default_applications.memory": "14001", "clocks.max.graphics": "3090", "clocks.max.memory": "14001",
    }


def apply_gpu_faults(p: Preset, funcs: list, faults: dict) -> set:
    """Change ``funcs`` and ``p.kmsg`` for ``faults``; return the GPU indices the driver does not list."""
    unknown = sorted(set(faults) - set(GPU_FAULTS))
    if unknown:
        raise ValueError(f"unknown GPU fault(s) {', '.join(unknown)}; available: {', '.join(GPU_FAULTS)}")
    gpus = [f for f in funcs if f.vendor == 0x10DE and (f.class_code >> 8) in (0x0300, 0x0302)]
    by_bdf = {f.bdf: f for f in funcs}
    for kind, indices in faults.items():
        for i in indices:
            if not isinstance(i, int) or not 0 <= i < len(gpus):
                raise ValueError(f"GPU fault {kind}: GPU index {i!r} is not one of 0..{len(gpus) - 1}")
    p.kmsg = list(p.kmsg)  # the preset's list is shared by every build
    for i in faults.get("x8", ()):
        for f in (gpus[i], by_bdf.get(gpus[i].parent)):
            if f is not None:
                f.link_width = 8
    for i in faults.get("dead", ()):
        gpus[i].dead = True
    for i in faults.get("xid79", ()):
        p.kmsg.append((3, f"NVRM: Xid (PCI:{gpus[i].bdf[:-2]}): 79, pid='<unknown>', name=<unknown>, "
                          "GPU has fallen off the bus."))
    return set(faults.get("driver_missing", ())) | set(faults.get("dead", ()))


# The drivers the stand-in can play (build(smi_driver=...)): the field set it knows and its version.
# "r470": an R470-era driver, before the clocks_event_reasons rename (it knows only clocks_throttle_reasons.*)
# and without remapped_rows.*; it refuses an unknown field as the real one does (exit 2, message on stdout).
SMI_DRIVERS = {
    "current": None,
    "r470": {"version": "470.256.02",
             "drop": ("clocks_event_reasons.active", "remapped_rows.pending", "remapped_rows.failure"),
             "add": {"clocks_throttle_reasons.active": "clocks_event_reasons.active"}},
}
# How the stand-in answers (build(smi_mode=...)): "answer" as a healthy driver, "hang" never (a wedged GPU),
# "exit9" exit 9 "couldn't communicate with the NVIDIA driver", "garbled" a query answer one column short.
SMI_MODES = ("answer", "hang", "exit9", "garbled")


def _smi_driver(p: Preset, smi_driver: str, smi_mode: str, smi_ansi: bool) -> dict:
    """What the stand-in plays ({} for a current driver answering in the default format)."""
    if smi_driver not in SMI_DRIVERS:
        raise ValueError(f"smi_driver {smi_driver!r} is not one of {', '.join(SMI_DRIVERS)}")
    if smi_mode not in SMI_MODES:
        raise ValueError(f"smi_mode {smi_mode!r} is not one of {', '.join(SMI_MODES)}")
    out = {}
    if smi_mode != "answer":
        out["mode"] = smi_mode
    if smi_ansi:
        out["ansi"] = True
    return out


def _driver_entry(entry: dict, driver: dict | None) -> dict:
    """A table entry as an older driver reports it: its fields renamed or absent, its version."""
    if not driver:
        return entry
    out = {k: v for k, v in entry.items() if k not in driver["drop"]}
    out.update({new: entry[old] for new, old in driver["add"].items()})
    out["driver_version"] = driver["version"]
    return out


def write_nvidia_smi(t: _Tree, p: Preset, funcs: list, faults: dict, missing: set, smi_driver: str = "current",
                     smi_mode: str = "answer", smi_ansi: bool = False) -> None:
    """The node-local nvidia-smi (<root>/usr/bin) and its table, with the faults' fields set."""
    gpus = [f for f in funcs if f.vendor == 0x10DE and (f.class_code >> 8) in (0x0300, 0x0302)]
    driver = SMI_DRIVERS[smi_driver]
    plays = _smi_driver(p, smi_driver, smi_mode, smi_ansi)
    table = []
    # nvidia-smi numbers GPUs in PCI bus order; fault indices follow build()'s gpu_bdfs.
    for i, f in sorted(enumerate(gpus), key=lambda item: item[1].bdf):
        if i in missing:
            continue
        entry = gpu_table_entry(len(table), f.bdf, p)
        if i in faults.get("row_remap_pending", ()):
            entry["remapped_rows.pending"] = "Yes"
        table.append(_driver_entry(entry, driver))
    t.write(SMI_STATE, json.dumps({"gpus": table}, indent=1))
    if "nvidia" in p.modules:  # the loaded kernel module's version, which nvidia-smi's must match
        t.write("sys/module/nvidia/version", driver["version"] if driver else _driver_version(p))
    script = NVIDIA_SMI_SCRIPT.replace("@STATE@", SMI_STATE).replace("@IDLE_CLOCK@", str(SMI_IDLE_CLOCK))
    script = script.replace("@DRIVER@", repr(json.dumps(plays, sort_keys=True)))
    t.write("usr/bin/nvidia-smi", script.encode(), mode=0o755)


# ---------------------------------------------------------------------------------------------
# The node-local amd-smi (AMD Instinct presets)
# ---------------------------------------------------------------------------------------------

# GPU faults of an AMD node (build(amd_faults={kind: [GPU index, ...]}), --amd-fault KIND=I[,J]).
AMD_FAULTS = {
    "ecc_uncorrectable": "amd-smi metric counts 2 uncorrectable ECC errors, in the UMC block",
    "bad_pages": "amd-smi bad-pages lists as many retired pages as the RAS threshold amd-smi static gives",
    "x8": "the GPU's link trained at x8 of x16 (amd-smi metric and config space)",
    "xgmi_down": "the GPU's XGMI link to the next GPU is down (xgmi -l: D on both ends; topology: DISABLED)",
    "gpu_reset": "the kernel log shows a GPU reset and VRAM lost, at info level as the driver logs them",
    "missing": "the GPU is on the PCI bus but amd-smi does not list it",
}
# How the stand-in answers: "answer"; "hang" never; "error" exit 1 with the library's init error on stderr;
# "invalid_json" its JSON cut short (as amdsmi issues #168/#184 show); "rocm_dir" answers, installed in
# opt/rocm/bin instead of usr/bin (not on PATH); "absent" no amd-smi at all; "set_refused" answers, but
# refuses every ``set`` (exit 1, AMDSMI_STATUS_NO_PERM, as without root). ``set`` changes the answers kept in
# AMD_SMI_STATE (static limit.socket_power, metric perf_level), so a read-back sees it.
# "refuse_link_status" and "refuse_bad_pages" answer that call with amd-smi's own error document on stdout and exit 0,
# as amd-smi up to ROCm 7.1 refuses an option or a command it lacks (amdsmi_cli_exceptions.py: -2 an invalid
# parameter, -7 a command not supported on the system; tests/data/real/amd-smi-error-*).
AMD_SMI_REFUSALS = {
    "refuse_link_status": ("xgmi_link_status", 0, "stdout",
                           '{"error": "Parameter \'-l\' is invalid. Run \'--help\' for more info.", "code": -2}'),
    "refuse_bad_pages": ("bad_pages", 0, "stdout", '{"error": "Command \'bad-pages\' is not supported on the system. '
                                                   'Run \'--help\' for more info.", "code": -7}'),
}
AMD_SMI_MODES = ("answer", "hang", "error", "invalid_json", "rocm_dir", "absent", "set_refused") + \
    tuple(AMD_SMI_REFUSALS)
AMD_SMI_STATE = "var/lib/simnode/amd-smi.json"
# ROCm 6.4.1's amd-smi, as tests/data/real/amd-smi-version-rocm6.4.1-mi300a-legacy-rocm-build-4759.txt prints it.
AMD_SMI_VERSION = ("AMDSMI Tool: 25.4.2+aca1101 | AMDSMI Library version: 25.4.0 | ROCm version: 6.4.1 | "
                   "amdgpu version: 6.10.5 | amd_hsmp version: N/A")
# The RAS bad-page threshold of tests/data/real/amd-smi-static-json-gpu-data-mi210-device-metrics-exporter.txt.
AMD_BAD_PAGE_THRESHOLD = 655
AMD_ECC_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL")

# Stand-in for amd-smi on a simulated node (written by tools/simnode.py): prints the answer simnode rendered
# for each subcommand (the shapes of ROCm 6.4's amd-smi: {"gpu_data": [...]}, topology a list, xgmi -l its table).
AMD_SMI_SCRIPT = r'''#!/usr/bin/env python3
import json, os, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) == "rocm":
    ROOT = os.path.dirname(ROOT)  # <root>/opt/rocm/bin/amd-smi
with open(os.path.join(ROOT, "@STATE@")) as f:
    RAW = f.read()
STATE = json.loads(RAW)
args = [a for a in sys.argv[1:] if a != "--json"]
if not args:
    sys.exit("usage: amd-smi [-h] {version,list,static,firmware,bad-pages,metric,process,topology,xgmi,set,reset} ...")
key = {"bad-pages": "bad_pages"}.get(args[0], args[0])
if key == "xgmi" and ("-l" in args or "--link-status" in args):
    key = "xgmi_link_status"
if key not in STATE["answers"]:
    sys.stderr.write("amd-smi: error: argument command: invalid choice: %r\n" % args[0])
    sys.exit(2)
mode = STATE.get("mode", "answer")
refusal = STATE.get("refuse", {}).get(key)
if refusal:  # [rc, stream, text]: amd-smi's own error document for a call it lacks
    (sys.stdout if refusal[1] == "stdout" else sys.stderr).write(refusal[2] + "\n")
    sys.exit(refusal[0])
if mode == "hang" and key != "version":
    time.sleep(3600)
if mode == "error" and key != "version":
    sys.stderr.write("ERROR:root:Unable to initialize amdsmi: AMDSMI_STATUS_DRIVER_NOT_LOADED\n")
    sys.exit(1)
if key == "set":  # amd-smi set -g I [J ...] --power-cap W | --perf-level LEVEL | --perf-determinism MHZ
    if mode == "set_refused":
        sys.stderr.write("AMDSMI_STATUS_NO_PERM - Command not permitted\n")
        sys.exit(1)
    opts = {"-o": "--power-cap", "-l": "--perf-level", "-d": "--perf-determinism"}
    ids, what, i = [], {}, 1
    while i < len(args):
        a = opts.get(args[i], args[i])
        if a == "-g":
            i += 1
            while i < len(args) and args[i].isdigit():
                ids.append(int(args[i]))
                i += 1
            continue
        if a in ("--power-cap", "--perf-level", "--perf-determinism") and i + 1 < len(args):
            what[a] = args[i + 1]
            i += 2
            continue
        sys.stderr.write("amd-smi set: error: unrecognized arguments: %s\n" % args[i])
        sys.exit(2)
    static, metric = json.loads(STATE["answers"]["static"]), json.loads(STATE["answers"]["metric"])
    for n in ids:
        if n >= len(static["gpu_data"]):
            sys.stderr.write("amd-smi set: error: GPU %d does not exist\n" % n)
            sys.exit(2)
    for n in ids:
        if "--power-cap" in what:
            watts = int(what["--power-cap"])
            lim = static["gpu_data"][n]["limit"]
            if not lim["min_power"]["value"] <= watts <= lim["max_power"]["value"]:
                sys.stderr.write("AMDSMI_STATUS_INVAL - Power cap %d W is out of range\n" % watts)
                sys.exit(1)
            lim["socket_power"]["value"] = watts
        level = "DETERMINISM" if "--perf-determinism" in what else what.get("--perf-level")
        if level:
            metric["gpu_data"][n]["perf_level"] = "AMDSMI_DEV_PERF_LEVEL_" + level.upper()
    STATE["answers"]["static"] = json.dumps(static, indent=4)
    STATE["answers"]["metric"] = json.dumps(metric, indent=4)
    with open(os.path.join(ROOT, "@STATE@"), "w") as f:
        f.write(json.dumps(STATE) + RAW[len(RAW.rstrip("\n")):])  # as simnode wrote it, to the byte
    sys.exit(0)
text = STATE["answers"][key]
if mode == "invalid_json" and key == "metric":
    text = text[: len(text) // 2]
sys.stdout.write(text + "\n")
'''


def _vt(value, unit: str) -> dict:
    return {"value": value, "unit": unit}


def _amd_uuid(index: int, bdf: str) -> str:
    """A UUID of the shape AMD's MI300X example shows (``afff74a1-0000-1000-80..-...``)."""
    return "%02xff74a1-0000-1000-80%02x-%012x" % ((index * 37 + 0xAF) % 256, int(bdf[5:7], 16), 0xE92B0A5D57C8 + index)


def amd_static_entry(index: int, f: PciFunction, p: Preset) -> dict:
    """``amd-smi static``'s record of one MI300X: the MI210 capture's fields, with an MI300X's values."""
    return {
        "gpu": index,
        "asic": {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002",
                 "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]", "subvendor_id": "0x1002",
                 "device_id": "0x%04x" % p.gpu_device, "rev_id": "0x00", "num_compute_units": 304,
                 "target_graphics_version": "gfx942"},
        "bus": {"bdf": f.bdf, "max_pcie_width": 16, "max_pcie_speed": _vt(32, "GT/s"),
                "pcie_interface_version": "Gen 5", "slot_type": "OAM"},
        "limit": {"max_power": _vt(750, "W"), "min_power": _vt(0, "W"), "socket_power": _vt(750, "W")},
        "driver": {"name": "amdgpu", "version": "6.10.5"},
        "ras": {"eeprom_version": "0x30000", "bad_page_threshold": AMD_BAD_PAGE_THRESHOLD,
                "parity_schema": "DISABLED", "single_bit_schema": "DISABLED", "double_bit_schema": "DISABLED",
                "poison_schema": "ENABLED", "ecc_block_state": {b: "ENABLED" for b in AMD_ECC_BLOCKS}},
        "partition": {"compute_partition": "SPX", "memory_partition": "NPS1"},
        "numa": {"node": max(f.numa_node, 0), "affinity": max(f.numa_node, 0)},
        "vram": {"type": "HBM", "vendor": "HYNIX", "size": _vt(196592, "MB"), "bit_width": 8192},
    }


def amd_metric_entry(index: int, f: PciFunction, faults: dict, i: int) -> dict:
    """``amd-smi metric``'s record of one idle MI300X: the RX 6600 capture's fields (6.1 names)."""
    unc = 2 if i in faults.get("ecc_uncorrectable", ()) else 0
    blocks = {b: {"correctable_count": 0, "uncorrectable_count": unc if b == "UMC" else 0, "deferred_count": 0}
              for b in AMD_ECC_BLOCKS}
    return {
        "gpu": index,
        "usage": {"gfx_activity": _vt(0, "%"), "umc_activity": _vt(0, "%"), "mm_activity": "N/A"},
        "power": {"socket_power": _vt(141, "W"), "gfx_voltage": _vt("N/A", "mV"), "power_management": "ENABLED",
                  "throttle_status": "UNTHROTTLED"},
        "pcie": {"width": f.link_width, "speed": _vt(32, "GT/s"), "bandwidth": "N/A", "replay_count": 0,
                 "l0_to_recovery_count": 0, "replay_roll_over_count": 0, "nak_sent_count": 0,
                 "nak_received_count": 0},
        "ecc": {"total_correctable_count": 0, "total_uncorrectable_count": unc, "total_deferred_count": 0,
                "cache_correctable_count": 0, "cache_uncorrectable_count": 0},
        "ecc_blocks": blocks,
        "perf_level": "AMDSMI_DEV_PERF_LEVEL_AUTO",
        "xgmi_err": "NONE",
    }


def _xgmi_up(i: int, j: int, faults: dict) -> bool:
    down = set(faults.get("xgmi_down", ()))
    return not ((i in down and j == (i + 1) % 8) or (j in down and i == (j + 1) % 8))


def amd_smi_answers(p: Preset, gpus: list, faults: dict) -> dict:
    """The stand-in's answer per subcommand: ``gpus`` the listed ``(fault index, PciFunction)`` in bus order."""
    listed = [(n, i, f) for n, (i, f) in enumerate(gpus)]

    def wrap(records):
        return json.dumps({"gpu_data": records}, indent=4)
    pages = []
    for n, i, _f in listed:
        retired = [{"page_address": "0x%x" % (0x1F0000 + k), "page_size": "4.00 KB", "status": "RESERVED"}
                   for k in range(AMD_BAD_PAGE_THRESHOLD)] if i in faults.get("bad_pages", ()) else \
            "No bad pages found."
        pages.append({"gpu": n, "retired": retired, "pending": "No bad pages found.", "un_res": "No bad pages found."})
    topology = [{"gpu": n, "bdf": f.bdf, "links": [
        {"gpu": m, "bdf": g.bdf, "weight": 0 if m == n else 15,
         "link_status": "ENABLED" if m == n or _xgmi_up(i, j, faults) else "DISABLED",
         "link_type": "SELF" if m == n else "XGMI", "num_hops": 0 if m == n else 1}
        for m, j, g in listed]} for n, i, f in listed]
    rows = ["XGMI LINK STATUS:", "    bdf           link_status"]
    for n, i, f in listed:
        cells = ["U" if _xgmi_up(i, j, faults) else "D" for m, j, _g in listed if m != n]
        rows.append("GPU%d   %s  %s" % (n, f.bdf, "  ".join(cells + ["X"])))
    rows += ["", "* U:Up D:Down X:Disabled"]
    return {
        "version": AMD_SMI_VERSION,
        "list": wrap([{"gpu": n, "bdf": f.bdf, "uuid": _amd_uuid(n, f.bdf), "kfd_id": 1000 + n, "node_id": 2 + n,
                       "partition_id": 0} for n, i, f in listed]),
        "static": wrap([amd_static_entry(n, f, p) for n, i, f in listed]),
        "metric": wrap([amd_metric_entry(n, f, faults, i) for n, i, f in listed]),
        "bad_pages": wrap(pages),
        "topology": json.dumps(topology, indent=4),
        "xgmi": wrap([]),
        "xgmi_link_status": "\n".join(rows),
        "set": "",
    }


def apply_amd_faults(p: Preset, funcs: list, faults: dict) -> None:
    """Check ``faults`` (AMD_FAULTS, GPU indices in bus order) and change ``funcs`` and ``p.kmsg`` for them."""
    unknown = sorted(set(faults) - set(AMD_FAULTS))
    if unknown:
        raise ValueError(f"unknown AMD GPU fault(s) {', '.join(unknown)}; available: {', '.join(AMD_FAULTS)}")
    gpus = sorted((f for f in funcs if is_gpu(f) and f.vendor == 0x1002), key=lambda f: f.bdf)
    for kind, indices in faults.items():
        for i in indices:
            if not isinstance(i, int) or not 0 <= i < len(gpus):
                raise ValueError(f"AMD GPU fault {kind}: GPU index {i!r} is not one of 0..{len(gpus) - 1}")
    by_bdf = {f.bdf: f for f in funcs}
    p.kmsg = list(p.kmsg)
    for i in faults.get("x8", ()):
        for f in (gpus[i], by_bdf.get(gpus[i].parent)):
            if f is not None:
                f.link_width = 8
    for i in faults.get("gpu_reset", ()):
        p.kmsg += [(6, f"amdgpu {gpus[i].bdf}: amdgpu: GPU reset begin!"),
                   (6, f"amdgpu {gpus[i].bdf}: amdgpu: VRAM is lost due to GPU reset!"),
                   (6, f"amdgpu {gpus[i].bdf}: amdgpu: GPU reset(2) succeeded!")]


def write_amd_smi(t: _Tree, p: Preset, funcs: list, faults: dict, mode: str = "answer") -> None:
    """The node-local amd-smi (<root>/usr/bin, or opt/rocm/bin) and its answers, with the faults' fields set."""
    if mode == "absent":
        return
    gpus = sorted((f for f in funcs if is_gpu(f) and f.vendor == 0x1002), key=lambda f: f.bdf)
    shown = [(i, f) for i, f in enumerate(gpus) if i not in faults.get("missing", ())]
    state = {"mode": mode, "answers": amd_smi_answers(p, shown, faults)}
    if mode in AMD_SMI_REFUSALS:
        key, rc, stream, text = AMD_SMI_REFUSALS[mode]
        state["refuse"] = {key: [rc, stream, text]}
    t.write(AMD_SMI_STATE, json.dumps(state))
    where = "opt/rocm/bin/amd-smi" if mode == "rocm_dir" else "usr/bin/amd-smi"
    t.write(where, AMD_SMI_SCRIPT.replace("@STATE@", AMD_SMI_STATE).encode(), mode=0o755)


BENCHMARK_KINDS = ("normal", "inverse", "hang")
BENCHMARK_BIN = "usr/bin/gpunode-sim-bench"

# Stand-in for a node benchmark (the rollout's measure gate, gpunode_tuning_rollout_benchmark_command):
# one number, higher is better, computed from the node's simulated state, never a GPU. Per GPU:
# its MRRS / 512, plus 1 when no bridge above it redirects peer traffic (ACS ReqRedir/CmpltRedir
# off). The inverse kind prints 100 / that score, so tuning makes it WORSE. The node root is
# GPUNODE_ROOT, else the directory two levels above this file's usr/bin.
BENCH_SCRIPT = r"""#!/usr/bin/env python3
import glob, os, sys, time
ROOT = os.environ.get("GPUNODE_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KIND = "@KIND@"


def config(path):
    with open(os.path.join(path, "config"), "rb") as fh:
        return fh.read()


def word(cfg, pos, size=2):
    return int.from_bytes(cfg[pos:pos + size], "little")


def mrrs(cfg):
    pos = cfg[0x34]
    for _step in range(48):  # the standard capability list, to the PCI Express capability
        if pos < 0x40 or pos + 10 > len(cfg):
            return 128
        if cfg[pos] == 0x10:
            return 128 << ((word(cfg, pos + 8) >> 12) & 7)
        pos = cfg[pos + 1]
    return 128


def redirected(cfg):
    pos = 0x100
    for _step in range(64):  # the extended capability list, to ACS (ID 0x000D)
        header = word(cfg, pos, 4) if pos + 8 <= len(cfg) else 0
        if header & 0xFFFF == 0x000D:
            return bool(word(cfg, pos + 6) & 0x000C)
        if header == 0 or header >> 20 < 0x100:
            return False
        pos = header >> 20
    return False


def score(gpu):
    cfg = config(gpu)
    value = mrrs(cfg) / 512.0
    path = os.path.dirname(os.path.realpath(gpu))
    while len(os.path.basename(path)) == 12 and os.path.isfile(os.path.join(path, "config")):
        if redirected(config(path)):
            return value
        path = os.path.dirname(path)
    return value + 1.0


if KIND == "hang":  # a benchmark that never finishes (a wedged GPU under load)
    while True:
        time.sleep(3600)
total = 0.0
for dev in sorted(glob.glob(os.path.join(ROOT, "sys/bus/pci/devices/*"))):
    cfg = config(dev)
    if word(cfg, 0) == 0x10DE and cfg[0x0B] == 0x03:
        total += score(dev)
if total <= 0:
    sys.exit("gpunode-sim-bench: no GPU under %s" % ROOT)
print("%.4f" % (100.0 / total if KIND == "inverse" else total))
"""


def write_benchmark(root: str, kind: str = "normal") -> str:
    """Write the benchmark stand-in (<root>/usr/bin/gpunode-sim-bench) of ``kind``; return its path."""
    if kind not in BENCHMARK_KINDS:
        raise ValueError(f"benchmark {kind!r} is not one of {', '.join(BENCHMARK_KINDS)}")
    t = _Tree(root)
    t.write(BENCHMARK_BIN, BENCH_SCRIPT.replace("@KIND@", kind).encode(), mode=0o755)
    return t.path(BENCHMARK_BIN)


# ---------------------------------------------------------------------------------------------
# The node's own boot configuration: a sysctl file of its image, the state of a systemd unit
# ---------------------------------------------------------------------------------------------

# What a cloud image ships (NVIDIA/aicr#239: Ubuntu 24.04.4 AMIs have /etc/sysctl.d/cloud-optimization.conf
# with vm.swappiness=60). Its name sorts after 90-gpunode-tuning.conf, so it wins at boot.
CLOUD_SYSCTL_FILE = "/etc/sysctl.d/cloud-optimization.conf"
CLOUD_SYSCTL = {"vm.swappiness": "60"}
UNIT_STATE = "var/lib/simnode/units.json"

# Stand-in for systemctl on a simulated node (written by tools/simnode.py): only `show
# --property=...` of the units in the node's own table (UNIT_STATE); anything else fails.
SYSTEMCTL_SCRIPT = r'''#!/usr/bin/env python3
import json, os, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
args = [a for a in sys.argv[1:] if a != "--"]
if not args or args[0] != "show":
    sys.stderr.write("systemctl (simulated node): only 'show' is simulated\n")
    sys.exit(1)
props = [p for a in args if a.startswith("--property=") for p in a.split("=", 1)[1].split(",")]
units = [a for a in args[1:] if not a.startswith("-")]
with open(os.path.join(ROOT, "@STATE@")) as fh:
    table = json.load(fh)
for unit in units:
    state = table.get(unit, {"ActiveState": "inactive", "SubState": "dead", "Result": "success",
                             "ExecMainStatus": "0"})
    for p in props or sorted(state):
        print("%s=%s" % (p, state.get(p, "")))
'''


def write_sysctl_file(root: str, path: str = CLOUD_SYSCTL_FILE, settings: dict | None = None) -> str:
    """A sysctl file of the node's own (``KEY = VALUE`` lines) at ``path``; the cloud image's by default."""
    t = _Tree(root)
    lines = ["# written by tools/simnode.py: a file of the node's image, not of gpunode.tuning"]
    lines += ["%s = %s" % (k, v) for k, v in (CLOUD_SYSCTL if settings is None else settings).items()]
    t.write(path, "\n".join(lines))
    return t.path(path)


def write_unit_state(root: str, unit: str, active_state: str = "failed", result: str = "exit-code",
                     exec_main_status: int = 1) -> None:
    """Record a systemd unit's state in the node's table and ship the systemctl stand-in (``usr/bin``)."""
    t = _Tree(root)
    table = {}
    if os.path.exists(t.path(UNIT_STATE)):
        with open(t.path(UNIT_STATE), encoding="utf-8") as fh:
            table = json.load(fh)
    table[unit] = {"ActiveState": active_state, "SubState": "failed" if active_state == "failed" else "exited",
                   "Result": result, "ExecMainStatus": str(exec_main_status)}
    t.write(UNIT_STATE, json.dumps(table, indent=1, sort_keys=True))
    t.write("usr/bin/systemctl", SYSTEMCTL_SCRIPT.replace("@STATE@", UNIT_STATE).encode(), mode=0o755)


NODE_EXPORTER_TEXTFILE_DIR = "var/lib/prometheus/node-exporter"


def write_node_exporter_dir(root: str) -> str:
    """The textfile collector directory Debian's prometheus-node-exporter package creates (empty)."""
    t = _Tree(root)
    t.mkdir(NODE_EXPORTER_TEXTFILE_DIR)
    return t.path(NODE_EXPORTER_TEXTFILE_DIR)


def _parse_sysctl_file(spec: str) -> tuple:
    """``PATH:KEY=VALUE[,KEY=VALUE]`` -> ``(path, {key: value})``; ValueError names the form."""
    path, sep, pairs = spec.partition(":")
    settings = dict(p.split("=", 1) for p in pairs.split(",") if "=" in p) if sep else {}
    if not path.startswith("/") or not settings:
        raise ValueError(f"--sysctl-file {spec!r}: expected /ABSOLUTE/PATH.conf:KEY=VALUE[,KEY=VALUE...]")
    return path, settings


def _parse_faults(specs: list) -> dict:
    """``["x8=3", "xid79=3,5"]`` -> ``{"x8": [3], "xid79": [3, 5]}``; ValueError names the form."""
    faults: dict = {}
    for spec in specs:
        kind, sep, indices = spec.partition("=")
        try:
            faults.setdefault(kind, []).extend(int(i) for i in indices.split(","))
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--gpu-fault {spec!r}: expected KIND=INDEX[,INDEX...] (kinds: {', '.join(GPU_FAULTS)})")
    return faults


# ---------------------------------------------------------------------------------------------
# IOMMU groups and vfio-pci (the P2P path: ACS isolates what vfio-pci passes through)
# ---------------------------------------------------------------------------------------------

IOMMU_TYPES = ("identity", "DMA", "DMA-FQ")


def check_iommu_vfio(funcs: list, iommu: str | None, vfio: list | None) -> None:
    """ValueError, before anything is written, for an unknown group type or a BDF the node lacks."""
    if iommu is not None and iommu not in IOMMU_TYPES:
        raise ValueError(f"iommu {iommu!r} is not one of {', '.join(IOMMU_TYPES)}")
    unknown = sorted(set(vfio or ()) - {f.bdf for f in funcs})
    if unknown:
        raise ValueError(f"vfio: no function {', '.join(unknown)} on this node")


def write_iommu_vfio(t: _Tree, p: Preset, funcs: list, iommu: str | None, vfio: list | None) -> None:
    """IOMMU units and groups (one per slot: a GPU and its audio function share one), vfio-pci links."""
    def device(bdf: str) -> str:
        return os.path.realpath(t.path(f"sys/bus/pci/devices/{bdf}"))

    for bdf in vfio or ():
        t.mkdir("sys/bus/pci/drivers/vfio-pci")
        os.symlink(os.path.relpath(t.path("sys/bus/pci/drivers/vfio-pci"), device(bdf)),
                   os.path.join(device(bdf), "driver"))
    if iommu is None:
        return
    unit = {"AuthenticAMD": "ivhd0", "GenuineIntel": "dmar0"}.get(p.cpu_vendor or "", "smmu3.0x0000000010000000")
    t.mkdir(f"sys/class/iommu/{unit}")
    groups = {}
    for f in funcs:
        n = groups.setdefault(f.bdf[:-2], len(groups))
        t.write(f"sys/kernel/iommu_groups/{n}/type", iommu)
        group = t.path(f"sys/kernel/iommu_groups/{n}")
        t.symlink(os.path.relpath(device(f.bdf), os.path.join(group, "devices")),
                  f"sys/kernel/iommu_groups/{n}/devices/{f.bdf}")
        os.symlink(os.path.relpath(group, device(f.bdf)), os.path.join(device(f.bdf), "iommu_group"))


# ---------------------------------------------------------------------------------------------
# GPU locality: local CPUs, device names, MSI/MSI-X IRQs and their affinities, irqbalance
# ---------------------------------------------------------------------------------------------

MSI_IRQ_BASE = 200  # the first MSI/MSI-X IRQ number (legacy INTx numbers are below, see _write_pci)
IRQBALANCE_PID = 3104


def _node_cpus(p: Preset, node: int) -> list:
    """The CPUs of a NUMA node; every CPU for -1 (what the kernel gives a device without a node)."""
    return [c for c in range(p.cpus) if node < 0 or _cpu_node(p, c) == node]


def _device_names(f: PciFunction, index: dict) -> dict:
    """Class directories below a function, as the drivers create them: net/IF, infiniband/mlx5_N, nvme/nvmeN."""
    cls = f.class_code >> 8
    if cls in (0x0200, 0x0207) and f.vendor == 0x15B3:
        n = index.setdefault("mlx5", 0)
        index["mlx5"] = n + 1
        bus = int(f.bdf[5:7], 16)
        netdev = f"ibp{bus}s0" if cls == 0x0207 else f"enp{bus}s0np0"
        return {"infiniband": f"mlx5_{n}", "net": netdev}
    if cls == 0x0108 and f.class_code & 0xFF == 0x02:
        n = index.setdefault("nvme", 0)
        index["nvme"] = n + 1
        return {"nvme": f"nvme{n}"}
    return {}


def _irq_cpus(p: Preset, f: PciFunction, vector: int, remote: bool) -> list:
    """The CPU one vector is served on: its node's CPUs in turn, or the other socket's when ``remote``."""
    cpus = _node_cpus(p, f.numa_node)
    if remote:
        other = (f.numa_node + 1) % max(p.sockets, 1)
        cpus = _node_cpus(p, other) or cpus
    return [cpus[vector % len(cpus)]]


def _write_irqs(t: _Tree, p: Preset, funcs: list) -> None:
    """MSI-X vectors of GPUs (1 each) and NICs (``nic_queues``) with their affinities in /proc/irq.

    Served on the other socket: GPU 5's vector and the last 4 vectors of the first NIC (a fresh node
    where irqbalance spread them), so each device has a known count of remote IRQs.
    """
    irq = MSI_IRQ_BASE
    gpus = nics = 0
    for f in funcs:
        cls = f.class_code >> 8
        if f.kind != "endpoint" or not (is_gpu(f) or cls in (0x0200, 0x0207)):
            continue
        gpu = is_gpu(f)
        vectors = 1 if gpu else max(p.nic_queues, 1)
        d = os.path.realpath(t.path(f"sys/bus/pci/devices/{f.bdf}"))
        for v in range(vectors):
            remote = p.sockets > 1 and f.numa_node >= 0 and (
                (gpu and gpus == 5) or (not gpu and nics == 0 and v >= vectors - 4))
            cpus = _cpulist(_irq_cpus(p, f, v, remote))
            t.write(os.path.relpath(os.path.join(d, "msi_irqs", str(irq)), t.root), "msix")
            t.write(f"proc/irq/{irq}/smp_affinity_list", cpus)
            t.write(f"proc/irq/{irq}/effective_affinity_list", cpus)
            irq += 1
        gpus, nics = gpus + gpu, nics + (not gpu)


def write_locality(t: _Tree, p: Preset, funcs: list) -> None:
    """What gpu_locality reads besides numa_node: each function's local_cpulist, the class directories
    naming its netdev, RDMA or NVMe device, and (``msi`` presets) IRQs and an irqbalance process."""
    index: dict = {}
    for f in funcs:
        d = os.path.realpath(t.path(f"sys/bus/pci/devices/{f.bdf}"))
        t.write(os.path.relpath(os.path.join(d, "local_cpulist"), t.root), _cpulist(_node_cpus(p, f.numa_node)))
        for cls_dir, name in _device_names(f, index).items():
            t.mkdir(os.path.relpath(os.path.join(d, cls_dir, name), t.root))
    if p.msi:
        _write_irqs(t, p, funcs)
    if p.irqbalance:
        t.write(f"proc/{IRQBALANCE_PID}/comm", "irqbalance")
        t.write(f"proc/{IRQBALANCE_PID}/cmdline", b"/usr/sbin/irqbalance\0--foreground\0")


# ---------------------------------------------------------------------------------------------
# Simulated reboot (issue 30): what a boot of the node would bring, from the files the tuning left
# ---------------------------------------------------------------------------------------------

REBOOT_NEVER_RETURNS = "var/lib/simnode/reboot-never-returns"
# GPU faults the next simulated boot brings (the post-reboot gate's tests): {kind: [GPU index, ...]}, the index in
# bus order among the GPUs amd-smi lists at that boot. Consumed by the boot (the faults stay, the file goes).
BOOT_FAULTS = "var/lib/simnode/boot-faults.json"
BOOT_FAULT_KINDS = {
    "ecc_uncorrectable": AMD_FAULTS["ecc_uncorrectable"],
    "missing": "the GPU stays on the PCI bus but amd-smi no longer lists it (list, static, metric, bad-pages, "
               "topology, xgmi -l)",
}
# The first simulated boot records the command line without our drop-in and the node's own drivers,
# so that a later boot without the drop-in (after a rollback) goes back to them.
BOOT_RECORD = "var/lib/simnode/boot.json"
GRUB_DROPIN = "/etc/default/grub.d/60-gpunode-tuning.cfg"
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
BOOT_UNIT = "etc/systemd/system/gpunode-tuning-boot.service"
BOOT_UNIT_WANTS = "etc/systemd/system/multi-user.target.wants/gpunode-tuning-boot.service"
SYSCTL_DIRS = ("etc/sysctl.d", "run/sysctl.d", "usr/local/lib/sysctl.d", "usr/lib/sysctl.d", "lib/sysctl.d")
MODULES_LOAD_DIRS = ("etc/modules-load.d", "run/modules-load.d", "usr/local/lib/modules-load.d",
                     "usr/lib/modules-load.d", "lib/modules-load.d")
# The tuning_apply module options that put each journaled family back (the rollback's own).
RESTORE_OPTIONS = {"pcie_mrrs": {"restore": True, "allow_empty": True}}
ACS_CAP_ID, ACS_REDIRECT = 0x000D, 0x002C  # ReqRedir, CmpltRedir, EgressCtrl: what disable_acs_redir= clears
REBOOT_COMMAND_TIMEOUT = 120
COLLECTIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".collections")


# The node's own reboot, as the collection's reboot sequence runs it on a simulated root (its path is the
# simulator's, never a real system's: a root that is a real system's copy has no such file to run).
REBOOT_COMMAND = "var/lib/simnode/reboot"
REBOOT_SCRIPT = """#!/bin/sh
# The simulated node's reboot: tools/simnode.py reboot on the root this file lives in (3 levels up).
root=$(cd "$(dirname "$0")/../../.." && pwd) || exit 2
exec "@PYTHON@" "@SIMNODE@" reboot "$root"
"""


def write_reboot_command(t: _Tree) -> None:
    """Ship REBOOT_COMMAND: this Python running this file's ``reboot`` on the root."""
    script = REBOOT_SCRIPT.replace("@PYTHON@", sys.executable).replace("@SIMNODE@", os.path.abspath(__file__))
    t.write(REBOOT_COMMAND, script.encode(), mode=0o755)


def _read(t: _Tree, rel: str, default: str | None = None) -> str | None:
    try:
        with open(t.path(rel), encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return default


def grub_dropin_args(text: str | None) -> list:
    """The kernel arguments a GRUB drop-in adds (``GRUB_CMDLINE_LINUX_DEFAULT="$... ARGS"``), unquoted as GRUB does."""
    args = []
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key not in ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT"):
            continue
        value = value.strip().strip('"')
        for var in ("$GRUB_CMDLINE_LINUX_DEFAULT", "${GRUB_CMDLINE_LINUX_DEFAULT}", "$GRUB_CMDLINE_LINUX",
                    "${GRUB_CMDLINE_LINUX}"):
            value = value.replace(var, " ")
        args += [word.replace("'", "") for word in value.split()]
    return args


def add_kernel_args(current: list, wanted: list) -> list:
    """``current`` with each of ``wanted``: a key already there takes the new value in place, others append."""
    out = list(current)
    for arg in wanted:
        key = arg.split("=", 1)[0]
        at = [i for i, a in enumerate(out) if a.split("=", 1)[0] == key]
        if at:
            out = [a for i, a in enumerate(out) if i not in at[1:]]
            out[at[0]] = arg
        else:
            out.append(arg)
    return out


def _last_value(args: list, key: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if "=" in a and a.split("=", 1)[0] == key]
    return values[-1] if values else None


def cpufreq_after_boot(args: list, cpu_vendor: str | None, default: tuple, release: str = "6.8",
                       cppc: bool = True) -> tuple:
    """``(scaling driver, pstate mode)`` a kernel ``release`` with ``args`` loads on this CPU (``cppc``: the
    firmware's ACPI CPPC is on); ``default`` without a choice, or with one the kernel cannot honour."""
    amd, intel = _last_value(args, "amd_pstate"), _last_value(args, "intel_pstate")
    if amd in ("active", "passive", "guided") and not kernel_runs_amd_pstate(release, cppc, amd):
        return default  # an argument this kernel or firmware cannot honour stays without effect
    if cpu_vendor == "AuthenticAMD" and amd in ("disable", "active", "passive", "guided"):
        return {"disable": ("acpi-cpufreq", None), "active": ("amd-pstate-epp", "active")}.get(amd, ("amd-pstate", amd))
    if cpu_vendor == "GenuineIntel" and intel in ("disable", "active", "passive"):
        return {"disable": ("acpi-cpufreq", None), "active": ("intel_pstate", "active"),
                "passive": ("intel_cpufreq", "passive")}[intel]
    return default


def iommu_after_boot(args: list, default: str | None) -> str | None:
    """The IOMMU groups' default domain type a kernel with ``args`` gives (passthrough: identity)."""
    if _last_value(args, "iommu") == "pt" or _last_value(args, "iommu.passthrough") in ("1", "on", "y"):
        return "identity"
    if _last_value(args, "iommu") == "nopt" or _last_value(args, "iommu.passthrough") in ("0", "off", "n"):
        return "DMA-FQ"
    return default


def acs_redirect_bdfs(args: list) -> list:
    """The functions ``pci=disable_acs_redir=BDF;BDF`` names (the kernel's domain-less form gets domain 0000)."""
    out = []
    for arg in args:
        if arg.startswith("pci="):
            for option in arg[len("pci="):].split(","):
                if option.startswith("disable_acs_redir="):
                    out += [b if b.count(":") == 2 else "0000:" + b
                            for b in option.split("=", 1)[1].split(";") if b]
    return out


def running_cpufreq(root: str) -> tuple | None:
    """``(scaling driver, pstate mode or None)`` the node runs, None without cpufreq."""
    return _running_cpufreq(_Tree(root))


def _running_cpufreq(t: _Tree) -> tuple | None:
    driver = _read(t, f"{CPU_BASE}/cpufreq/policy0/scaling_driver")
    if driver is None:
        return None
    status = _read(t, f"{CPU_BASE}/amd_pstate/status") or _read(t, f"{CPU_BASE}/intel_pstate/status")
    family = cpufreq_family(driver.strip())
    return driver.strip(), (status.strip() if status and family != "acpi-cpufreq" else None)


def _iommu_type(t: _Tree) -> str | None:
    groups = t.path("sys/kernel/iommu_groups")
    names = sorted(os.listdir(groups)) if os.path.isdir(groups) else []
    if not names:
        return None
    return (_read(t, f"sys/kernel/iommu_groups/{names[0]}/type") or "").strip() or None


def _boot_record(t: _Tree) -> dict:
    """The node's boot without our drop-in: recorded at the first simulated boot, read at the later ones."""
    text = _read(t, BOOT_RECORD)
    if text:
        return json.loads(text)
    record = {"boots": 0, "cmdline": (_read(t, "proc/cmdline") or "").split(), "cpufreq": _running_cpufreq(t),
              "iommu": _iommu_type(t)}
    return record


def _cpu_vendor(t: _Tree) -> str | None:
    for line in (_read(t, "proc/cpuinfo") or "").splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return None


def _clear_acs_redirect(t: _Tree, bdf: str) -> bool:
    """Clear ReqRedir, CmpltRedir and EgressCtrl in ``bdf``'s ACS control, as the kernel does at boot."""
    path = t.path(f"sys/bus/pci/devices/{bdf}/config")
    if not os.path.exists(path):
        return False
    with open(path, "r+b") as fh:
        cfg = bytearray(fh.read())
        offset, hops = 0x100, 0
        while 0x100 <= offset < len(cfg) - 8 and hops < 64:  # a broken list must not loop for ever
            hops += 1
            header = struct.unpack_from("<I", cfg, offset)[0]
            if header & 0xFFFF == ACS_CAP_ID:
                ctl = struct.unpack_from("<H", cfg, offset + 6)[0]
                struct.pack_into("<H", cfg, offset + 6, ctl & ~ACS_REDIRECT & 0xFFFF)
                fh.seek(0)
                fh.write(cfg)
                return True
            offset = header >> 20
    return False


def _next_boot(t: _Tree, record: dict, dropin: str) -> dict:
    """What the next boot's command line is (the node's own plus the drop-in's) and the driver it loads."""
    args = add_kernel_args(record["cmdline"], grub_dropin_args(_read(t, dropin.lstrip("/"))))
    running = _running_cpufreq(t)
    wanted = None
    if running is not None and record.get("cpufreq"):
        release = (_read(t, "proc/sys/kernel/osrelease") or "").strip()
        cppc = os.path.isdir(t.path(f"{CPU_BASE}/cpu0/acpi_cppc"))
        wanted = tuple(cpufreq_after_boot(args, _cpu_vendor(t), tuple(record["cpufreq"]), release, cppc))
    return {"args": args, "running": running, "wanted": wanted}


def _apply_command_line(t: _Tree, record: dict, boot: dict) -> dict:
    """The new /proc/cmdline, and what it brings: the cpufreq driver, the IOMMU groups' type, ACS redirect off."""
    args = boot["args"]
    before = (_read(t, "proc/cmdline") or "").split()
    t.write("proc/cmdline", " ".join(args))
    out = {"cmdline": " ".join(args), "added": [a for a in args if a not in before],
           "dropped": [a for a in before if a not in args], "cpufreq": None, "iommu": None, "acs_cleared": []}
    if boot["wanted"] is not None:
        if boot["wanted"] != tuple(boot["running"]):
            set_cpufreq_driver(t.root, *boot["wanted"])
        out["cpufreq"] = {"before": list(boot["running"]), "after": list(boot["wanted"])}
    groups = t.path("sys/kernel/iommu_groups")
    wanted_type = iommu_after_boot(args, record.get("iommu"))
    if os.path.isdir(groups) and wanted_type:
        for name in sorted(os.listdir(groups)):
            t.write(f"sys/kernel/iommu_groups/{name}/type", wanted_type)
        out["iommu"] = wanted_type
    out["acs_cleared"] = [b for b in acs_redirect_bdfs(args) if _clear_acs_redirect(t, b)]
    return out


def _run(argv: list, timeout: float = REBOOT_COMMAND_TIMEOUT, env: dict | None = None) -> tuple:
    """``(rc, stdout, stderr)``; a command that does not finish in ``timeout`` seconds is killed (rc 124)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd="/",
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 124, "", "%s did not finish within %s s" % (argv[0], timeout)
    except OSError as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def reset_journaled(root: str, journal: str = JOURNAL, collections: str = COLLECTIONS, skip: tuple = ()) -> dict:
    """Every journaled runtime value back to its original, as a reboot resets it, with the journal kept as it is.

    The collection's own rollback writes them (its tuning_apply module, run on a copy of the journal below the
    root, with ``collections`` on the module's path): the same files, the same values, no second writer to keep
    in step. ``skip``: families whose values this boot replaces anyway (cpufreq when the driver changes: the new
    driver starts with its own). Returns ``{"families": [...], "failed": {family: message}}``.
    """
    t = _Tree(root)
    text = _read(t, journal.lstrip("/"))
    families = sorted(set(json.loads(text).get("families", {})) - set(skip)) if text else []
    if not families:
        return {"families": [], "failed": {}}
    copy = os.path.join(os.path.dirname(journal), ".simnode-reboot-" + os.path.basename(journal))
    t.write(copy, text.encode(), mode=0o600)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"ANSIBLE_MODULE_ARGS": {"root": t.root, "journal": copy, "fail_on_error": False, "families": [
            {"name": name, "options": RESTORE_OPTIONS.get(name, {"restore": True})} for name in families]}}, fh)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (collections, os.environ.get("PYTHONPATH")) if p))
    try:
        rc, out, err = _run([sys.executable, "-m", "ansible_collections.gpunode.tuning.plugins.modules.tuning_apply",
                             fh.name], env=env)
    finally:
        os.unlink(fh.name)
        if os.path.exists(t.path(copy)):
            os.unlink(t.path(copy))
    try:
        result = json.loads(out)
    except ValueError:
        return {"families": families, "failed": {"*": "tuning_apply exited %d: %s %s" % (rc, out[-500:], err[-500:])}}
    return {"families": families, "failed": dict(result.get("failed_families") or {})}


def _conf_files(t: _Tree, dirs: tuple, suffix: str = ".conf") -> list:
    """The files a boot reads from ``dirs`` (an earlier directory hides the same name in a later one), by name."""
    chosen: dict = {}
    for directory in dirs:
        names = os.listdir(t.path(directory)) if os.path.isdir(t.path(directory)) else []
        for name in names:
            if name.endswith(suffix) and name not in chosen:
                chosen[name] = f"{directory}/{name}"
    return [chosen[name] for name in sorted(chosen)]


def _conf_lines(t: _Tree, rel: str) -> list:
    return [line.strip() for line in (_read(t, rel) or "").splitlines()
            if line.strip() and not line.strip().startswith(("#", ";"))]


def apply_sysctl_files(root: str) -> dict:
    """What systemd-sysctl does at boot: every sysctl.d file in load order, then /etc/sysctl.conf.

    Returns ``{"applied": {key: value}, "missing": [keys the node lacks]}`` (``-key`` lines may be missing).
    """
    t = _Tree(root)
    files = _conf_files(t, SYSCTL_DIRS) + (["etc/sysctl.conf"] if os.path.isfile(t.path("etc/sysctl.conf")) else [])
    out: dict = {"applied": {}, "missing": []}
    for rel in files:
        for line in _conf_lines(t, rel):
            key, sep, value = line.partition("=")
            key, optional = key.strip().lstrip("-"), key.strip().startswith("-")
            if not sep or "*" in key:
                continue
            path = "proc/sys/" + key.replace(".", "/")
            if os.path.isfile(t.path(path)):
                t.write(path, value.strip())
                out["applied"][key] = value.strip()
            elif not optional:
                out["missing"].append(key)
    return out


def load_boot_modules(root: str) -> dict:
    """What systemd-modules-load does at boot: each module of modules-load.d, through the node's modprobe, with
    the options modprobe.d gives it. Returns ``{"loaded": [...], "failed": {module: message}}``."""
    t = _Tree(root)
    options: dict = {}
    for rel in _conf_files(t, ("etc/modprobe.d", "run/modprobe.d", "usr/lib/modprobe.d", "lib/modprobe.d")):
        for words in (line.split() for line in _conf_lines(t, rel)):
            if len(words) > 2 and words[0] == "options":
                options.setdefault(words[1].replace("-", "_"), []).extend(words[2:])
    out: dict = {"loaded": [], "failed": {}}
    modprobe = t.path("usr/sbin/modprobe")
    for rel in _conf_files(t, MODULES_LOAD_DIRS):
        for name in _conf_lines(t, rel):
            rc, _stdout, err = _run([modprobe, name, *options.get(name.replace("-", "_"), [])])
            if rc == 0:
                out["loaded"].append(name)
            else:
                out["failed"][name] = err.strip() or "modprobe exited %d" % rc
    return out


def run_boot_unit(root: str) -> dict:
    """Run gpunode-tuning-boot.service's ExecStart as the boot would, when the unit is there and enabled.

    The runner below the root runs with this Python (the node's stands in for it), isolated (``-I -B``) and with
    ``--root`` added. Returns ``{"ran": bool, "rc", "output": [lines]}`` (``why`` when it did not run).
    """
    t = _Tree(root)
    unit = _read(t, BOOT_UNIT)
    if unit is None or not os.path.lexists(t.path(BOOT_UNIT_WANTS)):
        return {"ran": False, "why": "no enabled %s" % os.path.basename(BOOT_UNIT)}
    start = next((line.split("=", 1)[1].split() for line in unit.splitlines() if line.startswith("ExecStart=")), [])
    script = next((w for w in start[1:] if w.startswith("/")), None)
    if script is None or "--desired" not in start:
        return {"ran": False, "why": "ExecStart of %s is not the boot runner's: %s" % (BOOT_UNIT, " ".join(start))}
    desired = start[start.index("--desired") + 1]
    rc, out, err = _run([sys.executable, "-I", "-B", t.path(script), "--desired", desired, "--root", t.root])
    return {"ran": True, "rc": rc, "output": (out + err).splitlines()}


def reboot(root: str, dropin: str = GRUB_DROPIN, journal: str = JOURNAL, collections: str = COLLECTIONS) -> dict:
    """Reboot the simulated node at ``root`` as the kernel and systemd would, with what the tuning left on it.

    In this order: each journaled runtime value reset to its original (cpufreq's only when the driver stays:
    a new driver starts with its own); the kernel command line becomes the
    node's own plus the GRUB drop-in's arguments (``dropin``), and with it the cpufreq driver (amd_pstate=,
    intel_pstate=), the IOMMU groups' type (iommu=pt) and ACS redirect (pci=disable_acs_redir=); a new boot
    id, a fresh uptime, an empty kernel log; the sysctl and modules-load drop-ins applied; then the boot
    unit's re-apply run as the unit would. A root holding REBOOT_NEVER_RETURNS never comes back: nothing
    changes, its boot id stays, ``returned`` is False.

    Returns what happened: ``returned``, ``boot_id`` (and ``previous_boot_id``), ``cmdline`` (``added``,
    ``dropped``), ``cpufreq`` ({before, after}), ``iommu``, ``acs_cleared``, ``reset``, ``sysctl``,
    ``modules``, ``boot_unit``, and ``problems`` (what failed, in words).
    """
    t = _Tree(root)
    previous = (_read(t, "proc/sys/kernel/random/boot_id") or "").strip()
    if os.path.exists(t.path(REBOOT_NEVER_RETURNS)):
        return {"returned": False, "boot_id": previous, "previous_boot_id": previous,
                "problems": ["%s: the node never comes back (%s)" % (t.root, REBOOT_NEVER_RETURNS)]}
    apply_boot_faults(root, check_only=True)  # a bad fault file fails the boot before anything changes
    record = _boot_record(t)
    out: dict = {"returned": True, "previous_boot_id": previous}
    boot = _next_boot(t, record, dropin)
    switching = boot["wanted"] is not None and boot["wanted"] != tuple(boot["running"])
    out["reset"] = reset_journaled(root, journal, collections, skip=("cpufreq",) if switching else ())
    out.update(_apply_command_line(t, record, boot))
    out["aspm_policy"] = simnode_aspm.after_boot(root, boot["args"])
    out["boot_id"] = str(uuid.uuid4())
    t.write("proc/sys/kernel/random/boot_id", out["boot_id"])
    t.write("proc/uptime", "21.37 40.11")
    t.write("dev/kmsg", b"")
    out["gpu_faults"] = apply_boot_faults(root)
    out["sysctl"] = apply_sysctl_files(root)
    out["modules"] = load_boot_modules(root)
    out["boot_unit"] = run_boot_unit(root)
    record["boots"] += 1
    t.write(BOOT_RECORD, json.dumps(record, indent=1, sort_keys=True))
    out["problems"] = _reboot_problems(out)
    return out


def write_boot_faults(root: str, faults: dict) -> str:
    """Place ``faults`` ({kind: [GPU index]}, BOOT_FAULT_KINDS) for the node's next simulated boot; return the file."""
    unknown = sorted(set(faults) - set(BOOT_FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown boot fault(s) {', '.join(unknown)}; available: {', '.join(BOOT_FAULT_KINDS)}")
    t = _Tree(root)
    t.write(BOOT_FAULTS, json.dumps({k: sorted(set(v)) for k, v in faults.items()}))
    return t.path(BOOT_FAULTS)


def _drop_gpu(answers: dict, n: int, bdf: str) -> None:
    """Take GPU ``n`` (listing position, ``bdf``) out of every amd-smi answer, renumbering the others."""
    for key in ("list", "static", "metric", "bad_pages"):
        records = json.loads(answers[key])["gpu_data"]
        del records[n]
        for k, rec in enumerate(records):
            rec["gpu"] = k
        answers[key] = json.dumps({"gpu_data": records}, indent=4)
    topology = [e for e in json.loads(answers["topology"]) if e["bdf"] != bdf]
    for k, entry in enumerate(topology):
        entry["gpu"] = k
        entry["links"] = [link for link in entry["links"] if link["bdf"] != bdf]
        for m, link in enumerate(entry["links"]):
            link["gpu"] = m
    answers["topology"] = json.dumps(topology, indent=4)
    # xgmi -l: one row per GPU ("GPU<k>   <bdf>  <cell per other GPU>  X"); drop its row and its column.
    lines = answers["xgmi_link_status"].split("\n")
    rows = [line for line in lines if line.startswith("GPU")]
    kept, k = [], 0
    for row_no, row in enumerate(rows):
        words = row.split()
        if words[1] == bdf:
            continue
        cells = words[2:-1]
        del cells[n if n < row_no else n - 1]
        kept.append("GPU%d   %s  %s" % (k, words[1], "  ".join(cells + ["X"])))
        k += 1
    head = [line for line in lines if not line.startswith("GPU")]
    answers["xgmi_link_status"] = "\n".join(head[:2] + kept + head[2:])


def apply_boot_faults(root: str, check_only: bool = False) -> dict:
    """The GPU faults of BOOT_FAULTS, applied to the amd-smi stand-in's answers at this boot, then the file removed.

    Returns ``{"applied": {kind: [bdf]}}``, or ``{}`` without the file. A node without the amd-smi stand-in, an
    unknown kind or an index out of range is an error (ValueError): the test that placed the file is wrong.
    ``check_only``: only that check (the boot makes it before it changes anything).
    """
    t = _Tree(root)
    text = _read(t, BOOT_FAULTS)
    if text is None:
        return {}
    faults = json.loads(text)
    unknown = sorted(set(faults) - set(BOOT_FAULT_KINDS))
    if unknown:
        raise ValueError(f"{BOOT_FAULTS}: unknown boot fault(s) {', '.join(unknown)}; "
                         f"available: {', '.join(BOOT_FAULT_KINDS)}")
    if _read(t, AMD_SMI_STATE) is None:
        raise ValueError(f"{BOOT_FAULTS}: the node has no amd-smi stand-in ({AMD_SMI_STATE}) for its GPU faults")
    state = json.loads(_read(t, AMD_SMI_STATE))
    answers = state["answers"]
    listed = [g["bdf"] for g in json.loads(answers["list"])["gpu_data"]]
    for kind, indices in faults.items():
        bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < len(listed)]
        if bad:
            raise ValueError(f"{BOOT_FAULTS}: {kind}: GPU index {bad[0]!r} is not one of 0..{len(listed) - 1}")
    if check_only:
        return {}
    applied: dict = {}
    metric = json.loads(answers["metric"])["gpu_data"]
    for i in faults.get("ecc_uncorrectable", ()):
        metric[i]["ecc"]["total_uncorrectable_count"] = 2
        metric[i]["ecc_blocks"]["UMC"]["uncorrectable_count"] = 2
        applied.setdefault("ecc_uncorrectable", []).append(listed[i])
    answers["metric"] = json.dumps({"gpu_data": metric}, indent=4)
    for i in sorted(faults.get("missing", ()), reverse=True):
        _drop_gpu(answers, i, listed[i])
        applied.setdefault("missing", []).insert(0, listed[i])
    t.write(AMD_SMI_STATE, json.dumps(state))
    os.remove(t.path(BOOT_FAULTS))
    return {"applied": applied}


def _reboot_problems(out: dict) -> list:
    problems = ["reset of %s failed: %s" % (k, v) for k, v in sorted(out["reset"]["failed"].items())]
    problems += ["sysctl %s: the node has no such key" % k for k in out["sysctl"]["missing"]]
    problems += ["module %s did not load at boot: %s" % (k, v) for k, v in sorted(out["modules"]["failed"].items())]
    unit = out["boot_unit"]
    if unit["ran"] and unit["rc"] != 0:
        problems.append("the boot unit's re-apply exited %d: %s" % (unit["rc"], " | ".join(unit["output"][-5:])))
    return problems


def _reboot_command(args) -> int:
    """0: the node came back as the tuning wants it; 1: it came back with problems; 3: it never came back."""
    if not os.path.isfile(os.path.join(args.dir, "proc/sys/kernel/random/boot_id")):
        print(f"simnode: {args.dir} is not a simulated node (no proc/sys/kernel/random/boot_id)", file=sys.stderr)
        return 2
    report = reboot(args.dir, dropin=args.dropin, journal=args.journal)
    print(json.dumps(report, indent=1, sort_keys=True))
    if not report["returned"]:
        return 3
    return 1 if report["problems"] else 0


def _bars_and_aer(args) -> bool:
    """``--bar`` and ``--aer`` on the built node; False (said on stderr) when one is wrong."""
    try:
        for spec in args.bar:
            where, _eq, mib = spec.rpartition("=")
            bdf, _c, index = where.rpartition(":")
            set_gpu_bar(args.dir, bdf, int(index), int(mib) * MIB)
        for spec in args.aer:
            where, _eq, count = spec.rpartition("=")
            bdf_sev, _c, name = where.rpartition(":")
            bdf, _c, severity = bdf_sev.rpartition(":")
            set_aer(args.dir, bdf, severity, {name: int(count)})
    except (ValueError, OSError) as exc:
        print(f"simnode: {exc}", file=sys.stderr)
        return False
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write a simulated node under DIR")
    b.add_argument("--preset", required=True, choices=sorted(PRESETS))
    b.add_argument("--cpus", type=int)
    b.add_argument("--gpus", type=int)
    b.add_argument("--kmsg-records", type=int, default=0, help="extra kernel log records (benchmarks)")
    b.add_argument("--nvidia-smi", action="store_true", help="ship a node-local nvidia-smi stand-in")
    b.add_argument("--gpu-fault", action="append", default=[], metavar="KIND=I[,J]",
                   help="a sick GPU (implies --nvidia-smi); kinds: " + ", ".join(GPU_FAULTS))
    b.add_argument("--smi-driver", choices=sorted(SMI_DRIVERS), default="current",
                   help="the driver the nvidia-smi stand-in plays (r470: no clocks_event_reasons, no remapped_rows)")
    b.add_argument("--smi-mode", choices=SMI_MODES, default="answer",
                   help="how the nvidia-smi stand-in answers (hang: never; exit9: driver unreachable)")
    b.add_argument("--smi-ansi", action="store_true", help="ANSI-underlined topo header (drivers 590-610)")
    b.add_argument("--amd-smi", action="store_true", help="ship a node-local amd-smi stand-in (AMD presets)")
    b.add_argument("--amd-fault", action="append", default=[], metavar="KIND=I[,J]",
                   help="an AMD GPU fault (kinds: %s)" % ", ".join(AMD_FAULTS))
    b.add_argument("--amd-smi-mode", choices=AMD_SMI_MODES, default="answer",
                   help="how the amd-smi stand-in answers (implies --amd-smi)")
    b.add_argument("--iommu", choices=IOMMU_TYPES, help="an active IOMMU, groups of this default domain type")
    b.add_argument("--vfio", action="append", default=[], metavar="BDF", help="bind this function to vfio-pci")
    b.add_argument("--benchmark", choices=BENCHMARK_KINDS,
                   help="ship the benchmark stand-in usr/bin/gpunode-sim-bench (inverse: tuning makes it worse)")
    b.add_argument("--sysctl-file", action="append", default=[], metavar="PATH:KEY=VALUE[,KEY=VALUE]",
                   help="a sysctl file of the node's image (e.g. %s:vm.swappiness=60)" % CLOUD_SYSCTL_FILE)
    b.add_argument("--unit-failed", action="append", default=[], metavar="UNIT",
                   help="this systemd unit failed (ships a systemctl stand-in that answers 'show')")
    b.add_argument("--node-exporter", action="store_true",
                   help="the textfile directory of Debian's prometheus-node-exporter (/%s)"
                   % NODE_EXPORTER_TEXTFILE_DIR)
    b.add_argument("--bar", action="append", default=[], metavar="BDF:INDEX=MIB",
                   help="a GPU's BAR at this size in MiB, as firmware without Resizable BAR leaves it "
                   "(0000:41:00.0:1=256)")
    b.add_argument("--aer", action="append", default=[], metavar="BDF:SEVERITY:NAME=N",
                   help="an AER count of a GPU or bridge (severity correctable, nonfatal, fatal; "
                   "0000:40:01.1:fatal:DLP=1)")
    b.add_argument("--kernel", metavar="RELEASE", help="the running kernel's release (e.g. 5.15.0-91-generic)")
    b.add_argument("--cppc-off", action="store_true", help="firmware with ACPI CPPC off (no cpuN/acpi_cppc/)")
    b.add_argument("--nvidia-driver", metavar="FLAVOR:VERSION", help="open:580.65.06 or proprietary:570.86.15")
    b.add_argument("--aspm", choices=simnode_aspm.MODES, default="disabled", help="PCIe ASPM (tools/simnode_aspm.py)")
    b.add_argument("dir")
    sub.add_parser("list", help="list presets")
    r = sub.add_parser("reboot", help="reboot the simulated node at DIR (prints what the boot did, as JSON)")
    r.add_argument("--dropin", default=GRUB_DROPIN, help="the GRUB drop-in of the kernel arguments (%(default)s)")
    r.add_argument("--journal", default=JOURNAL, help="the journal of original values (%(default)s)")
    r.add_argument("dir")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for name, spec in sorted(PRESETS.items()):
            print(f"{name}: {spec['description']}")
        return 0
    if args.cmd == "reboot":
        return _reboot_command(args)
    try:
        faults = _parse_faults(args.gpu_fault)
        amd_faults = _parse_faults(args.amd_fault)
        sysctl_files = [_parse_sysctl_file(spec) for spec in args.sysctl_file]
        info = build(args.dir, args.preset, cpus=args.cpus, gpus=args.gpus, kmsg_records=args.kmsg_records,
                     nvidia_smi=args.nvidia_smi, gpu_faults=faults, iommu=args.iommu, vfio=args.vfio,
                     benchmark=args.benchmark, smi_driver=args.smi_driver, smi_mode=args.smi_mode,
                     smi_ansi=args.smi_ansi, amd_smi=args.amd_smi, amd_faults=amd_faults,
                     amd_smi_mode=args.amd_smi_mode, kernel=args.kernel, cppc=not args.cppc_off,
                     nvidia_driver=args.nvidia_driver, aspm=args.aspm)
    except ValueError as exc:
        print(f"simnode: {exc}", file=sys.stderr)
        return 2
    for path, settings in sysctl_files:
        write_sysctl_file(args.dir, path, settings)
    for unit in args.unit_failed:
        write_unit_state(args.dir, unit)
    if not _bars_and_aer(args):
        return 2
    if args.node_exporter:
        write_node_exporter_dir(args.dir)
    print(f"built {info['preset']} at {info['root']}: {info['cpus']} CPUs, {info['gpus']} GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
