"""The node root and the journal through the playbooks: a node that cannot be read is never
verified as passing, and a journal path that leaves the root is refused with nothing written.

Before: verify.yml on a root that does not exist reported "1 pass, 0 fail" (rc 0), and tune.yml
wrote the journal outside the root, so rollback then restored nothing (rc 0).
"""

from __future__ import annotations

import json
import os

from support.inventory import write_inventory
from support.nodes import assert_host_untouched, build_node
from support.playbooks import run_playbook
from support.trees import snapshot, tree_changes


def test_verify_fails_a_root_that_does_not_exist(tmp_path):
    root = str(tmp_path / "no-such-node")
    reports = tmp_path / "reports"
    inv = write_inventory(tmp_path / "inv.yml", {"ghost": root})
    proc = run_playbook("verify.yml", inv, "-e", "gpunode_tuning_report_dir=%s" % reports)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert proc.recap["ghost"]["failed"] == 1
    result = json.loads((reports / "ghost.json").read_text())
    assert result["status"] == "error"
    assert any("root %s does not exist" % root in f for f in result["failures"]), result["failures"]
    summary = (reports / "fleet-summary.md").read_text()
    assert "1 pass" not in summary and "ghost" in summary
    assert not os.path.exists(root)


def test_a_journal_path_outside_the_root_is_refused_and_nothing_is_written(tmp_path):
    root = build_node(tmp_path / "node", "audited-epyc-8gpu", cpus=4, gpus=2)
    escape = "/../outside/var/lib/gpunode-tuning/journal.json"
    inv = write_inventory(tmp_path / "inv.yml", {"node": root}, gpunode_tuning_journal=escape)
    before = snapshot(root)
    proc = run_playbook("tune.yml", inv, "--tags", "runtime")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    # The role's precheck refuses it before any task runs on the node (the modules' own refusal,
    # "journal path ... resolves to ..., outside the node root", is covered by tests/unit/test_journal.py).
    assert "value of gpunode_tuning_journal must be an absolute path on the node without '..' components" in out
    assert escape in out
    assert not os.path.exists(tmp_path / "outside")  # before: the journal was written here
    assert tree_changes(before, snapshot(root)) == []
    assert_host_untouched()
