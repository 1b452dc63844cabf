# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU idle states (C-states): read, plan and apply the per-CPU ``disable`` files (facts and verification:
cpuidle_verify.py).

How it works and why: docs/dev/node-code.md, "families/cpuidle.py"."""

from __future__ import annotations

from typing import Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core import validate
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import (
    JOURNAL_ARGUMENT_SPEC,
    Journal,
    open_node,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    SYSFS_CPU,
    Node,
    NodeError,
    format_cpulist,
    online_cpus,
    parse_cpulist,
)

NAME = "cpuidle"
CURRENT_DRIVER = SYSFS_CPU + "/cpuidle/current_driver"
POLL = "POLL"
DISABLED = "disabled"
ENABLED = "enabled"

ARGUMENT_SPEC = dict(
    disable=dict(type="list", elements="str"),
    max_latency_us=dict(type="int"),
    state=dict(type="str", choices=[DISABLED, ENABLED], default=DISABLED),
    cpus=dict(type="str"),
    required=dict(type="bool", default=False),
)
# The desired-value options (what a preset may set for every node: preset_options).
DESIRED_OPTIONS = ("disable", "max_latency_us", "cpus")
ARGUMENT_SPEC.update(contract.preset_options_spec(DESIRED_OPTIONS))
ARGUMENT_SPEC.update(JOURNAL_ARGUMENT_SPEC)
ARGUMENT_SPEC.update(NODE_ARGUMENT_SPEC)
MUTUALLY_EXCLUSIVE = [("disable", "max_latency_us")]


class PlanError(ValueError):
    """A request that cannot be planned on this node; the message names what is allowed."""


class IdleState:
    """One idle state of one CPU as read from sysfs."""

    __slots__ = ("cpu", "index", "name", "latency", "disabled")

    def __init__(self, cpu, index, name, latency, disabled):
        self.cpu = cpu
        self.index = index
        self.name = name
        self.latency = latency
        self.disabled = disabled

    def path(self, attr: str) -> str:
        return "%s/cpu%d/cpuidle/state%d/%s" % (SYSFS_CPU, self.cpu, self.index, attr)


def idle_driver(node: Node) -> str | None:
    """Return the cpuidle driver name, or None when the node has none (``none`` or no file)."""
    driver = node.read(CURRENT_DRIVER, default="")
    return driver if driver and driver != "none" else None


def select_cpus(node: Node, text: str | None) -> list[int]:
    """Return the CPUs named by a cpulist string (all online CPUs when ``text`` is empty)."""
    online = online_cpus(node)
    if text is None or not str(text).strip():
        return online
    text = str(text).strip()
    try:
        cpus = validate.cpulist(text)
    except validate.ValidationError:
        raise PlanError("cpus=%r is not a cpulist such as '0-3,8'; this node's online CPUs are %s"
                        % (text, format_cpulist(online))) from None
    missing = sorted(set(cpus) - set(online))
    if missing:
        raise PlanError("cpus=%r names CPUs this node does not have online (%s); online CPUs are %s"
                        % (text, format_cpulist(missing), format_cpulist(online)))
    return cpus


def _int(text, default=0):
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def _read_disabled(node, path):
    """Whether a ``disable`` file says disabled; None when it cannot be read (vanished, not a file)."""
    value = _int(node.read(path, default=""), default=None)
    return None if value is None else value != 0


def read_states(node: Node, cpus: Iterable[int]) -> dict:
    """Read the idle states of ``cpus``: ``{cpu: {name: IdleState}}``."""
    out = {}
    for cpu in cpus:
        base = "%s/cpu%d/cpuidle" % (SYSFS_CPU, cpu)
        states = {}
        for entry in node.listdir(base):
            if not entry.startswith("state") or not entry[5:].isdigit():
                continue
            d = base + "/" + entry
            name = node.read(d, "name", default="")
            if not name:
                continue
            states[name] = IdleState(cpu, int(entry[5:]), name, _int(node.read(d, "latency", default="0")),
                                     _read_disabled(node, d + "/disable"))
        out[cpu] = states
    return out


def state_names(states_by_cpu: dict) -> list[str]:
    """Names of the states present on any CPU, ordered by exit latency then name."""
    latency = {}
    for states in states_by_cpu.values():
        for st in states.values():
            latency[st.name] = max(latency.get(st.name, 0), st.latency)
    return sorted(latency, key=lambda n: (latency[n], n))


def plan_by_names(states_by_cpu: dict, names: list[str], desired: str) -> dict:
    """Plan ``desired`` (disabled/enabled) for the named states: ``{(cpu, name): desired}``."""
    known = state_names(states_by_cpu)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise PlanError("unknown idle state%s %s: this node's states (driver names) are %s"
                        % ("s" if len(unknown) > 1 else "", ", ".join(unknown), ", ".join(known) or "none"))
    wanted = set(names)
    return {(cpu, name): desired
            for cpu, states in states_by_cpu.items() for name in states if name in wanted}


def plan_by_latency(states_by_cpu: dict, max_latency_us: int) -> dict:
    """Plan by exit latency: states above ``max_latency_us`` disabled, the others enabled."""
    if max_latency_us is None or max_latency_us < 0:
        raise PlanError("max_latency_us must be an integer >= 0 (microseconds), got %r" % (max_latency_us,))
    plan = {}
    for cpu, states in states_by_cpu.items():
        for name, st in states.items():
            above = st.latency > max_latency_us and name != POLL
            plan[(cpu, name)] = DISABLED if above else ENABLED
    return plan


def plan_writes(states_by_cpu: dict, plan: dict) -> list[tuple[IdleState, str]]:
    """Return the IdleStates whose ``disable`` file must change, with the value to write."""
    writes = []
    for (cpu, name), desired in sorted(plan.items()):
        st = states_by_cpu[cpu][name]
        if st.disabled != (desired == DISABLED):
            writes.append((st, "1" if desired == DISABLED else "0"))
    return writes


def summarize(states_before: dict, states_after: dict, plan: dict) -> dict:
    """Aggregate per state name: latency, desired, cpus, cpus_changed, disabled counts/cpulist."""
    out = {}
    for name in state_names(states_before):
        cpus = sorted(cpu for cpu, states in states_before.items() if name in states)
        desired = sorted({plan[(cpu, name)] for cpu in cpus if (cpu, name) in plan})
        before = [cpu for cpu in cpus if states_before[cpu][name].disabled]
        after = [cpu for cpu in cpus if name in states_after.get(cpu, {}) and states_after[cpu][name].disabled]
        changed = [cpu for cpu in cpus if name in states_after.get(cpu, {})
                   and states_after[cpu][name].disabled != states_before[cpu][name].disabled]
        out[name] = dict(
            latency=max(states_before[cpu][name].latency for cpu in cpus),
            desired=(desired[0] if len(desired) == 1 else "mixed") if desired else None,
            cpus=format_cpulist(cpus),
            cpus_changed=len(changed),
            disabled_before=len(before),
            disabled_after=len(after),
            disabled_cpus=format_cpulist(after),
        )
    return out


def diff_text(summary: dict, names: Iterable[str]) -> dict:
    """Diff lines per state, e.g. ``C2: disabled on 0/128 CPUs``."""
    before, after = [], []
    for name in names:
        s = summary[name]
        total = len(parse_cpulist(s["cpus"]))
        before.append("%s: disabled on %d/%d CPUs\n" % (name, s["disabled_before"], total))
        after.append("%s: disabled on %d/%d CPUs\n" % (name, s["disabled_after"], total))
    return dict(before="".join(before), after="".join(after))


def reread_disabled(node: Node, states_by_cpu: dict) -> dict:
    """Copy of ``states_by_cpu`` with every ``disable`` file read again (the after state)."""
    return {cpu: {n: IdleState(st.cpu, st.index, st.name, st.latency, _read_disabled(node, st.path("disable")))
                  for n, st in states.items()}
            for cpu, states in states_by_cpu.items()}


def _after_states(states_by_cpu, writes):
    """States as they will be after ``writes`` (check mode), copied so the input is unchanged."""
    after = {cpu: {n: IdleState(st.cpu, st.index, st.name, st.latency, st.disabled) for n, st in states.items()}
             for cpu, states in states_by_cpu.items()}
    for st, value in writes:
        after[st.cpu][st.name].disabled = value == "1"
    return after


def apply_writes(node: Node, writes: list[tuple[IdleState, str]]) -> dict:
    """Write each ``disable`` file and read it back; return the failures as ``{name: {cpu: message}}``."""
    failed = {}
    for st, value in writes:
        try:
            node.write(value + "\n", st.path("disable"))
            got = node.read(st.path("disable"))
            if got != value:
                raise NodeError("cpu%d %s: wrote %s, read back %s" % (st.cpu, st.name, value, got))
        except NodeError as exc:
            failed.setdefault(st.name, {})[st.cpu] = str(exc)
    return failed


def writable_writes(node: Node, writes: list[tuple[IdleState, str]], failed: dict) -> list[tuple[IdleState, str]]:
    """Check mode: the writes a real run could make; each refused one goes to ``failed`` with its cause."""
    kept = []
    for st, value in writes:
        problem = node.write_problem(st.path("disable"))
        if problem is None:
            kept.append((st, value))
        else:
            failed.setdefault(st.name, {})[st.cpu] = "%s %s" % (node.path(st.path("disable")), problem)
    return kept


def failure_message(failed: dict, restore: bool = False, check_mode: bool = False) -> str:
    """``C2 on CPUs 3,7 (cause; cause)`` per state, at most three causes each."""
    parts = []
    for name, by_cpu in sorted(failed.items()):
        msgs = [by_cpu[cpu] for cpu in sorted(by_cpu)]
        more = "; and %d more" % (len(msgs) - 3) if len(msgs) > 3 else ""
        parts.append("%s on CPUs %s (%s%s)" % (name, format_cpulist(sorted(by_cpu)), "; ".join(msgs[:3]), more))
    if check_mode and restore:
        head = ("check mode: a real run would fail. idle states could not be restored (they would stay in the "
                "journal; the others would be restored): ")
    elif check_mode:
        head = "check mode: a real run would fail. idle state writes would not take (the other CPUs and states " \
               "would be set): "
    elif restore:
        head = "idle states could not be restored (they stay in the journal; the others were restored): "
    else:
        head = "idle state writes did not take (the other CPUs and states were set): "
    return head + "; ".join(parts)


def latency_problem(value) -> str | None:
    """What is wrong with a max_latency_us value, or None."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        return "max_latency_us must be an integer >= 0 (microseconds), got %r" % (value,)
    return None


def _check_params(params):
    """FamilyError on option combinations that cannot be planned, before the node is read."""
    names, max_latency = params["disable"], params["max_latency_us"]
    problem = None
    if latency_problem(max_latency):
        problem = latency_problem(max_latency)
    elif max_latency is not None and params["state"] == ENABLED:
        problem = ("state=enabled cannot be combined with max_latency_us: a latency bound both disables (exit "
                   "latency above it) and enables (the others); use disable=[names] with state=enabled")
    elif not params["restore"] and names is None and max_latency is None:
        problem = "one of disable (state names), max_latency_us or restore=true is required"
    elif names is not None and any(not n or not n.strip() for n in names):
        problem = "disable contains an empty state name; give names such as POLL, C1, C2"
    elif names is not None:
        try:
            validate.cstate_names(names)
        except validate.ValidationError as exc:
            problem = "disable: %s" % exc
    if problem:
        raise contract.FamilyError(problem)


def run(call: contract.Call) -> dict:
    """The cpu_cstate module: validate, plan, journal, write, read back; returns the result."""
    params = call.params
    _check_params(params)
    restore = params["restore"]
    node, journal = open_node(params)
    try:
        cpus = select_cpus(node, params["cpus"])
    except PlanError as exc:
        raise contract.FamilyError(str(exc)) from None

    driver = idle_driver(node)
    result = dict(changed=False, supported=driver is not None, driver=driver, states={})
    states_by_cpu = read_states(node, cpus) if driver else {}
    if not driver or not any(states_by_cpu.values()):
        return _unsupported(call, node, result, driver, cpus)

    if restore:
        from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpuidle_restore

        plan, journaled, failed = cpuidle_restore.restore_plan(node, journal, states_by_cpu)
    else:
        plan, journaled, failed = _plan(params, states_by_cpu, result), states_by_cpu, {}
    writes, after = _apply(call, node, journal, journaled, plan_writes(journaled, plan), failed)

    summary = summarize(journaled, after, plan)
    result.update(changed=bool(writes), states=summary, cpus=format_cpulist(cpus if not restore else sorted(journaled)))
    if call.diff:
        result["diff"] = diff_text(summary, [n for n in summary if summary[n]["desired"] is not None])
    if failed:
        result["failed_states"] = sorted(failed)
        raise contract.FamilyError(failure_message(failed, restore, call.check_mode), result)
    return result


def _apply(call, node, journal, journaled, writes, failed):
    """Journal and write ``writes``, or in check mode probe them; returns ``(writes, disabled states after)``."""
    restore = call.params["restore"]
    if writes and call.check_mode:
        writes = writable_writes(node, writes, failed)
    if writes and not call.check_mode:
        if journal is not None and not restore:
            _journal_originals(journal, writes)
        for name, by_cpu in apply_writes(node, writes).items():
            failed.setdefault(name, {}).update(by_cpu)
        after = reread_disabled(node, journaled)
    else:
        after = _after_states(journaled, writes)
    if restore and not call.check_mode:
        _keep_failed(journal, failed, bool(writes))
    return writes, after


def _unsupported(call, node, result, driver, cpus):
    """The result (FamilyError with required=true): no cpuidle driver, or no states on the selected CPUs."""
    params = call.params
    result["supported"] = False
    why = "this node has no cpuidle driver (/%s is %r)" % (CURRENT_DRIVER, node.read(CURRENT_DRIVER, default=""))
    if driver:
        why = "cpuidle driver %s exposes no idle states on CPUs %s" % (driver, format_cpulist(cpus))
    if params["required"]:
        raise contract.FamilyError("C-states cannot be controlled: " + why, result)
    result["reason"] = why
    if not params["restore"]:
        contract.warn_not_applicable(call, {k: why for k in ("disable", "max_latency_us")
                                            if params.get(k) is not None})
    return result


def _plan(params, states_by_cpu, result):
    """The plan of the desired states (latency bound or names); FamilyError naming what is allowed."""
    try:
        if params["max_latency_us"] is not None:
            return plan_by_latency(states_by_cpu, params["max_latency_us"])
        return plan_by_names(states_by_cpu, params["disable"], params["state"])
    except PlanError as exc:
        raise contract.FamilyError(str(exc), result) from None


def _journal_originals(journal, writes):
    """Record the original ``disable`` value of every CPU and state about to change, before writing."""
    originals = {}
    for st, _value in writes:
        if st.disabled is not None:  # unreadable: there is no original to record
            originals.setdefault(st.name, {})[st.cpu] = "1" if st.disabled else "0"
    for name, values in originals.items():
        journal.record_per_cpu(NAME, name, values)
    journal.mark_applied(NAME)
    journal.save()


def _keep_failed(journal, failed, wrote):
    """Drop the restored originals; keep exactly those of the CPUs and states that could not be restored."""
    for name, original in journal.entries(NAME).items():
        values = Journal.per_cpu(original)
        kept = {cpu: v for cpu, v in values.items() if cpu in failed.get(name, {})}
        if kept == values:
            continue
        journal.drop(NAME, name)
        if kept:
            journal.record_per_cpu(NAME, name, kept)
    if wrote:
        journal.mark_applied(NAME)
    journal.save()


# --- boot: its re-apply at boot (its verification is cpuidle_verify.py) ---


def summary(result: dict) -> str:
    if not result.get("supported", True):
        return "not applicable: %s" % result.get("reason")
    states = result.get("states") or {}
    disabled = [n for n, s in states.items() if s.get("desired") == "disabled"]
    changed = sum(s.get("cpus_changed") or 0 for s in states.values())
    return "disabled %s (%d CPU states changed)" % (", ".join(disabled) or "none", changed)


def _plan_half():
    """The plan half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpuidle_plan
    return cpuidle_plan


def _verification():
    """The verification half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpuidle_verify
    return cpuidle_verify


DEFINITION = Family(
    name=NAME,
    titles={NAME: "C-states"},
    module="cpu_cstate",
    read=contract.later(_verification, "read"),
    facts_doc=contract.later(_verification, "FACTS_DOC"),
    run=run,
    evaluate=contract.later(_verification, "evaluate"),
    boot=contract.later(_plan_half, "boot"),
    from_role=contract.later(_plan_half, "from_role"),
    runtime_options=contract.later(_plan_half, "runtime_options"),
    restore_options=contract.later(_plan_half, "restore_options"),
    argument_spec=ARGUMENT_SPEC,
    per_cpu=("*",),
    drifted_cpus=contract.later(_verification, "drifted_cpus"),
    summary=summary,
    items="states",
    validate={NAME: contract.later(_plan_half, "desired_problems")},
)
