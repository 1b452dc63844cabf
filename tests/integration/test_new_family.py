"""A new knob family costs at most 5 files: a throwaway one added to a copy of the tree, run through every flow.

The tracked tree is copied to a temporary directory (a git repository of its own). The family
``zone_reclaim`` (vm.zone_reclaim_mode, a /proc/sys value the simulated node has) is added by
touching only the files docs/dev/adding-a-family.md names: its file under families/, one line in
registry.py's NAMES, its variables in defaults/main.yml and meta/argument_specs.yml (it has no module
of its own). tools/generate.py rewrites what is derived from the registry; ``git status`` must show
nothing else. Then the copy's own playbooks run it on one simulated node through runtime,
persistent, the boot runner, verify, one guard run (with re-apply) and rollback, asserting the
family's own effect each time, and the copy's layout and generated-parts tests pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import generate
import simnode
import yaml
from support.checkout import REPO, VENV_BIN
from support.playbooks import RECAP
from support.trees import snapshot, tree_changes

NAME = "zone_reclaim"
KNOB = "proc/sys/vm/zone_reclaim_mode"
RUNNER = "usr/local/lib/gpunode-tuning/apply-boot-tuning.sh"
DESIRED = "/etc/gpunode-tuning/desired.json"
GUARD_STATUS = "var/lib/gpunode-tuning/guard-status.json"
# The files a family touches (docs/dev/adding-a-family.md, "Checklist"); generated files are not counted.
FAMILY_FILE = "plugins/module_utils/families/%s.py" % NAME
TOUCHED = {FAMILY_FILE, "plugins/module_utils/registry.py", "roles/tuning/defaults/main.yml",
           "roles/tuning/meta/argument_specs.yml"}
# Not counted (docs/dev/adding-a-family.md): the family's own unit test file, which test_layout asks for.
UNIT_TEST = "tests/unit/test_%s.py" % NAME
UNIT_TEST_SOURCE = '''"""The zone_reclaim family: its facts on a simulated node."""

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import zone_reclaim


def test_the_family_is_registered_and_reads_the_knob(build_node):
    root = build_node("tiny-vm")
    assert zone_reclaim.NAME in [fam.name for fam in registry.FAMILIES]
    assert zone_reclaim.read(Node.open(root), {})["mode"] == 0
'''

FAMILY_SOURCE = '''# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vm.zone_reclaim_mode: a throwaway knob family (tests/integration/test_new_family.py)."""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import JOURNAL_ARGUMENT_SPEC, open_node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import NODE_ARGUMENT_SPEC, Node

NAME = "zone_reclaim"
PATH = "proc/sys/vm/zone_reclaim_mode"
FACTS_DOC = r"""
description: The running vm.zone_reclaim_mode.
returned: always
type: dict
contains:
  mode:
    description: C(/proc/sys/vm/zone_reclaim_mode); null when absent.
    type: int
    returned: always
    sample: 0
"""
ARGUMENT_SPEC = dict(mode=dict(type="int"), **JOURNAL_ARGUMENT_SPEC, **NODE_ARGUMENT_SPEC)


def desired_problems(want: Any) -> list:
    if want is None:
        return []
    mode = want.get("mode") if isinstance(want, dict) else None
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 7:
        return [("mode", "zone_reclaim.mode must be an integer 0-7, got %r" % (mode,))]
    return []


def _write(node: Node, mode: int) -> None:
    with open(node.path(PATH), "w", encoding="utf-8") as handle:
        handle.write("%d\\n" % mode)


def run(call: family.Call) -> dict:
    """Set (or with restore, put back) vm.zone_reclaim_mode, journaling the original first."""
    params = call.params
    node, journal = open_node(params)
    before = int(node.read(PATH))
    if params["restore"]:
        original = (journal.entries(NAME) if journal else {}).get("mode")
        want = before if original is None else int(original)
    else:
        want = params["mode"]
    changed = want != before
    result = {"changed": changed, "settings": {"vm.zone_reclaim_mode": {"before": before, "after": want,
                                                                        "changed": changed}}}
    if call.check_mode:
        return result
    if journal and not params["restore"] and changed:
        journal.record(NAME, "mode", before)
        journal.save()
    if changed:
        _write(node, want)
        if int(node.read(PATH)) != want:
            raise family.FamilyError("vm.zone_reclaim_mode did not take %d" % want, result)
    if journal:
        if params["restore"]:
            journal.drop(NAME, "mode")
        elif changed:
            journal.mark_applied(NAME)
        journal.save()
    return result


def read(node: Node, selector: Any = None, query: Any = None) -> dict:
    value = node.read(PATH, default="")
    return {"mode": int(value) if value.isdigit() else None}


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    want = desired.get(NAME)
    if not want:
        return []
    running = (facts.get(NAME) or {}).get("mode")
    state = "applied" if running == want["mode"] else "drifted"
    return [family.setting(NAME, "mode", want["mode"], running, state, "", ctx.boot_persisted(want["mode"]))]


def boot(node: Node, want: dict) -> tuple:
    _write(node, int(want["mode"]))
    return True, "vm.zone_reclaim_mode=%d" % int(want["mode"])


def from_role(v: dict, shared: dict) -> dict:
    on = v["gpunode_tuning_zone_reclaim_enabled"]
    return {NAME: {"mode": int(v["gpunode_tuning_zone_reclaim_mode"])} if on else None}


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "zone reclaim"},
    read=read,
    facts_doc=FACTS_DOC,
    run=run,
    evaluate=evaluate,
    boot=boot,
    from_role=from_role,
    runtime_options=lambda desired, v: dict(desired[NAME]) if desired.get(NAME) else None,
    restore_options=lambda v: {"restore": True},
    argument_spec=ARGUMENT_SPEC,
    validate={NAME: desired_problems},
)
'''
DEFAULTS = '''
# --- vm.zone_reclaim_mode (the throwaway family of tests/integration/test_new_family.py)
gpunode_tuning_zone_reclaim_enabled: false
gpunode_tuning_zone_reclaim_mode: 1
'''
SPECS = '''      gpunode_tuning_zone_reclaim_enabled:
        type: bool
        default: false
        description:
          - Set C(vm.zone_reclaim_mode) now and at every boot, and verify it.
      gpunode_tuning_zone_reclaim_mode:
        type: int
        default: 1
        description:
          - The value of C(vm.zone_reclaim_mode), 0 to 7.
'''


def git(tree, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tree, check=True,
                          capture_output=True, text=True).stdout


def copy_tree(dest):
    """The tracked (and untracked, not ignored) files of this checkout, in a git repository of their own."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = os.path.join(REPO, name)
        if os.path.lexists(src) and not os.path.isdir(src):
            os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, name), follow_symlinks=False)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "copy")
    os.makedirs(os.path.join(dest, ".collections", "ansible_collections", "gpunode"))
    os.symlink(dest, os.path.join(dest, ".collections", "ansible_collections", "gpunode", "tuning"))


def edit(tree, path, old, new):
    full = os.path.join(tree, path)
    with open(full, encoding="utf-8") as handle:
        text = handle.read()
    assert text.count(old) == 1, (path, old)
    with open(full, "w", encoding="utf-8") as handle:
        handle.write(text.replace(old, new))


def add_family(tree):
    """The checklist of docs/dev/adding-a-family.md, for a family without a module of its own."""
    with open(os.path.join(tree, FAMILY_FILE), "w", encoding="utf-8") as handle:
        handle.write(FAMILY_SOURCE)
    # One line in NAMES; tools/generate.py writes the family into the registry's import (its generated block).
    edit(tree, "plugins/module_utils/registry.py", '    "gpu_locality",\n)',
         '    "gpu_locality",\n    "zone_reclaim",\n)')
    with open(os.path.join(tree, "roles/tuning/defaults/main.yml"), "a", encoding="utf-8") as handle:
        handle.write(DEFAULTS)
    edit(tree, "roles/tuning/meta/argument_specs.yml", "    options: &options\n", "    options: &options\n" + SPECS)
    with open(os.path.join(tree, UNIT_TEST), "w", encoding="utf-8") as handle:
        handle.write(UNIT_TEST_SOURCE)


def run(tree, argv, **kw):
    return subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False, timeout=600, **kw)


def playbook(tree, name, inventory, *args):
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(tree, ".collections"))
    env.pop("ANSIBLE_CONFIG", None)
    proc = run(tree, [os.path.join(VENV_BIN, "ansible-playbook"), "-i", inventory,
                      os.path.join(tree, "playbooks", name), *args], env=env)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    proc.recap = {m.group(1): int(m.group(3)) for m in RECAP.finditer(proc.stdout)}
    return proc


def knob(root):
    with open(os.path.join(root, KNOB), encoding="utf-8") as handle:
        return handle.read().strip()


def set_knob(root, value):
    with open(os.path.join(root, KNOB), "w", encoding="utf-8") as handle:
        handle.write(value + "\n")


def tree_with_the_family(tmp_path):
    """A copy of the tree with the family added by the checklist and generate.py run: only those files changed."""
    tree = str(tmp_path / "tree")
    copy_tree(tree)
    add_family(tree)
    python = os.path.join(VENV_BIN, "python")
    gen = run(tree, [python, "tools/generate.py"])
    assert gen.returncode == 0, gen.stdout + gen.stderr
    status = {line[3:] for line in git(tree, "status", "--porcelain", "--untracked-files=all").splitlines()}
    generated = {path for _name, path, _render, _kind in generate.all_parts()}  # what the one command rewrites
    assert TOUCHED <= status and status - TOUCHED - {UNIT_TEST} <= generated, sorted(status)
    assert {"docs/variables.md", "plugins/modules/tuning_info.py"} <= status  # its variables, its facts section
    counted = {p for p in TOUCHED if p.split("/")[0] in ("plugins", "roles", "playbooks", "meta")}
    assert len(counted) <= 5
    assert run(tree, [python, "tools/generate.py", "--check"]).returncode == 0
    # The copy's own checks hold with the family in: no family named outside its files, nothing stale.
    checks = run(tree, [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_layout.py",
                        "tests/unit/test_generate.py", UNIT_TEST])
    assert checks.returncode == 0, checks.stdout[-4000:]
    return tree


def check_boot_and_verify(tree, tmp_path, root):
    """The boot runner re-applies it on a fresh node (``--only`` the family); verify reports it applied."""
    python = os.path.join(VENV_BIN, "python")
    fresh = str(tmp_path / "fresh")
    simnode.build(fresh, "audited-epyc-8gpu", cpus=2, gpus=1)
    os.makedirs(os.path.join(fresh, os.path.dirname(DESIRED.lstrip("/"))))
    shutil.copy(os.path.join(root, DESIRED.lstrip("/")), os.path.join(fresh, DESIRED.lstrip("/")))
    boot = run("/", [python, "-I", "-B", os.path.join(root, RUNNER), "--desired", DESIRED, "--root", fresh,
                     "--only", NAME])
    assert boot.returncode == 0 and "%s: vm.zone_reclaim_mode=1" % NAME in boot.stdout, boot.stdout + boot.stderr
    assert knob(fresh) == "1"
    playbook(tree, "verify.yml", str(tmp_path / "hosts.yml"))
    with open(tmp_path / "reports" / "sim-new.json", encoding="utf-8") as handle:
        report = json.load(handle)
    row = next(s for s in report["settings"] if s["family"] == NAME)
    assert (row["id"], row["state"], row["running"], row["persisted"]) == ("%s.mode" % NAME, "applied", 1, 1)
    assert report["families"][NAME]["applied"] == 1


def check_guard(root):
    """One guard run with re-apply: the drifted knob is set back, counted, and verified applied."""
    python = os.path.join(VENV_BIN, "python")
    set_knob(root, "3")
    guard = run("/", [python, "-I", "-B", os.path.join(root, RUNNER), "guard", "--config",
                      "/etc/gpunode-tuning/guard.json", "--root", root])
    assert guard.returncode == 0, guard.stdout + guard.stderr
    assert knob(root) == "1" and "re-applied %s" % NAME in guard.stdout
    with open(os.path.join(root, GUARD_STATUS), encoding="utf-8") as handle:
        status = json.load(handle)
    assert status["reapply"]["counts"] == {NAME: 1}
    assert next(s for s in status["settings"] if s["id"] == "%s.mode" % NAME)["state"] == "applied"


def test_a_throwaway_family_costs_four_files_and_runs_through_every_flow(tmp_path):
    tree = tree_with_the_family(tmp_path)
    python = os.path.join(VENV_BIN, "python")
    root = str(tmp_path / "node")
    simnode.build(root, "audited-epyc-8gpu", cpus=2, gpus=1)
    simnode.write_node_exporter_dir(root)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "children": {"gpunodes": {"hosts": {"sim-new": {"gpunode_tuning_root": root}}}},
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": python,
                 "gpunode_tuning_zone_reclaim_enabled": True, "gpunode_tuning_zone_reclaim_mode": 1,
                 "gpunode_tuning_guard_reapply": True,
                 "gpunode_tuning_report_dir": str(tmp_path / "reports")}}}))
    inventory = str(inventory)
    assert knob(root) == "0"
    before = snapshot(root)

    # Runtime: set now, the original journaled; a rerun changes nothing.
    playbook(tree, "tune.yml", inventory, "--tags", "runtime")
    assert knob(root) == "1"
    with open(os.path.join(root, "var/lib/gpunode-tuning/journal.json"), encoding="utf-8") as handle:
        assert json.load(handle)["families"][NAME]["mode"]["original"] == 0
    assert playbook(tree, "tune.yml", inventory, "--tags", "runtime").recap == {"sim-new": 0}

    # Persistent: the boot unit's desired state carries it; the boot runner re-applies it; verify; the guard.
    playbook(tree, "tune.yml", inventory, "--tags", "persistent")
    with open(os.path.join(root, DESIRED.lstrip("/")), encoding="utf-8") as handle:
        assert json.load(handle)[NAME] == {"mode": 1}
    check_boot_and_verify(tree, tmp_path, root)
    check_guard(root)

    # Rollback: the original back, every file gone, the tree as it was to the byte.
    playbook(tree, "rollback.yml", inventory)
    assert knob(root) == "0"
    assert tree_changes(before, snapshot(root)) == []
