"""plugin_utils/drain/command.py: the command backend's claim (issue 42), with a fake scheduler behind the user's
commands. The fake keeps its own clock (``now``) and stamps a drain or a renewal with it, as a router or a
scheduler of the user's would; the check prints ``claim: {claim ...} age=<s>`` from that stamp."""

from __future__ import annotations

import pytest
from support.clock import Clock

from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot
from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot_sequence as seq
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.command import CommandBackend

OURS = reboot.claim_of("run-a", "ctl-a", 1_000_000, 600)
OTHER = reboot.claim_of("run-b", "ctl-b", 1_000_000, 600)
COMMANDS = {"drain": "lb-drain", "check": ["lb-check"], "undrain": "lb-add"}


class Scheduler:
    """The user's side: ``hosts[h] = {"claim": mark or None, "stamped": its clock}`` for a drained host. With
    ``claims=False`` its check prints no claim line (a command written before claims)."""

    def __init__(self, claims: bool = True):
        self.now, self.hosts, self.calls, self.claims = 5_000_000, {}, [], claims

    def __call__(self, argv, timeout, env):
        self.calls.append((argv[0], dict(env)))
        host = env["GPUNODE_HOST"]
        if argv[0] == "lb-drain":
            if env.get("GPUNODE_TUNING_RENEW") == "1":  # renew the stamp of our own claim, never drain again
                if (self.hosts.get(host) or {}).get("claim") == env["GPUNODE_TUNING_CLAIM"]:
                    self.hosts[host]["stamped"] = self.now
                return 0, "", ""
            self.hosts[host] = {"claim": env.get("GPUNODE_TUNING_CLAIM"), "stamped": self.now}
            return 0, "", ""
        if argv[0] == "lb-add":
            self.hosts.pop(host, None)
            return 0, "", ""
        held = self.hosts.get(host)
        if held is None:
            return 1, "in service\n", ""
        line = ""
        if self.claims and held["claim"]:
            line = "claim: %s age=%d\n" % (held["claim"], self.now - held["stamped"])
        return 0, "drained\n" + line, ""

    def drained_by(self, host, claim, age):
        self.hosts[host] = {"claim": reboot.claim_mark(claim), "stamped": self.now - age}

    def ran(self, command):
        return [env for name, env in self.calls if name == command]


def backend(sched, claim="ours"):
    """The backend with this run's claim (``"ours"``), another claim, or none (None)."""
    return CommandBackend(sched, COMMANDS, claim=OURS if claim == "ours" else claim)


def test_every_command_gets_the_runs_claim_and_only_a_renewal_says_renew():
    sched = Scheduler()
    b = backend(sched)
    b.drain("a", "gpunode.tuning: reboot for x")
    assert sched.ran("lb-drain") == [{"GPUNODE_HOST": "a", "GPUNODE_REASON": "gpunode.tuning: reboot for x",
                                      "GPUNODE_TUNING_CLAIM": "{claim run=run-a ctl=ctl-a start=1000000 lease=600}"}]
    assert b.drained("a") and b.holds("a") is None
    b.undrain("a")
    assert all(env["GPUNODE_TUNING_CLAIM"] == reboot.claim_mark(OURS) for _name, env in sched.calls)
    assert "GPUNODE_TUNING_RENEW" not in str(sched.calls)
    assert [name for name, _env in sched.calls] == ["lb-drain", "lb-check", "lb-check", "lb-check", "lb-add"]
    assert "a" not in sched.hosts


def test_without_a_claim_the_environment_is_as_before():
    sched = Scheduler()
    backend(sched, claim=None).drain("a", "r")
    assert sched.calls == [("lb-drain", {"GPUNODE_HOST": "a", "GPUNODE_REASON": "r"})]


def test_another_live_runs_claim_is_claimed_by_the_schedulers_age_never_ours():
    sched = Scheduler()
    sched.drained_by("a", OTHER, 500)
    got = backend(sched).states(["a", "b"])
    assert got["claimed"] == {"a": "claimed by the live run run-b on ctl-b (renewed 500 s ago, lease 600 s) "
                                   "(the drain check command's claim line)"}
    assert got["out_of_service"] == ["a"] and got["ours"] == []


def test_an_expired_claim_and_our_own_are_ours_to_adopt():
    sched = Scheduler()
    sched.drained_by("a", OTHER, 601)
    sched.drained_by("b", OURS, 5000)
    got = backend(sched).states(["a", "b"])
    assert got["claimed"] == {} and got["ours"] == ["a", "b"]


def test_a_claim_line_without_an_age_counts_as_live():
    sched = Scheduler()
    b = backend(sched)
    assert reboot.parse_claim_line("drained\nclaim: %s\n" % reboot.claim_mark(OTHER)) == (OTHER, None)
    b.run = lambda argv, timeout, env: (0, "claim: %s\n" % reboot.claim_mark(OTHER), "")
    assert "renewal time unknown" in b.states(["a"])["claimed"]["a"]


@pytest.mark.parametrize("line", ["claim: {claim run=x}", "claim: %s age=-5" % reboot.claim_mark(OTHER),
                                  "claim: %s age=soon" % reboot.claim_mark(OTHER)])
def test_a_claim_line_that_is_none_is_an_error_and_the_host_counts_as_out_of_service(line):
    b = CommandBackend(lambda argv, timeout, env: (1, "in service\n" + line, ""), COMMANDS, claim=OURS)
    got = b.states(["a"])
    assert got["unreachable"] == ["a"] and got["out_of_service"] == ["a"]
    assert "a claim line is 'claim: {claim run=<run>" in got["why"]["a"]


def test_a_check_without_claim_lines_keeps_the_records_based_behaviour(tmp_path):
    """No claim line: drained is out of service, neither ours nor claimed by the backend; the records decide (a
    record of another report directory is not seen: that is the limit the docs name)."""
    sched = Scheduler(claims=False)
    sched.drained_by("a", OTHER, 10)
    b = backend(sched)
    got = b.states(["a"])
    assert got["out_of_service"] == ["a"] and got["ours"] == [] and got["claimed"] == {}
    records = seq.Records(str(tmp_path / "mine"), "run-a")
    seq.Records(str(tmp_path / "mine"), "run-b").write("a", "draining")
    assert "a" in seq.survey(b, ["a"], records, {"claim_lease": 600})["claimed"]  # the same report directory
    b.drain("a", "r")
    assert b.drained("a") and b.holds("a") is None
    b.renew("a", force=True)  # the check shows no claim: the drain command is never called to renew
    assert sched.ran("lb-drain")[-1].get("GPUNODE_TUNING_RENEW") is None and len(sched.ran("lb-drain")) == 1


def test_right_before_the_reboot_another_claim_or_none_ends_ours():
    sched = Scheduler()
    b = backend(sched)
    b.drain("a", "r")
    assert b.drained("a")
    sched.drained_by("a", OTHER, 0)  # drained at the same moment by another run: its claim replaced ours
    with pytest.raises(seq.ClaimLost) as lost:
        b.holds("a")
    assert lost.value.by_run and "run-b" in str(lost.value)
    with pytest.raises(seq.ClaimLost) as lost:
        b.drained("a")
    assert lost.value.by_run
    sched.hosts["a"]["claim"] = None  # still drained, the claim gone (someone cleared it)
    with pytest.raises(seq.ClaimLost) as lost:
        b.holds("a")
    assert not lost.value.by_run and "no claim" in str(lost.value)
    sched.hosts.pop("a")  # back in service
    with pytest.raises(seq.ClaimLost, match="back in service"):
        b.holds("a")


def test_another_runs_claim_is_never_undrained_ours_is():
    sched = Scheduler()
    sched.drained_by("a", OTHER, 700)  # expired, yet not ours: only a drain of ours (adoption) makes it ours
    with pytest.raises(seq.ClaimLost):
        backend(sched).undrain("a")
    assert not sched.ran("lb-add") and "a" in sched.hosts
    sched.drained_by("a", OURS, 700)
    backend(sched).undrain("a")
    assert len(sched.ran("lb-add")) == 1 and "a" not in sched.hosts


def test_renew_restamps_our_claim_without_draining_again_at_most_every_third_of_the_lease():
    sched = Scheduler()
    b = backend(sched)
    b.drain("a", "r")
    assert b.drained("a")
    sched.now += 300
    b.renew("a")  # within a third of the lease (by the controller's monotonic clock): nothing
    assert len(sched.ran("lb-drain")) == 1
    b.renew("a", force=True)
    renewal = sched.ran("lb-drain")[-1]
    assert renewal["GPUNODE_TUNING_RENEW"] == "1" and renewal["GPUNODE_TUNING_CLAIM"] == reboot.claim_mark(OURS)
    assert sched.hosts["a"]["stamped"] == sched.now
    sched.now += 500
    assert backend(sched, OTHER).states(["a"])["claimed"]  # 500 s after the renewal: live for another run
    sched.drained_by("a", OTHER, 0)
    b.renew("a", force=True)  # no longer ours: not renewed
    assert len(sched.ran("lb-drain")) == 2


def test_the_sequence_waits_for_another_live_runs_host_counts_it_and_adopts_it_once_expired(tmp_path):
    """Through the sequence (survey, take_slot) from two report directories: another live run's host is claimed,
    never drained by this run, and holds a slot of the budget; once its lease ran out by the scheduler's age, it is
    ours (adopted)."""

    sched = Scheduler()
    sched.drained_by("a", OTHER, 100)
    mine, records = backend(sched), seq.Records(str(tmp_path), "run-a")
    assert "a" in seq.survey(mine, ["a", "b"], records, {"claim_lease": 600})["claimed"]
    base = {"max_unavailable": 1, "wait_timeout": 1, "drain_timeout": 5, "reboot_timeout": 5, "poll": 0.01}
    clock = Clock()
    got = seq.take_slot(mine, records, "b", ["a", "b"], base, False, sleep=clock.sleep, clock=clock)
    assert not got["taken"] and "out of service or starting now (a)" in got["why"], got["why"]
    clock = Clock()
    got = seq.take_slot(mine, records, "a", ["a", "b"], dict(base, max_unavailable=2), False, sleep=clock.sleep,
                        clock=clock)
    assert not got["taken"] and "claimed by the live run run-b on ctl-b" in got["why"]
    assert not sched.ran("lb-drain") and not sched.ran("lb-add")
    sched.now += 501
    assert seq.survey(mine, ["a", "b"], records, {"claim_lease": 600})["ours"] == ["a"]
