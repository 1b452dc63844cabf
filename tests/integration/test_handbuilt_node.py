"""The whole workflow on a node that tools/simnode did not write (tests/support/handbuilt.py).

A user checking the collection builds a node of their own, from the kernel's layout and real config space; this
runs the README's workflow on such a node: audit, plan, runtime (and its rerun), persistent, verify, rollback.
What each step did is read back independently: the real lspci for config space, the files themselves for the
rest, and a byte snapshot for "nothing written" and "everything restored".
"""

from __future__ import annotations

import json
import os
import re

from support import handbuilt
from support.inventory import write_inventory
from support.lspci import lspci_vvv
from support.playbooks import assert_ok, failure_summary, run_playbook
from support.trees import snapshot, tree_changes

HOST = "handbuilt"
DRIFTED = ["cpufreq.driver", "cpufreq.governor", "cpuidle.C2", "numa_balancing.kernel.numa_balancing",
           "pcie_acs." + handbuilt.ROOT_PORT, "pcie_mrrs." + handbuilt.GPU, "sysctl.net.core.rmem_max",
           "sysctl.net.core.somaxconn", "sysctl.net.core.wmem_max", "sysctl.vm.swappiness", "thp.defrag",
           "thp.enabled"]


def states(reports):
    with open(os.path.join(reports, HOST + ".json"), encoding="utf-8") as fh:
        return {s["id"]: s["state"] for s in json.load(fh)["settings"]}


def lspci_block(root, bdf):
    return next(b for b in lspci_vvv(root).split("\n\n") if b.startswith(bdf))


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read().strip()


def test_the_workflow_on_a_node_written_by_hand(tmp_path):
    root = handbuilt.build(str(tmp_path / "node"))
    reports = str(tmp_path / "reports")
    inventory = write_inventory(tmp_path / "hosts.yml", {HOST: root}, report_dir=reports)
    original = snapshot(root)

    audit = run_playbook("verify.yml", inventory)
    assert audit.returncode == 2, audit.stdout[-4000:]
    assert sorted(k for k, v in states(reports).items() if v == "drifted") == DRIFTED
    assert "MaxReadReq 512 bytes" in lspci_block(root, handbuilt.GPU)

    plan = run_playbook("tune.yml", inventory, "--tags", "runtime", "--check", "--diff")
    assert_ok(plan)
    assert tree_changes(original, snapshot(root)) == []

    tuned = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(tuned)
    # No modprobe below this root: the optional nvidia_peermem is a warning, not a failed family.
    assert re.search(r"nvidia_peermem: .*has no usr/sbin/modprobe.*\(no_modprobe; not required\)", tuned.stderr)
    gpu, port = lspci_block(root, handbuilt.GPU), lspci_block(root, handbuilt.ROOT_PORT)
    assert "MaxPayload 256 bytes, MaxReadReq 4096 bytes" in gpu
    assert re.search(r"ACSCtl:\s+SrcValid\+ TransBlk\+ ReqRedir- CmpltRedir- UpstreamFwd\+ EgressCtrl-", port)
    cpu = "sys/devices/system/cpu/"
    assert [read(root, cpu + "cpu%d/cpuidle/state%d/disable" % (i, s)) for i in range(3) for s in range(3)] == \
        ["0", "0", "1"] * 3
    assert {read(root, cpu + "cpufreq/policy%d/scaling_governor" % i) for i in range(3)} == {"performance"}
    # The offline CPU has no idle states or policy to write: nothing appeared below it.
    assert sorted(os.listdir(os.path.join(root, cpu, "cpu%d" % handbuilt.OFFLINE_CPU))) == ["online", "topology"]
    assert read(root, "proc/sys/kernel/numa_balancing") == "0"
    assert read(root, "sys/kernel/mm/transparent_hugepage/enabled") == "always [madvise] never"

    rerun = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(rerun)
    assert rerun.recap[HOST]["changed"] == 0

    persisted = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert_ok(persisted)
    assert "amd_pstate=active" in read(root, "etc/default/grub.d/60-gpunode-tuning.cfg")
    assert read(root, handbuilt.ADMIN_DROPIN) == "GRUB_TIMEOUT=1"

    assert_ok(run_playbook("verify.yml", inventory))
    assert states(reports)["cpufreq.driver"] == "pending_reboot"
    assert "drifted" not in states(reports).values()

    assert_ok(run_playbook("rollback.yml", inventory))
    assert tree_changes(original, snapshot(root)) == []
    again = run_playbook("verify.yml", inventory)
    assert again.returncode == 2 and "12 drifted" in failure_summary(again, HOST)
