"""The role-variable precheck: plugin_utils/role_variables.py (action tuning_flow)."""

from __future__ import annotations

import os
import re

import pytest
import yaml
from support.role import trusted

from ansible_collections.gpunode.tuning.plugins.plugin_utils import role_variables
from ansible_collections.gpunode.tuning.plugins.plugin_utils import role_variables as role_vars

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(REPO, "roles", "tuning", "meta", "argument_specs.yml")


def check(values, spec_path, entry_point="main"):
    """The precheck's verdict as the action reports it: errors, warnings and the one message."""
    _validated, errors, warnings = role_variables.check(values, [entry_point], role_variables.load_specs(spec_path))
    return {"errors": errors, "warnings": warnings,
            "msg": "%d bad variable(s), nothing was changed:\n%s" % (len(errors), "\n".join(errors)) if errors else ""}


@pytest.fixture()
def warnings():
    return []


def specs():
    with open(SPEC, encoding="utf-8") as handle:
        return yaml.safe_load(handle)["argument_specs"]


def test_good_values_pass(warnings):
    got = check({"gpunode_tuning_root": "/", "gpunode_tuning_pcie_mrrs": 4096, "gpunode_tuning_verification": {}},
                SPEC, "verify")
    assert got == {"errors": [], "warnings": [], "msg": ""}


@pytest.mark.parametrize("name, value, line", [
    ("gpunode_tuning_pcie_mrrs", 300,
     "value of gpunode_tuning_pcie_mrrs must be one of: 128, 256, 512, 1024, 2048, 4096, got: 300"),
    ("gpunode_tuning_pcie_mrrs_enabled", "maybe",
     'value of gpunode_tuning_pcie_mrrs_enabled must be a boolean (true or false), got: "maybe"'),
    ("gpunode_tuning_sysctl_extra", [1], "value of gpunode_tuning_sysctl_extra must be a dict, got: [1]"),
    ("gpunode_tuning_cpuidle_max_latency_us", "abc",
     'value of gpunode_tuning_cpuidle_max_latency_us must be an integer, got: "abc"'),
    ("gpunode_tuning_cpufreq_governor", "fast", "value of gpunode_tuning_cpufreq_governor must be one of: performance"),
    ("gpunode_tuning_kmsg_levels", ["loud"], "value of gpunode_tuning_kmsg_levels must be one or more of: emerg"),
    ("gpunode_tuning_kmod_modules", [{"nam": "x"}],
     'value of gpunode_tuning_kmod_modules must be a list of dicts with keys name (required), params, required, state, '
     'got: [{"nam": "x"}] (missing required arguments: name'),
])
def test_a_bad_value_is_one_line_naming_the_variable_the_value_and_what_is_allowed(warnings, name, value, line):
    got = check({name: value, "gpunode_tuning_root": "/"}, SPEC, "verify")
    assert len(got["errors"]) == 1 and got["errors"][0].startswith(line), got["errors"]
    assert got["msg"] == "1 bad variable(s), nothing was changed:\n" + got["errors"][0]
    assert len(got["msg"]) < 400 and "argument_spec" not in got["msg"]


def test_only_the_entry_points_options_are_validated(warnings):
    # rollback does not use MRRS: a bad MRRS value does not stop a rollback (nor is it unknown).
    assert check({"gpunode_tuning_pcie_mrrs": 300}, SPEC, "rollback")["errors"] == []
    with pytest.raises(role_variables.RoleVariablesError, match="entry point must be one of: main, runtime"):
        check({}, SPEC, "nosuch")
    with pytest.raises(role_variables.RoleVariablesError, match="cannot read the role's argument specs"):
        check({}, "/nonexistent/argument_specs.yml")


@pytest.mark.parametrize("root", ["", "  ", "node", "./node", None])
def test_the_root_must_be_an_absolute_path(warnings, root):
    # An empty root must never mean the controller's /.
    got = check({"gpunode_tuning_root": root}, SPEC, "main")
    assert len(got["errors"]) == 1, got
    assert got["errors"][0].startswith("value of gpunode_tuning_root must be an absolute path")
    assert check({"gpunode_tuning_root": "/srv/nodes/n1"}, SPEC, "main")["errors"] == []


@pytest.mark.parametrize("name", ["gpunode_tuning_journal", "gpunode_tuning_sysctl_file",
                                  "gpunode_tuning_kernel_cmdline_dropin", "gpunode_tuning_boot_script",
                                  "gpunode_tuning_udev_rule"])
@pytest.mark.parametrize("value", ["/var/lib/../../../tmp/j.json", "relative/path", "/etc/x\n/etc/y", "/etc/a b"])
def test_node_paths_stay_below_the_root(warnings, name, value):
    # verify slurps the journal and the persistent flow templates these files with the root as a
    # plain prefix: a '..' would read or write outside a simulated node's root.
    got = check({name: value}, SPEC, "main")
    assert got["errors"] == ["value of %s must be an absolute path on the node without '..' components, "
                             "spaces or control characters, got: %s" % (name, role_vars.show_value(value))], got
    assert check({name: "/var/lib/gpunode-tuning/x.json"}, SPEC, "main")["errors"] == []


def test_unknown_names_warn_with_the_nearest_known_name(warnings):
    values = {"gpunode_tuning_pcie_mrs": 4096, "gpunode_tuning_verificaton": 1, "gpunode_tuning_zzzz": 1,
              "gpunode_tuning_rollout_batch": "10%", "gpunode_tuning_pending_kernel_args": []}
    got = check(values, SPEC, "main")
    assert got["errors"] == []
    assert got["warnings"] == [
        "gpunode_tuning_pcie_mrs is not a variable of gpunode.tuning (did you mean gpunode_tuning_pcie_mrrs?). "
        "It is ignored; "
        "gpunode_tuning_strict_vars: true makes this an error.",
        "gpunode_tuning_verificaton is not a variable of gpunode.tuning (did you mean gpunode_tuning_verification?)."
        " It is ignored; gpunode_tuning_strict_vars: true makes this an error.",
        "gpunode_tuning_zzzz is not a variable of gpunode.tuning (no known variable is similar). It is ignored; "
        "gpunode_tuning_strict_vars: true makes this an error."]


@pytest.mark.parametrize("strict", [True, "true", "yes"])
def test_strict_makes_unknown_names_errors(warnings, strict):
    got = check({"gpunode_tuning_pcie_mrs": 4096, "gpunode_tuning_strict_vars": strict}, SPEC, "main")
    assert got["errors"] == ["gpunode_tuning_pcie_mrs is not a variable of gpunode.tuning (did you mean "
                             "gpunode_tuning_pcie_mrrs?); gpunode_tuning_strict_vars is true."]
    assert got["warnings"] == []
    got = check({"gpunode_tuning_strict_vars": "sometimes"}, SPEC, "main")
    assert got["errors"][0].startswith("value of gpunode_tuning_strict_vars must be a boolean")


def test_every_public_name_of_the_collection_is_known():
    # A variable or fact added to the role or a playbook must be added to role_vars (or the spec),
    # or setting it would be reported as a typo.
    found = set()
    for top in ("roles", "playbooks"):
        for dirpath, _dirs, files in os.walk(os.path.join(REPO, top)):
            if (os.sep + "files") in os.path.relpath(dirpath, REPO):
                continue  # what the role ships as is (the Prometheus rules: metric names, not variables)
            for name in files:
                if name.endswith((".yml", ".j2")):
                    with open(os.path.join(dirpath, name), encoding="utf-8") as handle:
                        found |= set(re.findall(r"(?<![_\w])gpunode_tuning_[a-z0-9_]*[a-z0-9]", handle.read()))
    known = set(role_vars.known_names(specs()))
    assert found - known == set()
    assert "gpunode_tuning_strict_vars" in known


def private_names(*tops):
    found = set()
    for top in tops:
        for dirpath, _dirs, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if name.endswith((".yml", ".j2", ".py")):
                    with open(os.path.join(dirpath, name), encoding="utf-8") as handle:
                        found |= set(re.findall(r"__gpunode_tuning_[a-z0-9_]*[a-z0-9]", handle.read()))
    return found


def test_every_private_variable_between_the_playbooks_and_the_role_is_listed_once():
    shared = private_names("playbooks") & private_names("roles", "plugins/action", "plugins/modules")
    assert shared == set(role_variables.PRIVATE_INTERFACE)
    # The step entry points' inputs are in the list.
    inputs = {name for entry in specs().values() for name in entry.get("options") or {} if name.startswith("__")}
    assert inputs <= set(role_variables.PRIVATE_INTERFACE)


def test_allowed_text_and_show_value():
    assert role_vars.allowed_text({"type": "str", "choices": ["a", None]}) == "a string, one of: a, or null"
    assert role_vars.allowed_text({"type": "list", "elements": "str", "choices": ["x"]}) == \
        "a list of strings, each one of: x"
    assert role_vars.show_value("x" * 500).endswith("...") and len(role_vars.show_value("x" * 500)) == 120
    assert role_vars.nearest_name("gpunode_tuning_thp_mod", ["gpunode_tuning_thp_mode"]) == "gpunode_tuning_thp_mode"


def test_a_name_from_before_1_0_gets_the_unknown_warning_naming_its_current_name_and_is_not_read(warnings):
    # difflib alone would point gpunode_tuning_cstate_enabled at gpunode_tuning_thp_enabled.
    values = {"gpunode_tuning_cstate_enabled": False, "gpunode_tuning_mrrs": 2048}
    validated, errors, warned = role_variables.check(values, ["main"], specs())
    assert errors == []
    assert warned == [
        "gpunode_tuning_cstate_enabled is not a variable of gpunode.tuning (renamed to "
        "gpunode_tuning_cpuidle_enabled before 1.0.0). It is ignored; gpunode_tuning_strict_vars: true makes this "
        "an error.",
        "gpunode_tuning_mrrs is not a variable of gpunode.tuning (renamed to gpunode_tuning_pcie_mrrs before "
        "1.0.0). It is ignored; gpunode_tuning_strict_vars: true makes this an error."]
    assert "gpunode_tuning_cstate_enabled" not in validated and "gpunode_tuning_mrrs" not in validated
    # Nothing reads the former name's value: the current names keep what the role gives them without it.
    task_vars = trusted(role_task_vars(gpunode_tuning_preset="inference-throughput"))
    plain_values, errors = role_variables.resolve(real_templar(task_vars), task_vars)
    assert errors == []
    with_former = dict(task_vars, **values)
    resolved, errors = role_variables.resolve(real_templar(with_former), with_former)
    assert errors == [] and resolved["gpunode_tuning_mrrs"] == 2048
    assert resolved["gpunode_tuning_pcie_mrrs"] == plain_values["gpunode_tuning_pcie_mrrs"] == 4096
    assert resolved["gpunode_tuning_cpuidle_enabled"] == plain_values["gpunode_tuning_cpuidle_enabled"]
    assert resolved["gpunode_tuning_cpuidle_enabled"] is not False


def test_every_name_from_before_1_0_names_a_current_option_and_is_none():
    options = role_vars.spec_options(specs())
    assert set(role_variables.RENAMED_BEFORE_1_0.values()) <= set(options)
    assert not set(role_variables.RENAMED_BEFORE_1_0) & set(role_vars.known_names(specs()))


def role_task_vars(**more):
    """The role's defaults and vars as a task sees them untemplated, plus ``more``."""
    out = {}
    for path in ("defaults", "vars"):
        with open(os.path.join(REPO, "roles", "tuning", path, "main.yml"), encoding="utf-8") as handle:
            out.update(yaml.safe_load(handle))
    out.update(more)
    return out


def test_the_inputs_digest_follows_every_variable_a_template_names():
    base = role_task_vars(site_swappiness=10, unrelated=1,
                          gpunode_tuning_sysctl_extra={"vm.swappiness": "{{ site_swappiness }}"})
    digest = role_variables.inputs_digest(base)
    assert digest is not None and len(digest) == 64
    assert role_variables.inputs_digest(dict(base, unrelated=2)) == digest  # named by no template
    # a role variable; a variable one names; one named two templates away (preset -> the preset's values)
    assert role_variables.inputs_digest(dict(base, gpunode_tuning_thp_mode="never")) != digest
    assert role_variables.inputs_digest(dict(base, site_swappiness=33)) != digest
    presets = dict(base["__gpunode_tuning_presets"])
    presets["inference-throughput"] = dict(presets["inference-throughput"], thp_mode="always")
    assert role_variables.inputs_digest(dict(base, __gpunode_tuning_presets=presets)) != digest
    # a name that was unset and becomes set
    named_unset = dict(base, gpunode_tuning_sysctl_extra={"vm.swappiness": "{{ later | default(10) }}"})
    assert role_variables.inputs_digest(dict(named_unset, later=10)) != role_variables.inputs_digest(named_unset)


@pytest.mark.parametrize("template", [
    "{{ lookup('ansible.builtin.env', 'X') }}", "{{ query('ansible.builtin.env', 'X') | first }}",
    "{{ now() }}", "{{ [1, 2] | random }}", "{{ hostvars[inventory_hostname].x }}", "{{ vars['x'] }}",
    "{{ unclosed", "{% if %}"])
def test_a_template_whose_result_the_names_do_not_decide_is_never_reused(template):
    assert role_variables.inputs_digest(role_task_vars(gpunode_tuning_sysctl_extra={"vm.x": template})) is None


def test_the_inputs_digest_ends_on_a_cycle_and_refuses_what_is_not_plain_data():
    cycle = {"gpunode_tuning_a": "{{ b }}", "b": "{{ gpunode_tuning_a }}"}
    assert role_variables.inputs_digest(cycle) == role_variables.inputs_digest(dict(cycle))
    assert role_variables.inputs_digest({"gpunode_tuning_a": object()}) is None


def real_templar(task_vars):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    return Templar(loader=DataLoader(), variables=task_vars)


def test_the_presets_values_are_templated_once_for_every_default_that_reads_them():
    task_vars = trusted(role_task_vars(gpunode_tuning_preset="inference-throughput"))
    expected = role_task_vars()["__gpunode_tuning_presets"]["inference-throughput"]
    templar = real_templar(task_vars)
    once = role_variables._with_preset_values(templar, task_vars)
    assert once is not templar
    # The defaults read the preset's values as data, not as the template that picks them.
    assert role_variables.plain(once.available_variables[role_variables.PRESET_VALUES]) == expected
    values, errors = role_variables.resolve(templar, task_vars)
    assert errors == []
    assert values["gpunode_tuning_thp_mode"] == expected["thp_mode"]
    assert values["gpunode_tuning_pcie_mrrs"] == expected["pcie_mrrs"]
    assert values["gpunode_tuning_sysctl"] == expected["sysctl"]


def test_a_preset_values_template_that_fails_is_reported_by_the_defaults_that_read_it():
    task_vars = trusted(role_task_vars(__gpunode_tuning_preset_values="{{ no_such_variable.pcie_mrrs }}"))
    templar = real_templar(task_vars)
    assert role_variables._with_preset_values(templar, task_vars) is templar
    _values, errors = role_variables.resolve(templar, task_vars)
    assert any(line.startswith("value of gpunode_tuning_thp_mode cannot be templated") for line in errors), errors


def numeric_options():
    """``{name: (entry point, spec type, a valid number)}``: every int/float role variable, with its default where
    that is a number (else its first choice, else 2)."""
    out = {}
    for entry, spec in specs().items():
        for name, option in ((spec or {}).get("options") or {}).items():
            if option.get("type") not in ("int", "float"):
                continue
            default = option.get("default")
            number = default if isinstance(default, (int, float)) and not isinstance(default, bool) else \
                (option.get("choices") or [2])[0]
            out.setdefault(name, (entry, option["type"], number))
    return out


def test_every_numeric_variable_given_as_text_is_read_as_the_number_the_precheck_accepted():
    """Issue 42: ``-e name=1`` arrives as "1". The precheck (``check``) converts it by the spec's type; every consumer
    reading ``typed_values`` gets that same number, for every int/float variable, not one special case."""
    options = numeric_options()
    assert {"gpunode_tuning_reboot_poll_interval", "gpunode_tuning_drain_timeout",
            "gpunode_tuning_reboot_timeout", "gpunode_tuning_pcie_mrrs"} <= set(options)
    for name, (entry, kind, number) in sorted(options.items()):
        text = str(number)
        validated, errors, _warnings = role_variables.check({"gpunode_tuning_root": "/", name: text}, [entry])
        assert errors == [], (name, errors)
        accepted = validated[name]
        assert isinstance(accepted, {"int": int, "float": float}[kind]), (name, accepted)
        assert not isinstance(accepted, bool) and accepted == number, (name, accepted)
        given = {name: text, "gpunode_tuning_drain_command": "true 1"}
        assert role_variables.typed_values(given) == {name: accepted, "gpunode_tuning_drain_command": "true 1"}


def test_a_value_the_spec_cannot_convert_is_left_for_the_precheck_to_refuse():
    got = role_variables.typed_values({"gpunode_tuning_reboot_poll_interval": "soon", "gpunode_tuning_reboot_ok": "yes",
                                       "gpunode_tuning_reboot_max_unavailable": "10%", "not_ours": "1"})
    assert got == {"gpunode_tuning_reboot_poll_interval": "soon", "gpunode_tuning_reboot_ok": True,
                   "gpunode_tuning_reboot_max_unavailable": "10%", "not_ours": "1"}


def test_the_reboot_action_reads_its_numbers_as_the_precheck_accepted_them(tmp_path, monkeypatch):
    """The reboot sequence's settings from ``-e``-style text: the poll every 1 s, not the 5 s fallback."""
    from types import SimpleNamespace

    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    from ansible_collections.gpunode.tuning.plugins.action import tuning_reboot
    from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot_sequence

    seen = {}

    def stop(self, name, _task_vars):
        seen.update(self._settings, backend=name)
        raise reboot_sequence.SequenceError("stopped by the test")
    monkeypatch.setattr(tuning_reboot.ActionModule, "_make_backend", stop)
    task = SimpleNamespace(args={"phase": "survey"}, check_mode=False, async_val=0,
                           action="gpunode.tuning.tuning_reboot")
    loader = DataLoader()
    action = tuning_reboot.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir=None)), None, loader,
                                        Templar(loader=loader), None)
    action._load_name = "gpunode.tuning.tuning_reboot"
    task_vars = {"inventory_hostname": "n1", "ansible_play_hosts_all": ["n1", "n2"], "gpunode_tuning_reboot_ok": "true",
                 "gpunode_tuning_drain": "none", "gpunode_tuning_reboot_poll_interval": "1",
                 "gpunode_tuning_drain_timeout": "60", "gpunode_tuning_reboot_timeout": "900",
                 "gpunode_tuning_report_dir": str(tmp_path)}
    result = action.run(task_vars=task_vars)
    assert result["failed"] and "stopped by the test" in result["msg"]
    assert (seen["poll"], seen["drain_timeout"], seen["reboot_timeout"], seen["backend"]) == (1.0, 60, 900, "none")


@pytest.mark.parametrize("hold, hold_for, lease", [(False, 5430.0, 3600), (True, 5430.0, 6030), (True, 60.0, 3600)])
def test_the_claim_outlasts_the_measure_gates_runs(tmp_path, monkeypatch, hold, hold_for, lease):
    """The run does not renew its claim while the measure gate's benchmark runs: a held host's claim lasts the
    gate's runs (hold_for) and 600 s more, never less than gpunode_tuning_reboot_claim_lease."""
    from types import SimpleNamespace

    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    from ansible_collections.gpunode.tuning.plugins.action import tuning_reboot
    from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot_sequence

    seen = {}

    def stop(self, name, _task_vars):
        seen.update(self._settings, claim=self._claim)
        raise reboot_sequence.SequenceError("stopped by the test")
    monkeypatch.setattr(tuning_reboot.ActionModule, "_make_backend", stop)
    task = SimpleNamespace(args={"phase": "survey", "hold": hold, "hold_for": hold_for}, check_mode=False,
                           async_val=0, action="gpunode.tuning.tuning_reboot")
    loader = DataLoader()
    action = tuning_reboot.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir=None)), None, loader,
                                        Templar(loader=loader), None)
    action._load_name = "gpunode.tuning.tuning_reboot"
    task_vars = {"inventory_hostname": "n1", "ansible_play_hosts_all": ["n1"], "gpunode_tuning_reboot_ok": True,
                 "gpunode_tuning_drain": "none", "gpunode_tuning_report_dir": str(tmp_path)}
    action.run(task_vars=task_vars)
    assert (seen["claim_lease"], seen["claim"]["lease"]) == (lease, lease)
