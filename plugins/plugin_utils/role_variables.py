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

Then the values are checked against the role's argument specs (one line per bad variable, worded
below) and converted as the spec says (``"yes"`` -> ``True``), before any flow uses them.
Controller side only (action plugin tuning_flow).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import jinja2
import jinja2.nodes
import yaml
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.errors import ArgumentTypeError, ElementError, NoLogError

from ansible_collections.gpunode.tuning.plugins.plugin_utils import ansible_compat

SPECS_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "roles", "tuning", "meta", "argument_specs.yml")
# A value that is one whole expression: its result is the value, whatever its type.
_WHOLE_EXPRESSION = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}|\{%|%\}|\{#).)*)\}\}\s*$", re.S)
# Prefixed so that 2.16's literal_eval of a template's result cannot turn the JSON into a number.
_MARK = "gpunode-json:"
_SPECS = {}
# The selected preset's values (roles/tuning/vars/main.yml), which most role defaults read.
PRESET_VALUES = "__gpunode_tuning_preset_values"
# Names that role variables had during development before 1.0.0 (never released): a hint only. Set, such a
# name is an unknown variable whose warning names the current one; its value is never read.
RENAMED_BEFORE_1_0 = {
    "gpunode_tuning_acs": "gpunode_tuning_pcie_acs",
    "gpunode_tuning_acs_persist": "gpunode_tuning_pcie_acs_persist",
    "gpunode_tuning_cmdline_args": "gpunode_tuning_kernel_cmdline_args",
    "gpunode_tuning_cmdline_bootloader": "gpunode_tuning_kernel_cmdline_bootloader",
    "gpunode_tuning_cmdline_dropin": "gpunode_tuning_kernel_cmdline_dropin",
    "gpunode_tuning_cmdline_enabled": "gpunode_tuning_kernel_cmdline_enabled",
    "gpunode_tuning_cstate_cpus": "gpunode_tuning_cpuidle_cpus",
    "gpunode_tuning_cstate_disable": "gpunode_tuning_cpuidle_disable",
    "gpunode_tuning_cstate_enabled": "gpunode_tuning_cpuidle_enabled",
    "gpunode_tuning_cstate_max_latency_us": "gpunode_tuning_cpuidle_max_latency_us",
    "gpunode_tuning_dcgm_diag": "gpunode_tuning_gpu_health_dcgm_diag",
    "gpunode_tuning_gpu_application_clocks": "gpunode_tuning_gpu_settings_application_clocks",
    "gpunode_tuning_gpu_count": "gpunode_tuning_gpu_health_count",
    "gpunode_tuning_gpu_compute_partition": "gpunode_tuning_gpu_settings_compute_partition",
    "gpunode_tuning_gpu_locked_clocks": "gpunode_tuning_gpu_settings_locked_clocks",
    "gpunode_tuning_gpu_memory_partition": "gpunode_tuning_gpu_settings_memory_partition",
    "gpunode_tuning_gpu_perf_determinism_mhz": "gpunode_tuning_gpu_settings_perf_determinism_mhz",
    "gpunode_tuning_gpu_perf_level": "gpunode_tuning_gpu_settings_perf_level",
    "gpunode_tuning_gpu_persistence": "gpunode_tuning_gpu_settings_persistence",
    "gpunode_tuning_gpu_power_limit": "gpunode_tuning_gpu_settings_power_limit",
    "gpunode_tuning_gpu_power_limits": "gpunode_tuning_gpu_settings_power_limits",
    "gpunode_tuning_locality_enabled": "gpunode_tuning_gpu_locality_enabled",
    "gpunode_tuning_locality_remote_irqs_fail": "gpunode_tuning_gpu_locality_remote_irqs_fail",
    "gpunode_tuning_mrrs": "gpunode_tuning_pcie_mrrs",
    "gpunode_tuning_mrrs_allow_empty": "gpunode_tuning_gpu_allow_empty",
    "gpunode_tuning_mrrs_bdfs": "gpunode_tuning_gpu_bdfs",
    "gpunode_tuning_mrrs_class_prefixes": "gpunode_tuning_gpu_class_prefixes",
    "gpunode_tuning_mrrs_device": "gpunode_tuning_gpu_device",
    "gpunode_tuning_mrrs_enabled": "gpunode_tuning_pcie_mrrs_enabled",
    "gpunode_tuning_mrrs_vendor": "gpunode_tuning_gpu_vendors",
    "gpunode_tuning_p2p_min_gbps": "gpunode_tuning_gpu_p2p_min_gbps",
}


PREFIX = "gpunode_tuning_"
# Public names that are not role options: the playbooks' own variables (-e on the command line)
# and the facts the role and the playbooks export. Setting them is not a typo.
PLAYBOOK_VARIABLES = (
    "gpunode_tuning_hosts",
    "gpunode_tuning_rollout_canary",
    "gpunode_tuning_rollout_batch",
    "gpunode_tuning_rollout_max_fail_percentage",
    "gpunode_tuning_rollout_flow",
    "gpunode_tuning_rollout_health_gate",
    "gpunode_tuning_rollout_benchmark_command", "gpunode_tuning_rollout_benchmark_min_gain",
    "gpunode_tuning_rollout_benchmark_format", "gpunode_tuning_rollout_benchmark_result_file",
    "gpunode_tuning_rollout_benchmark_metrics", "gpunode_tuning_rollout_benchmark_repeats",
    "gpunode_tuning_rollout_benchmark_warmup", "gpunode_tuning_rollout_benchmark_unchanged",
)
EXPORTED_FACTS = (
    "gpunode_tuning_verification",
    "gpunode_tuning_reboot_required",
    "gpunode_tuning_pending_kernel_args",
    "gpunode_tuning_rollout_result",
)
# The private variables that cross between the playbooks and the role (the one list; tests/unit/test_role_variables.py
# fails when a playbook and the role share one that is not here): name -> (who sets it, what it is). Not role
# options: a user never sets them, and the entry points that take them as input say so in argument_specs.yml.
PRIVATE_INTERFACE = {
    "__gpunode_tuning_precheck_entry_point": ("playbooks", "the entry point the precheck checks the variables for"),
    "__gpunode_tuning_precheck_rollout": ("rollout.yml", "the rollout's settings as given, checked by the precheck"),
    "__gpunode_tuning_rollout": ("rollout.yml", "the rollout's settings, checked (rollout_host)"),
    "__gpunode_tuning_rollout_batch_no": ("rollout.yml", "the host's batch number (rollout_host)"),
    "__gpunode_tuning_rollout_is_canary": ("rollout.yml", "whether the host is the canary (rollout_host)"),
    "__gpunode_tuning_rollout_flow": ("rollout.yml", "runtime or persistent (rollout_benchmark's rollback)"),
    "__gpunode_tuning_rollout_measure": ("rollout.yml", "the measure gate holds the host drained (persistent_reboot)"),
    "__gpunode_tuning_rollout_benchmark_phase": ("rollout_steps.yml", "before or after tuning (rollout_benchmark)"),
    "__gpunode_tuning_rollout_reboot_survey": ("rollout.yml", "the hosts out of service before the run (reboot)"),
    "__gpunode_tuning_rollout_steps": ("rollout_steps.yml", "the rollout steps one rollout_host task runs"),
    "__gpunode_tuning_rollout_outcome": ("rollout.yml", "what the step-wise rollout's own tasks found (rollout_host)"),
    "__gpunode_tuning_rollout_unreachable_hosts": ("rollout.yml", "the hosts the rollout found unreachable "
                                                                  "(persistent_reboot's budget)"),
    "__gpunode_tuning_rollout_host": ("role", "rollout_host's registered result (the host's state and record), "
                                              "read by rollout.yml"),
    "__gpunode_tuning_rollout_benchmark": ("role", "rollout_benchmark's reading, read by rollout.yml"),
    "__gpunode_tuning_reboot": ("role", "the reboot sequence's registered result, read by rollout.yml"),
    "__gpunode_tuning_persistent": ("role", "the persistent flow's registered result (not_rebooted_for), read by "
                                            "rollout.yml"),
}
TYPE_TEXT = {
    "str": "a string",
    "path": "a path",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (true or false)",
    "list": "a list",
    "dict": "a dict",
    "raw": "any value",
}
TYPE_PLURAL = {"str": "strings", "path": "paths", "int": "integers", "float": "numbers", "bool": "booleans",
               "dict": "dicts", "list": "lists", "raw": "values"}
# A value is shown up to this length: a message stays a few lines even for a large dict.
VALUE_WIDTH = 120


def spec_options(specs: dict | None, entry_points: Iterable[str] | None = None) -> dict:
    """Options of the given entry points of ``argument_specs`` (all entry points when None), merged."""
    out = {}
    for name, entry in (specs or {}).items():
        if entry_points is None or name in entry_points:
            out.update((entry or {}).get("options") or {})
    return out


def known_names(specs: dict | None) -> list[str]:
    """Every public name of the collection: the options of every entry point, playbook variables, facts."""
    return sorted(set(spec_options(specs)) | set(PLAYBOOK_VARIABLES) | set(EXPORTED_FACTS))


def nearest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name`` (compared without the common prefix), or None."""
    suffixes = {k[len(PREFIX):]: k for k in known if k.startswith(PREFIX)}
    match = difflib.get_close_matches(name[len(PREFIX):] if name.startswith(PREFIX) else name,
                                      list(suffixes), n=1, cutoff=0.6)
    return suffixes[match[0]] if match else None


def unknown_variables(names: Iterable[str], known: Iterable[str]) -> list[tuple[str, str | None]]:
    """``[(name, nearest known name or None)]`` for each prefixed name that is not known, sorted.

    A name from ``RENAMED_BEFORE_1_0`` is paired with its current name, which difflib alone would often miss.
    """
    known = set(known)
    return [(n, RENAMED_BEFORE_1_0.get(n) or nearest_name(n, known))
            for n in sorted(set(names)) if n.startswith(PREFIX) and n not in known]


def unknown_message(name: str, suggestion: str | None, strict: bool = False) -> str:
    """One line about an unknown variable."""
    if suggestion and RENAMED_BEFORE_1_0.get(name) == suggestion:
        hint = "renamed to %s before 1.0.0" % suggestion
    else:
        hint = "did you mean %s?" % suggestion if suggestion else "no known variable is similar"
    if strict:
        return "%s is not a variable of gpunode.tuning (%s); gpunode_tuning_strict_vars is true." % (name, hint)
    return ("%s is not a variable of gpunode.tuning (%s). It is ignored; "
            "gpunode_tuning_strict_vars: true makes this an error." % (name, hint))


def show_value(value: Any) -> str:
    """A value as a user wrote it (JSON-like), cut to VALUE_WIDTH characters."""
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= VALUE_WIDTH else text[:VALUE_WIDTH - 3] + "..."


def allowed_text(option: dict) -> str:
    """What an option accepts, from its argument spec: type, elements, choices, sub-options."""
    kind = option.get("type") or "str"
    text = TYPE_TEXT.get(kind, kind)
    elements = option.get("elements")
    if kind == "list" and elements:
        text = "a list of %s" % TYPE_PLURAL.get(elements, elements)
    subs = option.get("options") or {}
    if subs:
        keys = ["%s%s" % (k, " (required)" if (v or {}).get("required") else "") for k, v in subs.items()]
        text += " with keys %s" % ", ".join(keys)
    choices = [c for c in option.get("choices") or [] if c is not None]
    if choices:
        text += ", %s: %s" % ("each one of" if kind == "list" else "one of", ", ".join(str(c) for c in choices))
    if None in (option.get("choices") or []):
        text += ", or null"
    return text


def option_message(name: str, option: dict, value: Any, detail: str = "") -> str:
    """``value of NAME must be ALLOWED, got: VALUE`` and Ansible's detail when it adds something."""
    line = "value of %s must be %s, got: %s" % (name, allowed_text(option), show_value(value))
    if detail and "got:" not in detail:
        line += " (%s)" % detail[:200]
    return line


def root_problem(value: Any) -> str | None:
    """Why ``value`` cannot be the node root, or None. An empty root must never mean the controller's /."""
    if not isinstance(value, str) or not value.strip():
        return ("value of gpunode_tuning_root must be an absolute path (/ for the running system, a directory "
                "for a simulated node), got: %s" % show_value(value))
    if not value.startswith("/"):
        return ("value of gpunode_tuning_root must be an absolute path (/ for the running system, a directory "
                "for a simulated node), got the relative path %s" % show_value(value))
    return None


# Files of ours on the node, absolute below gpunode_tuning_root. The modules refuse a path that
# leaves the root; tasks that read or write them directly (slurp, template) rely on this check.
NODE_PATH_VARIABLES = (
    "gpunode_tuning_journal",
    "gpunode_tuning_sysctl_file",
    "gpunode_tuning_kernel_cmdline_dropin",
    "gpunode_tuning_boot_script",
    "gpunode_tuning_udev_rule",
)
NODE_PATH_ALLOWED = "an absolute path on the node without '..' components, spaces or control characters"


def node_path_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the node path ``name`` (below the node root), or None."""
    if not isinstance(value, str):
        return None  # the argument spec reports the type
    parts = value.split("/")
    bad = (not value.startswith("/") or ".." in parts
           or any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in value))
    if bad:
        return "value of %s must be %s, got: %s" % (name, NODE_PATH_ALLOWED, show_value(value))
    return None


def path_problems(provided: dict, errors: Iterable[str]) -> list[str]:
    """The node root's and the node paths' problems that the argument spec does not see.

    ``errors``: the lines already found; a variable named there is not reported twice.
    """
    out = []
    named = {line.split(" ", 3)[2] for line in errors if line.startswith("value of ")}
    if "gpunode_tuning_root" in provided and "gpunode_tuning_root" not in named:
        problem = root_problem(provided["gpunode_tuning_root"])
        if problem:
            out.append(problem)
    for name in NODE_PATH_VARIABLES:
        problem = node_path_problem(name, provided.get(name))
        if problem and name not in named:
            out.append(problem)
    return out


def report(errors: Iterable[str], unknown: Iterable[tuple[str, str | None]], strict: bool = False) -> dict:
    """``{errors, warnings, msg}``: the lines to fail with, the lines to warn about, one message."""
    unknown_lines = [unknown_message(n, s, strict) for n, s in unknown]
    errors = list(errors) + (unknown_lines if strict else [])
    warnings = [] if strict else unknown_lines
    msg = ""
    if errors:
        msg = "%d bad variable(s), nothing was changed:\n%s" % (len(errors), "\n".join(errors))
    return {"errors": errors, "warnings": warnings, "msg": msg}


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
    if ansible_compat.templating_keeps_types():
        return plain(templar.template(value))
    if isinstance(value, Mapping):
        return {typed(templar, k): typed(templar, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed(templar, v) for v in value]
    if not isinstance(value, str) or ansible_compat.is_unsafe(value) or "{" not in value:
        return plain(value)
    match = _WHOLE_EXPRESSION.match(value)
    if not match:
        return plain(templar.template(value))
    out = templar.template("%s{{ (%s) | ansible.builtin.to_json }}" % (_MARK, match.group("expr")))
    return json.loads(str(out)[len(_MARK):])


def raw_role_variables(task_vars: Mapping) -> dict:
    """Every ``gpunode_tuning_*`` variable of the task, untemplated, but the facts the role exports.

    The exported facts (``EXPORTED_FACTS``) are the flows' results, never their input: a flow that sets one
    must not make the next flow template the role's variables again (``inputs_digest``).
    """
    return {k: task_vars[k] for k in task_vars if isinstance(k, str) and k.startswith(PREFIX)
            and k not in EXPORTED_FACTS}


def _with_preset_values(templar, task_vars: Mapping):
    """``templar`` with the selected preset's values templated once, or ``templar`` itself when that fails.

    A dozen role defaults are ``{{ __gpunode_tuning_preset_values.NAME }}``, and the preset's values are a
    template that picks one preset out of all of them: templated through each default, it would be
    templated a dozen times per task (issue 31). Templated once here, the defaults read the result.
    A template that fails here fails again in the default that reads it, which reports it.
    """
    value = task_vars.get(PRESET_VALUES)
    if not isinstance(value, str) or "{" not in value:
        return templar
    try:
        rendered = typed(templar, value)
    except Exception:  # noqa: BLE001  (reported by the variables that read it)
        return templar
    return ansible_compat.with_variables(templar, dict(task_vars, **{PRESET_VALUES: rendered}))


def resolve(templar, task_vars: Mapping) -> tuple[dict, list[str]]:
    """``(values, errors)``: every ``gpunode_tuning_*`` variable with its type, and the ones that fail."""
    values, errors = {}, []
    raw = raw_role_variables(task_vars)
    templar = _with_preset_values(templar, task_vars)
    for name, value in sorted(raw.items()):
        try:
            values[name] = typed(templar, value)
        except Exception as exc:  # noqa: BLE001  (any templating error is the user's variable's)
            errors.append("value of %s cannot be templated: %s" % (name, " ".join(str(exc).split())[:300]))
    return values, errors


# What a template may call whose result is not a function of the variables it names (or names every
# variable at once): a role variable built with one is never reused, it is templated by every flow task.
UNSTABLE_NAMES = frozenset({"lookup", "query", "q", "now", "random", "shuffle", "password_hash", "hostvars",
                            "vars", "undef"})
_JINJA = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])  # parses, never renders
# Bound on the chain of variables followed through templates (a cycle ends sooner: each name once).
_MAX_NAMES = 2000


def _template_names(text: str) -> set[str] | None:
    """The variables the template ``text`` reads, or None when its result may depend on more than them."""
    try:
        tree = _JINJA.parse(text)
    except jinja2.TemplateSyntaxError:
        return None
    # Every name the template loads, its own loop and set variables too: one too many costs nothing.
    names = {node.name for node in tree.find_all(jinja2.nodes.Name) if node.ctx == "load"}
    called = {node.name for node in tree.find_all((jinja2.nodes.Filter, jinja2.nodes.Test))}
    if (names | called) & UNSTABLE_NAMES:
        return None
    return names


def _strings(value, out: list) -> list:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _strings(key, out)
            _strings(item, out)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _strings(item, out)
    elif isinstance(value, str) and ("{{" in value or "{%" in value):
        out.append(value)
    return out


def inputs_digest(task_vars: Mapping) -> str | None:
    """A digest of everything the role's variables are templated from, or None when that cannot be told.

    The inputs are the raw ``gpunode_tuning_*`` variables and, through every template among them, the raw
    value of each variable a template names (and of those their templates name, and so on; a name that is
    not set counts as unset). Two tasks of a host with the same digest template the role's variables to
    the same values, so the second may reuse the first's (``tuning_flow``'s resolved fact). None when a
    template looks up, draws at random, reads the clock or reads every variable (``UNSTABLE_NAMES``) or
    does not parse: then every task templates again.
    """
    pending = sorted(raw_role_variables(task_vars))
    seen: dict = {}
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        if len(seen) >= _MAX_NAMES:
            return None
        present = name in task_vars
        value = task_vars[name] if present else None
        seen[name] = (present, value)
        for text in _strings(value, []):
            names = _template_names(text)
            if names is None:
                return None
            pending.extend(sorted(names - set(seen)))
    try:
        encoded = json.dumps(sorted(seen.items()), sort_keys=True, default=_unencodable, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


def _unencodable(value):
    raise TypeError("%s is not plain data" % type(value).__name__)


def preload() -> None:
    """Parse the argument specs now, if they can be read (the flow task reports it if not).

    Called when tuning_flow is imported: ansible-playbook's main process imports an action plugin before it
    forks the workers that run its tasks, so each worker inherits them parsed instead of parsing the role's
    53 KB of specs again for every task and host (issue 31).
    """
    try:
        load_specs()
    except RoleVariablesError:
        pass


def _option_errors(options: dict, provided: dict) -> list[str]:
    """One line per bad option: each failing option validated again alone, to name it and its value."""
    lines = []
    for name in sorted(provided):
        if name == "gpunode_tuning_root" and root_problem(provided[name]):
            # path_problems words it, alike on every core: for null, 2.16's validator reports a type error
            # and 2.19's converts it to "".
            continue
        result = ArgumentSpecValidator({name: options[name]}).validate({name: provided[name]})
        if not result.error_messages:
            continue
        errors = ansible_compat.validation_errors(result)
        detail = errors[0].msg
        if detail.startswith("value of %s must " % name):
            # Ansible's choice error names the variable, the choices and the value; null as YAML says it.
            lines.append(detail.replace(", None, got: ", ", null, got: "))
            continue
        details = [e.msg for e in errors if not isinstance(e, (ArgumentTypeError, ElementError, NoLogError))]
        lines.append(option_message(name, options[name], provided[name], details[0] if details else ""))
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


# The spec types a command line gives as text (``-e name=1`` arrives as ``"1"``): converted as the precheck's
# validation converts them, for every consumer (``typed_values``).
CONVERTED_TYPES = ("int", "float", "bool")


def typed_values(values: Mapping, specs: dict | None = None) -> dict:
    """``values`` (role variables by name) with each one whose argument spec type is a number or a boolean
    converted as the precheck converts it (``check``: Ansible's validator, by the spec's type): ``"1"`` for a
    float is ``1.0``, ``"60"`` for an int ``60``, ``"yes"`` for a bool ``True``.

    What the precheck accepted is what every consumer reads (the reboot action reads its variables through this,
    the flows read ``check``'s result). A value the spec cannot convert is left as given: the precheck refuses it,
    naming it, before any consumer runs; other variables pass unchanged."""
    options = spec_options(load_specs() if specs is None else specs)
    scalar = {name: {"type": options[name]["type"]} for name, value in values.items()
              if value is not None and name in options and options[name].get("type") in CONVERTED_TYPES}
    out = dict(values)
    if scalar:
        result = ArgumentSpecValidator(scalar).validate({name: values[name] for name in scalar})
        out.update((name, plain(value)) for name, value in result.validated_parameters.items() if name in scalar)
    return out


def check(values: dict, entry_points, specs: dict | None = None) -> tuple[dict, list[str], list[str]]:
    """``(validated, errors, warnings)`` of the role variables against the options of ``entry_points``.

    ``validated`` holds every option of those entry points (defaults where a variable is unset),
    converted as the spec says; it is only meaningful when ``errors`` is empty.
    """
    specs = load_specs() if specs is None else specs
    for entry in entry_points:
        if entry not in specs:
            raise RoleVariablesError("entry point must be one of: %s (got %r)" % (", ".join(specs), entry))
    options = spec_options(specs, entry_points)
    provided = {k: v for k, v in values.items() if k in options}
    result = ArgumentSpecValidator(options).validate(provided)
    errors = _option_errors(options, provided) if result.error_messages else []
    errors += path_problems(provided, errors)
    validated = {k: without_filled(v, provided.get(k)) for k, v in plain(result.validated_parameters).items()}
    strict = validated.get("gpunode_tuning_strict_vars", values.get("gpunode_tuning_strict_vars")) is True
    unknown = unknown_variables(values, known_names(specs))
    outcome = report(errors, unknown, strict)
    return validated, outcome["errors"], outcome["warnings"]
