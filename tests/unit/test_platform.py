# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fit before tuned (issue 43): what a node cannot take is unsupported with its cause, never written, never a
reason to reboot; the NVIDIA driver is judged against what the GPUs need and the user's floors.

Every node is simulated (tools/simnode.py); the module runs are in-process.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import platform
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpufreq, gpu_health, gpu_health_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification as v
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify
from tools import simnode

DROPIN = "/etc/default/grub.d/60-gpunode-tuning.cfg"
PERSIST_SETTINGS = {"kernel_cmdline_enabled": True, "kernel_cmdline_dropin": DROPIN,
                    "kernel_cmdline_bootloader": "grub", "cpufreq_driver": "native",
                    "cpufreq_amd_pstate_mode": "active"}
CPUFREQ = {"driver": "native", "amd_pstate_mode": "active", "governor": "performance"}


def _facts(kernel=None, family=0x19, cppc=True, config="y", presence="builtin"):
    version = list(platform.parse_release(kernel) or []) or None
    cfg = None if config is None else {"CONFIG_X86_AMD_PSTATE": config, "CONFIG_X86_AMD_PSTATE_DEFAULT_MODE": None}
    return {"kernel": {"release": kernel, "version": version, "config": cfg, "config_source": "/boot/config-x",
                       "amd_pstate_driver": presence}, "cpu": {"family": family}, "acpi_cppc": cppc}


@pytest.mark.parametrize("facts, mode, ok, default, words", [
    # Ubuntu 22.04's GA kernel: no option, no module: the release and the mode's floor are named.
    (_facts("5.15.0-91-generic", config=None, presence=None), "active", False, False, ["5.15.0-91-generic", "6.3"]),
    (_facts("6.2.0-39-generic", config=None, presence=None), "guided", False, False, ["6.2.0-39-generic", "6.4"]),
    (_facts("6.1.0-28-amd64", config=None, presence=None), "passive", True, False, []),
    # RHEL 9 runs 5.14 with the driver backported: its configuration decides, not the release.
    (_facts("5.14.0-503.el9.x86_64"), "active", True, False, []),
    (_facts("6.8.0-79-generic", config="n"), "active", False, False, ["CONFIG_X86_AMD_PSTATE not set"]),
    (_facts("6.8.0-79-generic", config=None, presence="absent"), "active", False, False,
     ["neither built in nor in /lib/modules/6.8.0-79-generic"]),
    (_facts("6.8.0-79-generic", config="y", presence="absent"), "active", True, False, []),  # config first
    (_facts("6.8.0-79-generic", cppc=False), "active", False, False, ["ACPI CPPC is off", "firmware"]),
    # Zen 5 on 6.13+: the kernel's default, no argument; older Zen or kernel: an argument.
    (_facts("6.14.0-29-generic", family=0x1A), "active", True, True, ["0x1A", "6.13", "did not register"]),
    (_facts("6.12.9-amd64", family=0x1A), "active", True, False, []),
    (_facts("6.14.0-29-generic", family=0x19), "active", True, False, []),
    (None, "active", True, False, []),
])
def test_amd_pstate_feasibility(facts, mode, ok, default, words):
    got = platform.amd_pstate_feasibility(facts, mode)
    assert (got["ok"], got["default"]) == (ok, default), got
    assert all(w in got["reason"] for w in words), got["reason"]


def test_zen5_with_amd_pstate_disabled_on_the_command_line_names_it():
    got = platform.amd_pstate_feasibility(_facts("6.14.0-29-generic", family=0x1A), "active",
                                          ["ro", "amd_pstate=disable"])
    assert got["default"] and "amd_pstate=disable is on the command line" in got["reason"]


def _cpufreq(run_module, root, check, **options):
    result, failed = run_module("cpu_freq", dict(dict(CPUFREQ, **options), root=root), check=check)
    assert not failed, result
    return result


@pytest.mark.parametrize("kwargs, words", [
    ({"kernel": "5.15.0-91-generic"}, ["5.15.0-91-generic", "6.3"]),
    ({"cppc": False}, ["ACPI CPPC is off", "enable CPPC in the firmware"]),
])
def test_cpu_freq_writes_no_argument_and_asks_no_reboot_where_amd_pstate_cannot_run(build_node, run_module,
                                                                                    digest, kwargs, words):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0, **kwargs)
    check = _cpufreq(run_module, root, True)
    real = _cpufreq(run_module, root, False)
    for result in (check, real):  # --check --diff says what the run does
        assert result["kernel_args"] == [] and result["reboot_required"] is False
        assert all(w in result["unsupported"]["driver"] for w in words), result["unsupported"]
        assert all(w in result["settings"]["driver"]["reason"] for w in words)
    warnings = []
    params = dict(CPUFREQ, boost=None, epp=None, intel_pstate_status=None, required=False, restore=False,
                  journal=None, root=root)
    cpufreq.run(cpufreq.Call(params, check_mode=True, warn=warnings.append))
    assert any("no kernel argument is written and no reboot" in w and words[0] in w for w in warnings), warnings
    # Every other setting of the family is applied: the governor.
    assert real["settings"]["governor"]["after"] == {"performance": "0-1"}
    before = digest(root)
    assert _cpufreq(run_module, root, False)["changed"] is False and digest(root) == before


def test_persistent_kernel_cmdline_leaves_amd_pstate_out_on_an_old_kernel(build_node, run_module):
    old = build_node("audited-epyc-8gpu", cpus=2, gpus=0, kernel="5.15.0-91-generic")
    modern = build_node("audited-epyc-8gpu", cpus=2, gpus=0)
    desired = {"cpufreq": CPUFREQ, "kernel_cmdline": ["iommu=pt"]}
    for root, wanted in ((old, ["iommu=pt"]), (modern, ["iommu=pt", "amd_pstate=active"])):
        result, failed = run_module("tuning_persist", {"concerns": ["kernel_cmdline"], "desired": desired,
                                                       "settings": PERSIST_SETTINGS, "root": root})
        assert not failed, result
        with open(os.path.join(root, DROPIN.lstrip("/")), encoding="utf-8") as fh:
            text = fh.read()
        assert all(a in text for a in wanted) and ("amd_pstate" in text) == ("amd_pstate=active" in wanted), text
        assert result["concerns"]["kernel_cmdline"]["reboot_required"] is True  # iommu=pt still needs one
        # The flow's report names what it did not reboot for, and why (none on the modern node).
        unfit = result["not_rebooted_for"]
        assert sorted(unfit) == (["cpufreq.driver"] if root == old else []), unfit
        if root == old:
            assert "5.15.0-91-generic" in unfit["cpufreq.driver"] and "Linux 6.3" in unfit["cpufreq.driver"]
            assert "not rebooted for cpufreq.driver (the node cannot take it): amd-pstate active mode needs " \
                   "Linux 6.3" in result["summary"]["kernel_cmdline"]
    # Only the driver switch asked for a reboot: --check --diff says the same, and nothing is required.
    desired = {"cpufreq": CPUFREQ}
    for check in (True, False):
        result, failed = run_module("tuning_persist", {"concerns": ["kernel_cmdline"], "desired": desired,
                                                       "settings": PERSIST_SETTINGS, "root": old},
                                    check=check, diff=check)
        assert not failed and result["reboot_required"] is False and result["pending_kernel_args"] == []
        assert "5.15.0-91-generic" in result["not_rebooted_for"]["cpufreq.driver"]
        assert result["summary"]["kernel_cmdline"].startswith("skipped: no kernel argument to configure; not "
                                                              "rebooted for cpufreq.driver"), result["summary"]


def _verify(root, desired, **ctx):
    facts = verify.gather(Node(root))
    return facts, {s["id"]: s for s in v.evaluate_host(facts, desired, dict(ctx, root=root))["settings"]}


def test_verification_says_unsupported_with_the_cause_and_passes(build_node):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0, kernel="5.15.0-91-generic")
    facts, rows = _verify(root, {"cpufreq": {"driver": "native", "amd_pstate_mode": "active"}})
    row = rows["cpufreq.driver"]
    assert row["state"] == "unsupported" and "5.15.0-91-generic" in row["reason"] and "6.3" in row["reason"]
    assert facts["platform"]["kernel"]["config"] == {"CONFIG_X86_AMD_PSTATE": None,
                                                     "CONFIG_X86_AMD_PSTATE_DEFAULT_MODE": None}
    assert facts["platform"]["kernel"]["amd_pstate_driver"] == "absent"


@pytest.mark.parametrize("kwargs, cause", [({"cppc": False}, "ACPI CPPC is off"),
                                           ({"kernel": "5.15.0-91-generic"}, "this node runs 5.15.0-91-generic")])
def test_after_a_reboot_that_did_not_bring_amd_pstate_the_reason_is_the_cause(build_node, kwargs, cause):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0, **kwargs)
    with open(os.path.join(root, DROPIN.lstrip("/")), "w", encoding="utf-8") as fh:
        fh.write('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active"\n')
    report = simnode.reboot(root)
    assert report["cpufreq"]["after"] == ["acpi-cpufreq", None]  # the argument stays without effect
    _facts_, rows = _verify(root, {"cpufreq": {"driver": "amd-pstate", "amd_pstate_mode": "active"}})
    row = rows["cpufreq.driver"]
    assert row["state"] == "drifted" and "amd_pstate=active is on the running command line" in row["reason"]
    assert cause in row["reason"] and "_CPC object" not in row["reason"]  # the cause, not the list of causes


def test_zen5_runs_amd_pstate_by_default_and_without_cppc_says_why(build_node, run_module):
    default = build_node("epyc-zen5-default", cpus=2, gpus=0)
    assert simnode.running_cpufreq(default) == ("amd-pstate-epp", "active")
    assert _cpufreq(run_module, default, True)["kernel_args"] == []
    off = build_node("epyc-zen5-default", cpus=2, gpus=0, cppc=False)
    assert simnode.running_cpufreq(off) == ("acpi-cpufreq", None)
    result = _cpufreq(run_module, off, True)
    assert result["kernel_args"] == [] and not result["reboot_required"]
    assert "ACPI CPPC is off" in result["unsupported"]["driver"]


def test_zen5_still_on_acpi_cpufreq_names_the_cause_and_asks_nothing(build_node, run_module):
    root = build_node("epyc-zen5-default", cpus=2, gpus=0)
    simnode.set_cpufreq_driver(root, "acpi-cpufreq")
    with open(os.path.join(root, "proc/cmdline"), "a", encoding="utf-8") as fh:
        fh.write(" amd_pstate=disable")
    result = _cpufreq(run_module, root, False)
    assert result["kernel_args"] == [] and not result["reboot_required"]
    assert "amd_pstate=disable is on the command line" in result["unsupported"]["driver"]
    assert "Linux 6.13's default on CPU family 0x1A" in result["unsupported"]["driver"]


def _health(root, floors=None):
    facts = verify.gather(Node(root))
    desired = {"gpu_health": {"floors": floors or {}}}
    return {r["name"]: r for r in gpu_health_verify.evaluate(facts, desired, None)}, facts


@pytest.mark.parametrize("driver, floors, words", [
    ("proprietary:580.65.06", None, ["needs the open kernel modules", "runs the proprietary ones",
                                     "nvidia-transitions-fully-towards-open-source"]),
    ("open:570.124.06", None, ["needs NVIDIA driver 575.57.08 or newer", "runs 570.124.06", "NVIDIA/aicr/pull/2446"]),
    ("open:580.65.06", {"nvidia_driver": "590.44.01"}, ["needs NVIDIA driver 590.44.01", "gpunode_tuning_floors"]),
])
def test_blackwell_driver_fitness_fails_naming_each_gpu_the_driver_and_the_floor(build_node, driver, floors, words):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=2, nvidia_driver=driver)
    rows, facts = _health(root, floors)
    row = rows["driver_fitness"]
    assert row["state"] == "drifted" and row["fit"] is True
    assert all(w in row["reason"] for w in words), row["reason"]
    for bdf in facts["pci"]["nvidia_gpus"]:
        assert "GPU %s (0x2bb5, blackwell)" % bdf in row["reason"]
    # Verification fails (verify exits non-zero); the rollout's health gate and the post-reboot gate read the rows.
    result = v.evaluate_host(facts, {"gpu_health": {"floors": floors or {}}}, {"root": root})
    assert not result["ok"] and any("driver_fitness" in f for f in result["failures"]), result["failures"]
    assert {s["id"]: s for s in result["settings"]}["gpu_health.driver_fitness"]["reason"] == row["reason"]
    findings = gpu_health.health_findings(result)
    assert any(f.startswith("gpu_health.driver_fitness") for f in findings)


def test_a_fit_driver_passes_and_an_old_branch_is_a_warning(build_node):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=1, nvidia_driver="open:580.65.06")
    rows, facts = _health(root, {"nvidia_flavor": "any", "kernel": "6.8"})
    assert rows["driver_fitness"]["state"] == "applied"
    assert rows["kernel_floor"]["state"] == "drifted" and "6.1.0-28-amd64 is below the floor 6.8" in \
        rows["kernel_floor"]["reason"]
    old = build_node("xeon-4gpu-switch", cpus=2, gpus=1, nvidia_driver="proprietary:535.183.06")
    assert platform.eol_warnings(verify.gather(Node(old))["platform"]) == [
        "NVIDIA driver 535.183.06: branch R535 is past its end of life "
        "(https://github.com/NVIDIA/gpu-operator/issues/2613)"]


def test_an_old_branch_is_a_warning_of_the_verification_run(build_node, run_module, monkeypatch):
    from ansible.module_utils import basic

    warned = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, msg: warned.append(msg))
    old = build_node("xeon-4gpu-switch", cpus=2, gpus=1, nvidia_driver="proprietary:535.183.06")
    result, failed = run_module("tuning_info", {"root": old, "desired": {"gpu_health": {}}})
    assert not failed and result["verification"]["node"]["warnings"] == warned, warned
    assert len(warned) == 1 and "branch R535 is past its end of life" in warned[0]
    fit = build_node("xeon-4gpu-switch", cpus=2, gpus=1, nvidia_driver="open:580.65.06")
    del warned[:]
    result, failed = run_module("tuning_info", {"root": fit, "desired": {"gpu_health": {}}})
    assert not failed and warned == [] and result["verification"]["node"]["warnings"] == []


@pytest.mark.parametrize("floors, key", [
    ({"nvidia_driver": "latest"}, "floors.nvidia_driver"),
    ({"nvidia_flavor": "closed"}, "floors.nvidia_flavor"),
    ({"kernel": 6.8}, "floors.kernel"),
    ({"driver": "580"}, "floors.driver"),
    ("580", "floors"),
])
def test_the_precheck_refuses_bad_floors_naming_what_is_allowed(floors, key):
    problems = gpu_health.desired_problems({"floors": floors})
    assert [k for k, _m in problems] == [key]
    assert any(w in problems[0][1] for w in ("nvidia_driver, nvidia_flavor, kernel", "open, proprietary, any",
                                             "580.65.06", "6.8"))


def test_the_fleet_summary_lists_versions_and_what_hosts_cannot_take(build_node):
    desired = {"cpufreq": {"driver": "native", "amd_pstate_mode": "active"}, "gpu_health": {}}
    roots = {"old": build_node("audited-epyc-8gpu", cpus=2, gpus=1, kernel="5.15.0-91-generic",
                               nvidia_driver="proprietary:580.65.06"),
             "modern": build_node("audited-epyc-8gpu", cpus=2, gpus=1, nvidia_driver="open:580.65.06")}
    results = {h: v.evaluate_host(verify.gather(Node(r)), desired, {"root": r}, host=h) for h, r in roots.items()}
    fleet = v.fleet_summary(results)
    by = {(x["what"], x["version"], x["flavor"]): x for x in fleet["versions"]}
    assert by[("Kernel", "5.15.0-91-generic", None)] == {"what": "Kernel", "version": "5.15.0-91-generic",
                                                         "flavor": None, "hosts": ["old"], "unfit": ["old"]}
    assert by[("Kernel", "6.1.0-28-amd64", None)]["hosts"] == ["modern"]
    assert by[("NVIDIA driver", "580.65.06", "proprietary")]["unfit"] == ["old"]
    assert by[("NVIDIA driver", "580.65.06", "open")]["unfit"] == []
    unfit = {u["host"]: u["why"] for u in fleet["unfit"]}
    assert sorted(unfit) == ["old"] and any(w.startswith("cpufreq.driver: amd-pstate active mode needs Linux 6.3")
                                            for w in unfit["old"])


def test_a_whole_distribution_sized_config_and_modules_builtin_are_read(build_node):
    # A real config is ~250 KB and modules.builtin tens of KB: the options past 64 KB are read too.
    root = build_node("audited-epyc-8gpu", cpus=1, gpus=0)
    release = "6.1.0-28-amd64"
    filler = "".join("CONFIG_FILLER_%06d=y\n" % i for i in range(12000))
    with open(os.path.join(root, "boot", "config-" + release), "w", encoding="utf-8") as fh:
        fh.write(filler + "# CONFIG_X86_AMD_PSTATE is not set\n")
    with open(os.path.join(root, "lib/modules", release, "modules.builtin"), "w", encoding="utf-8") as fh:
        fh.write("".join("kernel/drivers/x/m%05d.ko\n" % i for i in range(4000))
                 + "kernel/drivers/cpufreq/amd-pstate.ko\n")
    facts = platform.read(Node(root))
    assert facts["kernel"]["config"]["CONFIG_X86_AMD_PSTATE"] == "n"
    assert facts["kernel"]["amd_pstate_driver"] == "builtin"
