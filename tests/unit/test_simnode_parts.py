"""The simulator's plug-in point for a new part of a node (tools/simnode/parts.py): its ``build()`` keyword
arguments, its check before the first write, its writer, and its options of ``simnode build``."""

from __future__ import annotations

import os

import pytest
import simnode
from simnode import cli, parts


def _check(preset, funcs, opts):
    if opts["policy"] not in ("default", "performance"):
        raise ValueError(f"policy {opts['policy']!r} is not one of default, performance")


def _write(tree, preset, funcs, opts):
    gpus = sum(map(simnode.is_gpu, funcs))
    tree.write("sys/module/pcie_aspm/parameters/policy", f"[{opts['policy']}] gpus={gpus} {preset.name}")


def _add_arguments(parser):
    parser.add_argument("--aspm-policy", default="default")


PART = parts.Part("aspm", options={"policy": "default"}, check=_check, write=_write,
                  add_arguments=_add_arguments, from_args=lambda args: {"policy": args.aspm_policy})


@pytest.fixture
def plugged():
    parts.REGISTERED.append(PART)
    yield
    parts.REGISTERED.remove(PART)


def _policy(root):
    with open(os.path.join(root, "sys/module/pcie_aspm/parameters/policy")) as handle:
        return handle.read()


def test_a_plugged_part_takes_its_build_options_and_writes_after_the_built_ins(tmp_path, plugged):
    info = simnode.build(str(tmp_path / "a"), "tiny-vm")
    assert _policy(info["root"]) == "[default] gpus=0 tiny-vm\n"
    simnode.build(str(tmp_path / "b"), "audited-epyc-8gpu", cpus=2, policy="performance")
    assert _policy(str(tmp_path / "b")) == "[performance] gpus=8 audited-epyc-8gpu\n"


def test_a_bad_option_of_a_plugged_part_writes_nothing(tmp_path, plugged):
    with pytest.raises(ValueError, match="policy 'powersave' is not one of"):
        simnode.build(str(tmp_path / "n"), "tiny-vm", policy="powersave")
    assert not (tmp_path / "n").exists()


def test_a_keyword_no_part_takes_is_refused(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'policy'"):
        simnode.build(str(tmp_path / "n"), "tiny-vm", policy="performance")
    assert not (tmp_path / "n").exists()


def test_the_command_line_has_the_plugged_options(tmp_path, plugged, capsys):
    assert cli.main(["build", "--preset", "tiny-vm", "--aspm-policy", "performance", str(tmp_path / "c")]) == 0
    assert _policy(str(tmp_path / "c")) == "[performance] gpus=0 tiny-vm\n"
    assert cli.main(["build", "--preset", "tiny-vm", "--aspm-policy", "nope", str(tmp_path / "d")]) == 2
    assert "simnode: policy 'nope' is not one of default, performance" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
