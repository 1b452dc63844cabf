"""The execution environment for AWX (ee/, meta/execution-environment.yml, bindep.txt), offline.

ansible-builder's ``create`` writes the build context (Containerfile, _build/) without a registry
or Galaxy; ``introspect`` reads an installed collection's meta/execution-environment.yml, as the
image build does. A proxy that refuses every connection makes any network use fail the test.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")


def offline_env():
    env = dict(os.environ)
    # make exports ANSIBLE_COLLECTIONS_PATH (the checkout's .collections, which already holds this
    # collection): ansible-galaxy would then find it "already installed" and install nothing below -p.
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    env.pop("ANSIBLE_COLLECTIONS_PATHS", None)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = "http://127.0.0.1:9"  # the discard port: refused at once
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    return env


def run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, env=offline_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, "%s failed:\n%s\n%s" % (" ".join(cmd), proc.stdout, proc.stderr)
    return proc.stdout


def pinned(package):
    """The version of ``package`` that requirements.txt pins."""
    with open(os.path.join(REPO, "requirements.txt"), encoding="utf-8") as handle:
        match = re.search(r"^%s==(\S+)$" % re.escape(package), handle.read(), re.MULTILINE | re.IGNORECASE)
    assert match, "requirements.txt pins no %s" % package
    return match.group(1)


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    """The collection built as ansible-galaxy builds it for the image (ee/dist in docs/awx.md)."""
    dist = tmp_path_factory.mktemp("dist")
    run([os.path.join(VENV_BIN, "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(dist), REPO],
        cwd=REPO)
    (path,) = glob.glob(str(dist / "gpunode-tuning-*.tar.gz"))
    return path


def test_ansible_builder_create_writes_the_context_offline(tmp_path, tarball):
    ee = tmp_path / "ee"
    shutil.copytree(os.path.join(REPO, "ee"), ee, ignore=shutil.ignore_patterns("dist", "context"))
    (ee / "dist").mkdir()
    shutil.copy(tarball, ee / "dist")
    # podman's file name, podman installed or not (ansible-builder otherwise names it after the runtime found).
    run([os.path.join(VENV_BIN, "ansible-builder"), "create", "-f", "execution-environment.yml",
         "--output-filename", "Containerfile", "--context", str(tmp_path / "context")], cwd=ee)

    containerfile = (tmp_path / "context" / "Containerfile").read_text(encoding="utf-8")
    # The base image is a build argument (no registry here): the file's name is only its default.
    assert re.search(r'^ARG EE_BASE_IMAGE=".+"$', containerfile, re.MULTILINE)
    assert "FROM $EE_BASE_IMAGE AS base" in containerfile
    # ansible-core and ansible-runner as pinned for the tests.
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core==%s ansible-runner==%s"' % (
        pinned("ansible-core"), pinned("ansible-runner")) in containerfile
    # The galaxy stage installs the collection from the tarball that the context carries.
    build = tmp_path / "context" / "_build"
    with open(build / "requirements.yml", encoding="utf-8") as handle:
        (entry,) = yaml.safe_load(handle)["collections"]
    assert entry["type"] == "file"
    assert (build / entry["name"]).is_file(), "requirements.yml names %s, not in the context" % entry["name"]
    assert os.path.basename(entry["name"]) == os.path.basename(tarball)


def test_the_collection_brings_its_system_and_python_requirements(tmp_path, tarball):
    collections = tmp_path / "collections"
    run([os.path.join(VENV_BIN, "ansible-galaxy"), "collection", "install", "--no-deps", "--force", "-p",
         str(collections), tarball], cwd=tmp_path)
    assert (collections / "ansible_collections/gpunode/tuning/MANIFEST.json").is_file(), "the tarball was not installed"
    out = run([os.path.join(VENV_BIN, "ansible-builder"), "introspect", str(collections)], cwd=tmp_path)
    data = yaml.safe_load(out.split("\n", 1)[1])  # after the "# Dependency data for ..." line
    system = " ".join(data["system"])
    for package in ("pciutils", "kmod", "util-linux", "openssh-client"):
        assert re.search(r"\b%s\b" % package, system), "bindep.txt lacks %s: %s" % (package, data["system"])
    assert any(line.startswith("netaddr") for line in data["python"]), data["python"]
