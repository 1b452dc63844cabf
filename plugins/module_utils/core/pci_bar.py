# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A GPU's memory BARs and its Resizable BAR capability, read-only (issue 44).

The NVIDIA driver maps a peer's memory through the peer's BAR1 ("BAR1 is used to map the FB (device memory) so
that it can be directly accessed by the CPU or by 3rd party devices (peer-to-peer on the PCIE bus)": NVML,
nvmlDeviceGetBAR1MemoryInfo). With Above 4G Decoding or Resizable BAR off in the firmware, BAR1 stays at 256 MiB
on a GPU of 96 GiB. Two sources, both plain files:

- ``resource`` of the PCI device in sysfs: one line per resource, ``start end flags`` in hex (standard BARs 0-5,
  the expansion ROM as 6, then bridge windows); the size is ``end - start + 1``, an unassigned one reads all zero.
  ``IORESOURCE_MEM`` (0x200) in the flags marks memory, ``IORESOURCE_PREFETCH`` (0x2000) prefetchable.
- the Resizable BAR extended capability (``PCI_EXT_CAP_ID_REBAR`` 0x15) of config space, as the kernel's
  include/uapi/linux/pci_regs.h lays it out (``PCI_REBAR_CAP`` 4, ``PCI_REBAR_CTRL`` 8, one 8-byte entry per
  resizable BAR): the capability register's bits 4-31 are the sizes supported (bit n: 1 MiB << (n - 4), up to
  128 TiB), the control register holds the BAR index (bits 0-2), the number of resizable BARs (bits 5-7, in
  the first entry) and the current size (bits 8-13: 1 MiB << value); its bits 16-31 continue the supported sizes
  from 256 TiB (lspci's ls-ecaps.c reads them the same way).

The GPU's memory comes from ``GPU_MEMORY_GIB`` (its PCI device id; the vendors' datasheets) or, on AMD, from
amdgpu's ``mem_info_vram_total``. Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

import os
import struct

from ansible_collections.gpunode.tuning.plugins.module_utils.core import pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import read_small

PCI_EXT_CAP_ID_REBAR = 0x15
PCI_REBAR_CAP = 4
PCI_REBAR_CTRL = 8
REBAR_CTRL_BAR_IDX = 0x7
REBAR_CTRL_NBAR_MASK = 0xE0
REBAR_CTRL_NBAR_SHIFT = 5
REBAR_CTRL_BAR_SIZE = 0x3F00
REBAR_CTRL_BAR_SHIFT = 8
MIB = 1 << 20
GIB = 1 << 30
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
STANDARD_BARS = 6  # BAR 0-5; line 6 of ``resource`` is the expansion ROM

# The BAR through which a GPU's peers reach its memory: BAR1 on NVIDIA (NVML's BAR1 documentation; the GPUDirect
# RDMA guide's "PCI BAR sizes": what a peer maps of the GPU's memory must fit in BAR1); on AMD the VRAM aperture,
# BAR0 (amdgpu's enum amdgpu_pcie_bar "PCIe BAR index identifiers for P2P access": AMDGPU_PCIE_BAR_VRAM is BAR 0,
# amd-gfx list; ROCm's "Troubleshoot BAR access limitation"; lspci of an RX 7900 XTX in tests/data/real). AMD
# Instinct GPUs linked by XGMI reach each other over XGMI: their BAR0 is judged only where they are not
# (families/gpu_p2p.py amd_bar_rows).
PEER_BAR = {"nvidia": 1, "amd": 0}
# The firmware settings that let a GPU's BAR grow to its memory.
FIRMWARE_FIX = "enable Above 4G Decoding and Resizable BAR (Re-Size BAR Support) in the system firmware"

# GPU memory by PCI device id, from the vendors' datasheets (GiB as marketed: 96 GB GDDR7 reads 96 GiB here);
# a GPU not listed has no memory size and its BAR is reported, never failed.
GPU_MEMORY_GIB = {
    ("nvidia", 0x2BB1): 96,  # RTX PRO 6000 Blackwell Workstation Edition
    ("nvidia", 0x2BB5): 96,  # RTX PRO 6000 Blackwell Server Edition
    ("nvidia", 0x2B85): 32,  # GeForce RTX 5090
    ("nvidia", 0x2684): 24,  # GeForce RTX 4090
    ("nvidia", 0x26B1): 48,  # RTX 6000 Ada Generation
    ("nvidia", 0x26B9): 48,  # L40S
    ("nvidia", 0x2330): 80,  # H100 SXM5 80GB
    ("nvidia", 0x2331): 80,  # H100 PCIe
    ("nvidia", 0x20B2): 80,  # A100 SXM4 80GB
    ("nvidia", 0x20B5): 80,  # A100 PCIe 80GB
    ("amd", 0x74A1): 192,  # Instinct MI300X
}


def parse_resource(text: str | None) -> list:
    """``resource``'s lines as ``[(index, start, end, flags)]``; lines that do not read as three hex numbers are
    left out (they keep their index)."""
    out = []
    for index, line in enumerate((text or "").splitlines()):
        fields = line.split()
        if len(fields) != 3:
            continue
        try:
            start, end, flags = (int(f, 16) for f in fields)
        except ValueError:
            continue
        out.append((index, start, end, flags))
    return out


def memory_bars(text: str | None) -> dict:
    """``{bar index: size in bytes}`` of the assigned memory BARs 0-5 of a ``resource`` file (a 64-bit BAR takes
    two registers: its upper half reads as an empty line and is left out)."""
    return {i: end - start + 1 for i, start, end, flags in parse_resource(text)
            if i < STANDARD_BARS and flags & IORESOURCE_MEM and end > start}


def _sizes(bits: int, first: int, base_shift: int) -> list:
    return [1 << (base_shift + n - first) for n in range(first, 32) if bits >> n & 1]


def decode_rebar(cfg: bytes) -> dict | None:
    """The Resizable BAR capability: ``{bar index: {"current": bytes, "supported": [bytes, ...]}}``; None when the
    config space has none (no extended space, or a device without the capability)."""
    cfg = bytes(cfg or b"")
    pos = pci.find_ext_capability(cfg, PCI_EXT_CAP_ID_REBAR)
    if pos is None or pos + PCI_REBAR_CTRL + 4 > len(cfg):
        return None
    first_ctrl = struct.unpack_from("<I", cfg, pos + PCI_REBAR_CTRL)[0]
    count = (first_ctrl & REBAR_CTRL_NBAR_MASK) >> REBAR_CTRL_NBAR_SHIFT
    out = {}
    for i in range(min(count, STANDARD_BARS)):
        at = pos + 8 * i
        if at + PCI_REBAR_CTRL + 4 > len(cfg):
            break
        cap, ctrl = struct.unpack_from("<II", cfg, at + PCI_REBAR_CAP)
        supported = _sizes(cap & 0xFFFFFFF0, 4, 20) + _sizes(ctrl & 0xFFFF0000, 16, 48)
        out[ctrl & REBAR_CTRL_BAR_IDX] = {
            "current": 1 << (20 + ((ctrl & REBAR_CTRL_BAR_SIZE) >> REBAR_CTRL_BAR_SHIFT)),
            "supported": supported,
        }
    return out


def human(size: int | None) -> str:
    """``256 MiB``, ``96 GiB``, ``1 TiB``: the largest binary unit that divides the size."""
    if size is None:
        return "unknown"
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return "%d %s" % (size >> shift, unit)
    return "%d bytes" % size


def lspci_size(size: int) -> str:
    """A size as lspci's Resizable BAR lines print it: ``256MB``, ``64GB``, ``1TB``."""
    for unit, shift in (("TB", 40), ("GB", 30), ("MB", 20)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return "%d%s" % (size >> shift, unit)
    return "%d" % size


def memory_of(vendor: str | None, device: str | int | None, vram_total: str | None = None) -> int | None:
    """A GPU's memory in bytes: amdgpu's ``mem_info_vram_total`` when given, else ``GPU_MEMORY_GIB``."""
    if vram_total:
        try:
            return int(vram_total.strip())
        except ValueError:
            pass
    try:
        dev = int(device, 16) if isinstance(device, str) else device
    except ValueError:
        return None
    gib = GPU_MEMORY_GIB.get((vendor, dev))
    return None if gib is None else gib * GIB


# What a peer BAR smaller than the memory means by design, per vendor: NVIDIA maps peer memory through a window of
# BAR1's size; amdgpu lets no PCIe peer in unless BAR0 shows all of the VRAM ("large BAR":
# amdgpu_device_is_peer_accessible in drivers/gpu/drm/amd/amdgpu/amdgpu_device.c).
BY_DESIGN = {"nvidia": "the driver maps peer memory through a window of this size",
             "amd": "amdgpu gives PCIe peers access only to a GPU whose BAR0 shows all of its VRAM (large BAR)"}


def verdict(bar_size: int | None, memory: int | None, supported: list | None, vendor: str = "nvidia") -> tuple:
    """``(state, reason)`` of a GPU's peer BAR: ``drifted`` when it is smaller than the memory while the
    capability supports a size that large; ``applied`` when it covers the memory, and also (reported, the
    reason says why) when it is smaller by design or the memory size is not known; ``unsupported`` when the
    BAR is not assigned."""
    if bar_size is None:
        return "unsupported", "the BAR is not assigned (resource reads no memory range)"
    if memory is None:
        return "applied", "%s; reported only: the GPU's memory size is not known" % human(bar_size)
    if bar_size >= memory:
        return "applied", "%s covers the GPU's %s of memory" % (human(bar_size), human(memory))
    largest = max(supported) if supported else None
    if largest is not None and largest >= memory:
        return "drifted", ("%s, smaller than the GPU's %s of memory, while its Resizable BAR capability supports up "
                           "to %s: the firmware left it small; %s" % (human(bar_size), human(memory), human(largest),
                                                                      FIRMWARE_FIX))
    why = "its Resizable BAR capability reaches %s" % human(largest) if largest else "it has no Resizable BAR"
    return "applied", ("%s, smaller than the GPU's %s of memory by design (%s); reported only: %s"
                       % (human(bar_size), human(memory), why, BY_DESIGN.get(vendor, BY_DESIGN["nvidia"])))


def read_gpu(dev: dict) -> dict:
    """One GPU's ``{"vendor", "device", "bars": {index: bytes}, "rebar": decode_rebar or None, "memory": bytes or
    None}`` from its sysfs directory (``dev``: a ``pci.list_devices`` dict with its ``vendor_name``)."""
    try:
        with open(os.path.join(dev["path"], "config"), "rb") as fh:
            rebar = decode_rebar(fh.read())
    except OSError:
        rebar = None
    vendor = dev.get("vendor_name")
    return {"vendor": vendor, "device": dev.get("device"),
            "bars": memory_bars(read_small(os.path.join(dev["path"], "resource"))),
            "rebar": rebar,
            "memory": memory_of(vendor, dev.get("device"),
                                read_small(os.path.join(dev["path"], "mem_info_vram_total")))}


def peer_bar_rows(gpus: dict, vendor: str, make) -> list:
    """The peer-mapping BAR of each of ``vendor``'s GPUs (``{bdf: read_gpu}``): a drifted row per GPU whose BAR the
    firmware left small (``bar1.<bdf>``), else one applied row ``bar1`` with what is reported; fewer than two GPUs:
    not_applicable. ``make(name, running, state, reason, desired)`` builds a row."""
    index = PEER_BAR[vendor]
    name = "bar%d" % index
    mine = {b: g for b, g in sorted(gpus.items()) if g.get("vendor") == vendor}
    want = ">= the GPU's memory"
    if len(mine) < 2:
        return [make(name, None, "not_applicable", "fewer than 2 GPUs (%d): no peer maps a GPU's BAR%d"
                     % (len(mine), index), want)]
    bad, notes, sizes = [], [], set()
    for bdf, g in mine.items():
        # JSON (the facts as Ansible returns them) turns the indices into strings
        size = {int(k): v for k, v in (g.get("bars") or {}).items()}.get(index)
        supported = ({int(k): v for k, v in (g.get("rebar") or {}).items()}.get(index) or {}).get("supported")
        state, why = verdict(size, g.get("memory"), supported, vendor)
        sizes.add(human(size))
        text = "GPU %s BAR%d: %s" % (bdf, index, why)
        if state == "drifted":
            bad.append(make("%s.%s" % (name, bdf), human(size), "drifted", text, want))
        elif state == "unsupported" or "reported only" in why:
            notes.append(text)
    if bad:
        return bad
    running = "BAR%d %s on %d GPUs" % (index, "/".join(sorted(sizes)), len(mine))
    reason = ("; ".join(notes) if notes else
              "every GPU's BAR%d covers its memory (peers map it whole)" % index)
    return [make(name, running, "applied", reason, want)]
