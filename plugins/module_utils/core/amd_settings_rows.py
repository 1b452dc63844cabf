# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verification rows of AMD GPU settings: desired power cap, performance level, determinism and partitions
against the GPU probe's amd-smi answers (core/amd_health.py's calls, read by core/amd_smi.py).

Verification's half of core/amd_settings.py: a run that only applies does not import it. Plain Python (3.8+), no
Ansible import; names no family (the caller passes its row factory).
"""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_health, amd_smi
from ansible_collections.gpunode.tuning.plugins.module_utils.core.amd_settings import PARTITION_OPTIONS, raw_caps


def gpu_name(g: dict) -> str:
    """``GPU <index> (<address>)``: how a row names a GPU."""
    return "GPU %s (%s)" % (g["index"], g["bdf"])


def amd_probe_gpus(probe: dict, need_metric: bool) -> tuple:
    """``(gpus, why)``: the GPUs of the probe's ``amd-smi static`` (and ``metric``) answers as ``read_amd_gpus``
    reads them, or why there are none (the call's failure, or its finding)."""
    answers = {}
    refused = amd_health.refusals(probe)
    for key in ("amd_static",) + (("amd_metric",) if need_metric else ()):
        answer = probe.get(key)
        if key in refused:
            return [], amd_health.refused_reason(probe, key, refused[key])
        why = amd_health.call_failure(key, answer)
        if why:
            return [], why
        answers[key] = answer.get("stdout") or ""
    static = amd_smi.read_static(answers["amd_static"])
    metric = amd_smi.read_metric(answers.get("amd_metric")) if need_metric else {"gpus": [], "finding": None}
    for key, answer in (("amd_static", static), ("amd_metric", metric)):
        if answer["finding"]:
            return [], "%s: %s" % (amd_health.argv_text(key), answer["finding"])
    levels = {r["gpu"]: r.get("perf_level") for r in metric["gpus"]}
    caps = raw_caps(answers["amd_static"])
    return [{"bdf": r["bdf"], "index": r["gpu"], "limit": caps.get(r["gpu"], r.get("power_cap_w")),
             "perf_level": levels.get(r["gpu"]), "compute_partition": r.get("compute_partition"),
             "memory_partition": r.get("memory_partition")} for r in static["gpus"]], None


def _power_row(row: Callable, key: str, power: dict, gpus: list) -> dict:
    listed = {g["bdf"] for g in gpus}
    off = ["amd-smi lists no GPU at %s" % b for b in sorted(power) if b != "*" and b not in listed]
    for g in gpus:
        watts = power.get(g["bdf"], power.get("*"))
        if watts is None:
            continue
        if g["limit"] is None:
            off.append("%s: no power cap (N/A), wanted %d W" % (gpu_name(g), watts))
        elif abs(g["limit"] - watts) >= 0.5:
            off.append("%s: cap %g W, wanted %d W" % (gpu_name(g), g["limit"], watts))
    if off:
        return row(key, power, "; ".join(off)[:300], "drifted", "power cap differs: " + "; ".join(off))
    return row(key, power, "as wanted", "applied", "")


def _level_row(row: Callable, key: str, wanted: Any, gpus: list) -> dict:
    level = "determinism" if key == "perf_determinism_mhz" else wanted
    off = ["%s: %s, wanted %s" % (gpu_name(g), g["perf_level"] or "no perf level (N/A)", level)
           for g in gpus if g["perf_level"] != level]
    note = ("; amd-smi reports no determinism ceiling: the level (determinism) is what is verified"
            if key == "perf_determinism_mhz" else "")
    if off:
        return row(key, wanted, "; ".join(off)[:300], "drifted",
                   "performance level differs: %s%s" % ("; ".join(off), note))
    return row(key, wanted, level, "applied", note.lstrip("; "))


def _partition_row(row: Callable, key: str, wanted: str, gpus: list) -> dict:
    """A partition mode per physical GPU (the partitions of a CPX/DPX/QPX GPU counted once)."""
    physical: dict = {}
    for g in gpus:
        physical.setdefault(amd_smi.physical_bdf(g["bdf"]) or g["bdf"], g)
    off, unknown, ids = [], [], []
    for _bdf, g in sorted(physical.items()):
        mode = (g[key] or "").upper() or None
        if mode is None:
            unknown.append(gpu_name(g))
        elif mode != wanted:
            off.append("%s: %s, wanted %s" % (gpu_name(g), mode, wanted))
            ids.append(str(g["index"]))
    what = key.replace("_", " ")
    if unknown and len(unknown) == len(physical):
        return row(key, wanted, None, "unsupported", "amd-smi static gives no %s (N/A) for %s: the GPUs have no "
                   "partitions (MI300 class and later)" % (what, ", ".join(unknown)))
    if off or unknown:
        reload = ", and the amdgpu driver reloads" if key == "memory_partition" else ""
        command = "amd-smi set -g %s %s %s" % (" ".join(ids), PARTITION_OPTIONS[key], wanted)
        fix = ("; verified only: this collection never changes a %s (it stops every process on the GPU%s); "
               "`%s` changes it" % (what, reload, command)) if ids else ""
        lost = ["no %s (N/A) for %s" % (what, ", ".join(unknown))] if unknown else []
        return row(key, wanted, "; ".join(off + lost)[:300], "drifted",
                   "%s differs: %s%s" % (what, "; ".join(off + lost), fix))
    return row(key, wanted, wanted, "applied", "%d GPU(s) in %s" % (len(physical), wanted))


def setting_rows(row: Callable[..., dict], asked: list, gpus: list) -> list:
    """The rows of the ``asked`` settings (``[(key, wanted)]``: power_limit, perf_level, perf_determinism_mhz,
    compute_partition, memory_partition) against ``gpus`` (``amd_probe_gpus``), each built with
    ``row(key, desired, running, state, reason)``."""
    build = {"power_limit": _power_row, "perf_level": _level_row, "perf_determinism_mhz": _level_row,
             "compute_partition": _partition_row, "memory_partition": _partition_row}
    return [build[k](row, k, v, gpus) for k, v in asked]
