# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet rollout's decisions: its settings, each host's status, the batch gate, the measure gate, the summary.

playbooks/rollout.yml orchestrates (serial batches, plays, the end of a stopped rollout) and renders;
every status, count, gate and parse is decided here, through the filters of plugins/filter/rollout.py.
Plain Python, no Ansible import.
"""

from __future__ import annotations

import base64
import math
import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.plugin_utils import benchmark

FLOWS = ("runtime", "persistent")
STATUSES = ("done", "failed", "unhealthy", "unreachable", "out_of_service")
DEFAULTS = {"flow": "runtime", "canary": 1, "batch": "20%", "max_fail_percentage": 0.0, "health_gate": True,
            "benchmark_command": None, "benchmark_min_gain": 0.0}
# The measure gate's result format, metrics, repeats (plugin_utils/benchmark.py fills their defaults).
BENCHMARK_KEYS = ("benchmark_format", "benchmark_result_file", "benchmark_metrics", "benchmark_repeats",
                  "benchmark_warmup", "benchmark_unchanged")
TASK_FAILED = "Task failed: "
_PERCENT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)%$")
_INTEGER = re.compile(r"^[0-9]+$")
_NUMBER = re.compile(r"^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$")
_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
BATCH_ALLOWED = ("a host count of 1 or more, a share of the remaining hosts from 1% to 100% (\"20%\"), or a "
                 "list of those (Ansible's serial)")


def _batch_item(value: Any) -> tuple[Any, str | None]:
    if isinstance(value, bool):
        return None, "got %s" % benchmark.shown(value)
    if isinstance(value, int):
        return (value, None) if value >= 1 else (None, "got %d" % value)
    if isinstance(value, str):
        text = value.strip()
        if _INTEGER.match(text):
            return _batch_item(int(text))
        match = _PERCENT.match(text)
        if match and 0 < float(match.group(1)) <= 100:
            return text, None
    return None, "got %s" % benchmark.shown(value)


def parse_batch(value: Any) -> tuple[list, list]:
    """``(serial items, errors)`` of gpunode_tuning_rollout_batch."""
    items = value if isinstance(value, (list, tuple)) else [value]
    out, errors = [], []
    if not items:
        errors.append("got an empty list")
    for item in items:
        parsed, problem = _batch_item(item)
        if problem:
            errors.append(problem)
        else:
            out.append(parsed)
    return out, errors


def _number(value: Any) -> float | None:
    """A finite number from a number or its text; None otherwise (text like 'abc', inf, nan, booleans)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str) and _NUMBER.match(value.strip()):
        number = float(value.strip())
    else:
        return None
    return number if math.isfinite(number) else None


def _command_problem(command: Any) -> str | None:
    if command is None:
        return None
    if isinstance(command, str):
        return None if command.strip() and "\0" not in command else "an empty string"
    if isinstance(command, (list, tuple)) and command and all(isinstance(a, str) and a for a in command):
        return None
    return benchmark.shown(command)


def settings(raw: dict) -> tuple[dict, list]:
    """``(settings, errors)`` from the rollout's variables (``gpunode_tuning_rollout_*`` without the prefix).

    Every error names the variable, what it got and what is allowed; the settings are meaningful only
    when there is none.
    """
    got = dict(DEFAULTS)
    got.update({k: v for k, v in raw.items() if k in DEFAULTS and v is not None or k == "benchmark_command"})
    errors = []
    if got["flow"] not in FLOWS:
        errors.append("gpunode_tuning_rollout_flow must be one of: %s (got %s)"
                      % (", ".join(FLOWS), benchmark.shown(got["flow"])))
    canary = got["canary"]
    if isinstance(canary, bool) or not _INTEGER.match(str(canary).strip()):
        errors.append("gpunode_tuning_rollout_canary must be a host count of 0 or more (0: no canary) (got %s)"
                      % benchmark.shown(canary))
    else:
        got["canary"] = int(str(canary).strip())
    batch, problems = parse_batch(got["batch"])
    errors += ["gpunode_tuning_rollout_batch must be %s (%s)" % (BATCH_ALLOWED, p) for p in problems]
    got["serial"] = ([got["canary"]] if isinstance(got["canary"], int) and got["canary"] > 0 else []) + batch
    pct = _number(got["max_fail_percentage"])
    if pct is None or not 0 <= pct <= 100:
        errors.append("gpunode_tuning_rollout_max_fail_percentage must be a number from 0 to 100 (got %s)"
                      % benchmark.shown(got["max_fail_percentage"]))
    got["max_fail_percentage"] = pct
    gate = _BOOLS.get(str(got["health_gate"]).strip().lower()) if not isinstance(got["health_gate"], bool) \
        else got["health_gate"]
    if gate is None:
        errors.append("gpunode_tuning_rollout_health_gate must be true or false (got %s)"
                      % benchmark.shown(got["health_gate"]))
    got["health_gate"] = gate
    problem = _command_problem(got["benchmark_command"])
    if problem:
        errors.append("gpunode_tuning_rollout_benchmark_command must be null (no measure gate), a command string or "
                      "a non-empty list of non-empty argument strings (got %s)" % problem)
    gain = _number(got["benchmark_min_gain"])
    if gain is None or gain <= -1:
        errors.append("gpunode_tuning_rollout_benchmark_min_gain must be a fraction above -1 (a finite number), e.g. "
                      "0.0 (must not get worse) or 0.05 (got %s)" % benchmark.shown(got["benchmark_min_gain"]))
    got["benchmark_min_gain"] = gain
    measure, problems = benchmark.check_settings({k: raw.get(k) for k in BENCHMARK_KEYS})
    got.update(measure)
    return got, errors + problems


def serial(raw: dict) -> list:
    """The rollout play's ``serial``: the canary batch, then the batches; [1] when the settings are bad
    (the first play has already refused them, so no host reaches this play)."""
    got, errors = settings(raw)
    return got["serial"] if not errors and got["serial"] else [1]


def benchmark_reading(run: dict, host: str, phase: str, limit: Any = None) -> tuple[float | None, str]:
    """``(value, problem)`` of a benchmark run (the command task's result): one finite positive number.

    The benchmark runs under coreutils' timeout with ``limit`` seconds: its exit status 124 is a hang.
    """
    out = str(run.get("stdout") or "").strip()
    rc = run.get("rc")
    value = _number(out) if rc == 0 else None
    if value is not None and value > 0:
        return value, ""
    if rc == 0:
        did = "printed"
    elif rc == 124 and limit is not None:
        did = "did not answer within %s s (killed; a wedged GPU, or a benchmark that does not finish)" % limit
    else:
        did = "exited with %s" % (rc if rc is not None else "no status")
    text = ("%s %s" % (out, str(run.get("stderr") or "").strip())).strip()
    if not text:
        cmd = run.get("cmd")
        text = "%s (%s)" % (run.get("msg") or "no output", cmd if isinstance(cmd, str) else " ".join(cmd or []))
    return None, ("the benchmark on %s (%s tuning) must print one positive finite number, higher is better; it %s: %s"
                  % (host, phase, did, text[:500]))


def benchmark_verdict(bench: dict, problem: str) -> dict:
    """The measure gate after tuning: ``gain`` (after / before - 1), ``kept`` and the ``reason`` when not kept."""
    out = dict(bench)
    gain = None if problem else round(float(bench["after"]) / float(bench["before"]) - 1, 4)
    kept = gain is not None and gain >= float(bench["min_gain"])
    if kept:
        reason = ""
    elif problem:
        reason = "measure gate: " + problem
    else:
        reason = "measure gate: gain %s below min_gain %s (benchmark before %s, after %s)" % (
            gain, bench["min_gain"], bench["before"], bench["after"])
    out.update(gain=gain, kept=kept, reason=reason)
    return out


def _run_text(run: dict, settings: dict) -> tuple[str | None, str]:
    """``(text to read, problem)`` of one run: its output, or what it wrote to the result file (sglang's
    --output-file gains one JSON line per run: only the line this run appended is read)."""
    path = settings.get("benchmark_result_file")
    if not path:
        return str(run.get("stdout") or ""), ""
    if run.get("content") is None:
        return None, "its result file %s could not be read (%s)" % (path, run.get("slurp_msg") or "no such file")
    try:
        content = base64.b64decode(run["content"])
    except (TypeError, ValueError):
        return None, "its result file %s could not be decoded" % path
    if settings.get("benchmark_format") == "sglang":
        text = benchmark.last_line(benchmark.appended(content, run.get("offset")).decode("utf-8", "replace"))
        return (text, "") if text else (None, "it appended no line to its result file %s" % path)
    return content.decode("utf-8", "replace"), ""


def _run_problems(runs: list, what: str, host: str, phase: str, fmt: str, metrics: list, settings: dict,
                  limit: Any) -> tuple[list, list]:
    """``(readings, problems)`` of runs read in ``fmt``: each failed or unreadable run named "WHAT k of N ..."."""
    readings, problems = [], []
    for number, run in enumerate(runs, 1):
        if run.get("rc") != 0:
            problem = benchmark_reading(run, host, phase, limit)[1].split("; it ", 1)[-1]
            problems.append("%s %d of %d %s" % (what, number, len(runs), problem))
            continue
        text, problem = _run_text(run, settings)
        values, problem = (None, problem) if text is None else benchmark.read(fmt, text, metrics)
        if values is None:
            problems.append("%s %d of %d: %s" % (what, number, len(runs), problem))
        else:
            readings.append(values)
    return readings, problems


def _warmup_words(before: list, after: list) -> str:
    """The failed or unreadable warm-up runs of both sides, said as not counted ("" without any)."""
    sides = [("%s tuning: %s" % (side, "; ".join(notes))) for side, notes in (("before", before), ("after", after))
             if notes]
    return ("warm-up runs not counted (failed or unreadable): %s" % " | ".join(sides))[:1000] if sides else ""


def benchmark_runs(runs: list, host: str, phase: str, bench: dict, settings: dict, limit: Any = None) -> dict:
    """The measure gate's side ``phase`` from its runs (the command results, warm-up runs first): the counted
    runs read in the benchmark's format, and after tuning the verdict. ``{bench, problem}``.

    A warm-up run is read too but never counted: one that fails or cannot be read is named in
    ``PHASE_warmup_problems`` and in the message (the reason after tuning, the problem before it).
    The number format with one run, no warm-up and no result file is today's gate, unchanged.
    """
    fmt = settings.get("benchmark_format") or "number"
    warmup = int(settings.get("benchmark_warmup") or 0)
    out = dict(bench or {})
    if fmt == "number" and len(runs) == 1 and not warmup and not settings.get("benchmark_result_file"):
        value, problem = benchmark_reading(runs[0], host, phase, limit)
        out[phase] = value
        return {"bench": benchmark_verdict(out, problem) if phase == "after" else out, "problem": problem}
    metrics = settings.get("benchmark_metrics") or benchmark.DEFAULT_METRICS["number"]
    if warmup:
        out[phase + "_warmup_problems"] = _run_problems(runs[:warmup], "warm-up run", host, phase, fmt, metrics,
                                                        settings, limit)[1]
    counted = runs[warmup:]
    readings, problems = _run_problems(counted, "run", host, phase, fmt, metrics, settings, limit)
    problem = ""
    if problems:
        problem = ("the benchmark on %s (%s tuning) is a failed measurement (a run that fails or cannot be read "
                   "counts as failed, never as zero): %s" % (host, phase, "; ".join(problems)))[:2000]
    warm = _warmup_words(out.get("before_warmup_problems") or [],
                         out.get("after_warmup_problems") or [] if phase == "after" else [])
    primary = next(m["name"] for m in metrics if m["primary"])
    out["format"], out[phase + "_runs"] = fmt, readings
    out[phase] = None if problem else round(benchmark.median([r[primary] for r in readings]), 6)
    if phase != "after":
        return {"bench": out, "problem": "; ".join(p for p in (problem, warm) if p) if problem else ""}
    if problem:
        out.update(gain=None, kept=False, reason="; ".join(p for p in ("measure gate: " + problem, warm) if p))
        return {"bench": out, "problem": problem}
    judged = benchmark.verdict(metrics, out["before_runs"], readings, settings.get("benchmark_unchanged") or "keep")
    out.update(metrics=judged["metrics"], primary=judged["primary"], primary_verdict=judged["primary_verdict"])
    if fmt == "number":  # min_gain keeps its meaning, on the medians
        out = benchmark_verdict(out, "")
        out["primary_verdict"] = judged["primary_verdict"]
    else:
        out.update(gain=round(judged["gain"], 4), kept=judged["kept"], reason=judged["reason"])
    out["reason"] = "; ".join(p for p in (out["reason"], warm) if p)
    return {"bench": out, "problem": ""}


def host_status(state: dict) -> str:
    """done, failed, unhealthy or unreachable, from what the rollout play recorded for the host."""
    if state.get("out_of_service"):
        return "out_of_service"
    if state.get("unreachable"):
        return "unreachable"
    if state.get("findings"):
        return "unhealthy"
    errors = ("health_error", "tune_error", "verify_error", "benchmark_error", "reboot_error")
    if any(state.get(k) for k in errors) or state.get("measure_failed"):
        return "failed"
    return "done"


def _reason(state: dict, status: str) -> str:
    if status == "unreachable":
        message = " ".join(str(state.get("unreachable_msg") or "no answer").split())
        # ansible-core 2.19 puts "Task failed: " before the connection's message in a task's result; the
        # rollout's one task reads the connection's own.
        return "unreachable: " + (message[len(TASK_FAILED):] if message.startswith(TASK_FAILED) else message)
    if status == "unhealthy":
        return "GPU health (not tuned): " + "; ".join(state["findings"])
    if status == "out_of_service":
        return ("out of service before the run, not by gpunode.tuning (%s): not tuned, drained, rebooted or resumed"
                % state["out_of_service"])
    bench = state.get("benchmark") or {}
    parts = [("health check failed (not tuned): %s" % state["health_error"]) if state.get("health_error") else "",
             ("tuning failed: %s" % state["tune_error"]) if state.get("tune_error") else "",
             ("benchmark failed: %s" % state["benchmark_error"]) if state.get("benchmark_error")
             else bench.get("reason") or "",
             ("verification failed: %s" % state["verify_error"]) if state.get("verify_error") else "",
             ("reboot sequence: %s" % state["reboot_error"]) if state.get("reboot_error") else ""]
    return "; ".join(p for p in parts if p)


def reboot_record(reboot: Any) -> dict | None:
    """What the summary says of the host's reboot sequence (the tuning_reboot task's result), None without one."""
    if not isinstance(reboot, dict) or reboot.get("skipped") or not reboot:
        return None
    keys = ("rebooted", "returned", "stays_drained", "stage", "waited", "drain_s", "reboot_s", "backend", "reason",
            "would", "adopted", "held", "released", "already_booted", "msg")
    out = {k: reboot[k] for k in keys if k in reboot}
    out["failed"] = bool(reboot.get("failed"))
    return out


def host_result(state: dict) -> dict:
    """The host's record in the summary, from what the rollout play recorded for it."""
    status = host_status(state)
    judged = status != "unreachable" and not state.get("check_mode") and state.get("cleared")
    verification = state.get("verification") or {}
    gate = verification.get("gate") or {}
    if state.get("health_gate") is False or status == "unreachable":
        health = "not checked"
    else:
        health = "error" if state.get("health_error") else "unhealthy" if state.get("findings") else "healthy"
    return {"host": state["host"], "batch": int(state["batch"]), "canary": bool(state.get("canary")),
            "status": status, "reason": _reason(state, status),
            "verification": (gate.get("status") or verification.get("status") or "not run") if judged else "not run",
            "reboot_required": bool(state.get("reboot_required")),
            "not_rebooted_for": dict(state.get("not_rebooted_for") or {}),
            "needs_reboot": list(verification.get("needs_reboot") or []) if judged else [],
            "health": health, "findings": list(state.get("findings") or []),
            "benchmark": state.get("benchmark") if state.get("measure") else None,
            "reboot": reboot_record(state.get("reboot"))}


def batch_gate(results: list, batch: int, canary: bool, max_fail_percentage: float) -> dict | None:
    """None when the batch passes; else why the rollout stops (the canary batch allows no failed host)."""
    failed = [r["host"] for r in results if r["status"] != "done"]
    pct = round(100.0 * len(failed) / len(results), 1) if results else 0.0
    allowed = 0.0 if canary else float(max_fail_percentage)
    # A host that failed after its drain stays out of service: no later batch reboots, whatever the share allows.
    drained = [r["host"] for r in results if (r.get("reboot") or {}).get("stays_drained")]
    if pct <= allowed and not drained:
        return None
    out = {"batch": batch, "canary": canary, "failed_hosts": failed, "batch_hosts": len(results),
           "failed_percentage": pct, "allowed_percentage": allowed}
    return dict(out, stays_drained=drained) if drained else out


def summary(hosts: list, results: list, stopped: dict | None, config: dict, generated_at: str) -> dict:
    """The rollout summary (rollout-summary.json; the Markdown renders it)."""
    seen = {r["host"] for r in results}
    skipped = [h for h in hosts if h not in seen]
    counts = {s: sum(1 for r in results if r["status"] == s) for s in STATUSES}
    counts["skipped"] = len(skipped)
    if stopped is not None:
        why = "the rollout stopped after batch %s%s" % (stopped["batch"], " (canary)" if stopped["canary"] else "")
    else:
        why = "not reached: the rollout play ended early (see its output)"
    return {"generated_at": generated_at, "settings": config, "stopped": stopped, "hosts": len(hosts),
            "counts": counts, "results": results, "skipped": skipped,
            "needs_reboot_hosts": [r["host"] for r in results if r.get("needs_reboot")], "skipped_reason": why,
            "not_rebooted": not_rebooted(results),
            "complete": stopped is None and counts["done"] == len(hosts),
            "benchmark_fleet": benchmark.fleet_changes(results)}


def not_rebooted(results: list) -> list:
    """The settings no host was rebooted for because it cannot take them (fit before tuned): ``[{host, setting,
    reason}]``, from the persistent flow's ``not_rebooted_for``."""
    return [{"host": r["host"], "setting": setting, "reason": why} for r in results
            for setting, why in sorted((r.get("not_rebooted_for") or {}).items())]


def reboot_lines(results: list) -> list:
    """The reboot sequence in the summary: who would be (check mode) or was drained and rebooted, who stays
    drained, who waited for a slot, and whether hosts rebooted without a drain."""
    lines = []
    for r in results:
        rb = dict(r.get("reboot") or {})
        if not rb:
            continue
        if str(rb.get("msg", "")).startswith(r["host"] + ": "):
            rb["msg"] = rb["msg"][len(r["host"]) + 2:]
        elif str(rb.get("msg", "")).startswith(r["host"] + " "):
            rb["msg"] = rb["msg"][len(r["host"]) + 1:]
        if rb.get("would"):
            lines.append("%s: would %s (%s)" % (r["host"], rb["would"], rb.get("reason", "")))
        elif rb.get("stays_drained"):
            lines.append("%s: stays drained (%s), out of service: %s" % (r["host"], rb.get("stage"), rb.get("msg", "")))
        elif rb.get("released"):
            lines.append("%s: our claim ended, left as it is: %s" % (r["host"], rb.get("msg", "")))
        elif rb.get("returned"):
            lines.append("%s: %s%s" % (r["host"], rb.get("msg", ""),
                                       " after waiting %s s for a slot" % rb["waited"] if rb.get("waited") else ""))
        elif rb.get("failed"):
            lines.append("%s: reboot: %s" % (r["host"], rb.get("msg", "")))
    if any((r.get("reboot") or {}).get("backend") == "none" and (r.get("reboot") or {}).get("rebooted")
           for r in results):
        lines.append("hosts were rebooted without a drain (gpunode_tuning_drain: none)")
    return lines


def summary_lines(summ: dict) -> list:
    """What the end of the rollout prints: the counts, each host not done with why, the skipped ones."""
    c = summ["counts"]
    oos = (", %d out of service" % c["out_of_service"]) if c.get("out_of_service") else ""
    lines = ["%d host(s): %d done, %d failed, %d unhealthy, %d unreachable%s, %d skipped" % (
        summ["hosts"], c["done"], c["failed"], c["unhealthy"], c["unreachable"], oos, c["skipped"])]
    lines += ["%s: %s: %s" % (r["host"], r["status"], r["reason"]) for r in summ["results"] if r["status"] != "done"]
    lines += reboot_lines(summ["results"])
    lines += ["%s: not rebooted for %s (the node cannot take it): %s" % (n["host"], n["setting"], n["reason"])
              for n in summ.get("not_rebooted") or []]
    if summ["skipped"]:
        lines.append("skipped (%s): %s" % (summ["skipped_reason"], ", ".join(summ["skipped"])))
    reboot = [r["host"] for r in summ["results"] if r.get("reboot_required")]
    if reboot:
        lines.append("reboot required: " + ", ".join(reboot))
    need = summ["needs_reboot_hosts"]
    if need:
        lines.append("%d host(s) still need the persistent flow and a reboot (what for: rollout-summary.md): %s%s"
                     % (len(need), ", ".join(need[:10]), ", ..." if len(need) > 10 else ""))
    return lines
