"""Kernel arguments by the vendor of a node's GPUs (families/kernel_cmdline.py), decided on the node.

The presets give ``{amd: [pci=realloc=off]}`` to every node; the simulated MI300X node gets it, the NVIDIA node
nothing, a node with both vendors' GPUs both lists; the guard's config keeps only the node's own.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import kernel_cmdline
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families

WANT = {"amd": ["pci=realloc=off"], "nvidia": ["nvidia.NVreg_Test=1"]}
KEY = kernel_cmdline.GPU_VENDOR_KEY


@pytest.mark.parametrize(("preset", "kwargs", "vendors", "args"), [
    ("mi300x-epyc-8gpu", {"amd_smi": True}, {"amd"}, ["pci=realloc=off"]),
    ("audited-epyc-8gpu", {}, {"nvidia"}, ["nvidia.NVreg_Test=1"]),
])
def test_the_node_decides_by_the_gpus_on_its_bus(build_node, preset, kwargs, vendors, args):
    node = Node(build_node(preset, cpus=4, **kwargs))
    assert kernel_cmdline.node_gpu_vendors(node) == vendors
    pc = SimpleNamespace(node=node, desired={KEY: WANT}, settings={KEY: WANT})
    assert kernel_cmdline.gpu_vendor_kernel_args(pc) == args
    assert kernel_cmdline.gpu_vendor_kernel_args(pc, remove=True) == ["pci=realloc=off", "nvidia.NVreg_Test=1"]
    kept = all_families.node_desired({KEY: {"amd": ["pci=realloc=off"]}, "numa_balancing": 0}, node)
    assert kept == ({KEY: {"amd": ["pci=realloc=off"]}, "numa_balancing": 0} if "amd" in vendors
                    else {"numa_balancing": 0})


def test_a_node_with_both_vendors_gets_both_lists_and_one_without_gpus_none():
    assert kernel_cmdline.gpu_vendor_arguments(WANT, {"nvidia", "amd"}) == ["pci=realloc=off", "nvidia.NVreg_Test=1"]
    assert kernel_cmdline.gpu_vendor_arguments(WANT, set()) == []
    assert kernel_cmdline.gpu_vendor_arguments(None, {"amd"}) == []


@pytest.mark.parametrize(("want", "words"), [
    ({"intel": ["x=1"]}, "unknown GPU vendor 'intel'; allowed: amd, nvidia"),
    ({"amd": "pci=realloc=off"}, "kernel_cmdline_gpu_vendor_args.amd must be a list of kernel arguments"),
    (["pci=realloc=off"], "must be a mapping of GPU vendor (amd, nvidia) to a list of kernel arguments"),
    ({"amd": ["pci=realloc=off;reboot"]}, "amd[0]"),
])
def test_bad_input_is_refused_naming_what_is_allowed(want, words):
    problems = kernel_cmdline.gpu_vendor_problems(want)
    assert problems and words in family.problems_text(problems), problems


def test_the_role_gives_the_entry_only_when_enabled_and_set():
    v = {"gpunode_tuning_kernel_cmdline_enabled": True, "gpunode_tuning_kernel_cmdline_args": [],
         "gpunode_tuning_kernel_cmdline_gpu_vendor_args": {"amd": ["pci=realloc=off"], "nvidia": []}}
    assert kernel_cmdline.from_role(v, {}) == {"kernel_cmdline": [], KEY: {"amd": ["pci=realloc=off"]}}
    assert kernel_cmdline.from_role(dict(v, gpunode_tuning_kernel_cmdline_enabled=False), {}) == {"kernel_cmdline": []}
    assert kernel_cmdline.from_role(dict(v, gpunode_tuning_kernel_cmdline_gpu_vendor_args={}), {}) == \
        {"kernel_cmdline": []}


def test_the_precheck_names_the_role_variable_of_a_bad_value():
    from ansible_collections.gpunode.tuning.plugins.plugin_utils import desired_state

    known = {"gpunode_tuning_kernel_cmdline_gpu_vendor_args", "gpunode_tuning_gpu_settings_compute_partition"}
    lines = desired_state.desired_problems({KEY: {"intel": ["x=1"]}, "gpu_settings": {"compute_partition": "SPX4"}},
                                           known)
    assert "value of gpunode_tuning_kernel_cmdline_gpu_vendor_args (intel): unknown GPU vendor 'intel'; allowed: " \
           "amd, nvidia" in lines, lines
    assert "value of gpunode_tuning_gpu_settings_compute_partition: compute_partition must be one of SPX, DPX, TPX, " \
           "QPX, CPX (AMD SMI's compute modes), got 'SPX4'" in lines, lines
