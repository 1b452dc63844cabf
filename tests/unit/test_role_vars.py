"""The role-variable precheck: module_utils/role_vars.py and the check_role_vars filter."""

from __future__ import annotations

import os
import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.filter import role_vars as role_vars_filter
from ansible_collections.gpunode.tuning.plugins.module_utils import role_vars

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(REPO, "roles", "tuning", "meta", "argument_specs.yml")
check = role_vars_filter.FilterModule().filters()["check_role_vars"]


@pytest.fixture()
def warnings(monkeypatch):
    shown = []
    monkeypatch.setattr(role_vars_filter.display, "warning", shown.append)
    monkeypatch.setattr(role_vars_filter, "_WARNED", set())
    return shown


def specs():
    with open(SPEC, encoding="utf-8") as handle:
        return yaml.safe_load(handle)["argument_specs"]


def test_the_filter_is_documented():
    with open(os.path.join(REPO, "plugins", "filter", "check_role_vars.yml"), encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    assert doc["DOCUMENTATION"]["name"] == "check_role_vars"
    assert {"_input", "spec_path", "entry_point"} <= set(doc["DOCUMENTATION"]["options"])


def test_good_values_pass(warnings):
    got = check({"gpunode_tuning_root": "/", "gpunode_tuning_mrrs": 4096, "gpunode_tuning_verification": {}},
                SPEC, "verify")
    assert got == {"errors": [], "warnings": [], "msg": ""} and warnings == []


@pytest.mark.parametrize("name, value, line", [
    ("gpunode_tuning_mrrs", 300, "value of gpunode_tuning_mrrs must be one of: 128, 256, 512, 1024, 2048, 4096, "
                                 "got: 300"),
    ("gpunode_tuning_mrrs_enabled", "maybe", 'value of gpunode_tuning_mrrs_enabled must be a boolean (true or false), '
                                             'got: "maybe"'),
    ("gpunode_tuning_sysctl_extra", [1], "value of gpunode_tuning_sysctl_extra must be a dict, got: [1]"),
    ("gpunode_tuning_cstate_max_latency_us", "abc",
     'value of gpunode_tuning_cstate_max_latency_us must be an integer, got: "abc"'),
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
    assert check({"gpunode_tuning_mrrs": 300}, SPEC, "rollback")["errors"] == []
    with pytest.raises(AnsibleFilterError, match="entry point must be one of: main, runtime"):
        check({}, SPEC, "precheck")
    with pytest.raises(AnsibleFilterError, match="expected a dict of variables"):
        check(["gpunode_tuning_root"], SPEC)
    with pytest.raises(AnsibleFilterError, match="cannot read the argument specs"):
        check({}, "/nonexistent/argument_specs.yml")


@pytest.mark.parametrize("root", ["", "  ", "node", "./node", None])
def test_the_root_must_be_an_absolute_path(warnings, root):
    # An empty root must never mean the controller's /.
    got = check({"gpunode_tuning_root": root}, SPEC, "main")
    assert len(got["errors"]) == 1, got
    assert got["errors"][0].startswith("value of gpunode_tuning_root must be an absolute path")
    assert check({"gpunode_tuning_root": "/srv/nodes/n1"}, SPEC, "main")["errors"] == []


@pytest.mark.parametrize("name", ["gpunode_tuning_journal", "gpunode_tuning_sysctl_file",
                                  "gpunode_tuning_cmdline_dropin", "gpunode_tuning_boot_script",
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
    values = {"gpunode_tuning_mrs": 4096, "gpunode_tuning_verificaton": 1, "gpunode_tuning_zzzz": 1,
              "gpunode_tuning_rollout_batch": "10%", "gpunode_tuning_pending_kernel_args": []}
    got = check(values, SPEC, "main")
    assert got["errors"] == []
    assert warnings == got["warnings"] == [
        "gpunode_tuning_mrs is not a variable of gpunode.tuning (did you mean gpunode_tuning_mrrs?). It is ignored; "
        "gpunode_tuning_strict_vars: true makes this an error.",
        "gpunode_tuning_verificaton is not a variable of gpunode.tuning (did you mean gpunode_tuning_verification?)."
        " It is ignored; gpunode_tuning_strict_vars: true makes this an error.",
        "gpunode_tuning_zzzz is not a variable of gpunode.tuning (no known variable is similar). It is ignored; "
        "gpunode_tuning_strict_vars: true makes this an error."]
    # The task templates the filter twice (when, msg): each warning is shown once.
    check(values, SPEC, "main")
    assert len(warnings) == 3


@pytest.mark.parametrize("strict", [True, "true", "yes"])
def test_strict_makes_unknown_names_errors(warnings, strict):
    got = check({"gpunode_tuning_mrs": 4096, "gpunode_tuning_strict_vars": strict}, SPEC, "main")
    assert got["errors"] == ["gpunode_tuning_mrs is not a variable of gpunode.tuning (did you mean "
                             "gpunode_tuning_mrrs?); gpunode_tuning_strict_vars is true."]
    assert warnings == []
    got = check({"gpunode_tuning_strict_vars": "sometimes"}, SPEC, "main")
    assert got["errors"][0].startswith("value of gpunode_tuning_strict_vars must be a boolean")


def test_every_public_name_of_the_collection_is_known():
    # A variable or fact added to the role or a playbook must be added to role_vars (or the spec),
    # or setting it would be reported as a typo.
    found = set()
    for top in ("roles", "playbooks"):
        for dirpath, _dirs, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if name.endswith((".yml", ".j2")):
                    with open(os.path.join(dirpath, name), encoding="utf-8") as handle:
                        found |= set(re.findall(r"(?<![_\w])gpunode_tuning_[a-z0-9_]*[a-z0-9]", handle.read()))
    known = set(role_vars.known_names(specs()))
    assert found - known == set()
    assert "gpunode_tuning_strict_vars" in known


def test_allowed_text_and_show_value():
    assert role_vars.allowed_text({"type": "str", "choices": ["a", None]}) == "a string, one of: a, or null"
    assert role_vars.allowed_text({"type": "list", "elements": "str", "choices": ["x"]}) == \
        "a list of strings, each one of: x"
    assert role_vars.show_value("x" * 500).endswith("...") and len(role_vars.show_value("x" * 500)) == 120
    assert role_vars.nearest_name("gpunode_tuning_thp_mod", ["gpunode_tuning_thp_mode"]) == "gpunode_tuning_thp_mode"
