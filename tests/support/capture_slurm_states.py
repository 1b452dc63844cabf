"""Capture what Slurm prints for each node state, from this machine's real Slurm (tests/data/real/slurm-*-here.txt).

    cd tests && ../.venv/bin/python -m support.capture_slurm_states data/real

Starts a SlurmCluster (tests/support/slurm.py) of one node per state and brings each there for real: idle,
mixed and allocated (jobs), draining and drained (our own reason), down after an unexpected reboot, drained
and then rebooted (DOWN+DRAIN), fail and failing, maint (a maintenance reservation), a reboot asked while a
job runs (``scontrol reboot ASAP``) and one issued (RebootProgram that never reboots), idle* and down* (a
slurmd that stopped answering), completing (an epilog still running). Then writes the captures of
``sinfo -N -h -o "%N|%T|%E"``, ``scontrol show node -o`` and ``sinfo -R``, each with its header.
"""

from __future__ import annotations

import os
import sys
import time

from .slurm import SlurmCluster

OURS = "gpunode.tuning: reboot for amd_pstate=active"
NODES = ["idle1", "mixed1", "alloc1", "draining1", "drained1", "rebooted1", "drainedreboot1", "fail1", "failing1",
         "maint1", "rebootasap1", "rebootissued1", "noresp1", "down1", "completing1"]
EPILOG_S = 8


def header(command: str, version: str) -> str:
    return ("source: captured here: Debian 12's %s (package 22.05.8-4+deb12u3), a slurmctld and one slurmd per node "
            "on loopback started by tests/support/capture_slurm_states.py, each node brought to its state for real\n"
            "who/when: gpunode.tuning session, %s; node names say the state each was brought to\n"
            "command: %s\n"
            "converted: no\n"
            "==> capture follows <==\n" % (version, time.strftime("%Y-%m-%d"), command))


def prepare(c: SlurmCluster) -> None:
    """Every node into its state; returns when the slow ones (down*, completing) are there too."""
    c.stop_node("down1")  # not responding long enough to be DOWN*: SlurmdTimeout
    c.submit("mixed1", 600)
    c.submit("alloc1", 600, cpus=2)
    c.submit("draining1", 600)
    c.submit("failing1", 600)
    c.submit("rebootasap1", 600)
    c.wait_for("jobs running", lambda: all(s == "RUNNING" for s, _n in c.jobs().values()), 20)
    c.drain("draining1", OURS)
    c.drain("drained1", OURS)
    c.update("fail1", "State=FAIL", "Reason=Xid 79: GPU fallen off the bus")
    c.update("failing1", "State=FAIL", "Reason=Xid 79: GPU fallen off the bus")
    c.run(["scontrol", "create", "reservation", "ReservationName=pm", "StartTime=now", "Duration=60",
           "Nodes=maint1", "Users=%s" % c.user, "Flags=MAINT"])
    c.run(["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=kernel upgrade", "rebootasap1"])
    c.run(["scontrol", "reboot", "nextstate=RESUME", "reason=firmware update", "rebootissued1"])
    c.reboot_node("rebooted1")
    c.drain("drainedreboot1", OURS)
    c.reboot_node("drainedreboot1")
    c.wait_for("down1 down*", lambda: c.state("down1") == "down*", 40)
    c.stop_node("noresp1")
    c.wait_for("noresp1 idle*", lambda: c.state("noresp1") == "idle*", 30)
    job = c.submit("completing1", 1)
    c.wait_for("completing1 completing", lambda: c.state("completing1").startswith("completing"), 20)
    del job


def main(out_dir: str) -> int:
    epilog = os.path.join("/tmp", "gpunode-slurm-epilog.sh")
    with open(epilog, "w", encoding="ascii") as fh:
        fh.write("#!/bin/sh\nsleep %d\n" % EPILOG_S)
    os.chmod(epilog, 0o755)
    extra = ["Epilog=%s" % epilog, "RebootProgram=/bin/true"]
    with SlurmCluster(nodes=NODES, extra_conf=extra, slurmd_timeout=10) as c:
        version = c.run(["sinfo", "-V"]).stdout.strip()
        prepare(c)
        captures = {
            "slurm-sinfo-N-states-captured-here.txt": ["sinfo", "-N", "-h", "-o", "%N|%T|%E"],
            "slurm-scontrol-show-node-o-captured-here.txt": ["scontrol", "show", "node", "-o"],
            "slurm-sinfo-R-captured-here.txt": ["sinfo", "-R"],
        }
        for name, argv in captures.items():
            out = c.run(argv).stdout
            shown = " ".join(a if " " not in a and "|" not in a else '"%s"' % a for a in argv)
            with open(os.path.join(out_dir, name), "w", encoding="utf-8") as fh:
                fh.write(header(shown, version) + out)
            print("wrote %s (%d lines)" % (name, len(out.splitlines())))
    os.unlink(epilog)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
