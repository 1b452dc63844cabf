"""ACS redirect through the role, with the default preset: check mode writes nothing, runtime tuning
clears redirect on the GPUs' root ports only, verification then reports ACS applied and the GPU pairs'
P2P verdict (the simulated nvidia-smi, which answers CNS while redirect is on) turned from failing to
OK, a rerun changes nothing, and rollback puts every byte of config space back."""

from __future__ import annotations

import json
import os
import struct

from simnode import nccl as simnode_nccl
from support.inventory import REPORT_DIR, write_inventory
from support.nodes import build_node
from support.playbooks import assert_ok, run_playbook
from support.trees import snapshot, tree_changes


def acs_ctl(root, bdf):
    """ACS Control of a bridge: the extended capability list walked from 0x100 to id 0x000D."""
    with open(os.path.join(root, "sys/bus/pci/devices", bdf, "config"), "rb") as fh:
        cfg = fh.read()
    pos = 0x100
    while pos:
        header = struct.unpack_from("<I", cfg, pos)[0]
        if header & 0xFFFF == 0x000D:
            return struct.unpack_from("<H", cfg, pos + 6)[0]
        pos = header >> 20
    raise AssertionError("%s has no ACS capability" % bdf)


def verify(inventory, host):
    """verify.yml's JSON report of ``host``: {setting id: state} of the ACS and P2P families."""
    run_playbook("verify.yml", inventory)
    with open(os.path.join(REPORT_DIR, "%s.json" % host), encoding="utf-8") as fh:
        report = json.load(fh)
    return {s["id"]: s["state"] for s in report["settings"] if s["family"] in ("pcie_acs", "gpu_p2p")}


def test_runtime_disables_redirect_on_gpu_paths_and_rollback_restores(tmp_path):
    root = build_node(tmp_path / "node", gpus=2, cpus=8, nvidia_smi=True)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-acs": root})  # the preset's disable_redirect
    before = snapshot(root)
    gpu_ports = ("0000:40:01.1", "0000:60:01.1")

    untuned = verify(inventory, "sim-acs")
    assert [untuned["pcie_acs.%s" % bdf] for bdf in gpu_ports] == ["drifted", "drifted"]
    assert untuned["gpu_p2p.GPU0-GPU1"] == "drifted"  # CNS: the bridges redirect peer traffic

    check = run_playbook("tune.yml", inventory, "--tags", "runtime", "--check")
    assert check.returncode == 0, check.stdout[-4000:]
    assert tree_changes(before, snapshot(root)) == []

    first = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(first)
    # The GPUs' root ports lose ReqRedir/CmpltRedir; the NIC's and NVMe's keep every bit.
    assert {bdf: acs_ctl(root, bdf) for bdf in ("0000:40:01.1", "0000:60:01.1", "0000:c0:03.1", "0000:e0:03.1")} \
        == {"0000:40:01.1": 0x0011, "0000:60:01.1": 0x0011, "0000:c0:03.1": 0x001D, "0000:e0:03.1": 0x001D}
    assert "redirect disabled on 2 bridge(s)" in first.stdout

    tuned = verify(inventory, "sim-acs")
    assert [tuned["pcie_acs.%s" % bdf] for bdf in gpu_ports] == ["applied", "applied"]
    assert tuned.get("gpu_p2p.pairs") == "applied" and "gpu_p2p.GPU0-GPU1" not in tuned, tuned

    second = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(second)
    assert second.recap["sim-acs"]["changed"] == 0, second.stdout[-4000:]

    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    assert tree_changes(before, snapshot(root)) == []

    # Issue 44: NCCL's verdict through the role's variables, on the same node (the stand-in prints a real run of
    # 8 L20s connected through host memory): each pair NCCL sent via SHM fails, the bus bandwidth floor named.
    path = "/" + simnode_nccl.write(root, "shm").lstrip("/")
    run_playbook("verify.yml", inventory, "-e", "gpunode_tuning_gpu_p2p_nccl_tests=%s" % path,
                 "-e", "gpunode_tuning_gpu_p2p_min_busbw_gbps=20")
    with open(os.path.join(REPORT_DIR, "sim-acs.json"), encoding="utf-8") as fh:
        nccl = {s["name"]: s for s in json.load(fh)["settings"] if s["name"].startswith("nccl")}
    assert nccl["nccl.GPU0-GPU4"]["state"] == "drifted" and "SHM/direct/direct" in nccl["nccl.GPU0-GPU4"]["reason"]
    assert nccl["nccl"]["state"] == "drifted" and "printed no result table" in nccl["nccl"]["reason"]
    assert simnode_nccl.calls(root) == ["NCCL_DEBUG=INFO -b 8 -e 1G -f 2 -g 2"]
