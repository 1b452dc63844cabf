"""ACS redirect through the role: runtime tuning clears it on the GPUs' root ports only, a rerun
changes nothing, and rollback puts every byte of config space back."""

from __future__ import annotations

import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_playbooks import (  # noqa: E402  (the playbook helpers of the tune/rollback tests)
    assert_ok,
    build_node,
    run_playbook,
    snapshot,
    tree_changes,
    write_inventory,
)


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


def test_runtime_disables_redirect_on_gpu_paths_and_rollback_restores(tmp_path):
    root = build_node(tmp_path / "node", gpus=2, cpus=8)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-acs": root}, gpunode_tuning_acs="disable_redirect")
    before = snapshot(root)

    first = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(first)
    assert {bdf: acs_ctl(root, bdf) for bdf in ("0000:40:01.1", "0000:60:01.1", "0000:c0:03.1", "0000:e0:03.1")} \
        == {"0000:40:01.1": 0x0011, "0000:60:01.1": 0x0011, "0000:c0:03.1": 0x001D, "0000:e0:03.1": 0x001D}
    assert "redirect disabled on 2 bridge(s)" in first.stdout

    second = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(second)
    assert second.recap["sim-acs"]["changed"] == 0, second.stdout[-4000:]

    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    assert tree_changes(before, snapshot(root)) == []
