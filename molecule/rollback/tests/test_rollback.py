# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Scenario ``rollback``: runtime and persistent tuning, then playbooks/rollback.yml."""

from __future__ import annotations

from support.molecule import GPU_BDFS, PRISTINE


def test_node_back_to_its_original_bytes(node):
    # The kernel log only grows (nvidia_peermem's failed load): no rollback can take lines back.
    assert sorted(node.changed_paths() - {"dev/kmsg"}) == []


def test_kernel_log_only_grew(node):
    pristine = node.host.file(PRISTINE + "/dev/kmsg").content_string
    assert node.read("dev/kmsg").startswith(pristine)


def test_gpus_back_at_mrrs_512(node):
    mrrs = node.lspci_mrrs()
    assert {bdf: mrrs[bdf] for bdf in GPU_BDFS} == {bdf: 512 for bdf in GPU_BDFS}


def test_no_file_of_the_collection_left(node):
    leftovers = node.host.run("find %s -name '*gpunode-tuning*'", node.root)
    assert leftovers.rc == 0
    assert leftovers.stdout.split() == []


def test_unit_not_enabled(node):
    state = node.host.run("systemctl --root=%s is-enabled gpunode-tuning-boot.service", node.root)
    assert state.stdout.strip() != "enabled"


def test_guard_timer_not_enabled(node):
    state = node.host.run("systemctl --root=%s is-enabled gpunode-tuning-guard.timer", node.root)
    assert state.stdout.strip() != "enabled"
    assert not node.exists("etc/systemd/system/timers.target.wants/gpunode-tuning-guard.timer")
