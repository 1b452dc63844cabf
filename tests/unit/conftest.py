"""Shared fixtures: simulated nodes and an in-process module runner."""

from __future__ import annotations

import importlib

import pytest
import simnode
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from support.captures import Capture
from support.trees import tree_digest


class ModuleExit(Exception):
    """Raised instead of sys.exit by exit_json/fail_json; carries the result."""

    def __init__(self, result, failed):
        super().__init__(result.get("msg", ""))
        self.result = result
        self.failed = failed


@pytest.fixture
def build_node(tmp_path):
    """Return a function that builds a simulated node and returns its root path."""
    counter = {"n": 0}

    def _build(preset="audited-epyc-8gpu", **kwargs):
        counter["n"] += 1
        root = tmp_path / ("node%d" % counter["n"])
        simnode.build(str(root), preset, **kwargs)
        return str(root)

    return _build


@pytest.fixture
def digest():
    return tree_digest


@pytest.fixture
def run_module(monkeypatch):
    """Run a collection module's main() in-process and return (result, failed).

    ``run_module("setpci_mrrs", {...}, check=True, diff=True)``
    """

    def _exit_json(self, **kwargs):
        kwargs.setdefault("changed", False)
        raise ModuleExit(kwargs, False)

    def _fail_json(self, msg="", **kwargs):
        kwargs["msg"] = msg
        kwargs["failed"] = True
        raise ModuleExit(kwargs, True)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)

    def _run(name, args, check=False, diff=False):
        mod = importlib.import_module("ansible_collections.gpunode.tuning.plugins.modules.%s" % name)
        args = dict(args)
        args["_ansible_check_mode"] = check
        args["_ansible_diff"] = diff
        with patch_module_args(args):
            try:
                mod.main()
            except ModuleExit as exc:
                return exc.result, exc.failed
        raise AssertionError("module %s returned without exit_json/fail_json" % name)

    return _run


@pytest.fixture
def real():
    """``real(name)``: the Capture of tests/data/real/<name> (real output other people posted, with its source)."""
    return Capture
