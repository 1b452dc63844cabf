"""playbooks/rollout.yml through ansible-runner, the engine AWX runs its jobs with (docs/awx.md).

A private data directory as AWX prepares one (project, inventory, env/extravars, env/envvars),
``ansible-runner run``, then the run read back from its artifacts only: status and rc, the job
events per host and task, and the rollout summary the play wrote. Two simulated hosts, the
canary then one batch: ~20 s of CPU on 2 cores.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess

import simfleet
import yaml
from support.checkout import COLLECTIONS, REPO

# ansible-runner is in the shared .venv only (not in the matrix's environments).
VENV_BIN = os.path.join(REPO, ".venv", "bin")


def private_data_dir(tmp_path, inventory, reports):
    """AWX's layout: project/ (the playbooks), inventory/, env/extravars, env/envvars."""
    pdd = tmp_path / "pdd"
    (pdd / "env").mkdir(parents=True)
    (pdd / "inventory").mkdir()
    os.symlink(os.path.join(REPO, "playbooks"), pdd / "project")
    os.symlink(inventory, pdd / "inventory" / "hosts.yml")
    extravars = {"gpunode_tuning_report_dir": str(reports), "gpunode_tuning_rollout_batch": "100%"}
    (pdd / "env" / "extravars").write_text(yaml.safe_dump(extravars), encoding="utf-8")
    envvars = {"ANSIBLE_COLLECTIONS_PATH": COLLECTIONS, "ANSIBLE_NOCOLOR": "1"}
    (pdd / "env" / "envvars").write_text(yaml.safe_dump(envvars), encoding="utf-8")
    return pdd


def events(artifacts):
    """The run's job events, in order."""
    out = []
    for path in glob.glob(os.path.join(artifacts, "job_events", "*.json")):
        with open(path, encoding="utf-8") as handle:
            out.append(json.load(handle))
    return sorted(out, key=lambda e: e["counter"])


def test_rollout_through_ansible_runner_reads_back_from_artifacts(tmp_path):
    inventory = simfleet.build_fleet(str(tmp_path / "fleet"), 2, python=os.path.join(VENV_BIN, "python"))
    reports = tmp_path / "reports"
    pdd = private_data_dir(tmp_path, inventory, reports)
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    env.pop("ANSIBLE_CONFIG", None)
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-runner"), "run", str(pdd), "-p", "rollout.yml",
                           "--ident", "job1", "--forks", "4"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    artifacts = pdd / "artifacts" / "job1"
    assert (artifacts / "status").read_text(encoding="utf-8").strip() == "successful", proc.stdout[-3000:]
    assert (artifacts / "rc").read_text(encoding="utf-8").strip() == "0"
    assert proc.returncode == 0

    evs = events(artifacts)
    ok = [e["event_data"] for e in evs if e["event"] == "runner_on_ok"]
    # The collection's tasks that ran a module on the node (the precheck says it ran none: module_runs 0).
    node = [(d["host"], d["task"], (d.get("res") or {}).get("modules")) for d in ok
            if d["task_action"].startswith("gpunode.tuning.")
            and d["task_action"] != "gpunode.tuning.verify_reports"  # the reports: written on the controller
            and (d.get("res") or {}).get("module_runs", 1) > 0]
    rollout_task = "Roll out the host (health gate, runtime tuning, verification, reports, its record)"
    hosts = [simfleet.host_name(n) for n in (1, 2)]
    for host in hosts:  # every host health-checked, tuned and verified in one task, as events AWX would record
        tasks = [(t, modules) for h, t, modules in node if h == host]
        # The health gate, the runtime flow, verification: one module run, named in the task's result.
        assert tasks == [(rollout_task, ["tuning_rollout"])], tasks
    done = {d["host"]: d["res"]["rollout_result"]["status"] for d in ok if d["task"] == rollout_task}
    assert done == {host: "done" for host in hosts}, done
    # The canary batch (sim-0001) is health-checked, tuned and verified before the other host starts.
    assert [h for h, _t, _m in node] == hosts, node
    assert evs[-1]["event"] == "playbook_on_stats"
    assert set(evs[-1]["event_data"]["ok"]) >= set(hosts)
    assert not evs[-1]["event_data"]["failures"]

    with open(reports / "rollout-summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    assert int(summary["counts"]["done"]) == 2, summary["counts"]
    assert [r["canary"] for r in sorted(summary["results"], key=lambda r: r["host"])] == [True, False]
