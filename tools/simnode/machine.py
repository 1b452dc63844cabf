"""Machine descriptions: the fields of a preset (``Preset``), PCI functions, cpuidle states, the GPU IDs known."""

from __future__ import annotations

import dataclasses


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
