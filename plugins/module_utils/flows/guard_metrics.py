# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard's status as Prometheus metrics: the text exposition format node_exporter's textfile collector reads.

Pure functions, no I/O: ``render(status)`` turns the status the guard writes as JSON
(module_utils/flows/guard.py, ``build_status``) into the ``.prom`` file's text, so the file and the JSON
always say the same. Naming follows Prometheus' rules: the prefix ``gpunode_tuning_``, base units
(seconds, transfers per second), ``_total`` only on counters, ``_info`` on metadata, and no
timestamps on samples (node_exporter refuses them in textfiles).

States are one series per state, value 1 for the current one and 0 for the others (the StateSet
shape): every series of a setting exists on every run, so a state change never makes a series
vanish (no staleness gap, ``for:`` clauses and ``changes()`` see it), and ``== 1`` selects a state.
Cardinality is bounded by the node's settings (about 40, one per GPU or bridge for the PCIe
families) times 5 states; per-CPU settings are one series each with a count of CPUs, never a
series per CPU.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import STATES

PREFIX = "gpunode_tuning_"
VERDICTS = ("pass", "fail", "error")
_GTS = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")

# name (without prefix) -> (type, help). The order of the file.
METRICS = (
    ("info", "gauge", "The guard's collection version, preset and mode (value 1)."),
    ("guard_interval_seconds", "gauge", "How often the guard's timer runs it."),
    ("guard_last_run_timestamp_seconds", "gauge", "When the last guard run ended (Unix time)."),
    ("guard_last_run_duration_seconds", "gauge", "How long the last guard run took."),
    ("guard_last_run_success", "gauge", "1 when the last guard run verified the node, 0 when it could not."),
    ("host_verdict", "gauge", "The node's verification verdict, one series per verdict (1 = current)."),
    ("settings", "gauge", "Settings of the desired state per verification state."),
    ("setting_state", "gauge", "Each setting's verification state, one series per state (1 = current)."),
    ("setting_drifted_cpus", "gauge", "CPUs on which a per-CPU setting is not as desired."),
    ("setting_drift_first_seen_timestamp_seconds", "gauge", "When the guard first saw a setting drifted (Unix time)."),
    ("setting_cause_info", "gauge", "Why a setting is or will be drifted, where the node tells (value 1)."),
    ("boot_unit_failed", "gauge", "1 when the boot unit failed at this boot, 0 when it did not."),
    ("gpu_link_width", "gauge", "PCIe link width a GPU trained at (lanes)."),
    ("gpu_link_max_width", "gauge", "PCIe link width a GPU is capable of (lanes)."),
    ("gpu_link_transfers_per_second", "gauge", "PCIe link speed a GPU runs at (transfers per second)."),
    ("gpu_link_max_transfers_per_second", "gauge", "PCIe link speed a GPU is capable of (transfers per second)."),
    ("gpu_health_finding", "gauge", "A GPU health finding (value 1): a failing check, or one needing a reset."),
    ("gpu_xid_errors_total", "counter", "Xid events in the kernel log since boot, by GPU and code."),
    ("gpu_fault_events_total", "counter",
     "amdgpu kernel-log fault events since boot (GPU reset, VRAM lost, RAS errors, ...), by GPU, vendor and class."),
    ("gpu_serious_xid_errors_total", "counter",
     "Xid events since boot of the codes that fail verification (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)."),
    ("gpu_serious_fault_events_total", "counter",
     "amdgpu kernel-log fault events since boot of the classes that mean a sick GPU, by GPU and vendor."),
    ("gpu_ecc_errors_total", "counter",
     "ECC errors a GPU counts (amd-smi metric; nvidia-smi: uncorrectable since the driver loaded), by GPU, vendor "
     "and type (correctable, uncorrectable, deferred)."),
    ("gpu_ecc_block_errors_total", "counter",
     "ECC errors per memory block (AMD's ecc_blocks: UMC, SDMA, GFX, ...), by GPU, vendor, type and block."),
    ("gpu_bad_pages", "gauge",
     "GPU memory pages by bad-page state (retired, pending, unreservable), by GPU and vendor."),
    ("gpu_bad_page_threshold", "gauge", "Retired pages at which the driver stops using a GPU (the RAS threshold)."),
    ("gpu_bad_page_threshold_reached", "gauge",
     "1 when a GPU reached its bad-page threshold (AMD: retired pages at the RAS threshold, or amd-smi says it is "
     "exceeded; NVIDIA: a row-remapping failure), 0 when not."),
    ("gpu_bar_size_bytes", "gauge", "Size of each memory BAR of a GPU (sysfs resource), by GPU, vendor and BAR."),
    ("gpu_bar_max_supported_bytes", "gauge",
     "The largest size a GPU's Resizable BAR capability supports for a BAR, by GPU, vendor and BAR."),
    ("gpu_memory_bytes", "gauge", "A GPU's memory (the BAR check's table, amdgpu's mem_info_vram_total)."),
    ("pcie_aer_errors_total", "counter",
     "AER errors a GPU or a bridge above it counted since boot, by device, GPU, severity (correctable, nonfatal, "
     "fatal) and error (total: the TOTAL_ERR_* line; the named errors once counted)."),
    ("kernel_log_records", "gauge", "Kernel-log records per class in verification's window (since the last "
                                    "runtime tuning of this boot, else since boot)."),
    ("guard_reapplied_total", "counter", "Families the guard re-applied since boot (gpunode_tuning_guard_reapply)."),
)


def escape(value: Any) -> str:
    """A label value as the text format writes it: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: Any) -> str:
    """A sample value: integers as integers, floats in Python's shortest repr, NaN/Inf spelled as Prometheus does."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def sample(name: str, labels: dict | None, value: Any) -> str:
    """One sample line, labels in the given order."""
    inner = ",".join('%s="%s"' % (k, escape(v)) for k, v in (labels or {}).items())
    return "%s%s%s %s" % (PREFIX, name, "{%s}" % inner if inner else "", number(value))


def transfers_per_second(text: Any) -> float | None:
    """``"32.0 GT/s"`` (lspci's and sysfs' spelling) -> 32e9; None when it does not read as GT/s."""
    m = _GTS.match(str(text or ""))
    return float(m.group(1)) * 1e9 if m else None


def _info(status):
    yield "info", {"version": status.get("collection_version") or "unknown",
                   "preset": status.get("preset") or "unknown", "mode": status.get("mode") or "read-only"}, 1


def _run(status):
    run = status.get("run") or {}
    if status.get("interval_seconds") is not None:
        yield "guard_interval_seconds", None, status["interval_seconds"]
    yield "guard_last_run_timestamp_seconds", None, run.get("timestamp", 0)
    yield "guard_last_run_duration_seconds", None, run.get("duration_seconds", 0)
    yield "guard_last_run_success", None, 1 if run.get("success") else 0
    for verdict in VERDICTS:
        yield "host_verdict", {"verdict": verdict}, 1 if status.get("verdict") == verdict else 0
    counts = status.get("counts") or {}
    for state in STATES:
        yield "settings", {"state": state}, counts.get(state, 0)


def _settings(status):
    for s in status.get("settings") or []:
        labels = {"family": s["family"], "setting": s["name"]}
        for state in STATES:
            yield "setting_state", dict(labels, state=state), 1 if s["state"] == state else 0
    for s in status.get("settings") or []:
        if s.get("drifted_cpus") is not None:
            yield "setting_drifted_cpus", {"family": s["family"], "setting": s["name"]}, s["drifted_cpus"]
    for s in status.get("settings") or []:
        if s.get("first_seen_drifted") is not None:
            yield ("setting_drift_first_seen_timestamp_seconds", {"family": s["family"], "setting": s["name"]},
                   s["first_seen_drifted"])
    for s in status.get("settings") or []:
        cause = s.get("cause") or {}
        if cause:
            source = cause.get("file") or cause.get("unit") or ""
            yield "setting_cause_info", {"family": s["family"], "setting": s["name"], "cause": cause["kind"],
                                         "source": source}, 1
    unit = status.get("boot_unit") or {}
    if unit.get("known"):
        yield "boot_unit_failed", None, 1 if unit.get("failed") else 0


def _gpus(status):
    keys = (("gpu_link_width", "link_width"), ("gpu_link_max_width", "link_max_width"),
            ("gpu_link_transfers_per_second", "link_transfers_per_second"),
            ("gpu_link_max_transfers_per_second", "link_max_transfers_per_second"))
    for name, key in keys:
        for g in status.get("gpus") or []:
            if g.get(key) is not None:
                yield name, {"gpu": g["gpu"], "vendor": g.get("vendor") or ""}, g[key]
    for f in status.get("health_findings") or []:
        yield "gpu_health_finding", {"gpu": f["gpu"], "vendor": f.get("vendor") or "", "check": f["check"],
                                     "state": f["state"]}, 1
    xid = status.get("xid") or {}
    for gpu, codes in sorted((xid.get("counts") or {}).items()):
        for code, n in sorted(codes.items(), key=lambda kv: int(kv[0])):
            yield "gpu_xid_errors_total", {"gpu": gpu, "vendor": "nvidia", "code": code}, n
    faults = status.get("gpu_faults") or {}
    for gpu, classes in sorted((faults.get("counts") or {}).items()):
        for cls, n in sorted(classes.items()):
            yield "gpu_fault_events_total", {"gpu": gpu, "vendor": (faults.get("vendor") or {}).get(gpu, "amd"),
                                             "class": cls}, n
    for gpu, n in sorted((xid.get("serious") or {}).items()):
        yield "gpu_serious_xid_errors_total", {"gpu": gpu, "vendor": "nvidia"}, n
    for gpu, n in sorted((faults.get("serious") or {}).items()):
        yield "gpu_serious_fault_events_total", {"gpu": gpu, "vendor": (faults.get("vendor") or {}).get(gpu, "amd")}, n


def _memory(status):
    memory = status.get("gpu_memory") or {}
    for e in memory.get("ecc") or []:
        yield "gpu_ecc_errors_total", {"gpu": e["gpu"], "vendor": e["vendor"], "type": e["type"]}, e["count"]
    for e in memory.get("ecc_blocks") or []:
        yield ("gpu_ecc_block_errors_total", {"gpu": e["gpu"], "vendor": e["vendor"], "type": e["type"],
                                              "block": e["block"]}, e["count"])
    for p in memory.get("bad_pages") or []:
        yield "gpu_bad_pages", {"gpu": p["gpu"], "vendor": p["vendor"], "state": p["state"]}, p["count"]
    for t in memory.get("bad_page_thresholds") or []:
        if t.get("threshold") is not None:
            yield "gpu_bad_page_threshold", {"gpu": t["gpu"], "vendor": t["vendor"]}, t["threshold"]
    for t in memory.get("bad_page_thresholds") or []:
        if t.get("reached") is not None:
            yield "gpu_bad_page_threshold_reached", {"gpu": t["gpu"], "vendor": t["vendor"]}, 1 if t["reached"] else 0


def _pcie(status):
    bars = status.get("gpu_bars") or []
    for b in bars:
        yield "gpu_bar_size_bytes", {"gpu": b["gpu"], "vendor": b["vendor"], "bar": str(b["bar"])}, b["size"]
    for b in bars:
        if b.get("max_supported") is not None:
            yield ("gpu_bar_max_supported_bytes", {"gpu": b["gpu"], "vendor": b["vendor"], "bar": str(b["bar"])},
                   b["max_supported"])
    for gpu, b in sorted({b["gpu"]: b for b in bars if b.get("memory") is not None}.items()):
        yield "gpu_memory_bytes", {"gpu": gpu, "vendor": b["vendor"]}, b["memory"]
    reading = status.get("aer") or {}
    gpu_of = reading.get("gpu") or {}
    for device, counters in sorted((reading.get("devices") or {}).items()):
        for severity in ("correctable", "nonfatal", "fatal"):
            errors = counters.get(severity)
            if errors is None:
                continue
            labels = {"device": device, "gpu": gpu_of.get(device, device), "severity": severity}
            yield "pcie_aer_errors_total", dict(labels, error="total"), errors.get("TOTAL", sum(errors.values()))
            for name, n in sorted(errors.items()):
                if name != "TOTAL" and n:
                    yield "pcie_aer_errors_total", dict(labels, error=name), n


def _kernel_log(status):
    for cls, n in sorted(((status.get("kernel_log") or {}).get("counts") or {}).items()):
        yield "kernel_log_records", {"class": cls}, n
    for fam, n in sorted(((status.get("reapply") or {}).get("counts") or {}).items()):
        yield "guard_reapplied_total", {"family": fam}, n


def samples(status: dict) -> Iterable[tuple]:
    """Every ``(name, labels, value)`` of ``status``, grouped by metric."""
    for part in (_info, _run, _settings, _gpus, _memory, _pcie, _kernel_log):
        yield from part(status)


def render(status: dict) -> str:
    """The ``.prom`` text of a guard status: ``# HELP`` and ``# TYPE`` once per metric, its samples together."""
    by_name: dict = {}
    for name, labels, value in samples(status):
        by_name.setdefault(name, []).append(sample(name, labels, value))
    lines = []
    for name, kind, text in METRICS:
        if name in by_name:
            lines += ["# HELP %s%s %s" % (PREFIX, name, text), "# TYPE %s%s %s" % (PREFIX, name, kind)]
            lines += by_name[name]
    return "\n".join(lines) + "\n"
