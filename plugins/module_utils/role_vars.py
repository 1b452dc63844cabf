# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's variables checked before anything runs: short messages, unknown names, the node root.

Pure functions, no I/O and no Ansible imports: the controller-side filter
(plugins/filter/role_vars.py) runs Ansible's own argument-spec validator and hands its verdict
and the role's argument specs here. Ansible's own messages can lack the value ("is of type str
and we were unable to convert to int") and its failed validation task dumps the whole spec
(about 10 KB); here every bad variable gets one line with its name, its value and what is
allowed.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, Iterable

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
)
EXPORTED_FACTS = (
    "gpunode_tuning_verification",
    "gpunode_tuning_reboot_required",
    "gpunode_tuning_pending_kernel_args",
    "gpunode_tuning_rollout_result",
)
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
    """``[(name, nearest known name or None)]`` for each prefixed name that is not known, sorted."""
    known = set(known)
    return [(n, nearest_name(n, known)) for n in sorted(set(names)) if n.startswith(PREFIX) and n not in known]


def unknown_message(name: str, suggestion: str | None, strict: bool = False) -> str:
    """One line about an unknown variable."""
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
    "gpunode_tuning_cmdline_dropin",
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
