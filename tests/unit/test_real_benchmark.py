"""The measure gate's benchmark readers (plugin_utils/benchmark.py) on real output other people posted
(tests/data/real/bench-*), and its verdict on runs built from those captures."""

from __future__ import annotations

import base64
import os
import re

import pytest

from ansible_collections.gpunode.tuning.plugins.plugin_utils import benchmark, rollout

SERVING = benchmark.DEFAULT_METRICS["sglang"]


def _m(name, better="higher", tolerance=0.0, primary=False):
    return {"name": name, "better": better, "tolerance": tolerance, "primary": primary}


def test_every_benchmark_capture_is_read_here_and_named_in_the_readme():
    real = os.path.join(os.path.dirname(__file__), os.pardir, "data", "real")
    on_disk = sorted(n for n in os.listdir(real) if n.startswith("bench-"))
    with open(__file__, encoding="utf-8") as fh:
        here = fh.read()
    with open(os.path.join(real, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert len(on_disk) == 11
    assert [n for n in on_disk if '"%s"' % n not in here or "| %s |" % n not in readme] == []


def test_sglang_result_block_is_read_as_the_json_keys(real):
    text = real("bench-sglang-text-fa4-32k-cut-sglang-9428.txt").text
    values, problem = benchmark.read("sglang", text, SERVING + [_m("median_e2e_latency_ms", "lower", 10)])
    assert problem == ""
    assert values == {"output_throughput": 6.60, "p99_ttft_ms": 15292.66, "p99_itl_ms": 13753.42,
                      "median_e2e_latency_ms": 15285.35}


def test_sglang_output_file_reads_only_the_line_this_run_appended(real):
    content = real("bench-sglang-output-file-jsonl-h200-benchmarks.txt").text.encode()
    before = content[:content.rindex(b"{")]  # the file as it was before the last run
    line = benchmark.last_line(benchmark.appended(content, len(before)).decode())
    metrics = [_m("output_throughput", primary=True), _m("median_ttft_ms", "lower", 10)]
    values, problem = benchmark.read("sglang", line, metrics)
    assert problem == ""
    assert values == {"output_throughput": 1471.0864833760852, "median_ttft_ms": 83.16566958092153}
    # The whole file's first line is another run's (request rate 1): never what this run is judged on.
    assert benchmark.read("sglang", content.decode().splitlines()[0], metrics)[0]["output_throughput"] == \
        537.4142851849319


def test_an_sglang_line_without_p99_fails_naming_the_format_and_the_missing_metrics(real):
    line = real("bench-sglang-output-file-jsonl-h200-benchmarks.txt").text.splitlines()[-1]
    values, problem = benchmark.read("sglang", line, SERVING)
    assert values is None
    assert problem.startswith("the sglang result has no p99_ttft_ms, p99_itl_ms (it has: ")
    assert "median_itl_ms" in problem


def test_vllm_bench_serve_block(real):
    text = real("bench-vllm-bench-serve-text-sharegpt-vllm-18566.txt").text
    metrics = SERVING + [_m("p99_tpot_ms", "lower", 10), _m("total_token_throughput")]
    values, problem = benchmark.read("vllm", text, metrics)
    assert problem == ""
    assert values == {"output_throughput": 6582.87, "p99_ttft_ms": 12666.73, "p99_itl_ms": 214.35,
                      "p99_tpot_ms": 211.21, "total_token_throughput": 14029.44}


def test_vllm_save_result_file_is_read_with_the_default_metrics(real):
    text = real("bench-vllm-save-result-json-l40s-vllm-bench-automation.txt").text
    values, problem = benchmark.read("vllm", text, SERVING + [_m("median_tpot_ms", "lower", 10), _m("completed")])
    assert problem == ""
    assert values == {"output_throughput": 2258.212337970085, "p99_ttft_ms": 98.69780922984769,
                      "p99_itl_ms": 34.48662216016601, "median_tpot_ms": 13.686303201518745, "completed": 300.0}
    # This vLLM writes its goodput as "request_goodput:" (the colon in the key), null without --goodput: no number.
    goodput = [_m("request_goodput", primary=True)]
    values, problem = benchmark.read("vllm", text, goodput)
    assert values is None and problem.startswith("the vllm result has no request_goodput (it has: completed, ")
    # With --goodput the number is under that same key, and is read as request_goodput.
    assert benchmark.read("vllm", text.replace('"request_goodput:": null', '"request_goodput:": 7.5'), goodput) == \
        ({"request_goodput": 7.5}, "")


def test_a_current_sglang_output_file_line_is_read_with_the_default_metrics(real):
    line = real("bench-sglang-output-file-line-pd-sglang-12389.txt").text.strip()
    values, problem = benchmark.read("sglang", benchmark.last_line(line), SERVING + [_m("p99_e2e_latency_ms", "lower")])
    assert problem == ""
    # The run's TTFT and ITL are 0.0 as it wrote them (its issue), read as such; its request_rate Infinity is no metric.
    assert values == {"output_throughput": 3267.0925907959777, "p99_ttft_ms": 0.0, "p99_itl_ms": 0.0,
                      "p99_e2e_latency_ms": 5812.809163999625}
    assert benchmark.read("sglang", line, [_m("request_rate", primary=True)])[0] is None


def test_genai_perf_profile_export_is_read_with_the_default_metrics(real):
    text = real("bench-genai-perf-profile-export-json-streaming-perf-analyzer-298.txt").text
    values, problem = benchmark.read("genai-perf", text, benchmark.DEFAULT_METRICS["genai-perf"]
                                     + [_m("request_latency.p90", "lower", 10)])
    assert problem == ""
    assert values == {"output_token_throughput.avg": 44190.56002502682, "time_to_first_token.p99": 425.02943662,
                      "inter_token_latency.p99": 2.2631232999999997, "request_latency.p90": 5882.4496025}


def test_genai_perf_without_streaming_has_no_inter_token_latency_and_says_so(real):
    text = real("bench-genai-perf-profile-export-json-no-streaming-perf-analyzer-298.txt").text
    values, problem = benchmark.read("genai-perf", text, benchmark.DEFAULT_METRICS["genai-perf"])
    assert values is None
    assert problem.startswith("the genai-perf result has no inter_token_latency.p99 (it has: ")
    assert "output_token_throughput.avg" in problem and "time_to_first_token.p99" in problem


def test_genai_perf_console_table(real):
    text = real("bench-genai-perf-console-goodput-zephyr-perf-analyzer-docs.txt").text
    values, problem = benchmark.read("genai-perf", text, benchmark.DEFAULT_METRICS["genai-perf"]
                                     + [_m("request_latency.p90", "lower", 10)])
    assert problem == ""
    assert values == {"output_token_throughput.avg": 51.20, "time_to_first_token.p99": 109.61,
                      "inter_token_latency.p99": 19.36, "request_latency.p90": 8920.69}


def test_genai_perf_table_without_throughput_fails_naming_what_is_missing(real):
    text = real("bench-genai-perf-console-no-throughput-cut-perf-analyzer-437.txt").text
    values, problem = benchmark.read("genai-perf", text, benchmark.DEFAULT_METRICS["genai-perf"])
    assert values is None
    assert problem.startswith("the genai-perf result has no output_token_throughput.avg, time_to_first_token.p99, "
                              "inter_token_latency.p99")
    # Early versions printed latencies in ns: read in ms, like the JSON export.
    found, _problem = benchmark.read("genai-perf", text, [_m("request_latency.p99", "lower", 10, True)])
    assert found == {"request_latency.p99": pytest.approx(5217.352175)}


def test_aiperf_profile_export_json(real):
    text = real("bench-aiperf-profile-export-json-cut-aiperf-340.txt").text
    values, problem = benchmark.read("genai-perf", text, [_m("request_throughput.avg", primary=True),
                                                          _m("time_to_first_token.p99", "lower", 10)])
    assert problem == ""
    assert values == {"request_throughput.avg": 0.14968841618235815, "time_to_first_token.p99": 48.16844818}
    assert "no output_token_throughput.avg" in benchmark.read("genai-perf", text,
                                                              benchmark.DEFAULT_METRICS["genai-perf"])[1]


def test_nccl_tests_all_reduce(real):
    text = real("bench-nccl-tests-all-reduce-16xh100-a3mega.txt").text
    values, problem = benchmark.read("nccl-tests", text, [_m("avg_busbw", primary=True), _m("busbw_largest"),
                                                          _m("algbw_largest")])
    assert problem == ""
    assert values == {"avg_busbw": 70.742, "busbw_largest": 338.82, "algbw_largest": 180.71}


def test_json_path(real):
    text = real("bench-aiperf-profile-export-json-cut-aiperf-340.txt").text
    assert benchmark.read("json", text, [_m("request_latency.p50", "lower", 5, True)]) == \
        ({"request_latency.p50": 6653.8574435}, "")


@pytest.mark.parametrize("fmt, capture", [
    ("sglang", "bench-nccl-tests-all-reduce-16xh100-a3mega.txt"),
    ("vllm", "bench-genai-perf-console-goodput-zephyr-perf-analyzer-docs.txt"),
    ("genai-perf", "bench-nccl-tests-all-reduce-16xh100-a3mega.txt"),
    ("nccl-tests", "bench-vllm-bench-serve-text-sharegpt-vllm-18566.txt"),
    ("json", "bench-vllm-bench-serve-text-sharegpt-vllm-18566.txt"),
])
def test_an_output_of_another_kind_fails_naming_the_format(real, fmt, capture):
    metrics = benchmark.DEFAULT_METRICS[fmt] or [_m("x", primary=True)]
    values, problem = benchmark.read(fmt, real(capture).text, metrics)
    assert values is None
    assert problem.startswith("the %s format expects " % fmt), problem


# --- the verdict: change and noise of the medians, as docs/measure-gate.md defines them ----------------

def _runs(text, scale):
    """Three runs of the vLLM capture, each metric scaled by ``scale[metric]`` and by the run's noise."""
    base = benchmark.read("vllm", text, SERVING)[0]
    return [{k: v * scale.get(k, 1.0) * noise for k, v in base.items()} for noise in (0.99, 1.0, 1.01)]


def test_throughput_up_ten_percent_with_p99_ttft_doubled_rolls_back_naming_p99_ttft(real):
    text = real("bench-vllm-bench-serve-text-sharegpt-vllm-18566.txt").text
    out = benchmark.verdict(SERVING, _runs(text, {}), _runs(text, {"output_throughput": 1.1, "p99_ttft_ms": 2.0}),
                            "keep")
    assert out["kept"] is False
    assert out["reason"] == ("measure gate: p99_ttft_ms worse +100.0% (median before 12666.73, after 25333.46; "
                             "spread 4.0% of the median before; tolerance 10.0%)")
    records = {r["name"]: r for r in out["metrics"]}
    assert records["output_throughput"]["verdict"] == "better" and records["p99_itl_ms"]["verdict"] == "unchanged"


def test_throughput_up_ten_percent_with_latencies_unchanged_is_kept(real):
    text = real("bench-vllm-bench-serve-text-sharegpt-vllm-18566.txt").text
    out = benchmark.verdict(SERVING, _runs(text, {}), _runs(text, {"output_throughput": 1.1}), "keep")
    assert out["kept"] is True and out["reason"] == "" and out["primary_verdict"] == "better"
    assert round(out["gain"], 4) == 0.1


def test_a_change_within_the_spread_is_unchanged_and_follows_the_variable(real):
    text = real("bench-vllm-bench-serve-text-sharegpt-vllm-18566.txt").text
    before, after = _runs(text, {}), _runs(text, {"output_throughput": 0.995})
    kept = benchmark.verdict(SERVING, before, after, "keep")
    assert kept["kept"] is True and kept["primary_verdict"] == "unchanged"
    rolled = benchmark.verdict(SERVING, before, after, "rollback")
    assert rolled["kept"] is False
    assert rolled["reason"].startswith("measure gate: output_throughput unchanged within the noise and "
                                       "gpunode_tuning_rollout_benchmark_unchanged is rollback (output_throughput "
                                       "unchanged -0.5%")


def test_a_guarded_metric_worse_within_its_tolerance_is_kept():
    metrics = SERVING
    before = [{"output_throughput": 100.0, "p99_ttft_ms": 100.0, "p99_itl_ms": 10.0}] * 3
    after = [{"output_throughput": 100.0, "p99_ttft_ms": 109.0, "p99_itl_ms": 10.0}] * 3
    out = benchmark.verdict(metrics, before, after, "keep")
    ttft = next(r for r in out["metrics"] if r["name"] == "p99_ttft_ms")
    assert ttft["verdict"] == "worse" and ttft["fails"] is False and out["kept"] is True
    assert (ttft["median_before"], ttft["median_after"], ttft["noise"], ttft["change"]) == (100.0, 109.0, 0.0, 0.09)


def _run(stdout="", rc=0, **extra):
    return dict({"rc": rc, "stdout": stdout, "stderr": "", "cmd": ["bench"]}, **extra)


def test_the_gate_over_runs_names_a_failed_run_and_never_counts_it_as_zero(real):
    text = real("bench-vllm-bench-serve-text-sharegpt-vllm-18566.txt").text
    settings = rollout.settings({"benchmark_command": "b", "benchmark_format": "vllm", "benchmark_warmup": 1})[0]
    runs = [_run(text)] + [_run(text)] * 3
    before = rollout.benchmark_runs(runs, "h1", "before", {}, settings)
    assert before["problem"] == "" and before["bench"]["before"] == 6582.87
    assert before["bench"]["before_warmup_problems"] == [] and len(before["bench"]["before_runs"]) == 3
    after = rollout.benchmark_runs([_run(text), _run(text), _run("", rc=3), _run("no result here")], "h1", "after",
                                   before["bench"], settings)
    bench = after["bench"]
    assert bench["kept"] is False and bench["after"] is None and "metrics" not in bench
    assert "run 2 of 3 exited with 3" in after["problem"]
    assert re.search(r"run 3 of 3: the vllm format expects a 'Serving Benchmark Result' block", after["problem"])


def test_a_failed_or_unreadable_warm_up_run_is_named_but_never_counted(real):
    text = real("bench-vllm-bench-serve-text-sharegpt-vllm-18566.txt").text
    settings = rollout.settings({"benchmark_command": "b", "benchmark_format": "vllm", "benchmark_warmup": 1})[0]
    before = rollout.benchmark_runs([_run("", rc=3)] + [_run(text)] * 3, "h1", "before", {}, settings)
    assert before["problem"] == "" and before["bench"]["before_warmup_problems"] == [
        "warm-up run 1 of 1 exited with 3: no output (bench)"]
    assert len(before["bench"]["before_runs"]) == 3 and before["bench"]["before"] == 6582.87
    after = rollout.benchmark_runs([_run("Traceback: CUDA error")] + [_run(text)] * 3, "h1", "after",
                                   before["bench"], settings)
    bench = after["bench"]
    assert after["problem"] == "" and bench["kept"] is True and len(bench["after_runs"]) == 3
    assert bench["after_warmup_problems"] == ["warm-up run 1 of 1: the vllm format expects a 'Serving Benchmark "
                                              "Result' block or the --save-result JSON; none was found in "
                                              "'Traceback: CUDA error'"]
    # The verdict is the one of the counted runs alone; the message names both warm-up runs.
    assert bench["metrics"] == benchmark.verdict(SERVING, bench["before_runs"], bench["after_runs"], "keep")["metrics"]
    assert bench["reason"] == ("warm-up runs not counted (failed or unreadable): before tuning: warm-up run 1 of 1 "
                               "exited with 3: no output (bench) | after tuning: " + bench["after_warmup_problems"][0])
    state = {"host": "h1", "batch": 1, "measure": True, "benchmark": bench, "cleared": True}
    assert rollout.host_result(state)["status"] == "done"
    assert rollout.host_result(state)["reason"] == bench["reason"]
    # Before tuning, a failed counted run fails the host: the message names the warm-up run as well.
    failed = rollout.benchmark_runs([_run("", rc=3), _run(text), _run("", rc=1), _run(text)], "h1", "before", {},
                                    settings)
    assert "run 2 of 3 exited with 1" in failed["problem"]
    assert failed["problem"].endswith("; warm-up runs not counted (failed or unreadable): before tuning: warm-up run "
                                      "1 of 1 exited with 3: no output (bench)")


def test_the_sglang_result_file_is_read_from_where_this_run_appended(real):
    content = real("bench-sglang-output-file-jsonl-h200-benchmarks.txt").text.encode()
    settings = rollout.settings({"benchmark_command": "b", "benchmark_format": "sglang",
                                 "benchmark_result_file": "/tmp/out.jsonl", "benchmark_repeats": 1,
                                 "benchmark_metrics": [_m("output_throughput", primary=True)]})[0]
    run = _run("the block on stdout is not read", content=base64.b64encode(content).decode(),
               offset=content.index(b"\n") + 1)
    got = rollout.benchmark_runs([run], "h1", "before", {}, settings)
    assert got["problem"] == "" and got["bench"]["before_runs"] == [{"output_throughput": 1471.0864833760852}]
    nothing = rollout.benchmark_runs([dict(run, offset=len(content))], "h1", "before", {}, settings)
    assert "it appended no line to its result file /tmp/out.jsonl" in nothing["problem"]


def test_the_number_format_with_one_run_is_todays_gate():
    settings = rollout.settings({"benchmark_command": "b"})[0]
    assert settings["benchmark_repeats"] == 1 and settings["benchmark_format"] == "number"
    before = rollout.benchmark_runs([_run("100")], "h1", "before", {"min_gain": 0.0}, settings)
    after = rollout.benchmark_runs([_run("97")], "h1", "after", before["bench"], settings)
    assert after["bench"] == rollout.benchmark_verdict({"before": 100.0, "after": 97.0, "min_gain": 0.0}, "")


@pytest.mark.parametrize("raw, message", [
    ({"benchmark_format": "sglang", "benchmark_metrics": [{"name": "tokens_per_s", "primary": True}]},
     "gpunode_tuning_rollout_benchmark_metrics[0].name tokens_per_s is not a metric of the sglang format; allowed: "
     "output_throughput"),
    ({"benchmark_format": "vllm", "benchmark_metrics": [{"name": "p99_ttft_ms", "better": "up", "primary": True}]},
     "gpunode_tuning_rollout_benchmark_metrics[0].better must be higher or lower (got up)"),
    ({"benchmark_format": "nccl-tests", "benchmark_metrics": [{"name": "avg_busbw", "tolerance": "x",
                                                               "primary": True}]},
     "gpunode_tuning_rollout_benchmark_metrics[0].tolerance must be a percentage of 0 or more"),
    ({"benchmark_format": "genai-perf", "benchmark_metrics": [{"name": "time_to_first_token.p99"}]},
     "gpunode_tuning_rollout_benchmark_metrics must mark exactly one metric primary: true (got 0)"),
    ({"benchmark_format": "json"}, "gpunode_tuning_rollout_benchmark_metrics must name the metric for the json format"),
    ({"benchmark_format": "csv"}, "gpunode_tuning_rollout_benchmark_format must be one of: number, sglang, vllm, "
                                  "genai-perf, nccl-tests, json (got csv)"),
    ({"benchmark_repeats": 0}, "gpunode_tuning_rollout_benchmark_repeats must be a run count of 1 or more (got 0)"),
    ({"benchmark_warmup": -1}, "gpunode_tuning_rollout_benchmark_warmup must be a run count of 0 or more"),
    ({"benchmark_unchanged": "maybe"}, "gpunode_tuning_rollout_benchmark_unchanged must be keep or rollback"),
    ({"benchmark_result_file": "out.jsonl"}, "gpunode_tuning_rollout_benchmark_result_file must be null"),
])
def test_bad_measure_gate_settings_are_refused_naming_what_is_allowed(raw, message):
    errors = rollout.settings(raw)[1]
    assert len(errors) == 1 and errors[0].startswith(message), errors


def test_the_fleet_summary_has_the_median_change_per_metric():
    def host(change):
        return {"benchmark": {"metrics": [{"name": "output_throughput", "change": change}]}}
    assert benchmark.fleet_changes([host(0.1), host(0.3), {"benchmark": None}, host(0.2)]) == \
        [{"name": "output_throughput", "hosts": 3, "median_change": 0.2}]
