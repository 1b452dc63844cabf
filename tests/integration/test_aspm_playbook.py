"""PCIe ASPM through the role, with the default preset (policy performance, links off), on one simulated node whose
firmware enabled L1 on both GPU links (tools/simnode/aspm.py ``l1``): check mode writes nothing, ``tune.yml --tags
runtime`` sets the policy and clears ASPM on the GPU links (the link attributes and Link Control's ASPM field of both
ends), verification then reports every row applied, a second run changes nothing, and rollback puts every byte back."""

from __future__ import annotations

import json
import os
import struct

from support.inventory import REPORT_DIR, write_inventory
from support.nodes import build_node
from support.playbooks import assert_ok, run_playbook
from support.trees import snapshot, tree_changes

HOST = "sim-aspm"
GPUS = ("0000:41:00.0", "0000:61:00.0")
ROOT_PORTS = ("0000:40:01.1", "0000:60:01.1")
POLICY = "sys/module/pcie_aspm/parameters/policy"


def lnkctl_aspm(root, bdf):
    """ASPM Control (bits 1:0) of Link Control: the PCIe capability found from 0x34, then + 0x10."""
    with open(os.path.join(root, "sys/bus/pci/devices", bdf, "config"), "rb") as fh:
        cfg = fh.read()
    pos = cfg[0x34]
    while cfg[pos] != 0x10:
        pos = cfg[pos + 1]
    return struct.unpack_from("<H", cfg, pos + 0x10)[0] & 0x3


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read()


def verify(inventory):
    """verify.yml's JSON report: {setting id: state} of the pcie_aspm family (the host fails on its cpufreq driver,
    which needs a reboot on this node: the report is written before that)."""
    run_playbook("verify.yml", inventory)
    with open(os.path.join(REPORT_DIR, "%s.json" % HOST), encoding="utf-8") as fh:
        report = json.load(fh)
    return {s["id"]: s["state"] for s in report["settings"] if s["family"] == "pcie_aspm"}


def test_runtime_sets_the_policy_clears_gpu_link_aspm_verifies_and_rolls_back(tmp_path):
    root = build_node(tmp_path / "node", gpus=2, cpus=2, aspm="l1")
    inventory = write_inventory(tmp_path / "hosts.yml", {HOST: root})
    before = snapshot(root)
    assert {bdf: lnkctl_aspm(root, bdf) for bdf in GPUS + ROOT_PORTS} == dict.fromkeys(GPUS + ROOT_PORTS, 2)

    check = run_playbook("tune.yml", inventory, "--tags", "runtime", "--check")
    assert check.returncode == 0, check.stdout[-4000:]
    assert tree_changes(before, snapshot(root)) == []

    first = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(first)
    assert read(root, POLICY) == "default [performance] powersave powersupersave \n"
    assert [read(root, "sys/bus/pci/devices/%s/link/l1_aspm" % g) for g in GPUS] == ["0\n", "0\n"]
    assert {bdf: lnkctl_aspm(root, bdf) for bdf in GPUS + ROOT_PORTS} == dict.fromkeys(GPUS + ROOT_PORTS, 0)
    assert "3 written (policy, %s/l1_aspm, %s/l1_aspm)" % GPUS in first.stdout, first.stdout[-4000:]

    assert verify(inventory) == {"pcie_aspm.policy": "applied", "pcie_aspm.%s" % GPUS[0]: "applied",
                                 "pcie_aspm.%s" % GPUS[1]: "applied"}

    second = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(second)
    assert second.recap[HOST]["changed"] == 0, second.stdout[-4000:]

    assert_ok(run_playbook("rollback.yml", inventory))
    assert tree_changes(before, snapshot(root)) == []
