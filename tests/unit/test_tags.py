"""Which families a run's tags select, and the tags the role's flow tasks carry (plugin_utils/tags.py)."""

from __future__ import annotations

import os

import generate
import pytest
import yaml
from support.checkout import REPO

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.plugin_utils import tags

RUNTIME_TASK = ["pcie_mrrs", "pcie_acs", "pcie_aspm", "cpuidle", "cpufreq", "tunables", "numa_balancing", "thp",
                "sysctl", "kmod", "gpu_settings"]


def names(families):
    return [f.name for f in families]


def test_the_runtime_task_carries_every_tag_that_selects_a_runtime_family():
    assert tags.flow_task_tags("runtime") == RUNTIME_TASK
    runtime = [f for f in registry.FAMILIES if f.runtime_options is not None]
    for fam in runtime:
        assert {fam.name, *fam.tags} <= set(tags.flow_task_tags("runtime"))
    assert not {"runtime", "always", "persistent"} & set(tags.flow_task_tags("runtime"))


def test_rollback_and_persistent_carry_their_concerns_and_the_parts():
    persistent = tags.flow_task_tags("persistent")
    assert {"sysctl", "kmod", "kernel_cmdline", "boot_unit", "udev", "guard", "gpu_locality"} <= set(persistent)
    rollback = tags.flow_task_tags("rollback")
    assert rollback[:2] == ["runtime", "persistent"] and set(persistent) <= set(rollback)
    # kmod: a loaded module's new parameters wait for a boot (issue 44).
    assert {"pcie_acs", "iommu", "pcie_aspm", "cpufreq", "kernel_cmdline", "kmod"} == set(tags.flow_task_tags("reboot"))
    with pytest.raises(KeyError, match="no family task for flow 'verify'"):
        tags.flow_task_tags("verify")


@pytest.mark.parametrize("only, skip, runs", [
    (["all"], [], True),                      # untagged: the flow's own task runs
    (["pcie_mrrs"], [], False),               # a family's tag: only the family task runs
    (["runtime"], ["pcie_mrrs"], True),       # the flow, all but one family
    (["all"], ["always"], True),              # --skip-tags always still runs every flow
    (["all"], ["runtime"], False),            # the flow skipped (its family task is skipped by Ansible too)
])
def test_the_family_task_steps_aside_when_the_flows_own_task_runs(only, skip, runs):
    # The family task of main.yml's runtime import: its generated tags and the import's runtime tag.
    assert tags.own_task_runs("runtime", RUNTIME_TASK + ["runtime"], only, skip) is runs


def test_selection_by_a_family_tag_skip_tags_and_inheritance():
    # --tags pcie_mrrs: the family task's selection (inherits runtime from the import).
    inherited = tags.inherited_tags("runtime", RUNTIME_TASK + ["runtime"], by_family=True)
    assert inherited == {"runtime"}
    assert names(tags.selected_families("runtime", ["pcie_mrrs"], [], inherited)) == ["pcie_mrrs"]
    # --tags runtime --skip-tags pcie_mrrs: every runtime family but MRRS.
    rest = names(tags.selected_families("runtime", ["runtime"], ["pcie_mrrs"], {"runtime"}))
    assert "pcie_mrrs" not in rest and {"pcie_acs", "cpuidle", "cpufreq", "tunables", "kmod"} <= set(rest)
    # A family's name skips it as it selects it; a name from before 1.0.0 selects nothing.
    assert "cpuidle" not in names(tags.selected_families("runtime", ["all"], ["cpuidle"], ()))
    assert names(tags.selected_families("runtime", ["cstate"], [], ())) == []
    # A setting's tag selects its family.
    assert names(tags.selected_families("runtime", ["thp"], [], ())) == ["tunables"]


def test_persistent_concerns_by_tag():
    by = {t: [c.name for c in tags.selected_concerns("persistent", [t], [], ())] for t in ("pcie_mrrs", "guard")}
    assert by == {"pcie_mrrs": ["boot_unit", "udev"], "guard": ["guard"]}
    kept = [c.name for c in tags.selected_concerns("persistent", ["persistent"], ["guard"], ())]
    assert "guard" not in kept and {"sysctl", "kmod", "kernel_cmdline", "boot_unit", "udev"} <= set(kept)


def test_run_tags_read_the_magic_variables():
    assert tags.run_tags({}) == (["all"], [])
    assert tags.run_tags({"ansible_run_tags": ["runtime"], "ansible_skip_tags": ["pcie_mrrs"]}) == (
        ["runtime"], ["pcie_mrrs"])


def test_the_roles_generated_tag_lists_are_current():
    stale = [path for path in generate.stale() if path.startswith("roles/")]
    assert stale == [], "run: .venv/bin/python tools/generate.py"


def test_the_generated_runtime_list_is_the_runtime_tasks_tags():
    with open(os.path.join(REPO, "roles", "tuning", "tasks", "runtime.yml"), encoding="utf-8") as handle:
        first = yaml.safe_load(handle)[0]
    assert first["gpunode.tuning.tuning_flow"]["selected_by"] == "family" and first["tags"] == RUNTIME_TASK


def test_no_flow_task_of_the_role_is_tagged_always():
    """--skip-tags always must still run every flow: only reports and the failure summary are always-tagged."""
    for name in ("runtime.yml", "persistent.yml", "rollback.yml"):
        with open(os.path.join(REPO, "roles", "tuning", "tasks", name), encoding="utf-8") as handle:
            tasks = yaml.safe_load(handle)
        for task in tasks:
            if "gpunode.tuning.tuning_flow" in task:
                assert "always" not in (task.get("tags") or []), (name, task["name"])
