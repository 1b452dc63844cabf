"""A preset's PCI topology: root ports, PCI segments (arm64), PCIe switches, GPUs and the other endpoints."""

from __future__ import annotations

from .machine import GPU_BUSES, PciFunction, Preset


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
