"""The real Slurm harness (tests/support/slurm.py): Debian's Slurm 22.05 on loopback, six nodes, real jobs.

What the reboot rollout's tests (issue 30) rely on, shown on the real daemons: a cluster of six idle nodes
that is up in about a second; a running job keeps a drained node ``draining`` until it ends, and RESUME
returns it; a rebooted node comes back DOWN "Node unexpectedly rebooted" (a drained one keeps its DRAIN
and its reason); the sinfo monitor sees every node that was out of service, and the most at once.
"""

from __future__ import annotations

import socket
import time

import pytest
from support.slurm import SlurmError, out_of_service


@pytest.fixture
def cluster(slurm_cluster):
    running = slurm_cluster(nodes=6)
    yield running
    running.stop()
    assert running.timings["stop_s"] < 10, running.timings


def listening(port):
    """The local addresses a TCP socket listens on for ``port`` (from /proc/net/tcp: state 0A)."""
    out = set()
    with open("/proc/net/tcp", encoding="ascii") as fh:
        for line in fh.readlines()[1:]:
            local, _remote, state = line.split()[1:4]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                out.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


def test_six_idle_nodes_on_private_loopback_ports(cluster):
    assert cluster.sinfo() == {"n%d" % i: ("idle", "none") for i in range(1, 7)}
    assert cluster.timings["start_s"] < 20, cluster.timings
    for node in cluster.nodes:
        assert listening(cluster.ports[node]) == {"127.0.0.1"}, node  # slurmd: NoInAddrAny
        shown = cluster.show_node(node)
        assert (shown["State"], shown["NodeAddr"], shown["Port"]) == ("IDLE", "127.0.0.1", str(cluster.ports[node]))
    # slurmctld 22.05 binds every address (its man page: NoInAddrAny is for all daemons but slurmctld),
    # on its private port.
    assert listening(cluster.ports["slurmctld"]) in ({"0.0.0.0"}, {"127.0.0.1"})
    assert len(set(cluster.ports.values())) == 7


def test_a_job_keeps_a_drained_node_draining_until_it_ends_then_resume(cluster):
    job = cluster.submit("n2", 4)
    cluster.wait_for("job %s running" % job, lambda: cluster.jobs().get(job, ("", ""))[0] == "RUNNING", 15)
    assert cluster.state("n2") == "mixed"  # one of its two CPUs
    with cluster.monitor(interval=0.1) as seen:
        cluster.drain("n2", "gpunode.tuning: reboot for amd_pstate=active")
        assert cluster.sinfo()["n2"] == ("draining", "gpunode.tuning: reboot for amd_pstate=active")
        assert cluster.show_node("n2")["State"] == "MIXED+DRAIN"
        cluster.wait_state("n2", "drained", timeout=20)
        assert job not in cluster.jobs()
        time.sleep(0.5)  # seen drained by the monitor too
        cluster.resume("n2")
        cluster.wait_state("n2", "idle", timeout=15)
    assert not seen.errors
    assert seen.max_out_of_service == 1 and seen.ever_out() == {"n2"}
    states = [s.nodes["n2"][0] for s in seen.samples]
    assert "draining" in states and "drained" in states and states[-1] == "idle", states
    assert cluster.sinfo()["n2"] == ("idle", "none")


def test_a_rebooted_node_comes_back_down_until_resumed_and_a_drained_one_keeps_its_reason(cluster):
    with cluster.monitor(only=["n3", "n4"]) as seen:
        cluster.reboot_node("n3")
        cluster.wait_for("n3 down", lambda: cluster.sinfo()["n3"] == ("down", "Node unexpectedly rebooted"), 15)
        assert cluster.show_node("n3")["State"] == "DOWN"

        cluster.drain("n4", "gpunode.tuning: reboot for iommu=pt")
        cluster.reboot_node("n4")
        cluster.wait_for("n4 down+drain", lambda: cluster.show_node("n4")["State"] == "DOWN+DRAIN", 15)
        assert cluster.sinfo()["n4"] == ("drained", "gpunode.tuning: reboot for iommu=pt")

        for node in ("n3", "n4"):
            cluster.resume(node)
        # RESUME leaves a DOWN node NOT_RESPONDING ("idle*") until its next ping answers.
        for node in ("n3", "n4"):
            cluster.wait_state(node, "idle", timeout=15)
    assert not seen.errors
    assert seen.ever_out() == {"n3", "n4"} and seen.max_out_of_service == 2
    assert all(not s.out for s in seen.samples[-1:])


def test_out_of_service_reading_of_sinfo_states():
    assert [out_of_service(s) for s in ("idle", "mixed", "allocated", "completing", "idle~", "planned")] == [False] * 6
    assert all(out_of_service(s) for s in ("drained", "draining", "down", "down*", "idle*", "fail", "failing",
                                           "maint", "reboot^", "drained*", "allocated*", "mixed@", "idle$"))


def test_a_command_that_fails_names_itself(cluster):
    with pytest.raises(SlurmError, match="scontrol update NodeName=nosuchnode State=RESUME exited 1"):
        cluster.resume("nosuchnode")
