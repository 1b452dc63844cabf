"""Pure planning functions of module_utils/families/cpuidle.py, plus reading a simulated node."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpuidle


def _states(spec):
    """{cpu: [(name, latency, disabled), ...]} -> {cpu: {name: IdleState}} with indexes in list order."""
    return {cpu: {name: cpuidle.IdleState(cpu, i, name, lat, dis) for i, (name, lat, dis) in enumerate(items)}
            for cpu, items in spec.items()}


XEON = [("POLL", 0, False), ("C1", 2, False), ("C1E", 10, False), ("C6", 170, False)]


def test_plan_by_names_disables_only_named_states_on_every_cpu():
    states = _states({0: XEON, 1: XEON})
    plan = cpuidle.plan_by_names(states, ["C6"], "disabled")
    assert plan == {(0, "C6"): "disabled", (1, "C6"): "disabled"}


def test_plan_by_names_unknown_name_lists_the_nodes_names_in_latency_order():
    states = _states({0: XEON})
    with pytest.raises(cpuidle.PlanError) as exc:
        cpuidle.plan_by_names(states, ["C2", "C6", "c1e"], "disabled")
    msg = str(exc.value)
    assert "C2, c1e" in msg
    assert "POLL, C1, C1E, C6" in msg


def test_plan_by_latency_disables_above_bound_enables_the_rest():
    states = _states({0: [("POLL", 0, False), ("C1", 2, True), ("C1E", 10, False), ("C6", 170, False)]})
    plan = cpuidle.plan_by_latency(states, 10)
    assert plan == {(0, "POLL"): "enabled", (0, "C1"): "enabled", (0, "C1E"): "enabled", (0, "C6"): "disabled"}
    writes = cpuidle.plan_writes(states, plan)
    # C1 was disabled: the bound re-enables it (writes 0); C6 gets 1; nothing else is written.
    assert sorted((st.name, v) for st, v in writes) == [("C1", "0"), ("C6", "1")]


def test_plan_by_latency_never_disables_poll():
    states = _states({0: [("POLL", 5, False), ("C1", 7, False)]})
    plan = cpuidle.plan_by_latency(states, 0)
    assert plan[(0, "POLL")] == "enabled"
    assert plan[(0, "C1")] == "disabled"


@pytest.mark.parametrize("bad", [-1, None])
def test_plan_by_latency_rejects_negative_or_missing_bound(bad):
    with pytest.raises(cpuidle.PlanError, match=">= 0"):
        cpuidle.plan_by_latency(_states({0: XEON}), bad)


def test_states_are_matched_by_name_not_index():
    # cpu1 lists its states in another order: C2 is state1 there.
    states = _states({0: [("POLL", 0, False), ("C1", 1, False), ("C2", 400, False)],
                      1: [("POLL", 0, False), ("C2", 400, False), ("C1", 1, False)]})
    writes = cpuidle.plan_writes(states, cpuidle.plan_by_names(states, ["C2"], "disabled"))
    assert sorted((st.cpu, st.index, v) for st, v in writes) == [(0, 2, "1"), (1, 1, "1")]
    assert writes[1][0].path("disable") == "sys/devices/system/cpu/cpu1/cpuidle/state1/disable"


def test_plan_writes_skips_states_already_at_their_value():
    states = _states({0: [("C2", 400, True)], 1: [("C2", 400, False)]})
    writes = cpuidle.plan_writes(states, cpuidle.plan_by_names(states, ["C2"], "disabled"))
    assert [(st.cpu, v) for st, v in writes] == [(1, "1")]


def test_summarize_and_diff_aggregate_per_state():
    before = _states({c: [("POLL", 0, False), ("C2", 400, c == 0)] for c in range(4)})
    plan = cpuidle.plan_by_names(before, ["C2"], "disabled")
    after = cpuidle._after_states(before, cpuidle.plan_writes(before, plan))
    summary = cpuidle.summarize(before, after, plan)
    assert summary["C2"] == dict(latency=400, desired="disabled", cpus="0-3", cpus_changed=3,
                                 disabled_before=1, disabled_after=4, disabled_cpus="0-3")
    assert summary["POLL"]["desired"] is None and summary["POLL"]["cpus_changed"] == 0
    assert cpuidle.diff_text(summary, ["C2"]) == dict(before="C2: disabled on 1/4 CPUs\n",
                                                      after="C2: disabled on 4/4 CPUs\n")
    # The input of the check-mode prediction is left as it was.
    assert not before[1]["C2"].disabled


@pytest.mark.parametrize("text", ["0-", "abc", "5-3", "1,,2", "-1", "0-2x"])
def test_select_cpus_rejects_malformed_lists(build_node, text):
    node = Node(build_node("tiny-vm"))
    with pytest.raises(cpuidle.PlanError) as exc:
        cpuidle.select_cpus(node, text)
    assert "online CPUs are 0-1" in str(exc.value)


def test_select_cpus_rejects_cpus_the_node_does_not_have(build_node):
    node = Node(build_node("audited-epyc-8gpu", cpus=8))
    with pytest.raises(cpuidle.PlanError, match=r"\(8-9\); online CPUs are 0-7"):
        cpuidle.select_cpus(node, "6-9")
    assert cpuidle.select_cpus(node, " 1,3-4 ") == [1, 3, 4]
    assert cpuidle.select_cpus(node, None) == list(range(8))


def test_read_states_and_driver_on_presets(build_node):
    node = Node(build_node("xeon-4gpu-switch", cpus=4))
    assert cpuidle.idle_driver(node) == "intel_idle"
    states = cpuidle.read_states(node, [0, 3])
    assert cpuidle.state_names(states) == ["POLL", "C1", "C1E", "C6"]
    assert states[3]["C6"].latency == 170 and states[3]["C6"].index == 3 and not states[3]["C6"].disabled
    assert cpuidle.idle_driver(Node(build_node("tiny-vm"))) is None
