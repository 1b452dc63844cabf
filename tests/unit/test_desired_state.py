"""The role's desired state in Python and the families a run's tags select (plugin_utils/desired_state.py)."""

from __future__ import annotations

import os

import pytest
import yaml
from support.role import preset_values

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.plugin_utils import desired_state, tags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_presets_null_stays_null_and_means_leave_alone():
    desired = desired_state.desired_state(preset_values())
    assert desired["cpufreq"] == {"governor": "performance", "epp": None, "boost": None, "driver": "native",
                                  "amd_pstate_mode": "active", "intel_pstate_status": None}
    assert desired["pcie_mrrs"] == {"mrrs": 4096, "allow_empty": True, "vendor": ["10de", "1002"], "device": None,
                                    "class_prefixes": ["0300", "0302", "0380", "1200"], "bdfs": None}
    assert desired["cpuidle"] == {"disable": [], "max_latency_us": 100, "cpus": None}
    assert desired["sysctl"]["kernel.numa_balancing"] == 0 and desired["numa_balancing"] == 0
    assert desired["gpu_settings"] is None and desired["iommu"] is None
    assert desired["pcie_acs"]["persist"] == "boot_unit"
    # Every family of the registry that has role variables has its key.
    assert {f.name for f in registry.FAMILIES if f.from_role} - set(desired) == {"tunables"}


def test_switched_off_families_are_absent_from_runtime():
    values = preset_values(gpunode_tuning_pcie_mrrs_enabled=False, gpunode_tuning_cpuidle_enabled=False,
                           gpunode_tuning_pcie_acs="unmanaged", gpunode_tuning_pcie_aspm_policy=None,
                           gpunode_tuning_pcie_aspm_links="keep")
    desired = desired_state.desired_state(values)
    names = [r["name"] for r in desired_state.runtime_requests(desired, values, registry.FAMILIES)]
    assert names == ["cpufreq", "tunables", "kmod"]
    boosted = preset_values("inference-latency")
    cpufreq = desired_state.runtime_requests(desired_state.desired_state(boosted), boosted, registry.FAMILIES)
    # Every value is the role's: the module is told so (preset_options), and does not warn where one does not apply.
    assert {"name": "cpufreq", "options": {"governor": "performance", "epp": "performance", "boost": True,
                                           "driver": "native", "amd_pstate_mode": "active",
                                           "preset_options": ["governor", "epp", "boost", "driver",
                                                              "amd_pstate_mode"]}} in cpufreq


@pytest.mark.parametrize("only, skip, runtime", [
    (None, None, ["pcie_mrrs", "pcie_acs", "pcie_aspm", "cpuidle", "cpufreq", "tunables", "kmod", "gpu_settings"]),
    (["runtime"], None, ["pcie_mrrs", "pcie_acs", "pcie_aspm", "cpuidle", "cpufreq", "tunables", "kmod",
                         "gpu_settings"]),
    (["pcie_mrrs"], None, ["pcie_mrrs"]),
    (["pcie_mrrs", "thp"], None, ["pcie_mrrs", "tunables"]),
    (["runtime"], ["cpuidle", "pcie_acs"], ["pcie_mrrs", "pcie_aspm", "cpufreq", "tunables", "kmod", "gpu_settings"]),
    (["persistent"], None, []),
    (["verify"], None, []),
    (["all"], ["runtime"], []),
])
def test_tags_select_families_as_per_family_tasks_did(only, skip, runtime):
    got = [f.name for f in tags.selected_families("runtime", only, skip) if f.runtime_options]
    assert got == runtime


def test_rollback_undoes_the_part_its_tags_name():
    def names(only, skip=None):
        concerns, families = tags.rollback_selection(only, skip)
        return [c.name for c in concerns], [f.name for f in families]

    every_concern = [c.name for c in tags.selected_concerns("persistent", None, None)]
    every_family = [f.name for f in registry.FAMILIES]
    assert names(None) == (every_concern, every_family)
    # Molecule's rollback scenario runs rollback.yml with the converge's --tags runtime,persistent.
    assert names(["runtime", "persistent"]) == (every_concern, every_family)
    assert names(["persistent"]) == (every_concern, [])
    assert names(["runtime"]) == ([], every_family)
    assert names(["rollback"], ["persistent"]) == ([], every_family)
    assert names(["guard"]) == (["guard"], [])
    assert names(["pcie_mrrs"]) == (["boot_unit", "udev"], ["pcie_mrrs"])


def test_tags_select_persistent_concerns_from_the_registry():
    def names(only, skip=None):
        return [c.name for c in tags.selected_concerns("persistent", only, skip)]

    assert names(None) == ["sysctl", "kmod", "kernel_cmdline", "gpu_locality", "boot_unit", "udev", "guard"]
    assert names(["gpu_locality"]) == ["gpu_locality", "boot_unit"]
    assert names(["pcie_mrrs"]) == ["boot_unit", "udev"]
    # The families that re-apply at boot select the boot unit (ACS and GPU settings included).
    assert names(["pcie_acs"]) == ["kernel_cmdline", "boot_unit"] and names(["gpu_settings"]) == ["boot_unit"]
    assert names(["sysctl"]) == ["sysctl"] and names(["thp"]) == ["boot_unit"]
    assert names(["cpufreq"]) == ["kernel_cmdline", "boot_unit"]
    assert names(["persistent"], ["udev", "boot_unit"]) == ["sysctl", "kmod", "kernel_cmdline", "gpu_locality", "guard"]
    assert names(["guard"]) == ["guard"]


def test_combinations_no_spec_can_express():
    values = preset_values(gpunode_tuning_pcie_acs="disable_redirect", gpunode_tuning_pcie_acs_persist="kernel_arg",
                           gpunode_tuning_kernel_cmdline_enabled=False)
    assert [p.split(" needs ")[0] for p in desired_state.combination_problems(values)] == \
        ["gpunode_tuning_pcie_acs_persist: kernel_arg"]
    assert "gpunode_tuning_kernel_cmdline_enabled" in desired_state.combination_problems(values)[0]
    bad_dir = desired_state.combination_problems(preset_values(gpunode_tuning_report_dir="reports\nx/"))
    assert len(bad_dir) == 1 and "line feed" in bad_dir[0]
    assert desired_state.combination_problems(preset_values()) == []


@pytest.mark.parametrize("interval,ok", [("5min", True), ("1h 30min", True), (90, True), ("5s", False),
                                         ("five minutes", False), ("5 fortnights", False)])
def test_the_guards_interval_is_judged_before_anything_changes(interval, ok):
    problems = desired_state.combination_problems(preset_values(gpunode_tuning_guard_interval=interval))
    assert (problems == []) is ok, problems
    if not ok:
        assert problems[0].startswith("value of gpunode_tuning_guard_interval must be a time span")
        assert "at least 10 s" in problems[0] and repr(interval) in problems[0]
    # Rollback writes nothing of the guard: a bad interval must not stop it.
    assert desired_state.combination_problems(preset_values(gpunode_tuning_guard_interval=interval), "rollback") == []
    # Off, the guard is not written, so its interval is not judged.
    off = preset_values(gpunode_tuning_guard_interval=interval, gpunode_tuning_guard_enabled=False)
    assert desired_state.combination_problems(off) == []


def test_the_guards_textfile_directory_is_absolute_or_empty():
    bad = desired_state.combination_problems(preset_values(gpunode_tuning_guard_textfile_dir="var/lib/node-exporter"))
    assert len(bad) == 1 and bad[0].startswith("value of gpunode_tuning_guard_textfile_dir") and '""' in bad[0]
    assert desired_state.combination_problems(preset_values(gpunode_tuning_guard_textfile_dir="")) == []


def test_the_guard_gets_verifications_options():
    values = preset_values(gpunode_tuning_sysctl_file="/etc/sysctl.d/95-gpu.conf")
    desired = desired_state.desired_state(values)
    inputs = desired_state.guard_inputs(values, desired, "node7", "1.0.0")
    verify = desired_state.verify_options(values, desired, "node7", "now")
    assert inputs["verify"] == {k: v for k, v in verify["verify"].items() if k not in ("gate", "verified_at")}
    assert inputs["verify"]["sysctl_file"] == "/etc/sysctl.d/95-gpu.conf" and inputs["host"] == "node7"
    assert inputs["facts"] == {k: verify[k] for k in ("pci_selector", "sysctls", "modules", "kmsg_levels",
                                                      "kmsg_ignore")}
    assert inputs["collection_version"] == "1.0.0"


def test_the_defaults_python_and_the_role_share_are_one():
    """A module's default for what the role also sets is the role's default (one place for each)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import journal
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import kernel_cmdline
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify as verify_node

    with open(os.path.join(REPO, "roles", "tuning", "defaults", "main.yml"), encoding="utf-8") as handle:
        role = yaml.safe_load(handle)
    defaults = verify_node.VERIFY_DEFAULTS
    assert defaults["fail_classes"] == role["gpunode_tuning_kmsg_fail_classes"]
    assert defaults["sysctl_file"] == role["gpunode_tuning_sysctl_file"]
    assert defaults["journal"] == role["gpunode_tuning_journal"] == journal.DEFAULT_JOURNAL
    assert defaults["cmdline_dropin"] == role["gpunode_tuning_kernel_cmdline_dropin"] == kernel_cmdline.DEFAULT_DROPIN
    assert defaults["boot_unit_link"] == boot.WANTS_LINK
