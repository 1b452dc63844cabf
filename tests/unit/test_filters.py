"""The controller-side filters of verification (plugins/filter/verification.py) and the rollout's."""

from __future__ import annotations

import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.filter.rollout import FilterModule as RolloutFilters
from ansible_collections.gpunode.tuning.plugins.filter.verification import FilterModule
from ansible_collections.gpunode.tuning.plugins.module_utils.core import cpu_freq
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification

FILTER_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "filter")


def test_every_filter_is_exported_and_documented():
    filters = dict(FilterModule().filters(), **RolloutFilters().filters())
    assert set(filters) == {"verify_fleet", "verify_error", "verify_report_dir", "rollout_settings", "rollout_serial",
                            "rollout_host_result", "rollout_gate", "rollout_summary",
                            "rollout_benchmark_runs"}
    for name in filters:
        with open(os.path.join(FILTER_DIR, name + ".yml"), encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
        assert doc["DOCUMENTATION"]["name"] == name
        assert "_input" in doc["DOCUMENTATION"]["options"]
        assert doc["EXAMPLES"] and "_value" in doc["RETURN"]


def test_the_driver_switch_arguments_rollback_removes():
    # What the persistent flow's rollback removes for a desired driver (cpufreq.kernel_args with remove).
    # (The driver's choices are the argument spec's: the precheck refuses another before this runs.)
    removable = list(cpu_freq.driver_kernel_args("native", "guided").removable)
    assert removable == ["amd_pstate=guided", "intel_pstate=active"]
    for driver in cpu_freq.DRIVER_FAMILIES:
        assert cpu_freq.driver_kernel_args(driver).removable


def test_verify_host_and_fleet(build_node):
    from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify

    root = build_node("tiny-vm")
    facts = {"tuning_facts": verify.gather(Node(root), sysctls=["vm.swappiness"])}
    f = FilterModule().filters()
    res = verification.evaluate_host(facts, {"sysctl": {"vm.swappiness": 60}}, context={"root": root}, host="vm",
                                     verified_at="T")
    assert res["status"] == "pass" and res["host"] == "vm" and res["verified_at"] == "T"
    fleet = f["verify_fleet"]({"vm": res, "x": f["verify_error"]("x", "no facts")}, ["vm", "x"], "T")
    assert [r["host"] for r in fleet["failing"]] == ["x"]


def test_verify_report_dir_is_below_the_working_directory(tmp_path, monkeypatch):
    # Not below the playbook's directory: `reports/` is where the user runs ansible-playbook.
    f = FilterModule().filters()["verify_report_dir"]
    monkeypatch.chdir(tmp_path)
    assert f("reports/") == str(tmp_path / "reports")
    assert f("out/../reports/demo") == str(tmp_path / "reports" / "demo")
    assert f("/srv/reports/") == "/srv/reports"
    assert f("~/r") == os.path.join(os.path.expanduser("~"), "r")
    for bad in ("", None, ["reports"]):
        with pytest.raises(AnsibleFilterError, match="gpunode_tuning_report_dir must be a directory path"):
            f(bad)


def test_verify_host_passes_the_gate_through(build_node):
    from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify

    root = build_node("audited-epyc-8gpu", cpus=2, gpus=1)
    facts = {"tuning_facts": verify.gather(Node(root))}
    f = FilterModule().filters()
    desired = {"cpufreq": {"driver": "native", "amd_pstate_mode": "active"}}
    res = verification.evaluate_host(facts, desired, context={"root": root}, gate="runtime")
    assert res["status"] == "fail" and res["gate"]["name"] == "runtime" and res["gate"]["ok"] is True
    assert res["needs_reboot"][0].startswith("cpufreq driver: amd-pstate (active) wanted, acpi-cpufreq runs")
    with pytest.raises(verification.VerificationError, match="gate must be one of"):
        verification.evaluate_host(facts, desired, gate="nope")
    assert f["verify_error"]("x", "no facts", None, "runtime")["gate"]["name"] == "runtime"
