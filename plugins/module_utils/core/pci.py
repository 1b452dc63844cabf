# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCI devices of a node: listing, selection, config space and PCI Express capability decoding.

How it works and why: docs/dev/node-code.md, "core/pci.py".
"""

from __future__ import annotations

import errno
import os
import re
import struct

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    SYSFS_PCI_DEVICES,
    Node,
    NodeError,
    cmdline_args,
    write_refusal,
)

# The ACS extended capability (pci_regs.h PCI_EXT_CAP_ID_ACS, PCI_ACS_CAP, PCI_ACS_CTRL).
PCI_EXT_CAP_ID_ACS = 0x000D
EXT_CAP_START = 0x100
ACS_CAP = 0x04
ACS_CTRL = 0x06
# Bit names as lspci prints them (pciutils ls-ecaps.c), bit numbers from pci_regs.h PCI_ACS_*.
ACS_BITS = (("SrcValid", 0), ("TransBlk", 1), ("ReqRedir", 2), ("CmpltRedir", 3), ("UpstreamFwd", 4),
            ("EgressCtrl", 5), ("DirectTrans", 6))
# ReqRedir, CmpltRedir, EgressCtrl: what pci=disable_acs_redir= clears too.
ACS_REDIRECT_MASK = 0x002C
_BDF_COMPONENT = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

PCI_CAP_ID_EXP = 0x10
PCI_CAPABILITY_LIST = 0x34
PCI_STATUS = 0x06
PCI_STATUS_CAP_LIST = 0x10

# Offsets inside the PCI Express capability (include/uapi/linux/pci_regs.h).
PCI_EXP_FLAGS = 0x02
PCI_EXP_DEVCAP = 0x04
PCI_EXP_DEVCTL = 0x08
PCI_EXP_LNKCAP = 0x0C
PCI_EXP_LNKSTA = 0x12

DEVCTL_MPS_MASK = 0x00E0
DEVCTL_MRRS_MASK = 0x7000
DEVCTL_MRRS_SHIFT = 12

MRRS_CHOICES = (128, 256, 512, 1024, 2048, 4096)
SETPCI_DEVCTL_REG = "CAP_EXP+08.w"

NVIDIA_VENDOR = "0x10de"
NVIDIA_GPU_CLASS_PREFIXES = ("0300", "0302")
AMD_VENDOR = "0x1002"
# The GPUs the default selector picks: NVIDIA's display (0300) and 3D (0302) controllers, AMD Instinct's
# "display controller, other" (0380, MI200) and processing accelerator (1200, MI300). HDMI-audio functions
# (0403), NVSwitch bridges (0680) and AMD's own CPU devices (vendor 0x1022) are not among them.
GPU_VENDORS = {NVIDIA_VENDOR: "nvidia", AMD_VENDOR: "amd"}
GPU_CLASS_PREFIXES = ("0300", "0302", "0380", "1200")

PCIE_PORT_TYPES = {
    0x0: "endpoint", 0x1: "legacy_endpoint", 0x4: "root_port", 0x5: "upstream_port",
    0x6: "downstream_port", 0x7: "pci_bridge", 0x8: "pcie_bridge", 0x9: "rc_integrated_endpoint",
    0xA: "rc_event_collector",
}
LINK_SPEEDS = {1: "2.5 GT/s", 2: "5.0 GT/s", 3: "8.0 GT/s", 4: "16.0 GT/s", 5: "32.0 GT/s", 6: "64.0 GT/s"}

_BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([01][0-9a-fA-F])\.([0-7])$")
_HEX_RE = re.compile(r"^(?:0[xX])?([0-9a-fA-F]+)$")

# -- Encoding and decoding


def encode_mrrs(size: int) -> int:
    """Return the Device Control MRRS field (0..5) for a size in bytes (128..4096)."""
    if isinstance(size, bool) or size not in MRRS_CHOICES:
        raise ValueError("mrrs must be one of %s bytes, got %r" % (", ".join(str(c) for c in MRRS_CHOICES), size))
    return MRRS_CHOICES.index(size)


def decode_mrrs(field: int) -> int:
    """Return the size in bytes of an MRRS (or MPS) field value 0..7: ``128 << field``."""
    if isinstance(field, bool) or not isinstance(field, int) or not 0 <= field <= 7:
        raise ValueError("an MRRS field is 3 bits (0..7), got %r" % (field,))
    return 128 << field if field <= 5 else None


def mrrs_of_devctl(devctl: int) -> int | None:
    """MRRS in bytes encoded in a Device Control value (None when reserved)."""
    return decode_mrrs((devctl & DEVCTL_MRRS_MASK) >> DEVCTL_MRRS_SHIFT)


def mps_of_devctl(devctl: int) -> int | None:
    """MPS in bytes encoded in a Device Control value (None when reserved)."""
    return decode_mrrs((devctl & DEVCTL_MPS_MASK) >> 5)


def setpci_mrrs_assignment(size: int) -> str:
    """The setpci ``value:mask`` write of an MRRS, e.g. ``CAP_EXP+08.w=5000:7000`` for 4096."""
    return "%s=%04x:%04x" % (SETPCI_DEVCTL_REG, encode_mrrs(size) << DEVCTL_MRRS_SHIFT, DEVCTL_MRRS_MASK)


def find_capability(config_bytes: bytes, cap_id: int) -> int | None:
    """Offset of the first capability ``cap_id`` in the standard list, or None when absent."""
    cfg = bytes(config_bytes)
    if len(cfg) < 0x40:
        return None
    status = struct.unpack_from("<H", cfg, PCI_STATUS)[0]
    if not status & PCI_STATUS_CAP_LIST:
        return None
    pos = cfg[PCI_CAPABILITY_LIST] & 0xFC
    for _step in range(48):  # at most 48 capabilities fit in 256 bytes
        if pos < 0x40 or pos + 2 > len(cfg):
            return None
        if cfg[pos] == 0xFF:
            return None
        if cfg[pos] == cap_id:
            return pos
        pos = cfg[pos + 1] & 0xFC
    return None


def decode_pcie(config_bytes: bytes) -> dict | None:
    """Decode the PCI Express capability of a config space; None when the device has none."""
    cfg = bytes(config_bytes)
    cap = find_capability(cfg, PCI_CAP_ID_EXP)
    if cap is None or cap + PCI_EXP_LNKSTA + 2 > len(cfg):
        return None
    flags = struct.unpack_from("<H", cfg, cap + PCI_EXP_FLAGS)[0]
    devcap = struct.unpack_from("<I", cfg, cap + PCI_EXP_DEVCAP)[0]
    devctl = struct.unpack_from("<H", cfg, cap + PCI_EXP_DEVCTL)[0]
    lnkcap = struct.unpack_from("<I", cfg, cap + PCI_EXP_LNKCAP)[0]
    lnksta = struct.unpack_from("<H", cfg, cap + PCI_EXP_LNKSTA)[0]
    return {
        "cap_offset": cap,
        "port_type": PCIE_PORT_TYPES.get((flags >> 4) & 0xF, "unknown"),
        "devcap": devcap,
        "devcap_mps_max": decode_mrrs(devcap & 0x7),
        "devctl": devctl,
        "mps": mps_of_devctl(devctl),
        "mrrs": mrrs_of_devctl(devctl),
        "link_speed_capable_code": lnkcap & 0xF,
        "link_speed_capable": LINK_SPEEDS.get(lnkcap & 0xF),
        "link_width_capable": (lnkcap >> 4) & 0x3F,
        "link_speed_current_code": lnksta & 0xF,
        "link_speed_current": LINK_SPEEDS.get(lnksta & 0xF),
        "link_width_current": (lnksta >> 4) & 0x3F,
    }


# -- Input validation and selection


def normalize_bdf(text: str) -> str:
    """Return ``DDDD:BB:DD.F`` (lower case) for ``DDDD:BB:DD.F`` or ``BB:DD.F``; else ValueError."""
    m = _BDF_RE.match(str(text).strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError("%r is not a PCI address: use DDDD:BB:DD.F or BB:DD.F in hex "
                         "(device 00-1f, function 0-7), e.g. 0000:41:00.0 or 41:00.0" % (text,))
    domain = m.group(1) or "0000"
    return ("%s:%s:%s.%s" % (domain, m.group(2), m.group(3), m.group(4))).lower()


def normalize_hex_id(value: str | int, name: str, digits: int = 4) -> str:
    """Return ``0x`` + ``digits`` lower-case hex digits for a PCI id given as hex text or int."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        m = _HEX_RE.match(str(value).strip()) if isinstance(value, str) else None
        if not m or len(m.group(1)) > digits:
            raise ValueError("%s must be a %d-digit hex PCI id such as %s, got %r"
                             % (name, digits, "10de or 0x10de" if digits == 4 else "0x" + "0" * digits, value))
        number = int(m.group(1), 16)
    if not 0 <= number < 16 ** digits:
        raise ValueError("%s must fit in %d hex digits, got %r" % (name, digits, value))
    return "0x%0*x" % (digits, number)


def normalize_class_prefix(value: str) -> str:
    """Return a class prefix as 2, 4 or 6 lower-case hex digits (base, base+sub, with prog-if)."""
    text = str(value).strip() if isinstance(value, str) else None
    m = _HEX_RE.match(text) if text is not None else None
    if not m or len(m.group(1)) not in (2, 4, 6):
        raise ValueError("class prefix %r is not 2, 4 or 6 hex digits (base class, base+subclass, or "
                         "with prog-if), e.g. \"03\", \"0302\" or \"030200\"; quote it in YAML" % (value,))
    return m.group(1).lower()


def selector_problems(want: dict) -> list:
    """``[(key, message)]`` of the PCI selector keys ``vendor``, ``device``, ``class_prefixes``, ``bdfs``."""
    out = []
    for key in ("vendor", "device"):
        value = want.get(key)
        for one in value if key == "vendor" and isinstance(value, (list, tuple)) else [value]:
            if one is None:
                continue
            try:
                normalize_hex_id(one, key)
            except ValueError as exc:
                out.append((key, str(exc)))
    for key, check, what in (("class_prefixes", normalize_class_prefix, "class prefixes (2, 4 or 6 hex digits)"),
                             ("bdfs", normalize_bdf, "PCI addresses (DDDD:BB:DD.F or BB:DD.F)")):
        values = want.get(key)
        if values is None:
            continue
        if not isinstance(values, (list, tuple)):
            out.append((key, "%r is not a list: allowed is a list of %s" % (values, what)))
            continue
        for value in values:
            try:
                check(value)
            except ValueError as exc:
                out.append((key, str(exc)))
    if want.get("allow_empty") is not None and not isinstance(want.get("allow_empty"), bool):
        out.append(("allow_empty", "allow_empty must be true or false, got %r" % (want["allow_empty"],)))
    return out


class DeviceSelector:
    """Which PCI functions a task applies to. Every given criterion must match (AND)."""

    def __init__(self, vendor=None, device=None, class_prefixes=None, bdfs=None):
        vendors = list(vendor) if isinstance(vendor, (list, tuple)) else [] if vendor is None else [vendor]
        self.is_default = not vendors and device is None and not class_prefixes and not bdfs
        if self.is_default:
            vendors, class_prefixes = list(GPU_VENDORS), list(GPU_CLASS_PREFIXES)
        self.vendors = [normalize_hex_id(v, "vendor") for v in vendors] or None
        self.device = normalize_hex_id(device, "device") if device is not None else None
        self.class_prefixes = [normalize_class_prefix(c) for c in class_prefixes] if class_prefixes else None
        self.bdfs = [normalize_bdf(b) for b in bdfs] if bdfs else None

    @classmethod
    def nvidia_gpus(cls) -> DeviceSelector:
        """NVIDIA display/3D controllers."""
        return cls(vendor=NVIDIA_VENDOR, class_prefixes=list(NVIDIA_GPU_CLASS_PREFIXES))

    @classmethod
    def gpus(cls) -> DeviceSelector:
        """The default selector: every vendor's GPUs (``GPU_VENDORS``, ``GPU_CLASS_PREFIXES``)."""
        return cls()

    def matches(self, dev: dict) -> bool:
        """True when a device dict (as from ``list_devices``) matches every given criterion."""
        if self.bdfs is not None and dev["bdf"] not in self.bdfs:
            return False
        if self.vendors is not None and _as_hex(dev["vendor"], 4) not in self.vendors:
            return False
        if self.device is not None and _as_hex(dev["device"], 4) != self.device:
            return False
        if self.class_prefixes is not None:
            cls = _as_hex(dev["class"], 6)[2:]
            if not any(cls.startswith(p) for p in self.class_prefixes):
                return False
        return True

    def describe(self) -> str:
        """A short human description of the selection, for messages."""
        if self.is_default:
            return "NVIDIA and AMD GPUs (vendor 0x10de/0x1002, class 0x0300/0x0302/0x0380/0x1200)"
        parts = []
        if self.vendors:
            parts.append("vendor %s" % "/".join(self.vendors))
        if self.device:
            parts.append("device %s" % self.device)
        if self.class_prefixes:
            parts.append("class prefix %s" % "/".join(self.class_prefixes))
        if self.bdfs:
            parts.append("bdfs %s" % ", ".join(self.bdfs))
        return ", ".join(parts)


def gpu_vendor(dev: dict) -> str | None:
    """``"nvidia"`` or ``"amd"`` for a device dict that is a GPU of ``GPU_VENDORS`` by vendor and class, else None."""
    try:
        vendor, cls = _as_hex(dev.get("vendor"), 4), _as_hex(dev.get("class"), 6)[2:]
    except (TypeError, ValueError):
        return None
    if vendor not in GPU_VENDORS or not any(cls.startswith(p) for p in GPU_CLASS_PREFIXES):
        return None
    if vendor == NVIDIA_VENDOR and cls[:4] not in NVIDIA_GPU_CLASS_PREFIXES:
        return None
    return GPU_VENDORS[vendor]


def _as_hex(value, digits):
    if isinstance(value, int):
        return "0x%0*x" % (digits, value)
    return "0x%0*x" % (digits, int(str(value), 16))


# -- Reading the node


def _read_int(text, default):
    try:
        return int(text, 0)
    except (TypeError, ValueError):
        return default


def list_devices(node: Node) -> list[dict]:
    """Every PCI function of the node, sorted by BDF, from sysfs attribute files."""
    devices = []
    for bdf in node.listdir(SYSFS_PCI_DEVICES):
        vendor = node.read(SYSFS_PCI_DEVICES, bdf, "vendor", default="")
        if not vendor:
            continue
        devices.append({
            "bdf": bdf.lower(),
            "vendor": vendor.lower(),
            "device": node.read(SYSFS_PCI_DEVICES, bdf, "device", default="0x0000").lower(),
            "class": node.read(SYSFS_PCI_DEVICES, bdf, "class", default="0x000000").lower(),
            "numa_node": _read_int(node.read(SYSFS_PCI_DEVICES, bdf, "numa_node", default="-1"), -1),
            "path": node.path(SYSFS_PCI_DEVICES, bdf),
        })
    return devices


def read_config(dev: dict) -> bytes:
    """The config space bytes of a device dict (``path/config``); NodeError when unreadable."""
    full = os.path.join(dev["path"], "config")
    try:
        with open(full, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise NodeError("cannot read %s: %s" % (full, exc.strerror or exc)) from exc


def pcie_bus_perf(node: Node) -> bool:
    """True when the kernel was booted with ``pci=pcie_bus_perf`` (it clamps MRRS to MPS)."""
    for arg in cmdline_args(node):
        if arg.startswith("pci=") and "pcie_bus_perf" in arg[4:].split(","):
            return True
    return False


# -- setpci


class Setpci:
    """Batched setpci calls: one process reads or writes Device Control of many devices."""

    # Arguments per process: keeps the command line far below ARG_MAX on any node.
    BATCH = 512

    def __init__(self, run, binary, extra_args=()):
        self.run = run
        self.binary = binary
        self.extra_args = list(extra_args)
        self.calls = 0

    def _argv(self, groups):
        argv = [self.binary] + self.extra_args
        for bdf, op in groups:
            argv += ["-s", bdf, op]
        return argv

    def read_devctl(self, bdfs: list[str]) -> tuple[dict, dict]:
        """Read Device Control of each BDF: ``({bdf: int}, {bdf: error message})``."""
        values, errors = {}, {}
        bdfs = list(bdfs)
        for start in range(0, len(bdfs), self.BATCH):
            chunk = bdfs[start:start + self.BATCH]
            rc, out, err = self._call([(b, SETPCI_DEVCTL_REG) for b in chunk])
            lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
            if rc == 0 and len(lines) == len(chunk) and all(re.match(r"^[0-9a-fA-F]{4}$", v) for v in lines):
                values.update((b, int(v, 16)) for b, v in zip(chunk, lines))
                continue
            if len(chunk) == 1:
                errors[chunk[0]] = "setpci read failed (rc %s): %s" % (rc, (err or out).strip() or "no output")
                continue
            # Output cannot be mapped to devices (one vanished or failed): ask each one alone.
            for b in chunk:
                v, e = self.read_devctl([b])
                values.update(v)
                errors.update(e)
        return values, errors

    def write_mrrs(self, targets: dict) -> tuple[int, str]:
        """Write MRRS (mask 0x7000 only) for ``{bdf: bytes}``; returns ``(rc, stderr)`` of the last batch that failed,
        or ``(0, "")``."""
        items = sorted(targets.items())
        result = (0, "")
        for start in range(0, len(items), self.BATCH):
            chunk = items[start:start + self.BATCH]
            rc, _stdout, err = self._call([(b, setpci_mrrs_assignment(size)) for b, size in chunk])
            if rc != 0 or err.strip():
                result = (rc, err.strip())
        return result

    def _call(self, groups):
        self.calls += 1
        return self.run(self._argv(groups))


# -- Faults of one device: each failed device is named with its own cause

_ROOT_HINT = "run the module as root (become: true)"


def _not_root():
    return hasattr(os, "geteuid") and os.geteuid() != 0


def not_responding(cfg: bytes) -> str | None:
    """Why a device that reads all ``0xff`` (or vendor id ``ffff``) has stopped answering; None when it answers."""
    cfg = bytes(cfg)
    if len(cfg) < 2 or cfg[:2] != b"\xff\xff":
        return None
    if cfg.count(0xFF) == len(cfg):
        return "not responding: config space reads 0xff (the device fell off the bus or lost power)"
    return "not responding: vendor id reads ffff (the device fell off the bus or lost power)"


def config_fault(cfg: bytes) -> str | None:
    """Why config bytes read in full are unusable: the device does not respond, or they are too short to hold
    the PCIe capability; None when usable."""
    dead = not_responding(cfg)
    if dead:
        return dead
    size = len(cfg)
    if size >= 0x100:
        return None
    if size >= 0x40:
        if not struct.unpack_from("<H", cfg, PCI_STATUS)[0] & PCI_STATUS_CAP_LIST:
            return None
        cap = find_capability(cfg, PCI_CAP_ID_EXP)
        if cap is not None and cap + PCI_EXP_LNKSTA + 2 <= size:
            return None
    msg = "config space is only %d bytes: the device is not fully visible (no PCIe capability readable)" % size
    if _not_root():
        msg += "; only root reads past the 64-byte header: " + _ROOT_HINT
    return msg


def _access_fault(dev_path, exc):
    """The cause of an OSError on a device's config file, classified."""
    full = os.path.join(dev_path, "config")
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        gone = full if os.path.isdir(dev_path) else dev_path
        return "device vanished: %s is gone (hot-removed or reset while the task ran)" % gone
    if isinstance(exc, IsADirectoryError):
        return "config space unreadable: %s is a directory, not the device's config file" % full
    msg = "cannot access %s: %s" % (full, exc.strerror or exc)
    if exc.errno in (errno.EPERM, errno.EACCES) and _not_root():
        msg += "; " + _ROOT_HINT
    return msg


def write_fault(dev: dict) -> str | None:
    """Why the config file of ``dev`` cannot be opened for writing; None when it can."""
    full = os.path.join(dev["path"], "config")
    cause = write_refusal(full)
    if cause is None:
        return None
    msg = "write refused: cannot open %s for writing (%s)" % (full, cause.strerror or cause)
    if _not_root():
        return msg + "; " + _ROOT_HINT
    if cause.errno == errno.EPERM:
        return msg + ": the file is immutable or the kernel forbids config-space writes"
    if cause.errno == errno.EROFS:
        return msg + ": sysfs is mounted read-only"
    return msg


def inspect_device(dev: dict) -> tuple[dict | None, str | None]:
    """Read and decode a device's config space: ``(decode_pcie result or None, fault or None)``."""
    try:
        with open(os.path.join(dev["path"], "config"), "rb") as fh:
            cfg = fh.read()
    except OSError as exc:
        return None, _access_fault(dev["path"], exc)
    fault = config_fault(cfg)
    if fault:
        return None, fault
    return decode_pcie(cfg), None


def failure_cause(dev, want, got, read_error, write_error):
    """Why ``want`` is not what ``dev`` reads back after writing: its own fault, first found."""
    _pcie, fault = inspect_device(dev)
    fault = fault or write_fault(dev)
    if fault:
        return fault
    if write_error:
        msg = "write refused: setpci %s" % write_error
        return msg + "; " + _ROOT_HINT if _not_root() else msg
    if got is None:
        return "read-back failed: %s" % read_error
    return ("wrote MRRS %d but Device Control reads back 0x%04x (MRRS %s): the write did not take "
            "(the device ignored it)" % (want, got, mrrs_of_devctl(got)))


class SelectionError(ValueError):
    """A selection that names devices the node does not have; nothing has been written."""

    def __init__(self, msg, result=None):
        super().__init__(msg)
        self.result = result or {}


def select_devices(node: Node, selector: DeviceSelector) -> list[dict]:
    """Devices matching ``selector``; raises SelectionError when named BDFs are absent from the node."""
    devices = list_devices(node)
    if selector.bdfs:
        present = {d["bdf"] for d in devices}
        missing = [b for b in selector.bdfs if b not in present]
        if missing:
            raise SelectionError("bdfs not present on the node: %s (present: %s)"
                                 % (", ".join(missing), ", ".join(sorted(present)) or "none"))
    return [d for d in devices if selector.matches(d)]


# -- The ACS extended capability and the bridges above a device (peer-to-peer traffic between GPUs)


def find_ext_capability(cfg: bytes, cap_id: int) -> int | None:
    """Offset of the first extended capability ``cap_id`` (walked from 0x100), None when absent."""
    pos = EXT_CAP_START
    for _step in range((len(cfg) - EXT_CAP_START) // 8 + 1):
        if pos < EXT_CAP_START or pos + 4 > len(cfg):
            return None
        header = struct.unpack_from("<I", cfg, pos)[0]
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return pos
        pos = (header >> 20) & 0xFFC
    return None


def acs_bits(value: int) -> dict:
    """``{SrcValid: bool, ...}`` of an ACSCap or ACSCtl value."""
    return {name: bool(value >> bit & 1) for name, bit in ACS_BITS}


def describe_acs(value: int) -> str:
    """``SrcValid+ TransBlk- ...`` as ``lspci -vvv`` prints an ACS register."""
    return " ".join("%s%s" % (name, "+" if value >> bit & 1 else "-") for name, bit in ACS_BITS)


def decode_acs(cfg: bytes) -> dict | None:
    """The ACS capability of a config space: offset, ACSCap and ACSCtl (raw and decoded); None if absent."""
    pos = find_ext_capability(bytes(cfg), PCI_EXT_CAP_ID_ACS)
    if pos is None or pos + ACS_CTRL + 2 > len(cfg):
        return None
    cap, ctl = struct.unpack_from("<HH", cfg, pos + ACS_CAP)
    return {"offset": pos, "cap": cap, "ctl": ctl, "cap_bits": acs_bits(cap), "ctl_bits": acs_bits(ctl),
            "redirect": bool(ctl & ACS_REDIRECT_MASK)}


def device_dir(node: Node, bdf: str) -> str:
    """The real sysfs directory of a PCI function (its /sys/bus/pci/devices link resolved)."""
    return os.path.realpath(node.path(SYSFS_PCI_DEVICES, bdf))


def bridge_chain(node: Node, bdf: str) -> list:
    """``[(bridge bdf, its sysfs dir)]`` from the root port down to the device's parent."""
    path = device_dir(node, bdf)
    base = os.path.realpath(node.path("sys/devices"))
    rel = os.path.relpath(path, base) if path.startswith(base + os.sep) else path
    chain, prefix = [], base if path.startswith(base + os.sep) else ""
    for part in rel.split(os.sep):
        prefix = os.path.join(prefix, part) if prefix else part
        if _BDF_COMPONENT.match(part.lower()):
            chain.append((part.lower(), prefix))
    return chain[:-1] if chain and chain[-1][0] == bdf else chain


def listed(node: Node, query: object = None) -> list:
    """The node's PCI functions: those a FactsQuery listed once for every family, else ``list_devices``."""
    devices = getattr(query, "devices", None)
    return list(devices) if devices is not None else list_devices(node)


# -- The IOMMU that translates the devices' DMA


def iommu_group(node: Node, bdf: str) -> tuple:
    """``(group, default domain type)`` of a PCI function (``identity``, ``DMA``, ``DMA-FQ``); None for unknown."""
    try:
        group = os.path.basename(os.readlink(os.path.join(device_dir(node, bdf), "iommu_group")))
    except OSError:
        return None, None
    return group, node.read("sys/kernel/iommu_groups", group, "type", default="") or None
