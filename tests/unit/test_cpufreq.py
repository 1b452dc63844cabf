"""Pure planning functions of module_utils/families/cpufreq.py, plus reading a simulated node."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import cpu, family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpufreq


def test_leaving_performance_for_powersave_and_balanced_epp_writes_governor_first():
    steps = cpufreq.order_governor_epp("amd-pstate-epp", "performance", "powersave", "balance_performance")
    assert steps == [("governor", "powersave"), ("epp", "balance_performance")]


def test_entering_performance_with_performance_epp_is_allowed():
    steps = cpufreq.order_governor_epp("amd-pstate-epp", "powersave", "performance", "performance")
    assert steps == [("governor", "performance"), ("epp", "performance")]


@pytest.mark.parametrize("driver", ["amd-pstate-epp", "intel_pstate"])
def test_performance_governor_with_other_epp_is_refused_before_writing(driver):
    with pytest.raises(cpufreq.PlanError) as exc:
        cpufreq.order_governor_epp(driver, "powersave", "performance", "balance_performance")
    msg = str(exc.value)
    assert "EBUSY" in msg and driver in msg and "governor=powersave" in msg and "epp=performance" in msg


def test_epp_alone_under_current_performance_governor_is_refused():
    with pytest.raises(cpufreq.PlanError, match="the governor is performance"):
        cpufreq.order_governor_epp("amd-pstate-epp", "performance", None, "power")


def test_epp_alone_under_powersave_is_one_write():
    assert cpufreq.order_governor_epp("amd-pstate-epp", "powersave", None, "power") == [("epp", "power")]


def test_governor_already_set_is_left_out():
    assert cpufreq.order_governor_epp("acpi-cpufreq", "performance", "performance", None) == []


def test_drivers_without_the_ebusy_rule_are_not_restricted():
    assert cpufreq.order_governor_epp("intel_cpufreq", "performance", None, "power") == [("epp", "power")]


@pytest.mark.parametrize("driver,family", [
    ("amd-pstate", "amd-pstate"), ("amd-pstate-epp", "amd-pstate"), ("intel_pstate", "intel_pstate"),
    ("intel_cpufreq", "intel_pstate"), ("acpi-cpufreq", "acpi-cpufreq")])
def test_driver_family(driver, family):
    assert cpufreq.driver_family(driver) == family


@pytest.mark.parametrize("family,mode,driver", [
    ("amd-pstate", "active", "amd-pstate-epp"), ("amd-pstate", "passive", "amd-pstate"),
    ("amd-pstate", "guided", "amd-pstate"), ("intel_pstate", "active", "intel_pstate"),
    ("intel_pstate", "passive", "intel_cpufreq")])
def test_driver_for_mode(family, mode, driver):
    assert cpufreq.driver_for_mode(family, mode) == driver


def test_driver_change_from_acpi_cpufreq_to_amd_pstate_needs_a_reboot():
    assert cpufreq.driver_change("acpi-cpufreq", "amd-pstate", "AuthenticAMD") == (True, ["amd_pstate=active"])
    assert cpufreq.driver_change("acpi-cpufreq", "amd-pstate", "AuthenticAMD", "guided") == \
        (True, ["amd_pstate=guided"])


def test_driver_change_same_family_or_none_asked_needs_nothing():
    assert cpufreq.driver_change("amd-pstate-epp", "amd-pstate", "AuthenticAMD") == (False, [])
    assert cpufreq.driver_change("acpi-cpufreq", None, "AuthenticAMD") == (False, [])


def test_driver_change_back_to_acpi_cpufreq_disables_the_pstate_driver():
    assert cpufreq.driver_change("amd-pstate", "acpi-cpufreq", "AuthenticAMD") == (True, ["amd_pstate=disable"])
    assert cpufreq.driver_change("intel_pstate", "acpi-cpufreq", "GenuineIntel") == (True, ["intel_pstate=disable"])


def test_driver_change_to_a_driver_of_the_other_vendor_is_refused():
    with pytest.raises(cpufreq.PlanError, match="needs an AMD CPU.*GenuineIntel"):
        cpufreq.driver_change("intel_pstate", "amd-pstate", "GenuineIntel")
    with pytest.raises(cpufreq.PlanError, match="needs an Intel CPU"):
        cpufreq.driver_change("acpi-cpufreq", "intel_pstate", "AuthenticAMD")


def test_driver_kernel_args_lists_what_each_desired_driver_can_add():
    assert cpufreq.driver_kernel_args("native").removable == ["amd_pstate=active", "intel_pstate=active"]
    assert cpufreq.driver_kernel_args("native", "guided").removable == ["amd_pstate=guided", "intel_pstate=active"]
    assert cpufreq.driver_kernel_args("amd-pstate", "passive").removable == ["amd_pstate=passive"]
    assert cpufreq.driver_kernel_args("intel_pstate").removable == ["intel_pstate=active"]
    assert cpufreq.driver_kernel_args("acpi-cpufreq").removable == ["amd_pstate=disable", "intel_pstate=disable"]
    assert cpufreq.driver_kernel_args(None).removable == []


@pytest.mark.parametrize("wanted", ["native", "amd-pstate", "intel_pstate", "acpi-cpufreq"])
@pytest.mark.parametrize("mode", [None, "active", "guided"])
def test_driver_kernel_args_is_exactly_what_driver_change_can_plan(wanted, mode):
    # The rollback removes driver_kernel_args(wanted): every argument the persistent flow can have
    # configured through driver_change, on a node of either vendor running any driver, and no other.
    planned = set()
    for vendor in ("AuthenticAMD", "GenuineIntel"):
        try:
            family = cpufreq.resolve_driver(wanted, vendor)
        except cpufreq.PlanError:
            continue
        for current in ("acpi-cpufreq", "amd-pstate", "amd-pstate-epp", "intel_pstate", "intel_cpufreq", None):
            try:
                planned.update(cpufreq.driver_change(current, family, vendor, mode)[1])
            except cpufreq.PlanError:
                continue
    assert planned == set(cpufreq.driver_kernel_args(wanted, mode).removable)


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
    args = cpufreq.driver_kernel_args(wanted, mode, vendor, running)
    assert args.needed == needed
    assert set(needed) <= set(args.removable)  # the rollback removes what was configured


def test_driver_kernel_args_refuses_a_driver_the_cpu_cannot_run():
    with pytest.raises(cpufreq.PlanError, match="needs an AMD CPU"):
        cpufreq.driver_kernel_args("amd-pstate", None, "GenuineIntel", "intel_pstate")
    with pytest.raises(cpufreq.PlanError, match="x86 CPUs only"):
        cpufreq.driver_kernel_args("acpi-cpufreq", None, "arm64 (CPU implementer 0x41)", "cppc_cpufreq")


def test_group_by_value_aggregates_cpus():
    assert cpufreq.group_by_value({0: "a", 1: "a", 2: "b", 3: "a", 4: None}) == {"a": "0-1,3", "b": "2"}


def test_boost_value_inverts_no_turbo():
    assert cpufreq.boost_value(cpufreq.BOOST, True) == "1"
    assert cpufreq.boost_value(cpufreq.INTEL_NO_TURBO, True) == "0"
    assert cpufreq.boost_value(cpufreq.INTEL_NO_TURBO, False) == "1"


def test_read_policies_and_node_state(build_node):
    node = Node(build_node("epyc-pstate-epp", cpus=4))
    freq = cpufreq.NodeFreq(node)
    assert [p.cpus for p in freq.policies] == [[0], [1], [2], [3]]
    p = freq.policies[0]
    assert (p.driver, p.governor, p.epp) == ("amd-pstate-epp", "powersave", "balance_performance")
    assert p.governors == ["performance", "powersave"] and "power" in p.epps
    assert (freq.amd_status, freq.boost, freq.boost_file) == ("active", True, cpufreq.BOOST)
    assert cpufreq.cpu_vendor(node) == "AuthenticAMD"


def test_intel_boost_is_read_from_no_turbo(build_node):
    freq = cpufreq.NodeFreq(Node(build_node("xeon-4gpu-switch", cpus=2)))
    assert (freq.boost_file, freq.boost, freq.intel_status) == (cpufreq.INTEL_NO_TURBO, True, "active")


def test_policy_covering_several_cpus_is_one_policy(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4)
    node = Node(root)
    node.write("0-1\n", cpufreq.CPUFREQ, "policy0", "affected_cpus")
    node.write("\n", cpufreq.CPUFREQ, "policy1", "affected_cpus")  # CPU 1 moved into policy0
    policies = cpufreq.read_policies(node)
    assert [p.cpus for p in policies] == [[0, 1], [2], [3]]
    assert cpufreq.per_cpu(policies, "governor") == {0: "schedutil", 1: "schedutil", 2: "schedutil", 3: "schedutil"}


def _params(**kw):
    base = dict(governor=None, epp=None, boost=None, amd_pstate_mode=None, intel_pstate_status=None, driver=None)
    base.update(kw)
    return base


def test_validate_mode_switch_to_active_knows_the_governors(build_node):
    freq = cpufreq.NodeFreq(Node(build_node("epyc-pstate-epp", cpus=2)))
    freq.amd_status = "passive"
    with pytest.raises(cpufreq.PlanError, match="available governors: performance, powersave"):
        cpufreq.validate(_params(amd_pstate_mode="active", governor="schedutil"), freq, "AuthenticAMD")


def test_validate_mode_switch_to_passive_defers_the_governor_check(build_node):
    freq = cpufreq.NodeFreq(Node(build_node("epyc-pstate-epp", cpus=2)))
    plan = cpufreq.validate(_params(amd_pstate_mode="passive", governor="schedutil"), freq, "AuthenticAMD")
    assert plan["deferred"] and plan["driver_after"] == "amd-pstate"
    assert plan["mode"] == (cpufreq.AMD_PSTATE_STATUS, "amd_pstate_mode", "passive")


# ---------------------------------------------------------------------------------------------
# CPUs without a vendor pstate driver (arm64), and the applicability rule
# ---------------------------------------------------------------------------------------------

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
    assert cpufreq.resolve_driver("native", vendor) is None
    running = dict(driver="cppc_cpufreq", amd_status=None, intel_status=None, epp=False, boost=False)
    wanted, reasons = cpufreq.applicability({"driver": "native", "governor": "performance"}, vendor, running)
    assert wanted is None and list(reasons) == ["driver"]
    assert reasons["driver"].endswith("so the running driver cppc_cpufreq is kept")
    assert cpufreq.driver_change("cppc_cpufreq", wanted, vendor) == (False, [])


@pytest.mark.parametrize("wanted", ["amd-pstate", "intel_pstate", "acpi-cpufreq"])
def test_x86_drivers_are_refused_on_arm64(wanted):
    with pytest.raises(cpufreq.PlanError, match="driver=%s exists on x86 CPUs only" % wanted):
        cpufreq.driver_change("cppc_cpufreq", wanted, "arm64 (CPU implementer 0x41)")


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
    got_wanted, reasons = cpufreq.applicability(desired, "AuthenticAMD", running)
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
