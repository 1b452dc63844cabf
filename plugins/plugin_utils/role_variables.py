# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's variables as the flows see them, with their types, on every supported ansible-core.

The role's defaults are templates (``"{{ __gpunode_tuning_preset_values.cpufreq_epp }}"``): before
ansible-core 2.19 a template's result is text, so a preset's ``null`` arrived as ``""`` and ``4096``
as ``"4096"`` (2.19's templating keeps the types). Here every raw variable (as the inventory, the
role defaults and the presets hold it) is templated so that its type survives: on 2.16-2.18 an
expression that is a whole value is rendered through ``to_json`` and read back, at every level of
a list or dict; 2.19 keeps native types itself. A ``null`` therefore means "leave alone" on every
version, and nothing needs to accept ``""`` as null.

Then the values are checked against the role's argument specs (module_utils/role_vars.py words
the messages) and converted as the spec says (``"yes"`` -> ``True``), before any flow uses them.
Controller side only (action plugin tuning_flow).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

import yaml
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.errors import ArgumentTypeError, ElementError, NoLogError

from ansible_collections.gpunode.tuning.plugins.module_utils import role_vars

try:  # ansible-core 2.19+: templating keeps native types, None included
    from ansible.template import trust_as_template as _trust  # noqa: F401  (only probed)
    NATIVE_TYPES = True
    AnsibleUnsafe = ()
except ImportError:  # 2.16-2.18
    NATIVE_TYPES = False
    from ansible.utils.unsafe_proxy import AnsibleUnsafe

SPECS_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "roles", "tuning", "meta", "argument_specs.yml")
# A value that is one whole expression: its result is the value, whatever its type.
_WHOLE_EXPRESSION = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}|\{%|%\}|\{#).)*)\}\}\s*$", re.S)
# Prefixed so that 2.16's literal_eval of a template's result cannot turn the JSON into a number.
_MARK = "gpunode-json:"
_SPECS = {}


class RoleVariablesError(AnsibleError):
    """A variable that cannot be templated (an undefined name in a user's template)."""


def load_specs(path: str = SPECS_PATH) -> dict:
    """The ``argument_specs`` of the role's meta/argument_specs.yml (parsed once per file version)."""
    try:
        key = (path, os.stat(path).st_mtime_ns)
        if key not in _SPECS:
            with open(path, encoding="utf-8") as handle:
                data = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            _SPECS[key] = (data or {}).get("argument_specs") or {}
        return _SPECS[key]
    except (OSError, yaml.YAMLError) as exc:
        raise RoleVariablesError("cannot read the role's argument specs %s: %s" % (path, exc)) from exc


def plain(value):
    """``value`` as plain dicts, lists and scalars (no Ansible wrapper types, no lazy containers)."""
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool):
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def typed(templar, value):
    """``value`` templated with its type kept (see the module docstring)."""
    if NATIVE_TYPES:
        return plain(templar.template(value))
    if isinstance(value, Mapping):
        return {typed(templar, k): typed(templar, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed(templar, v) for v in value]
    if not isinstance(value, str) or isinstance(value, AnsibleUnsafe) or "{" not in value:
        return plain(value)
    match = _WHOLE_EXPRESSION.match(value)
    if not match:
        return plain(templar.template(value))
    out = templar.template("%s{{ (%s) | ansible.builtin.to_json }}" % (_MARK, match.group("expr")))
    return json.loads(str(out)[len(_MARK):])


def raw_role_variables(task_vars: Mapping) -> dict:
    """Every ``gpunode_tuning_*`` variable of the task, untemplated."""
    return {k: task_vars[k] for k in task_vars if isinstance(k, str) and k.startswith(role_vars.PREFIX)}


def resolve(templar, task_vars: Mapping) -> tuple[dict, list[str]]:
    """``(values, errors)``: every ``gpunode_tuning_*`` variable with its type, and the ones that fail."""
    values, errors = {}, []
    for name, raw in sorted(raw_role_variables(task_vars).items()):
        try:
            values[name] = typed(templar, raw)
        except Exception as exc:  # noqa: BLE001  (any templating error is the user's variable's)
            errors.append("value of %s cannot be templated: %s" % (name, " ".join(str(exc).split())[:300]))
    return values, errors


def _option_errors(options: dict, provided: dict) -> list[str]:
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
        details = [e.msg for e in errors if not isinstance(e, (ArgumentTypeError, ElementError, NoLogError))]
        lines.append(role_vars.option_message(name, options[name], provided[name], details[0] if details else ""))
    return lines


def without_filled(validated, given):
    """``validated`` without the ``None`` sub-options the validator added where ``given`` had no such key.

    The argument spec converts types (``"yes"`` -> ``True``); the sub-options it fills with ``None``
    are not the user's and would reach the modules as explicit values.
    """
    if isinstance(validated, dict) and isinstance(given, Mapping):
        return {k: without_filled(v, given.get(k)) for k, v in validated.items() if k in given or v is not None}
    if isinstance(validated, list) and isinstance(given, (list, tuple)) and len(validated) == len(given):
        return [without_filled(v, g) for v, g in zip(validated, given, strict=True)]
    return validated


def check(values: dict, entry_points, specs: dict | None = None) -> tuple[dict, list[str], list[str]]:
    """``(validated, errors, warnings)`` of the role variables against the options of ``entry_points``.

    ``validated`` holds every option of those entry points (defaults where a variable is unset),
    converted as the spec says; it is only meaningful when ``errors`` is empty.
    """
    specs = load_specs() if specs is None else specs
    for entry in entry_points:
        if entry not in specs:
            raise RoleVariablesError("entry point must be one of: %s (got %r)" % (", ".join(specs), entry))
    options = role_vars.spec_options(specs, entry_points)
    provided = {k: v for k, v in values.items() if k in options}
    result = ArgumentSpecValidator(options).validate(provided)
    errors = _option_errors(options, provided) if result.error_messages else []
    errors += role_vars.path_problems(provided, errors)
    validated = {k: without_filled(v, provided.get(k)) for k, v in plain(result.validated_parameters).items()}
    strict = validated.get("gpunode_tuning_strict_vars", values.get("gpunode_tuning_strict_vars")) is True
    unknown = role_vars.unknown_variables(values, role_vars.known_names(specs))
    outcome = role_vars.report(errors, unknown, strict)
    return validated, outcome["errors"], outcome["warnings"]
