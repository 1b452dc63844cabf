"""The version matrix (scripts/matrix.py) and what the collection claims agree.

meta/runtime.yml's requires_ansible is exactly the range the matrix tests, the newest version of
the matrix is the one of requirements.txt (the shared .venv, where the full suite runs), and each
version's files pin an ansible-core of that version and the ``ansible`` package of the same
generation (the ansible package N carries ansible-core 2.(N + 7): 9 -> 2.16, ..., 12 -> 2.19).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("matrix", os.path.join(REPO, "scripts", "matrix.py"))
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)

VERSIONS = matrix.versions()


def test_the_matrix_covers_the_supported_versions():
    assert VERSIONS == ["2.16", "2.17", "2.18", "2.19"]


def test_requires_ansible_is_the_tested_range():
    with open(os.path.join(REPO, "meta", "runtime.yml"), encoding="utf-8") as handle:
        requires = yaml.safe_load(handle)["requires_ansible"]
    major, minor = VERSIONS[-1].split(".")
    assert requires == ">=%s.0,<%s.%d.0" % (VERSIONS[0], major, int(minor) + 1)


def test_the_newest_version_is_the_shared_venv():
    core, bundle = matrix.requirement_files(VERSIONS[-1])
    shared = os.path.join(REPO, "requirements.txt")
    assert matrix.pinned(core, "ansible-core") == matrix.pinned(shared, "ansible-core")
    assert matrix.pinned(bundle, "ansible") == matrix.pinned(shared, "ansible")


@pytest.mark.parametrize("version", VERSIONS)
def test_each_version_pins_its_core_and_the_matching_bundle(version):
    core, bundle = matrix.requirement_files(version)
    assert matrix.pinned(core, "ansible-core").startswith(version + ".")
    minor = int(version.split(".")[1])
    assert matrix.pinned(bundle, "ansible").split(".")[0] == str(minor - 7)


def test_galaxy_ranges_are_checked_like_galaxy_reads_them():
    assert matrix.in_range("1.6.2", ">=1.6.2,<3.0.0")
    assert not matrix.in_range("1.6.1", ">=1.6.2,<3.0.0")
    assert not matrix.in_range("3.0.0", ">=1.6.2,<3.0.0")
    assert matrix.in_range("8.6.8", "*")


def test_every_matrix_test_exists():
    # A renamed or removed integration test must not silently leave the matrix.
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *matrix.MATRIX_TESTS], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    for test in matrix.MATRIX_TESTS:
        assert any(line == test or line.startswith((test + "::", test + "[")) for line in collected), test
