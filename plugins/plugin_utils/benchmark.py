# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The measure gate's benchmark results: read each format, check the metric settings, decide the verdict.

Runs on the controller (through plugins/filter/rollout.py): the benchmark's output and its result file
come back to the controller anyway (the command task's stdout, a slurp), so reading them there needs
nothing on the node and no module run per reading. Plain Python, no Ansible import.

A reading is ``(values, problem)``: ``values`` maps each metric's name to a finite number; ``problem``
is empty, or says, naming the format, what was missing. A failed or unreadable run is a failed
measurement, never a zero. docs/measure-gate.md defines the verdict.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

FORMATS = ("number", "sglang", "vllm", "genai-perf", "nccl-tests", "json")
SERVING = ("sglang", "vllm")
UNCHANGED = ("keep", "rollback")
DEFAULT_GUARD_TOLERANCE = 10.0


def _m(name: str, better: str, tolerance: float, primary: bool = False) -> dict:
    return {"name": name, "better": better, "tolerance": tolerance, "primary": primary}


# Output token throughput primary; p99 time to first token and p99 inter-token latency guarded.
DEFAULT_METRICS = {
    "number": [_m("value", "higher", 0.0, True)],
    "sglang": [_m("output_throughput", "higher", 0.0, True), _m("p99_ttft_ms", "lower", DEFAULT_GUARD_TOLERANCE),
               _m("p99_itl_ms", "lower", DEFAULT_GUARD_TOLERANCE)],
    "vllm": [_m("output_throughput", "higher", 0.0, True), _m("p99_ttft_ms", "lower", DEFAULT_GUARD_TOLERANCE),
             _m("p99_itl_ms", "lower", DEFAULT_GUARD_TOLERANCE)],
    "genai-perf": [_m("output_token_throughput.avg", "higher", 0.0, True),
                   _m("time_to_first_token.p99", "lower", DEFAULT_GUARD_TOLERANCE),
                   _m("inter_token_latency.p99", "lower", DEFAULT_GUARD_TOLERANCE)],
    "nccl-tests": [_m("avg_busbw", "higher", 0.0, True)],
    "json": [],
}

# The names each format reads (what the precheck allows), as a pattern and in words.
_STAT = r"(mean|median|std|p[0-9]{1,2}(\.[0-9]+)?)"
_SERVING_NAMES = re.compile(r"^(%s_(ttft|tpot|itl|e2e_latency|e2el)_ms|request_throughput|input_throughput|"
                            r"output_throughput|total_token_throughput|total_throughput|request_goodput|"
                            r"concurrency|duration|completed)$" % _STAT)
_GENAI_NAMES = re.compile(r"^[a-z][a-z0-9_]*\.(avg|min|max|std|p[0-9]{1,2})$")
_NCCL_NAMES = ("avg_busbw", "busbw_largest", "algbw_largest")
ALLOWED_WORDS = {
    "number": "value (the one number the command prints)",
    "sglang": "output_throughput, request_throughput, input_throughput, total_throughput, concurrency, duration, "
              "completed, or STAT_KIND_ms with STAT mean, median, std or pNN and KIND ttft, tpot, itl or e2e_latency "
              "(e.g. p99_ttft_ms): the keys of bench_serving's --output-file line",
    "vllm": "output_throughput, request_throughput, total_token_throughput, request_goodput, completed, duration, "
            "or STAT_KIND_ms with STAT mean, median, std or pNN and KIND ttft, tpot, itl or e2el (e.g. p99_itl_ms): "
            "the keys of --save-result's file",
    "genai-perf": "METRIC.STAT with METRIC a key of profile_export_genai_perf.json (output_token_throughput, "
                  "request_throughput, time_to_first_token, inter_token_latency, request_latency, ...) and STAT "
                  "avg, min, max, std or pNN (e.g. time_to_first_token.p99)",
    "nccl-tests": ", ".join(_NCCL_NAMES),
    "json": "a dotted path to a number in the JSON the benchmark writes (e.g. results.throughput or runs.0.tps)",
}


def shown(value: Any) -> str:
    """A value as the user wrote it: text as is, anything else as JSON would show it."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _finite(value: Any) -> float | None:
    """A finite number (a JSON number, or text such as "1,287.08"); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(",", "")
        try:
            number = float(text)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def name_allowed(fmt: str, name: str) -> bool:
    if fmt == "number":
        return name == "value"
    if fmt in SERVING:
        return bool(_SERVING_NAMES.match(name))
    if fmt == "genai-perf":
        return bool(_GENAI_NAMES.match(name))
    if fmt == "nccl-tests":
        return name in _NCCL_NAMES
    return bool(re.match(r"^[^.\s][^\s]*$", name)) and ".." not in name and not name.endswith(".")


def _count(value: Any, default: int, least: int) -> tuple[int | None, bool]:
    if value is None:
        return default, True
    if isinstance(value, bool):
        return None, False
    if isinstance(value, int):
        return (value, True) if value >= least else (None, False)
    if isinstance(value, str) and value.strip().isdigit():
        return _count(int(value.strip()), default, least)
    return None, False


def _metric(fmt: str, where: str, item: Any) -> tuple[dict | None, list]:
    """One item of gpunode_tuning_rollout_benchmark_metrics with its defaults, and what is wrong with it."""
    if not isinstance(item, dict):
        return None, ["%s must be a mapping {name, better, tolerance, primary} (got %s)" % (where, shown(item))]
    errors = []
    unknown = sorted(set(item) - {"name", "better", "tolerance", "primary"})
    if unknown:
        errors.append("%s has unknown key(s) %s; allowed: name, better, tolerance, primary"
                      % (where, ", ".join(unknown)))
    name = item.get("name")
    if not isinstance(name, str) or not name_allowed(fmt, name):
        errors.append("%s.name %s is not a metric of the %s format; allowed: %s"
                      % (where, shown(name), fmt, ALLOWED_WORDS[fmt]))
    better = item.get("better", "higher")
    if better not in ("higher", "lower"):
        errors.append("%s.better must be higher or lower (got %s)" % (where, shown(better)))
    primary = item.get("primary", False)
    if not isinstance(primary, bool):
        errors.append("%s.primary must be true or false (got %s)" % (where, shown(primary)))
    tolerance = _finite(item.get("tolerance", 0.0 if primary is True else DEFAULT_GUARD_TOLERANCE))
    if tolerance is None or tolerance < 0:
        errors.append("%s.tolerance must be a percentage of 0 or more (how much worse the metric may get), "
                      "e.g. 5 (got %s)" % (where, shown(item.get("tolerance"))))
    return {"name": name, "better": better, "tolerance": tolerance, "primary": primary is True}, errors


def _metric_errors(fmt: str, metrics: Any) -> tuple[list, list]:
    """``(metrics with their defaults filled in, errors)`` of gpunode_tuning_rollout_benchmark_metrics."""
    var = "gpunode_tuning_rollout_benchmark_metrics"
    if metrics is None:
        if fmt == "json":
            return [], ["%s must name the metric for the json format (a list of {name: a dotted path to the number, "
                        "better: higher|lower, tolerance: percent, primary: true|false}); got none" % var]
        return [dict(m) for m in DEFAULT_METRICS[fmt]], []
    if not isinstance(metrics, (list, tuple)) or not metrics:
        return [], ["%s must be a non-empty list of {name, better: higher|lower, tolerance: percent, primary: "
                    "true|false} (got %s)" % (var, shown(metrics))]
    out, errors = [], []
    for i, item in enumerate(metrics):
        metric, problems = _metric(fmt, "%s[%d]" % (var, i), item)
        errors += problems
        if metric:
            out.append(metric)
    names = [m["name"] for m in out]
    if len(set(names)) != len(names):
        errors.append("%s names a metric more than once (%s)" % (var, ", ".join(map(str, names))))
    if metrics and sum(1 for m in out if m["primary"]) != 1:
        errors.append("%s must mark exactly one metric primary: true (got %d)"
                      % (var, sum(1 for m in out if m["primary"])))
    return out, errors


def check_settings(raw: dict) -> tuple[dict, list]:
    """``(settings, errors)`` of the measure gate's variables (rollout settings without the prefix).

    Fills ``benchmark_metrics``, ``benchmark_repeats`` (3; 1 for the number format unless given),
    ``benchmark_warmup`` (0), ``benchmark_unchanged`` (keep) and ``benchmark_format`` (number).
    """
    got, errors = {}, []
    fmt = raw.get("benchmark_format")
    fmt = "number" if fmt is None else fmt
    if fmt not in FORMATS:
        errors.append("gpunode_tuning_rollout_benchmark_format must be one of: %s (got %s)"
                      % (", ".join(FORMATS), shown(fmt)))
        fmt = None
    got["benchmark_format"] = fmt
    path = raw.get("benchmark_result_file")
    if path is not None and (not isinstance(path, str) or not path.startswith("/") or "\0" in path):
        errors.append("gpunode_tuning_rollout_benchmark_result_file must be null (the result is read from the "
                      "command's output) or an absolute path on the node (got %s)" % shown(path))
    got["benchmark_result_file"] = path
    repeats, ok = _count(raw.get("benchmark_repeats"), 1 if fmt == "number" else 3, 1)
    if not ok:
        errors.append("gpunode_tuning_rollout_benchmark_repeats must be a run count of 1 or more (got %s)"
                      % shown(raw.get("benchmark_repeats")))
    got["benchmark_repeats"] = repeats
    warmup, ok = _count(raw.get("benchmark_warmup"), 0, 0)
    if not ok:
        errors.append("gpunode_tuning_rollout_benchmark_warmup must be a run count of 0 or more, the runs before "
                      "the measured ones that are not counted (got %s)" % shown(raw.get("benchmark_warmup")))
    got["benchmark_warmup"] = warmup
    unchanged = raw.get("benchmark_unchanged")
    unchanged = "keep" if unchanged is None else unchanged
    if unchanged not in UNCHANGED:
        errors.append("gpunode_tuning_rollout_benchmark_unchanged must be keep or rollback, what the gate does when "
                      "the primary metric changed within the noise (got %s)" % shown(unchanged))
    got["benchmark_unchanged"] = unchanged
    if fmt is not None:
        got["benchmark_metrics"], problems = _metric_errors(fmt, raw.get("benchmark_metrics"))
        errors += problems
    else:
        got["benchmark_metrics"] = []
    return got, errors


# --------------------------------------------------------------------------------------------- readers

def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


_SERVING_LINE = re.compile(r"^\s*([A-Za-z][^:]*?)\s*:\s+(\S+)\s*$")
_SERVING_LABEL = re.compile(r"^(Mean|Median|Std|P[0-9]{1,2}(?:\.[0-9]+)?)\s+(TTFT|TPOT|ITL|E2EL|E2E Latency)\s+\(ms\)$",
                            re.IGNORECASE)
_SERVING_FIXED = {"request throughput (req/s)": "request_throughput",
                  "input token throughput (tok/s)": "input_throughput",
                  "output token throughput (tok/s)": "output_throughput",
                  "total token throughput (tok/s)": "total_token_throughput",
                  "total throughput (tok/s)": "total_throughput",
                  "request goodput (req/s)": "request_goodput",
                  "benchmark duration (s)": "duration", "successful requests": "completed",
                  "concurrency": "concurrency"}


def serving_text(text: str) -> dict:
    """The result block of sglang.bench_serving or vLLM's benchmark_serving / ``vllm bench serve``."""
    start = text.rfind("Serving Benchmark Result")
    if start < 0:
        return {}
    values = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("=" * 10):
            break
        match = _SERVING_LINE.match(line)
        if not match:
            continue
        label, number = match.group(1), _finite(match.group(2))
        if number is None:
            continue
        kind = _SERVING_LABEL.match(label)
        if kind:
            what = kind.group(2).lower().replace(" ", "_")
            values["%s_%s_ms" % (kind.group(1).lower(), what)] = number
        else:
            values[_SERVING_FIXED.get(label.lower(), _slug(label))] = number
    return values


def _json_object(text: str) -> Any:
    """The JSON of a result file or output: the whole text, else its last line that parses."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _flat(data: Any, prefix: str = "") -> dict:
    """Every number in a JSON document by its dotted path (list items by their index)."""
    out = {}
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        path = "%s%s" % (prefix, key)
        if isinstance(value, (dict, list)):
            out.update(_flat(value, path + "."))
        else:
            number = _finite(value) if not isinstance(value, str) else None
            if number is not None:
                out[path] = number
    return out


_TABLE_SEP = "\u2502"  # the box-drawing bar of genai-perf's rich table
_GENAI_UNIT = re.compile(r"\s*\(([^)]*)\)\s*$")


def _genai_label(label: str) -> tuple[str, float]:
    """``(metric key, factor to the unit of the JSON export)`` of a console row label."""
    unit = _GENAI_UNIT.search(label)
    name = _slug(_GENAI_UNIT.sub("", label))
    factor = 1e-6 if unit and unit.group(1) == "ns" else 1.0  # early versions printed latencies in ns
    return name, factor


def _genai_console(text: str) -> dict:
    """genai-perf's (and AIPerf's) console table, and the throughput lines early versions printed below it."""
    values, header = {}, None
    for line in text.splitlines():
        if "\u2503" in line and "Statistic" in line or "\u2503" in line and "Metric" in line:
            header = [_slug(c) for c in line.split("\u2503")[2:-1]]
            continue
        if _TABLE_SEP in line and header:
            cells = [c.strip() for c in line.split(_TABLE_SEP)[1:-1]]
            if len(cells) < 2 or not cells[0]:
                continue
            name, factor = _genai_label(cells[0])
            for i, cell in enumerate(cells[1:len(header) + 1]):
                number = _finite(cell)
                if number is not None:
                    values["%s.%s" % (name, header[i])] = number * factor
            continue
        match = re.match(r"^\s*([A-Za-z][A-Za-z ]+\(per sec\)):\s*([0-9.,]+)\s*$", line)
        if match:
            values["%s.avg" % _genai_label(match.group(1))[0]] = _finite(match.group(2))
    return {k: v for k, v in values.items() if v is not None}


_NCCL_ROW = re.compile(r"^\s*([0-9]+)\s+([0-9]+)\s+\S+\s+\S+\s+(-?[0-9]+\s+)?([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s")


def _nccl(text: str) -> dict:
    """nccl-tests' *_perf output: the average bus bandwidth, and the largest size's out-of-place bandwidths."""
    values = {}
    match = re.search(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)", text, re.MULTILINE)
    if match and _finite(match.group(1)) is not None:
        values["avg_busbw"] = _finite(match.group(1))
    largest = None
    for line in text.splitlines():
        row = _NCCL_ROW.match(line)
        if row and (largest is None or int(row.group(1)) >= largest[0]):
            largest = (int(row.group(1)), float(row.group(5)), float(row.group(6)))
    if largest:
        values["algbw_largest"], values["busbw_largest"] = largest[1], largest[2]
    return values


_WHAT = {"sglang": "a 'Serving Benchmark Result' block or a bench_serving --output-file JSON line",
         "vllm": "a 'Serving Benchmark Result' block or the --save-result JSON",
         "genai-perf": "profile_export_genai_perf.json (or AIPerf's profile_export_aiperf.json) or the console table",
         "nccl-tests": "a *_perf result table with its '# Avg bus bandwidth' line",
         "json": "a JSON document"}


def read(fmt: str, text: str, metrics: list) -> tuple[dict | None, str]:
    """``(values of the metrics, problem)`` of one run's result text in ``fmt``.

    The problem names the format and the metrics it could not find (and what the format expects).
    """
    text = text or ""
    if fmt == "number":
        number = _finite(text.strip()) if re.match(r"^\s*[-+0-9.eE]+\s*$", text) else None
        if number is None or number <= 0:
            return None, "the number format expects one positive finite number, got %r" % text.strip()[:200]
        return {"value": number}, ""
    if fmt in SERVING:
        found = serving_text(text)
        if not found:
            data = _json_object(text)
            # vLLM's benchmark_serving.py wrote its goodput as "request_goodput:" (the colon in the key).
            found = {k.rstrip(":"): v for k, v in _flat(data).items()} if isinstance(data, dict) else {}
    elif fmt == "genai-perf":
        data = _json_object(text) if text.lstrip().startswith("{") else None
        found = _flat(data) if isinstance(data, dict) else _genai_console(text)
    elif fmt == "nccl-tests":
        found = _nccl(text)
    else:
        data = _json_object(text)
        found = _flat(data) if isinstance(data, (dict, list)) else {}
    if not found:
        return None, "the %s format expects %s; none was found in %r" % (fmt, _WHAT[fmt], text.strip()[-300:])
    missing = [m["name"] for m in metrics if m["name"] not in found]
    if missing:
        # What it has that the format can judge (a genai-perf export's input_config numbers are settings).
        has = [k for k in sorted(found) if fmt == "json" or name_allowed(fmt, k)] or sorted(found)
        return None, "the %s result has no %s (it has: %s%s)" % (fmt, ", ".join(missing), ", ".join(has[:60]),
                                                                 ", ..." if len(has) > 60 else "")
    return {m["name"]: found[m["name"]] for m in metrics}, ""


def appended(content: bytes, offset: Any) -> bytes:
    """What a run appended to a result file that was ``offset`` bytes long before it (sglang appends one
    JSON line per run; a file shorter than before was replaced, and is read whole)."""
    try:
        start = int(offset or 0)
    except (TypeError, ValueError):
        start = 0
    return content[start:] if 0 <= start <= len(content) else content


def last_line(text: str) -> str:
    """The last non-empty line (the line this run wrote, of an appended JSON-lines file)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------------------------- verdict

def median(values: list) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def judge_metric(metric: dict, before: list, after: list) -> dict:
    """One metric's record: medians, spreads, change, noise, its verdict (better, worse, unchanged) and
    whether it fails the gate (worse beyond the noise and beyond its tolerance)."""
    mb, ma = median(before), median(after)
    spread_b, spread_a = max(before) - min(before), max(after) - min(after)
    if mb != 0:
        change = (ma - mb) / abs(mb)
        noise = max(spread_b, spread_a) / abs(mb)
    else:  # a median of zero before: no relative change; equal is unchanged, anything else beyond the noise
        change = 0.0 if ma == 0 else math.copysign(1.0, ma)
        noise = 0.0 if max(spread_b, spread_a) == 0 else 1.0
    worse_by = -change if metric["better"] == "higher" else change
    if abs(change) <= noise:
        verdict = "unchanged"
    else:
        verdict = "worse" if worse_by > 0 else "better"
    fails = verdict == "worse" and worse_by * 100 > float(metric["tolerance"])
    return {"name": metric["name"], "better": metric["better"], "primary": metric["primary"],
            "tolerance": metric["tolerance"], "before": before, "after": after,
            "median_before": round(mb, 6), "median_after": round(ma, 6),
            "spread_before": round(spread_b, 6), "spread_after": round(spread_a, 6),
            "change": round(change, 6), "noise": round(noise, 6), "verdict": verdict, "fails": fails}


def _pct(value: float) -> str:
    return "%+.1f%%" % (value * 100)


def why(record: dict) -> str:
    """The metric named with both medians, the spread and the tolerance."""
    return ("%s %s %s (median before %s, after %s; spread %.1f%% of the median before; tolerance %s%%)"
            % (record["name"], record["verdict"], _pct(record["change"]), record["median_before"],
               record["median_after"], record["noise"] * 100, record["tolerance"]))


def verdict(metrics: list, before_runs: list, after_runs: list, unchanged: str) -> dict:
    """The measure gate after tuning, from the readings of the counted runs on each side.

    ``kept`` when the primary metric is not worse beyond the noise (and its tolerance) and no guarded
    metric is worse beyond the noise and its tolerance; a primary metric within the noise is
    "unchanged", and ``unchanged`` (keep or rollback) decides.
    """
    records = [judge_metric(m, [r[m["name"]] for r in before_runs], [r[m["name"]] for r in after_runs])
               for m in metrics]
    failed = [r for r in records if r["fails"]]
    primary = next(r for r in records if r["primary"])
    if failed:
        kept = False
        reason = "measure gate: " + "; ".join(why(r) for r in failed)
    elif primary["verdict"] == "unchanged" and unchanged == "rollback":
        kept = False
        reason = ("measure gate: %s unchanged within the noise and gpunode_tuning_rollout_benchmark_unchanged is "
                  "rollback (%s)" % (primary["name"], why(primary)))
    else:
        kept, reason = True, ""
    return {"metrics": records, "kept": kept, "reason": reason, "primary": primary["name"],
            "primary_verdict": primary["verdict"], "gain": primary["change"]}


def fleet_changes(results: list) -> list:
    """The median change of each metric over the hosts whose benchmark was measured on both sides."""
    changes = {}
    for result in results:
        for record in ((result.get("benchmark") or {}).get("metrics") or []):
            changes.setdefault(record["name"], []).append(record["change"])
    return [{"name": name, "hosts": len(values), "median_change": round(median(values), 6)}
            for name, values in changes.items()]
