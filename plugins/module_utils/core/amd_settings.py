# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU settings of AMD Instinct GPUs through amd-smi: read, plan, set, read back, restore.

``amd-smi set -g N [N ...] --power-cap W`` (watts on the CLI; the library takes microwatts),
``--perf-level LEVEL`` and ``--perf-determinism MHZ`` (AMD SMI docs, "Performance levels and performance
determinism"). ``set`` names its GPUs with ``-g``, which takes several: one call per distinct wanted value,
for the GPUs that differ only. The cap is read back from ``amd-smi static --json`` (``limit.socket_power``,
6.0's ``limit.current_power``), the level from ``amd-smi metric --json`` (``perf_level``). Every call runs
through the module's runner, bounded by ``command_timeouts.amd_smi``. amd-smi's answers are read by
core/amd_smi.py; verification's rows are core/amd_settings_rows.py.

The GPU settings family runs this on a node whose GPUs are AMD's. Plain Python (3.8+), no Ansible import; names
no family (the caller passes its journal key).
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_smi, family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError

# amd-smi's performance levels (``amd-smi set --perf-level``; AMD SMI's perf-determinism guide lists them).
AMD_PERF_LEVELS = ("auto", "low", "high", "manual", "stable_std", "stable_peak", "stable_min_mclk",
                   "stable_min_sclk", "determinism")
# The partition modes, verified only, never changed (changing them stops every process on the GPU; a memory
# partition needs a driver reload). They are AMD SMI's
# (https://rocm.docs.amd.com/projects/amdsmi/en/latest/conceptual/partition.html: accelerator/compute partitions
# SPX, DPX, TPX, QPX, CPX; memory partitions NPS1, NPS2, NPS4, NPS8, amdsmi_memory_partition_type_t).
AMD_PARTITIONS = {"compute_partition": ("SPX", "DPX", "TPX", "QPX", "CPX"),
                  "memory_partition": ("NPS1", "NPS2", "NPS4", "NPS8")}
# amd-smi set's option for each (``amd-smi set -g N --compute-partition CPX``).
PARTITION_OPTIONS = {"compute_partition": "--compute-partition", "memory_partition": "--memory-partition"}
# The journal key of each setting's original (``<key>:<PCI address>``).
AMD_JOURNAL = {"power_limit": "amd_power_cap", "perf_level": "amd_perf_level"}


def amd_watts(raw: Any) -> float | None:
    """A power cap in watts: amd-smi prints W from 6.1 on; a value in uW (its unit says so, or a bare number
    too big for watts, as the library's microwatts) is converted."""
    n = amd_smi.number(raw)
    if n is None:
        return None
    unit = (amd_smi.unit(raw) or "").replace("\u00b5", "u").lower()
    return float(n) / 1e6 if unit == "uw" or (not unit and n > 100000) else float(n)


def read_amd_gpus(run, smi: str) -> list:
    """``[{bdf, index, limit, min, max, perf_level, compute_partition, memory_partition}]`` from one
    ``amd-smi static --json`` and one ``amd-smi metric --json`` call; FamilyError naming what amd-smi did."""
    answers = {}
    for name in ("static", "metric"):
        argv = [smi] + list(amd_smi.COMMANDS[name]["argv"])
        rc, out, err = run(argv)
        if rc != 0:
            raise family.FamilyError("GPU settings not read: amd-smi %s rc %s: %s"
                                     % (name, rc, (err or out).strip()[:200]))
        answers[name] = out
    static = amd_smi.read_static(answers["static"])
    metric = amd_smi.read_metric(answers["metric"])
    for name, answer in (("static", static), ("metric", metric)):
        if answer["finding"]:
            raise family.FamilyError("GPU settings not read: amd-smi %s: %s" % (name, answer["finding"]))
    levels = {r["gpu"]: r.get("perf_level") for r in metric["gpus"]}
    caps = raw_caps(answers["static"])
    return [{"bdf": r["bdf"], "index": r["gpu"], "limit": caps.get(r["gpu"], r.get("power_cap_w")),
             "min": r.get("power_cap_min_w"), "max": r.get("power_cap_max_w"), "perf_level": levels.get(r["gpu"]),
             "compute_partition": r.get("compute_partition"), "memory_partition": r.get("memory_partition")}
            for r in static["gpus"]]


def raw_caps(text: str) -> dict:
    """``{gpu index: cap in W}`` from the raw static records (the unit decides W or uW)."""
    records, _finding = amd_smi.entries(amd_smi.load_json(text)["data"])
    out = {}
    for entry in records:
        raw = amd_smi.dig(entry, ("limit", "socket_power"), ("limit", "current_power"))
        out[amd_smi.integer(entry.get("gpu"))] = amd_watts(raw)
    return out


def amd_plan(gpus: list, want: dict) -> list:
    """``[(bdf, key, original, wanted)]`` of the AMD GPUs that differ; FamilyError before any write for a cap
    outside a GPU's range or an address amd-smi does not list."""
    listed = {g["bdf"] for g in gpus}
    unknown = sorted(b for b in want["power"] if b != "*" and b not in listed)
    if unknown:
        raise family.FamilyError("power_limits: amd-smi lists no GPU at %s; it lists: %s"
                                 % (", ".join(unknown), ", ".join(sorted(listed)) or "none"))
    level = "determinism" if want.get("determinism") else want.get("perf_level")
    steps = []
    for g in gpus:
        watts = want["power"].get(g["bdf"], want["power"].get("*"))
        if watts is not None:
            if g["min"] is not None and g["max"] is not None and not g["min"] <= watts <= g["max"]:
                raise family.FamilyError("power limit %d W for %s is outside its range %.0f-%.0f W; nothing was "
                                         "changed" % (watts, g["bdf"], g["min"], g["max"]))
            if g["limit"] is None or abs(g["limit"] - watts) >= 0.5:
                steps.append((g["bdf"], "power_limit", g["limit"], watts))
        if level is not None and g["perf_level"] != level:
            steps.append((g["bdf"], "perf_level", g["perf_level"], level))
    return steps


def amd_argvs(smi: str, gpus: list, steps: list, determinism: int | None = None) -> list:
    """``[(argv, [step, ...])]``: one ``amd-smi set -g I J ...`` per setting and wanted value."""
    index = {g["bdf"]: g["index"] for g in gpus}
    groups: dict = {}
    for step in steps:
        groups.setdefault((step[1], step[3]), []).append(step)
    out = []
    for (key, value), members in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        ids = [str(index[s[0]]) for s in members]
        if key == "power_limit":
            option = ["--power-cap", "%d" % round(float(value))]
        elif value == "determinism" and determinism:
            option = ["--perf-determinism", str(determinism)]
        else:
            option = ["--perf-level", str(value).upper()]
        out.append(([smi, "set", "-g"] + ids + option, members))
    return out


def amd_execute(call: family.Call, smi: str, gpus: list, steps: list, determinism: int | None = None) -> list:
    """Run the grouped ``amd-smi set`` calls: ``[(step, error)]`` of those that failed (the others still run)."""
    failed = []
    for argv, members in amd_argvs(smi, gpus, steps, determinism):
        rc, out, err = call.run_command(argv)
        refused = amd_smi.refusal((rc, out, err))
        error = amd_smi.error_document(out) or amd_smi.error_document(err)
        if refused:  # up to ROCm 7.1 amd-smi prints its refusal and exits 0: nothing was set
            why = "%s: this amd-smi does not offer it (%s)" % (" ".join(argv[1:]), refused)
        elif error:
            why = "%s: amd-smi rc %s: %s (code %s)" % (" ".join(argv[1:]), rc, error["error"][:200], error["code"])
        elif rc != 0:
            why = "%s: amd-smi rc %s: %s" % (" ".join(argv[1:]), rc, (err or out).strip()[:200])
        else:
            continue
        failed += [(s, why) for s in members]
    return failed


def find_amd_smi(node: Node, lookup: Any) -> str:
    """amd-smi of the node (PATH, then /opt/rocm/bin); on a simulated root only the node's own stand-in."""
    try:
        return node.bin_path(lookup, "amd-smi", "amd-smi-lib", host=node.is_live)
    except NodeError:
        candidate = node.path("opt/rocm/bin", "amd-smi")
        if os.access(candidate, os.X_OK):
            return candidate
        raise


def amd_result(steps: list, gpus: list) -> dict:
    changes = [{"gpu": bdf, "vendor": "amd", "setting": key, "before": before, "after": after}
               for bdf, key, before, after in steps]
    return {"changed": bool(changes), "changes": changes,
            "gpus": [{"bdf": g["bdf"], "vendor": "amd", "power_limit": g["limit"], "perf_level": g["perf_level"],
                      "compute_partition": g["compute_partition"], "memory_partition": g["memory_partition"]}
                     for g in gpus]}


def amd_readback_errors(gpus: list, steps: list) -> list:
    """What amd-smi accepted but does not report afterwards."""
    by_bdf = {g["bdf"]: g for g in gpus}
    errors = []
    for bdf, key, _before, after in steps:
        g = by_bdf.get(bdf, {})
        now = g.get("limit") if key == "power_limit" else g.get("perf_level")
        if key == "power_limit" and (now is None or abs(now - float(after)) >= 0.5) or \
                key == "perf_level" and now != after:
            errors.append("%s %s: amd-smi reports %s after setting %s" % (bdf, key, now, after))
    return errors


def run_amd(call: family.Call, node: Node, journal, want: dict | None, restore: bool, name: str) -> dict:
    """The GPU settings on a node whose GPUs are AMD's: plan, journal (under the family ``name``), ``amd-smi set``,
    read back (or restore)."""
    try:
        smi = find_amd_smi(node, call.lookup)
    except NodeError as exc:
        raise family.FamilyError(str(exc)) from None
    gpus = read_amd_gpus(call.run_command, smi)
    if restore:
        return _amd_restore(call, journal, smi, gpus, name)
    return _amd_apply(call, journal, smi, gpus, want, name)


def _amd_restore(call: family.Call, journal, smi: str, gpus: list, name: str) -> dict:
    """Write the journaled AMD originals back; what could not be restored stays in the journal."""
    by_bdf = {g["bdf"]: g for g in gpus}
    steps, keys = [], {}
    for key, original in sorted(journal.entries(name).items()):
        kind, _sep, bdf = key.partition(":")
        setting = {v: k for k, v in AMD_JOURNAL.items()}.get(kind)
        if setting is None or bdf not in by_bdf or original is None:
            continue
        current = by_bdf[bdf]["limit" if setting == "power_limit" else "perf_level"]
        if setting == "power_limit" and current is not None and abs(current - float(original)) < 0.5 or \
                setting == "perf_level" and current == original:
            journal.drop(name, key)
            continue
        step = (bdf, setting, current, original)
        steps.append(step)
        keys[step] = key
    result = amd_result(steps, gpus)
    if call.check_mode:
        return result
    failed = amd_execute(call, smi, gpus, steps)
    for step in steps:
        if step not in [f for f, _e in failed]:
            journal.drop(name, keys[step])
    journal.save()
    result["gpus"] = amd_result([], read_amd_gpus(call.run_command, smi))["gpus"]
    if failed:
        raise family.FamilyError("GPU settings not restored (they stay in the journal): "
                                 + "; ".join(sorted({e for _s, e in failed})), result)
    return result


def _amd_apply(call: family.Call, journal, smi: str, gpus: list, want: dict, name: str) -> dict:
    """Plan, journal the originals, ``amd-smi set``, read back."""
    steps = amd_plan(gpus, want)
    result = amd_result(steps, gpus)
    if call.diff:
        result["diff"] = {"before": {"%s %s" % (s[0], s[1]): s[2] for s in steps},
                          "after": {"%s %s" % (s[0], s[1]): s[3] for s in steps}}
    if call.check_mode or not steps:
        return result
    if journal is not None:
        for bdf, key, before, _after in steps:
            if "%s:%s" % (AMD_JOURNAL[key], bdf) not in journal.entries(name):
                journal.record(name, "%s:%s" % (AMD_JOURNAL[key], bdf), before)
        journal.save()
    failed = amd_execute(call, smi, gpus, steps, want.get("determinism"))
    if journal is not None:
        journal.mark_applied(name)
        journal.save()
    after = read_amd_gpus(call.run_command, smi)
    result["gpus"] = amd_result([], after)["gpus"]
    errors = sorted({e for _s, e in failed})
    errors += amd_readback_errors(after, [s for s in steps if s not in [f for f, _e in failed]])
    if errors:
        raise family.FamilyError("GPU settings not applied: " + "; ".join(errors), result)
    return result
