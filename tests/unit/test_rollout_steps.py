"""plugin_utils/rollout_steps.py: a host's rollout steps in one call (the default rollout's one task) and one step
at a time (the persistent flow and the measure gate) leave the same record, verification, reports and node files.

The action is a stand-in whose module runs are the real tuning_rollout module on a simulated node (in-process);
the role's variables are the inference-throughput preset's and the reports are captured instead of rendered.
Two identical nodes per case: one rolled out in one call, the other step by step.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from support.role import preset_values

from ansible_collections.gpunode.tuning.plugins.plugin_utils import flow_task, reports, rollout, rollout_steps, tags

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?")
HOST = "node1"


class StandIn:
    """What rollout_steps uses of an action: its task (check mode, tags) and its module runs."""

    def __init__(self, run_module, check):
        self._task = type("Task", (), {"check_mode": check, "tags": []})()
        self._templar = None
        self._run_module = run_module
        self.runs = []

    def _execute_module(self, module_name, module_args, task_vars):
        assert module_name == "gpunode.tuning.tuning_rollout" and task_vars["inventory_hostname"] == HOST
        self.runs.append([k for k in ("health", "tune", "verify") if module_args.get(k)])
        result, _failed = self._run_module("tuning_rollout", module_args, check=self._task.check_mode)
        return result


def plain(value, root):
    """``value`` with the times and the node's root taken out."""
    return json.loads(TIME.sub("TIME", json.dumps(value, sort_keys=True).replace(root, "ROOT")))


def node_files(root):
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                with open(path, "rb") as handle:
                    out[os.path.relpath(path, root)] = TIME.sub("TIME", handle.read().decode("utf-8", "replace"))
    return out


@pytest.fixture
def roll(monkeypatch, tmp_path, run_module):
    """``roll(root, steps_list, check)``: the host rolled out on ``root`` in the calls ``steps_list`` (each a list
    of steps, the state handed from one to the next); returns (last result, the stand-in, the reports written), the
    last result's ``ansible_facts`` being every call's, as the host's facts would hold them."""
    written = []
    monkeypatch.setattr(reports, "write", lambda _templar, _task_vars, directory, result=None, fleet=None,
                        check_mode=False: written.append(result) or {"files": ["%s/%s.json" % (directory, HOST)]})

    def _roll(root, calls, check=False, outcome=None):
        values = preset_values(gpunode_tuning_root=root, gpunode_tuning_report_dir=str(tmp_path / "reports"))
        monkeypatch.setattr(flow_task, "values", lambda _templar, _task_vars, _entry, _cache=None: (values, None))
        action, task_vars = StandIn(run_module, check), {"inventory_hostname": HOST, "ansible_play_hosts_all": [HOST]}
        only, skip = tags.run_tags(task_vars)
        del written[:]
        result, facts = None, {}
        for steps in calls:
            args = {"steps": steps, "rollout": rollout.settings({})[0], "batch": 1, "canary": True,
                    "outcome": outcome or {}, "state": (result or {}).get("rollout_state")}
            result = rollout_steps.run(action, task_vars, args, only, skip, {})
            facts.update(result.get("ansible_facts") or {})
        return dict(result, ansible_facts=facts), action, list(written)

    return _roll


ONE = [["health", "tune", "verify", "record"]]
STEPS = [["health"], ["tune"], ["verify", "record"]]


@pytest.mark.parametrize("case, node, check", [
    ("healthy", {}, False),
    ("locked MRRS", {"preset": "locked-bus-perf"}, False),
    ("x8 GPU", {"gpus": 1, "gpu_faults": {"x8": [0]}}, False),
    ("check mode", {}, True),
])
def test_one_call_and_steps_leave_the_same_record_reports_and_node(build_node, roll, case, node, check):
    node = dict({"cpus": 4, "gpus": 2}, **node)
    preset = node.pop("preset", "audited-epyc-8gpu")
    roots = [build_node(preset, **node) for _copy in range(2)]
    one, one_action, one_reports = roll(roots[0], ONE, check)
    steps, steps_action, steps_reports = roll(roots[1], STEPS, check)
    record = one["rollout_result"]
    assert plain(record, roots[0]) == plain(steps["rollout_result"], roots[1]), case
    assert plain(one["ansible_facts"], roots[0]) == plain(steps["ansible_facts"], roots[1]), case
    assert plain(one_reports, roots[0]) == plain(steps_reports, roots[1]), case
    assert node_files(roots[0]) == node_files(roots[1]), case
    expected = {"healthy": "done", "locked MRRS": "failed", "x8 GPU": "unhealthy", "check mode": "done"}[case]
    assert record["status"] == expected, record
    # The one call is one module run; step by step, one per step that has something to do on the node.
    assert one_action.runs == [["health", "tune"] + ([] if check else ["verify"])], one_action.runs
    if case == "x8 GPU":
        assert "x8 of x16" in record["reason"] and steps_action.runs == [["health"]] and one_reports == []
    else:
        assert steps_action.runs == [["health"], ["tune"]] + ([] if check else [["verify"]]), steps_action.runs
        assert len(one_reports) == (0 if check else 1)
    if case == "locked MRRS":
        assert record["reason"].startswith("tuning failed: these knob families failed (every other family ran): ")
        assert "verification failed: " in record["reason"] and "pcie_mrrs" in record["reason"], record["reason"]


def test_what_the_plays_own_tasks_found_decides_the_later_steps(build_node, roll):
    root = build_node(cpus=4, gpus=2)
    # A measure gate that rolled the tuning back: nothing tuned to verify, the host failed.
    bench = {"kept": False, "reason": "measure gate: gain -0.1 below min_gain 0.0", "before": 10, "after": 9}
    result, action, written = roll(root, STEPS, outcome={"benchmark": bench, "measure_failed": True})
    assert action.runs == [["health"], ["tune"]] and written == []
    assert result["rollout_result"]["status"] == "failed" and result["rollout_result"]["verification"] == "not run"
    # The reboot sequence's gate verified the host after its boot: that verification is the host's, not read again.
    judged = {"status": "pass", "gate": {"ok": True, "failures": [], "name": "full"}, "settings": []}
    reboot = {"rebooted": True, "returned": True, "verification": judged}
    result, action, written = roll(root, [["health"], ["verify", "record"]], outcome={"reboot": reboot})
    assert action.runs == [["health"]] and written == [judged]
    assert result["rollout_result"]["status"] == "done" and result["rollout_result"]["reboot"]["rebooted"] is True
    # A later step without the state of the one before is the task's error, not the host's.
    result, _action, _written = roll(root, [["verify"]])
    assert result["failed"] and "need the state the host's earlier steps left" in result["msg"]
