"""IOMMU passthrough and ACS redirect persisted as kernel arguments through the role: the persistent
run writes them to the GRUB drop-in, verification says pending_reboot, and after a simulated reboot
(the arguments on /proc/cmdline, identity groups, redirect cleared by the kernel) applied."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from support.inventory import REPORT_DIR, write_inventory
from support.nodes import build_node
from support.playbooks import assert_ok, run_playbook

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs_plan as acs_plan

DROPIN = "etc/default/grub.d/60-gpunode-tuning.cfg"
ACS_ARG = "pci=disable_acs_redir=0000:40:01.1;0000:60:01.1"
BRIDGES = ("pcie_acs.0000:40:01.1", "pcie_acs.0000:60:01.1")


def verify_states(inventory):
    run_playbook("verify.yml", inventory, "--limit", "sim-p2p")  # drifted families fail the host: read the report
    with open(os.path.join(REPORT_DIR, "sim-p2p.json")) as fh:
        settings = {s["id"]: s for s in json.load(fh)["settings"]}
    return {k: (settings[k]["state"], settings[k]["persisted"]) for k in ("iommu.mode",) + BRIDGES}


@pytest.mark.skipif(shutil.which("setpci") is None, reason="setpci (pciutils) is not installed")
def test_persistent_kernel_args_pending_until_the_reboot(tmp_path):
    root = build_node(tmp_path / "node", gpus=2, cpus=4, iommu="DMA-FQ")
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-p2p": root}, gpunode_tuning_iommu_mode="passthrough",
                                gpunode_tuning_pcie_acs="disable_redirect",
                                gpunode_tuning_pcie_acs_persist="kernel_arg")

    assert_ok(run_playbook("tune.yml", inventory, "--tags", "persistent"))
    with open(os.path.join(root, DROPIN)) as fh:
        line = fh.read().splitlines()[-1]
    # The families' arguments in registry order (pcie_acs, iommu, cpufreq): the IOMMU mode's are iommu's own
    # Family.kernel_args since 0.4 (they came last before, added by kernel_cmdline itself).
    assert line == ('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT '
                    "pci='disable_acs_redir=0000:40:01.1;0000:60:01.1' iommu=pt amd_pstate=active\""), line
    pending = ("pending_reboot", ACS_ARG)
    assert verify_states(inventory) == {"iommu.mode": ("pending_reboot", "iommu=pt"),
                                        BRIDGES[0]: pending, BRIDGES[1]: pending}

    # The reboot: both arguments on /proc/cmdline, identity default domains, redirect cleared.
    with open(os.path.join(root, "proc/cmdline")) as fh:
        cmdline = fh.read().strip()
    with open(os.path.join(root, "proc/cmdline"), "w") as fh:
        fh.write("%s iommu=pt %s\n" % (cmdline, ACS_ARG))
    groups = os.path.join(root, "sys/kernel/iommu_groups")
    for n in os.listdir(groups):
        with open(os.path.join(groups, n, "type"), "w") as fh:
            fh.write("identity\n")
    assert acs_plan.boot(Node(root), {"mode": "disable_redirect", "allow_empty": True})[0]
    applied = ("applied", ACS_ARG)
    assert verify_states(inventory) == {"iommu.mode": ("applied", "iommu=pt"), BRIDGES[0]: applied,
                                        BRIDGES[1]: applied}

    assert_ok(run_playbook("rollback.yml", inventory))
    assert not os.path.exists(os.path.join(root, DROPIN))
