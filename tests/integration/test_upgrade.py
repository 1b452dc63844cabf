"""Nodes tuned by an earlier release keep working with this one (issues 24 and 29).

Each earlier tree tunes a simulated node: runtime, persistent and verify, as its untagged tune.yml does.
Then this tree verifies that node, its boot runner re-applies the old desired.json on a fresh node, the
old udev rule's command line runs this release's runner for a hot-added GPU, and this tree's rollback
restores the old journal and removes every file the old release wrote, leaving the tree as it was before
(the kernel log aside). The earlier trees:

- 1752866: the last commit before the role was driven by the registry and module_utils moved into
  families/ (issue 24);
- c50e7c8: the last commit before the layers became packages and each family got one name (issue 29:
  ``cmdline`` was the command-line family's report name, the udev rule called ``--only-mrrs``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest
from support.checkout import REPO, VENV_BIN
from support.inventory import REPORT_DIR, write_inventory
from support.nodes import (
    BOOT_DESIRED,
    JOURNAL,
    assert_host_untouched,
    build_node,
    cstate_disabled,
    inject_drift,
    read_mrrs,
)
from support.playbooks import assert_ok, run_playbook
from support.trees import snapshot, tree_changes

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot

PREVIOUS = ("1752866", "c50e7c8")
UDEV_RULE = "etc/udev/rules.d/70-gpunode-tuning.rules"


@pytest.fixture(scope="module", params=PREVIOUS)
def previous_tree(request, tmp_path_factory):
    """An earlier release's tree (git archive of the commit) and a collections path that holds it."""
    commit = request.param
    known = subprocess.run(["git", "-C", REPO, "cat-file", "-e", commit + "^{commit}"], capture_output=True,
                           check=False, timeout=60)
    if known.returncode != 0:
        pytest.skip("this clone does not hold commit %s (a shallow clone): nothing to upgrade from" % commit)
    base = tmp_path_factory.mktemp("previous-" + commit)
    tree = base / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", REPO, "archive", commit], capture_output=True, check=True, timeout=120)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=120)
    collections = base / "collections" / "ansible_collections" / "gpunode"
    collections.mkdir(parents=True)
    os.symlink(str(tree), str(collections / "tuning"))
    return str(tree), str(base / "collections")


def run_previous(previous, playbook, inventory, *args):
    """A playbook of the previous tree, with its own collection and ansible.cfg."""
    tree, collections = previous
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
               ANSIBLE_COLLECTIONS_PATH=collections, ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CONFIG", None)
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", inventory, os.path.join(tree, "playbooks", playbook),
           "-e", "gpunode_tuning_report_dir=%s" % REPORT_DIR, *args]
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_a_node_tuned_by_the_previous_release_is_verified_reapplied_and_rolled_back(tmp_path, previous_tree):
    root = build_node(tmp_path / "node")
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-upgrade": root})
    before = snapshot(root)

    old = run_previous(previous_tree, "tune.yml", inventory)  # runtime, persistent, verify
    assert_ok(old)
    assert read_mrrs(root, "0000:41:00.0") == 4096
    assert os.path.isfile(os.path.join(root, JOURNAL))
    assert os.path.isfile(os.path.join(root, BOOT_DESIRED.lstrip("/")))

    # This release reads what the previous one left: verification passes on the tuned node.
    verify = run_playbook("verify.yml", inventory)
    assert_ok(verify)

    # Its boot runner reads the previous release's desired.json and tunes a fresh node with it.
    fresh = build_node(tmp_path / "fresh", cpus=8, gpus=2)
    desired = os.path.join(fresh, BOOT_DESIRED.lstrip("/"))
    os.makedirs(os.path.dirname(desired), exist_ok=True)
    with open(os.path.join(root, BOOT_DESIRED.lstrip("/")), encoding="utf-8") as src, \
            open(desired, "w", encoding="utf-8") as dst:
        dst.write(src.read())
    runner = tmp_path / "runner.py"
    runner.write_text(boot.runner_text(boot.carried_sources(os.path.join(REPO, "plugins", "module_utils"))))
    run = subprocess.run([os.path.join(VENV_BIN, "python"), "-I", "-B", str(runner), "--desired", BOOT_DESIRED,
                          "--root", fresh], capture_output=True, text=True, check=False, cwd="/", timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [read_mrrs(fresh, bdf) for bdf in ("0000:41:00.0", "0000:61:00.0")] == [4096, 4096]
    assert cstate_disabled(fresh, "C2") == set(range(8))

    # The old udev rule's command line (c50e7c8's calls --only-mrrs) with this release's runner, as udev
    # runs it for a hot-added GPU that came up at 512: that function only, set back to 4096.
    with open(os.path.join(root, UDEV_RULE), encoding="utf-8") as handle:
        run_key = re.search(r'RUN\+="([^"]+)"', handle.read())
    assert run_key, "the earlier release wrote no RUN key in its udev rule"
    rule_args = shlex.split(run_key.group(1).replace("%k", "0000:41:00.0"))
    options = rule_args[rule_args.index("--desired"):]
    inject_drift(root, "0000:41:00.0")
    inject_drift(root, "0000:61:00.0")
    hotplug = subprocess.run([os.path.join(VENV_BIN, "python"), "-I", "-B", str(runner), *options, "--root", root],
                             capture_output=True, text=True, check=False, cwd="/", timeout=120)
    assert hotplug.returncode == 0, hotplug.stdout + hotplug.stderr
    assert [read_mrrs(root, bdf) for bdf in ("0000:41:00.0", "0000:61:00.0")] == [4096, 512]
    with open(os.path.join(root, "proc/sys/kernel/numa_balancing"), "w", encoding="utf-8") as handle:
        handle.write("0\n")  # inject_drift's other half: what the journal holds for the node is unchanged

    # Its rollback restores the previous release's journal and removes every file it wrote.
    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    left = tree_changes(before, snapshot(root))
    assert left == [], left
    assert_host_untouched()
