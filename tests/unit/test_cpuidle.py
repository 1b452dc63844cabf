"""The cpuidle family: module_utils/families/cpuidle.py's planning functions and facts, then the cpu_cstate
module (its API) through its entry point on every simulated-node preset.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

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


CPU = "sys/devices/system/cpu"
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
IDLE_PRESETS = {  # preset -> (deepest state, all state names)
    "audited-epyc-8gpu": ("C2", ["POLL", "C1", "C2"]),
    "epyc-pstate-epp": ("C2", ["POLL", "C1", "C2"]),
    "xeon-4gpu-switch": ("C6", ["POLL", "C1", "C1E", "C6"]),
    "locked-bus-perf": ("C2", ["POLL", "C1", "C2"]),
    "grace-arm64-4gpu": ("cluster-sleep-0", ["WFI", "cpu-sleep-0", "cluster-sleep-0"]),
}


def disabled_map(root):
    """{(cpu, state name): disable file content} for every CPU and state of the node."""
    out = {}
    base = os.path.join(root, CPU)
    for entry in os.listdir(base):
        if not (entry.startswith("cpu") and entry[3:].isdigit()):
            continue
        idle = os.path.join(base, entry, "cpuidle")
        for st in os.listdir(idle) if os.path.isdir(idle) else []:
            with open(os.path.join(idle, st, "name")) as fh:
                name = fh.read().strip()
            disable = os.path.join(idle, st, "disable")
            if os.path.isfile(disable):
                with open(disable) as fh:
                    out[(int(entry[3:]), name)] = fh.read().strip()
    return out


def set_disable(root, cpu, index, value):
    with open(os.path.join(root, CPU, "cpu%d/cpuidle/state%d/disable" % (cpu, index)), "w") as fh:
        fh.write("%s\n" % value)


@pytest.mark.parametrize("preset", sorted(IDLE_PRESETS))
def test_disable_deepest_state_on_every_cpu_and_nothing_else(build_node, run_module, digest, preset):
    deepest, names = IDLE_PRESETS[preset]
    root = build_node(preset)
    result, failed = run_module("cpu_cstate", {"root": root, "disable": [deepest]}, diff=True)
    assert not failed, result
    assert result["changed"] and result["supported"]
    values = disabled_map(root)
    ncpus = len({key[0] for key in values})
    assert {key[1] for key in values} == set(names)
    assert all(v == ("1" if key[1] == deepest else "0") for key, v in values.items())
    s = result["states"][deepest]
    assert (s["disabled_before"], s["disabled_after"], s["cpus_changed"]) == (0, ncpus, ncpus)
    assert s["cpus"] == "0-%d" % (ncpus - 1) and s["desired"] == "disabled"
    assert result["diff"] == {"before": "%s: disabled on 0/%d CPUs\n" % (deepest, ncpus),
                              "after": "%s: disabled on %d/%d CPUs\n" % (deepest, ncpus, ncpus)}
    # Rerun: nothing to do, nothing written.
    before = digest(root)
    again, failed = run_module("cpu_cstate", {"root": root, "disable": [deepest]})
    assert not failed and not again["changed"]
    assert again["states"][deepest]["cpus_changed"] == 0
    assert digest(root) == before


@pytest.mark.parametrize("preset", sorted(IDLE_PRESETS))
def test_check_mode_writes_nothing_and_reports_the_plan(build_node, run_module, digest, preset):
    deepest = IDLE_PRESETS[preset][0]
    root = build_node(preset, cpus=6)
    before = digest(root)
    result, failed = run_module("cpu_cstate", {"root": root, "disable": [deepest], "journal": JOURNAL},
                                check=True, diff=True)
    assert not failed and result["changed"]
    assert result["states"][deepest]["disabled_after"] == 6
    assert result["diff"]["after"] == "%s: disabled on 6/6 CPUs\n" % deepest
    assert digest(root) == before


@pytest.mark.parametrize("preset", sorted(IDLE_PRESETS))
def test_journal_then_restore_is_byte_identical(build_node, run_module, digest, preset):
    root = build_node(preset, cpus=8)
    set_disable(root, 5, 1, 1)  # an original that is not the default: C1 off on cpu5
    before = digest(root)
    result, failed = run_module("cpu_cstate", {"root": root, "max_latency_us": 0, "journal": JOURNAL})
    assert not failed and result["changed"]
    with open(os.path.join(root, JOURNAL.lstrip("/"))) as fh:
        data = json.load(fh)
    assert data["last_applied"]["family"] == "cpuidle"
    assert "POLL" not in data["families"]["cpuidle"]  # POLL was not touched
    # A second run must not overwrite the recorded originals.
    run_module("cpu_cstate", {"root": root, "disable": ["C1"], "state": "enabled", "journal": JOURNAL})
    result, failed = run_module("cpu_cstate", {"root": root, "restore": True, "journal": JOURNAL}, diff=True)
    assert not failed, result
    assert result["changed"]
    assert not os.path.exists(os.path.join(root, JOURNAL.lstrip("/")))
    assert digest(root) == before
    again, failed = run_module("cpu_cstate", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed and not again["changed"] and again["states"] == {}


def test_restore_keeps_other_families_and_leaves_the_rest_identical(build_node, run_module, digest):
    root = build_node("xeon-4gpu-switch", cpus=4)
    jpath = os.path.join(root, JOURNAL.lstrip("/"))
    os.makedirs(os.path.dirname(jpath))
    other = {"version": 1, "families": {"tunables": {"vm.swappiness": {"original": "60", "recorded": "x"}}}}
    with open(jpath, "w") as fh:
        json.dump(other, fh)
    before = digest(root)
    run_module("cpu_cstate", {"root": root, "disable": ["C6", "C1E"], "journal": JOURNAL})
    result, failed = run_module("cpu_cstate", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed and result["changed"]
    with open(jpath) as fh:
        data = json.load(fh)
    assert data["families"] == other["families"]
    with open(jpath, "w") as fh:
        json.dump(other, fh)
    assert digest(root) == before


def test_restore_in_check_mode_writes_nothing(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    run_module("cpu_cstate", {"root": root, "disable": ["C2"], "journal": JOURNAL})
    before = digest(root)
    result, failed = run_module("cpu_cstate", {"root": root, "restore": True, "journal": JOURNAL}, check=True)
    assert not failed and result["changed"]
    assert result["states"]["C2"]["disabled_after"] == 0
    assert digest(root) == before


def test_max_latency_disables_deep_and_reenables_shallow_states(build_node, run_module):
    root = build_node("xeon-4gpu-switch", cpus=4)
    set_disable(root, 2, 1, 1)  # C1 disabled on cpu2 by someone earlier
    set_disable(root, 3, 0, 1)  # POLL disabled on cpu3
    result, failed = run_module("cpu_cstate", {"root": root, "max_latency_us": 10}, diff=True)
    assert not failed, result
    values = disabled_map(root)
    for cpu in range(4):
        assert values[(cpu, "C6")] == "1"
        assert values[(cpu, "C1E")] == values[(cpu, "C1")] == values[(cpu, "POLL")] == "0"
    assert result["states"]["C1"]["desired"] == "enabled" and result["states"]["C1"]["cpus_changed"] == 1
    assert result["states"]["POLL"]["cpus_changed"] == 1
    assert "C1: disabled on 1/4 CPUs\n" in result["diff"]["before"]


def test_poll_is_disabled_only_when_named(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=2)
    run_module("cpu_cstate", {"root": root, "max_latency_us": 0})
    assert {k: v for k, v in disabled_map(root).items() if k[1] == "POLL"} == {(0, "POLL"): "0", (1, "POLL"): "0"}
    run_module("cpu_cstate", {"root": root, "disable": ["POLL"]})
    assert disabled_map(root)[(1, "POLL")] == "1"


def test_cpus_option_limits_the_writes(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=8)
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"], "cpus": "2-3,6"})
    assert not failed and result["cpus"] == "2-3,6"
    values = disabled_map(root)
    assert sorted(cpu for (cpu, name), v in values.items() if v == "1") == [2, 3, 6]
    assert result["states"]["C2"]["disabled_after"] == 3


def test_state_enabled_reenables_named_states(build_node, run_module):
    root = build_node("xeon-4gpu-switch", cpus=3)
    run_module("cpu_cstate", {"root": root, "disable": ["C6", "C1E"]})
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C6"], "state": "enabled"})
    assert not failed and result["states"]["C6"]["cpus_changed"] == 3
    values = disabled_map(root)
    assert all(values[(c, "C6")] == "0" and values[(c, "C1E")] == "1" for c in range(3))


def test_states_matched_by_name_when_indexes_differ(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    idle = os.path.join(root, CPU, "cpu3/cpuidle")
    os.rename(os.path.join(idle, "state1"), os.path.join(idle, "tmp"))
    os.rename(os.path.join(idle, "state2"), os.path.join(idle, "state1"))
    os.rename(os.path.join(idle, "tmp"), os.path.join(idle, "state2"))
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"]})
    assert not failed
    with open(os.path.join(idle, "state1/disable")) as fh:
        assert fh.read().strip() == "1"
    with open(os.path.join(idle, "state2/disable")) as fh:
        assert fh.read().strip() == "0"


def test_empty_disable_list_changes_nothing(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=2)
    before = digest(root)
    result, failed = run_module("cpu_cstate", {"root": root, "disable": []})
    assert not failed and not result["changed"] and set(result["states"]) == {"POLL", "C1", "C2"}
    assert digest(root) == before


def test_no_cpuidle_driver_is_unsupported_unless_required(build_node, run_module, digest):
    root = build_node("tiny-vm")
    before = digest(root)
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"]})
    assert not failed and result["supported"] is False and not result["changed"]
    assert "no cpuidle driver" in result["reason"]
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"], "required": True})
    assert failed and "no cpuidle driver" in result["msg"]
    assert digest(root) == before


def test_write_that_does_not_take_fails_naming_the_state_and_applies_the_rest(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    bad = os.path.join(root, CPU, "cpu2/cpuidle/state2/disable")
    os.unlink(bad)
    os.mkdir(bad)  # refuses the write (EISDIR), as a sysfs attribute that rejects a value would
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"]})
    assert failed and result["failed_states"] == ["C2"]
    assert "C2 on CPUs 2 (" in result["msg"] and "cpu2/cpuidle/state2/disable" in result["msg"]
    values = disabled_map(root)
    assert [values[(c, "C2")] for c in (0, 1, 3)] == ["1", "1", "1"]


BAD_INPUTS = [
    ({"disable": ["C3"]}, "unknown idle state C3: this node's states (driver names) are POLL, C1, C2"),
    ({"disable": ["C2", "C6", "c1"]}, "C6, c1"),
    ({"disable": [""]}, "empty state name"),
    ({"max_latency_us": -5}, "max_latency_us must be an integer >= 0"),
    ({"disable": ["C2"], "max_latency_us": 10}, "mutually exclusive"),
    ({"max_latency_us": 10, "state": "enabled"}, "state=enabled cannot be combined with max_latency_us"),
    ({"disable": ["C2"], "state": "off"}, "disabled, enabled"),
    ({"disable": ["C2"], "cpus": "0-"}, "online CPUs are 0-7"),
    ({"disable": ["C2"], "cpus": "abc"}, "not a cpulist"),
    # A digit str.isdigit accepts but int() refuses: a clear error, not a traceback.
    ({"disable": ["C2"], "cpus": "\u00b2"}, "not a cpulist"),
    ({"disable": ["C2"], "cpus": "1\n2"}, "not a cpulist"),
    ({"disable": ["C2"], "cpus": "4-64"}, "(8-64); online CPUs are 0-7"),
    ({"restore": True}, "restore=true needs the journal option"),
    ({}, "one of disable (state names), max_latency_us or restore=true is required"),
    ({"disable": ["C2"], "journal": "relative/journal.json"}, "journal path must be absolute"),
    ({"max_latency_us": "ten"}, "max_latency_us"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS)
def test_bad_inputs_fail_naming_what_is_allowed_and_write_nothing(build_node, run_module, digest, args, message):
    root = build_node("audited-epyc-8gpu", cpus=8)
    before = digest(root)
    result, failed = run_module("cpu_cstate", dict(args, root=root))
    assert failed
    assert message in result["msg"]
    assert digest(root) == before


def test_unreadable_journal_fails_before_writing(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=2)
    jpath = os.path.join(root, JOURNAL.lstrip("/"))
    os.makedirs(os.path.dirname(jpath))
    with open(jpath, "w") as fh:
        fh.write("{not json")
    before = digest(root)
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"], "journal": JOURNAL})
    assert failed and "unreadable" in result["msg"]
    assert digest(root) == before


def test_one_call_on_384_cpus_is_fast(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=384)
    start = time.perf_counter()
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"], "journal": JOURNAL})
    elapsed = time.perf_counter() - start
    assert not failed and result["states"]["C2"]["cpus_changed"] == 384
    assert elapsed < 1.0, elapsed


def test_arm64_psci_idle_latency_bounds_of_the_presets(build_node, run_module, digest):
    """inference-throughput (100 us) and inference-latency (2 us) on psci_idle: only WFI stays enabled."""
    root = build_node("grace-arm64-4gpu", cpus=8)
    before = digest(root)
    for bound in (100, 2):
        result, failed = run_module("cpu_cstate", {"root": root, "max_latency_us": bound, "journal": JOURNAL})
        assert not failed, result
        assert result["driver"] == "psci_idle"
        values = disabled_map(root)
        assert {name for (_cpu, name), v in values.items() if v == "1"} == {"cpu-sleep-0", "cluster-sleep-0"}
        assert result["states"]["WFI"]["desired"] == "enabled" and result["states"]["WFI"]["disabled_after"] == 0
    result, failed = run_module("cpu_cstate", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed, result
    assert digest(root) == before


# -- Faults: one CPU's file immutable or gone never stops the others, and is named with its cause


@contextlib.contextmanager
def immutable(*paths):
    """chattr +i the files (as root, chmod does not stop a write), always undone."""
    done = []
    try:
        for path in paths:
            if subprocess.run(["chattr", "+i", path], capture_output=True, check=False).returncode:
                pytest.skip("chattr +i is not available here (needs root and a file system with attributes)")
            done.append(path)
        yield
    finally:
        for path in done:
            subprocess.run(["chattr", "-i", path], check=False)


def state_dir(root, cpu, index):
    return os.path.join(root, CPU, "cpu%d/cpuidle/state%d" % (cpu, index))


def test_runtime_goes_on_past_an_immutable_and_a_vanished_disable_file(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    os.unlink(os.path.join(state_dir(root, 3, 2), "disable"))
    with immutable(os.path.join(state_dir(root, 1, 2), "disable")):
        result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"], "journal": JOURNAL})
    assert failed and result["failed_states"] == ["C2"]
    msg = result["msg"]
    assert msg.startswith("idle state writes did not take (the other CPUs and states were set): C2 on CPUs 1,3 (")
    assert "cpu1/cpuidle/state2/disable for writing: Operation not permitted" in msg
    assert "cpu3/cpuidle/state2/disable for writing: No such file or directory" in msg
    values = disabled_map(root)
    assert [values[(c, "C2")] for c in (0, 1, 2)] == ["1", "0", "1"]
    with open(os.path.join(root, JOURNAL.lstrip("/"))) as fh:
        # The originals of the CPUs that were read; cpu3's vanished file had none to record.
        assert json.load(fh)["families"]["cpuidle"]["C2"]["original"] == {"0": "0-2"}


def test_restore_goes_on_past_what_it_cannot_restore_and_keeps_exactly_that(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    original = digest(root)
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C1", "C2"], "journal": JOURNAL})
    assert not failed, result
    aside = os.path.join(root, "state2-aside")
    os.rename(state_dir(root, 3, 2), aside)  # cpu3's C2 vanished (as when the driver changed)
    with immutable(os.path.join(state_dir(root, 1, 2), "disable")):
        result, failed = run_module("cpu_cstate", {"root": root, "restore": True, "journal": JOURNAL})
    assert failed and result["failed_states"] == ["C2"]
    assert result["msg"].startswith("idle states could not be restored (they stay in the journal; the others were "
                                    "restored): C2 on CPUs 1,3 (")
    assert "Operation not permitted" in result["msg"] and "cpu3 has no idle state C2 any more" in result["msg"]
    values = disabled_map(root)
    assert [values[(c, "C1")] for c in range(4)] == ["0"] * 4  # every other state restored
    assert [values[(c, "C2")] for c in (0, 1, 2)] == ["0", "1", "0"]
    with open(os.path.join(root, JOURNAL.lstrip("/"))) as fh:
        families = json.load(fh)["families"]
    assert list(families) == ["cpuidle"] and list(families["cpuidle"]) == ["C2"]
    assert families["cpuidle"]["C2"]["original"] == {"0": "1,3"}
    # Once the fault is gone, the next rollback restores the rest and the journal goes.
    os.rename(aside, state_dir(root, 3, 2))
    result, failed = run_module("cpu_cstate", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed, result
    assert not os.path.exists(os.path.join(root, JOURNAL.lstrip("/")))
    assert digest(root) == original


# -- Check mode predicts the faults a real run would meet, and still writes nothing


def make_faults(root):
    """cpu1's C2 disable file immutable (returned for chattr), cpu2's a directory, cpu3's gone; cpu0 healthy."""
    os.unlink(os.path.join(state_dir(root, 2, 2), "disable"))
    os.mkdir(os.path.join(state_dir(root, 2, 2), "disable"))
    os.unlink(os.path.join(state_dir(root, 3, 2), "disable"))
    return os.path.join(state_dir(root, 1, 2), "disable")


def test_check_mode_fails_where_the_real_run_would_and_writes_nothing(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    with immutable(make_faults(root)):
        before = digest(root)
        args = {"root": root, "disable": ["C1", "C2"], "journal": JOURNAL}
        checked, failed = run_module("cpu_cstate", args, check=True, diff=True)
        assert digest(root) == before
        assert failed and checked["failed_states"] == ["C2"]
        msg = checked["msg"]
        assert msg.startswith("check mode: a real run would fail. idle state writes would not take (the other CPUs "
                              "and states would be set): C2 on CPUs 1-3 (")
        assert "cpu1/cpuidle/state2/disable is not writable (Operation not permitted: the file is immutable" in msg
        assert "cpu2/cpuidle/state2/disable is a directory" in msg
        assert "cpu3/cpuidle/state2/disable does not exist" in msg
        # The healthy changes are still reported as planned.
        assert checked["states"]["C1"]["disabled_after"] == 4 and checked["states"]["C1"]["cpus_changed"] == 4
        assert checked["states"]["C2"]["disabled_cpus"] == "0" and checked["states"]["C2"]["cpus_changed"] == 1
        assert checked["diff"]["after"] == "C1: disabled on 4/4 CPUs\nC2: disabled on 1/4 CPUs\n"
        applied, failed = run_module("cpu_cstate", args)
    assert failed and applied["failed_states"] == ["C2"] and "C2 on CPUs 1-3 (" in applied["msg"]
    assert {k: applied["states"][n][k] for n in ("C1", "C2") for k in ("disabled_cpus", "cpus_changed")} == \
        {k: checked["states"][n][k] for n in ("C1", "C2") for k in ("disabled_cpus", "cpus_changed")}


def test_restore_in_check_mode_names_what_it_could_not_restore(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"], "journal": JOURNAL})
    assert not failed, result
    with immutable(os.path.join(state_dir(root, 1, 2), "disable")):
        before = digest(root)
        result, failed = run_module("cpu_cstate", {"root": root, "restore": True, "journal": JOURNAL}, check=True)
        assert digest(root) == before  # the journal too
    assert failed and result["failed_states"] == ["C2"]
    assert result["msg"].startswith("check mode: a real run would fail. idle states could not be restored (they "
                                    "would stay in the journal; the others would be restored): C2 on CPUs 1 (")
    assert result["states"]["C2"]["disabled_cpus"] == "1"


def test_check_mode_probes_only_the_files_that_change(build_node, run_module, monkeypatch):
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import node as node_mod

    root = build_node("audited-epyc-8gpu", cpus=8)
    for cpu in range(5):
        set_disable(root, cpu, 2, 1)
    probed = []
    real = node_mod.Node.write_problem
    monkeypatch.setattr(node_mod.Node, "write_problem", lambda self, *p: probed.append(p) or real(self, *p))
    result, failed = run_module("cpu_cstate", {"root": root, "disable": ["C2"]}, check=True)
    assert not failed and result["states"]["C2"]["cpus_changed"] == 3
    assert sorted(probed) == [(CPU + "/cpu%d/cpuidle/state2/disable" % c,) for c in (5, 6, 7)]
