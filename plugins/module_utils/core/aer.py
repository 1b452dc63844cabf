# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCIe AER error counters of the GPUs and the bridges above them, read-only (issue 44).

The kernel counts the AER errors each device saw since boot (drivers/pci/pcie/aer.c, sysfs attributes of
Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats, KernelVersion 4.19): ``aer_dev_correctable``,
``aer_dev_nonfatal`` and ``aer_dev_fatal``, one ``<error name> <count>`` per line and a last
``TOTAL_ERR_COR`` / ``TOTAL_ERR_NONFATAL`` / ``TOTAL_ERR_FATAL`` line (the ERR_* messages, which may each carry
several errors). The names have changed (``Receiver Error`` in the ABI's sample, ``RxErr`` since 5.x) and hold
spaces, so a line is split at its last blank. An error at the link may be counted by the link partner (the
bridge above the GPU) and not by the GPU: every bridge above a GPU is read too.

Judged (``judge``): a fatal count fails; a non-fatal count is reported at first sight (counts since boot) and
fails once it grows between two readings of the same boot; correctable errors fail above a rate per hour
between two readings. The previous reading is the one the guard left in its status file (``PREVIOUS_STATUS``,
key ``aer``): the guard's successive runs, and verification against the guard's last run.
Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpunode.tuning.plugins.module_utils.core import pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, read_small

SEVERITIES = (("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
              ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
              ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"))
TOTAL = "TOTAL"  # the key a reading keeps each file's TOTAL_ERR_* line under
# The guard's status (flows/guard_files.py STATUS_NAME next to the default journal), below the node root.
PREVIOUS_STATUS = "var/lib/gpunode-tuning/guard-status.json"
BOOT_ID = "proc/sys/kernel/random/boot_id"
UPTIME = "proc/uptime"


def parse_counters(text: str | None) -> dict | None:
    """One ``aer_dev_*`` file as ``{error name: count}`` with its ``TOTAL_ERR_*`` line under ``TOTAL``; None when
    no line reads as ``<name> <count>``."""
    out = {}
    for line in (text or "").splitlines():
        name, _sep, count = line.strip().rpartition(" ")
        if not name or not count.isdigit():
            continue
        out[TOTAL if name.startswith("TOTAL_ERR_") else name.strip()] = int(count)
    return out or None


def read_device(path: str) -> dict | None:
    """``{severity: counters}`` of the device directory ``path``; None when it has no AER counter file (a kernel
    before 4.19, or a device without the AER capability)."""
    out = {}
    for severity, filename, _total in SEVERITIES:
        counters = parse_counters(read_small(os.path.join(path, filename)))
        if counters is not None:
            out[severity] = counters
    return out or None


def read(node: Node, gpus: list, now: float | None = None) -> dict:
    """This reading: ``{"boot_id", "time" (seconds since boot), "devices": {bdf: {severity: counters}},
    "gpu": {bdf: gpu bdf}, "missing": [bdf, ...]}`` for each GPU (``pci.list_devices`` dicts) and each bridge
    above it, and ``previous``: the guard's last reading of this boot (None when there is none)."""
    devices, gpu_of, missing = {}, {}, []
    for g in gpus:
        chain = [(g["bdf"], pci.device_dir(node, g["bdf"]))] + list(reversed(pci.bridge_chain(node, g["bdf"])))
        for bdf, path in chain:
            if bdf in gpu_of:
                continue
            gpu_of[bdf] = g["bdf"]
            counters = read_device(path)
            if counters is None:
                missing.append(bdf)
            else:
                devices[bdf] = counters
    boot_id = (node.read(BOOT_ID, default="") or "").strip()
    reading = {"boot_id": boot_id, "time": uptime(node) if now is None else now, "devices": devices,
               "gpu": gpu_of, "missing": missing}
    return dict(reading, previous=previous_reading(node, boot_id))


def uptime(node: Node) -> float | None:
    """Seconds since boot (``/proc/uptime``): the clock of the readings (two readings of a boot compare, and a
    simulated node's facts stay the same from run to run); None when unreadable."""
    try:
        return float((node.read(UPTIME, default="") or "").split()[0])
    except (IndexError, ValueError):
        return None


def previous_reading(node: Node, boot_id: str) -> dict | None:
    """The ``aer`` reading of the guard's last status when it is of this boot, else None."""
    try:
        with open(node.path(PREVIOUS_STATUS), encoding="utf-8") as fh:
            prev = (json.load(fh) or {}).get("aer")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(prev, dict) or not boot_id or prev.get("boot_id") != boot_id:
        return None
    return {k: prev.get(k) for k in ("boot_id", "time", "devices")}


def stored(reading: dict | None) -> dict | None:
    """What the guard keeps of a reading for the next one (its status' ``aer``): without ``previous``."""
    return None if not reading else {k: reading.get(k) for k in ("boot_id", "time", "devices", "gpu", "missing")}


def _errors(counters: dict) -> dict:
    """The named errors with a count (the TOTAL line only when no name has one)."""
    named = {k: v for k, v in counters.items() if k != TOTAL and v}
    return named or ({TOTAL: counters[TOTAL]} if counters.get(TOTAL) else {})


def _grown(now: dict, before: dict) -> dict:
    """The named errors (else TOTAL) whose count grew since ``before``."""
    grew = {k: v - before.get(k, 0) for k, v in now.items() if k != TOTAL and v > before.get(k, 0)}
    if not grew and now.get(TOTAL, 0) > before.get(TOTAL, 0):
        grew = {TOTAL: now[TOTAL] - before.get(TOTAL, 0)}
    return grew


def _names(errors: dict) -> str:
    return ", ".join("%s %d" % (k, v) for k, v in sorted(errors.items()))


def label(bdf: str, gpu: str) -> str:
    return "GPU %s" % bdf if bdf == gpu else "bridge %s above GPU %s" % (bdf, gpu)


def judge(reading: dict, per_hour: float | None) -> dict:
    """``{severity: (failing, reported)}``: lists of ``"<device>: <errors>"`` per severity.

    fatal: every count fails. nonfatal: reported at first sight, fails when it grew since the previous reading
    of this boot. correctable: reported, fails when it grew faster than ``per_hour`` since the previous reading.
    """
    prev = (reading.get("previous") or {})
    before_all = prev.get("devices") or {}
    hours = max((reading.get("time") or 0) - (prev.get("time") or 0), 1.0) / 3600.0 \
        if prev and reading.get("time") is not None and prev.get("time") is not None else None
    out = {s: ([], []) for s, _f, _t in SEVERITIES}
    for bdf, counters in sorted((reading.get("devices") or {}).items()):
        who = label(bdf, (reading.get("gpu") or {}).get(bdf, bdf))
        for severity, _file, _total in SEVERITIES:
            now = counters.get(severity) or {}
            errors = _errors(now)
            failing, reported = out[severity]
            if severity == "fatal":
                if errors:
                    failing.append("%s: %s" % (who, _names(errors)))
                continue
            before = (before_all.get(bdf) or {}).get(severity) if prev else None
            grew = _grown(now, before) if before is not None else {}
            if severity == "nonfatal" and grew:
                failing.append("%s: %s more since the guard's last reading (%s in all since boot)"
                               % (who, _names(grew), _names(errors)))
            elif severity == "correctable" and grew and per_hour is not None and hours:
                rate = (now.get(TOTAL, 0) - before.get(TOTAL, 0) or sum(grew.values())) / hours
                if rate > per_hour:
                    failing.append("%s: %.1f per hour since the guard's last reading, above %g (%s)"
                                   % (who, rate, per_hour, _names(grew)))
                else:
                    reported.append("%s: %s since boot" % (who, _names(errors)))
            elif errors:
                reported.append("%s: %s since boot" % (who, _names(errors)))
    return out


ROWS = (("fatal", "aer_fatal"), ("nonfatal", "aer_nonfatal"), ("correctable", "aer_correctable"))


def rows(reading: dict | None, per_hour: float | None, make) -> list:
    """The health rows ``aer_fatal``, ``aer_nonfatal``, ``aer_correctable`` of a reading (``read``);
    ``make(name, desired, running, state, reason)`` builds a row. None (no GPU read): no row."""
    if reading is None or not reading.get("gpu"):
        return []
    devices = reading.get("devices") or {}
    if not devices:
        why = ("no AER counters in sysfs for %s (a kernel before 4.19, or no AER capability)"
               % ", ".join(sorted(reading.get("gpu") or {})))
        return [make(name, None, None, "unsupported", why) for _s, name in ROWS]
    verdicts = judge(reading, per_hour)
    out = []
    first = "" if reading.get("previous") else "; no earlier reading of this boot by the guard: counts since boot"
    for severity, name in ROWS:
        failing, reported = verdicts[severity]
        desired = "0" if severity == "fatal" else (
            "no growth" if severity == "nonfatal" else
            ("<= %g per hour" % per_hour if per_hour is not None else "reported"))
        running = "%d device(s) with errors" % len(failing + reported) if failing or reported else "0"
        if failing:
            out.append(make(name, desired, running, "drifted", "; ".join(failing + reported)))
        elif reported:
            out.append(make(name, desired, running, "applied", "reported: %s%s" % ("; ".join(reported), first)))
        else:
            out.append(make(name, desired, running, "applied", "no %s AER error on %d device(s) (GPUs and the "
                            "bridges above them)" % (severity.replace("nonfatal", "non-fatal"), len(devices))))
    return out
