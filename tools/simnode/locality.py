"""IOMMU groups and vfio-pci, and GPU locality: local CPUs, device names, MSI/MSI-X IRQs, irqbalance."""

from __future__ import annotations

import os

from .cpu import cpu_node
from .machine import PciFunction, Preset, is_gpu
from .tree import Tree, cpulist

# -- IOMMU groups and vfio-pci (the P2P path: ACS isolates what vfio-pci passes through)

IOMMU_TYPES = ("identity", "DMA", "DMA-FQ")


def check_iommu_vfio(funcs: list, iommu: str | None, vfio: list | None) -> None:
    """ValueError, before anything is written, for an unknown group type or a BDF the node lacks."""
    if iommu is not None and iommu not in IOMMU_TYPES:
        raise ValueError(f"iommu {iommu!r} is not one of {', '.join(IOMMU_TYPES)}")
    unknown = sorted(set(vfio or ()) - {f.bdf for f in funcs})
    if unknown:
        raise ValueError(f"vfio: no function {', '.join(unknown)} on this node")


def write_iommu_vfio(t: Tree, p: Preset, funcs: list, iommu: str | None, vfio: list | None) -> None:
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


# -- GPU locality: local CPUs, device names, MSI/MSI-X IRQs and their affinities, irqbalance

MSI_IRQ_BASE = 200  # the first MSI/MSI-X IRQ number (legacy INTx numbers are below, see write_pci)
IRQBALANCE_PID = 3104


def _node_cpus(p: Preset, node: int) -> list:
    """The CPUs of a NUMA node; every CPU for -1 (what the kernel gives a device without a node)."""
    return [c for c in range(p.cpus) if node < 0 or cpu_node(p, c) == node]


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


def _write_irqs(t: Tree, p: Preset, funcs: list) -> None:
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
            cpus = cpulist(_irq_cpus(p, f, v, remote))
            t.write(os.path.relpath(os.path.join(d, "msi_irqs", str(irq)), t.root), "msix")
            t.write(f"proc/irq/{irq}/smp_affinity_list", cpus)
            t.write(f"proc/irq/{irq}/effective_affinity_list", cpus)
            irq += 1
        gpus, nics = gpus + gpu, nics + (not gpu)


def write_locality(t: Tree, p: Preset, funcs: list) -> None:
    """What gpu_locality reads besides numa_node: each function's local_cpulist, the class directories
    naming its netdev, RDMA or NVMe device, and (``msi`` presets) IRQs and an irqbalance process."""
    index: dict = {}
    for f in funcs:
        d = os.path.realpath(t.path(f"sys/bus/pci/devices/{f.bdf}"))
        t.write(os.path.relpath(os.path.join(d, "local_cpulist"), t.root), cpulist(_node_cpus(p, f.numa_node)))
        for cls_dir, name in _device_names(f, index).items():
            t.mkdir(os.path.relpath(os.path.join(d, cls_dir, name), t.root))
    if p.msi:
        _write_irqs(t, p, funcs)
    if p.irqbalance:
        t.write(f"proc/{IRQBALANCE_PID}/comm", "irqbalance")
        t.write(f"proc/{IRQBALANCE_PID}/cmdline", b"/usr/sbin/irqbalance\0--foreground\0")
