"""The families' node-free validators (``Family.validate``, issue 22 class 1) and their modules' refusals.

What can be judged without the node (shape, syntax, ranges the kernel documents) is refused by the
family's ``validate`` functions, which the controller-side precheck calls on the whole desired state,
and by the family's module before its first write: one rule, two callers. What needs the node (an
absent device, a CPU or C-state the node lacks, a power limit above the GPU's maximum) passes here and
stays the family's failure on that node.
"""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core import node as node_module
from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpufreq, cpuidle, pcie_mrrs, tunables
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs as acs
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families

JOURNAL = "/var/lib/gpunode-tuning/journal.json"

# A desired state as the role builds it from the inference-latency preset, with every family set.
GOOD = {
    "pcie_mrrs": {"mrrs": 4096, "vendor": None, "device": None, "class_prefixes": None, "bdfs": None,
                  "allow_empty": False},
    "pcie_acs": {"mode": "disable_redirect", "persist": "boot_unit", "vendor": "10de", "device": None,
                 "class_prefixes": ["0302"], "bdfs": ["0000:41:00.0", "41:00.0"], "allow_empty": True},
    "iommu": {"mode": "passthrough"},
    "pcie_aspm": {"policy": "performance", "links": "off", "persist": "boot_unit", "vendor": ["10de", "1002"],
                  "device": None, "class_prefixes": None, "bdfs": None, "allow_empty": True},
    "cpuidle": {"disable": [], "max_latency_us": 2, "cpus": "0-3,8"},
    "cpufreq": {"governor": "performance", "epp": "performance", "boost": True, "driver": "native",
                "amd_pstate_mode": "active", "intel_pstate_status": None},
    "numa_balancing": 0,
    "thp": {"enabled": "madvise", "defrag": "defer+madvise"},
    "sysctl": {"vm.swappiness": 10, "net.core.rmem_max": 134217728, "net.core.somaxconn": 65535,
               "net.ipv4.tcp_rmem": "4096 131072 67108864", "kernel.numa_balancing": 0},
    "kmod": {"modules": [{"name": "nvidia_peermem", "params": {}, "required": False}]},
    "kernel_cmdline": ["iommu=pt", "pci=noaer,disable_acs_redir=0000:40:01.1;60:01.1", "quiet"],
    "kernel_cmdline_gpu_vendor_args": {"amd": ["pci=realloc=off"], "nvidia": []},
    "gpu_settings": {"persistence": True, "power_limits": {"0000:41:00.0": 300}, "locked_clocks": {"min": 1500,
                                                                                                   "max": 1980},
                     "application_clocks": {"memory": 2619, "graphics": 1980}},
    "gpu_health": {"gpu_count": 8, "dcgm_diag": False},
    "gpu_p2p": {"min_gbps": 300.0},
}

# (desired-state key, entry, key inside it, fragment of the message): issue 22's class 1 and what goes with it.
BAD = [
    ("pcie_mrrs", dict(GOOD["pcie_mrrs"], bdfs=["bogus"]), "bdfs", "'bogus' is not a PCI address"),
    ("pcie_mrrs", dict(GOOD["pcie_mrrs"], class_prefixes=["030"]), "class_prefixes", "'030' is not 2, 4 or 6 hex"),
    ("pcie_mrrs", dict(GOOD["pcie_mrrs"], class_prefixes="0302"), "class_prefixes", "is not a list"),
    ("pcie_mrrs", dict(GOOD["pcie_mrrs"], vendor="nvidia"), "vendor", "vendor must be a 4-digit hex PCI id"),
    ("pcie_mrrs", dict(GOOD["pcie_mrrs"], device="0x10de0"), "device", "device must be a 4-digit hex PCI id"),
    ("pcie_mrrs", dict(GOOD["pcie_mrrs"], mrrs=300), "mrrs", "mrrs must be one of 128, 256, 512, 1024, 2048, 4096"),
    ("pcie_mrrs", dict(GOOD["pcie_mrrs"], allow_empty="yes"), "allow_empty", "must be true or false"),
    ("pcie_mrrs", "4096", "", "pcie_mrrs must be a mapping"),
    ("pcie_acs", dict(GOOD["pcie_acs"], bdfs=["0000:41:00.8"]), "bdfs", "'0000:41:00.8' is not a PCI address"),
    ("pcie_acs", dict(GOOD["pcie_acs"], mode="off"), "mode", "mode must be one of disable_redirect, unmanaged"),
    ("pcie_acs", dict(GOOD["pcie_acs"], persist="grub"), "persist", "persist must be one of boot_unit, kernel_arg"),
    ("iommu", {"mode": "pt"}, "mode", "iommu.mode must be one of passthrough, translated, unmanaged"),
    ("pcie_aspm", dict(GOOD["pcie_aspm"], policy="max"), "policy", "policy must be one of default, performance"),
    ("pcie_aspm", dict(GOOD["pcie_aspm"], links="on"), "links", "links must be one of off, keep"),
    ("pcie_aspm", dict(GOOD["pcie_aspm"], bdfs=["41:00"]), "bdfs", "'41:00' is not a PCI address"),
    ("cpuidle", dict(GOOD["cpuidle"], cpus="0-3,x"), "cpus", "cpulist '0-3,x' is invalid"),
    ("cpuidle", dict(GOOD["cpuidle"], cpus="3-1"), "cpus", "ascending ranges"),
    ("cpuidle", {"disable": ["C6;reboot"], "max_latency_us": None}, "disable", "idle state name 'C6;reboot'"),
    ("cpuidle", {"disable": "C6", "max_latency_us": None}, "disable", "is not a list of idle state names"),
    ("cpuidle", {"disable": [], "max_latency_us": -1}, "max_latency_us", "an integer >= 0 (microseconds), got -1"),
    ("cpuidle", {"disable": [], "max_latency_us": "100us"}, "max_latency_us", "got '100us'"),
    ("cpuidle", {"disable": ["C6"], "max_latency_us": 100}, "max_latency_us", "exclude each other"),
    ("cpufreq", dict(GOOD["cpufreq"], governor="perfomance"), "governor", "'perfomance' is not a cpufreq governor"),
    ("cpufreq", dict(GOOD["cpufreq"], epp="fast"), "epp", "'fast' is not an energy performance preference"),
    ("cpufreq", dict(GOOD["cpufreq"], epp="256"), "epp", "or a raw value 0-255"),
    ("cpufreq", dict(GOOD["cpufreq"], amd_pstate_mode="on"), "amd_pstate_mode", "active, passive, guided"),
    ("cpufreq", dict(GOOD["cpufreq"], intel_pstate_status="guided"), "intel_pstate_status", "active, passive"),
    ("cpufreq", dict(GOOD["cpufreq"], driver="pstate"), "driver", "native, amd-pstate, acpi-cpufreq, intel_pstate"),
    ("cpufreq", dict(GOOD["cpufreq"], boost="on"), "boost", "boost must be true, false or null"),
    ("thp", dict(GOOD["thp"], enabled="sometimes"), "enabled", "allowed are always, madvise, never"),
    ("thp", dict(GOOD["thp"], defrag="defer-madvise"), "defrag", "always, defer, defer+madvise, madvise, never"),
    ("thp", {"enable": "madvise"}, "enable", "enable is not a transparent hugepage setting"),
    ("numa_balancing", 5, "", "allowed is one integer 0-3 (Documentation/admin-guide/sysctl/kernel.rst"),
    ("sysctl", {"vm.swappiness": -5}, "vm.swappiness", "allowed is one integer 0-200"),
    ("sysctl", {"vm.swappiness": "1e20"}, "vm.swappiness", "value '1e20' is not accepted"),
    ("sysctl", {"vm.swappiness": 10 ** 20}, "vm.swappiness", "allowed is one integer 0-200"),
    ("sysctl", {"kernel.numa_balancing": 4}, "kernel.numa_balancing", "allowed is one integer 0-3"),
    ("sysctl", {"vm..swappiness": 10}, "vm..swappiness", "sysctl key 'vm..swappiness' is invalid"),
    ("sysctl", {"vm.swappiness=10": 10}, "vm.swappiness=10", "no '='"),
    ("sysctl", {"vm.swappiness": 10, "vm/swappiness": 20}, "vm/swappiness", "vm.swappiness is given twice"),
    ("sysctl", {"net.core.somaxconn": "1\n2"}, "net.core.somaxconn", "contains line feed"),
    ("sysctl", {"net.core.somaxconn": None}, "net.core.somaxconn", "null is not a value"),
    ("kmod", {"modules": [{"name": "-r", "params": {}}]}, "modules", "module name '-r' is invalid"),
    ("kmod", {"modules": [{"name": "nvidia", "params": {"NVreg x": 1}}]}, "modules", "parameter name 'NVreg x'"),
    ("kmod", {"modules": [{"name": "nvidia", "params": {"a": "1;reboot"}}]}, "modules", "value '1;reboot'"),
    ("kmod", {"modules": [{"name": "nvidia"}, {"name": "nvidia"}]}, "modules", "nvidia is given more than once"),
    ("kmod", {"modules": [{"name": "nvidia", "required": "yes"}]}, "modules", "required must be true or false"),
    ("kmod", {"modules": "nvidia_peermem"}, "modules", "modules must be a list"),
    ("kernel_cmdline", ["iommu=pt", "pci=disable_acs_redir=ZZZZ:00:01.1"], "1",
     "'ZZZZ:00:01.1' in its disable_acs_redir="),
    ("kernel_cmdline", ["pci=disable_acs_redir=0000:00:01.8"], "0", "'0000:00:01.8' in its disable_acs_redir= list"),
    ("kernel_cmdline", ["pci=disable_acs_redir=0000:00:01.1;0000:00:3f.0"], "0", "'0000:00:3f.0' in its"),
    ("kernel_cmdline", ["pci=noaer,disable_acs_redir=00:01.1;x"], "0", "'x' in its disable_acs_redir= list"),
    ("kernel_cmdline", ["quiet", "$(reboot)"], "1", "argument '$(reboot)' is invalid"),
    ("kernel_cmdline", ["amd_pstate=active", "amd_pstate=passive"], "1", "key amd_pstate is given twice"),
    ("kernel_cmdline", "iommu=pt", "", "kernel_cmdline must be a list of kernel arguments"),
    ("kernel_cmdline_gpu_vendor_args", {"intel": ["quiet"]}, "intel",
     "unknown GPU vendor 'intel'; allowed: amd, nvidia"),
    ("kernel_cmdline_gpu_vendor_args", {"amd": "pci=realloc=off"}, "amd", "must be a list of kernel arguments"),
    ("kernel_cmdline_gpu_vendor_args", {"amd": ["$(reboot)"]}, "amd[0]", "argument '$(reboot)' is invalid"),
    ("kernel_cmdline_gpu_vendor_args", ["pci=realloc=off"], "", "a mapping of GPU vendor (amd, nvidia)"),
    ("gpu_settings", {"power_limits": {"bogus": 300}}, "power_limits", "'bogus' is not a PCI address"),
    ("gpu_settings", {"power_limits": {"0000:41:00.0": -300}}, "power_limits", "a whole number of watts > 0, got -300"),
    ("gpu_settings", {"power_limit": 0}, "power_limit", "power_limit must be a whole number of watts > 0, got 0"),
    ("gpu_settings", {"locked_clocks": {"min": 1500}}, "locked_clocks", "locked_clocks must be a map {min: MHz, max"),
    ("gpu_settings", {"locked_clocks": {"min": 1980, "max": 1500}}, "locked_clocks", "min 1980 MHz is above max"),
    ("gpu_settings", {"locked_clocks": {"min": 0, "max": 1500}}, "locked_clocks", "locked_clocks.min must be a"),
    ("gpu_settings", {"application_clocks": {"memory": 2619}}, "application_clocks", "{memory: MHz, graphics: MHz}"),
    ("gpu_settings", {"application_clocks": [2619, 1980]}, "application_clocks", "must be a map"),
    ("gpu_settings", {"persistence": "on"}, "persistence", "persistence must be true, false or null"),
    ("gpu_health", {"gpu_count": 0, "dcgm_diag": False}, "gpu_count", "an integer >= 1 or null, got 0"),
    ("gpu_health", {"gpu_count": 8, "dcgm_diag": "yes"}, "dcgm_diag", "must be true or false"),
    ("gpu_p2p", {"min_gbps": float("inf")}, "min_gbps", "a number > 0 (GB/s, finite)"),
    ("gpu_p2p", {"min_gbps": 0}, "min_gbps", "a number > 0 (GB/s, finite)"),
]


def validator(entry: str):
    """The registry's validator of a desired-state entry (the precheck's way in)."""
    found = [fam.validate[entry] for fam in registry.FAMILIES if entry in (fam.validate or {})]
    assert len(found) == 1, "%s is validated by %d families" % (entry, len(found))
    return found[0]


def test_every_entry_of_the_desired_state_has_one_validator():
    for entry in GOOD:
        validator(entry)
    assert {e for fam in registry.FAMILIES for e in (fam.validate or {})} == set(GOOD)


def test_the_role_desired_state_passes():
    assert all_families.desired_problems(GOOD) == []
    assert all_families.desired_problems({}) == []  # no entry, no problem


@pytest.mark.parametrize("entry,value,key,fragment", BAD, ids=["%s-%d" % (b[0], i) for i, b in enumerate(BAD)])
def test_a_bad_value_is_named_with_its_key_and_what_is_allowed(entry, value, key, fragment):
    problems = validator(entry)(value)
    assert [k for k, _msg in problems] == [key], problems
    assert fragment in problems[0][1], problems


def test_every_problem_of_the_desired_state_is_listed_with_its_entry():
    desired = dict(GOOD, pcie_mrrs=dict(GOOD["pcie_mrrs"], bdfs=["bogus", "41:00.0", "zz"]),
                   gpu_settings={"power_limits": {"bogus": 300}, "locked_clocks": {"min": 1500}},
                   kernel_cmdline=["pci=disable_acs_redir=ZZZZ:00:01.1"])
    problems = all_families.desired_problems(desired)
    assert [(e, k) for e, k, _m in problems] == [("pcie_mrrs", "bdfs"), ("pcie_mrrs", "bdfs"),
                                                 ("kernel_cmdline", "0"), ("gpu_settings", "power_limits"),
                                                 ("gpu_settings", "locked_clocks")]
    assert "'zz' is not a PCI address" in problems[1][2]


@pytest.mark.parametrize("entry,value", [
    # What only the node can judge passes here: it stays that family's failure on that node.
    ("cpuidle", {"disable": [], "max_latency_us": 100, "cpus": "0-999"}),  # a 16-CPU node lacks most of them
    ("cpuidle", {"disable": ["C9"], "max_latency_us": None, "cpus": None}),  # a state the node may lack
    ("gpu_settings", {"power_limit": 5000}),  # above this GPU's maximum
    ("gpu_settings", {"locked_clocks": {"min": 100, "max": 9000}}),  # above its clocks.max.graphics
    ("pcie_mrrs", dict(GOOD["pcie_mrrs"], bdfs=["0000:99:00.0"])),  # absent device
    ("cpufreq", dict(GOOD["cpufreq"], governor="userspace", epp="128")),  # offered or not by the node's driver
    ("sysctl", {"vm.swappiness": 150, "net.no_such_key": 1}),  # 101-200 needs Linux 5.8; a key the node lacks
    ("kmod", {"modules": [{"name": "no_such_module", "params": {}}]}),
])
def test_what_needs_the_node_passes(entry, value):
    assert validator(entry)(value) == []


# --- the modules refuse the same values before their first write -------------------------------------


@pytest.fixture
def node_root(build_node):
    return build_node("audited-epyc-8gpu", cpus=4, gpus=1, nvidia_smi=True)


MODULE_BAD = [
    ("setpci_mrrs", {"mrrs": 4096, "bdfs": ["bogus"]}, "bdfs: 'bogus' is not a PCI address"),
    ("setpci_mrrs", {"mrrs": 4096, "class_prefixes": ["030"], "bdfs": ["zz"]},
     "class_prefixes: class prefix '030' is not 2, 4 or 6 hex digits"),
    ("pcie_acs", {"bdfs": ["bogus"]}, "bdfs: 'bogus' is not a PCI address"),
    ("gpu_settings", {"power_limits": {"bogus": 300}}, "power_limits: 'bogus' is not a PCI address"),
    ("gpu_settings", {"locked_clocks": {"min": 1500}}, "locked_clocks must be a map {min: MHz, max: MHz}"),
    ("cpu_cstate", {"disable": ["C1;reboot"]}, "idle state name 'C1;reboot' is invalid"),
    ("cpu_cstate", {"disable": ["C2"], "cpus": "0-3,x"}, "not a cpulist"),
    ("cpu_freq", {"governor": "perfomance"}, "governor 'perfomance' is not a cpufreq governor"),
    # acpi-cpufreq has no EPP: before, a bad EPP was skipped there as not applicable and the run passed.
    ("cpu_freq", {"governor": "performance", "epp": "fast"}, "epp 'fast' is not an energy performance preference"),
    ("kernel_tunables", {"sysctl": {"vm.swappiness": -5}}, "allowed is one integer 0-200"),
    ("kernel_tunables", {"sysctl": {"vm.swappiness": 10 ** 20}}, "allowed is one integer 0-200"),
    ("kernel_tunables", {"sysctl": {"vm.swappiness": 10, "vm.dirty_ratio": 101}}, "vm.dirty_ratio: value '101'"),
    ("kernel_tunables", {"sysctl": {"kernel.numa_balancing": -1}}, "allowed is one integer 0-3"),
    ("kernel_tunables", {"transparent_hugepage": {"enabled": "sometimes"}}, "allowed are always, madvise, never"),
    ("kmod_optional", {"modules": [{"name": "-r"}]}, "module name '-r' is invalid"),
]


@pytest.mark.parametrize("module,args,fragment", MODULE_BAD,
                         ids=["%s-%d" % (b[0], i) for i, b in enumerate(MODULE_BAD)])
def test_the_module_refuses_it_before_any_write(node_root, run_module, digest, module, args, fragment):
    before = digest(node_root)
    result, failed = run_module(module, dict(args, root=node_root, journal=JOURNAL))
    assert failed and fragment in result["msg"], result
    assert digest(node_root) == before


@pytest.mark.parametrize("arg", ["pci=disable_acs_redir=ZZZZ:00:01.1", "pci=disable_acs_redir=0000:00:01.8"])
def test_kernel_cmdline_checks_a_single_acs_address(build_node, run_module, digest, arg):
    root = build_node("tiny-vm")
    before = digest(root)
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt", arg], "root": root})
    assert failed and "invalid input, nothing was written" in result["msg"]
    assert "%r in its disable_acs_redir= list is not a PCI address" % arg.rpartition("=")[2] in result["msg"]
    assert digest(root) == before


def test_pcie_acs_refuses_an_empty_root(run_module):
    result, failed = run_module("pcie_acs", {"root": ""})
    assert failed and "root is empty" in result["msg"], result


def test_a_sysctl_value_the_kernel_refuses_is_named(node_root, monkeypatch):
    """vm.swappiness 150 passes the documented range, but a kernel before 5.8 (0-100) refuses it: EINVAL."""
    real = os.write

    def kernel_write(fd, data):
        if os.readlink("/proc/self/fd/%d" % fd).endswith("proc/sys/vm/swappiness"):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, data)

    monkeypatch.setattr(node_module.os, "write", kernel_write)
    params = dict(root=node_root, journal=None, restore=False, sysctl={"vm.swappiness": 150, "vm.dirty_ratio": 15},
                  transparent_hugepage=None, sysctl_file=None, skip_readonly=False)
    with pytest.raises(family.FamilyError) as exc:
        tunables.run(family.Call(params=params))
    assert "the kernel refused vm.swappiness = '150' (Invalid argument" in str(exc.value)
    assert "Applied: vm.dirty_ratio" in str(exc.value)


def test_a_sysctl_integer_beyond_64_bits_is_refused_for_any_integer_key(node_root, run_module, digest):
    before = digest(node_root)
    result, failed = run_module("kernel_tunables", {"sysctl": {"net.core.somaxconn": 2 ** 64}, "root": node_root})
    assert failed and "does not fit in 64 bits" in result["msg"]
    assert digest(node_root) == before


# --- class 5: an option asked for by name that does not apply warns; a preset's stays silent -----------


def module_params(spec: dict, **values) -> dict:
    params = {k: v.get("default") for k, v in spec.items()}
    params.update(values)
    return params


CPUFREQ_NOT_APPLICABLE = [
    ("audited-epyc-8gpu", {"epp": "performance"}, "epp=performance does not apply on this node: driver acpi-cpufreq "
                                                  "has no energy performance preference"),
    ("audited-epyc-8gpu", {"amd_pstate_mode": "active"}, "amd_pstate_mode=active does not apply on this node: "
                                                         "amd_pstate_mode applies to the amd-pstate driver only"),
    ("epyc-pstate-epp", {"intel_pstate_status": "passive"}, "intel_pstate_status=passive does not apply on this "
                                                            "node: intel_pstate_status applies to the intel_pstate"),
    ("tiny-vm", {"governor": "performance"}, "governor=performance does not apply on this node: this node has no "
                                             "cpufreq policies"),
]


@pytest.mark.parametrize("preset,args,warning", CPUFREQ_NOT_APPLICABLE)
def test_cpu_freq_warns_about_an_explicit_option_that_does_not_apply(build_node, preset, args, warning):
    root = build_node(preset, cpus=2, gpus=1) if preset != "tiny-vm" else build_node(preset)
    warnings = []
    result = cpufreq.run(family.Call(params=module_params(cpufreq.ARGUMENT_SPEC, root=root, **args),
                                     warn=warnings.append))
    assert not result["changed"]
    assert any(w.startswith(warning) for w in warnings), warnings
    quiet = []
    cpufreq.run(family.Call(params=module_params(cpufreq.ARGUMENT_SPEC, root=root, preset_options=list(args),
                                                 **args), warn=quiet.append))
    assert not [w for w in quiet if "does not apply on this node" in w], quiet


def test_cpu_cstate_warns_when_the_node_has_no_cpuidle_unless_preset(build_node):
    root = build_node("tiny-vm")
    warnings = []
    result = cpuidle.run(family.Call(params=module_params(cpuidle.ARGUMENT_SPEC, root=root, disable=["C6"]),
                                     warn=warnings.append))
    assert result["supported"] is False
    assert warnings == ["disable=['C6'] does not apply on this node: this node has no cpuidle driver "
                        "(/sys/devices/system/cpu/cpuidle/current_driver is 'none')"], warnings
    quiet = []
    cpuidle.run(family.Call(params=module_params(cpuidle.ARGUMENT_SPEC, root=root, max_latency_us=2,
                                                 preset_options=["max_latency_us"]), warn=quiet.append))
    assert quiet == []


def test_setpci_mrrs_warns_about_a_named_device_without_pcie(build_node):
    root = build_node("tiny-vm")  # virtio functions: conventional PCI, no PCI Express capability

    def no_setpci():
        raise AssertionError("nothing is written, so setpci never starts")

    result = pcie_mrrs.run_mrrs(node_module.Node(root), no_setpci, None, False, mrrs=4096,
                                selector=pci.DeviceSelector(bdfs=["0000:00:03.0"]), allow_empty=True)
    assert [d["skipped"] for d in result["devices"]] == [True]
    assert result["warnings"] == ["0000:00:03.0: MRRS does not apply: it was named in bdfs but has no PCI Express "
                                  "capability (a conventional PCI function); it was skipped"]
    # Selected by vendor/class (a preset's selector), a function without PCIe is just skipped.
    quiet = pcie_mrrs.run_mrrs(node_module.Node(root), no_setpci, None, False, mrrs=4096,
                               selector=pci.DeviceSelector(vendor="1af4"), allow_empty=True)
    assert quiet["warnings"] == [] and all(d["skipped"] for d in quiet["devices"])


def test_pcie_acs_warns_when_no_bridge_has_acs_unless_preset(build_node, digest):
    root = build_node(gpus=1)
    path = os.path.join(acs.device_dir(node_module.Node(root), "0000:40:01.1"), "config")
    with open(path, "r+b") as fh:
        fh.seek(0x100)
        fh.write(bytes(4))  # no extended capability at all
    warnings = []
    result = acs.run(family.Call(params=module_params(acs.ARGUMENT_SPEC, root=root), warn=warnings.append))
    assert result["not_applicable"] and not result["changed"]
    assert warnings == ["mode=disable_redirect does not apply on this node: no bridge on the path of 0000:41:00.0 "
                        "has an ACS capability: redirect does not exist there"], warnings
    quiet = []
    acs.run(family.Call(params=module_params(acs.ARGUMENT_SPEC, root=root, preset_options=["mode"]), warn=quiet.append))
    assert quiet == []
