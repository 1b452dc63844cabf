# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCI devices of a node: listing, selection, PCI Express capability decoding, and MRRS tuning.

Reading is pure Python over sysfs files (``vendor``, ``device``, ``class``, ``numa_node``,
``config``); writing goes through ``setpci`` so that the kernel's config-space access path is
the one real operators use. Nothing here imports Ansible: errors are ``ValueError`` (bad input)
or ``NodeError`` (unreadable node), and the setpci runner is any callable
``run(argv) -> (rc, stdout, stderr)``.

Device dicts (``list_devices``) use the sysfs spelling for ids: ``vendor`` ``"0x10de"``,
``device`` ``"0x2bb5"``, ``class`` ``"0x030200"`` (lower-case hex strings, 24-bit class with
prog-if), ``numa_node`` an int (-1 when the platform has no NUMA information), ``bdf`` the
domain-qualified address ``"0000:41:00.0"`` and ``path`` the device's sysfs directory.
"""

from __future__ import annotations

import errno
import os
import re
import struct
from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils import command
from ansible_collections.gpunode.tuning.plugins.module_utils import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.family import Family, SystemLookup, run_argv, setting
from ansible_collections.gpunode.tuning.plugins.module_utils.journal import JOURNAL_ARGUMENT_SPEC, Journal, open_node
from ansible_collections.gpunode.tuning.plugins.module_utils.node import (
    NODE_ARGUMENT_SPEC,
    SYSFS_PCI_DEVICES,
    Node,
    NodeError,
    cmdline_args,
    lockdown_mode,
    write_refusal,
)

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
DEVCTL_BCR_FLR = 0x8000  # never written: on endpoints it initiates a Function Level Reset

MRRS_CHOICES = (128, 256, 512, 1024, 2048, 4096)
SETPCI_DEVCTL_REG = "CAP_EXP+08.w"

NVIDIA_VENDOR = "0x10de"
NVIDIA_GPU_CLASS_PREFIXES = ("0300", "0302")

PCIE_PORT_TYPES = {
    0x0: "endpoint", 0x1: "legacy_endpoint", 0x4: "root_port", 0x5: "upstream_port",
    0x6: "downstream_port", 0x7: "pci_bridge", 0x8: "pcie_bridge", 0x9: "rc_integrated_endpoint",
    0xA: "rc_event_collector",
}
LINK_SPEEDS = {1: "2.5 GT/s", 2: "5.0 GT/s", 3: "8.0 GT/s", 4: "16.0 GT/s", 5: "32.0 GT/s", 6: "64.0 GT/s"}

_BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([01][0-9a-fA-F])\.([0-7])$")
_HEX_RE = re.compile(r"^(?:0[xX])?([0-9a-fA-F]+)$")

FAMILY = "pcie_mrrs"


# ---------------------------------------------------------------------------------------------
# Encoding and decoding
# ---------------------------------------------------------------------------------------------


def encode_mrrs(size: int) -> int:
    """Return the Device Control MRRS field (0..5) for a size in bytes (128..4096).

    Raises ``ValueError`` naming the allowed sizes for anything else.
    """
    if isinstance(size, bool) or size not in MRRS_CHOICES:
        raise ValueError("mrrs must be one of %s bytes, got %r" % (", ".join(str(c) for c in MRRS_CHOICES), size))
    return MRRS_CHOICES.index(size)


def decode_mrrs(field: int) -> int:
    """Return the size in bytes of an MRRS (or MPS) field value 0..7: ``128 << field``.

    The encodings 6 and 7 are reserved by the specification: they return None.
    """
    if isinstance(field, bool) or not isinstance(field, int) or not 0 <= field <= 7:
        raise ValueError("an MRRS field is 3 bits (0..7), got %r" % (field,))
    return 128 << field if field <= 5 else None


def mrrs_of_devctl(devctl: int) -> int | None:
    """MRRS in bytes encoded in a Device Control value (None when reserved)."""
    return decode_mrrs((devctl & DEVCTL_MRRS_MASK) >> DEVCTL_MRRS_SHIFT)


def mps_of_devctl(devctl: int) -> int | None:
    """MPS in bytes encoded in a Device Control value (None when reserved)."""
    return decode_mrrs((devctl & DEVCTL_MPS_MASK) >> 5)


def devctl_with_mrrs(devctl: int, size: int) -> int:
    """Device Control value ``devctl`` with only its MRRS field replaced by ``size`` bytes."""
    return (devctl & ~DEVCTL_MRRS_MASK & 0xFFFF) | (encode_mrrs(size) << DEVCTL_MRRS_SHIFT)


def setpci_mrrs_assignment(size: int) -> str:
    """The setpci ``value:mask`` write of an MRRS, e.g. ``CAP_EXP+08.w=5000:7000`` for 4096.

    The mask is exactly 0x7000: MPS (bits 7:5) and bit 15 (FLR on endpoints) are never written.
    """
    return "%s=%04x:%04x" % (SETPCI_DEVCTL_REG, encode_mrrs(size) << DEVCTL_MRRS_SHIFT, DEVCTL_MRRS_MASK)


def find_capability(config_bytes: bytes, cap_id: int) -> int | None:
    """Offset of the first capability ``cap_id`` in the standard list, or None when absent.

    Walks from the pointer at 0x34 (only when the Status register says a list exists), guarding
    against loops and pointers into the header, as the kernel's ``pci_find_capability`` does.
    """
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
    """Decode the PCI Express capability of a config space; None when the device has none.

    Returns a dict:
    ``cap_offset`` (int), ``port_type`` (str, e.g. endpoint, root_port), ``devcap`` (int),
    ``devcap_mps_max`` (largest supported MPS, bytes), ``devctl`` (int), ``mps`` and ``mrrs``
    (bytes, None for a reserved encoding), ``link_speed_capable`` / ``link_speed_current``
    (``"32.0 GT/s"``, None when unknown), ``link_speed_capable_code`` / ``link_speed_current_code``
    (the register's speed code, 1 = 2.5 GT/s ... 6 = 64 GT/s), ``link_width_capable`` /
    ``link_width_current`` (lanes, int).
    """
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


_LSPCI_SLOT_RE = re.compile(r"^([0-9a-fA-F]{4}:)?([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")
_LSPCI_SIZES_RE = re.compile(r"MaxPayload (\d+) bytes, MaxReadReq (\d+) bytes")


def parse_lspci_devctl(text: str) -> dict:
    """Parse ``lspci -vvv`` (or ``-D -vvv``) output into ``{bdf: {"mps": int, "mrrs": int}}``.

    The sizes are those of the ``DevCtl:`` block (its ``MaxPayload N bytes, MaxReadReq M bytes``
    line); the ``DevCap:`` line shows what is supported, not what is set, and has no MaxReadReq.
    BDFs printed without a domain get ``0000:``.
    """
    out = {}
    bdf = None
    for line in text.splitlines():
        m = _LSPCI_SLOT_RE.match(line)
        if m:
            bdf = (m.group(1) or "0000:").lower() + m.group(2).lower()
            continue
        sizes = _LSPCI_SIZES_RE.search(line)
        if sizes and bdf:
            out[bdf] = {"mps": int(sizes.group(1)), "mrrs": int(sizes.group(2))}
    return out


# ---------------------------------------------------------------------------------------------
# Input validation and selection
# ---------------------------------------------------------------------------------------------


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
    """``[(key, message)]`` of the PCI selector keys ``vendor``, ``device``, ``class_prefixes``, ``bdfs``.

    The rules are ``DeviceSelector``'s (normalize_hex_id, normalize_class_prefix, normalize_bdf), applied
    to every value so that one message lists them all. Shared by setpci_mrrs, pcie_acs and the desired
    state's ``pcie_mrrs`` and ``pcie_acs`` entries; no node is read.
    """
    out = []
    for key in ("vendor", "device"):
        value = want.get(key)
        if value is not None:
            try:
                normalize_hex_id(value, key)
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


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["pcie_mrrs"]``: ``{mrrs, vendor, device, class_prefixes, bdfs,
    allow_empty}``."""
    shape = contract.entry_problem(FAMILY, want, "mrrs, vendor, device, class_prefixes, bdfs, allow_empty")
    if shape or want is None:
        return shape
    out = []
    try:
        encode_mrrs(want.get("mrrs"))
    except ValueError as exc:
        out.append(("mrrs", str(exc)))
    return out + selector_problems(want)


class DeviceSelector:
    """Which PCI functions a task applies to. Every given criterion must match (AND).

    ``vendor`` / ``device``: hex ids (``"10de"``, ``"0x10de"`` or int); ``class_prefixes``:
    list of 2/4/6-hex-digit class prefixes matched against the 24-bit class; ``bdfs``: list of
    addresses (``DDDD:BB:DD.F`` or ``BB:DD.F``). With no criterion at all the selector is the
    default: NVIDIA GPUs, vendor 0x10de with class 0x0300 or 0x0302 (not their HDMI-audio
    functions, not NVSwitch bridges). Raises ``ValueError`` on malformed input.
    """

    def __init__(self, vendor=None, device=None, class_prefixes=None, bdfs=None):
        self.is_default = vendor is None and device is None and not class_prefixes and not bdfs
        if self.is_default:
            vendor, class_prefixes = NVIDIA_VENDOR, list(NVIDIA_GPU_CLASS_PREFIXES)
        self.vendor = normalize_hex_id(vendor, "vendor") if vendor is not None else None
        self.device = normalize_hex_id(device, "device") if device is not None else None
        self.class_prefixes = [normalize_class_prefix(c) for c in class_prefixes] if class_prefixes else None
        self.bdfs = [normalize_bdf(b) for b in bdfs] if bdfs else None

    @classmethod
    def nvidia_gpus(cls) -> DeviceSelector:
        """The default selector: NVIDIA display/3D controllers."""
        return cls()

    def matches(self, dev: dict) -> bool:
        """True when a device dict (as from ``list_devices``) matches every given criterion."""
        if self.bdfs is not None and dev["bdf"] not in self.bdfs:
            return False
        if self.vendor is not None and _as_hex(dev["vendor"], 4) != self.vendor:
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
            return "NVIDIA GPUs (vendor 0x10de, class 0x0300/0x0302)"
        parts = []
        if self.vendor:
            parts.append("vendor %s" % self.vendor)
        if self.device:
            parts.append("device %s" % self.device)
        if self.class_prefixes:
            parts.append("class prefix %s" % "/".join(self.class_prefixes))
        if self.bdfs:
            parts.append("bdfs %s" % ", ".join(self.bdfs))
        return ", ".join(parts)


def _as_hex(value, digits):
    if isinstance(value, int):
        return "0x%0*x" % (digits, value)
    return "0x%0*x" % (digits, int(str(value), 16))


# ---------------------------------------------------------------------------------------------
# Reading the node
# ---------------------------------------------------------------------------------------------


def _read_int(text, default):
    try:
        return int(text, 0)
    except (TypeError, ValueError):
        return default


def list_devices(node: Node) -> list[dict]:
    """Every PCI function of the node, sorted by BDF, from sysfs attribute files.

    Each dict: ``bdf``, ``vendor``, ``device``, ``class`` (sysfs hex strings, see the module
    docstring), ``numa_node`` (int, -1 unknown) and ``path`` (the device's sysfs directory).
    The config space is not read here (see ``read_config``).
    """
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


# ---------------------------------------------------------------------------------------------
# setpci
# ---------------------------------------------------------------------------------------------


class Setpci:
    """Batched setpci calls: one process reads or writes Device Control of many devices.

    ``run`` is ``run(argv) -> (rc, stdout, stderr)`` (the module passes ``run_command`` with
    ``LC_ALL=C``); ``binary`` the setpci path; ``extra_args`` e.g. ``Node.pciutils_args()``.
    setpci takes several ``-s BDF REG`` groups on one command line and prints one value per
    line for each read, in order.
    """

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
        """Write MRRS (mask 0x7000 only) for ``{bdf: bytes}``; returns ``(rc, stderr)`` of the last batch
        that failed, or ``(0, "")``. Success per device is decided by reading back."""
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


# ---------------------------------------------------------------------------------------------
# Faults of one device: each failed device is named with its own cause
# ---------------------------------------------------------------------------------------------

_ROOT_HINT = "run the module as root (become: true)"


def _not_root():
    return hasattr(os, "geteuid") and os.geteuid() != 0


def not_responding(cfg: bytes) -> str | None:
    """Why a device that reads all ``0xff`` (or vendor id ``ffff``) has stopped answering; None when it answers.

    A function that fell off the bus (an Xid 79 GPU, a link down, a device reset that never completed)
    answers config reads with all ones: lspci shows ``rev ff`` and ``Unknown header type 7f``, while sysfs
    still has the vendor and class the kernel read at enumeration.
    """
    cfg = bytes(cfg)
    if len(cfg) < 2 or cfg[:2] != b"\xff\xff":
        return None
    if cfg.count(0xFF) == len(cfg):
        return "not responding: config space reads 0xff (the device fell off the bus or lost power)"
    return "not responding: vendor id reads ffff (the device fell off the bus or lost power)"


def config_fault(cfg: bytes) -> str | None:
    """Why config bytes read in full are unusable: the device does not respond, or they are too short to hold
    the PCIe capability; None when usable.

    A config file is 256 or 4096 bytes for root; the kernel shows only the 64-byte header to
    other users. A device without a capability list needs no more than its header.
    """
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
    """Why the config file of ``dev`` cannot be opened for writing; None when it can.

    ``write_refusal`` (the probe every check mode shares) names the errno; the root hint is
    given only to a process that is not root.
    """
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


def _failure_cause(dev, want, got, read_error, write_error):
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


# ---------------------------------------------------------------------------------------------
# The MRRS task: plan, journal, write, read back
# ---------------------------------------------------------------------------------------------


class MrrsError(Exception):
    """The task cannot proceed; nothing has been written. ``result`` holds what was found."""

    def __init__(self, msg, result=None):
        super().__init__(msg)
        self.result = result or {}


def _device_result(dev, pcie):
    return {
        "bdf": dev["bdf"],
        "vendor": dev["vendor"],
        "device": dev["device"],
        "class": dev["class"],
        "numa_node": dev["numa_node"],
        "mps": pcie["mps"] if pcie else None,
        "mrrs_before": pcie["mrrs"] if pcie else None,
        "mrrs_after": pcie["mrrs"] if pcie else None,
        "changed": False,
        "skipped": False,
        "failed": False,
        "reason": "",
    }


def _absent_result(bdf):
    return {"bdf": bdf, "vendor": None, "device": None, "class": None, "numa_node": None, "mps": None,
            "mrrs_before": None, "mrrs_after": None, "changed": False, "skipped": True, "failed": False,
            "reason": "recorded in the journal but not present on the node; journal entry kept"}


def select_devices(node: Node, selector: DeviceSelector) -> list[dict]:
    """Devices matching ``selector``; raises MrrsError when named BDFs are absent from the node."""
    devices = list_devices(node)
    if selector.bdfs:
        present = {d["bdf"] for d in devices}
        missing = [b for b in selector.bdfs if b not in present]
        if missing:
            raise MrrsError("bdfs not present on the node: %s (present: %s)"
                            % (", ".join(missing), ", ".join(sorted(present)) or "none"))
    return [d for d in devices if selector.matches(d)]


def _restore_wanted(node, journal, base):
    """The journal's originals and the devices to restore; absent devices are reported skipped."""
    originals = journal.entries(FAMILY)
    bad = {b: v for b, v in originals.items() if v not in MRRS_CHOICES}
    if bad:
        raise MrrsError("journal %s holds invalid MRRS originals %s (allowed %s); fix or remove those entries"
                        % (journal.path, bad, ", ".join(map(str, MRRS_CHOICES))), base)
    by_bdf = {d["bdf"]: d for d in list_devices(node)}
    for bdf in sorted(set(originals) - set(by_bdf)):
        base["devices"].append(_absent_result(bdf))
        base["warnings"].append("%s: %s" % (bdf, base["devices"][-1]["reason"]))
    return originals, [by_bdf[b] for b in sorted(originals) if b in by_bdf]


def _plan(devices, wanted, base):
    """Inspect ``devices`` and fill ``base["devices"]``; return ``{bdf: target}`` and ``{bdf: (dev, devctl)}``.

    A device whose config space is unusable, or not writable where a write is needed, is
    failed here with its cause and left out of the targets, so it cannot stop the others.
    """
    targets, planned = {}, {}
    for dev in devices:
        pcie, fault = inspect_device(dev)
        r = _device_result(dev, pcie)
        base["devices"].append(r)
        planned[dev["bdf"]] = (dev, pcie["devctl"] if pcie else None)
        want = wanted[dev["bdf"]]
        if fault is None and pcie is not None and pcie["mrrs"] != want:
            fault = write_fault(dev)
        if fault:
            r["failed"], r["reason"] = True, fault
        elif pcie is None:
            r["skipped"], r["reason"] = True, "no PCI Express capability"
        elif pcie["mrrs"] == want:
            r["reason"] = "already %d" % want
        else:
            targets[dev["bdf"]] = want
            r["mrrs_after"], r["changed"] = want, True
    base["devices"].sort(key=lambda r: r["bdf"])
    return targets, planned


def _diff(results):
    diff = {"before": {}, "after": {}}
    for r in results:
        if not r["skipped"] and r["mrrs_before"] is not None:
            diff["before"][r["bdf"]] = {"mrrs": r["mrrs_before"]}
            diff["after"][r["bdf"]] = {"mrrs": r["mrrs_after"]}
    return diff


def _journal_plan(journal, restore, check_mode, base, targets):
    """Record originals of what will change, or drop restore entries that are already back."""
    if journal is None or check_mode:
        return
    for r in base["devices"]:
        if restore and not r["skipped"] and not r["failed"] and r["bdf"] not in targets:
            journal.drop(FAMILY, r["bdf"])
            r["reason"] = "already at the recorded original %d" % r["mrrs_before"]
        elif not restore and r["bdf"] in targets and r["mrrs_before"] is not None:
            journal.record(FAMILY, r["bdf"], r["mrrs_before"])  # a reserved encoding cannot be restored


def _base_result(node):
    bus_perf = pcie_bus_perf(node)
    warnings = []
    if bus_perf:
        warnings.append("the kernel command line has pci=pcie_bus_perf: it sets MRRS to MPS at boot and clamps "
                        "later requests to MPS, so MRRS set here may be lowered again; remove it for large MRRS")
    return {"lockdown": lockdown_mode(node), "pcie_bus_perf": bus_perf, "warnings": warnings, "devices": [],
            "failed_devices": [], "changed": False}


def run_mrrs(node: Node, setpci_factory: Callable[[], Setpci], journal: Journal | None, check_mode: bool,
             mrrs: int | None = None, selector: DeviceSelector | None = None, restore: bool = False,
             allow_empty: bool = False) -> dict:
    """Apply ``mrrs`` to the devices chosen by ``selector`` (or restore the journal's originals).

    ``setpci_factory()`` returns a ``Setpci``; it is called only when something must be written,
    so check mode and idempotent runs start no process. Returns the result dict (``devices``,
    ``failed_devices``, ``changed``, ``lockdown``, ``pcie_bus_perf``, ``warnings``, ``diff``).
    Raises MrrsError, before any write, when the task cannot proceed. A device that cannot be
    set (predicted before writing, also in check mode, or found after) is listed in
    ``failed_devices`` with its cause while every other device is still set; the caller fails
    the task at the end (``failure_message``).
    """
    if not restore:
        encode_mrrs(mrrs)  # ValueError naming the allowed sizes
        selector = selector or DeviceSelector()
    base = _base_result(node)
    if restore:
        wanted, devices = _restore_wanted(node, journal, base)
    else:
        devices = select_devices(node, selector)
        wanted = {d["bdf"]: mrrs for d in devices}
    targets, planned = _plan(devices, wanted, base)
    base["failed_devices"] = [r["bdf"] for r in base["devices"] if r["failed"]]
    named = set(selector.bdfs or []) if not restore else set()
    base["warnings"] += ["%s: MRRS does not apply: it was named in bdfs but has no PCI Express capability (a "
                         "conventional PCI function); it was skipped" % r["bdf"]
                         for r in base["devices"] if r["skipped"] and r["bdf"] in named]
    if not restore and all(r["skipped"] for r in base["devices"]) and not allow_empty:
        raise MrrsError("no PCI Express device matches the selection (%s); set allow_empty: true to accept "
                        "a node without such devices" % selector.describe(), base)
    base["diff"] = _diff(base["devices"])
    if targets and base["lockdown"] in ("integrity", "confidentiality"):
        raise MrrsError("kernel lockdown is in %s mode: the kernel refuses PCI config-space writes from user "
                        "space, so MRRS cannot be changed at runtime on %s; nothing was written. Set MRRS in "
                        "the BIOS, or boot without lockdown" % (base["lockdown"], ", ".join(sorted(targets))), base)
    _journal_plan(journal, restore, check_mode, base, targets)
    base["changed"] = bool(targets)
    if check_mode or not targets:
        if journal is not None and not check_mode:
            journal.save()
        return base
    if journal is not None:
        try:
            journal.save()  # before the first config-space write: originals survive a crash
        except OSError as exc:
            raise MrrsError("cannot save the journal %s (%s); nothing was written" % (journal.path, exc), base) \
                from exc
    _apply(setpci_factory(), targets, planned, base, journal if restore else None)
    return base


def _write_and_read_back(setpci, targets, warnings):
    """One setpci process writes every target and one reads them back (the normal path).

    setpci stops at the first device it cannot write, leaving the ones after it unwritten:
    after a failed batch, each device not yet at its target is written alone, so a bad device
    neither keeps the others at their old value nor lends them its error. Returns
    ``(after {bdf: devctl}, read_errors {bdf: msg}, write_errors {bdf: msg})``.
    """
    wrc, werr = setpci.write_mrrs(targets)
    after, read_errors = setpci.read_devctl(sorted(targets))
    if not (wrc or werr):
        return after, read_errors, {}
    retry = {b: w for b, w in targets.items() if b in after and mrrs_of_devctl(after[b]) != w}
    write_errors = {}
    for bdf, want in sorted(retry.items()):
        rc, err = setpci.write_mrrs({bdf: want})
        if rc or err:
            write_errors[bdf] = "rc %s: %s" % (rc, err or "no message")
    if retry:
        again, errors = setpci.read_devctl(sorted(retry))
        for bdf in retry:
            after.pop(bdf, None)
        after.update(again)
        read_errors.update(errors)
    if not retry and not read_errors:
        warnings.append("setpci reported an error (rc %s: %s) but every device reads back as written"
                        % (wrc, werr or "no message"))
    return after, read_errors, write_errors


def _apply(setpci, targets, planned, base, restore_journal):
    """Write ``targets``, judge each device by its read-back, name the cause of each failure."""
    after, read_errors, write_errors = _write_and_read_back(setpci, targets, base["warnings"])
    results = {r["bdf"]: r for r in base["devices"]}
    for bdf, want in sorted(targets.items()):
        (dev, devctl_before), r, got = planned[bdf], results[bdf], after.get(bdf)
        r["mrrs_after"] = mrrs_of_devctl(got) if got is not None else None
        r["changed"] = got is not None and r["mrrs_after"] != r["mrrs_before"]
        if got is None or r["mrrs_after"] != want:
            r["failed"] = True
            r["reason"] = _failure_cause(dev, want, got, read_errors.get(bdf), write_errors.get(bdf))
            base["failed_devices"].append(bdf)
            continue
        r["reason"] = "restored" if restore_journal is not None else "set"
        if restore_journal is not None:
            restore_journal.drop(FAMILY, bdf)
        if (got & ~DEVCTL_MRRS_MASK) != (devctl_before & ~DEVCTL_MRRS_MASK):
            # Not written by us (mask 0x7000), e.g. the kernel's AER handling in between.
            base["warnings"].append("%s: Device Control bits outside MRRS changed meanwhile (0x%04x -> 0x%04x)"
                                    % (bdf, devctl_before, got))
    base["failed_devices"].sort()
    base["diff"]["after"].update({b: {"mrrs": results[b]["mrrs_after"]} for b in targets})
    if restore_journal is not None:
        restore_journal.save()
    base["changed"] = any(r["changed"] for r in base["devices"])
    base["setpci_calls"] = setpci.calls


def failure_message(result: dict, restore: bool, check_mode: bool, journal_path: str | None = None) -> str:
    """The task's closing error: every failed device with its cause, and what happened to the rest."""
    failed = [d for d in result["devices"] if d["failed"]]
    done = [d for d in result["devices"] if d["changed"]]
    verb = "restored" if restore else "set"
    msg = "MRRS could not be %s on %d device(s): %s" % (
        verb, len(failed), "; ".join("%s: %s" % (d["bdf"], d["reason"]) for d in failed))
    if check_mode:
        msg = "check mode: a real run would fail. " + msg
        tail = "%d other device(s) would be %s" % (len(done), verb)
    else:
        tail = "%d other device(s) were %s" % (len(done), verb)
    if restore and journal_path:
        tail += "; the failed entries stay in the journal %s for the next attempt" % journal_path
    return msg + ". " + tail


def run(call: contract.Call) -> dict:
    """The setpci_mrrs module: check the options, open the node, ``run_mrrs``; returns the module's result.

    Raises FamilyError (with the result so far) where the module fails: a bad option or root
    before anything is read, a selection or lockdown that stops the task before any write, and
    at the end every device that could not be set (``failure_message``).
    """
    params = call.params
    if params["mrrs"] is None and not params["restore"]:
        raise contract.FamilyError("mrrs is required (one of %s bytes) unless restore=true"
                                   % ", ".join(str(c) for c in MRRS_CHOICES))
    problems = selector_problems(params)
    if params["mrrs"] is not None:
        try:
            encode_mrrs(params["mrrs"])
        except ValueError as exc:
            problems.insert(0, ("mrrs", str(exc)))
    if problems:
        raise contract.FamilyError("invalid input, nothing was written: %s" % contract.problems_text(problems))
    selector = DeviceSelector(vendor=params["vendor"], device=params["device"],
                              class_prefixes=params["class_prefixes"], bdfs=params["bdfs"])
    node, journal = open_node(params)
    try:
        setpci_bin = node.bin_path(call.lookup, "setpci", "pciutils")
    except NodeError as exc:
        raise contract.FamilyError(str(exc)) from None

    def setpci_factory():
        return Setpci(call.run_command, setpci_bin, node.pciutils_args())

    try:
        result = run_mrrs(node, setpci_factory, journal, call.check_mode, mrrs=params["mrrs"], selector=selector,
                          restore=params["restore"], allow_empty=params["allow_empty"])
    except MrrsError as exc:
        _warn(call, exc.result)
        raise contract.FamilyError(str(exc), _public(call, exc.result, changed=False)) from None
    except NodeError as exc:
        raise contract.FamilyError(str(exc), {"changed": False}) from None
    _warn(call, result)
    if result["failed_devices"]:
        raise contract.FamilyError(failure_message(result, params["restore"], call.check_mode,
                                                   journal.path if journal else None), _public(call, result))
    return _public(call, result)


def _warn(call, result):
    for warning in result.get("warnings", []):
        call.warn(warning)


def _public(call, result, **overrides):
    """The module's result keys (``warnings`` go through ``call.warn``, the diff only when asked)."""
    out = dict(
        changed=result.get("changed", False),
        devices=result.get("devices", []),
        failed_devices=result.get("failed_devices", []),
        lockdown=result.get("lockdown"),
        pcie_bus_perf=result.get("pcie_bus_perf", False),
        setpci_calls=result.get("setpci_calls", 0),
    )
    out.update(overrides)
    if call.diff and "diff" in result:
        out["diff"] = result["diff"]
    return out

# --- verification and boot: the rows of this family's settings, and its re-apply at boot ---


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """One setting per selected PCI device: its MRRS against ``desired['pcie_mrrs']['mrrs']``."""
    wanted = desired.get(FAMILY) or {}
    if wanted.get("mrrs") is None:
        return []
    pci = facts.get("pci") or {}
    want = int(wanted["mrrs"])
    lockdown = (facts.get("kernel") or {}).get("lockdown")
    out = []
    devices = pci.get("devices") or []
    if not devices:
        return [setting(FAMILY, "devices", want, None, "not_applicable",
                        "no PCI device matches the selector (%s)" % (pci.get("selector") or "NVIDIA GPUs"))]
    for dev in devices:
        running = dev.get("mrrs")
        persisted = ctx.boot_persisted(want)
        if running is None:
            out.append(setting(FAMILY, dev["bdf"], want, None, "unsupported",
                               dev.get("error") or "no PCI Express capability: MRRS does not exist on it",
                               persisted))
            continue
        if running == want:
            out.append(setting(FAMILY, dev["bdf"], want, running, "applied", "", persisted))
            continue
        why = ["MRRS is %d bytes, not %d" % (running, want)]
        if running == 512:
            why.append("512 is the power-up default: nobody tuned this device since it was reset")
        if pci.get("pcie_bus_perf"):
            why.append("the kernel was booted with pci=pcie_bus_perf, which clamps MRRS to MPS (%s)" % dev.get("mps"))
        if lockdown in ("integrity", "confidentiality"):
            why.append("kernel lockdown (%s) refuses config-space writes from user space" % lockdown)
        out.append(setting(FAMILY, dev["bdf"], want, running, "drifted", "; ".join(why), persisted))
    missing = pci.get("missing_bdfs") or []
    for bdf in missing:
        out.append(setting(FAMILY, bdf, want, None, "not_applicable", "the node has no device at %s" % bdf))
    return out


def boot_selector(want: dict, bdf: str | None = None) -> DeviceSelector | None:
    """The module's selector for ``want``; with ``bdf`` (udev) restricted to it, None when not selected."""
    selector = DeviceSelector(vendor=want.get("vendor"), device=want.get("device"),
                              class_prefixes=want.get("class_prefixes"), bdfs=want.get("bdfs"))
    if bdf is None:
        return selector
    bdf = normalize_bdf(bdf)
    if selector.bdfs is not None and bdf not in selector.bdfs:
        return None
    # The default selector is resolved already (vendor 0x10de, GPU classes): keep it with the BDF.
    return DeviceSelector(vendor=selector.vendor, device=selector.device,
                          class_prefixes=selector.class_prefixes, bdfs=[bdf])


def boot(node: Node, want: dict, bdf: str | None = None) -> tuple[bool, str]:
    """``run_mrrs`` without a journal; ``bdf`` restricts it to one device (udev ACTION=add)."""
    size = want.get("mrrs")
    encode_mrrs(size)
    selector = boot_selector(want, bdf)
    if selector is None:
        return True, "%s is not one of the selected bdfs (%s): nothing to do" % (bdf, ", ".join(want["bdfs"]))

    def setpci_factory():
        return Setpci(run_argv, node.bin_path(SystemLookup(), "setpci", "pciutils"), node.pciutils_args())

    allow_empty = bdf is not None or bool(want.get("allow_empty"))
    result = run_mrrs(node, setpci_factory, None, False, mrrs=size, selector=selector,
                      allow_empty=allow_empty)
    notes = "".join("; warning: %s" % w for w in result["warnings"])
    if result["failed_devices"]:
        return False, failure_message(result, False, False) + notes
    done = [d["bdf"] for d in result["devices"] if d["changed"]]
    kept = [d["bdf"] for d in result["devices"] if not d["changed"] and not d["skipped"]]
    if not result["devices"]:
        return True, "no PCI Express device matches (%s)%s" % (selector.describe(), notes)
    return True, "MRRS %d set on %d device(s)%s, %d already at it%s" % (
        size, len(done), (" (%s)" % ", ".join(done)) if done else "", len(kept), notes)


# The options of its module (setpci_mrrs): the flow module completes each family's options with it too.
ARGUMENT_SPEC = dict(
    mrrs=dict(type="int", choices=list(MRRS_CHOICES)),
    vendor=dict(type="str"),
    device=dict(type="str"),
    class_prefixes=dict(type="list", elements="str"),
    bdfs=dict(type="list", elements="str"),
    allow_empty=dict(type="bool", default=False),
    **JOURNAL_ARGUMENT_SPEC,
    **NODE_ARGUMENT_SPEC,
    **command.ARGUMENT_SPEC,
)

def from_role(v: dict, shared: dict) -> dict:
    """The desired MRRS of the role's variables: the value and the GPUs it applies to."""
    if not v["gpunode_tuning_mrrs_enabled"]:
        return {FAMILY: None}
    return {FAMILY: dict(mrrs=v["gpunode_tuning_mrrs"], allow_empty=bool(v["gpunode_tuning_mrrs_allow_empty"]),
                         **shared["selector"])}


def runtime_options(desired: dict, v: dict) -> dict | None:
    """setpci_mrrs' options for the role's runtime flow (the selector's unset keys left out)."""
    want = desired.get(FAMILY)
    return None if want is None else {k: x for k, x in want.items() if x is not None}


def restore_options(v: dict) -> dict:
    return {"restore": True, "allow_empty": True}


def summary(result: dict) -> str:
    """The runtime report's line: how many devices were set, already there, skipped."""
    devices = result.get("devices") or []
    if not devices:
        return "not applicable: no matching PCIe device"
    changed = [d for d in devices if d.get("changed")]
    skipped = [d for d in devices if d.get("skipped")]
    mrrs = next((d.get("mrrs_after") for d in devices if d.get("mrrs_after")), None)
    return "%d set%s, %d already there, %d skipped" % (len(changed), " to %s" % mrrs if mrrs else "",
                                                       len(devices) - len(changed) - len(skipped), len(skipped))


DEFINITION = Family(
    name=FAMILY,
    titles={"pcie_mrrs": "PCIe MRRS"},
    module="setpci_mrrs",
    run=run,
    evaluate=evaluate,
    boot=boot,
    tags=("mrrs",),
    from_role=from_role,
    runtime_options=runtime_options,
    restore_options=restore_options,
    argument_spec=ARGUMENT_SPEC,
    summary=summary,
    validate={FAMILY: desired_problems},
)
