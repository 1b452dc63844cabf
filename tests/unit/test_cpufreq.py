"""The cpufreq family: module_utils/families/cpufreq.py's planning functions and facts, then the cpu_freq
module (its API) through its entry point on every simulated-node preset.

Some tests put a small model of the kernel's behaviour in front of the simulated tree
(``fake_kernel``): EBUSY for a non-performance EPP under the performance governor, EPP forced to
performance by that governor, and the driver re-registering after an amd_pstate mode switch.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import cpu, cpu_freq, family
from ansible_collections.gpunode.tuning.plugins.module_utils.core import node as node_mod
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpufreq


def test_leaving_performance_for_powersave_and_balanced_epp_writes_governor_first():
    steps = cpu_freq.order_governor_epp("amd-pstate-epp", "performance", "powersave", "balance_performance")
    assert steps == [("governor", "powersave"), ("epp", "balance_performance")]


def test_entering_performance_with_performance_epp_is_allowed():
    steps = cpu_freq.order_governor_epp("amd-pstate-epp", "powersave", "performance", "performance")
    assert steps == [("governor", "performance"), ("epp", "performance")]


@pytest.mark.parametrize("driver", ["amd-pstate-epp", "intel_pstate"])
def test_performance_governor_with_other_epp_is_refused_before_writing(driver):
    with pytest.raises(cpu_freq.PlanError) as exc:
        cpu_freq.order_governor_epp(driver, "powersave", "performance", "balance_performance")
    msg = str(exc.value)
    assert "EBUSY" in msg and driver in msg and "governor=powersave" in msg and "epp=performance" in msg


def test_epp_alone_under_current_performance_governor_is_refused():
    with pytest.raises(cpu_freq.PlanError, match="the governor is performance"):
        cpu_freq.order_governor_epp("amd-pstate-epp", "performance", None, "power")


def test_epp_alone_under_powersave_is_one_write():
    assert cpu_freq.order_governor_epp("amd-pstate-epp", "powersave", None, "power") == [("epp", "power")]


def test_governor_already_set_is_left_out():
    assert cpu_freq.order_governor_epp("acpi-cpufreq", "performance", "performance", None) == []


def test_drivers_without_the_ebusy_rule_are_not_restricted():
    assert cpu_freq.order_governor_epp("intel_cpufreq", "performance", None, "power") == [("epp", "power")]


@pytest.mark.parametrize("driver,family", [
    ("amd-pstate", "amd-pstate"), ("amd-pstate-epp", "amd-pstate"), ("intel_pstate", "intel_pstate"),
    ("intel_cpufreq", "intel_pstate"), ("acpi-cpufreq", "acpi-cpufreq")])
def test_driver_family(driver, family):
    assert cpu.driver_family(driver) == family


@pytest.mark.parametrize("family,mode,driver", [
    ("amd-pstate", "active", "amd-pstate-epp"), ("amd-pstate", "passive", "amd-pstate"),
    ("amd-pstate", "guided", "amd-pstate"), ("intel_pstate", "active", "intel_pstate"),
    ("intel_pstate", "passive", "intel_cpufreq")])
def test_driver_for_mode(family, mode, driver):
    assert cpu_freq.driver_for_mode(family, mode) == driver


def test_driver_change_from_acpi_cpufreq_to_amd_pstate_needs_a_reboot():
    assert cpu_freq.driver_change("acpi-cpufreq", "amd-pstate", "AuthenticAMD") == (True, ["amd_pstate=active"])
    assert cpu_freq.driver_change("acpi-cpufreq", "amd-pstate", "AuthenticAMD", "guided") == \
        (True, ["amd_pstate=guided"])


def test_driver_change_same_family_or_none_asked_needs_nothing():
    assert cpu_freq.driver_change("amd-pstate-epp", "amd-pstate", "AuthenticAMD") == (False, [])
    assert cpu_freq.driver_change("acpi-cpufreq", None, "AuthenticAMD") == (False, [])


def test_driver_change_back_to_acpi_cpufreq_disables_the_pstate_driver():
    assert cpu_freq.driver_change("amd-pstate", "acpi-cpufreq", "AuthenticAMD") == (True, ["amd_pstate=disable"])
    assert cpu_freq.driver_change("intel_pstate", "acpi-cpufreq", "GenuineIntel") == (True, ["intel_pstate=disable"])


def test_driver_change_to_a_driver_of_the_other_vendor_is_refused():
    with pytest.raises(cpu_freq.PlanError, match="needs an AMD CPU.*GenuineIntel"):
        cpu_freq.driver_change("intel_pstate", "amd-pstate", "GenuineIntel")
    with pytest.raises(cpu_freq.PlanError, match="needs an Intel CPU"):
        cpu_freq.driver_change("acpi-cpufreq", "intel_pstate", "AuthenticAMD")


def test_driver_kernel_args_lists_what_each_desired_driver_can_add():
    assert cpu_freq.driver_kernel_args("native").removable == ["amd_pstate=active", "intel_pstate=active"]
    assert cpu_freq.driver_kernel_args("native", "guided").removable == ["amd_pstate=guided", "intel_pstate=active"]
    assert cpu_freq.driver_kernel_args("amd-pstate", "passive").removable == ["amd_pstate=passive"]
    assert cpu_freq.driver_kernel_args("intel_pstate").removable == ["intel_pstate=active"]
    assert cpu_freq.driver_kernel_args("acpi-cpufreq").removable == ["amd_pstate=disable", "intel_pstate=disable"]
    assert cpu_freq.driver_kernel_args(None).removable == []


@pytest.mark.parametrize("wanted", ["native", "amd-pstate", "intel_pstate", "acpi-cpufreq"])
@pytest.mark.parametrize("mode", [None, "active", "guided"])
def test_driver_kernel_args_is_exactly_what_driver_change_can_plan(wanted, mode):
    # The rollback removes driver_kernel_args(wanted): every argument the persistent flow can have
    # configured through driver_change, on a node of either vendor running any driver, and no other.
    planned = set()
    for vendor in ("AuthenticAMD", "GenuineIntel"):
        try:
            family = cpu_freq.resolve_driver(wanted, vendor)
        except cpu_freq.PlanError:
            continue
        for current in ("acpi-cpufreq", "amd-pstate", "amd-pstate-epp", "intel_pstate", "intel_cpufreq", None):
            try:
                planned.update(cpu_freq.driver_change(current, family, vendor, mode)[1])
            except cpu_freq.PlanError:
                continue
    assert planned == set(cpu_freq.driver_kernel_args(wanted, mode).removable)


@pytest.mark.parametrize("wanted,mode,vendor,running,needed", [
    ("acpi-cpufreq", None, "AuthenticAMD", "amd-pstate-epp", ["amd_pstate=disable"]),
    ("acpi-cpufreq", None, "AuthenticAMD", "amd-pstate", ["amd_pstate=disable"]),
    ("acpi-cpufreq", None, "GenuineIntel", "intel_pstate", ["intel_pstate=disable"]),
    ("acpi-cpufreq", None, "GenuineIntel", "intel_cpufreq", ["intel_pstate=disable"]),
    ("acpi-cpufreq", None, "AuthenticAMD", "acpi-cpufreq", []),
    ("amd-pstate", "guided", "AuthenticAMD", "acpi-cpufreq", ["amd_pstate=guided"]),
    ("amd-pstate", None, "AuthenticAMD", "acpi-cpufreq", ["amd_pstate=active"]),
    ("amd-pstate", "passive", "AuthenticAMD", "amd-pstate-epp", []),
    ("native", "passive", "AuthenticAMD", "acpi-cpufreq", ["amd_pstate=passive"]),
    ("native", None, "GenuineIntel", "acpi-cpufreq", ["intel_pstate=active"]),
    ("native", None, "arm64 (CPU implementer 0x41)", "cppc_cpufreq", []),
    ("intel_pstate", None, "GenuineIntel", "acpi-cpufreq", ["intel_pstate=active"]),
    (None, None, "GenuineIntel", "acpi-cpufreq", []),
])
def test_driver_kernel_args_needed_on_one_node(wanted, mode, vendor, running, needed):
    args = cpu_freq.driver_kernel_args(wanted, mode, vendor, running)
    assert args.needed == needed
    assert set(needed) <= set(args.removable)  # the rollback removes what was configured


def test_driver_kernel_args_refuses_a_driver_the_cpu_cannot_run():
    with pytest.raises(cpu_freq.PlanError, match="needs an AMD CPU"):
        cpu_freq.driver_kernel_args("amd-pstate", None, "GenuineIntel", "intel_pstate")
    with pytest.raises(cpu_freq.PlanError, match="x86 CPUs only"):
        cpu_freq.driver_kernel_args("acpi-cpufreq", None, "arm64 (CPU implementer 0x41)", "cppc_cpufreq")


def test_group_by_value_aggregates_cpus():
    assert cpu_freq.group_by_value({0: "a", 1: "a", 2: "b", 3: "a", 4: None}) == {"a": "0-1,3", "b": "2"}


def test_boost_value_inverts_no_turbo():
    assert cpu_freq.boost_value(cpu_freq.BOOST, True) == "1"
    assert cpu_freq.boost_value(cpu_freq.INTEL_NO_TURBO, True) == "0"
    assert cpu_freq.boost_value(cpu_freq.INTEL_NO_TURBO, False) == "1"


def test_read_policies_and_node_state(build_node):
    node = Node(build_node("epyc-pstate-epp", cpus=4))
    freq = cpu_freq.NodeFreq(node)
    assert [p.cpus for p in freq.policies] == [[0], [1], [2], [3]]
    p = freq.policies[0]
    assert (p.driver, p.governor, p.epp) == ("amd-pstate-epp", "powersave", "balance_performance")
    assert p.governors == ["performance", "powersave"] and "power" in p.epps
    assert (freq.amd_status, freq.boost, freq.boost_file) == ("active", True, cpu_freq.BOOST)
    assert cpufreq.cpu_vendor(node) == "AuthenticAMD"


def test_intel_boost_is_read_from_no_turbo(build_node):
    freq = cpu_freq.NodeFreq(Node(build_node("xeon-4gpu-switch", cpus=2)))
    assert (freq.boost_file, freq.boost, freq.intel_status) == (cpu_freq.INTEL_NO_TURBO, True, "active")


def test_policy_covering_several_cpus_is_one_policy(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4)
    node = Node(root)
    node.write("0-1\n", cpu_freq.CPUFREQ_DIR, "policy0", "affected_cpus")
    node.write("\n", cpu_freq.CPUFREQ_DIR, "policy1", "affected_cpus")  # CPU 1 moved into policy0
    policies = cpu_freq.read_policies(node)
    assert [p.cpus for p in policies] == [[0, 1], [2], [3]]
    assert cpu_freq.per_cpu(policies, "governor") == {0: "schedutil", 1: "schedutil", 2: "schedutil", 3: "schedutil"}


def _params(**kw):
    base = dict(governor=None, epp=None, boost=None, amd_pstate_mode=None, intel_pstate_status=None, driver=None)
    base.update(kw)
    return base


def test_validate_mode_switch_to_active_knows_the_governors(build_node):
    freq = cpu_freq.NodeFreq(Node(build_node("epyc-pstate-epp", cpus=2)))
    freq.amd_status = "passive"
    with pytest.raises(cpu_freq.PlanError, match="available governors: performance, powersave"):
        cpu_freq.validate(_params(amd_pstate_mode="active", governor="schedutil"), freq, "AuthenticAMD")


def test_validate_mode_switch_to_passive_defers_the_governor_check(build_node):
    freq = cpu_freq.NodeFreq(Node(build_node("epyc-pstate-epp", cpus=2)))
    plan = cpu_freq.validate(_params(amd_pstate_mode="passive", governor="schedutil"), freq, "AuthenticAMD")
    assert plan["deferred"] and plan["driver_after"] == "amd-pstate"
    assert plan["mode"] == (cpu_freq.AMD_PSTATE_STATUS, "amd_pstate_mode", "passive")


# -- CPUs without a vendor pstate driver (arm64), and the applicability rule

ARM64_CPUINFO = ["processor\t: 0\n", "BogoMIPS\t: 2000.00\n", "Features\t: fp asimd evtstrm aes\n",
                 "CPU implementer\t: 0x41\n", "CPU architecture: 8\n", "CPU variant\t: 0x0\n",
                 "CPU part\t: 0xd4f\n", "CPU revision\t: 0\n"]


def test_vendor_from_cpuinfo_reads_x86_vendor_id_and_the_arm64_implementer():
    assert cpu.vendor_from_cpuinfo(["processor\t: 0\n", "vendor_id\t: AuthenticAMD\n"]) == "AuthenticAMD"
    assert cpu.vendor_from_cpuinfo(ARM64_CPUINFO) == "arm64 (CPU implementer 0x41)"
    assert cpu.vendor_from_cpuinfo([]) is None


def test_cpu_vendor_of_the_arm64_preset(build_node):
    assert cpufreq.cpu_vendor(Node(build_node("grace-arm64-4gpu", cpus=2, gpus=1))) == "arm64 (CPU implementer 0x41)"


@pytest.mark.parametrize("vendor", ["arm64 (CPU implementer 0x41)", "HygonGenuine", None])
def test_native_without_a_vendor_pstate_driver_keeps_the_running_driver(vendor):
    assert cpu_freq.resolve_driver("native", vendor) is None
    running = dict(driver="cppc_cpufreq", amd_status=None, intel_status=None, epp=False, boost=False)
    wanted, reasons = cpu_freq.applicability({"driver": "native", "governor": "performance"}, vendor, running)
    assert wanted is None and list(reasons) == ["driver"]
    assert reasons["driver"].endswith("so the running driver cppc_cpufreq is kept")
    assert cpu_freq.driver_change("cppc_cpufreq", wanted, vendor) == (False, [])


@pytest.mark.parametrize("wanted", ["amd-pstate", "intel_pstate", "acpi-cpufreq"])
def test_x86_drivers_are_refused_on_arm64(wanted):
    with pytest.raises(cpu_freq.PlanError, match="driver=%s exists on x86 CPUs only" % wanted):
        cpu_freq.driver_change("cppc_cpufreq", wanted, "arm64 (CPU implementer 0x41)")


ACPI = dict(driver="acpi-cpufreq", amd_status=None, intel_status=None, epp=False, boost=True)
EPP_ACTIVE = dict(driver="amd-pstate-epp", amd_status="active", intel_status=None, epp=True, boost=True)
PASSIVE = dict(driver="amd-pstate", amd_status="passive", intel_status=None, epp=False, boost=True)


@pytest.mark.parametrize("desired,running,wanted,keys", [
    # The preset's amd-pstate mode applies only where amd-pstate is the desired driver.
    ({"driver": "acpi-cpufreq", "amd_pstate_mode": "active"}, ACPI, "acpi-cpufreq", {"amd_pstate_mode"}),
    ({"driver": "native", "amd_pstate_mode": "active"}, ACPI, "amd-pstate", set()),
    ({"driver": "amd-pstate", "amd_pstate_mode": "active", "epp": "performance"}, ACPI, "amd-pstate", set()),
    ({"amd_pstate_mode": "active", "intel_pstate_status": "active"}, EPP_ACTIVE, None, {"intel_pstate_status"}),
    # EPP: not on a driver without one, not in a mode without one; yes once a switch brings it.
    ({"epp": "performance"}, ACPI, None, {"epp"}),
    ({"driver": "acpi-cpufreq", "epp": "performance"}, EPP_ACTIVE, "acpi-cpufreq", {"epp"}),
    ({"amd_pstate_mode": "passive", "epp": "performance"}, EPP_ACTIVE, None, {"epp"}),
    ({"amd_pstate_mode": "active", "epp": "performance"}, PASSIVE, None, set()),
    ({"epp": "performance"}, PASSIVE, None, {"epp"}),
    # Boost: only where a boost control exists.
    ({"boost": True}, dict(ACPI, boost=False), None, {"boost"}),
    ({"boost": False}, ACPI, None, set()),
])
def test_applicability_of_the_preset_knobs(desired, running, wanted, keys):
    got_wanted, reasons = cpu_freq.applicability(desired, "AuthenticAMD", running)
    assert got_wanted == wanted and set(reasons) == keys, reasons


def _params(**kw):
    params = {k: None for k in ("governor", "epp", "boost", "amd_pstate_mode", "intel_pstate_status", "driver")}
    params.update(required=False, restore=False, journal=None)
    params.update(kw)
    return params


def test_run_is_plain_python_returning_the_result_or_raising(build_node, digest, tmp_path):
    # The module is a thin adapter: run() needs no AnsibleModule and never exits the process.
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=1)
    warnings = []
    call = cpufreq.Call(_params(governor="performance", driver="amd-pstate", root=root), check_mode=True,
                        warn=warnings.append)
    result = cpufreq.run(call)
    assert result["changed"] and result["reboot_required"] and result["kernel_args"] == ["amd_pstate=active"]
    before = digest(root)
    # The options are checked before the node is opened: a bad root is not what this call reports.
    with pytest.raises(family.FamilyError, match="nothing to do"):
        cpufreq.run(cpufreq.Call(_params(root=str(tmp_path / "gone"))))
    with pytest.raises(family.FamilyError, match="root .*gone does not exist"):
        cpufreq.run(cpufreq.Call(_params(governor="performance", root=str(tmp_path / "gone"))))
    # A kernel governor this node's driver does not offer (amd-pstate-epp: performance, powersave).
    epp_node = build_node("epyc-pstate-epp", cpus=2, gpus=1)
    epp_before = digest(epp_node)
    with pytest.raises(cpufreq.CpufreqError, match="not offer|available") as exc:
        cpufreq.run(cpufreq.Call(_params(governor="schedutil", root=epp_node)))
    assert exc.value.result["supported"] is True
    # A name that is no cpufreq governor at all is refused before the node is read.
    with pytest.raises(cpufreq.CpufreqError, match="'turbo' is not a cpufreq governor") as exc:
        cpufreq.run(cpufreq.Call(_params(governor="turbo", root=str(tmp_path / "gone"))))
    assert digest(root) == before and digest(epp_node) == epp_before


CPU = "sys/devices/system/cpu"
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
EPP_CHOICES = "default performance balance_performance balance_power power"
PASSIVE_GOVERNORS = "conservative ondemand powersave performance schedutil"
FREQ_PRESETS = ["audited-epyc-8gpu", "epyc-pstate-epp", "locked-bus-perf", "xeon-4gpu-switch"]


def read(root, rel):
    with open(os.path.join(root, rel)) as fh:
        return fh.read().strip()


def cpu_files(root):
    """{relative path: content} of every file below sys/devices/system/cpu except cpuidle."""
    out = {}
    base = os.path.join(root, CPU)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != "cpuidle" and not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, root)] = fh.read()
    return out


def policy_values(root, attr):
    base = os.path.join(root, CPU, "cpufreq")
    return {p: read(root, os.path.join(CPU, "cpufreq", p, attr)) for p in os.listdir(base) if p.startswith("policy")}


@pytest.fixture
def fake_kernel(monkeypatch):
    """Model the kernel behaviour the module must plan around; returns the list of writes made."""
    writes = []
    real_write = node_mod.Node.write
    epp_cache = {}

    def _put(path, value):
        with open(path, "w") as fh:
            fh.write(value + "\n")

    def write(self, value, *parts):
        full = self.path(*parts)
        policy = os.path.dirname(full)
        name = os.path.basename(full)
        text = str(value).strip()
        driver = read(policy, "scaling_driver") if os.path.exists(os.path.join(policy, "scaling_driver")) else ""
        if name == "energy_performance_preference" and driver in ("amd-pstate-epp", "intel_pstate") \
                and read(policy, "scaling_governor") == "performance" and text != "performance":
            raise node_mod.NodeError("writing %r to %s failed: Device or resource busy" % (value, full))
        writes.append((os.path.relpath(full, self.root), text))
        real_write(self, value, *parts)
        epp = os.path.join(policy, "energy_performance_preference")
        if name == "scaling_governor" and os.path.exists(epp):
            if text == "performance":
                epp_cache[policy] = read(policy, "energy_performance_preference")
                _put(epp, "performance")
            elif policy in epp_cache:
                _put(epp, epp_cache.pop(policy))
        if full.endswith("amd_pstate/status"):
            cpufreq = os.path.join(self.root, CPU, "cpufreq")
            for p in (os.path.join(cpufreq, d) for d in os.listdir(cpufreq) if d.startswith("policy")):
                if text == "active":
                    _put(os.path.join(p, "scaling_driver"), "amd-pstate-epp")
                    _put(os.path.join(p, "scaling_available_governors"), "performance powersave")
                    _put(os.path.join(p, "scaling_governor"), "powersave")
                    _put(os.path.join(p, "energy_performance_preference"), "balance_performance")
                    _put(os.path.join(p, "energy_performance_available_preferences"), EPP_CHOICES)
                else:
                    # A kernel built without the userspace governor: the new driver's list is not the old one.
                    _put(os.path.join(p, "scaling_driver"), "amd-pstate")
                    _put(os.path.join(p, "scaling_available_governors"), PASSIVE_GOVERNORS)
                    _put(os.path.join(p, "scaling_governor"), "schedutil")
                    for f in ("energy_performance_preference", "energy_performance_available_preferences"):
                        if os.path.exists(os.path.join(p, f)):
                            os.unlink(os.path.join(p, f))

    monkeypatch.setattr(node_mod.Node, "write", write)
    return writes


# -- Every preset


@pytest.mark.parametrize("preset", FREQ_PRESETS)
def test_performance_governor_and_boost_off_on_every_cpu_and_nothing_else(build_node, run_module, digest, preset):
    root = build_node(preset)
    before = cpu_files(root)
    result, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "boost": False}, diff=True)
    assert not failed, result
    after = cpu_files(root)
    policies = policy_values(root, "scaling_governor")
    assert set(policies.values()) == {"performance"}
    intel = preset.startswith("xeon")
    boost_file = CPU + ("/intel_pstate/no_turbo" if intel else "/cpufreq/boost")
    assert read(root, boost_file) == ("1" if intel else "0")
    changed = {k for k in after if after[k] != before[k]}
    expected = {os.path.join(CPU, "cpufreq", p, "scaling_governor") for p in policies} | {boost_file}
    if preset == "xeon-4gpu-switch":  # the preset starts at powersave; the others elsewhere
        assert result["settings"]["governor"]["before"] == {"powersave": "0-%d" % (len(policies) - 1)}
    assert changed == expected
    gov = result["settings"]["governor"]
    assert gov["after"] == {"performance": "0-%d" % (len(policies) - 1)}
    assert gov["cpus_changed"] == gov["cpus"] == gov["cpus_desired"] == len(policies)
    assert result["settings"]["boost"]["before"] is True and result["settings"]["boost"]["after"] is False
    assert "governor: performance on 0-" in result["diff"]["after"] and "boost: off" in result["diff"]["after"]
    snapshot = digest(root)
    again, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "boost": False})
    assert not failed and not again["changed"] and again["settings"]["governor"]["cpus_changed"] == 0
    assert digest(root) == snapshot


@pytest.mark.parametrize("preset", FREQ_PRESETS)
def test_check_mode_writes_nothing(build_node, run_module, digest, preset):
    root = build_node(preset, cpus=4)
    before = digest(root)
    result, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "boost": False,
                                             "journal": JOURNAL}, check=True, diff=True)
    assert not failed and result["changed"]
    assert result["settings"]["governor"]["after"] == {"performance": "0-3"}
    assert result["settings"]["boost"]["after"] is False
    assert digest(root) == before


@pytest.mark.parametrize("preset", FREQ_PRESETS)
def test_journal_then_restore_is_byte_identical(build_node, run_module, digest, preset):
    root = build_node(preset, cpus=6)
    before = digest(root)
    args = {"root": root, "governor": "performance", "boost": False, "journal": JOURNAL}
    result, failed = run_module("cpu_freq", args)
    assert not failed and result["changed"]
    with open(os.path.join(root, JOURNAL.lstrip("/"))) as fh:
        journal = json.load(fh)
    assert journal["families"]["cpufreq"]["boost"]["original"] is True
    assert journal["last_applied"]["family"] == "cpufreq"
    result, failed = run_module("cpu_freq", {"root": root, "restore": True, "journal": JOURNAL}, diff=True)
    assert not failed, result
    assert result["changed"] and result["settings"]["boost"]["after"] is True
    assert not os.path.exists(os.path.join(root, JOURNAL.lstrip("/")))
    assert digest(root) == before


def test_restore_keeps_other_families(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=2)
    jpath = os.path.join(root, JOURNAL.lstrip("/"))
    os.makedirs(os.path.dirname(jpath))
    other = {"version": 1, "families": {"cpuidle": {"C2": {"original": {"0": "0-1"}, "recorded": "x"}}}}
    with open(jpath, "w") as fh:
        json.dump(other, fh)
    before = digest(root)
    run_module("cpu_freq", {"root": root, "governor": "performance", "journal": JOURNAL})
    result, failed = run_module("cpu_freq", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed and result["settings"]["governor"]["after"] == {"schedutil": "0-1"}
    with open(jpath) as fh:
        assert json.load(fh)["families"] == other["families"]
    with open(jpath, "w") as fh:
        json.dump(other, fh)
    assert digest(root) == before


def test_no_cpufreq_is_unsupported_unless_required(build_node, run_module, digest):
    root = build_node("tiny-vm")
    before = digest(root)
    result, failed = run_module("cpu_freq", {"root": root, "governor": "performance"})
    assert not failed and result["supported"] is False and not result["changed"]
    assert "no cpufreq policies" in result["reason"]
    result, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "required": True})
    assert failed and "no cpufreq policies" in result["msg"]
    assert digest(root) == before


# -- Driver, mode, EPP ordering


def test_amd_pstate_on_acpi_cpufreq_asks_for_a_reboot_and_changes_nothing(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    before = digest(root)
    result, failed = run_module("cpu_freq", {"root": root, "driver": "amd-pstate"})
    assert not failed and not result["changed"]
    assert result["reboot_required"] is True and result["kernel_args"] == ["amd_pstate=active"]
    assert result["driver"] == "acpi-cpufreq" and result["settings"]["driver"]["skipped"] is True
    assert digest(root) == before


def test_pending_amd_pstate_skips_mode_and_epp_but_applies_the_governor(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    result, failed = run_module("cpu_freq", {"root": root, "driver": "amd-pstate", "amd_pstate_mode": "passive",
                                             "epp": "performance", "governor": "performance"})
    assert not failed, result
    assert result["kernel_args"] == ["amd_pstate=passive"]
    # Passive mode runs amd-pstate without EPP: the EPP does not apply, not even after the reboot.
    assert result["settings"]["epp"]["skipped"] and "amd_pstate_mode=passive runs the amd-pstate driver, which has " \
        "no energy performance preference" in result["settings"]["epp"]["reason"]
    assert result["settings"]["amd_pstate_mode"]["skipped"]
    assert "after the reboot into it (amd_pstate=passive)" in result["settings"]["amd_pstate_mode"]["reason"]
    assert set(policy_values(root, "scaling_governor").values()) == {"performance"}
    assert not os.path.exists(os.path.join(root, CPU, "amd_pstate"))


def test_running_amd_pstate_needs_no_reboot(build_node, run_module):
    root = build_node("epyc-pstate-epp", cpus=2)
    result, failed = run_module("cpu_freq", {"root": root, "driver": "amd-pstate"})
    assert not failed and result["reboot_required"] is False and result["kernel_args"] == []


def test_epp_order_from_performance_to_powersave_writes_governor_first(build_node, run_module, fake_kernel):
    root = build_node("epyc-pstate-epp", cpus=4)
    result, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "epp": "performance"})
    assert not failed, result
    assert set(policy_values(root, "energy_performance_preference").values()) == {"performance"}
    del fake_kernel[:]
    result, failed = run_module("cpu_freq", {"root": root, "governor": "powersave", "epp": "balance_power"})
    assert not failed, result
    kinds = [os.path.basename(write[0]) for write in fake_kernel]
    assert kinds == ["scaling_governor"] * 4 + ["energy_performance_preference"] * 4
    assert set(policy_values(root, "energy_performance_preference").values()) == {"balance_power"}
    assert result["settings"]["epp"]["before"] == {"performance": "0-3"}


def test_performance_governor_with_balanced_epp_is_refused_before_writing(build_node, run_module, digest):
    root = build_node("epyc-pstate-epp", cpus=4)
    before = digest(root)
    result, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "epp": "balance_performance"})
    assert failed and "EBUSY" in result["msg"] and "governor=powersave" in result["msg"]
    assert digest(root) == before


def test_governor_performance_then_restore_gets_the_epp_back(build_node, run_module, digest, fake_kernel):
    root = build_node("epyc-pstate-epp", cpus=4)
    before = digest(root)
    run_module("cpu_freq", {"root": root, "governor": "performance", "journal": JOURNAL})
    assert set(policy_values(root, "energy_performance_preference").values()) == {"performance"}
    result, failed = run_module("cpu_freq", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed, result
    assert digest(root) == before


def test_amd_pstate_mode_switch_rereads_the_driver_before_the_governor(build_node, run_module, digest, fake_kernel):
    root = build_node("epyc-pstate-epp", cpus=4)
    before = digest(root)
    args = {"root": root, "amd_pstate_mode": "passive", "governor": "ondemand", "journal": JOURNAL}
    result, failed = run_module("cpu_freq", args, diff=True)
    assert not failed, result
    assert read(root, CPU + "/amd_pstate/status") == "passive"
    assert result["driver"] == "amd-pstate"
    assert set(policy_values(root, "scaling_governor").values()) == {"ondemand"}
    assert result["settings"]["amd_pstate_mode"]["before"] == "active"
    assert fake_kernel[0] == (CPU + "/amd_pstate/status", "passive")
    result, failed = run_module("cpu_freq", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed, result
    assert digest(root) == before


def test_amd_pstate_mode_switch_in_check_mode_predicts_the_driver(build_node, run_module, digest):
    root = build_node("epyc-pstate-epp", cpus=2)
    before = digest(root)
    result, failed = run_module("cpu_freq", {"root": root, "amd_pstate_mode": "guided", "governor": "schedutil"},
                                check=True)
    assert not failed and result["changed"] and result["driver"] == "amd-pstate"
    assert result["settings"]["amd_pstate_mode"]["after"] == "guided"
    assert digest(root) == before


def test_governor_missing_after_mode_switch_fails_naming_the_new_list(build_node, run_module, fake_kernel):
    root = build_node("epyc-pstate-epp", cpus=2)
    result, failed = run_module("cpu_freq", {"root": root, "amd_pstate_mode": "passive", "governor": "userspace"})
    assert failed and result["failed_settings"] == ["governor"]
    assert "conservative, ondemand" in result["msg"]
    assert read(root, CPU + "/amd_pstate/status") == "passive"  # the mode switch itself was applied


def test_intel_pstate_boost_status_and_epp(build_node, run_module, digest):
    root = build_node("xeon-4gpu-switch", cpus=4)
    before = digest(root)
    result, failed = run_module("cpu_freq", {"root": root, "boost": False, "epp": "balance_power",
                                             "intel_pstate_status": "passive", "journal": JOURNAL})
    assert not failed, result
    assert read(root, CPU + "/intel_pstate/no_turbo") == "1"
    assert read(root, CPU + "/intel_pstate/status") == "passive"
    assert set(policy_values(root, "energy_performance_preference").values()) == {"balance_power"}
    assert result["settings"]["boost"]["file"] == "/" + CPU + "/intel_pstate/no_turbo"
    result, failed = run_module("cpu_freq", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed, result
    assert digest(root) == before


def test_write_that_does_not_take_fails_and_the_rest_is_applied(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    bad = os.path.join(root, CPU, "cpufreq/policy2/scaling_governor")
    os.unlink(bad)
    os.mkdir(bad)
    result, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "boost": False})
    assert failed and result["failed_settings"] == ["governor"]
    assert "policy2/scaling_governor" in result["msg"]
    assert [read(root, CPU + "/cpufreq/policy%d/scaling_governor" % i) for i in (0, 1, 3)] == ["performance"] * 3
    assert read(root, CPU + "/cpufreq/boost") == "0"


# -- Bad inputs

BAD_INPUTS = [
    ("audited-epyc-8gpu", {"governor": "turbo"},
     "governor 'turbo' is not a cpufreq governor: allowed are performance, powersave, schedutil, ondemand, "
     "conservative, userspace"),
    ("epyc-pstate-epp", {"governor": "schedutil"},
     "governor schedutil is not available with driver amd-pstate-epp; available governors: performance, powersave"),
    ("epyc-pstate-epp", {"epp": "fast"}, "epp 'fast' is not an energy performance preference: allowed are default, "
                                         "performance, balance_performance, balance_power, power, or a raw value"),
    ("epyc-pstate-epp", {"epp": "128"}, "available preferences: default, performance, balance_performance"),
    ("epyc-pstate-epp", {"amd_pstate_mode": "turbo"}, "active, passive, guided"),
    ("epyc-pstate-epp", {"governor": "performance", "epp": "power"}, "EBUSY"),
    ("audited-epyc-8gpu", {"driver": "intel_pstate"}, "needs an Intel CPU"),
    ("xeon-4gpu-switch", {"driver": "amd-pstate"}, "needs an AMD CPU"),
    ("grace-arm64-4gpu", {"driver": "acpi-cpufreq"},
     "driver=acpi-cpufreq exists on x86 CPUs only; this node's CPU is arm64 (CPU implementer 0x41), running "
     "cppc_cpufreq: use driver=native to keep the running driver"),
    ("grace-arm64-4gpu", {"driver": "amd-pstate"}, "driver=amd-pstate exists on x86 CPUs only"),
    ("grace-arm64-4gpu", {"governor": "turbo"}, "governor 'turbo' is not a cpufreq governor"),
    # amd-pstate running without a status file (kernels before 6.3): the mode cannot be switched.
    ("epyc-pstate-epp-no-status", {"amd_pstate_mode": "passive"},
     "amd_pstate_mode=passive needs /sys/devices/system/cpu/amd_pstate/status, which this node does not have"),
    ("audited-epyc-8gpu", {"driver": "amd_pstate"}, "amd-pstate, acpi-cpufreq, intel_pstate"),
    ("audited-epyc-8gpu", {"restore": True}, "restore=true needs the journal option"),
    ("audited-epyc-8gpu", {}, "give at least one of governor, epp, boost"),
    ("audited-epyc-8gpu", {"governor": " "}, "governor must not be empty"),
    ("audited-epyc-8gpu", {"boost": "maybe"}, "boost"),
]


@pytest.mark.parametrize("preset,args,message", BAD_INPUTS)
def test_bad_inputs_fail_naming_what_is_allowed_and_write_nothing(build_node, run_module, digest, preset, args,
                                                                  message):
    root = build_node(preset.replace("-no-status", ""), cpus=4)
    if preset.endswith("-no-status"):
        os.unlink(os.path.join(root, CPU, "amd_pstate/status"))
    before = digest(root)
    extra = {} if "restore" in args else {"journal": JOURNAL}  # a journal must not be written either
    result, failed = run_module("cpu_freq", dict(args, root=root, **extra))
    assert failed
    assert message in result["msg"]
    assert digest(root) == before


# -- A preset's knob for another driver: not applicable, with the reason, never an error

# (preset, args, {setting: reason fragment} of the settings that do not apply, reboot kernel args)
NOT_APPLICABLE = [
    # The audited EPYC pinned to acpi-cpufreq with the default preset (issue 12, class 6).
    ("audited-epyc-8gpu", {"driver": "acpi-cpufreq", "amd_pstate_mode": "active"},
     {"amd_pstate_mode": "amd_pstate_mode applies to the amd-pstate driver only; the desired driver is acpi-cpufreq"},
     []),
    # ... with the inference-latency preset: EPP too; boost exists there and applies.
    ("audited-epyc-8gpu", {"driver": "acpi-cpufreq", "amd_pstate_mode": "active", "epp": "performance",
                           "boost": True},
     {"amd_pstate_mode": "the desired driver is acpi-cpufreq",
      "epp": "driver acpi-cpufreq has no energy performance preference"}, []),
    # No driver asked: the running one is the desired one.
    ("audited-epyc-8gpu", {"amd_pstate_mode": "active", "intel_pstate_status": "active"},
     {"amd_pstate_mode": "this node keeps its running driver acpi-cpufreq",
      "intel_pstate_status": "intel_pstate_status applies to the intel_pstate driver only"}, []),
    # amd-pstate-epp pinned back to acpi-cpufreq: neither the mode nor the EPP apply to that driver.
    ("epyc-pstate-epp", {"driver": "acpi-cpufreq", "amd_pstate_mode": "active", "epp": "performance"},
     {"amd_pstate_mode": "the desired driver is acpi-cpufreq",
      "epp": "the desired driver acpi-cpufreq has no energy performance preference"}, ["amd_pstate=disable"]),
    ("epyc-pstate-epp", {"amd_pstate_mode": "passive", "epp": "power"},
     {"epp": "amd_pstate_mode=passive runs the amd-pstate driver, which has no energy performance preference"}, []),
    ("xeon-4gpu-switch", {"driver": "native", "amd_pstate_mode": "guided"},
     {"amd_pstate_mode": "the desired driver is intel_pstate"}, []),
    # arm64: native keeps cppc_cpufreq; the inference-latency preset's EPP and boost have no file there.
    ("grace-arm64-4gpu", {"driver": "native", "amd_pstate_mode": "active", "epp": "performance", "boost": True},
     {"driver": "this CPU (arm64 (CPU implementer 0x41)) has none, so the running driver cppc_cpufreq is kept",
      "amd_pstate_mode": "this node keeps its running driver cppc_cpufreq",
      "epp": "driver cppc_cpufreq has no energy performance preference",
      "boost": "driver cppc_cpufreq has no boost control (neither /sys/devices/system/cpu/cpufreq/boost nor "
               "/sys/devices/system/cpu/intel_pstate/no_turbo exists)"}, []),
]


@pytest.mark.parametrize("preset,args,reasons,kernel_args", NOT_APPLICABLE)
def test_a_knob_for_another_driver_is_not_applicable_and_the_governor_still_applies(
        build_node, run_module, digest, preset, args, reasons, kernel_args):
    root = build_node(preset, cpus=4)
    args = dict(args, root=root, governor="performance", journal=JOURNAL)
    check, failed = run_module("cpu_freq", args, check=True)
    assert not failed, check
    result, failed = run_module("cpu_freq", args)
    assert not failed, result
    for res in (check, result):
        skipped = {k for k, v in res["settings"].items() if v["skipped"]}
        assert skipped == set(reasons) | ({"driver"} if kernel_args else set()), res["settings"]
        for key, fragment in reasons.items():
            assert fragment in res["settings"][key]["reason"], (key, res["settings"][key]["reason"])
        assert res["kernel_args"] == kernel_args and res["reboot_required"] is bool(kernel_args)
    assert set(policy_values(root, "scaling_governor").values()) == {"performance"}
    if "boost" in args and "boost" not in reasons:
        assert result["settings"]["boost"]["after"] is True
    snapshot = digest(root)
    again, failed = run_module("cpu_freq", args)
    assert not failed and not again["changed"]
    assert digest(root) == snapshot


@pytest.mark.parametrize("preset,args,reasons,kernel_args", NOT_APPLICABLE)
def test_verification_agrees_with_the_module(build_node, run_module, preset, args, reasons, kernel_args):
    """cpu_freq and verify.yml decide what does not apply with the same function, hence the same reasons."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification

    root = build_node(preset, cpus=4)
    desired = dict(args, governor="performance")
    result, failed = run_module("cpu_freq", dict(desired, root=root), check=True)
    assert not failed, result
    facts, failed = run_module("tuning_info", {"root": root})
    assert not failed, facts
    rows = verification.evaluate_host(facts["tuning_facts"], {"cpufreq": desired})["settings"]
    not_applicable = {s["name"]: s["reason"] for s in rows
                      if s["state"] == "not_applicable" and s["family"] == "cpufreq"}
    # Modes are part of the driver row in verification; the other settings have a row each.
    folded = ("amd_pstate_mode", "intel_pstate_status")
    expected = {k: result["settings"][k]["reason"] for k in reasons if k not in folded}
    # On arm64 too: tuning_info takes the vendor from cpu_freq's own function, so the reasons are the same.
    assert not_applicable == expected


def test_boost_without_a_boost_file_is_not_applicable(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=2)
    os.unlink(os.path.join(root, CPU, "cpufreq/boost"))
    result, failed = run_module("cpu_freq", {"root": root, "boost": True, "governor": "performance"})
    assert not failed, result
    boost = result["settings"]["boost"]
    assert boost["skipped"] and boost["file"] is None and "intel_pstate/no_turbo" in boost["reason"]
    assert set(policy_values(root, "scaling_governor").values()) == {"performance"}


# -- arm64 (Grace: cppc_cpufreq, no vendor_id)


def test_arm64_native_keeps_cppc_cpufreq_and_applies_the_governor(build_node, run_module, digest):
    root = build_node("grace-arm64-4gpu", cpus=8)
    before = digest(root)
    preset = {"root": root, "driver": "native", "amd_pstate_mode": "active", "governor": "performance",
              "journal": JOURNAL}
    result, failed = run_module("cpu_freq", preset, diff=True)
    assert not failed, result
    assert result["changed"] and result["driver"] == "cppc_cpufreq"
    assert (result["reboot_required"], result["kernel_args"]) == (False, [])
    driver = result["settings"]["driver"]
    assert (driver["desired"], driver["before"], driver["after"], driver["skipped"]) == \
        ("native", "cppc_cpufreq", "cppc_cpufreq", True)
    assert "so the running driver cppc_cpufreq is kept" in driver["reason"]
    assert result["settings"]["governor"]["after"] == {"performance": "0-7"}
    assert set(policy_values(root, "scaling_governor").values()) == {"performance"}
    again, failed = run_module("cpu_freq", preset)
    assert not failed and not again["changed"]
    result, failed = run_module("cpu_freq", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed, result
    assert digest(root) == before


def test_one_call_on_384_cpus_is_fast(build_node, run_module):
    root = build_node("epyc-pstate-epp", cpus=384)
    start = time.perf_counter()
    result, failed = run_module("cpu_freq", {"root": root, "governor": "powersave", "epp": "performance",
                                             "boost": False, "journal": JOURNAL})
    elapsed = time.perf_counter() - start
    assert not failed and result["settings"]["epp"]["cpus_changed"] == 384
    assert elapsed < 1.0, elapsed


def test_native_driver_resolves_per_vendor(build_node, run_module):
    """driver=native: amd-pstate wanted on the EPYC node, intel_pstate (already running) on Xeon."""
    amd = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    res, failed = run_module("cpu_freq", {"root": amd, "driver": "native", "amd_pstate_mode": "active"})
    assert not failed, res
    assert res["reboot_required"] is True
    assert res["kernel_args"] == ["amd_pstate=active"]
    assert res["settings"]["driver"]["desired"] == "amd-pstate"

    xeon = build_node("xeon-4gpu-switch", cpus=4, gpus=1)
    res, failed = run_module("cpu_freq", {"root": xeon, "driver": "native", "amd_pstate_mode": "active"})
    assert not failed, res
    assert res["reboot_required"] is False
    assert res["kernel_args"] == []
    assert res["settings"]["driver"]["desired"] == "intel_pstate"


# -- Faults: one CPU's file immutable or gone never stops the others, and is named with its cause


@contextlib.contextmanager
def immutable(*paths):
    """chattr +i the files (as root, chmod does not stop a write), always undone."""
    done = []
    try:
        for path in paths:
            if subprocess.run(["chattr", "+i", path], capture_output=True, check=False).returncode:
                pytest.skip("chattr +i is not available here (needs root and a file system with attributes)")
            done.append(path)
        yield
    finally:
        for path in done:
            subprocess.run(["chattr", "-i", path], check=False)


def policy_file(root, n, attr="scaling_governor"):
    return os.path.join(root, CPU, "cpufreq/policy%d/%s" % (n, attr))


def test_runtime_goes_on_past_immutable_policies_and_names_them(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    with immutable(policy_file(root, 1), policy_file(root, 3)):
        result, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "boost": False})
    assert failed and result["failed_settings"] == ["governor"]
    msg = result["msg"]
    assert msg.startswith("cpufreq settings did not take (the others were applied): governor on CPUs 1,3: CPUs 1: ")
    assert "policy3/scaling_governor for writing: Operation not permitted" in msg
    assert [read(root, CPU + "/cpufreq/policy%d/scaling_governor" % i) for i in range(4)] == \
        ["performance", "schedutil", "performance", "schedutil"]
    assert read(root, CPU + "/cpufreq/boost") == "0"


def test_restore_goes_on_past_what_it_cannot_restore_and_keeps_exactly_that(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    original = digest(root)
    result, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "boost": False,
                                             "journal": JOURNAL})
    assert not failed, result
    policy3 = os.path.join(root, CPU, "cpufreq/policy3")
    aside = os.path.join(root, "policy3-aside")
    os.rename(policy3, aside)  # CPU 3's policy vanished (CPU offline, driver gone)
    with immutable(policy_file(root, 1)):
        result, failed = run_module("cpu_freq", {"root": root, "restore": True, "journal": JOURNAL})
    assert failed and result["failed_settings"] == ["governor"]
    msg = result["msg"]
    assert msg.startswith("cpufreq originals could not be restored (they stay in the journal; the others were "
                          "restored): governor on CPUs 1,3: ")
    assert "CPUs 3 have no cpufreq policy" in msg and "policy1/scaling_governor for writing: Operation not permitted" \
        in msg
    assert [read(root, CPU + "/cpufreq/policy%d/scaling_governor" % i) for i in (0, 1, 2)] == \
        ["schedutil", "performance", "schedutil"]
    assert read(root, CPU + "/cpufreq/boost") == "1"  # restored although the governor was not
    with open(os.path.join(root, JOURNAL.lstrip("/"))) as fh:
        families = json.load(fh)["families"]
    assert list(families) == ["cpufreq"] and list(families["cpufreq"]) == ["governor"]
    assert families["cpufreq"]["governor"]["original"] == {"schedutil": "1,3"}
    # Once the fault is gone, the next rollback restores the rest and the journal goes.
    os.rename(aside, policy3)
    result, failed = run_module("cpu_freq", {"root": root, "restore": True, "journal": JOURNAL})
    assert not failed, result
    assert result["settings"]["governor"]["after"] == {"schedutil": "0-3"}
    assert not os.path.exists(os.path.join(root, JOURNAL.lstrip("/")))
    assert digest(root) == original


# -- Check mode predicts the faults a real run would meet, and still writes nothing


def test_check_mode_fails_where_the_real_run_would_and_writes_nothing(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    os.unlink(policy_file(root, 3))  # CPU 3's governor file vanished
    args = {"root": root, "governor": "performance", "boost": False, "journal": JOURNAL}
    with immutable(policy_file(root, 1)):
        before = digest(root)
        checked, failed = run_module("cpu_freq", args, check=True, diff=True)
        assert digest(root) == before
        assert failed and checked["failed_settings"] == ["governor"]
        msg = checked["msg"]
        assert msg.startswith("check mode: a real run would fail. cpufreq settings would not take (the others would "
                              "be applied): governor on CPUs 1,3: CPUs 1: ")
        assert "policy1/scaling_governor is not writable (Operation not permitted: the file is immutable" in msg
        assert "CPUs 3: %s does not exist" % policy_file(root, 3) in msg
        # The healthy changes are still reported as planned.
        assert checked["settings"]["governor"]["after"] == {"performance": "0,2", "schedutil": "1", "": "3"}
        assert checked["settings"]["boost"]["after"] is False
        applied, failed = run_module("cpu_freq", args)
    assert failed and applied["failed_settings"] == ["governor"] and "governor on CPUs 1,3: " in applied["msg"]
    assert applied["settings"]["governor"]["after"] == checked["settings"]["governor"]["after"]
    assert applied["settings"]["boost"]["after"] is False


def test_check_mode_predicts_an_unwritable_boost_file_and_mode_switch(build_node, run_module, digest):
    root = build_node("epyc-pstate-epp", cpus=2)
    status = os.path.join(root, CPU, "amd_pstate/status")
    with immutable(status, os.path.join(root, CPU, "cpufreq/boost")):
        before = digest(root)
        result, failed = run_module("cpu_freq", {"root": root, "amd_pstate_mode": "passive", "boost": False},
                                    check=True)
        assert digest(root) == before
    assert failed and result["failed_settings"] == ["amd_pstate_mode", "boost"]
    assert "amd_pstate_mode: %s is not writable (Operation not permitted" % status in result["msg"]
    assert "cpufreq/boost is not writable" in result["msg"]
    # The driver stays as it is, as after a real run whose mode switch was refused.
    assert result["driver"] == "amd-pstate-epp" and result["settings"]["amd_pstate_mode"]["after"] == "active"
    assert result["settings"]["boost"]["after"] is True


def test_restore_in_check_mode_names_what_it_could_not_restore(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    result, failed = run_module("cpu_freq", {"root": root, "governor": "performance", "boost": False,
                                             "journal": JOURNAL})
    assert not failed, result
    with immutable(policy_file(root, 2), os.path.join(root, CPU, "cpufreq/boost")):
        before = digest(root)
        result, failed = run_module("cpu_freq", {"root": root, "restore": True, "journal": JOURNAL}, check=True)
        assert digest(root) == before  # the journal too
    assert failed and result["failed_settings"] == ["boost", "governor"]
    assert result["msg"].startswith("check mode: a real run would fail. cpufreq originals could not be restored "
                                    "(they would stay in the journal; the others would be restored): ")
    assert "governor on CPUs 2: CPUs 2: %s is not writable" % policy_file(root, 2) in result["msg"]
    assert result["settings"]["governor"]["after"] == {"performance": "2", "schedutil": "0-1,3"}
    assert result["settings"]["boost"]["after"] is False
