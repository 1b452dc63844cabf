"""A GPU module's parameter that waits for a boot (issue 44), end to end on one simulated node.

uvm_disable_hmm=1 requested (gpunode_tuning_kmod_modules) where nvidia_uvm runs with HMM on (N): the module is
never unloaded, the options line is written, the persistent flow asks for a reboot, verification says
pending_reboot (not drifted), and rollback removes the line. (A second run keeps the file byte for byte: the unit
test of module_options.options_text; the boot that applies it: tests/unit/test_module_params.py.)
"""

from __future__ import annotations

import json
import os

import simnode
from support.inventory import write_inventory
from support.playbooks import assert_ok, run_playbook

OPTIONS = "etc/modprobe.d/gpunode-tuning-nvidia_uvm.conf"
HMM = "sys/module/nvidia_uvm/parameters/uvm_disable_hmm"


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read()


def test_uvm_disable_hmm_waits_for_a_boot(tmp_path):
    root = str(tmp_path / "node")
    simnode.build(root, "audited-epyc-8gpu", cpus=4, gpus=1)
    assert read(root, HMM).strip() == "N"
    reports = tmp_path / "reports"
    inv = write_inventory(tmp_path / "hosts.yml", {"sim-uvm": root}, reports,
                          gpunode_tuning_kmod_modules=[{"name": "nvidia_uvm", "params": {"uvm_disable_hmm": 1}}])

    tuned = run_playbook("tune.yml", inv, "--tags", "kmod")
    assert_ok(tuned)
    lines = [x for x in read(root, OPTIONS).splitlines() if not x.startswith("#")]
    assert lines == ["options nvidia_uvm uvm_disable_hmm=1"]
    assert "# boot_id %s " % read(root, "proc/sys/kernel/random/boot_id").strip() in read(root, OPTIONS)
    assert read(root, HMM).strip() == "N"  # never unloaded to apply it
    assert "the module parameters a loaded module takes at boot (nvidia_uvm.uvm_disable_hmm)" in tuned.stdout
    assert "nvidia_uvm.uvm_disable_hmm=1 (running N)" in tuned.stdout  # the persistent flow's summary

    verified = run_playbook("verify.yml", inv)
    result = json.loads((reports / "sim-uvm.json").read_text())
    row = next(s for s in result["settings"] if s["id"] == "kmod.nvidia_uvm.uvm_disable_hmm")
    assert (row["state"], row["desired"], row["running"], row["persisted"]) == ("pending_reboot", "Y", "N", "1"), row
    assert result["reboot_required"] is True and "kmod.nvidia_uvm.uvm_disable_hmm" in result["pending"]
    assert verified.returncode in (0, 2)  # other families are untuned here; this row is not what fails

    rolled = run_playbook("rollback.yml", inv, "--tags", "kmod")
    assert_ok(rolled)
    assert not os.path.exists(os.path.join(root, OPTIONS))
    assert not os.path.exists(os.path.join(root, "etc/modules-load.d/gpunode-tuning-nvidia_uvm.conf"))
