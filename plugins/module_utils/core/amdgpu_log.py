# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The amdgpu driver's kernel-log messages that mean a sick GPU, classified and counted per GPU.

The driver prefixes most messages with the device: ``amdgpu 0000:05:00.0: amdgpu: GPU reset begin!``
(older kernels and some paths print ``[drm] ...`` or ``[drm:func [amdgpu]] *ERROR* ...`` without it; the
class is then counted under ``unknown``). Classes, checked in this order (the first that matches wins):

- ``vram_lost``: ``VRAM is lost due to GPU reset!``
- ``gpu_reset_failed``: ``GPU reset(N) failed`` (one per GPU of the reset; the recovery's summary after it,
  ``GPU reset end with ret = -110`` and ``*ERROR* GPU Recovery Failed: -110``, is not counted again)
- ``gpu_reset``: ``GPU reset begin!`` (one per reset; the method lines, MODE1/MODE2, and ``GPU reset succeeded``
  are not counted again)
- ``poison_consumed``: ``poison is consumed by client N`` (older drivers: ``RAS poison consumption ...``)
- ``bad_page_threshold``: ``Saved bad pages N reaches threshold value M``, ``RAS records:N exceed threshold:M``
  (not the 90 % warning, ``exceeds 90% of threshold``)
- ``ras_uncorrectable`` / ``ras_deferred`` / ``ras_correctable``: ``N [new] uncorrectable|deferred|correctable
  hardware errors detected in BLOCK block`` with the block and count; ``uncorrectable hardware
  error(ERREVENT_ATHUB_INTERRUPT) detected!`` (a fatal error event) is ``ras_uncorrectable`` of its block.
  The running totals newer drivers print next to each new count (``... detected in total in umc block``)
  are not counted again; ``no uncorrectable hardware errors ...`` (an all-clear) matches nothing.
  ``ras_correctable`` is counted but is no trouble (correctable errors are what ECC is for).
- ``ring_timeout``: ``ring gfx_0.0.0 timeout`` (``*ERROR* ring gfx timeout`` in older drivers)
- ``init_failed``: ``Fatal error during GPU init``, the one line the driver prints per GPU whose probe fails;
  the cause before it (``hw_init of IP block <psp> failed -22``, ``amdgpu_device_ip_init failed``) and the PCI
  core's ``probe of 0000:48:00.0 failed with error -12`` after it are not counted again

The class never depends on the record's level: the driver logs GPU resets, VRAM loss and the RAS counts at
info level (dev_info) and others at err or warn, so a caller reading /dev/kmsg passes every record of the
amdgpu driver (``kernel_log.parse_kmsg(data, levels=None)``), not only err and warn. The messages come from
the driver's sources (amdgpu_device.c, amdgpu_ras.c, amdgpu_ras_eeprom.c, amdgpu_job.c, kfd_int_process_v9.c);
tests/data/real/amd-kmsg-* are logs people posted.

Plain Python (3.8+), no Ansible import. ``classify`` has the shape of ``kernel_log.classify``: ``(class, extra)``.
"""

from __future__ import annotations

import re
from typing import Iterable

CLASSES = ("gpu_reset", "gpu_reset_failed", "vram_lost", "ras_uncorrectable", "ras_deferred", "ras_correctable",
           "poison_consumed", "bad_page_threshold", "ring_timeout", "init_failed")
TROUBLE_CLASSES = tuple(c for c in CLASSES if c != "ras_correctable")
OTHER = "other"
UNKNOWN_DEVICE = "unknown"
SAMPLES_PER_CLASS = 5
# A message must name the driver (most do: "amdgpu 0000:..: amdgpu:", "[drm:... [amdgpu]]"); "[drm]" alone is
# accepted for the few lines older drivers print without the device.
_DRIVER = ("amdgpu", "[drm]", "[drm:")
# Substrings one of the classes needs: most records are ruled out by these plain tests.
KEYWORDS = ("reset", "VRAM is lost", "hardware error", "oison", "bad pages", "RAS records", "timeout",
            "GPU init")

_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_DEVICE = re.compile(r"\bamdgpu (" + _BDF + r"):")
_RAS_COUNT = re.compile(r"(?<![\w-])(\d+) (new )?(uncorrectable|deferred|correctable) hardware errors detected in "
                        r"(total in )?(\w+) block")
_RAS_EVENT = re.compile(r"uncorrectable hardware error\((\w+)\) detected")
_RULES = (
    ("vram_lost", re.compile(r"VRAM is lost due to GPU reset")),
    ("gpu_reset_failed", re.compile(r"GPU reset\(\d+\) failed")),
    ("gpu_reset", re.compile(r"GPU reset begin")),
    ("poison_consumed", re.compile(r"poison is consumed by client (\d+)|RAS poison consumption.*client id (\d+)",
                                   re.I)),
    ("bad_page_threshold", re.compile(r"Saved bad pages\s*\(?(\d+)\)? reaches threshold value\s*\(?(\d+)\)?"
                                      r"|RAS records:\s*(\d+) exceeds? threshold:\s*(\d+)")),
    ("ring_timeout", re.compile(r"\bring (\S+) timeout\b")),
    ("init_failed", re.compile(r"Fatal error during GPU init")),
)
_SYSLOG = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: ")
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[.,]\d+(?:[+-]\d\d:?\d\d|Z)? \S+ kernel: ")
_STAMP = re.compile(r"^\[\s*\d+\.\d+\] |^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\] ")


def device(message: str) -> str | None:
    """The GPU a message names (``amdgpu 0000:05:00.0:``), lower case; None for a line without one."""
    m = _DEVICE.search(message)
    return m.group(1).lower() if m else None


def classify(message: str) -> tuple:
    """``(class, extra)`` for one kernel message; ``("other", {})`` for anything that is not an amdgpu fault.

    ``extra`` holds ``device`` (None when the line names none) and what the message tells: ``block`` and
    ``count`` of RAS lines, ``ring``, ``client`` (poison), ``bad_pages``/``threshold``.
    """
    if not any(word in message for word in _DRIVER) or not any(word in message for word in KEYWORDS):
        return OTHER, {}
    ras = _ras(message)
    if ras is not None:
        return ras
    for cls, pattern in _RULES:
        m = pattern.search(message)
        if m:
            return cls, _extra(cls, m, message)
    return OTHER, {}


def _ras(message: str) -> tuple | None:
    m = _RAS_COUNT.search(message)
    if m:
        if m.group(4):  # the running total next to a new count: counted by the new count's line
            return OTHER, {"device": device(message), "total": int(m.group(1)), "block": m.group(5).lower()}
        return "ras_" + m.group(3), {"device": device(message), "block": m.group(5).lower(), "count": int(m.group(1))}
    m = _RAS_EVENT.search(message)
    if m:
        event = m.group(1)
        block = event.replace("ERREVENT_", "").split("_")[0].lower()
        return "ras_uncorrectable", {"device": device(message), "block": block, "event": event, "count": 1}
    return None


def _extra(cls: str, m: re.Match, message: str) -> dict:
    extra = {"device": device(message)}
    groups = [g for g in m.groups() if g is not None]
    if cls == "ring_timeout":
        extra["ring"] = groups[0]
    elif cls == "poison_consumed" and groups:
        extra["client"] = int(groups[0])
    elif cls == "bad_page_threshold" and len(groups) == 2:
        extra["bad_pages"], extra["threshold"] = int(groups[0]), int(groups[1])
    return extra


def message_of(line: str) -> str:
    """A kernel message out of a dmesg or journal line: the syslog/ISO prefix and the [timestamp] dropped."""
    line = _ISO.sub("", _SYSLOG.sub("", line.rstrip("\n")))
    return _STAMP.sub("", line)


def summarize(records: Iterable, samples: int = SAMPLES_PER_CLASS) -> dict:
    """Classify kernel records (``(level, usec, seq, message)`` as ``kernel_log.parse_kmsg`` yields, or messages).

    ``{"counts": {class: n}, "trouble": n, "by_device": {bdf: {class: n}}, "ras_blocks": {class: {block: count}},
    "records": {class: [first records]}}``; the level is not looked at. A line without a device counts under
    ``"unknown"``.
    """
    counts = dict.fromkeys(CLASSES, 0)
    by_device, blocks = {}, {}
    firsts = {c: [] for c in CLASSES}
    for record in records:
        message = record[3] if isinstance(record, (tuple, list)) else record
        cls, extra = classify(message)
        if cls == OTHER:
            continue
        counts[cls] += 1
        per = by_device.setdefault(extra.get("device") or UNKNOWN_DEVICE, {})
        per[cls] = per.get(cls, 0) + 1
        if "block" in extra:
            per_block = blocks.setdefault(cls, {})
            per_block[extra["block"]] = per_block.get(extra["block"], 0) + extra.get("count", 1)
        if len(firsts[cls]) < samples:
            firsts[cls].append(dict(extra, message=message))
    return {"counts": counts, "trouble": sum(counts[c] for c in TROUBLE_CLASSES), "by_device": by_device,
            "ras_blocks": blocks, "records": firsts}
