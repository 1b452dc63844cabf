# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cpuidle family's plan half: what the controller calls (the desired state from the role's variables, its
validation, the module's options) and what the persistent flow and the boot re-apply (flows/boot.py) ask of it.

Imported when one of them is first called (``family.later`` in families/cpuidle.py), never by a run that only
applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core import validate
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils.families.cpuidle import (
    DISABLED,
    NAME,
    apply_writes,
    failure_message,
    idle_driver,
    latency_problem,
    plan_by_latency,
    plan_by_names,
    plan_writes,
    read_states,
    select_cpus,
)


def desired_problems(want) -> list:
    """``Family.validate`` of ``desired["cpuidle"]``: ``{disable: [names], max_latency_us, cpus}``."""
    shape = contract.entry_problem(NAME, want, "disable, max_latency_us, cpus")
    if shape or want is None:
        return shape
    out = []
    names = want.get("disable")
    if names is not None:
        try:
            validate.cstate_names(names)
        except validate.ValidationError as exc:
            out.append(("disable", str(exc)))
    problem = latency_problem(want.get("max_latency_us"))
    if problem:
        out.append(("max_latency_us", problem))
    elif names and want.get("max_latency_us") is not None:
        out.append(("max_latency_us", "disable (%s) and max_latency_us (%r) exclude each other: give state names "
                    "or a latency bound" % (names, want["max_latency_us"])))
    cpus = want.get("cpus")
    if cpus not in (None, ""):
        try:
            validate.cpulist(cpus)
        except validate.ValidationError as exc:
            out.append(("cpus", str(exc)))
    return out


def from_role(v: dict, shared: dict) -> dict:
    """States to disable by name, else by the exit-latency bound, on the selected CPUs."""
    if not v["gpunode_tuning_cpuidle_enabled"]:
        return {NAME: None}
    names = v["gpunode_tuning_cpuidle_disable"] or []
    latency = v["gpunode_tuning_cpuidle_max_latency_us"]
    return {NAME: {"disable": names, "max_latency_us": None if names or latency is None else int(latency),
                   "cpus": v["gpunode_tuning_cpuidle_cpus"] or None}}


def runtime_options(desired: dict, v: dict) -> dict | None:
    """cpu_cstate's options: by name when states are listed, otherwise by latency; None when neither."""
    want = desired.get(NAME)
    if not want or not (want["disable"] or want["max_latency_us"] is not None):
        return None
    out = {"disable": want["disable"]} if want["disable"] else {"max_latency_us": want["max_latency_us"]}
    if want["cpus"]:
        out["cpus"] = want["cpus"]
    return out


def restore_options(v: dict) -> dict:
    return {"restore": True}


def boot(node: Node, want: dict) -> tuple[bool, str]:
    """cpu_cstate's plan (by names, else by the latency bound) and writes, without a journal."""
    names = validate.cstate_names(want.get("disable") or [])
    latency = want.get("max_latency_us")
    if not names and latency is None:
        return True, "no state names and no latency bound: idle states left alone"
    cpus = select_cpus(node, want.get("cpus"))
    if not idle_driver(node):
        return True, "not applicable: this node has no cpuidle driver"
    states = read_states(node, cpus)
    if names:
        plan = plan_by_names(states, names, DISABLED)
        what = "disable %s" % ", ".join(names)
    else:
        plan = plan_by_latency(states, latency)
        what = "exit latency above %d us disabled" % latency
    writes = plan_writes(states, plan)
    failed = apply_writes(node, writes)
    if failed:
        return False, failure_message(failed)
    return True, "%s: %d file(s) written on CPUs %s" % (what, len(writes), format_cpulist(cpus))
