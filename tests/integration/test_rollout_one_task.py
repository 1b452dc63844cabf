"""Both ways a host is rolled out leave the same records, reports and node files (issue 41: one implementation).

The runtime rollout without the measure gate runs each host's steps in one task (issue 31); with a measure gate the
same steps (plugins/plugin_utils/rollout_steps.py) run one at a time, the benchmark between them
(playbooks/tasks/rollout_steps.yml). Here both ways run, as shipped, on two copies of the same fleet: the second
with a measure gate whose benchmark is a trivial command that always prints the same number, kept by its
min_gain. The fleet: a healthy node, a node whose MRRS write is refused (kernel lockdown), a node with a GPU trained
at x8 of x16 (the health gate), an AMD Instinct MI300X node (amd-smi, XGMI) and a host that refuses connections.
The hosts' records, the summary, the verification reports and the nodes' files must be the same, apart from times,
the fleet's path and what only the measure gate adds (its benchmark and its settings).
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import simfleet
import simnode
from support.checkout import VENV_BIN
from support.playbooks import by_host, rollout
from support.trees import tree_digest

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ?")
# The measure gate with a benchmark that always answers the same number: the gain is 0, above min_gain -0.5.
MEASURED = ("-e", "gpunode_tuning_rollout_benchmark_command='echo 100'",
            "-e", "gpunode_tuning_rollout_benchmark_min_gain=-0.5")
COMMON = ("-e", "gpunode_tuning_rollout_canary=0", "-e", "gpunode_tuning_rollout_batch=4",
          "-e", "gpunode_tuning_rollout_max_fail_percentage=100")


def build(directory):
    simfleet.build_fleet(str(directory), 4, overrides={2: "locked-bus-perf", 4: "mi300x-epyc-8gpu"}, unreachable=1,
                         python=os.path.join(VENV_BIN, "python"))
    sick = os.path.join(str(directory), "nodes", "sim-0003")
    shutil.rmtree(sick)
    simnode.build(sick, "audited-epyc-8gpu", cpus=4, gpus=1, gpu_faults={"x8": [0]})
    amd = os.path.join(str(directory), "nodes", "sim-0004")
    shutil.rmtree(amd)
    simnode.build(amd, "mi300x-epyc-8gpu", cpus=4, gpus=2, amd_smi=True)
    return directory


def plain(value, fleet):
    """A report or record with the fleet's path, the times and what only the measure gate adds taken out."""
    text = TIME.sub("TIME", json.dumps(value, sort_keys=True).replace(str(fleet), "FLEET"))
    value = json.loads(text)

    def strip(item):
        if isinstance(item, dict):
            return {k: strip(v) for k, v in item.items()
                    if k not in ("verified_at", "generated_at", "boot_id", "benchmark", "benchmark_fleet")}
        if isinstance(item, list):
            return [strip(v) for v in item]
        if isinstance(item, str) and "\n## Measure gate" in item:  # the host's Markdown report, last section
            return item.split("\n## Measure gate")[0]
        return item
    return strip(value)


def node_files(root):
    """``{path: content}`` of a node's tree, times taken out (the journal records when each entry was made)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                out[os.path.relpath(path, root)] = "-> " + os.readlink(path)
                continue
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = TIME.sub("TIME", handle.read().decode("utf-8", "replace"))
    return out


def reports_of(directory, fleet):
    out = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.endswith(".json") and name != "rollout-summary.json":
            with open(path, encoding="utf-8") as handle:
                out[name] = plain(json.load(handle), fleet)
        elif name.endswith((".md", ".xml")) and not name.startswith("rollout-summary"):
            with open(path, encoding="utf-8") as handle:
                out[name] = plain(handle.read(), fleet)
    return out


def node_warnings(output, fleet):
    """The distinct warnings of a run that came from the nodes: not the rollout's own lines naming a host."""
    lines = (m.group(1) for m in re.finditer(r"^\[WARNING\]: (.*)$", output, re.M))
    return sorted({plain(line, fleet) for line in lines if not line.startswith("rollout: ")})


@pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs an ssh client to be refused by")
def test_one_task_and_steps_give_the_same_rollout(tmp_path):
    fleets = {way: build(tmp_path / way) for way in ("one", "steps")}
    sick = {way: tree_digest(os.path.join(str(fleet), "nodes", "sim-0003")) for way, fleet in fleets.items()}
    got = {}
    for way, fleet in fleets.items():
        proc, summary, reports = rollout(str(fleet), *COMMON, *(MEASURED if way == "steps" else ()))
        assert proc.returncode != 0, proc.stdout[-3000:]  # not every host is done
        assert summary is not None, proc.stdout[-3000:]
        # The steps as tasks of their own, and the benchmark between them, run only with the measure gate.
        for step in ("TASK [Check the host's GPU health before tuning (its first connection)]",
                     "TASK [gpunode.tuning.tuning : Run the benchmark, tuning phase before]"):
            assert (step in proc.stdout) is (way == "steps"), (way, step)
        got[way] = {"summary": plain({k: v for k, v in summary.items() if k not in ("generated_at", "settings")},
                                     fleet),
                    "settings": plain({k: v for k, v in summary["settings"].items() if not k.startswith("benchmark_")},
                                      fleet),
                    "reports": reports_of(reports, fleet),
                    "nodes": {h: node_files(os.path.join(str(fleet), "nodes", h))
                              for h in ("sim-0001", "sim-0002", "sim-0003", "sim-0004")},
                    "untouched": tree_digest(os.path.join(str(fleet), "nodes", "sim-0003")) == sick[way],
                    "unreachable": proc.stdout.count("UNREACHABLE!"),
                    "warnings": node_warnings(proc.stdout + proc.stderr, fleet),
                    "benchmarks": {r["host"]: r["benchmark"] for r in summary["results"]}}
    one, steps = got["one"], got["steps"]
    results = by_host(one["summary"])
    assert [results[h]["status"] for h in sorted(results)] == ["done", "failed", "unhealthy", "done",
                                                               "unreachable"], results
    assert "kernel lockdown" in results["sim-0002"]["reason"]
    assert "x8 of x16" in results["sim-0003"]["reason"]
    # The measure gate did run step by step (kept on the tuned hosts, not run where the host was not cleared).
    assert all(v is None for v in one["benchmarks"].values()), one["benchmarks"]
    assert steps["benchmarks"]["sim-0001"]["kept"] is True and steps["benchmarks"]["sim-0004"]["kept"] is True
    assert steps["benchmarks"]["sim-0003"] is None and steps["benchmarks"]["sim-0005"] is None
    assert one["summary"] == steps["summary"]
    assert one["settings"] == steps["settings"]
    assert one["reports"] == steps["reports"]
    # The verification's fleet summary too (written once per batch either way).
    assert sorted(one["reports"]) == ["fleet-summary.md", "sim-0001.json", "sim-0001.junit.xml", "sim-0001.md",
                                      "sim-0001.topology.json", "sim-0002.json", "sim-0002.junit.xml",
                                      "sim-0002.md", "sim-0002.topology.json", "sim-0004.json",
                                      "sim-0004.junit.xml", "sim-0004.md", "sim-0004.topology.json"]
    # The same files on the nodes (their journals included); the unhealthy one untouched either way.
    assert one["nodes"] == steps["nodes"]
    assert one["untouched"] and steps["untouched"]
    journal = "var/lib/gpunode-tuning/journal.json"
    assert journal in one["nodes"]["sim-0001"] and journal not in one["nodes"]["sim-0003"]
    assert journal in one["nodes"]["sim-0004"]
    assert one["unreachable"] == steps["unreachable"] == 1
    # What the nodes warned about reaches the operator either way (nvidia_peermem failing harmlessly).
    assert one["warnings"] == steps["warnings"]
    assert any(w.startswith("kmod: nvidia_peermem: nvidia_peermem did not load") for w in one["warnings"])
