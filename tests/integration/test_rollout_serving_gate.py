"""The measure gate with a serving benchmark (issue 45): the sglang format, three runs a side, on a simulated fleet.

Each node gets tools/simbench.py's stand-in of ``python -m sglang.bench_serving``, answering from a real
capture: it appends one JSON line per run to the node's result file (``--output-file``), which the gate reads
(only the line each run wrote). Once tuned, sim-0001's throughput rises 10 % while its p99 TTFT doubles (rolled
back, naming p99_ttft_ms), sim-0002's throughput rises 10 % with its latencies unchanged (kept), and sim-0003
moves within its own run-to-run spread (unchanged, kept: gpunode_tuning_rollout_benchmark_unchanged is keep).
"""

from __future__ import annotations

import glob
import json
import os

import simbench
import simfleet
from support.checkout import VENV_BIN
from support.nodes import JOURNAL
from support.playbooks import by_host, rollout

RESULT = "{{ gpunode_tuning_root }}/var/tmp/sglang-bench.jsonl"
GATE = {"gpunode_tuning_rollout_benchmark_command": ["{{ gpunode_tuning_root }}/" + simbench.BIN,
                                                     "--output-file", RESULT],
        "gpunode_tuning_rollout_benchmark_format": "sglang",
        "gpunode_tuning_rollout_benchmark_result_file": RESULT,
        "gpunode_tuning_rollout_canary": 0, "gpunode_tuning_rollout_batch": "100%",
        "gpunode_tuning_rollout_max_fail_percentage": 100}


def test_serving_benchmark_gate_rolls_back_on_p99_ttft_keeps_a_gain_and_says_unchanged(tmp_path):
    simfleet.build_fleet(str(tmp_path), 3, python=os.path.join(VENV_BIN, "python"))
    nodes = os.path.join(str(tmp_path), "nodes")
    simbench.write(os.path.join(nodes, "sim-0001"), "sglang", {"output_throughput": 1.1, "p99_ttft_ms": 2.0}, 0.01)
    simbench.write(os.path.join(nodes, "sim-0002"), "sglang", {"output_throughput": 1.1}, 0.01)
    simbench.write(os.path.join(nodes, "sim-0003"), "sglang", {"output_throughput": 1.01}, 0.02)
    # A line another run wrote earlier is in the file already: never read.
    for host in ("sim-0001", "sim-0002", "sim-0003"):
        os.makedirs(os.path.join(nodes, host, "var/tmp"))
        with open(os.path.join(nodes, host, "var/tmp/sglang-bench.jsonl"), "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"output_throughput": 1e9, "p99_ttft_ms": 1.0, "p99_itl_ms": 1.0}) + "\n")

    # A metric the format does not have stops the rollout in its variable checks, before any host is touched.
    bad = dict(GATE, gpunode_tuning_rollout_benchmark_metrics=[{"name": "tokens_per_s", "primary": True}])
    proc, _summary, _reports = rollout(str(tmp_path), "-e", json.dumps(bad))
    assert proc.returncode != 0
    assert ("gpunode_tuning_rollout_benchmark_metrics[0].name tokens_per_s is not a metric of the sglang format; "
            "allowed: output_throughput") in proc.stdout, proc.stdout[-3000:]
    assert not glob.glob(os.path.join(nodes, "*", JOURNAL))
    assert not glob.glob(os.path.join(nodes, "*", simbench.COUNTER))  # the benchmark never ran

    proc, summary, reports = rollout(str(tmp_path), "-e", json.dumps(GATE))
    assert summary is not None, proc.stdout[-3000:]
    hosts = by_host(summary)
    assert proc.returncode != 0 and summary["counts"]["done"] == 2, proc.stdout[-3000:]

    worse = hosts["sim-0001"]
    bench = worse["benchmark"]
    assert worse["status"] == "failed" and bench["kept"] is False and bench["rolled_back"] is True
    metrics = {m["name"]: m for m in bench["metrics"]}
    ttft = metrics["p99_ttft_ms"]
    assert ttft["verdict"] == "worse" and ttft["fails"] and round(ttft["change"], 2) == 1.0
    assert metrics["output_throughput"]["verdict"] == "better"
    assert worse["reason"] == ("measure gate: p99_ttft_ms worse +100.0%% (median before %s, after %s; spread %.1f%% "
                               "of the median before; tolerance 10.0%%); runtime tuning rolled back"
                               % (ttft["median_before"], ttft["median_after"], ttft["noise"] * 100))
    assert len(bench["before_runs"]) == 3 and len(bench["after_runs"]) == 3
    assert all(r["output_throughput"] < 1e9 for r in bench["before_runs"])  # the earlier line was not read

    gain = hosts["sim-0002"]
    assert gain["status"] == "done" and gain["benchmark"]["kept"] is True
    assert gain["benchmark"]["primary_verdict"] == "better" and round(gain["benchmark"]["gain"], 2) == 0.1
    assert {m["name"]: m["verdict"] for m in gain["benchmark"]["metrics"]} == {
        "output_throughput": "better", "p99_ttft_ms": "unchanged", "p99_itl_ms": "unchanged"}

    # The kept host's own report shows the benchmark too (the rolled-back one is not verified: the summary has it).
    host_md = open(os.path.join(reports, "sim-0002.md"), encoding="utf-8").read()
    assert "## Measure gate" in host_md and "| p99_ttft_ms (lower, guarded, tolerance 10.0%) |" in host_md
    with open(os.path.join(reports, "sim-0002.json"), encoding="utf-8") as fh:
        assert [m["name"] for m in json.load(fh)["benchmark"]["metrics"]] == ["output_throughput", "p99_ttft_ms",
                                                                              "p99_itl_ms"]

    same = hosts["sim-0003"]
    assert same["status"] == "done" and same["benchmark"]["kept"] is True
    assert same["benchmark"]["primary_verdict"] == "unchanged"

    fleet = {f["name"]: f for f in summary["benchmark_fleet"]}
    assert fleet["output_throughput"]["hosts"] == 3 and round(fleet["output_throughput"]["median_change"], 2) == 0.1
    markdown = open(os.path.join(reports, "rollout-summary.md"), encoding="utf-8").read()
    assert "| sim-0001 | p99_ttft_ms (lower, guarded, tolerance 10.0%) |" in markdown
    assert "| sim-0003 | output_throughput (higher, primary, tolerance 0.0%) |" in markdown
    assert "| unchanged |" in markdown
    assert "| output_throughput | 3 | +10.0% |" in markdown
