# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side check of the role's variables before any task of a flow runs.

The playbooks run it first (roles/tuning/tasks/precheck.yml) and then import the role with
``rolespec_validate: false``: Ansible's implicit validation would say the same in a 10 KB dump of
the argument spec. Messages and name matching are in module_utils/role_vars.py; documented in
check_role_vars.yml next to this file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.errors import ArgumentTypeError, ElementError, NoLogError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.utils.display import Display

from ansible_collections.gpunode.tuning.plugins.module_utils import role_vars

display = Display()
# Parsed argument specs by (path, mtime): every host of a run checks against the same file.
_SPECS = {}
# Warnings already shown by this process: the task templates the filter for `when` and for `msg`.
_WARNED = set()


def load_specs(path):
    """The ``argument_specs`` of a role's meta/argument_specs.yml."""
    try:
        key = (path, os.stat(path).st_mtime_ns)
        if key not in _SPECS:
            with open(path, encoding="utf-8") as handle:
                # The C loader when PyYAML has it: each host's worker parses the spec file (~20 KB) once.
                data = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
                _SPECS[key] = (data or {}).get("argument_specs") or {}
        return _SPECS[key]
    except (OSError, yaml.YAMLError) as exc:
        raise AnsibleFilterError("gpunode.tuning.check_role_vars: cannot read the argument specs %s: %s"
                                 % (path, exc)) from exc


def _plain(value):
    """``value`` as plain dicts, lists and scalars.

    The validator deep-copies what it checks, and a copy of Ansible's lazy templated containers
    drags their templating context along: 0.4 s per host instead of a millisecond.
    """
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def _option_errors(options, provided):
    """One line per bad option: each failing option validated again alone, to name it and its value."""
    lines = []
    for name in sorted(provided):
        result = ArgumentSpecValidator({name: options[name]}).validate({name: provided[name]})
        if not result.error_messages:
            continue
        errors = result.errors.errors
        detail = errors[0].msg
        if detail.startswith("value of %s must " % name):
            # Ansible's choice error names the variable, the choices and the value; null as YAML says it.
            lines.append(detail.replace(", None, got: ", ", null, got: "))
            continue
        # A type error says no more than the allowed type (and a non-dict element trips the no_log
        # scan first, with a confusing text); a sub-option error says which key is wrong.
        details = [e.msg for e in errors if not isinstance(e, (ArgumentTypeError, ElementError, NoLogError))]
        lines.append(role_vars.option_message(name, options[name], provided[name], details[0] if details else ""))
    return lines


def check_role_vars(values, spec_path, entry_point="main"):
    """Errors and warnings about the role's variables; warns about unknown names (unless strict).

    ``values``: every defined variable whose name starts with ``gpunode_tuning_`` (its value);
    ``spec_path``: the role's meta/argument_specs.yml; ``entry_point``: the entry point whose options
    are validated (unknown names are looked up in every entry point).
    """
    if not isinstance(values, dict):
        raise AnsibleFilterError("gpunode.tuning.check_role_vars: expected a dict of variables, got %s"
                                 % type(values).__name__)
    specs = load_specs(spec_path)
    if entry_point not in specs:
        raise AnsibleFilterError("gpunode.tuning.check_role_vars: entry point must be one of: %s (got %r)"
                                 % (", ".join(specs), entry_point))
    options = role_vars.spec_options(specs, [entry_point])
    provided = {k: _plain(v) for k, v in values.items() if k in options}
    errors = []
    if ArgumentSpecValidator(options).validate(provided).error_messages:
        errors = _option_errors(options, provided)
    if "gpunode_tuning_root" in provided:
        problem = role_vars.root_problem(provided["gpunode_tuning_root"])
        if problem and not any(e.startswith("value of gpunode_tuning_root ") for e in errors):
            errors.append(problem)
    for name in role_vars.NODE_PATH_VARIABLES:
        problem = role_vars.node_path_problem(name, provided.get(name))
        if problem and not any(e.startswith("value of %s " % name) for e in errors):
            errors.append(problem)
    try:
        strict = boolean(_plain(values.get("gpunode_tuning_strict_vars", False)), strict=True)
    except TypeError:
        strict = False  # reported above as a bad value
    unknown = role_vars.unknown_variables(values, role_vars.known_names(specs))
    result = role_vars.report(errors, unknown, strict)
    for line in result["warnings"]:
        if line not in _WARNED:
            _WARNED.add(line)
            display.warning(line)
    return result


class FilterModule:
    """gpunode.tuning role variable filters."""

    def filters(self):
        return {"check_role_vars": check_role_vars}
