"""The persistent rollout's reboot sequence against a real Slurm (tests/support/slurm.py): six simulated hosts,
each one Slurm node (n1..n6, one slurmd each on loopback), one cluster shared by the tests of this file.

The simulated reboot (the root's own var/lib/simnode/reboot) changes the root's boot id; a watcher thread of the
test then reboots that node's slurmd as Slurm sees a reboot (slurmd gone, back with a new boot time), so the
sequence meets what a real reboot brings: DOWN+DRAIN, "Node unexpectedly rebooted", a new SlurmdStartTime.
What the budget allows is checked by polling sinfo during the run (the harness's monitor), not from our records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import simnode
import yaml
from support.background import Background
from support.checkout import REPO, VENV_BIN, ansible_env
from support.inventory import write_inventory
from support.nodes import BootWatcher
from support.slurm import SlurmCluster, SlurmError, missing_tools

from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.slurm import SlurmBackend

HOSTS = ["n1", "n2", "n3", "n4", "n5", "n6"]
# acpi-cpufreq nodes whose native driver is amd-pstate: the persistent flow leaves amd_pstate=active pending.
NEEDS_REBOOT = "audited-epyc-8gpu"
# Already on amd-pstate-epp: nothing pending, never drained.
NO_REBOOT = "epyc-pstate-epp"
DRIVER = "sys/devices/system/cpu/cpufreq/policy0/scaling_driver"
# The claim lease of this file's runs: short enough for a killed run's claim to run out within a test, long
# enough to cover a gate on a loaded machine (the live run renews it at every wait, and before and after the gate).
LEASE = 30


@pytest.fixture(scope="module")
def cluster():
    assert not missing_tools(), "missing %s: scripts/setup.sh --tests" % ", ".join(missing_tools())
    started = SlurmCluster(nodes=HOSTS, slurmd_timeout=10).start()
    yield started
    started.stop()


@pytest.fixture
def fresh(cluster):
    """The cluster with every node idle and in service, no job left (the tests share it)."""
    for job in cluster.jobs():
        cluster.run(["scancel", job], check=False)
    for node, (state, _reason) in cluster.sinfo().items():
        if state != "idle":
            cluster.resume(node)
    for node in HOSTS:
        cluster.wait_state(node, "idle", timeout=30)
    return cluster


def reboot_watcher(cluster, roots):
    """Reboots a node's slurmd (as Slurm sees a reboot) when its simulated root gets a new boot id."""
    return BootWatcher(roots, lambda host: cluster.reboot_node(host, down_seconds=1.0))


class JobEnder(Background):
    """Ends ``job`` ``after`` seconds once sinfo shows ``node`` draining (the sequence's drain is waiting on it)."""

    def __init__(self, cluster, node, job, after):
        super().__init__()
        self.cluster, self.node, self.job, self.after = cluster, node, job, after
        self.ended_at = None

    def _run(self):
        while not self._stop.is_set():
            if self.cluster.state(self.node) == "draining":
                time.sleep(self.after)
                self.cluster.run(["scancel", self.job])
                self.ended_at = time.monotonic()
                return
            time.sleep(0.2)


class CancelWhen(Background):
    """Cancels ``job`` once ``ready()`` says so."""

    def __init__(self, cluster, job, ready):
        super().__init__()
        self.cluster, self.job, self.ready = cluster, job, ready

    def _run(self):
        while not self._stop.is_set():
            if self.ready():
                self.cluster.run(["scancel", self.job])
                return
            time.sleep(0.2)


def build_fleet(tmp_path, presets, hosts=None, **common):
    roots = {}
    for host in HOSTS if hosts is None else hosts:
        roots[host] = str(tmp_path / host)
        simnode.build(roots[host], presets.get(host, NEEDS_REBOOT), cpus=2, gpus=1)
    reports = tmp_path / "reports"
    common.setdefault("gpunode_tuning_reboot_claim_lease", LEASE)
    inventory = write_inventory(
        tmp_path / "hosts.yml", roots, report_dir=reports, gpunode_tuning_reboot_ok=True,
        gpunode_tuning_drain="slurm", gpunode_tuning_reboot_poll_interval=0.3, **common)
    return roots, inventory, reports


def second_inventory(tmp_path, roots, name, **common):
    """Another run's inventory over ``roots`` (the same simulated hosts), with its own report directory (as two AWX
    jobs in their own containers have them)."""
    reports = tmp_path / ("reports-" + name)
    common.setdefault("gpunode_tuning_reboot_claim_lease", LEASE)
    inventory = write_inventory(
        tmp_path / ("hosts-%s.yml" % name), roots, report_dir=reports, gpunode_tuning_reboot_ok=True,
        gpunode_tuning_drain="slurm", gpunode_tuning_reboot_poll_interval=0.3, **common)
    return inventory, reports


class StateAtBoot(BootWatcher):
    """A BootWatcher that also records each node's sinfo (state, reason) at the moment its root rebooted."""

    def __init__(self, cluster, roots):
        self.states: dict = {}

        def on_boot(host):
            self.states.setdefault(host, []).append(cluster.sinfo()[host])
            cluster.reboot_node(host, down_seconds=1.0)

        super().__init__(roots, on_boot)


# The longest a drain over the budget may last: two runs that decided at the same moment (each on a poll that did
# not show the other's drain yet) both drain, read again, and step back (docs/rebooting.md, "Two runs deciding at
# the same moment"): a scheduler read and a resume, each bounded by the command timeout.
STEP_BACK_S = 30


def out_spans(seen, node):
    """``[(first, last)]``: the monotonic times of each stretch of consecutive samples with ``node`` out."""
    spans, start, last = [], None, None
    for sample in seen.samples:
        if node in sample.out:
            start = sample.when if start is None else start
            last = sample.when
        elif start is not None:
            spans.append((start, last))
            start = None
    return spans + ([(start, last)] if start is not None else [])


def assert_budget_held_for_reboots(seen, watcher, budget):
    """Two runs' budget as docs/rebooting.md promises it: no node is rebooted while more than ``budget`` are out
    (the stretch out of service around each reboot overlaps no other rebooted node's), and more than ``budget``
    out happens only in the moment two runs drained at once, before one stepped back (at most STEP_BACK_S)."""
    around = {}
    for host, at in watcher.when.items():
        around[host] = next(((a, b) for a, b in out_spans(seen, host) if a - 2.0 <= at <= b + 2.0), (at, at))
    for host, (a, b) in around.items():
        for other, (c, d) in around.items():
            assert other == host or b < c or d < a, ("rebooted while another rebooted node was out", around)
    over, since = [], None
    for sample in seen.samples:
        if len(sample.out) > budget:
            since = sample.when if since is None else since
            over.append(sample)
            assert sample.when - since <= STEP_BACK_S, ("over the budget longer than a step back", over)
        else:
            since = None


def start_rollout(cluster, inventory, *extra):
    return subprocess.Popen(rollout_command(inventory, *extra), cwd=REPO, env=ansible_env(SLURM_CONF=cluster.conf),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def summary_of(reports):
    with open(os.path.join(reports, "rollout-summary.json"), encoding="utf-8") as fh:
        return json.load(fh)


def assert_each_rebooted_once_and_drained(watcher, hosts):
    assert watcher.errors == [], watcher.errors
    assert sorted(watcher.rebooted) == sorted(hosts), watcher.rebooted  # no double reboot
    for host, states in watcher.states.items():
        for state, reason in states:  # never rebooted in service: drained, with a claim of ours
            assert state == "drained" and reason.startswith("gpunode.tuning: reboot for"), (host, states)
            assert "{claim run=" in reason, reason


def rollout_command(inventory, *extra):
    return [os.path.join(VENV_BIN, "ansible-playbook"), "-i", inventory, os.path.join(REPO, "playbooks", "rollout.yml"),
            "-f", "8", "-e", "gpunode_tuning_rollout_flow=persistent", "-e", "gpunode_tuning_rollout_canary=0",
            "-e", "gpunode_tuning_rollout_batch=100%", *extra]


def rollout(cluster, inventory, reports, *extra, env=None):
    env = env or ansible_env(SLURM_CONF=cluster.conf)
    proc = subprocess.run(rollout_command(inventory, *extra), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400, check=False)
    path = os.path.join(reports, "rollout-summary.json")
    summary = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else None
    return proc, summary


def driver(root):
    with open(os.path.join(root, DRIVER), encoding="ascii") as fh:
        return fh.read().strip()


def by_host(summary):
    return {r["host"]: r for r in summary["results"]}


def test_rollout_drains_reboots_within_the_budget_and_resumes_with_a_job_delaying_one_reboot(fresh, tmp_path):
    """Four hosts need a reboot, two do not; max_unavailable 2; a real job on n2 delays its reboot."""
    cluster = fresh
    roots, inventory, reports = build_fleet(tmp_path, {"n5": NO_REBOOT, "n6": NO_REBOOT},
                                            gpunode_tuning_reboot_max_unavailable=2)
    job = cluster.submit("n2", 300)
    cluster.wait_for("the job on n2 to run", lambda: cluster.jobs().get(job, ("", ""))[0] == "RUNNING", 20)
    ended = JobEnder(cluster, "n2", job, after=2.0)
    with cluster.monitor() as seen, reboot_watcher(cluster, roots) as watcher, ended as _ender:
        started = time.monotonic()
        proc, summary = rollout(cluster, inventory, reports)
        wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert watcher.errors == [] and seen.errors == [], (watcher.errors, seen.errors)
    # The budget, as sinfo showed it during the run (every poll), not as our records tell it.
    assert 1 <= seen.max_out_of_service <= 2, seen.peak
    assert seen.ever_out() == {"n1", "n2", "n3", "n4"}, seen.ever_out()  # n5, n6 never drained
    assert sorted(watcher.rebooted) == ["n1", "n2", "n3", "n4"]
    results = by_host(summary)
    for host in ("n1", "n2", "n3", "n4"):
        assert results[host]["status"] == "done", results[host]
        assert results[host]["reboot"]["returned"] and results[host]["reboot"]["backend"] == "slurm"
        assert driver(roots[host]) == "amd-pstate-epp", host  # verified after the reboot with the driver switched
        assert results[host]["verification"] == "pass"
    for host in ("n5", "n6"):
        assert results[host]["reboot"] is None and results[host]["status"] == "done"
    assert set(cluster.sinfo().values()) == {("idle", "none")}, cluster.sinfo()  # every host resumed
    # n2 was draining with the job on it, and rebooted only after the job ended.
    assert ended.ended_at is not None, "n2 was never seen draining"
    assert job not in cluster.jobs()
    assert results["n2"]["reboot"]["drain_s"] >= 2, results["n2"]["reboot"]
    assert watcher.when["n2"] > ended.ended_at
    print("rollout of 6 hosts, 4 reboots, budget 2: %.1f s" % wall)


def test_a_drain_timeout_and_a_host_that_never_returns_stay_drained_and_stop_the_reboots(fresh, tmp_path):
    """max_unavailable 2: n1's job outlasts the drain timeout, n2 never comes back; both stay drained with
    their reason, no other host is rebooted (those left are tuned, their reboot pending), nothing else drained."""
    cluster = fresh
    roots, inventory, reports = build_fleet(
        tmp_path, {}, gpunode_tuning_reboot_max_unavailable=2, gpunode_tuning_drain_timeout=3,
        gpunode_tuning_reboot_timeout=4, gpunode_tuning_reboot_wait_timeout=60)
    open(os.path.join(roots["n2"], simnode.REBOOT_NEVER_RETURNS), "w").close()
    # the job outlasts the rollout however slow the machine (with 60 s, a loaded run reached the drain after the
    # job had ended); the next test's ``fresh`` cancels it
    job = cluster.submit("n1", 900)
    cluster.wait_for("the job on n1 to run", lambda: cluster.jobs().get(job, ("", ""))[0] == "RUNNING", 20)
    with cluster.monitor() as seen, reboot_watcher(cluster, roots) as watcher:
        proc, summary = rollout(cluster, inventory, reports)
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert seen.max_out_of_service <= 2, seen.peak
    states = cluster.sinfo()
    assert states["n1"][0] in ("draining", "drained") and "drain did not finish within 3 s" in states["n1"][1], states
    assert states["n1"][1].startswith("gpunode.tuning:")
    assert states["n2"][0] == "drained" and "did not come back within 4 s" in states["n2"][1], states
    for host in ("n3", "n4", "n5", "n6"):
        assert states[host] == ("idle", "none"), states  # nothing else left drained by us
    assert watcher.rebooted == []
    results = by_host(summary)
    assert results["n1"]["reboot"]["stays_drained"] and results["n1"]["reboot"]["stage"] == "drain"
    assert results["n2"]["reboot"]["stays_drained"] and results["n2"]["reboot"]["stage"] == "reboot"
    for host in ("n3", "n4", "n5", "n6"):
        assert results[host]["status"] == "failed" and not results[host]["reboot"].get("rebooted"), results[host]
        assert driver(roots[host]) == "acpi-cpufreq"  # tuned, the reboot still pending
    lines = "\n".join(summary and rollout_lines(proc))
    assert "n1: stays drained (drain)" in lines and "n2: stays drained (reboot)" in lines, lines


def rollout_lines(proc):
    return [line for line in proc.stdout.splitlines() if "stays drained" in line]


def test_a_node_drained_by_someone_else_is_skipped_and_holds_the_only_slot(fresh, tmp_path):
    """max_unavailable 1 and n6 drained by an operator: n6 is out_of_service (not tuned, not resumed, its reason
    kept); no host is rebooted while it holds the budget's only slot; the run says so and exits non-zero."""
    cluster = fresh
    roots, inventory, reports = build_fleet(tmp_path, {}, gpunode_tuning_reboot_wait_timeout=4)
    cluster.drain("n6", "bad DIMM, ticket 4711")
    before = simnode.running_cpufreq(roots["n6"])
    with cluster.monitor() as seen, reboot_watcher(cluster, roots) as watcher:
        proc, summary = rollout(cluster, inventory, reports)
    assert proc.returncode != 0
    assert "n6" in proc.stdout and "out of service" in proc.stdout
    assert watcher.rebooted == [] and seen.max_out_of_service == 1, seen.peak
    assert cluster.sinfo()["n6"] == ("drained", "bad DIMM, ticket 4711")
    results = by_host(summary)
    assert results["n6"]["status"] == "out_of_service" and "bad DIMM" in results["n6"]["reason"]
    assert simnode.running_cpufreq(roots["n6"]) == before
    assert not os.path.exists(os.path.join(roots["n6"], "etc/default/grub.d/60-gpunode-tuning.cfg"))  # not tuned
    for host in ("n1", "n2", "n3", "n4", "n5"):
        assert cluster.sinfo()[host] == ("idle", "none")
        assert results[host]["status"] == "failed", results[host]
    assert "waited 4 s for a slot" in json.dumps(summary), summary["results"]
    assert summary["counts"]["out_of_service"] == 1


def test_tune_persistent_skips_a_node_drained_by_someone_else_before_tuning_it(fresh, tmp_path):
    """tune.yml --tags persistent (not the rollout), n6 drained by an operator: n6 is not tuned, not drained
    again, not rebooted, not resumed, its reason kept, and the run fails naming it; the other hosts are tuned."""
    cluster = fresh
    roots, inventory, _reports = build_fleet(tmp_path, {h: NO_REBOOT for h in HOSTS})
    cluster.drain("n6", "bad DIMM, ticket 4711")
    before = simnode.running_cpufreq(roots["n6"])
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", inventory, os.path.join(REPO, "playbooks", "tune.yml"),
           "-f", "8", "--tags", "persistent"]
    with reboot_watcher(cluster, roots) as watcher:
        proc = subprocess.run(cmd, cwd=REPO, env=ansible_env(SLURM_CONF=cluster.conf), capture_output=True,
                              text=True, timeout=300, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "n6 was out of service before the run" in proc.stdout and "bad DIMM" in proc.stdout, proc.stdout
    assert watcher.rebooted == []
    assert cluster.sinfo()["n6"] == ("drained", "bad DIMM, ticket 4711")
    assert simnode.running_cpufreq(roots["n6"]) == before
    desired = "etc/gpunode-tuning/desired.json"
    assert not os.path.exists(os.path.join(roots["n6"], desired))  # not tuned
    for host in ("n1", "n2", "n3", "n4", "n5"):
        assert os.path.exists(os.path.join(roots[host], desired)), host  # tuned
        assert cluster.sinfo()[host] == ("idle", "none")


def processes_of(inventory):
    """The pids of the processes whose command line names ``inventory`` (an ansible-playbook run and its workers)."""
    out = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                if inventory.encode() in fh.read():
                    out.append(int(pid))
        except OSError:
            continue
    return out


def where_waiting(pids):
    """``{pid: "state wchan ppid"}`` of ``pids``: where a process that should have stopped waits."""
    out = {}
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid, encoding="utf-8") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open("/proc/%d/wchan" % pid, encoding="utf-8") as fh:
                wchan = fh.read().strip()
        except OSError:
            continue
        out[pid] = "state %s, waits in %s, parent %s" % (fields[0], wchan or "-", fields[1])
    return out


def add_login_node(inventory, cluster, tmp_path):
    """An inventory host ``slurm-login`` outside the group of the nodes (local connection): the only one whose
    shell knows the cluster (its ansible_shell_executable exports SLURM_CONF), like a site's login node."""
    shell = tmp_path / "login-shell"
    shell.write_text("#!/bin/sh\nSLURM_CONF=%s\nexport SLURM_CONF\nexec /bin/sh \"$@\"\n" % cluster.conf,
                     encoding="ascii")
    shell.chmod(0o755)
    with open(inventory, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["all"]["hosts"] = {"slurm-login": {"ansible_connection": "local", "ansible_shell_executable": str(shell)}}
    with open(inventory, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh)


def test_slurm_commands_on_a_delegate_update_the_reason_of_a_host_that_never_returns(fresh, tmp_path):
    """gpunode_tuning_drain_slurm_delegate: slurm-login. ansible-playbook (and so every node's own shell) runs without
    SLURM_CONF, so sinfo and scontrol reach the cluster only on the delegate. n1 is drained, rebooted and resumed;
    n2 never comes back and stays drained with its reason updated through the delegate; nothing else drained.
    An inventory name that does not exist fails the precheck before any host is touched."""
    cluster = fresh
    roots, inventory, reports = build_fleet(
        tmp_path, {h: NO_REBOOT for h in ("n3", "n4", "n5", "n6")}, gpunode_tuning_reboot_timeout=4,
        gpunode_tuning_drain_slurm_delegate="slurm-login")
    add_login_node(inventory, cluster, tmp_path)
    open(os.path.join(roots["n2"], simnode.REBOOT_NEVER_RETURNS), "w").close()
    env = ansible_env()
    env.pop("SLURM_CONF", None)
    assert subprocess.run(["sinfo"], env=env, capture_output=True, timeout=20, check=False).returncode != 0, \
        "sinfo reaches a cluster without SLURM_CONF: the test would not show that the delegate ran the commands"

    proc, summary = rollout(cluster, inventory, reports, "-e", "gpunode_tuning_drain_slurm_delegate=login-9",
                            env=env)
    assert proc.returncode != 0
    assert 'gpunode_tuning_drain_slurm_delegate must be an inventory host name' in proc.stdout, proc.stdout[-3000:]
    assert '"login-9": no such host in the inventory' in proc.stdout
    assert not any(os.path.exists(os.path.join(r, "etc/gpunode-tuning/desired.json")) for r in roots.values())

    with cluster.monitor() as seen, reboot_watcher(cluster, roots) as watcher:
        proc, summary = rollout(cluster, inventory, reports, env=env)
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert watcher.errors == [] and seen.errors == [], (watcher.errors, seen.errors)
    assert seen.max_out_of_service == 1, seen.peak
    assert watcher.rebooted == ["n1"]
    states = cluster.sinfo()
    assert states["n1"] == ("idle", "none"), states
    assert states["n2"][0] == "drained", states
    assert states["n2"][1].startswith("gpunode.tuning: did not come back within 4 s"), states
    for host in ("n3", "n4", "n5", "n6"):
        assert states[host] == ("idle", "none"), states
    results = by_host(summary)
    assert results["n1"]["status"] == "done" and results["n1"]["reboot"]["returned"], results["n1"]
    assert driver(roots["n1"]) == "amd-pstate-epp"
    assert results["n2"]["reboot"]["stays_drained"] and results["n2"]["reboot"]["stage"] == "reboot"
    assert "could not be updated" not in json.dumps(results["n2"])


def test_an_interrupted_rollout_is_adopted_by_the_next_run(fresh, tmp_path):
    """max_unavailable 1, four hosts need a reboot. The first run's ansible-playbook (its whole process group) is
    killed once sinfo shows a host drained by us, before it is resumed. The next run adopts that host (rebooted
    if it still needs it, within the budget, then gated) and resumes it; the others get their reboot one at a
    time; at the end every host is back in service, each rebooted once."""
    cluster = fresh
    roots, inventory, reports = build_fleet(tmp_path, {"n5": NO_REBOOT, "n6": NO_REBOOT},
                                            gpunode_tuning_reboot_claim_lease=6)
    with reboot_watcher(cluster, roots) as watcher:
        first = subprocess.Popen(rollout_command(inventory), cwd=REPO, env=ansible_env(SLURM_CONF=cluster.conf),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        drained = {}
        try:
            def ours_drained():
                drained.update({n: v for n, v in cluster.sinfo().items()
                                if v[0] == "drained" and v[1].startswith("gpunode.tuning:")})
                return bool(drained) or first.poll() is not None
            cluster.wait_for("a host drained by the rollout", ours_drained, timeout=300, interval=0.1)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            output = first.communicate(timeout=60)[0]
        # Ansible's workers run in sessions of their own: each host's reboot task outlives the killed group, and
        # must stop by itself (reboot_sequence.guard_run) before it drains, reboots or resumes anything more. What
        # is asserted is that: the cluster as the kill left it until every worker is gone. How long that takes is
        # the step a worker is in (one scheduler command, bounded by its timeout of 30 s, then its check), under
        # load far more than the poll; a worker still there after that is shown with where it waits (/proc).
        after_kill = cluster.sinfo()
        changed = {}

        def workers_gone():
            now = cluster.sinfo()
            # a drain or a resume after the kill (the victim's reboot may change its state, not return it to service)
            changed.update({n: v for n, v in now.items() if (v[0] == "idle") != (after_kill.get(n, v)[0] == "idle")})
            return not processes_of(inventory)

        try:
            cluster.wait_for("the killed run's workers to stop", workers_gone, timeout=120, interval=0.5)
        except SlurmError as exc:
            raise AssertionError("%s; still running: %s" % (exc, where_waiting(processes_of(inventory)))) from exc
        assert changed == {}, ("a worker of the killed run changed the cluster after the kill", after_kill, changed)
        assert len(drained) == 1, (drained, output[-3000:])
        victim, (_state, reason) = next(iter(drained.items()))
        assert reason.startswith("gpunode.tuning: reboot for"), reason
        time.sleep(2)  # what the killed run left: still out of service, not resumed
        left = cluster.sinfo()
        assert left[victim][0] != "idle", left
        assert [n for n, v in left.items() if v[0] != "idle" and n != victim] == [], left
        rebooted_before = list(watcher.rebooted)

        with cluster.monitor() as seen:
            proc, summary = rollout(cluster, inventory, reports)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert watcher.errors == [] and seen.errors == [], (watcher.errors, seen.errors)
    assert seen.max_out_of_service == 1, seen.peak  # the adopted host held the only slot until it was resumed
    assert set(cluster.sinfo().values()) == {("idle", "none")}, cluster.sinfo()
    assert sorted(watcher.rebooted) == ["n1", "n2", "n3", "n4"], (rebooted_before, watcher.rebooted)
    results = by_host(summary)
    for host in ("n1", "n2", "n3", "n4"):
        assert results[host]["status"] == "done", results[host]
        assert results[host]["reboot"]["returned"], results[host]
        assert driver(roots[host]) == "amd-pstate-epp", host
    # rebooted once: by the killed run (then the next one only gates and returns it) or by the next run
    assert results[victim]["reboot"]["rebooted"] is (victim not in rebooted_before), (rebooted_before, results[victim])
    assert "adopted" in results[victim]["reboot"]["msg"] or victim not in rebooted_before, results[victim]
    for host in ("n5", "n6"):
        assert results[host]["reboot"] is None


def test_resuming_a_node_an_operator_already_resumed_is_no_failure(fresh):
    # An adopted node that someone resumed before the sequence returns it: the real slurmctld refuses the
    # second RESUME ("Invalid node state specified"), and the backend takes the node being in service as
    # returned instead of failing the host.
    def run(argv, timeout):
        proc = fresh.run(argv, timeout=timeout, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    backend = SlurmBackend(run, {h: h for h in HOSTS})
    node = HOSTS[0]
    backend.drain(node, "gpunode.tuning: reboot for amd_pstate=active")
    fresh.wait_state(node, "drained", timeout=20)
    fresh.resume(node)  # the operator
    fresh.wait_state(node, "idle", timeout=20)
    again = fresh.run(["scontrol", "update", "NodeName=" + node, "State=RESUME"], check=False)
    assert again.returncode != 0 and "Invalid node state" in again.stdout + again.stderr, again
    backend.undrain(node)
    assert backend.in_service(node) and fresh.sinfo()[node] == ("idle", "none")


def test_two_rollouts_at_once_over_the_same_hosts_reboot_each_node_once_and_never_in_service(fresh, tmp_path):
    """Issue 42: two rollouts over the same hosts (an AWX schedule and a manual run), budget 1, the second started once
    Slurm shows a node drained by the first, each with its own report directory. The scheduler holds each drain as a
    run's claim: the other run waits for it and never drains again, reboots, resumes or adopts it; a host the first
    run rebooted is not rebooted again (its command line already holds the argument). Never two nodes out, each node
    rebooted once, each reboot of a drained node, all back in service.
    """
    cluster = fresh
    hosts = ["n1", "n2", "n3"]
    roots, inventory_a, reports_a = build_fleet(tmp_path, {"n3": NO_REBOOT}, hosts=hosts)
    inventory_b, reports_b = second_inventory(tmp_path, roots, "b")
    # A job on n2 keeps the first run's drain of n2 waiting until the second run's sequence for n2 has started: both
    # runs then meet on the same drained node.
    job = cluster.submit("n2", 300)
    cluster.wait_for("the job on n2 to run", lambda: cluster.jobs().get(job, ("", ""))[0] == "RUNNING", 20)
    ender = CancelWhen(cluster, job, lambda: os.path.exists(os.path.join(reports_b, "reboots", "n2.json")))
    with cluster.monitor() as seen, StateAtBoot(cluster, roots) as watcher, ender as _ender:
        first = start_rollout(cluster, inventory_a)
        cluster.wait_for("a node drained by the first run", lambda: first.poll() is not None or any(
            state in ("draining", "drained") for state, _reason in cluster.sinfo().values()), timeout=300,
            interval=0.1)
        second = start_rollout(cluster, inventory_b)
        out_a = first.communicate(timeout=400)[0]
        out_b = second.communicate(timeout=400)[0]
    assert seen.errors == [] and seen.max_out_of_service == 1, seen.peak
    assert_each_rebooted_once_and_drained(watcher, ["n1", "n2"])
    assert set(cluster.sinfo().values()) == {("idle", "none")}, cluster.sinfo()
    for host in ("n1", "n2"):
        assert driver(roots[host]) == "amd-pstate-epp", host
    assert first.returncode == 0, out_a[-5000:]
    assert second.returncode == 0, out_b[-5000:]
    results = by_host(summary_of(reports_b))
    assert all(results[h]["status"] == "done" for h in hosts), results


def test_two_rollouts_over_disjoint_hosts_of_one_partition_share_the_fleet_budget(fresh, tmp_path):
    """Issue 42: budget 1 with the fleet scope (the default): run A over n1, n2 and run B over n3, at once, each
    with its own report directory; the budget counts every node of the partition: never two rebooted at once, and
    two out only for the moment two runs drained at once before one stepped back (the runs share no lock; the
    scheduler is all they both read)."""
    cluster = fresh
    hosts = ["n1", "n2", "n3"]
    roots, _inventory, _reports = build_fleet(tmp_path, {}, hosts=hosts)
    inventory_a, reports_a = second_inventory(tmp_path, {h: roots[h] for h in ("n1", "n2")}, "a")
    inventory_b, reports_b = second_inventory(tmp_path, {"n3": roots["n3"]}, "b")
    with cluster.monitor() as seen, StateAtBoot(cluster, roots) as watcher:
        first = start_rollout(cluster, inventory_a)
        second = start_rollout(cluster, inventory_b)
        out_a = first.communicate(timeout=400)[0]
        out_b = second.communicate(timeout=400)[0]
    assert seen.errors == []
    assert_budget_held_for_reboots(seen, watcher, budget=1)
    assert_each_rebooted_once_and_drained(watcher, hosts)
    assert first.returncode == 0, out_a[-5000:]
    assert second.returncode == 0, out_b[-5000:]
    assert set(cluster.sinfo().values()) == {("idle", "none")}, cluster.sinfo()
    for reports in (reports_a, reports_b):
        assert all(r["status"] == "done" for r in summary_of(reports)["results"])


def test_a_controller_restart_while_a_node_with_a_job_drains_never_reboots_it_before_the_job_ends(fresh, tmp_path):
    """Issue 42: slurmctld stopped for 5 s while n1 (a job running on it) drains, then started: the scheduler's
    errors are asked again within the drain wait, and right after the restart sinfo shows n1 "drained" before
    slurmd has re-registered its job; the job is still listed by squeue, so n1 is rebooted only after it ended
    (3 s after the restart)."""
    cluster = fresh
    roots, inventory, reports = build_fleet(tmp_path, {"n2": NO_REBOOT}, hosts=["n1", "n2"])
    job = cluster.submit("n1", 120)
    cluster.wait_for("the job on n1 to run", lambda: cluster.jobs().get(job, ("", ""))[0] == "RUNNING", 20)
    with StateAtBoot(cluster, roots) as watcher:
        proc = start_rollout(cluster, inventory)
        try:
            cluster.wait_for("n1 draining", lambda: cluster.state("n1") == "draining" or proc.poll() is not None,
                             timeout=200, interval=0.2)
            cluster.stop_controller()
            time.sleep(5)
        finally:
            cluster.start_controller()
        time.sleep(3)
        cluster.run(["scancel", job])
        ended_at = time.monotonic()
        output = proc.communicate(timeout=400)[0]
    assert proc.returncode == 0, output[-6000:]
    assert watcher.rebooted == ["n1"] and watcher.errors == [], (watcher.rebooted, watcher.errors)
    assert watcher.when["n1"] > ended_at, watcher.when["n1"] - ended_at  # not before the job ended
    results = by_host(summary_of(reports))
    assert results["n1"]["status"] == "done" and results["n1"]["reboot"]["returned"], results["n1"]
    assert cluster.sinfo()["n1"] == ("idle", "none")
