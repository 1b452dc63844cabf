"""One inventory, one preset, an NVIDIA and an AMD Instinct node (issue 32): the preset's kernel arguments are chosen
on each node by its GPUs' vendor, and the AMD GPU settings are applied, verified and rolled back through the role.

``inference-throughput`` adds ``pci=realloc=off`` (AMD's MI300X system optimization guide) on the MI300X node only;
the NVIDIA node's drop-in holds what it held before (``iommu=pt`` comes from ``gpunode_tuning_iommu_mode`` on both).
The AMD perf level set by its role variable is verified per GPU, and a compute partition that differs is drifted
and never changed.
"""

from __future__ import annotations

import json
import os

import simnode
from support.inventory import write_inventory
from support.playbooks import assert_ok, run_playbook
from support.trees import snapshot, tree_changes

DROPIN = "etc/default/grub.d/60-gpunode-tuning.cfg"
PRESET = ("-e", "gpunode_tuning_preset=inference-throughput", "-e", "gpunode_tuning_iommu_mode=passthrough")


def _read(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as fh:
        return fh.read()


def _report(tmp_path, host):
    with open(os.path.join(str(tmp_path / "reports"), "%s.json" % host), encoding="utf-8") as fh:
        return {s["id"]: s for s in json.load(fh)["settings"]}


def test_one_preset_adds_pci_realloc_off_on_the_amd_node_only_and_rolls_back(tmp_path):
    roots = {"nvidia": str(tmp_path / "nvidia"), "mi300x": str(tmp_path / "mi300x")}
    simnode.build(roots["nvidia"], "audited-epyc-8gpu", cpus=4, nvidia_smi=True)
    simnode.build(roots["mi300x"], "mi300x-epyc-8gpu", cpus=4, amd_smi=True)
    inventory = write_inventory(str(tmp_path / "hosts.yml"), roots, report_dir=str(tmp_path / "reports"))
    before = {h: snapshot(r) for h, r in roots.items()}

    check = run_playbook("tune.yml", inventory, "--tags", "persistent", "--check", *PRESET)
    assert_ok(check)
    assert {h: tree_changes(before[h], snapshot(r)) for h, r in roots.items()} == {"nvidia": [], "mi300x": []}

    persistent = run_playbook("tune.yml", inventory, "--tags", "persistent", *PRESET)
    assert_ok(persistent)
    amd, nvidia = _read(roots["mi300x"], DROPIN), _read(roots["nvidia"], DROPIN)
    assert "pci=realloc=off" in amd and "iommu=pt" in amd, amd
    assert "pci=realloc=off" not in nvidia and "iommu=pt" in nvidia, nvidia
    again = run_playbook("tune.yml", inventory, "--tags", "persistent", *PRESET)
    assert_ok(again)
    assert again.recap["mi300x"]["changed"] == 0 and again.recap["nvidia"]["changed"] == 0, again.stdout[-4000:]

    verify = run_playbook("verify.yml", inventory, *PRESET)
    rows = {h: _report(tmp_path, h) for h in roots}
    assert rows["mi300x"]["kernel_cmdline.pci=realloc=off"]["state"] == "pending_reboot", verify.stdout[-3000:]
    assert not any("realloc" in i for i in rows["nvidia"]), sorted(rows["nvidia"])

    rollback = run_playbook("rollback.yml", inventory, *PRESET)  # the IOMMU mode's arguments are removed as told
    assert_ok(rollback)
    assert {h: tree_changes(before[h], snapshot(r)) for h, r in roots.items()} == {"nvidia": [], "mi300x": []}


def _levels(root):
    with open(os.path.join(root, simnode.AMD_SMI_STATE), encoding="utf-8") as fh:
        metric = json.loads(json.load(fh)["answers"]["metric"])["gpu_data"]
    return {m["perf_level"] for m in metric}


def test_the_amd_perf_level_variable_applies_verifies_and_rolls_back_and_partitions_are_only_verified(tmp_path):
    root = str(tmp_path / "mi300x")
    simnode.build(root, "mi300x-epyc-8gpu", cpus=4, amd_smi=True)
    inventory = write_inventory(str(tmp_path / "hosts.yml"), {"mi300x": root}, report_dir=str(tmp_path / "reports"))
    before = snapshot(root)
    level = ("-e", "gpunode_tuning_gpu_settings_perf_level=stable_peak",
             "-e", "gpunode_tuning_gpu_settings_memory_partition=NPS1")
    check = run_playbook("tune.yml", inventory, "--tags", "runtime", "--check", *level)
    assert_ok(check)
    assert _levels(root) == {"AMDSMI_DEV_PERF_LEVEL_AUTO"} and tree_changes(before, snapshot(root)) == []
    runtime = run_playbook("tune.yml", inventory, "--tags", "runtime", *level)
    assert_ok(runtime)
    assert _levels(root) == {"AMDSMI_DEV_PERF_LEVEL_STABLE_PEAK"}, runtime.stdout[-3000:]
    again = run_playbook("tune.yml", inventory, "--tags", "runtime", *level)
    assert_ok(again)
    assert again.recap["mi300x"]["changed"] == 0, again.stdout[-4000:]

    run_playbook("verify.yml", inventory, *level, "-e", "gpunode_tuning_gpu_settings_compute_partition=CPX")
    rows = _report(tmp_path, "mi300x")
    assert rows["gpu_settings.perf_level"]["state"] == "applied" and rows["gpu_settings.perf_level"]["vendor"] == "amd"
    assert rows["gpu_settings.memory_partition"]["state"] == "applied"
    partition = rows["gpu_settings.compute_partition"]
    assert partition["state"] == "drifted" and partition["vendor"] == "amd"
    assert "GPU 0 (0000:05:00.0): SPX, wanted CPX" in partition["reason"]
    assert "amd-smi set -g 0 1 2 3 4 5 6 7 --compute-partition CPX" in partition["reason"]

    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    assert tree_changes(before, snapshot(root)) == []
