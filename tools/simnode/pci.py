"""PCI configuration space and sysfs: capabilities, BARs and Resizable BAR, AER counters, ``sys/bus/pci/devices``."""

from __future__ import annotations

import os
import struct

from .machine import PciFunction, is_gpu
from .tree import Tree

# -- PCI configuration space

PCIE_PORT_TYPE = {"endpoint": 0x0, "root_port": 0x4, "upstream": 0x5, "downstream": 0x6}


def _encode_size(size: int) -> int:
    return (size // 128).bit_length() - 1


def config_space(f: PciFunction) -> bytes:  # noqa: PLR0915 (the layout, capability by capability at fixed offsets)
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


PCIE_SPEEDS = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}


def write_pci(t: Tree, funcs: list) -> None:
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
