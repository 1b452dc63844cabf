"""plugin_utils/reboot_sequence.py: the records, the backends' commands and the budget's slot, with a fake Slurm.

The fake answers sinfo and scontrol as Slurm 22.05 prints them (the formats of tests/data/real/slurm-*); the
integration tests (test_reboot_slurm.py) run the same code against a real slurmctld.
"""

from __future__ import annotations

import os
import threading

import pytest

from ansible_collections.gpunode.tuning.plugins.plugin_utils import desired_state, reboot
from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot_sequence as seq

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
    backend = seq.SlurmBackend(fake, {h: h for h in HOSTS})
    backend.drain("n1", reboot.drain_reason(["amd_pstate=active"]))
    assert fake.calls[-1] == ["scontrol", "update", "NodeName=n1", "State=DRAIN",
                              "Reason=gpunode.tuning: reboot for amd_pstate=active"]
    assert backend.drained("n1") and backend.states(HOSTS) == {
        "out_of_service": ["n1"], "ours": ["n1"], "missing": [], "why": {
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
    backend = seq.SlurmBackend(fake, {h: h for h in HOSTS})
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

    with pytest.raises(seq.SequenceError, match="permission denied"):
        seq.SlurmBackend(run, {h: h for h in HOSTS}).undrain("n2")


def test_a_failing_slurm_command_names_itself():
    backend = seq.SlurmBackend(lambda argv, timeout: (1, "", "Unable to contact slurm controller"), {"n1": "n1"})
    with pytest.raises(seq.SequenceError, match="sinfo -N -h .* exited 1: Unable to contact slurm controller"):
        backend.states(["n1"])


def test_the_survey_skips_other_drains_and_adopts_ours(tmp_path):
    fake = FakeSlurm()
    fake.nodes["n2"].update(state="drained", reason="bad DIMM")
    fake.nodes["n3"].update(state="drained", reason="gpunode.tuning: reboot for iommu=pt")
    got = seq.survey(seq.SlurmBackend(fake, {h: h for h in HOSTS}), HOSTS, seq.Records(str(tmp_path), "r"))
    assert got == {"out_of_service": {"n2": "drained: bad DIMM"}, "ours": ["n3"], "backend": "slurm", "hosts": HOSTS}


def test_a_slot_counts_a_node_drained_by_someone_else_and_times_out_halting_the_run(tmp_path):
    fake, clock = FakeSlurm(), Clock()
    fake.nodes["n4"].update(state="drained", reason="operator")
    records = seq.Records(str(tmp_path), "r")
    got = seq.take_slot(seq.SlurmBackend(fake, {h: h for h in HOSTS}), records, "n1", HOSTS, settings(wait_timeout=2),
                        False, sleep=clock.sleep, clock=clock)
    assert not got["taken"] and got["timed_out"]
    assert "waited 2 s for a slot" in got["why"] and "(n4)" in got["why"]
    assert records.halted().startswith("n1: waited 2 s")
    assert records.read("n1")["state"] == "not_rebooted"
    assert not any(c[:2] == ["scontrol", "update"] for c in fake.calls)  # nothing drained


def test_a_slot_is_taken_within_the_budget_and_a_recorded_drain_counts_before_slurm_shows_it(tmp_path):
    fake = FakeSlurm()
    backend = seq.SlurmBackend(fake, {h: h for h in HOSTS})
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
    backend = seq.SlurmBackend(lambda a, t: _locked(lock, fake, a, t), {h: h for h in hosts})
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

    backend = seq.CommandBackend(run, {"drain": "lb drain", "check": ["drained?"], "undrain": ["lb", "add"]})
    assert backend.states(["a", "b"])["out_of_service"] == ["b"]
    backend.drain("a", "gpunode.tuning: reboot for x")
    assert calls[-1] == (["lb", "drain"], {"GPUNODE_HOST": "a", "GPUNODE_REASON": "gpunode.tuning: reboot for x"})
    bad = seq.CommandBackend(lambda argv, timeout, env: (2, "", "boom"), {"check": "drained?"})
    with pytest.raises(seq.SequenceError, match="check command for a .* exited 2: boom"):
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
    """The controller was killed with n2 rebooting: the next run (another run id) adopts it, and its slot
    goes on (``continue``) whatever the budget's other holders, while n1 still waits."""
    seq.Records(str(tmp_path), "killed-run").write("n2", "rebooting", reason="gpunode.tuning: reboot for x")
    records = seq.Records(str(tmp_path), "next-run")
    got = seq.survey(seq.NoneBackend(), HOSTS, records)
    assert got["ours"] == ["n2"] and got["out_of_service"] == {}
    fake = FakeSlurm()
    fake.nodes["n2"].update(state="drained", reason="gpunode.tuning: reboot for x")
    backend = seq.SlurmBackend(fake, {h: h for h in HOSTS})
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
    backend = seq.SlurmBackend(fake, {h: h for h in HOSTS})
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
    backend = seq.SlurmBackend(fake, {h: h for h in HOSTS})
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

    backend = seq.CommandBackend(run, {"check": ["lb-check"]})
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
    got = seq.take_slot(seq.NoneBackend(), records, "n2", HOSTS, settings(wait_timeout=1), False, sleep=clock.sleep,
                        clock=clock)
    assert not got["taken"] and "(n1)" in got["why"]  # its slot is held until the measure gate returns it
