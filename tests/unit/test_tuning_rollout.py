"""Module tuning_rollout: the rollout's health gate, tuning and verification in one module run on a simulated node.

The options are built as the rollout's action builds them (plugin_utils/desired_state.py from the role's variables
with the inference-throughput preset), so the module is exercised with what it gets in a rollout.
"""

from __future__ import annotations

import json
import os

import pytest
from support.role import preset_values

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import apply
from ansible_collections.gpunode.tuning.plugins.plugin_utils import desired_state

JOURNAL = "var/lib/gpunode-tuning/journal.json"


def rollout_args(root, health=True, verify=True):
    values = preset_values(gpunode_tuning_root=root)
    desired = desired_state.desired_state(values)
    requests = desired_state.runtime_requests(desired, values, registry.FAMILIES)
    return {
        "root": root,
        "health": desired_state.health_options(values, desired, "node1") if health else None,
        "tune": {"families": requests, "journal": values["gpunode_tuning_journal"], "fail_on_error": False},
        "verify": desired_state.verify_options(values, desired, "node1", "2026-12-03T00:00:00Z", "runtime")
        if verify else None,
    }


def test_a_healthy_node_is_checked_tuned_and_verified_in_one_run(build_node, run_module):
    root = build_node(cpus=4, gpus=2)
    result, failed = run_module("tuning_rollout", rollout_args(root))
    assert not failed, result
    assert result["steps"] == ["health", "tune", "verify"]
    # Only what the rollout reads comes back: the findings, and the verification without the node's facts.
    assert result["health"] == {"health_findings": []}
    assert "tuning_facts" not in result["verify"]
    assert result["changed"] is True and result["tune"]["changed"] is True
    assert result["tune"]["failed_families"] == {}
    assert os.path.exists(os.path.join(root, JOURNAL))
    verification = result["verify"]["verification"]
    # Verification read the node after the tuning of the same process: what was applied is applied.
    assert verification["gate"]["name"] == "runtime" and verification["gate"]["ok"] is True, verification["gate"]
    assert verification["counts"]["applied"] > 0
    again, failed = run_module("tuning_rollout", rollout_args(root))
    assert not failed and again["changed"] is False, again.get("tune")


def test_a_node_with_a_health_finding_is_neither_tuned_nor_verified(build_node, run_module, digest):
    root = build_node(cpus=4, gpus=1, gpu_faults={"x8": [0]})
    before = digest(root)
    result, failed = run_module("tuning_rollout", rollout_args(root))
    assert not failed, result
    assert result["steps"] == ["health"]
    assert any("x8 of x16" in f for f in result["health"]["health_findings"]), result["health"]
    assert "tune" not in result and "verify" not in result and result["changed"] is False
    assert digest(root) == before


def test_check_mode_plans_writes_nothing_and_does_not_verify(build_node, run_module, digest):
    root = build_node(cpus=4, gpus=1)
    before = digest(root)
    result, failed = run_module("tuning_rollout", rollout_args(root), check=True, diff=True)
    assert not failed, result
    assert result["steps"] == ["health", "tune"]
    assert result["changed"] is True and result["diff"], result
    assert digest(root) == before


def test_a_crashing_tuning_step_is_that_steps_and_the_node_is_still_verified(build_node, run_module, monkeypatch):
    root = build_node(cpus=4, gpus=1)

    def crash(module, make_call):
        raise RuntimeError("simulated crash inside the tuning step")

    monkeypatch.setattr(apply, "run", crash)
    result, failed = run_module("tuning_rollout", rollout_args(root))
    assert not failed, result
    assert result["steps"] == ["health", "tune", "verify"]
    assert result["tune"]["failed"] is True and "simulated crash" in result["tune"]["msg"]
    assert "RuntimeError" in result["tune"]["exception"]
    # Nothing was applied: verification says so rather than being skipped.
    assert result["verify"]["verification"]["gate"]["ok"] is False


def test_bad_options_of_a_step_name_the_option_and_stop_before_tuning(build_node, run_module, digest):
    root = build_node(cpus=4, gpus=1)
    before = digest(root)
    args = rollout_args(root)
    args["health"] = dict(args["health"], no_such_option=1)
    result, failed = run_module("tuning_rollout", args)
    assert not failed, result
    assert result["steps"] == ["health"] and result["health"]["failed"] is True
    assert "no_such_option" in result["health"]["msg"]
    assert digest(root) == before


def test_without_the_health_step_the_node_is_tuned_and_verified(build_node, run_module):
    root = build_node(cpus=4, gpus=1)
    result, failed = run_module("tuning_rollout", rollout_args(root, health=False))
    assert not failed, result
    assert result["steps"] == ["tune", "verify"] and "health" not in result
    json.dumps(result)  # what goes back to the controller is plain JSON


@pytest.mark.parametrize("key", ["health", "tune", "verify"])
def test_a_step_option_that_is_no_mapping_fails_the_module_naming_it(build_node, run_module, key):
    root = build_node(cpus=4, gpus=1)
    args = rollout_args(root)
    args[key] = "not a mapping"
    result, failed = run_module("tuning_rollout", args)
    assert failed and key in result["msg"], result
