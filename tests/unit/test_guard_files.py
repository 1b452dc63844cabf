"""The persistent flow's guard concern (flows/guard_files.py) through tuning_persist, as the role runs it: no
node_exporter yet, the guard turned off, a textfile directory changed before rollback, errors that name path and
errno."""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils import basic
from support.trees import snapshot, tree_changes

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot, guard_files

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
SETTINGS = {"boot_python": "/usr/bin/python3", "boot_script": "/usr/local/lib/gpunode-tuning/apply-boot-tuning.sh",
            "guard_enabled": True, "guard_textfile_dir": TEXTFILE_DIR, "guard_interval": "5min",
            "guard_reapply": False, "journal": JOURNAL}


@pytest.fixture
def runner_src(tmp_path_factory):
    path = tmp_path_factory.mktemp("runner") / "gpunode-tuning-boot.py"
    path.write_text(boot.runner_text(boot.carried_sources(os.path.join(REPO, "plugins", "module_utils"))))
    return str(path)


@pytest.fixture
def warnings(monkeypatch):
    said = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, msg: said.append(msg))
    return said


@pytest.fixture
def persist(run_module, runner_src):
    def _persist(root, state="present", check=False, concerns=("guard",), **settings):
        args = {"state": state, "concerns": list(concerns), "settings": dict(SETTINGS, **settings), "root": root,
                "journal": JOURNAL}
        if state == "present":
            args.update(runner_src=runner_src, desired={})
        result, failed = run_module("tuning_persist", args, check=check)
        assert not failed, result
        return result["concerns"]["guard"], result["changed"]
    return _persist


def journal(root):
    with open(os.path.join(root, JOURNAL.lstrip("/")), encoding="utf-8") as fh:
        return json.load(fh)


def test_no_textfile_directory_installs_the_guard_with_metrics_off_said_once(build_node, persist, warnings):
    root = build_node()
    before = snapshot(root)
    result, changed = persist(root)
    assert changed and result["metrics"] == "off until %s exists" % TEXTFILE_DIR, result
    assert len(warnings) == 1 and "gpunode_tuning_guard_textfile_dir" in warnings[0], warnings
    assert "install prometheus-node-exporter" in warnings[0] and TEXTFILE_DIR in warnings[0]
    assert os.path.isfile(os.path.join(root, guard_files.TIMER_PATH.lstrip("/")))
    assert not os.path.exists(os.path.join(root, TEXTFILE_DIR.lstrip("/")))  # never created by us
    assert journal(root)["written"] == {"guard_textfile": [TEXTFILE_DIR + "/gpunode-tuning.prom"]}
    again, changed = persist(root)
    assert not changed and again["metrics"] == result["metrics"]
    persist(root, state="absent")
    assert tree_changes(before, snapshot(root)) == [], tree_changes(before, snapshot(root))


def test_rollback_removes_the_prom_where_the_journal_says_it_was_written(build_node, persist):
    root = build_node()
    old_dir = os.path.join(root, TEXTFILE_DIR.lstrip("/"))
    os.makedirs(old_dir)
    before = snapshot(root)
    result, _changed = persist(root)
    assert result["metrics"] == "on"
    with open(os.path.join(old_dir, "gpunode-tuning.prom"), "w", encoding="utf-8") as fh:
        fh.write("gpunode_tuning_guard_last_run_success 1\n")  # as the guard's runs write it
    # The operator points the variable elsewhere and rolls back: the old directory's .prom goes all the same.
    persist(root, state="absent", concerns=("guard", "boot_unit"), guard_textfile_dir="/srv/node-exporter")
    assert tree_changes(before, snapshot(root)) == [], tree_changes(before, snapshot(root))


def test_a_changed_textfile_directory_moves_the_prom(build_node, persist):
    root = build_node()
    for directory in (TEXTFILE_DIR, "/srv/textfiles"):
        os.makedirs(os.path.join(root, directory.lstrip("/")))
    persist(root)
    old = os.path.join(root, TEXTFILE_DIR.lstrip("/"), "gpunode-tuning.prom")
    with open(old, "w", encoding="utf-8") as fh:
        fh.write("x 1\n")
    result, changed = persist(root, guard_textfile_dir="/srv/textfiles")
    assert changed and result["textfile_dir"] == "/srv/textfiles" and not os.path.exists(old)
    assert journal(root)["written"] == {"guard_textfile": ["/srv/textfiles/gpunode-tuning.prom"]}


def test_turning_the_guard_off_removes_an_installed_one(build_node, persist):
    root = build_node()
    before = snapshot(root)
    persist(root)
    result, changed = persist(root, check=True, guard_enabled=False)
    assert changed and os.path.isfile(os.path.join(root, guard_files.CONFIG_PATH.lstrip("/")))  # check: nothing gone
    result, changed = persist(root, guard_enabled=False)
    assert changed and result["summary"] == "removed: gpunode_tuning_guard_enabled is false", result
    assert tree_changes(before, snapshot(root)) == [], tree_changes(before, snapshot(root))
    result, changed = persist(root, guard_enabled=False)
    assert not changed and result["skipped"]


def test_a_textfile_directory_that_cannot_be_listed_names_the_path_and_errno(build_node, persist, run_module,
                                                                             monkeypatch):
    root = build_node()
    os.makedirs(os.path.join(root, TEXTFILE_DIR.lstrip("/")))
    persist(root)
    listdir = os.listdir

    def refuse(path):
        if path.rstrip("/").endswith("node-exporter"):
            raise PermissionError(13, "Permission denied", path)
        return listdir(path)

    monkeypatch.setattr(os, "listdir", refuse)
    result, failed = run_module("tuning_persist", {"state": "absent", "concerns": ["guard"], "settings": SETTINGS,
                                                   "root": root, "journal": JOURNAL})
    msg = result["concerns"]["guard"]["msg"]
    assert failed and "a bug" not in msg
    assert msg == "guard: cannot list %s: Permission denied (errno EACCES); nothing more was removed" % TEXTFILE_DIR
