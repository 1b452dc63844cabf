# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tunables family's plan half: what the controller calls (the desired state from the role's variables, its
validation, the module's options), what the persistent flow writes (the sysctl drop-in) and the boot re-apply of
the transparent hugepage settings (flows/boot.py).

Imported when one of them is first called (``family.later`` in families/tunables.py), never by a run that only
applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core import persistence
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import ValidationError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate_boot import absolute_path, write_problem
from ansible_collections.gpunode.tuning.plugins.module_utils.families.tunables import (
    NAME,
    TunableError,
    apply,
    canonical_key,
    key_components,
    plan_items,
    thp_problem,
    value_problem,
)


def sysctl_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["sysctl"]`` (``{name: value}``): key grammar, a name given twice,
    the value's text and a range the kernel documents. Whether the key exists on the node, and whether an
    integer key gets integers, is the node's (``plan_sysctl``)."""
    shape = contract.entry_problem("sysctl", want, "sysctl names to values")
    if shape or want is None:
        return shape
    out, seen = [], {}
    for key, value in want.items():
        try:
            name = canonical_key(key_components(key))
        except TunableError as exc:
            out.append((str(key), str(exc)))
            continue
        if name in seen:
            out.append((key, "%s is given twice (as %r and %r)" % (name, seen[name], key)))
        seen[name] = key
        problem = value_problem(name, value)
        if problem:
            out.append((key, problem))
    return out


def thp_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["thp"]`` (``{enabled, defrag}``, None or "" for not managed)."""
    shape = contract.entry_problem("thp", want, "enabled, defrag")
    if shape or want is None:
        return shape
    return [(str(name), problem) for name, value in want.items() if value not in (None, "")
            for problem in [thp_problem(name, value)] if problem]


def numa_balancing_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["numa_balancing"]`` (kernel.numa_balancing's value; None: unmanaged)."""
    if want is None:
        return []
    problem = value_problem("kernel.numa_balancing", want)
    return [("", problem)] if problem else []


def from_role(v: dict, shared: dict) -> dict:
    """NUMA balancing, THP and the sysctls (NUMA balancing is a sysctl too: kernel.numa_balancing)."""
    sysctl = {}
    if v["gpunode_tuning_sysctl_enabled"]:
        sysctl.update(v["gpunode_tuning_sysctl"] or {})
        sysctl.update(v["gpunode_tuning_sysctl_extra"] or {})
    numa = v["gpunode_tuning_numa_balancing"] if v["gpunode_tuning_numa_balancing_enabled"] else None
    if v["gpunode_tuning_numa_balancing_enabled"]:
        sysctl["kernel.numa_balancing"] = numa
    thp = ({"enabled": v["gpunode_tuning_thp_mode"], "defrag": v["gpunode_tuning_thp_defrag"]}
           if v["gpunode_tuning_thp_enabled"] else {})
    return {"numa_balancing": numa, "thp": thp, "sysctl": sysctl}


def runtime_options(desired: dict, v: dict) -> dict | None:
    """kernel_tunables' options: one call for the sysctls and THP; None when there is neither."""
    if not desired.get("sysctl") and not desired.get("thp"):
        return None
    out = {"skip_readonly": v["gpunode_tuning_sysctl_skip_readonly"]}
    if desired.get("sysctl"):
        out["sysctl"] = desired["sysctl"]
    if desired.get("thp"):
        out["transparent_hugepage"] = desired["thp"]
    return out


def restore_options(v: dict) -> dict:
    return {"restore": True, "skip_readonly": v.get("gpunode_tuning_sysctl_skip_readonly", False)}


def persist_sysctl(pc) -> dict:
    """The sysctl drop-in: every valid key the node has; a key it lacks is left out and fails the concern.

    The values are kernel_tunables' own plan (validated, normalized: lists joined, booleans 1/0), made in
    check mode; bad input or an unwritable drop-in fails before anything is written.
    """
    sysctl = pc.desired.get("sysctl") or {}
    if not sysctl:
        return {"changed": False, "skipped": True, "reason": "no sysctl to persist"}
    path = pc.settings["sysctl_file"]
    try:
        plan = pc.run_family(NAME, {"sysctl": sysctl, "sysctl_file": path}, check_mode=True)
    except contract.FamilyError as exc:
        if "failed_keys" not in exc.result:
            raise
        plan = exc.result
    settings = plan["settings"]
    lines = ["%s=%s" % (k, r["desired"]) for k, r in settings.items() if not r.get("failed")]
    if pc.files.write(path, persistence.HEADER + "".join(line + "\n" for line in lines)) and not pc.settings.get(
            "sysctl_skip_readonly"):
        persistence.run_command(pc, ["sysctl", "-p", path], "loading the sysctl drop-in")
    if plan["failed_keys"]:
        raise contract.FamilyError("not persisted to %s (the other sysctls were): %s" % (
            path, "; ".join(settings[k].get("reason") or k for k in plan["failed_keys"])))
    return {"keys": [k for k, r in settings.items() if not r.get("failed")]}


def remove_sysctl(pc) -> dict:
    pc.files.remove(pc.settings["sysctl_file"])
    return {}


def boot(node: Node, want: dict) -> tuple[bool, str]:
    """kernel_tunables' plan and writes of the transparent hugepage settings, without a journal."""
    items = plan_items(node, thp=want)
    results, failed = apply(node, items)
    if failed:
        return False, "; ".join("%s: %s" % (k, results[k]["reason"]) for k in failed)
    return True, ", ".join("%s=%s%s" % (k, r["after"], " (changed)" if r["changed"] else "")
                           for k, r in sorted(results.items()))


def sysctl_file_problem(node: Node, path: str) -> str | None:
    """Why the sysctl drop-in ``path`` (absolute on the node) could not be written, or None."""
    try:
        absolute_path(path)
    except ValidationError as exc:
        raise TunableError("sysctl_file: %s" % exc) from None
    problem = write_problem(node.path(path))
    if problem:
        return "the sysctl drop-in %s cannot be written: %s" % (node.path(path), problem)
    return None
