# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Why modprobe failed: the kernel log records of the attempt, and the reason class of a failed load or unload.

How it works and why: docs/dev/node-code.md, "core/modprobe_log.py"."""

from __future__ import annotations

import errno
import os
import re
from typing import Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils.core.kmsg import parse_kmsg
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import sysfs_name

PEERMEM_NAMES = ("nvidia_peermem", "nv_peer_mem")
PEERMEM_MESSAGE = (
    "%s did not load (Invalid argument): it needs the MOFED/ib_core peer-memory support used by "
    "GPUDirect RDMA. This is expected and harmless on a node without RDMA; GPU-to-GPU P2P does not use it."
)


# --- kernel log ---------------------------------------------------------------------------------


class KmsgCursor:
    """Kernel log records written after the cursor was opened."""

    def __init__(self, node):
        self.fd = None
        try:
            self.fd = os.open(node.path("dev/kmsg"), os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            self.close()

    @property
    def available(self) -> bool:
        return self.fd is not None

    def read_new(self, limit: int = 512) -> list[str]:
        """Messages appended since the cursor was opened (at most ``limit`` records)."""
        if self.fd is None:
            return []
        chunks = []
        while len(chunks) < limit:
            try:
                data = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten while we read: go on
                    continue
                break
            if not data:
                break
            chunks.append(data)
        records, _stats = parse_kmsg(b"".join(chunks))
        return [message for _level, _usec, _seq, message in records]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def relevant_log_lines(lines: list[str], name: str, limit: int = 20) -> list[str]:
    """Kernel log lines that concern a module load (its name, symbols, lockdown, signatures)."""
    keys = (name.lower(), sysfs_name(name).lower(), name.replace("_", "-").lower(),
            "unknown symbol", "disagrees about version", "lockdown", "signature", "key was rejected")
    hits = [line for line in lines if any(k in line.lower() for k in keys)]
    return hits[-limit:]


# --- classification ------------------------------------------------------------------------------


def classify_failure(name: str, output: str, log_lines: Iterable[str] = ()) -> tuple[str, str]:
    """Classify a failed modprobe from its output and the kernel log lines of the attempt."""
    out = (output or "").strip()
    log = "\n".join(log_lines or ())
    both = out + "\n" + log
    low = both.lower()
    short = sysfs_name(name)
    first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")

    m = re.search(r"disagrees about version of symbol (\S+)", both)
    if m:
        msg = "%s was built against other symbol versions (%s): rebuild it for the running kernel" % (name, m.group(1))
        if short in PEERMEM_NAMES:
            msg += " and the installed MOFED (ib_core)"
        return "symbol_mismatch", msg
    m = re.search(r"Unknown symbol (\S+)", both)
    if m and m.group(1) != "in":
        return "dependency_missing", "%s needs symbol %s that no loaded module provides (a dependency is missing)" % (
            name, m.group(1))
    if "unknown symbol in module" in low:
        return "dependency_missing", "%s: %s (a dependency or a parameter is unknown; see the kernel log)" % (
            name, first)
    for m in re.finditer(r"Module (\S+) not found", both):
        if sysfs_name(m.group(1)) != short:
            return "dependency_missing", "%s needs module %s, which is not installed" % (name, m.group(1))
    if "could not find module by name" in low and "'%s'" % name not in both:
        return "dependency_missing", "%s: %s" % (name, first)
    denied = ("operation not permitted", "key was rejected by service", "required key not available",
              "lockdown", "signature", "permission denied", "error running install command")
    if any(d in low for d in denied):
        return "denied", "%s may not be loaded here (%s)" % (
            name, first or next((ln for ln in log_lines if any(d in ln.lower() for d in denied)), ""))
    if "not found" in low or "no such file or directory" in low:
        return "not_found", "%s is not installed for the running kernel (%s)" % (name, first)
    if "invalid argument" in low:
        if short in PEERMEM_NAMES:
            return "invalid_argument", PEERMEM_MESSAGE % name
        return "invalid_argument", "%s refused to initialise (Invalid argument): %s" % (
            name, "; ".join(log_lines[-3:]) if log_lines else first)
    return "unknown", "%s did not load: %s" % (name, first or "modprobe gave no message")


def classify_unload_failure(name: str, output: str) -> tuple[str, str]:
    """Classify a failed ``modprobe -r``. Returns ``(reason_class, message)``."""
    out = (output or "").strip()
    low = out.lower()
    first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")
    if "is builtin" in low:
        return "builtin", "%s is built into the kernel and cannot be unloaded" % name
    if "in use" in low or "resource temporarily unavailable" in low:
        return "in_use", "%s is in use and was not unloaded (%s)" % (name, first)
    if "operation not permitted" in low:
        return "denied", "%s may not be unloaded here (%s)" % (name, first)
    return "unknown", "%s was not unloaded: %s" % (name, first or "modprobe gave no message")
