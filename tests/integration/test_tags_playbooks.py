"""The role's flows as Ansible's tags see them: --list-tags, --tags FAMILY, --skip-tags FAMILY, --skip-tags always.

Each flow is two tasks (roles/tuning/tasks, plugin_utils/tags.py): one that carries every tag of the flow's
families and concerns, one tagged with the flow's own tag; either way one module run. These runs check what a
user sees on a simulated node: which families changed the node, which did not, and what the run printed.
"""

from __future__ import annotations

import os
import re

import pytest
import yaml
from support.checkout import REPO
from support.inventory import write_inventory
from support.nodes import build_node, cstate_disabled, read_mrrs
from support.playbooks import assert_ok, run_playbook

GPU = "0000:41:00.0"
SYSCTL_DROPIN = "etc/sysctl.d/90-gpunode-tuning.conf"
GUARD_TIMER = "etc/systemd/system/gpunode-tuning-guard.timer"


@pytest.fixture
def node(tmp_path):
    root = build_node(tmp_path / "node", cpus=4, gpus=2)
    return root, write_inventory(tmp_path / "hosts.yml", {"sim-tags": root})


def swappiness(root):
    with open(os.path.join(root, "proc/sys/vm/swappiness"), encoding="utf-8") as handle:
        return int(handle.read())


def test_list_tags_shows_every_tag_that_selects_a_family_or_a_concern(node):
    _root, inventory = node
    listed = set()
    for playbook in ("tune.yml", "rollback.yml"):
        proc = run_playbook(playbook, inventory, "--list-tags")
        assert_ok(proc)
        for found in re.findall(r"TASK TAGS: \[([^\]]*)\]", proc.stdout):
            listed |= {t.strip() for t in found.split(",")}
    wanted = set()
    for name in ("runtime.yml", "persistent.yml", "rollback.yml"):  # the generated lists included
        with open(os.path.join(REPO, "roles", "tuning", "tasks", name), encoding="utf-8") as handle:
            wanted |= {t for task in yaml.safe_load(handle) for t in task.get("tags") or []}
    assert len(wanted) > 20 and wanted <= listed, wanted - listed
    # The flows' own tags too; no family name from before 1.0.0.
    assert {"runtime", "persistent", "rollback", "reboot"} <= listed
    assert not {"mrrs", "acs", "cstate", "cmdline", "locality"} & listed


def test_tags_a_family_runs_only_that_family(node):
    root, inventory = node
    proc = run_playbook("tune.yml", inventory, "--tags", "cpuidle")
    assert_ok(proc)
    assert cstate_disabled(root, "C2") == {0, 1, 2, 3}
    assert read_mrrs(root, GPU) == 512 and swappiness(root) == 60  # nothing else changed


def test_skip_tags_a_family_runs_every_other_family_of_the_flow(node):
    root, inventory = node
    proc = run_playbook("tune.yml", inventory, "--tags", "runtime,persistent", "--skip-tags", "pcie_mrrs,guard")
    assert_ok(proc)
    assert read_mrrs(root, GPU) == 512  # skipped
    assert cstate_disabled(root, "C2") == {0, 1, 2, 3} and swappiness(root) == 10  # the other runtime families
    assert os.path.exists(os.path.join(root, SYSCTL_DROPIN))  # the other persistent concerns
    assert not os.path.lexists(os.path.join(root, GUARD_TIMER))
    # A concern that serves the skipped family is skipped as a whole: the boot unit re-applies MRRS among
    # others (it writes one desired state for all), the udev rule only MRRS.
    assert not os.path.exists(os.path.join(root, "etc/gpunode-tuning/desired.json"))
    assert not os.path.exists(os.path.join(root, "etc/udev/rules.d/70-gpunode-tuning.rules"))


def test_skip_tags_always_still_checks_the_variables_and_runs_every_flow(node, tmp_path):
    root, inventory = node
    bad = write_inventory(tmp_path / "bad.yml", {"sim-tags": root}, gpunode_tuning_pcie_mrrs=300)
    proc = run_playbook("tune.yml", bad, "--skip-tags", "always")
    assert proc.returncode != 0
    assert "value of gpunode_tuning_pcie_mrrs must be one of: 128, 256, 512, 1024, 2048, 4096, got: 300" in (
        proc.stdout + proc.stderr)
    assert read_mrrs(root, GPU) == 512 and not os.path.exists(os.path.join(root, SYSCTL_DROPIN))

    proc = run_playbook("tune.yml", inventory, "--skip-tags", "always")
    assert_ok(proc)
    assert read_mrrs(root, GPU) == 4096 and os.path.exists(os.path.join(root, GUARD_TIMER))
    proc = run_playbook("rollback.yml", inventory, "--skip-tags", "always")
    assert_ok(proc)
    assert read_mrrs(root, GPU) == 512 and not os.path.lexists(os.path.join(root, GUARD_TIMER))
