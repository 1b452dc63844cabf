"""The fleet reboot's decisions (plugin_utils/reboot.py): settings, Slurm's node states on real captures, the budget."""

from __future__ import annotations

import itertools
import os

import pytest

from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot

# --- settings ----------------------------------------------------------------------------------------------


def test_defaults_reboot_one_host_at_a_time_with_the_issue_timeouts():
    got, errors = reboot.reboot_settings({}, hosts=40)
    assert errors == []
    assert got == {"reboot_ok": False, "max_unavailable": 1, "max_unavailable_given": 1, "reboot_timeout": 1800,
                   "wait_timeout": 3600, "drain_timeout": 3600, "drain": None,
                   "claim_lease": 3600, "budget_scope": "fleet"}


@pytest.mark.parametrize("value, hosts, count", [
    (1, 6, 1), ("3", 6, 3), (3, 6, 3), (" 2 ", 6, 2),
    ("10%", 25, 2),    # 2.5 rounded down
    ("10%", 5, 1),     # 0.5 rounded down is 0: at least one host
    ("10%", 0, 1),
    ("100%", 6, 6), ("12.5%", 16, 2), ("50 %", 7, 3),
    (10, 6, 10),       # more than the play has: the budget never binds
])
def test_max_unavailable_is_a_count_or_a_share_of_the_play_rounded_down_at_least_one(value, hosts, count):
    assert reboot.max_unavailable_count(value, hosts) == (count, None)
    got, errors = reboot.reboot_settings({"max_unavailable": value}, hosts)
    assert errors == [] and got["max_unavailable"] == count and got["max_unavailable_given"] == value


@pytest.mark.parametrize("value", [0, "0", -1, "-1", "0%", "0.0%", "101%", "150%", "abc", "", True, False, 1.5,
                                   "1.5", "10%%", [1], {"n": 1}])
def test_a_bad_max_unavailable_is_refused_naming_what_is_allowed(value):
    count, problem = reboot.max_unavailable_count(value, 10)
    assert count is None
    assert problem.startswith("gpunode_tuning_reboot_max_unavailable must be " + reboot.MAX_UNAVAILABLE_ALLOWED)
    _got, errors = reboot.reboot_settings({"max_unavailable": value, "drain": "slurm", "reboot_ok": True}, 10)
    assert errors == [problem]


@pytest.mark.parametrize("key, variable", sorted(reboot.TIMEOUT_VARIABLES.items()))
@pytest.mark.parametrize("value", [0, -5, "0", "1h", "", True, 1.5, reboot.MAX_TIMEOUT + 1, [60]])
def test_a_bad_timeout_is_refused_naming_the_variable(key, variable, value):
    _got, errors = reboot.reboot_settings({key: value}, 6)
    assert len(errors) == 1 and errors[0].startswith(variable + " must be a whole number of seconds from 1 to"), errors


@pytest.mark.parametrize("key", sorted(reboot.TIMEOUT_VARIABLES))
def test_timeouts_take_whole_seconds_as_numbers_or_text(key):
    assert reboot.reboot_settings({key: "600"}, 6)[0][key] == 600
    assert reboot.reboot_settings({key: reboot.MAX_TIMEOUT}, 6)[0][key] == reboot.MAX_TIMEOUT


def test_reboot_ok_without_a_drain_backend_is_refused_naming_the_choices():
    _got, errors = reboot.reboot_settings({"reboot_ok": True}, 6)
    assert errors == ["gpunode_tuning_reboot_ok is true, so gpunode_tuning_drain must say how hosts leave service "
                      "before they reboot: one of none, slurm, kubernetes, command (none reboots without draining, "
                      "and must be chosen explicitly)"]
    assert reboot.reboot_settings({"reboot_ok": "yes", "drain": " "}, 6)[1] == errors


@pytest.mark.parametrize("backend", reboot.DRAIN_BACKENDS)
def test_every_drain_backend_is_accepted_none_included_when_named(backend):
    got, errors = reboot.reboot_settings({"reboot_ok": True, "drain": backend}, 6)
    assert errors == [] and got["drain"] == backend and got["reboot_ok"] is True


def test_without_reboot_ok_the_drain_may_be_left_unset_but_not_wrong():
    assert reboot.reboot_settings({"reboot_ok": "false"}, 6) == (reboot.reboot_settings({}, 6)[0], [])
    _got, errors = reboot.reboot_settings({"drain": "ssh"}, 6)
    assert errors == ['gpunode_tuning_drain must be one of none, slurm, kubernetes, command (got "ssh")']
    _got, errors = reboot.reboot_settings({"reboot_ok": "maybe", "drain": "slurm"}, 6)
    assert errors == ['gpunode_tuning_reboot_ok must be true or false (got "maybe")']


def test_every_bad_setting_is_reported_at_once():
    _got, errors = reboot.reboot_settings({"reboot_ok": True, "max_unavailable": 0, "reboot_timeout": 0,
                                           "wait_timeout": "x", "drain_timeout": -1}, 6)
    assert [e.split(" ")[0] for e in errors] == [
        "gpunode_tuning_reboot_max_unavailable", "gpunode_tuning_reboot_timeout", "gpunode_tuning_reboot_wait_timeout",
        "gpunode_tuning_drain_timeout", "gpunode_tuning_reboot_ok"]


# --- Slurm's states ------------------------------------------------------------------------------------------

OUT, IN = True, False


@pytest.mark.parametrize("token, state, flags, out", [
    # sinfo %T (long names with one suffix), from the captures
    ("idle", "IDLE", [], IN), ("mixed", "MIXED", [], IN), ("allocated", "ALLOCATED", [], IN),
    ("completing", "COMPLETING", [], IN), ("reserved", "RESERVED", [], IN),
    ("drained", "DRAINED", ["DRAIN"], OUT), ("draining", "DRAINING", ["DRAIN"], OUT),
    ("drained*", "DRAINED", ["DRAIN", "NOT_RESPONDING"], OUT), ("down", "DOWN", [], OUT),
    ("down*", "DOWN", ["NOT_RESPONDING"], OUT), ("idle*", "IDLE", ["NOT_RESPONDING"], OUT),
    ("fail", "FAIL", ["FAIL"], OUT), ("fail*", "FAIL", ["FAIL", "NOT_RESPONDING"], OUT),
    ("maint", "MAINT", ["MAINT"], OUT), ("draining@", "DRAINING", ["DRAIN", "REBOOT_REQUESTED"], OUT),
    ("reboot^", "REBOOT", ["REBOOT_ISSUED"], OUT),
    # sinfo(1)'s other suffixes: powered off, powering up, planned by backfill, maintenance reservation
    ("idle~", "IDLE", ["POWERED_DOWN"], IN), ("idle#", "IDLE", ["POWERING_UP"], IN),
    ("mixed-", "MIXED", ["PLANNED"], IN), ("idle$", "IDLE", ["MAINT"], OUT),
    ("mixed@", "MIXED", ["REBOOT_REQUESTED"], OUT),
    ("allocated+", "ALLOCATED", ["COMPLETING"], IN),
    # %t (the default sinfo): short names
    ("drng@", "DRAINING", ["DRAIN", "REBOOT_REQUESTED"], OUT), ("drain", "DRAINED", ["DRAIN"], OUT),
    ("mix", "MIXED", [], IN), ("alloc", "ALLOCATED", [], IN), ("comp", "COMPLETING", [], IN),
    ("boot^", "REBOOT", ["REBOOT_ISSUED"], OUT), ("resv", "RESERVED", [], IN), ("plnd", "PLANNED", [], IN),
    # neither can be counted on for work
    ("inval", "INVAL", [], OUT), ("unk", "UNKNOWN", [], OUT), ("", "UNKNOWN", [], OUT),
    # scontrol State=
    ("IDLE+DRAIN", "IDLE", ["DRAIN"], OUT), ("DOWN+DRAIN", "DOWN", ["DRAIN"], OUT),
    ("MIXED+DRAIN+REBOOT_REQUESTED", "MIXED", ["DRAIN", "REBOOT_REQUESTED"], OUT),
    ("DOWN+REBOOT_ISSUED", "DOWN", ["REBOOT_ISSUED"], OUT),
    ("IDLE+MAINTENANCE+RESERVED", "IDLE", ["MAINT", "RESERVED"], OUT),
    ("IDLE+NOT_RESPONDING", "IDLE", ["NOT_RESPONDING"], OUT), ("MIXED+FAIL", "MIXED", ["FAIL"], OUT),
    ("IDLE+COMPLETING", "IDLE", ["COMPLETING"], IN), ("IDLE+DYNAMIC_NORM", "IDLE", ["DYNAMIC_NORM"], IN),
    ("DOWN+CLOUD+REBOOT_ISSUED", "DOWN", ["CLOUD", "REBOOT_ISSUED"], OUT),
    ("IDLE+CLOUD+POWERED_DOWN", "IDLE", ["CLOUD", "POWERED_DOWN"], IN),
    ("MIXED+DYNAMIC_NORM+MAINTENANCE+RESERVED+PLANNED", "MIXED", ["DYNAMIC_NORM", "MAINT", "PLANNED", "RESERVED"], OUT),
    # older Slurm: a suffix on the base state inside scontrol's State= (20.11's booting node)
    ("REBOOT*+DRAIN", "REBOOT", ["DRAIN", "NOT_RESPONDING"], OUT),
    ("DOWN*+DRAIN", "DOWN", ["DRAIN", "NOT_RESPONDING"], OUT),
])
def test_each_state_and_its_suffix_or_flags(token, state, flags, out):
    assert reboot.slurm_state(token) == {"state": state, "flags": flags, "out_of_service": out}


@pytest.mark.parametrize("reason, ours", [
    ("gpunode.tuning: reboot for amd_pstate=active", True), ("  gpunode.tuning: x", True),
    ("gpunode.tuning reboot", False), ("reboot for gpunode.tuning: x", False), ("", False), (None, False),
    ("Kill task failed", False)])
def test_our_drains_are_known_by_their_reason(reason, ours):
    assert reboot.is_our_reason(reason) is ours


def test_our_reason_names_the_pending_change_and_stays_one_printable_line():
    assert reboot.drain_reason(["amd_pstate=active", "iommu=pt"]) == (
        "gpunode.tuning: reboot for amd_pstate=active iommu=pt")
    assert reboot.drain_reason([]) == "gpunode.tuning: reboot for pending changes"
    hostile = reboot.drain_reason(["a\nState=RESUME", "b\x1b[2J", "c" * 500])
    assert "\n" not in hostile and "\x1b" not in hostile and len(hostile) == reboot.MAX_REASON
    assert reboot.is_our_reason(hostile) and hostile.startswith("gpunode.tuning: reboot for a State=RESUME b [2J c")


# --- the real captures (tests/data/real/slurm-*) -------------------------------------------------------------

REAL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "real")
CAPTURES = (
    "slurm-scontrol-show-node-down-not-responding-23.11-slurm-exporter-198.txt",
    "slurm-scontrol-show-node-idle-drain-24.05-awsome-distributed-ai-195.txt",
    "slurm-scontrol-show-node-o-captured-here.txt",
    "slurm-scontrol-show-nodes-o-25.11-maintenance-drain-slurm-exporter.txt",
    "slurm-scontrol-show-nodes-o-26.05-dynamic-norm-slurm-exporter.txt",
    "slurm-scontrol-state-reboot-while-booting-20.11-nhc-84.txt",
    "slurm-sinfo-D-T-E-reasons-prometheus-slurm-exporter-33.txt",
    "slurm-sinfo-N-states-captured-here.txt",
    "slurm-sinfo-R-captured-here.txt",
    "slurm-sinfo-N-stamped-captured-here.txt",
    "slurm-sdiag-captured-here.txt",
    "slurm-sinfo-n-T-700-nodes-prometheus-slurm-exporter.txt",
    "slurm-sinfo-partitions-drng-maint-fail-arjunausers-69.txt",
)


def test_every_slurm_capture_is_read_here_and_named_in_the_readme():
    assert sorted(n for n in os.listdir(REAL) if n.startswith("slurm-")) == sorted(CAPTURES)
    with open(os.path.join(REAL, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    with open(os.path.abspath(__file__), encoding="utf-8") as fh:
        tests = fh.read()
    assert [n for n in CAPTURES if "| %s |" % n not in readme] == []
    assert [n for n in CAPTURES if tests.count('"%s"' % n) < 2] == []  # listed above and read by a test


HERE_OUT = {"down1", "drained1", "drainedreboot1", "draining1", "fail1", "failing1", "maint1", "noresp1",
            "rebootasap1", "rebooted1", "rebootissued1"}
HERE_IN = {"idle1", "mixed1", "alloc1", "completing1"}
HERE_OURS = {"drained1", "drainedreboot1", "draining1"}


def out_of(nodes):
    return {n for n, r in nodes.items() if r["out_of_service"]}


def test_sinfo_of_every_state_captured_here(real):
    nodes = reboot.parse_sinfo(real("slurm-sinfo-N-states-captured-here.txt").text)
    assert set(nodes) == HERE_OUT | HERE_IN and out_of(nodes) == HERE_OUT
    assert {n for n, r in nodes.items() if r["ours"]} == HERE_OURS
    assert nodes["draining1"] == {"state": "DRAINING", "flags": ["DRAIN"], "out_of_service": True, "ours": True,
                                  "reason": "gpunode.tuning: reboot for amd_pstate=active"}
    # A drained node that rebooted is still "drained" for sinfo, with our reason: adopted by a later run.
    assert nodes["drainedreboot1"]["state"] == "DRAINED" and nodes["drainedreboot1"]["ours"]
    assert nodes["rebooted1"]["reason"] == "Node unexpectedly rebooted"
    assert nodes["rebootasap1"]["flags"] == ["DRAIN", "REBOOT_REQUESTED"] and not nodes["rebootasap1"]["ours"]
    assert nodes["idle1"]["reason"] == ""  # sinfo's "none"


def test_scontrol_o_of_every_state_captured_here(real):
    nodes = reboot.parse_scontrol_nodes(real("slurm-scontrol-show-node-o-captured-here.txt").text)
    assert set(nodes) == HERE_OUT | HERE_IN and out_of(nodes) == HERE_OUT
    assert {n for n, r in nodes.items() if r["ours"]} == HERE_OURS
    # What sinfo shows as drained, scontrol shows as DOWN+DRAIN after the reboot: its reason without [user@time].
    assert (nodes["drainedreboot1"]["state"], nodes["drainedreboot1"]["flags"]) == ("DOWN", ["DRAIN"])
    assert nodes["drainedreboot1"]["reason"] == "gpunode.tuning: reboot for amd_pstate=active"
    assert nodes["maint1"]["flags"] == ["MAINT", "RESERVED"]
    assert nodes["rebootissued1"] == dict(nodes["rebootissued1"], state="DOWN", flags=["REBOOT_ISSUED"],
                                          reason="firmware update : reboot issued")
    assert nodes["noresp1"]["flags"] == ["NOT_RESPONDING"] and nodes["completing1"]["flags"] == ["COMPLETING"]
    assert all(r["boot_time"] and r["slurmd_start_time"] for r in nodes.values())


def test_sinfo_and_scontrol_captured_here_agree_on_who_is_out_and_whose_drain(real):
    by_sinfo = reboot.parse_sinfo(real("slurm-sinfo-N-states-captured-here.txt").text)
    by_scontrol = reboot.parse_scontrol_nodes(real("slurm-scontrol-show-node-o-captured-here.txt").text)
    for node in by_sinfo:
        assert (by_sinfo[node]["out_of_service"], by_sinfo[node]["ours"], by_sinfo[node]["reason"]) == (
            by_scontrol[node]["out_of_service"], by_scontrol[node]["ours"], by_scontrol[node]["reason"]), node


def test_sinfo_R_cuts_reasons_at_20_characters_so_the_rollout_reads_E_instead(real):
    lines = real("slurm-sinfo-R-captured-here.txt").text.splitlines()
    assert lines[0].split() == ["REASON", "USER", "TIMESTAMP", "NODELIST"]
    ours = {line.split()[-1] for line in lines[1:] if line.startswith("gpunode.tuning: rebo ")}
    assert ours == {"drained1,draining1", "drainedreboot1"}
    assert all(len(line[:20].rstrip()) <= 20 for line in lines[1:])


def test_default_sinfo_of_a_cluster_draining_for_a_reboot(real):
    """ArjunaUsers#69: the partition view with short states: drng@ (draining, reboot pending), fail*, maint, mix."""
    capture = real("slurm-sinfo-partitions-drng-maint-fail-arjunausers-69.txt")
    rows = [line.split() for line in capture.text.splitlines()]
    assert rows[0] == ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "NODELIST"]
    states = {row[4]: reboot.slurm_state(row[4]) for row in rows[1:]}
    assert {s for s, r in states.items() if r["out_of_service"]} == {"drng@", "fail*", "maint"}
    assert states["drng@"]["flags"] == ["DRAIN", "REBOOT_REQUESTED"]
    assert sum(int(row[3]) for row in rows[1:] if states[row[4]]["out_of_service"]) == 55 + 1 + 12 + 5 + 3


def test_counts_states_and_reasons_of_a_production_cluster(real):
    """prometheus-slurm-exporter#33: %D,%T,%E, reasons set by people (TTS#...), NHC and Slurm (reboot timed out)."""
    rows = [line.split(",", 2) for line in real("slurm-sinfo-D-T-E-reasons-prometheus-slurm-exporter-33.txt").text
            .splitlines() if line.count(",") >= 2]
    assert len(rows) == 8  # the [...] and empty lines are not rows
    out = [(int(count), reason) for count, state, reason in rows if reboot.slurm_state(state)["out_of_service"]]
    assert sum(count for count, _reason in out) == 17
    assert (11, "reboot timed out") in out and not any(reboot.is_our_reason(reason) for _count, reason in out)
    assert [state for _c, state, _r in rows if not reboot.slurm_state(state)["out_of_service"]] == ["idle", "reserved"]


def test_every_node_of_a_700_node_cluster(real):
    """prometheus-slurm-exporter's test data: sinfo -h -o "%n,%T" on two production partitions."""
    nodes = reboot.parse_sinfo(real("slurm-sinfo-n-T-700-nodes-prometheus-slurm-exporter.txt").text, separator=",")
    assert len(nodes) == 709
    counts = {}
    for record in nodes.values():
        counts[record["out_of_service"]] = counts.get(record["out_of_service"], 0) + 1
    assert counts == {False: 250 + 319 + 44, True: 1 + 66 + 7 + 11 + 10 + 1}
    assert nodes["lxfoo0242"]["flags"] == ["DRAIN", "NOT_RESPONDING"] and nodes["lxfoo0312"]["state"] == "DOWN"
    assert not any(r["ours"] or r["reason"] for r in nodes.values())


def test_multi_line_scontrol_of_a_node_slurm_drained_24_05(real):
    """awsome-distributed-ai#195: IDLE+DRAIN, the Reason after a line of spaces, OS= with spaces."""
    capture = real("slurm-scontrol-show-node-idle-drain-24.05-awsome-distributed-ai-195.txt").text
    nodes = reboot.parse_scontrol_nodes(capture)
    assert nodes == {"yigou-dev-102-68": {
        "state": "IDLE", "flags": ["DRAIN"], "out_of_service": True, "ours": False,
        "reason": "gres/gpu count reported lower than configured (0 < 1)",
        "boot_time": "2024-11-18T20:46:45", "slurmd_start_time": "2024-12-19T11:41:49"}}
    fields = reboot.scontrol_fields(capture)
    assert fields["OS"] == "Linux 5.10.0-153.12.0.92.oe2203sp2.x86_64 #1 SMP Wed Jun 28 23:04:48 CST 2023"
    assert fields["AllocTRES"] == "" and fields["CfgTRES"] == "cpu=8,mem=1M,billing=8,gres/gpu=1"


def test_multi_line_scontrol_of_a_node_down_not_responding_cut_short(real):
    """slurm_exporter#198, Slurm 23.11.4: DOWN+NOT_RESPONDING; the stored copy ends in "CfgT" (no Reason)."""
    capture = real("slurm-scontrol-show-node-down-not-responding-23.11-slurm-exporter-198.txt").text
    assert capture.endswith("   CfgT")
    nodes = reboot.parse_scontrol_nodes(capture)
    assert nodes["gpu02"]["state"] == "DOWN" and nodes["gpu02"]["flags"] == ["NOT_RESPONDING"]
    assert nodes["gpu02"]["out_of_service"] and nodes["gpu02"]["reason"] == ""
    assert reboot.scontrol_fields(capture)["ResumeAfterTime"] == "None"


def test_scontrol_o_of_drained_nodes_in_a_maintenance_reservation_25_11(real):
    """slurm_exporter's real 25.11.2 capture: MAINTENANCE+RESERVED, PLANNED, and Reason followed by ReservationName."""
    nodes = reboot.parse_scontrol_nodes(real("slurm-scontrol-show-nodes-o-25.11-maintenance-drain-slurm-exporter.txt")
                                        .text)
    assert out_of(nodes) == {"c1", "c2", "c3", "c4"} and set(nodes) - out_of(nodes) == {"c5", "c6", "c7"}
    assert nodes["c1"]["reason"] == "planned_maintenance" and nodes["c4"]["reason"] == "planned_maintenance"
    assert nodes["c1"]["flags"] == ["DRAIN", "DYNAMIC_NORM", "MAINT", "RESERVED"]
    assert nodes["c5"]["flags"] == ["DYNAMIC_NORM", "RESERVED"]  # an ordinary reservation: in service
    assert "PLANNED" in nodes["c2"]["flags"]


def test_scontrol_o_of_a_healthy_26_05_cluster(real):
    """slurm_exporter's 26.05.2 capture: DYNAMIC_NORM on every node, SuspendTime, no Reason: all in service."""
    nodes = reboot.parse_scontrol_nodes(real("slurm-scontrol-show-nodes-o-26.05-dynamic-norm-slurm-exporter.txt").text)
    assert len(nodes) == 20 and not out_of(nodes)
    assert {r["state"] for r in nodes.values()} == {"IDLE", "MIXED"}
    assert all(r["flags"] == ["DYNAMIC_NORM"] and r["reason"] == "" for r in nodes.values())


def test_a_booting_node_of_slurm_20_11(real):
    """nhc#84: scontrol's State= of a node booting after scontrol reboot: REBOOT*+DRAIN."""
    state = reboot.scontrol_fields(real("slurm-scontrol-state-reboot-while-booting-20.11-nhc-84.txt").text)["State"]
    assert reboot.slurm_state(state) == {"state": "REBOOT", "flags": ["DRAIN", "NOT_RESPONDING"],
                                         "out_of_service": True}


def test_scontrol_reason_runs_to_its_stamp_and_may_hold_equals_signs():
    line = ("NodeName=n1 Arch=x86_64 State=IDLE+DRAIN Partitions=p Reason=gpunode.tuning: reboot for amd_pstate=active "
            "iommu=pt [root@2026-12-01T21:52:55] Comment=rack 4")
    node = reboot.parse_scontrol_nodes(line)["n1"]
    assert node["reason"] == "gpunode.tuning: reboot for amd_pstate=active iommu=pt" and node["ours"]
    assert reboot.scontrol_fields(line)["Comment"] == "rack 4"
    assert reboot.scontrol_fields(line)["Partitions"] == "p"


# --- hosts and the budget ------------------------------------------------------------------------------------


def test_slurm_hosts_maps_hosts_to_their_nodes_and_counts_a_missing_node_out(real):
    nodes = reboot.parse_sinfo(real("slurm-sinfo-N-states-captured-here.txt").text)
    got = reboot.slurm_hosts(nodes, {"h-idle": "idle1", "h-ours": "drained1", "h-down": "rebooted1",
                                     "h-gone": "nosuch"})
    assert got == {"out_of_service": ["h-ours", "h-down", "h-gone"], "ours": ["h-ours"], "missing": ["h-gone"],
                   "why": {"h-ours": "drained: gpunode.tuning: reboot for amd_pstate=active",
                           "h-down": "down: Node unexpectedly rebooted", "h-gone": "Slurm lists no node nosuch"}}


HOSTS = ["h1", "h2", "h3", "h4", "h5", "h6"]


def test_one_host_at_a_time_by_default():
    plan = reboot.reboot_plan(HOSTS, out_of_service=[], ours=[], want=HOSTS, max_unavailable=1)
    assert (plan["start"], plan["wait"], plan["continue"], plan["skip"], plan["free"]) == (["h1"], HOSTS[1:], [], [], 0)
    assert plan["why"]["h2"] == ("waiting for a slot: gpunode_tuning_reboot_max_unavailable is 1 and 1 host(s) of the "
                                 "run are out of service or starting now (h1)")


def test_a_node_drained_by_someone_else_uses_the_only_slot_and_is_left_alone():
    plan = reboot.reboot_plan(HOSTS, out_of_service=["h3"], ours=[], want=HOSTS, max_unavailable=1)
    assert plan["start"] == [] and plan["skip"] == ["h3"] and plan["wait"] == ["h1", "h2", "h4", "h5", "h6"]
    assert "out of service or starting now (h3)" in plan["why"]["h1"]
    assert plan["why"]["h3"] == "out of service before this run, not by gpunode.tuning: left as it is"
    assert plan["unavailable"] == ["h3"]


def test_our_own_drains_continue_in_the_slot_they_hold_and_count_against_the_budget():
    plan = reboot.reboot_plan(HOSTS, out_of_service=["h2"], ours=["h2"], want=HOSTS, max_unavailable=2)
    assert (plan["continue"], plan["start"], plan["wait"]) == (["h2"], ["h1"], ["h3", "h4", "h5", "h6"])


def test_a_host_we_drained_that_needs_no_reboot_any_more_is_returned():
    plan = reboot.reboot_plan(HOSTS, out_of_service=["h4"], ours=["h4"], want=["h1"], max_unavailable=2)
    assert plan["resume"] == ["h4"] and plan["start"] == ["h1"] and plan["free"] == 0


def test_unreachable_and_down_hosts_of_the_run_count_those_of_other_runs_do_not():
    plan = reboot.reboot_plan(HOSTS, out_of_service=["h5", "h6", "elsewhere1", "elsewhere2"], ours=[],
                              want=["h1", "h2"], max_unavailable=3)
    assert plan["unavailable"] == ["h5", "h6"] and plan["start"] == ["h1"] and plan["wait"] == ["h2"]


def test_halted_rollout_starts_nothing_but_our_drains_go_on():
    plan = reboot.reboot_plan(HOSTS, out_of_service=["h1"], ours=["h1"], want=HOSTS, max_unavailable=6,
                              halted="h0 did not come back within gpunode_tuning_reboot_timeout (1800 s)")
    assert plan["start"] == [] and plan["continue"] == ["h1"] and plan["wait"] == HOSTS[1:]
    assert plan["why"]["h2"] == "not rebooted: h0 did not come back within gpunode_tuning_reboot_timeout (1800 s)"


def test_a_budget_above_the_fleet_starts_every_host_in_rollout_order_once():
    plan = reboot.reboot_plan(["h2", "h1", "h2", "h3"], out_of_service=[], ours=[], want=["h3", "h1", "h2"],
                              max_unavailable=10)
    assert plan["start"] == ["h2", "h1", "h3"] and plan["free"] == 7 and plan["why"] == {}


def test_hosts_that_need_no_reboot_are_never_in_the_plan():
    plan = reboot.reboot_plan(HOSTS, out_of_service=[], ours=[], want=["h6"], max_unavailable=1)
    assert plan["start"] == ["h6"] and plan["wait"] == [] and set(plan["why"]) == set()


@pytest.mark.parametrize("budget", [1, 2, 3, 6])
def test_the_budget_is_never_exceeded_whatever_is_out_already(budget):
    for out_count in range(len(HOSTS) + 1):
        for down in itertools.combinations(HOSTS, out_count):
            for ours in ([], list(down[:1])):
                plan = reboot.reboot_plan(HOSTS, out_of_service=down, ours=ours, want=HOSTS, max_unavailable=budget)
                assert len(plan["start"]) + len(down) <= max(budget, len(down))
                assert not set(plan["start"]) & set(down)
                assert sorted(plan["start"] + plan["wait"] + plan["skip"] + plan["continue"]) == sorted(HOSTS)


def test_the_stamped_node_list_and_slurmctlds_clock_as_slurm_prints_them(real):
    """Captured on the test cluster (Slurm 22.05): ``SLURM_TIME_FORMAT=%s sinfo -N -h -o "%N|%T|%H|%P|%E"`` gives
    the time slurmctld stamped on each reason in seconds since the epoch ("Unknown" without a reason), the
    partition with the default's ``*``; sdiag's first line carries slurmctld's own time (sdiag.c prints the
    answer's req_time)."""
    nodes = reboot.parse_sinfo_stamped(real("slurm-sinfo-N-stamped-captured-here.txt").text)
    assert nodes["n1"]["reason_time"] == nodes["n3"]["reason_time"] == 1796549824
    assert nodes["n4"]["reason_time"] is None and nodes["n4"]["partitions"] == ["gpunodes"]
    assert nodes["n2"]["state"] == "DRAINING" and nodes["n2"]["ours"]
    assert reboot.parse_claim(nodes["n2"]["reason"]) == {"run": "2211-5", "ctl": "awx-7", "start": 1796549000,
                                                         "lease": 3600}
    assert reboot.parse_claim(nodes["n3"]["reason"]) is None and not nodes["n3"]["ours"]
    now = reboot.parse_sdiag_time(real("slurm-sdiag-captured-here.txt").text)
    assert now == 1796549824
    claim = reboot.parse_claim(nodes["n1"]["reason"])
    assert reboot.claim_live(claim, nodes["n1"]["reason_time"], now)
    assert not reboot.claim_live(claim, nodes["n1"]["reason_time"], now + 31)
    assert reboot.parse_sdiag_time("sdiag: error: Unable to contact slurm controller") is None


def test_a_claimed_reason_keeps_its_claim_whole_within_the_reason_limit():
    claim = reboot.claim_of("123456-999999", "controller.example.org", 1796549521.7, 3600)
    assert claim["ctl"] == "controller.example.org" and claim["start"] == 1796549521
    text = reboot.claimed_reason(reboot.drain_reason(["pci=disable_acs_redir=" + "0000:00:01.0;" * 30]), claim)
    assert len(text) <= reboot.MAX_REASON and reboot.parse_claim(text) == claim
    again = reboot.claimed_reason(text, claim)  # a reason renewed or re-set never grows a second claim
    assert again == text and again.count("{claim") == 1
    hostile = reboot.claim_of("a b{c}", "x\ny", 0, 1)
    assert reboot.parse_claim(reboot.claimed_reason("gpunode.tuning: x", hostile)) == hostile
