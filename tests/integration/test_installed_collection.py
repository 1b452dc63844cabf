"""The collection as a user installs it, on the ansible-core under test (GPUNODE_ANSIBLE_BIN).

The tarball of ``ansible-galaxy collection build``, installed with ``ansible-galaxy collection
install`` into a collections path of its own, its playbooks run by their FQCNs from a directory
outside the checkout (no ansible.cfg of ours, no .collections link), against a simulated node:
the steps of docs/compatibility.md. The dependencies of galaxy.yml are the ones the environment
already has, as the ``ansible`` package from PyPI brings them: the install must accept them and
not ask Galaxy (unreachable here), which it only does while galaxy.yml's ranges hold them.

A second node's modules run with the managed node's floor Python of the ansible-core under test
where this machine has one (pyenv's): 3.8, the collection's own floor, up to 2.19; 3.9 from 2.20,
which dropped 3.8 on targets (its changelog; ``_PY_MIN`` in its module_utils/basic.py). So the
floor is held on every controller version. The version matrix (scripts/matrix.py) runs this file on
every supported ansible-core.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess

import pytest
import yaml
from support.checkout import REPO, VENV_BIN
from support.inventory import write_inventory
from support.nodes import JOURNAL, build_node, read_mrrs
from support.playbooks import RECAP
from support.trees import snapshot, tree_changes

GPUS = ["0000:41:00.0", "0000:61:00.0"]
DEPENDENCIES = ("ansible.posix", "ansible.utils", "community.general")


def node_floor():
    """The oldest managed-node Python of the ansible-core under test that the collection supports."""
    out = subprocess.run([os.path.join(VENV_BIN, "python"), "-c", "import ansible.release as r; print(r.__version__)"],
                         capture_output=True, text=True, check=True).stdout
    return "3.9" if tuple(int(part) for part in out.split(".")[:2]) >= (2, 20) else "3.8"


def python_at(minor):
    """A Python ``minor`` (``3.8``) that runs (a pyenv shim of a version not selected does not), or None."""
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/%s*/bin/python%s" % (minor, minor))))
    candidates = [shutil.which("python" + minor), *pyenv]
    want = tuple(int(part) for part in minor.split("."))
    for path in filter(None, candidates):
        probe = subprocess.run([path, "-c", "import sys; assert sys.version_info[:2] == %r" % (want,)],
                               capture_output=True, check=False)
        if probe.returncode == 0:
            return path
    return None


def fleet(tmp_path):
    """{host: root} and the inventory: node1 with the controller's Python, node38 (or node39) with the floor's."""
    roots = {"node1": build_node(tmp_path / "node1", cpus=8, gpus=2)}
    inventory = write_inventory(tmp_path / "hosts.yml", roots, report_dir=None)  # reports/ of the working directory
    floor = node_floor()
    oldest = python_at(floor)
    if oldest:
        name = "node" + floor.replace(".", "")
        roots[name] = build_node(tmp_path / name, cpus=8, gpus=2)
        with open(inventory, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
        hosts = data["all"]["children"]["gpunodes"]["hosts"]
        hosts[name] = {"gpunode_tuning_root": roots[name], "ansible_python_interpreter": oldest}
        with open(inventory, "w", encoding="utf-8") as fh:
            yaml.safe_dump(data, fh)
    return roots, inventory


def user_env(collections):
    """A user's shell: the venv on PATH, the collections path of the install, no ansible.cfg (cwd has none)."""
    env = dict(os.environ)
    env.pop("ANSIBLE_CONFIG", None)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_COLLECTIONS_PATH"] = collections
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def run(cwd, collections, *cmd):
    proc = subprocess.run([os.path.join(VENV_BIN, cmd[0]), *cmd[1:]], cwd=cwd, env=user_env(collections),
                          capture_output=True, text=True, timeout=600, check=False)
    proc.recap = {m.group(1): int(m.group(3)) for m in RECAP.finditer(proc.stdout)}
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(working directory, collections path) with the collection installed from its tarball."""
    base = tmp_path_factory.mktemp("installed")
    collections = str(base / "collections")
    build = run(str(base), collections, "ansible-galaxy", "collection", "build", "--output-path", str(base), REPO)
    assert build.returncode == 0, build.stdout + build.stderr
    tarball = re.search(r"Created collection for gpunode\.tuning at (\S+\.tar\.gz)", build.stdout).group(1)
    install = run(str(base), collections, "ansible-galaxy", "collection", "install", "-p", collections, tarball)
    assert install.returncode == 0, install.stdout + install.stderr
    assert "gpunode.tuning:" in install.stdout and "was installed successfully" in install.stdout, install.stdout
    for name in DEPENDENCIES:  # found in the environment, within galaxy.yml's range: Galaxy not asked
        assert re.search(r"'%s:[^']+' is already installed, skipping" % re.escape(name), install.stdout), install.stdout
    manifest = os.path.join(collections, "ansible_collections", "gpunode", "tuning", "MANIFEST.json")
    assert os.path.isfile(manifest) and not os.path.islink(os.path.dirname(manifest))
    return str(base), collections


def reports(cwd, roots):
    out = {}
    for host in roots:
        with open(os.path.join(cwd, "reports", host + ".json"), encoding="utf-8") as fh:
            out[host] = json.load(fh)
    return out


def test_verify_and_runtime_tuning_from_the_installed_tarball(installed, tmp_path):
    cwd, collections = installed
    roots, inventory = fleet(tmp_path)
    before = {host: snapshot(root) for host, root in roots.items()}

    audit = run(cwd, collections, "ansible-playbook", "-i", inventory, "gpunode.tuning.verify")
    assert audit.returncode == 2, audit.stdout[-4000:] + audit.stderr[-2000:]  # the untuned nodes drift
    assert "does not support Ansible version" not in audit.stderr  # meta/runtime.yml admits this core
    assert all(r["status"] == "fail" for r in reports(cwd, roots).values())
    assert all(tree_changes(before[host], snapshot(root)) == [] for host, root in roots.items())

    tuned = run(cwd, collections, "ansible-playbook", "-i", inventory, "gpunode.tuning.tune", "--tags", "runtime")
    assert tuned.returncode == 0, tuned.stdout[-6000:] + tuned.stderr[-2000:]
    for host, root in roots.items():
        assert tuned.recap[host] == 1, host  # one task ran every runtime family
        assert [read_mrrs(root, bdf) for bdf in GPUS] == [4096, 4096], host
        assert os.path.isfile(os.path.join(root, JOURNAL)), host

    again = run(cwd, collections, "ansible-playbook", "-i", inventory, "gpunode.tuning.tune", "--tags", "runtime")
    assert again.returncode == 0 and set(again.recap.values()) == {0}, again.stdout[-4000:]

    verified = run(cwd, collections, "ansible-playbook", "-i", inventory, "gpunode.tuning.verify")
    assert verified.returncode == 2
    # What runtime tuning cannot do: the driver switch needs the persistent flow and a reboot.
    for host, report in reports(cwd, roots).items():
        assert report["failures"] == ["1 drifted: cpufreq driver"], (host, report["failures"])

    rollback = run(cwd, collections, "ansible-playbook", "-i", inventory, "gpunode.tuning.rollback")
    assert rollback.returncode == 0, rollback.stdout[-4000:] + rollback.stderr[-2000:]
    for host, root in roots.items():
        assert tree_changes(before[host], snapshot(root)) == [], host
