"""The version matrix (scripts/matrix.py) and what the collection claims agree.

meta/runtime.yml's requires_ansible is exactly the range the matrix tests, the shared .venv's
version (requirements.txt, where the full suite runs) is one of the matrix's with the same pins, and
each version's files pin an ansible-core of that version and the ``ansible`` package of the same
generation (the ansible package N carries ansible-core 2.(N + 7): 9 -> 2.16, ..., 14 -> 2.21). A
version whose controller Python is missing fails the setup with what to install; it is never skipped.
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
    assert VERSIONS == ["2.16", "2.17", "2.18", "2.19", "2.20", "2.21"]


def test_requires_ansible_is_the_tested_range():
    with open(os.path.join(REPO, "meta", "runtime.yml"), encoding="utf-8") as handle:
        requires = yaml.safe_load(handle)["requires_ansible"]
    major, minor = VERSIONS[-1].split(".")
    assert requires == ">=%s.0,<%s.%d.0" % (VERSIONS[0], major, int(minor) + 1)


def test_the_shared_venv_is_a_matrix_version_with_its_pins():
    assert matrix.shared_version() in VERSIONS
    core, bundle = matrix.requirement_files(matrix.shared_version())
    shared = os.path.join(REPO, "requirements.txt")
    assert matrix.pinned(core, "ansible-core") == matrix.pinned(shared, "ansible-core")
    assert matrix.pinned(bundle, "ansible") == matrix.pinned(shared, "ansible")


def test_the_flows_run_at_both_ends_of_each_group_of_alike_cores(monkeypatch):
    # The unit and integration stages run everything on the shared version already.
    monkeypatch.delenv("MATRIX_FLOWS", raising=False)
    monkeypatch.delenv("MATRIX_SHARED", raising=False)
    assert matrix.selection(matrix.shared_version()) == (matrix.MATRIX_UNIT, [])
    flows = {v for v in VERSIONS if matrix.selection(v)[1] == matrix.MATRIX_TESTS}
    assert flows == set(matrix.FLOWS_VERSIONS) and {VERSIONS[0], VERSIONS[-1]} <= flows
    # The last core before 2.19's templating and the shared 2.19 itself (docs/compatibility.md) are both tested.
    assert "2.18" in flows and matrix.shared_version() == "2.19"
    monkeypatch.setenv("MATRIX_FLOWS", "all")
    assert {v for v in VERSIONS if matrix.selection(v)[1]} == set(VERSIONS) - {matrix.shared_version()}


@pytest.mark.parametrize("version", VERSIONS)
def test_each_version_names_its_controller_pythons_and_pins_pytest(version):
    pythons = matrix.CONTROLLER_PYTHONS[version]
    minor = int(version.split(".")[1])
    # ansible-core 2.20 dropped Python 3.11 on the controller; 2.18 dropped 3.10.
    floor = (3, 12) if minor >= 20 else (3, 11) if minor >= 18 else (3, 10)
    assert all(tuple(map(int, p.split("."))) >= floor for p in pythons), pythons
    core, _bundle = matrix.requirement_files(version)
    assert matrix.pinned(core, "pytest")  # MATRIX_UNIT runs in the environment itself


def test_a_missing_controller_python_fails_saying_what_to_install(monkeypatch):
    monkeypatch.setattr(matrix, "candidates", lambda minor: [])
    monkeypatch.delenv("MATRIX_PYTHON_2_21", raising=False)
    monkeypatch.setattr(matrix, "_PYTHONS", {})
    with pytest.raises(matrix.NoPython) as caught:
        matrix.python("2.21")
    message = str(caught.value)
    assert "ansible-core 2.21 needs Python 3.13 or 3.12 or 3.14 on the controller" in message
    assert "pyenv install 3.13" in message and "apt-get install python3.13 python3.13-venv" in message
    assert "MATRIX_PYTHON_2_21=" in message


def test_a_named_controller_python_must_be_a_supported_one(monkeypatch):
    monkeypatch.setattr(matrix, "_PYTHONS", {})
    monkeypatch.setenv("MATRIX_PYTHON_2_21", sys.executable)  # the .venv's 3.11: not for 2.21
    with pytest.raises(matrix.NoPython, match="MATRIX_PYTHON_2_21=.* is not a Python 3.13/3.12/3.14"):
        matrix.python("2.21")


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
    tests = matrix.MATRIX_UNIT + matrix.MATRIX_TESTS
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    for test in tests:
        assert any(line == test or line.startswith((test + "::", test + "[")) for line in collected), test
