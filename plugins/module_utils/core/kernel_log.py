# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel log: read ``/dev/kmsg`` without blocking, filter by level and time, classify.

``/dev/kmsg`` yields one record per ``read``: ``PRI,SEQ,TS_USEC,FLAGS[,...];MESSAGE\\n``, then
optional continuation lines that start with a space (``SUBSYSTEM=pci`` and the like). The level is
``PRI & 7``; ``PRI >> 3`` is the facility (0 for the kernel, others for messages user space wrote).
A simulated node (tools/simnode.py) has the same records in a regular file at ``<root>/dev/kmsg``.

Parsing is one pass over the bytes: a regular expression anchored on the newline picks only the
records whose priority can be at a wanted level, so a busy node's informational chatter costs no
Python-level work; only the selected records are decoded and classified.

Classes, checked in this order (the first that matches wins):

- ``noise``: an ignore rule matches (a message regex, optionally with a CIDR network that the
  address found in the message must be inside). Checked first so that a known, accepted message
  never counts as trouble.
- ``xid``: ``NVRM: Xid (PCI:0000:41:00): 79, ...`` (the code and the device are extracted).
- ``fallen_off_bus``: ``GPU has fallen off the bus``.
- ``aer``: PCIe Advanced Error Reporting (``PCIe Bus Error: severity=...``, ``AER:``, and the
  ``error status/mask=`` detail lines of the same report).
- ``lockdown``: ``Lockdown: <program>: <what> is restricted``.
- ``module_failure``: ``disagrees about version of symbol``, ``Unknown symbol``,
  ``nvidia-peermem ... ERROR``, ``module verification failed``.
- ``other``: everything else at a selected level.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from typing import Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils.core.kmsg import parse_kmsg  # noqa: F401 (re-exported)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node

# netaddr, imported on first use (_netaddr): only rules with a cidr need it, and a module run that
# never reads the kernel log (tuning_apply) must not pay for its import. None: not looked for yet.
# Tests set HAS_NETADDR to False to stand for a node without it; the module then reports
# missing_required_lib.
netaddr = None
HAS_NETADDR = None


def _netaddr():
    """The netaddr module, or None when it is not installed (or HAS_NETADDR is False)."""
    global netaddr, HAS_NETADDR  # pylint: disable=global-statement
    if HAS_NETADDR is None:
        try:
            import netaddr as imported
        except ImportError:
            HAS_NETADDR = False
        else:
            netaddr, HAS_NETADDR = imported, True
    return netaddr if HAS_NETADDR else None


def needs_netaddr(ignore_rules) -> bool:
    """Whether ``kmsg_ignore`` rules need netaddr (a rule with a cidr) and it is not installed."""
    return any((r or {}).get("cidr") for r in (ignore_rules or [])) and _netaddr() is None


KMSG_PATH = "dev/kmsg"

LEVEL_NAMES = ("emerg", "alert", "crit", "err", "warn", "notice", "info", "debug")
# "err" is "err and worse": emerg/alert/crit are rare and must not slip through a filter that
# only names err (the `dmesg --level=err,warn` trap). Every other name selects its own level.
LEVEL_SELECTION = {name: frozenset([i]) for i, name in enumerate(LEVEL_NAMES)}
LEVEL_SELECTION["err"] = frozenset([0, 1, 2, 3])
DEFAULT_LEVELS = ("err", "warn")

CLASSES = ("aer", "xid", "fallen_off_bus", "lockdown", "module_failure", "noise", "other")
TROUBLE_CLASSES = ("aer", "xid", "fallen_off_bus", "lockdown", "module_failure")
SAMPLES_PER_CLASS = 5

# Known noise on these nodes: VXLAN reports ECN-capable outer headers from peers that do not set
# ECT. It is harmless and frequent; a given kmsg_ignore list replaces this default.
DEFAULT_IGNORE_RULES = ({"pattern": r"^vxlan: non-ECT from \S+ with TOS=", "cidr": None},)

_READ_SIZE = 8192  # larger than the longest /dev/kmsg record (CONSOLE_EXT_LOG_MAX)

_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
# Xid codes that fail verification. Source: NVIDIA's Xid catalog ("Xid Errors", Analyzing Xid
# Errors with the Xid Catalog, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), whose
# resolution buckets for these are a GPU reset, a node reboot or a service call, not an app restart.
SERIOUS_XIDS = {
    48: "double-bit ECC error",
    63: "row remapping / page retirement pending (reset the GPU)",
    64: "row remapping / page retirement failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): (\d+)")
_FALLEN = re.compile(r"has fallen off the bus")
_NVRM_DEVICE = re.compile(r"PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
_AER = re.compile(r"PCIe Bus Error: |\bAER: |error status/mask=")
_AER_SEVERITY = re.compile(r"severity=([^,]+)")
_DEVICE = re.compile(r"(?<![0-9a-fA-F:])(" + _BDF + r")\b")
_LOCKDOWN = re.compile(r"^Lockdown: ([^:]+): (.+?) is restricted")
_MODULE_FAILURE = re.compile(
    r"disagrees about version of symbol|Unknown symbol|nvidia-peermem .*ERROR|module verification failed"
)
# Substrings that every trouble class needs: plain "in" tests rule most records out several
# times faster than one alternation regex (this matters when info-level chatter is selected).
_TROUBLE_KEYWORDS = ("Xid", "fallen off the bus", "PCIe Bus Error", "AER:", "error status/mask=", "Lockdown:",
                     "disagrees about version", "Unknown symbol", "ERROR", "module verification failed")
_MODULE_NAME = re.compile(r"^([A-Za-z0-9_-]+)(?::| )")
# /dev/kmsg escapes a non-printable byte inside one record as \xNN: a newline of a multi-line message
# is \x0a ("...installed in this system has\x0aNVRM: fallen off the bus..."). Continuation lines repeat
# the NVRM: prefix, which the joined text drops.
_KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_CONTINUATION = re.compile(r"\s*\n\s*(?:NVRM: )?")
# AER severities as kernels spell them: "Corrected" before 4.19's rename, "Correctable" after (and the
# "Uncorrected"/"Uncorrectable" pair likewise): counted under the newer spelling.
_AER_SEVERITY_NAMES = {"corrected": "Correctable", "correctable": "Correctable",
                       "uncorrected (non-fatal)": "Uncorrectable (Non-Fatal)",
                       "uncorrectable (non-fatal)": "Uncorrectable (Non-Fatal)",
                       "uncorrected (fatal)": "Uncorrectable (Fatal)", "uncorrectable (fatal)": "Uncorrectable (Fatal)"}
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
_IPV6_CANDIDATE = re.compile(r"(?<![0-9A-Fa-f:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![0-9A-Fa-f:])")


class KernelLogError(ValueError):
    """An option of the kernel-log filter is invalid; the message names the allowed values."""


def select_levels(names: Iterable[str]) -> frozenset:
    """Return the set of numeric levels (0-7) that the level names select.

    Raises ``KernelLogError`` naming the allowed names for an unknown one.
    """
    levels = set()
    for name in names:
        key = str(name).strip().lower()
        if key not in LEVEL_SELECTION:
            raise KernelLogError(
                "kmsg_levels: unknown level %r; allowed: %s" % (name, ", ".join(LEVEL_NAMES))
            )
        levels |= LEVEL_SELECTION[key]
    if not levels:
        raise KernelLogError("kmsg_levels must name at least one of: %s" % ", ".join(LEVEL_NAMES))
    return frozenset(levels)


class IgnoreRule:
    """A known-noise rule: a message regex and, optionally, a network the message's address is in."""

    def __init__(self, index, pattern, cidr=None):
        self.index = index
        self.pattern_text = pattern
        self.cidr_text = cidr
        if not isinstance(pattern, str) or not pattern:
            raise KernelLogError("kmsg_ignore[%d].pattern must be a non-empty regular expression" % index)
        try:
            self.pattern = re.compile(pattern)
        except re.error as exc:
            raise KernelLogError(
                "kmsg_ignore[%d].pattern %r is not a valid regular expression: %s" % (index, pattern, exc)
            ) from exc
        self.network = None
        self.netaddr = None
        if cidr not in (None, ""):
            self.netaddr = _netaddr()
            if self.netaddr is None:
                raise ImportError("netaddr")
            try:
                self.network = self.netaddr.IPNetwork(str(cidr))
            except (self.netaddr.AddrFormatError, ValueError, TypeError) as exc:
                raise KernelLogError(
                    "kmsg_ignore[%d].cidr %r is not a network in CIDR notation (e.g. 10.224.0.0/16 or "
                    "fd00::/8): %s" % (index, cidr, exc)
                ) from exc

    def match(self, message: str) -> str | None:
        """Return the address that made the rule match ('' without a cidr), or None."""
        m = self.pattern.search(message)
        if m is None:
            return None
        if self.network is None:
            return ""
        address = m.groupdict().get("address") if self.pattern.groupindex else None
        address = address or message_address(message)
        if address is None:
            return None
        try:
            inside = self.netaddr.IPAddress(address) in self.network
        except (self.netaddr.AddrFormatError, ValueError):
            return None
        return address if inside else None


def compile_ignore_rules(rules: list | None) -> list[IgnoreRule]:
    """Compile ``kmsg_ignore`` entries (dicts with ``pattern`` and optional ``cidr``).

    ``None`` selects ``DEFAULT_IGNORE_RULES``; an empty list ignores nothing. Raises
    ``KernelLogError`` for a bad regex or network, ``ImportError`` when a cidr needs netaddr.
    """
    if rules is None:
        rules = DEFAULT_IGNORE_RULES
    compiled = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            raise KernelLogError("kmsg_ignore[%d] must be a dict with keys: pattern, cidr" % i)
        unknown = sorted(set(rule) - {"pattern", "cidr"})
        if unknown:
            raise KernelLogError(
                "kmsg_ignore[%d]: unknown key(s) %s; allowed: pattern, cidr" % (i, ", ".join(unknown))
            )
        compiled.append(IgnoreRule(i, rule.get("pattern"), rule.get("cidr")))
    return compiled


def message_address(message: str) -> str | None:
    """Return the first IPv4 (else IPv6) address in a message, or None."""
    m = _IPV4.search(message)
    if m and _valid_ipv4(m.group(0)):
        return m.group(0)
    for m in _IPV6_CANDIDATE.finditer(message):
        text = m.group(0)
        lib = _netaddr()
        if lib is not None and lib.valid_ipv6(text):
            return text
    return None


def _valid_ipv4(text):
    return all(int(part) <= 255 for part in text.split("."))


def read_kmsg(node: Node) -> tuple[bytes | None, str | None]:
    """Read every record of the node's kernel log without blocking.

    Returns ``(data, None)`` with the raw bytes, or ``(None, reason)`` when the log cannot be
    read (no /dev/kmsg in a container, dmesg_restrict without CAP_SYSLOG, ...).
    """
    path = node.path(KMSG_PATH)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return None, _unreadable_reason(path, exc)
    chunks = []
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            # A simulated node's log: one read of the whole file.
            with os.fdopen(os.dup(fd), "rb") as fh:
                chunks.append(fh.read())
        else:
            # The character device returns one record per read and EAGAIN after the last one.
            while True:
                try:
                    chunk = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:
                        continue  # records were overwritten while reading: go on with the next
                    if exc.errno == errno.EINTR:
                        continue
                    if not chunks:
                        return None, _unreadable_reason(path, exc)
                    break
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as exc:
        return None, _unreadable_reason(path, exc)
    finally:
        os.close(fd)
    return b"".join(chunks), None


def _unreadable_reason(path, exc):
    why = exc.strerror or str(exc)
    if exc.errno in (errno.EPERM, errno.EACCES):
        why += " (kernel.dmesg_restrict without CAP_SYSLOG, or a container without access to the kernel log)"
    elif exc.errno == errno.ENOENT:
        why += " (no kernel log device, e.g. inside a container)"
    return "cannot read %s: %s" % (path, why)


def unescape(message: str) -> str:
    """A /dev/kmsg message with its ``\\xNN`` escapes decoded (``\\x0a`` is a newline inside the record)."""
    if "\\x" not in message:
        return message
    return _KMSG_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), message)


def joined(message: str) -> str:
    """One line of a multi-line message: its continuation lines appended, their ``NVRM:`` prefix dropped."""
    text = unescape(message)
    return _CONTINUATION.sub(" ", text.strip()) if "\n" in text else text


def aer_severity(text: str) -> str:
    """The AER severity as newer kernels spell it (``Corrected`` and ``Correctable`` are one class)."""
    return _AER_SEVERITY_NAMES.get(text.strip().lower(), text.strip())


def classify(message: str, ignore_rules: Iterable[IgnoreRule] = ()) -> tuple[str, dict]:
    """Return ``(class, extra)`` for one message; ``extra`` holds the extracted fields.

    A multi-line record (``\\x0a`` inside it) is classified as one line (``joined``).
    """
    message = joined(message)
    for rule in ignore_rules:
        address = rule.match(message)
        if address is not None:
            extra = {"rule": rule.index}
            if address:
                extra["address"] = address
            return "noise", extra
    for keyword in _TROUBLE_KEYWORDS:
        if keyword in message:
            break
    else:
        return "other", {}
    m = _XID.search(message)
    if m:
        return "xid", {"device": m.group(1).lower(), "code": int(m.group(2))}
    if _FALLEN.search(message):
        return "fallen_off_bus", _device_extra(message)
    if _AER.search(message):
        extra = _device_extra(message)
        sev = _AER_SEVERITY.search(message)
        if sev:
            extra["severity"] = aer_severity(sev.group(1))
        return "aer", extra
    m = _LOCKDOWN.search(message)
    if m:
        return "lockdown", {"program": m.group(1), "what": m.group(2)}
    if _MODULE_FAILURE.search(message):
        m = _MODULE_NAME.match(message)
        return "module_failure", {"module": m.group(1).replace("-", "_")} if m else {}
    return "other", {}


def _device_extra(message):
    m = _DEVICE.search(message)
    if m:
        return {"device": m.group(1).lower()}
    m = _NVRM_DEVICE.search(message)
    return {"device": m.group(1).lower()} if m else {}


def summarize(records: list, ignore_rules: Iterable[IgnoreRule] = (), samples: int = SAMPLES_PER_CLASS) -> dict:
    """Classify parsed records: counts per class, the first ``samples`` records of each class,
    Xid codes and AER severities with their counts."""
    counts = dict.fromkeys(CLASSES, 0)
    firsts = {c: [] for c in CLASSES}
    xid_codes = {}
    aer_severities = {}
    for level, usec, seq, message in records:
        cls, extra = classify(message, ignore_rules)
        counts[cls] += 1
        if cls == "xid":
            key = str(extra["code"])
            xid_codes[key] = xid_codes.get(key, 0) + 1
        elif cls == "aer" and "severity" in extra:
            aer_severities[extra["severity"]] = aer_severities.get(extra["severity"], 0) + 1
        if len(firsts[cls]) < samples:
            rec = {"level": LEVEL_NAMES[level], "time": round(usec / 1e6, 6), "seq": seq, "message": joined(message)}
            rec.update(extra)
            firsts[cls].append(rec)
    return {
        "counts": counts,
        "trouble": sum(counts[c] for c in TROUBLE_CLASSES),
        "records": firsts,
        "xid_codes": xid_codes,
        "aer_severities": aer_severities,
    }


def kernel_log_facts(node: Node, levels: Iterable[str] = DEFAULT_LEVELS, since: float = 0.0,
                     ignore: list | None = None) -> dict:
    """Return the ``kernel_log`` section of tuning_facts for a node.

    ``levels``: level names; ``since``: seconds since boot (records before it are left out);
    ``ignore``: kmsg_ignore rules (None: the default noise rules). Raises ``KernelLogError`` for
    invalid options, before anything is read.
    """
    level_set = select_levels(levels)
    if since is None:
        since = 0.0
    try:
        since = float(since)
    except (TypeError, ValueError) as exc:
        raise KernelLogError("kmsg_since must be a number of seconds since boot (>= 0), got %r" % (since,)) from exc
    if since < 0 or math.isnan(since):
        raise KernelLogError("kmsg_since must be >= 0 (seconds since boot), got %r" % (since,))
    rules = compile_ignore_rules(ignore)
    result = {
        "available": False,
        "reason": None,
        "source": node.path(KMSG_PATH),
        "levels": sorted({str(n).strip().lower() for n in levels}, key=LEVEL_NAMES.index),
        "since": since,
        "last_time": None,
        "records_total": 0,
        "records_selected": 0,
        "malformed": 0,
        "counts": dict.fromkeys(CLASSES, 0),
        "trouble": 0,
        "records": {c: [] for c in CLASSES},
        "xid_codes": {},
        "aer_severities": {},
    }
    data, reason = read_kmsg(node)
    if data is None:
        result["reason"] = reason
        return result
    records, stats = parse_kmsg(data, level_set, int(round(since * 1e6)))
    result.update(summarize(records, rules))
    if b"amdgpu" in data:  # the amdgpu classes at every level: the driver logs resets and RAS counts at info
        # Imported here: only the facts gatherer summarizes.
        from ansible_collections.gpunode.tuning.plugins.module_utils.core import amdgpu_log

        result["amdgpu"] = amdgpu_log.summarize(parse_kmsg(data, None, int(round(since * 1e6)))[0])
    result.update(available=True, records_total=stats["total"], records_selected=stats["selected"],
                  malformed=stats["malformed"])
    if stats["last_usec"] is not None:
        result["last_time"] = round(stats["last_usec"] / 1e6, 6)
    return result
