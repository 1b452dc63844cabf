"""The fleet rollout's decisions (plugin_utils/rollout.py): settings, host status, batch gate, measure gate, summary."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.filter import rollout as rollout_filter
from ansible_collections.gpunode.tuning.plugins.plugin_utils import rollout


def test_defaults_are_one_canary_then_batches_of_a_fifth():
    got, errors = rollout.settings({})
    assert errors == []
    assert got["serial"] == [1, "20%"] and got["flow"] == "runtime" and got["max_fail_percentage"] == 0.0
    assert rollout.serial({"canary": 0, "batch": ["1", 2, "50%"]}) == [1, 2, "50%"]


@pytest.mark.parametrize("batch, shown", [(0, "got 0"), (-1, "got -1"), ("0%", "got 0%"), ("-50%", "got -50%"),
                                          ("abc", "got abc"), ([1, "abc"], "got abc"), ([], "got an empty list"),
                                          ("150%", "got 150%"), (True, "got true")])
def test_a_nonsense_batch_is_refused_naming_what_is_allowed(batch, shown):
    _got, errors = rollout.settings({"batch": batch})
    assert errors == ["gpunode_tuning_rollout_batch must be %s (%s)" % (rollout.BATCH_ALLOWED, shown)]
    # The play's serial never crashes: the first play refused the settings already.
    assert rollout.serial({"batch": batch}) == [1]


@pytest.mark.parametrize("raw, variable", [
    ({"max_fail_percentage": "abc"}, "gpunode_tuning_rollout_max_fail_percentage must be a number from 0 to 100"),
    ({"max_fail_percentage": 101}, "gpunode_tuning_rollout_max_fail_percentage"),
    ({"max_fail_percentage": "inf"}, "gpunode_tuning_rollout_max_fail_percentage"),
    ({"canary": -1}, "gpunode_tuning_rollout_canary must be a host count of 0 or more"),
    ({"canary": "x"}, "gpunode_tuning_rollout_canary"),
    ({"flow": "fast"}, "gpunode_tuning_rollout_flow must be one of: runtime, persistent"),
    ({"health_gate": "maybe"}, "gpunode_tuning_rollout_health_gate must be true or false"),
    ({"benchmark_command": ""}, "gpunode_tuning_rollout_benchmark_command must be null"),
    ({"benchmark_command": ["x", ""]}, "gpunode_tuning_rollout_benchmark_command"),
    ({"benchmark_min_gain": -1}, "gpunode_tuning_rollout_benchmark_min_gain must be a fraction above -1"),
    ({"benchmark_min_gain": "1e309"}, "gpunode_tuning_rollout_benchmark_min_gain"),
])
def test_every_bad_setting_is_named(raw, variable):
    _got, errors = rollout.settings(raw)
    assert len(errors) == 1 and errors[0].startswith(variable), errors


def test_good_settings_are_normalized():
    got, errors = rollout.settings({"max_fail_percentage": "25", "health_gate": "no", "canary": "2",
                                    "benchmark_command": ["bench", "--quick"], "benchmark_min_gain": "-0.02"})
    assert errors == []
    assert (got["max_fail_percentage"], got["health_gate"], got["canary"], got["benchmark_min_gain"]) == \
        (25.0, False, 2, -0.02)
    assert got["serial"] == [2, "20%"]


@pytest.mark.parametrize("stdout, rc, value", [("123.5\n", 0, 123.5), ("1e3", 0, 1000.0), ("+.5", 0, 0.5)])
def test_a_benchmark_prints_one_positive_finite_number(stdout, rc, value):
    assert rollout.benchmark_reading({"stdout": stdout, "rc": rc}, "h1", "before") == (value, "")


@pytest.mark.parametrize("run, said", [
    ({"stdout": "1e309", "rc": 0}, "it printed: 1e309"),
    ({"stdout": "nan", "rc": 0}, "it printed: nan"),
    ({"stdout": "0", "rc": 0}, "it printed: 0"),
    ({"stdout": "12 tok/s", "rc": 0}, "it printed: 12 tok/s"),
    ({"stdout": "", "stderr": "boom", "rc": 3}, "it exited with 3: boom"),
    ({"rc": None, "msg": "no such file", "cmd": ["bench"]}, "it exited with no status: no such file (bench)"),
])
def test_anything_else_is_a_problem_naming_host_phase_and_output(run, said):
    value, problem = rollout.benchmark_reading(run, "h1", "after")
    assert value is None
    assert problem.startswith("the benchmark on h1 (after tuning) must print one positive finite number")
    assert problem.endswith(said)


def test_the_gain_decides_whether_the_tuning_is_kept():
    kept = rollout.benchmark_verdict({"before": 100.0, "after": 110.0, "min_gain": 0.05}, "")
    assert (kept["gain"], kept["kept"], kept["reason"]) == (0.1, True, "")
    worse = rollout.benchmark_verdict({"before": 100.0, "after": 97.0, "min_gain": 0.0}, "")
    assert worse["kept"] is False and worse["reason"] == ("measure gate: gain -0.03 below min_gain 0.0 (benchmark "
                                                          "before 100.0, after 97.0)")
    broken = rollout.benchmark_verdict({"before": 100.0, "after": None, "min_gain": 0.0}, "it printed: x")
    assert broken["gain"] is None and broken["kept"] is False and broken["reason"] == "measure gate: it printed: x"


def _state(**kw):
    base = {"host": "h1", "batch": 2, "canary": False, "cleared": True, "health_gate": True,
            "verification": {"gate": {"status": "pass"}, "needs_reboot": ["cpufreq.driver: amd_pstate=active"]}}
    base.update(kw)
    return base


@pytest.mark.parametrize("state, status, reason", [
    (_state(), "done", ""),
    (_state(unreachable=True, unreachable_msg="ssh:  timeout\n"), "unreachable", "unreachable: ssh: timeout"),
    (_state(findings=["gpu_health.x: link x8"], cleared=False), "unhealthy",
     "GPU health (not tuned): gpu_health.x: link x8"),
    (_state(tune_error="Apply: boom"), "failed", "tuning failed: Apply: boom"),
    (_state(measure=True, measure_failed=True, benchmark={"reason": "measure gate: gain -0.1"}), "failed",
     "measure gate: gain -0.1"),
    (_state(health_error="x: y", cleared=False), "failed", "health check failed (not tuned): x: y"),
    (_state(verify_error="1 drifted"), "failed", "verification failed: 1 drifted"),
    (_state(reboot_error="h1 stays drained: resumed, but not in service within 600 s"), "failed",
     "reboot sequence: h1 stays drained: resumed, but not in service within 600 s"),
])
def test_a_hosts_status_and_reason(state, status, reason):
    got = rollout.host_result(state)
    assert (got["status"], got["reason"]) == (status, reason)


def test_a_host_not_judged_has_no_verification_and_needs_nothing():
    done = rollout.host_result(_state())
    assert done["verification"] == "pass" and done["needs_reboot"] == ["cpufreq.driver: amd_pstate=active"]
    assert done["health"] == "healthy"
    checked = rollout.host_result(_state(check_mode=True))
    assert checked["verification"] == "not run" and checked["needs_reboot"] == []
    off = rollout.host_result(_state(health_gate=False))
    assert off["health"] == "not checked"


def test_the_canary_batch_allows_no_failure_and_later_ones_their_share():
    ok = {"host": "a", "status": "done"}
    bad = {"host": "b", "status": "unreachable"}
    assert rollout.batch_gate([ok], 1, True, 50) is None
    assert rollout.batch_gate([ok, bad], 1, True, 50) == {
        "batch": 1, "canary": True, "failed_hosts": ["b"], "batch_hosts": 2, "failed_percentage": 50.0,
        "allowed_percentage": 0.0}
    assert rollout.batch_gate([ok, bad], 2, False, 50) is None
    assert rollout.batch_gate([ok, bad, bad], 2, False, 50)["failed_percentage"] == 66.7


def test_the_summary_counts_skips_and_says_why():
    results = [rollout.host_result(_state(host="a", batch=1, canary=True)),
               rollout.host_result(_state(host="b", tune_error="x: y"))]
    stopped = rollout.batch_gate(results[1:], 2, False, 0)
    summ = rollout_filter.rollout_summary(results, ["a", "b", "c"], stopped, {"flow": "runtime"}, "T")
    assert summ["counts"] == {"done": 1, "failed": 1, "unhealthy": 0, "unreachable": 0, "out_of_service": 0,
                              "skipped": 1}
    assert summ["skipped"] == ["c"] and summ["skipped_reason"] == "the rollout stopped after batch 2"
    assert summ["complete"] is False and summ["needs_reboot_hosts"] == ["a", "b"]
    assert summ["lines"][:3] == ["3 host(s): 1 done, 1 failed, 0 unhealthy, 0 unreachable, 1 skipped",
                                 "b: failed: tuning failed: x: y",
                                 "skipped (the rollout stopped after batch 2): c"]
    whole = rollout.summary(["a"], results[:1], None, {}, "T")
    assert whole["complete"] is True and whole["skipped"] == []


def test_a_benchmark_killed_at_its_timeout_is_named_a_hang():
    _value, problem = rollout.benchmark_reading({"stdout": "", "rc": 124}, "h1", "after", 3)
    assert "it did not answer within 3 s (killed; a wedged GPU, or a benchmark that does not finish)" in problem


def test_a_held_reboot_is_in_the_summary_with_what_its_return_said():
    """The rollout combines the reboot phase's result (held for the measure gate) with the return phase's."""
    held = {"rebooted": True, "held": True, "backend": "slurm", "reason": "gpunode.tuning: reboot for x",
            "msg": "h1: drained, rebooted, passed its gate; held out of service for the measure gate",
            "verification": {"gate": {"ok": True}}, "changed": True}
    returned = dict(held, returned=True, msg="h1: drained, rebooted, passed its gate and the measure gate and is "
                    "back in service")
    got = rollout.host_result(_state(reboot=returned))
    assert got["status"] == "done" and got["reboot"]["held"] is True and got["reboot"]["returned"] is True
    assert "verification" not in got["reboot"]  # the gate's full result stays out of the summary
    assert rollout.reboot_lines([got]) == ["h1: drained, rebooted, passed its gate and the measure gate and is back "
                                           "in service"]


def test_the_summary_says_who_was_not_rebooted_for_what_it_cannot_take():
    why = "amd-pstate active mode needs Linux 6.3 or newer with CONFIG_X86_AMD_PSTATE; this node runs 5.15.0-91"
    old = rollout.host_result(_state(host="old", not_rebooted_for={"cpufreq.driver": why}))
    modern = rollout.host_result(_state(host="new", reboot_required=True))
    assert old["not_rebooted_for"] == {"cpufreq.driver": why} and modern["not_rebooted_for"] == {}
    summ = rollout_filter.rollout_summary([old, modern], ["old", "new"], None, {"flow": "persistent"}, "T")
    assert summ["not_rebooted"] == [{"host": "old", "setting": "cpufreq.driver", "reason": why}]
    assert "old: not rebooted for cpufreq.driver (the node cannot take it): " + why in summ["lines"]
    assert not any(line.startswith("new: not rebooted") for line in summ["lines"])
