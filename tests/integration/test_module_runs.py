"""Module runs per host, counted by benchmarks/callback_plugins/module_runs.py (issue 31's ceilings).

`tune.yml --tags runtime` makes one module run per host; the runtime rollout one (tuning_rollout: the health
gate, the tuning and verification in one process; issue 31 allows three); the persistent rollout at most four
for a host that needs no reboot (its steps as tasks: the health gate's tuning_info, tuning_apply, tuning_persist,
verification's tuning_info). Whatever the rollout's own tasks do around them runs on the
controller. docs/performance.md states the counts.
"""

from __future__ import annotations

import json
import os

import simfleet
from support.checkout import REPO, VENV_BIN, ansible_env
from support.playbooks import assert_ok, rollout, run_playbook

COUNTER = os.path.join(REPO, "benchmarks", "callback_plugins")


def node_runs(path):
    with open(path, encoding="utf-8") as handle:
        hosts = json.load(handle)["hosts"]
    return {host: (entry["node"], entry["actions"]) for host, entry in hosts.items()}


def task_runs(path):
    """Task results per host (each one a worker process forked on the controller)."""
    with open(path, encoding="utf-8") as handle:
        return {host: entry["tasks"] for host, entry in json.load(handle)["hosts"].items()}


def counted_env(path):
    return dict(ansible_env(), ANSIBLE_CALLBACK_PLUGINS=COUNTER, ANSIBLE_CALLBACKS_ENABLED="module_runs",
                BENCH_MODULE_RUNS_OUT=path)


def test_runtime_tuning_is_one_module_run_per_host(tmp_path):
    simfleet.build_fleet(str(tmp_path), 2, python=os.path.join(VENV_BIN, "python"))
    counts = str(tmp_path / "runs.json")
    proc = run_playbook("tune.yml", os.path.join(tmp_path, "hosts.yml"), "--tags", "runtime",
                        env=counted_env(counts))
    assert_ok(proc)
    runs = node_runs(counts)
    assert sorted(runs) == ["sim-0001", "sim-0002"]
    for host, (node, actions) in runs.items():
        assert node == 1, (host, actions)


def test_the_runtime_rollout_is_one_module_run_and_three_tasks_per_host(tmp_path):
    simfleet.build_fleet(str(tmp_path), 2, python=os.path.join(VENV_BIN, "python"))
    counts = str(tmp_path / "runs.json")
    proc, summary, _reports = rollout(str(tmp_path), module_runs=counts)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert summary["counts"]["done"] == 2
    for host, (node, actions) in node_runs(counts).items():
        # The health gate, the tuning and verification in one module run (tuning_rollout), in one task.
        assert node == 1 and actions == {"tuning_rollout": 1}, (host, actions)
    # The tasks each host costs a worker for: the precheck, the one rollout task and the skipped include of the
    # steps; each batch (one host here) adds its count, fleet summary, gate and end (counted for its first host),
    # the run its survey and two groupings (counted for the first host). The steps as tasks were about 25 per host.
    tasks = task_runs(counts)
    assert tasks == {"sim-0001": 3 + 4 + 3, "sim-0002": 3 + 4}, tasks


def test_the_persistent_rollout_is_at_most_four_module_runs_for_a_host_needing_no_reboot(tmp_path):
    simfleet.build_fleet(str(tmp_path), 2, python=os.path.join(VENV_BIN, "python"))
    counts = str(tmp_path / "runs.json")
    proc, summary, _reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_flow=persistent",
                                      "-e", "gpunode_tuning_reboot_ok=false", module_runs=counts)
    assert proc.returncode == 0, proc.stdout[-4000:]
    results = {r["host"]: r for r in summary["results"]}
    no_reboot = [h for h, r in results.items() if r["status"] == "done" and not r.get("reboot_required")]
    assert no_reboot, results  # the default mix has a node whose tuning needs no reboot
    runs = node_runs(counts)
    for host in no_reboot:
        node, actions = runs[host]
        assert node <= 4, (host, actions)
