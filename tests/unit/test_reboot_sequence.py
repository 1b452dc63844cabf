"""plugin_utils/reboot_sequence.py: the records, the backends' commands and the budget's slot, with a fake Slurm.

The fake answers sinfo and scontrol as Slurm 22.05 prints them (the formats of tests/data/real/slurm-*); the
integration tests (test_reboot_slurm.py) run the same code against a real slurmctld.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from ansible_collections.gpunode.tuning.plugins.plugin_utils import desired_state, reboot
from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot_sequence as seq
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain import ClaimLost, SequenceError
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.command import CommandBackend
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.none import NoneBackend
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.slurm import SlurmBackend

HOSTS = ["n1", "n2", "n3", "n4"]


class FakeSlurm:
    """A cluster of idle nodes: sinfo, scontrol update (DRAIN, RESUME) and scontrol show node -o."""

    def __init__(self, nodes=None):
        self.nodes = {n: {"state": "idle", "reason": "", "start": "2026-12-02T10:00:00"} for n in nodes or HOSTS}
        self.calls = []

    def __call__(self, argv, timeout):
        assert timeout > 0
        self.calls.append(list(argv))
        if argv[0] == "sinfo":
            names = argv[argv.index("-n") + 1].split(",") if "-n" in argv else list(self.nodes)
            return 0, "".join("%s|%s|%s\n" % (n, self.nodes[n]["state"], self.nodes[n]["reason"] or "none")
                              for n in names), ""
        if argv[0] == "squeue":  # squeue -h -w N -t RUNNING,COMPLETING -o %i
            return 0, "".join("%s\n" % j for j in self.nodes[argv[argv.index("-w") + 1]].get("jobs", ())), ""
        if argv[:3] == ["scontrol", "show", "node"]:
            n = argv[-1]
            node = self.nodes[n]
            state = {"drained": "IDLE+DRAIN", "draining": "MIXED+DRAIN", "idle": "IDLE"}[node["state"]]
            return 0, "NodeName=%s Arch=x86_64 State=%s SlurmdStartTime=%s Reason=%s [root@2026-12-02T10:00:00]\n" % (
                n, state, node["start"], node["reason"]), ""
        if argv[:2] == ["scontrol", "update"]:
            n = argv[2].split("=", 1)[1]
            fields = dict(a.split("=", 1) for a in argv[3:])
            if fields.get("State") == "DRAIN":
                self.nodes[n].update(state="drained", reason=fields.get("Reason", ""))
            elif fields.get("State") == "RESUME":
                if self.nodes[n]["state"] not in ("drained", "draining", "down"):
                    # Slurm 22.05 (tests/integration/test_reboot_slurm.py shows it on the real daemons)
                    return 1, "", "slurm_update error: Invalid node state specified\n"
                self.nodes[n].update(state="idle", reason="")
            return 0, "", ""
        return 1, "", "unexpected %s" % argv


def settings(**more):
    got = {"max_unavailable": 1, "wait_timeout": 5, "drain_timeout": 5, "reboot_timeout": 5, "poll": 0.01}
    got.update(more)
    return got


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_records_lock_halt_and_in_flight_are_per_run(tmp_path):
    mine, older = seq.Records(str(tmp_path), "run-2"), seq.Records(str(tmp_path), "run-1")
    older.write("n1", "failed", reason="x")
    mine.write("n2", "draining")
    mine.write("n3", "done")
    assert seq.in_flight(mine.all(HOSTS)) == ["n1", "n2"]
    assert seq.in_flight(mine.all(HOSTS), "run-2") == ["n2"]
    older.halt("n1", "did not come back")
    assert mine.halted() is None and older.halted() == "n1: did not come back"
    mine.halt("n2", "first")
    mine.halt("n3", "second")
    assert mine.halted() == "n2: first"  # the first reason stays


def test_slurm_backend_drains_with_our_reason_and_resumes_only_after_slurmd_registered_again():
    fake = FakeSlurm()
    backend = SlurmBackend(fake, {h: h for h in HOSTS})
    backend.drain("n1", reboot.drain_reason(["amd_pstate=active"]))
    assert fake.calls[-1] == ["scontrol", "update", "NodeName=n1", "State=DRAIN",
                              "Reason=gpunode.tuning: reboot for amd_pstate=active"]
    assert backend.drained("n1") and backend.states(HOSTS) == {
        "out_of_service": ["n1"], "ours": ["n1"], "missing": [], "claimed": {}, "transient": [], "why": {
            "n1": "drained: gpunode.tuning: reboot for amd_pstate=active"}}
    mark = backend.boot_mark("n1")
    assert mark == "2026-12-02T10:00:00"
    assert not backend.ready("n1", mark)  # slurmd has not registered since the reboot
    fake.nodes["n1"]["start"] = "2026-12-02T10:05:00"
    assert backend.ready("n1", mark)
    backend.undrain("n1")
    assert backend.in_service("n1") and fake.calls[-2] == ["scontrol", "update", "NodeName=n1", "State=RESUME"]


def test_resuming_a_node_someone_else_resumed_is_no_failure_but_a_node_still_out_is():
    fake = FakeSlurm()
    backend = SlurmBackend(fake, {h: h for h in HOSTS})
    backend.drain("n1", "gpunode.tuning: reboot")
    fake.nodes["n1"].update(state="idle", reason="")  # an operator resumed it
    backend.undrain("n1")  # Slurm refuses (not drained), and the node is in service: done
    assert fake.calls[-2] == ["scontrol", "update", "NodeName=n1", "State=RESUME"]
    assert fake.calls[-1][0] == "sinfo" and backend.in_service("n1")
    # A refusal for another reason while the node stays out of service is the sequence's failure.
    refusing = FakeSlurm()
    refusing.nodes["n2"].update(state="drained", reason="gpunode.tuning: reboot")

    def run(argv, timeout):
        if "State=RESUME" in argv:
            return 1, "", "slurm_update error: Access/permission denied"
        return refusing(argv, timeout)

    with pytest.raises(SequenceError, match="permission denied"):
        SlurmBackend(run, {h: h for h in HOSTS}).undrain("n2")


def test_a_failing_slurm_command_names_itself():
    backend = SlurmBackend(lambda argv, timeout: (1, "", "Unable to contact slurm controller"), {"n1": "n1"})
    with pytest.raises(SequenceError, match="sinfo -N -h .* exited 1: Unable to contact slurm controller"):
        backend.states(["n1"])


def test_the_survey_skips_other_drains_and_adopts_ours(tmp_path):
    fake = FakeSlurm()
    fake.nodes["n2"].update(state="drained", reason="bad DIMM")
    fake.nodes["n3"].update(state="drained", reason="gpunode.tuning: reboot for iommu=pt")
    got = seq.survey(SlurmBackend(fake, {h: h for h in HOSTS}), HOSTS, seq.Records(str(tmp_path), "r"))
    assert got == {"out_of_service": {"n2": "drained: bad DIMM"}, "ours": ["n3"], "claimed": {}, "backend": "slurm",
                   "hosts": HOSTS}


def test_a_slot_counts_a_node_drained_by_someone_else_and_times_out_halting_the_run(tmp_path):
    fake, clock = FakeSlurm(), Clock()
    fake.nodes["n4"].update(state="drained", reason="operator")
    records = seq.Records(str(tmp_path), "r")
    got = seq.take_slot(SlurmBackend(fake, {h: h for h in HOSTS}), records, "n1", HOSTS, settings(wait_timeout=2),
                        False, sleep=clock.sleep, clock=clock)
    assert not got["taken"] and got["timed_out"]
    assert "waited 2 s for a slot" in got["why"] and "(n4)" in got["why"]
    assert records.halted().startswith("n1: waited 2 s")
    assert records.read("n1")["state"] == "not_rebooted"
    assert not any(c[:2] == ["scontrol", "update"] for c in fake.calls)  # nothing drained


def test_a_slot_is_taken_within_the_budget_and_a_recorded_drain_counts_before_slurm_shows_it(tmp_path):
    fake = FakeSlurm()
    backend = SlurmBackend(fake, {h: h for h in HOSTS})
    records = seq.Records(str(tmp_path), "r")
    assert seq.take_slot(backend, records, "n1", HOSTS, settings(max_unavailable=2), False)["taken"]
    assert seq.take_slot(backend, records, "n2", HOSTS, settings(max_unavailable=2), False)["taken"]
    clock = Clock()
    third = seq.take_slot(backend, records, "n3", HOSTS, settings(max_unavailable=2, wait_timeout=1), False,
                          sleep=clock.sleep, clock=clock)
    assert not third["taken"] and "(n1, n2)" in third["why"]  # Slurm shows no drain yet: the records count


def test_hosts_waiting_at_once_never_hold_more_slots_than_the_budget(tmp_path):
    fake = FakeSlurm(["n%d" % i for i in range(1, 9)])
    hosts = list(fake.nodes)
    lock = threading.Lock()
    backend = SlurmBackend(lambda a, t: _locked(lock, fake, a, t), {h: h for h in hosts})
    records = seq.Records(str(tmp_path), "r")
    taken = []

    def one(host):
        if seq.take_slot(backend, records, host, hosts, settings(max_unavailable=3, wait_timeout=0.3), False)["taken"]:
            taken.append(host)

    threads = [threading.Thread(target=one, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 3, taken


def _locked(lock, fake, argv, timeout):
    with lock:
        return fake(argv, timeout)


def test_the_command_backend_runs_the_users_commands_with_the_host_in_the_environment():
    calls = []

    def run(argv, timeout, env):
        calls.append((argv, env))
        return (0 if argv[0] == "drained?" and env["GPUNODE_HOST"] == "b" else 1 if argv[0] == "drained?" else 0,
                "", "")

    backend = CommandBackend(run, {"drain": "lb drain", "check": ["drained?"], "undrain": ["lb", "add"]})
    assert backend.states(["a", "b"])["out_of_service"] == ["b"]
    backend.drain("a", "gpunode.tuning: reboot for x")
    assert calls[-1] == (["lb", "drain"], {"GPUNODE_HOST": "a", "GPUNODE_REASON": "gpunode.tuning: reboot for x"})
    bad = CommandBackend(lambda argv, timeout, env: (2, "", "boom"), {"check": "drained?"})
    with pytest.raises(SequenceError, match="check command for a .* exited 2: boom"):
        bad.drained("a")


def test_wait_until_is_bounded():
    clock = Clock()
    assert not seq.wait_until(lambda: False, 3, 1, sleep=clock.sleep, clock=clock)
    assert clock.now == pytest.approx(3)


@pytest.mark.parametrize("values,message", [
    ({"gpunode_tuning_reboot_ok": True}, "gpunode_tuning_drain must say how hosts leave service"),
    ({"gpunode_tuning_reboot_ok": True, "gpunode_tuning_drain": "command"},
     "gpunode_tuning_drain is command, so gpunode_tuning_drain_command must be set"),
    ({"gpunode_tuning_drain_command": ["lb", ""]}, "gpunode_tuning_drain_command must be a command string"),
    ({"gpunode_tuning_reboot_poll_interval": 0}, "gpunode_tuning_reboot_poll_interval must be a number"),
    ({"gpunode_tuning_drain_slurm_node": "-n1"}, "gpunode_tuning_drain_slurm_node must be a Slurm node name"),
    ({"gpunode_tuning_reboot_max_unavailable": "0%"}, "gpunode_tuning_reboot_max_unavailable must be"),
])
def test_the_precheck_refuses_bad_reboot_settings_naming_what_is_allowed(values, message):
    problems = reboot.role_problems(values)
    assert any(message in p for p in problems), problems
    assert not any(message in p for p in desired_state.combination_problems(values, "rollback"))


def test_the_precheck_accepts_a_complete_reboot_setting():
    assert reboot.role_problems({"gpunode_tuning_reboot_ok": True, "gpunode_tuning_drain": "slurm",
                                 "gpunode_tuning_reboot_max_unavailable": "10%",
                                 "gpunode_tuning_drain_slurm_node": "gpu-01"}) == []


def test_an_interrupted_run_is_adopted_from_its_records(tmp_path):
    """The controller was killed with n2 rebooting: the next run (another run id) adopts it once the killed run's
    record is older than the lease, and its slot goes on (``continue``) whatever the budget's other holders,
    while n1 still waits. Within the lease the record is a live run's claim: waited for, not adopted."""
    killed = seq.Records(str(tmp_path), "killed-run")
    killed.write("n2", "rebooting", reason="gpunode.tuning: reboot for x")
    records = seq.Records(str(tmp_path), "next-run")
    got = seq.survey(NoneBackend(), HOSTS, records, {"claim_lease": 60})
    assert got["ours"] == [] and "claimed by the live run killed-run" in got["claimed"]["n2"]
    killed.write("n2", "rebooting", updated=time.time() - 61)
    got = seq.survey(NoneBackend(), HOSTS, records, {"claim_lease": 60})
    assert got["ours"] == ["n2"] and got["out_of_service"] == {} and got["claimed"] == {}
    fake = FakeSlurm()
    fake.nodes["n2"].update(state="drained", reason="gpunode.tuning: reboot for x")
    backend = SlurmBackend(fake, {h: h for h in HOSTS})
    assert seq.survey(backend, HOSTS, records)["ours"] == ["n2"]
    assert seq.take_slot(backend, records, "n2", HOSTS, settings(), True)["taken"]
    clock = Clock()
    assert not seq.take_slot(backend, records, "n1", HOSTS, settings(wait_timeout=1), False, sleep=clock.sleep,
                             clock=clock)["taken"]


def test_the_precheck_accepts_the_kubernetes_drain():
    problems = reboot.role_problems({"gpunode_tuning_reboot_ok": True, "gpunode_tuning_drain": "kubernetes"})
    assert not [p for p in problems if "kubernetes" in p], problems


def test_a_sequence_whose_run_ended_stops_before_its_next_step(tmp_path, monkeypatch):
    """An orphaned worker (its ansible-playbook killed: Ansible's workers run in sessions of their own) stops at its
    next wait, before it polls, drains or resumes anything; the host is left as it is for the next run."""
    fake = FakeSlurm()
    backend = SlurmBackend(fake, {h: h for h in HOSTS})
    monkeypatch.setitem(seq._RUN, "parent", None)
    seq.guard_run(os.getppid())
    assert seq.wait_until(lambda: True, 1, 0.1)  # the run is alive: no change
    seq.guard_run(os.getppid() + 100000)  # as after a re-parenting: the run's pid is not our parent any more
    checked = []
    with pytest.raises(seq.RunEnded, match="ended: stopped here"):
        seq.wait_until(lambda: checked.append(1) or True, 1, 0.1)
    assert checked == []
    with pytest.raises(seq.RunEnded):
        seq.take_slot(backend, seq.Records(str(tmp_path), "r"), "n1", HOSTS, settings(), False)
    assert fake.calls == []
    seq.guard_run(None)


def test_a_host_of_the_run_that_is_unreachable_holds_a_slot_and_the_wait_says_so(tmp_path):
    """Budget 1 and n4 unreachable (Ansible could not reach it): n1 gets no slot while it stays unreachable,
    and its record and the timeout name it; once n4 answers again, n1 takes the slot."""
    fake, clock = FakeSlurm(), Clock()
    backend = SlurmBackend(fake, {h: h for h in HOSTS})
    records = seq.Records(str(tmp_path), "r")
    gone = {"n4": "unreachable: ssh: connect to host 10.0.0.4 port 22: No route to host", "elsewhere": "x"}
    got = seq.take_slot(backend, records, "n1", HOSTS, settings(wait_timeout=2), False, sleep=clock.sleep, clock=clock,
                        unreachable=lambda: gone)
    assert not got["taken"] and got["timed_out"]
    assert "(n4)" in got["why"] and "counted out of service as unreachable: n4 (unreachable: ssh: connect" in got["why"]
    assert "elsewhere" not in got["why"]  # not a host of the run
    assert records.read("n1")["state"] == "not_rebooted"
    assert not any(c[:2] == ["scontrol", "update"] for c in fake.calls)

    records = seq.Records(str(tmp_path), "r2")
    polls = []

    def answers_after_two_polls():
        polls.append(1)
        return gone if len(polls) <= 2 else {}

    clock = Clock()
    got = seq.take_slot(backend, records, "n1", HOSTS, settings(wait_timeout=60), False, sleep=clock.sleep,
                        clock=clock, unreachable=answers_after_two_polls)
    assert got["taken"] and len(polls) == 3 and "unreachable: n4" in got["why"]
    assert records.read("n1")["counted_out"] == ["n1"] and records.read("n1")["unreachable"] == {}


def test_a_host_the_drain_check_cannot_reach_counts_as_out_of_service(tmp_path):
    def run(argv, timeout, env):
        return {"a": (1, "", ""), "b": (2, "", "ssh: b: Connection timed out"), "c": (1, "", "")}[env["GPUNODE_HOST"]]

    backend = CommandBackend(run, {"check": ["lb-check"]})
    got = backend.states(["a", "b", "c"])
    assert got["out_of_service"] == ["b"] and got["unreachable"] == ["b"]
    assert got["why"]["b"].startswith("unreachable: check command for b (lb-check) exited 2: ssh: b: Connection")
    clock = Clock()
    slot = seq.take_slot(backend, seq.Records(str(tmp_path), "r"), "a", ["a", "b", "c"], settings(wait_timeout=1),
                         False, sleep=clock.sleep, clock=clock)
    assert not slot["taken"] and "counted out of service as unreachable: b (unreachable: check command" in slot["why"]


def test_a_gated_host_held_for_the_measure_gate_is_in_flight(tmp_path):
    records = seq.Records(str(tmp_path), "r")
    records.write("n1", "gated", reason="gpunode.tuning: reboot for x")
    assert seq.in_flight(records.all(HOSTS), "r") == ["n1"]
    clock = Clock()
    got = seq.take_slot(NoneBackend(), records, "n2", HOSTS, settings(wait_timeout=1), False, sleep=clock.sleep,
                        clock=clock)
    assert not got["taken"] and "(n1)" in got["why"]  # its slot is held until the measure gate returns it


# --- issue 42: the claim, "drained" proven by the jobs, the fleet's budget, every way out said -----------------

CLAIM = reboot.claim_of("4242-77", "ctl-a", 1796500000, 60)
OTHER = reboot.claim_of("5151-88", "ctl-b", 1796500003, 60)


class ClaimSlurm(FakeSlurm):
    """FakeSlurm with what the claim reads: ``env SLURM_TIME_FORMAT=%s sinfo -o %N|%T|%H|%P|%E`` (the reason's
    time as slurmctld stamped it, the partition), ``sdiag`` (slurmctld's now) and a Reason-only update."""

    def __init__(self, nodes=None, partition="gpu"):
        super().__init__(nodes)
        self.now = 1796550000
        for node in self.nodes.values():
            node.update(stamp=None, partition=partition, jobs=[])
        self.broken = None

    def __call__(self, argv, timeout):
        if argv[0] == "env":
            argv = [a for a in argv[1:] if "=" not in a or a.startswith("-")]
        if self.broken and argv[0] in ("sinfo", "scontrol", "squeue", "sdiag"):
            self.calls.append(list(argv))
            return 1, "", self.broken
        if argv[0] == "sdiag":
            return 0, "*******\nsdiag output at Sun Dec 06 10:00:00 2026 (%d)\nData since ...\n" % self.now, ""
        if argv[0] == "sinfo" and argv[argv.index("-o") + 1] == "%N|%T|%H|%P|%E":
            self.calls.append(list(argv))
            names = argv[argv.index("-n") + 1].split(",") if "-n" in argv else list(self.nodes)
            return 0, "".join("%s|%s|%s|%s*|%s\n" % (n, self.nodes[n]["state"], self.nodes[n]["stamp"] or "Unknown",
                                                     self.nodes[n]["partition"], self.nodes[n]["reason"] or "none")
                              for n in names), ""
        if argv[:2] == ["scontrol", "update"]:
            fields = dict(a.split("=", 1) for a in argv[3:])
            node = self.nodes[argv[2].split("=", 1)[1]]
            if "Reason" in fields and node["state"] in ("drained", "draining", "down") or fields.get("State"):
                node["stamp"] = self.now
            if "State" not in fields:
                self.calls.append(list(argv))
                if node["state"] in ("drained", "draining", "down"):
                    node["reason"] = fields["Reason"]
                return 0, "", ""
        return super().__call__(argv, timeout)


def test_a_drain_carries_the_runs_claim_and_another_live_runs_claim_is_waited_for_never_adopted(tmp_path):
    fake = ClaimSlurm()
    mine = SlurmBackend(fake, {h: h for h in HOSTS}, claim=CLAIM)
    theirs = SlurmBackend(fake, {h: h for h in HOSTS}, claim=OTHER)
    theirs.drain("n2", "gpunode.tuning: reboot for amd_pstate=active")
    reason = fake.nodes["n2"]["reason"]
    assert reason == "gpunode.tuning: reboot for amd_pstate=active {claim run=5151-88 ctl=ctl-b start=1796500003 " \
                     "lease=60}"
    assert reboot.parse_claim(reason) == OTHER and len(reason) <= reboot.MAX_REASON
    fake.nodes["n3"].update(state="drained", reason="bad DIMM")
    records = seq.Records(str(tmp_path), CLAIM["run"])
    got = seq.survey(mine, HOSTS, records, {"claim_lease": 60})
    assert got["claimed"] == {"n2": "claimed by the live run 5151-88 on ctl-b (renewed 0 s ago, lease 60 s)"}
    assert got["ours"] == [] and got["out_of_service"] == {"n3": "drained: bad DIMM"}
    # within the lease by slurmctld's clock (sdiag), however long ago the other controller started
    fake.now += 60
    assert "n2" in mine.states(HOSTS)["claimed"]
    # the live run renews its claim without draining again: slurmctld stamps the reason anew
    theirs.renew("n2", force=True)
    assert fake.calls[-1] == ["scontrol", "update", "NodeName=n2", "Reason=" + reason]
    fake.now += 60
    assert "n2" in mine.states(HOSTS)["claimed"]
    # not renewed for longer than its lease: an interrupted run's, adopted
    fake.now += 61
    polled = mine.states(HOSTS)
    assert polled["claimed"] == {} and polled["ours"] == ["n2"]
    assert seq.survey(mine, HOSTS, records, {"claim_lease": 60})["ours"] == ["n2"]


def test_the_slot_waits_for_a_node_another_live_run_holds_and_counts_it(tmp_path):
    fake = ClaimSlurm()
    SlurmBackend(fake, {h: h for h in HOSTS}, claim=OTHER).drain("n1", "gpunode.tuning: reboot for x")
    mine = SlurmBackend(fake, {h: h for h in HOSTS}, claim=CLAIM)
    records, clock = seq.Records(str(tmp_path), CLAIM["run"]), Clock()
    got = seq.take_slot(mine, records, "n1", HOSTS, settings(wait_timeout=1, max_unavailable=2), False,
                        sleep=clock.sleep, clock=clock)
    assert not got["taken"] and not got.get("skip") and "claimed by the live run 5151-88 on ctl-b" in got["why"]
    assert ["scontrol", "update", "NodeName=n1", "State=DRAIN"] not in [c[:4] for c in fake.calls[1:]]
    # n2's slot: n1 (the other run's) holds one of the two
    clock2 = Clock()
    assert seq.take_slot(mine, seq.Records(str(tmp_path / "2"), CLAIM["run"]), "n2", HOSTS,
                         settings(max_unavailable=2), False, sleep=clock2.sleep, clock=clock2)["taken"]
    assert not seq.take_slot(mine, seq.Records(str(tmp_path / "3"), CLAIM["run"]), "n2", HOSTS,
                             settings(wait_timeout=1), False, sleep=clock2.sleep, clock=clock2)["taken"]


def test_drained_means_no_running_or_completing_job_and_an_operators_resume_ends_the_claim():
    fake = ClaimSlurm()
    backend = SlurmBackend(fake, {h: h for h in HOSTS}, claim=CLAIM)
    backend.drain("n1", "gpunode.tuning: reboot for x")
    # slurmctld just restarted: sinfo says drained, squeue still lists the job slurmd has not re-registered
    fake.nodes["n1"]["jobs"] = ["17"]
    assert not backend.drained("n1")
    assert backend.holds("n1") == "Slurm still lists job(s) 17 running or completing on n1"
    assert ["squeue", "-h", "-w", "n1", "-t", "RUNNING,COMPLETING", "-o", "%i"] in fake.calls
    fake.nodes["n1"]["jobs"] = []
    assert backend.drained("n1") and backend.holds("n1") is None
    fake.nodes["n1"].update(state="idle", reason="")  # an operator resumed it
    drains = len([c for c in fake.calls if "State=DRAIN" in c])
    with pytest.raises(ClaimLost, match="someone resumed n1 .*our claim on it ended") as lost:
        backend.drained("n1")
    assert not lost.value.by_run
    with pytest.raises(ClaimLost):
        backend.holds("n1")
    assert len([c for c in fake.calls if "State=DRAIN" in c]) == drains  # never drained again
    # another run's claim on it now (two runs drained it at once): by_run, waited for
    fake.nodes["n1"].update(state="drained", reason=reboot.claimed_reason("gpunode.tuning: reboot for x", OTHER))
    with pytest.raises(ClaimLost) as lost:
        backend.drained("n1")
    assert lost.value.by_run
    with pytest.raises(ClaimLost, match="not resumed by this run"):
        backend.undrain("n1")
    assert not any("State=RESUME" in c for c in fake.calls)


def test_a_transient_unknown_state_is_asked_again_not_judged_on_one_reading(tmp_path):
    fake = ClaimSlurm()
    fake.nodes["n2"].update(state="unknown")  # right after a controller restart
    backend = SlurmBackend(fake, {h: h for h in HOSTS}, claim=CLAIM)
    clock = Clock()

    def sleep(seconds):
        clock.sleep(seconds)
        fake.nodes["n2"].update(state="idle")  # slurmd registered again

    got = seq.survey(backend, HOSTS, seq.Records(str(tmp_path), "r"), {"wait_timeout": 30, "poll": 1},
                     sleep=sleep, clock=clock)
    assert got["out_of_service"] == {} and clock.now == 1
    # the same within the slot's wait: asked again, not skipped as out of service
    fake.nodes["n1"].update(state="unknown")
    clock2 = Clock()

    def sleep2(seconds):
        clock2.sleep(seconds)
        fake.nodes["n1"].update(state="idle")

    got = seq.take_slot(backend, seq.Records(str(tmp_path / "slot"), "r"), "n1", HOSTS, settings(wait_timeout=30),
                        False, sleep=sleep2, clock=clock2)
    assert got["taken"] and not got.get("skip"), got
    # one that stays unknown for the whole wait is out of service, as before
    fake.nodes["n3"].update(state="unknown")
    got = seq.survey(backend, HOSTS, seq.Records(str(tmp_path), "r"), {"wait_timeout": 3, "poll": 1},
                     sleep=clock.sleep, clock=clock)
    assert got["out_of_service"] == {"n3": "unknown"}


def test_the_fleet_budget_counts_every_node_of_the_partitions_whoever_took_it_out(tmp_path):
    nodes = ["n1", "n2", "n3", "n4", "x1", "x2"]
    fake = ClaimSlurm(nodes)
    fake.nodes["x1"]["partition"] = fake.nodes["x2"]["partition"] = "other"
    fake.nodes["n4"].update(state="drained", reason="bad DIMM")  # not a host of the run, in its partition
    fake.nodes["x1"].update(state="drained", reason="another partition")
    backend = SlurmBackend(fake, {h: h for h in ("n1", "n2")}, claim=CLAIM)
    polled = backend.states(["n1", "n2"])
    assert polled["fleet"] == {"n4": "drained: bad DIMM"} and polled["fleet_size"] == 4
    fleet = settings(budget_scope="fleet", wait_timeout=1)
    clock = Clock()
    got = seq.take_slot(backend, seq.Records(str(tmp_path), CLAIM["run"]), "n1", ["n1", "n2"], fleet, False,
                        sleep=clock.sleep, clock=clock)
    assert not got["taken"] and "the fleet's slots are also held by 1 node(s) outside the run: n4 (drained: " \
                                "bad DIMM)" in got["why"], got
    run_scope = settings(budget_scope="run")
    assert seq.take_slot(backend, seq.Records(str(tmp_path / "r"), CLAIM["run"]), "n1", ["n1", "n2"], run_scope,
                         False, sleep=clock.sleep, clock=clock)["taken"]
    # a share is of the fleet's nodes: 50% of 4 is 2, n4 holds one
    share = settings(budget_scope="fleet", max_unavailable=1, max_unavailable_given="50%")
    assert seq.fleet_budget(polled, share) == (2, {"n4": "drained: bad DIMM"})
    # the partitions named instead
    named = SlurmBackend(fake, {h: h for h in ("n1", "n2")}, claim=CLAIM, fleet_partitions=["other"])
    assert named.states(["n1", "n2"])["fleet"] == {"x1": "drained: another partition"}


def test_the_command_backends_fleet_is_what_its_fleet_command_lists():
    def run(argv, timeout, env):
        if argv == ["fleet-out"]:
            return 0, "gpu-7\tmaintenance\ngpu-8\n\n", ""
        return 1, "", ""

    backend = CommandBackend(run, {"check": ["check"], "fleet": "fleet-out"})
    got = backend.states(["a", "gpu-8"])
    assert got["fleet"] == {"gpu-7": "maintenance"}
    assert CommandBackend(run, {"check": ["check"]}).states(["a"]).get("fleet") is None


@pytest.mark.parametrize("name,value,allowed", [
    ("gpunode_tuning_reboot_budget_scope", "fleet", True), ("gpunode_tuning_reboot_budget_scope", "run", True),
    ("gpunode_tuning_reboot_budget_scope", "cluster", False),
    ("gpunode_tuning_reboot_claim_lease", 600, True), ("gpunode_tuning_reboot_claim_lease", 0, False),
    ("gpunode_tuning_drain_slurm_fleet_partitions", ["gpu", "gpu-a100"], True),
    ("gpunode_tuning_drain_slurm_fleet_partitions", "gpu", False),
    ("gpunode_tuning_drain_slurm_fleet_partitions", ["-p"], False),
    ("gpunode_tuning_drain_kubernetes_fleet_selector", "gpunode.tuning/fleet=a100", True),
    ("gpunode_tuning_drain_kubernetes_fleet_selector", "", False),
    ("gpunode_tuning_drain_fleet_command", ["lb", "list-out"], True),
    ("gpunode_tuning_drain_fleet_command", [], False),
])
def test_the_precheck_names_what_the_new_reboot_variables_allow(name, value, allowed):
    problems = reboot.role_problems({name: value})
    assert (problems == []) is allowed, problems
    if not allowed:
        assert problems[0].startswith(name + " must be"), problems


def sequence_action(tmp_path, fake, host="n1", **more):
    """The tuning_reboot action's sequence for ``host`` with the Slurm backend on ``fake`` (its run() skipped: the
    attributes it sets are set here), the reboot itself and the gate replaced by what the test says."""
    from ansible_collections.gpunode.tuning.plugins.action.tuning_reboot import ActionModule  # noqa: PLC0415

    action = object.__new__(ActionModule)
    action._host, action._hosts = host, list(HOSTS)
    action._settings = settings(**dict({"claim_lease": 60, "drain_timeout": 0.3}, **more))
    action._records = seq.Records(str(tmp_path), CLAIM["run"])
    action._backend = SlurmBackend(fake, {h: h for h in HOSTS}, claim=CLAIM)
    action._touched, action._hold, action._vars, action._drain_started = 0.0, False, {}, None
    action.rebooted = []

    def reboot_host(_task_vars):
        action.rebooted.append(host)
        return True, "new-boot"

    action._reboot_host = reboot_host
    action._gate = lambda _task_vars: (True, [], {"gate": {"ok": True}, "status": "pass"})
    return action


def test_a_scheduler_error_after_the_drain_leaves_the_host_in_stays_drained_with_its_reason(tmp_path):
    """sinfo answering "Unable to contact slurm controller" for the whole drain wait: asked again within it, then
    the host stays drained (its first reason: the controller cannot be told), listed with stays_drained."""
    fake = ClaimSlurm()
    fake.nodes["n1"]["jobs"] = ["9"]
    action = sequence_action(tmp_path, fake)
    action._backend.drain("n1", "gpunode.tuning: reboot for x")
    fake.broken = "slurm_load_partitions: Unable to contact slurm controller (connect failure)"
    got = action._drain_and_reboot({"changed": True}, "gpunode.tuning: reboot for x", {})
    assert got["failed"] and got["stays_drained"] and got["stage"] == "drain", got
    assert "the scheduler did not answer: " in got["msg"] and "Unable to contact slurm controller" in got["msg"]
    assert "its drain reason could not be updated" in got["msg"] and action.rebooted == []
    assert len([c for c in fake.calls if c[0] == "sinfo"]) > 2  # asked again, not judged on one error
    assert action._records.read("n1")["state"] == "failed" and action._records.halted()
    from ansible_collections.gpunode.tuning.plugins.plugin_utils import rollout  # noqa: PLC0415

    lines = rollout.reboot_lines([{"host": "n1", "reboot": rollout.reboot_record(got)}])
    assert lines[0].startswith("n1: stays drained (drain), out of service: "), lines


def test_an_operators_resume_while_we_drain_ends_our_claim_said_and_never_drained_again(tmp_path):
    fake = ClaimSlurm()
    fake.nodes["n1"]["jobs"] = ["9"]
    action = sequence_action(tmp_path, fake, drain_timeout=5)
    action._backend.drain("n1", "gpunode.tuning: reboot for x")
    polls = {"n": 0}
    real = fake.__call__

    def operator(argv, timeout):
        polls["n"] += 1
        if polls["n"] == 4:
            fake.nodes["n1"].update(state="idle", reason="")  # scontrol update NodeName=n1 State=RESUME
        return real(argv, timeout)

    action._backend.run = operator
    got = action._drain_and_reboot({"changed": True}, "gpunode.tuning: reboot for x", {})
    assert got["failed"] and got["released"] and not got.get("stays_drained"), got
    assert "someone resumed n1" in got["msg"] and "not drained again" in got["msg"]
    assert action.rebooted == [] and fake.nodes["n1"]["state"] == "idle" and fake.nodes["n1"]["reason"] == ""
    assert len([c for c in fake.calls if "State=DRAIN" in c]) == 1
    assert action._records.read("n1")["state"] == "released" and not action._records.halted()
    from ansible_collections.gpunode.tuning.plugins.plugin_utils import rollout  # noqa: PLC0415

    lines = rollout.reboot_lines([{"host": "n1", "reboot": rollout.reboot_record(got)}])
    assert lines == ["n1: our claim ended, left as it is: " + got["msg"][len("n1: "):]], lines


def test_right_before_the_reboot_the_node_is_read_again(tmp_path):
    """Drained and idle, then (between the drain wait and the reboot) another run's claim replaced ours: the node
    is not rebooted; the action hands it back to its slot's wait (ClaimLost by_run)."""
    fake = ClaimSlurm()
    action = sequence_action(tmp_path, fake)
    action._backend.drain("n1", "gpunode.tuning: reboot for x")
    real = action._backend.boot_mark

    def boot_mark(host):
        fake.nodes["n1"]["reason"] = reboot.claimed_reason("gpunode.tuning: reboot for x", OTHER)
        return real(host)

    action._backend.boot_mark = boot_mark
    with pytest.raises(ClaimLost) as lost:
        action._drain_and_reboot({"changed": True}, "gpunode.tuning: reboot for x", {})
    assert lost.value.by_run and action.rebooted == []


def test_the_command_backend_reads_the_host_again_right_before_the_reboot():
    answers = {"check": 0}

    def run(argv, timeout, env):
        return answers["check"], "", ""

    backend = CommandBackend(run, {"check": ["lb-check"]})
    assert backend.holds("a") is None
    answers["check"] = 1  # someone put it back into the load balancer
    with pytest.raises(ClaimLost, match="back in service: our claim on it ended"):
        backend.holds("a")


def test_a_slurm_command_that_did_not_reach_the_controller_is_asked_again_within_retry_for():
    """Issue 42 under load: slurmctld restarting is asked again (every scheduler read and write of the sequence goes
    through _call), each retry noted; any other error, or the controller silent past retry_for, still fails clearly."""
    fake = FakeSlurm()
    answers = iter([(1, "", "slurm_load_partitions: Unable to contact slurm controller (connect failure)"),
                    (124, "", "")])
    pauses = []

    def run(argv, timeout):
        return next(answers, None) or fake(argv, timeout)

    backend = SlurmBackend(run, {h: h for h in HOSTS}, retry_for=30, pause=pauses.append)
    assert backend.states(HOSTS)["out_of_service"] == [] and len(backend.retried) == 2 and len(pauses) == 2
    silent = SlurmBackend(lambda argv, timeout: (1, "", "Unable to contact slurm controller"), {"n1": "n1"},
                          retry_for=0.2, pause=lambda s: time.sleep(0.05))
    with pytest.raises(SequenceError, match="Unable to contact slurm controller .the controller did not answer for 0"):
        silent.states(["n1"])
    assert silent.retried
    refused = SlurmBackend(lambda argv, timeout: (1, "", "slurm_update error: Access/permission denied"),
                           {"n1": "n1"}, retry_for=30, pause=pauses.append)
    with pytest.raises(SequenceError, match="permission denied$"):
        refused.drain("n1", "gpunode.tuning: reboot")
    assert refused.retried == []
