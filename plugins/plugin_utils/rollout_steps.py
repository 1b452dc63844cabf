# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One host's rollout steps on the controller: the one implementation of both ways a host is rolled out.

playbooks/rollout.yml takes each host through its steps: the health gate, the tuning, the measure gate's
benchmark around it, the reboot sequence (persistent flow), verification with its reports, and the host's
record. The steps the action tuning_flow runs (flow ``rollout``, its option ``steps``) are the functions here:

- ``health``: the GPUs' health (gpu_health alone), or only whether the host answers when the health gate is
  off. The host's first connection: a host that does not answer is recorded as unreachable and tried no more.
- ``tune``: the runtime flow's tuning (tuning_apply's options). The persistent flow's tuning is the role's main
  entry point with its reboot sequence, a task of the play's own (its result comes in as the ``outcome``).
- ``verify``: verification (gate ``runtime`` for the runtime flow, ``full`` for the persistent flow, whose reboot
  sequence may hand in the verification its gate made after the boot) and the host's reports.
- ``record``: the host's record (plugin_utils/rollout.py ``host_result``), also the fact
  ``gpunode_tuning_rollout_result``.

The runtime flow without the measure gate asks for all four in one task: the node's steps are then ONE
tuning_rollout module run (issue 31). The persistent flow and the measure gate ask for one step at a time,
their own tasks between (the benchmark, the reboot sequence): each task hands the host's state (``start``, a
dict) to the next through its result (``rollout_state``), with what the play's own tasks found (``outcome``).
Either way the same functions decide what runs, what failed and how it is worded: no task name of a playbook is
read, and both ways leave the same records, reports and node files.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.utils.display import Display

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification
from ansible_collections.gpunode.tuning.plugins.plugin_utils import desired_state, flow_task, reports, rollout, tags

display = Display()
STEPS = ("health", "tune", "verify", "record")
# What the play's own tasks between the steps found (the persistent flow's tuning, the measure gate, the reboot
# sequence): the record holds it, and the verification report shows the benchmark.
OUTCOME_KEYS = ("tune_error", "benchmark", "benchmark_error", "measure_failed", "reboot", "reboot_error",
                "reboot_required", "not_rebooted_for")


def start(host, batch, canary, check_mode, settings):
    """The host's state before its first step (the rollout's ``settings`` as plugin_utils/rollout.py decided)."""
    return {"host": host, "batch": int(batch), "canary": bool(canary), "check_mode": bool(check_mode),
            "flow": settings.get("flow") or "runtime", "health_gate": bool(settings.get("health_gate", True)),
            # The measure gate: a benchmark before and after tuning; in check mode nothing is applied to measure.
            "measure": settings.get("benchmark_command") is not None and not check_mode,
            "measure_failed": False, "unreachable": False, "reboot_required": False, "reboot": {}}


def with_outcome(state, outcome):
    """The state with what the play's own tasks found (``OUTCOME_KEYS``; what they did not find is left out)."""
    out = dict(state)
    for key in OUTCOME_KEYS:
        value = (outcome or {}).get(key)
        if isinstance(value, str) and value.strip().lower() in ("", "false", "none"):
            continue  # a template that rendered to text (ansible-core before 2.19 without native types)
        if value:
            out[key] = value
    return out


def may_tune(state):
    """Whether the tuning step runs: the host answered, is healthy and its benchmark before tuning answered."""
    return bool(state.get("cleared")) and not state.get("unreachable") and not state.get("benchmark_error")


def may_verify(state):
    """Whether the verification step runs: a cleared host, not in check mode (nothing was applied), and not one
    whose measure gate rolled the tuning back (nothing tuned to verify). A host whose tuning failed is verified
    too: its reports show what is not applied and why."""
    return (bool(state.get("cleared")) and not state.get("unreachable") and not state.get("check_mode")
            and not state.get("measure_failed"))


def given_verification(state):
    """The verification the reboot sequence's gate made after the boot (not read twice), or None."""
    given = (state.get("reboot") or {}).get("verification")
    return given if isinstance(given, dict) and given else None


def run(action, task_vars, args, only, skip, cache):
    """The steps of ``args["steps"]`` for this host, run by ``action`` (tuning_flow); the action's result.

    Nothing here fails the task: every failure is the host's record's, and the batch gate decides. A host that
    does not answer gets an unreachable result that still carries its state and its record."""
    steps = [s for s in STEPS if s in (args.get("steps") or STEPS)]
    host = task_vars.get("inventory_hostname")
    if "health" in steps:
        state = start(host, args["batch"], args["canary"], bool(action._task.check_mode), args["rollout"] or {})
    elif isinstance(args.get("state"), dict):
        state = dict(args["state"])
    else:
        return {"failed": True, "changed": False, "msg": "%s: the rollout steps %s need the state the host's earlier "
                "steps left (option state)" % (host, ", ".join(steps))}
    state = with_outcome(state, args.get("outcome"))
    out = {"changed": False, "modules": []}
    facts = {}
    if not state.get("unreachable"):
        try:
            _on_node(action, task_vars, state, steps, out, facts, (only, skip, cache))
        except AnsibleError as exc:  # a fault of this host's step is its record's, never the batch's
            state["tune_error" if state.get("cleared") else "health_error"] = "the rollout task failed: %s" % (
                to_text(exc))
            state.setdefault("cleared", False)
    out.update(module_runs=len(out["modules"]), rollout_state=state)
    if state.get("unreachable") or "record" in steps:
        out["rollout_result"] = facts["gpunode_tuning_rollout_result"] = _record(state)
    if state.get("unreachable"):
        # An unreachable result sets no fact: the batch gate reads the record from the registered result.
        return dict(out, unreachable=True, msg=state["unreachable_msg"])
    return dict(out, health_findings=state.get("findings") or [], ansible_facts=facts)


def _record(state):
    """The host's record; a host that is not done is named in the run's output."""
    record = rollout.host_result(state)
    if record["status"] != "done":
        display.warning("rollout: %s is %s: %s" % (record["host"], record["status"], record["reason"]))
    return record


def _on_node(action, task_vars, state, steps, out, facts, selection):
    """The node's part of ``steps`` in ONE tuning_rollout run (none when no step has anything to do there),
    read into ``state``, ``out`` and ``facts``."""
    only, skip, cache = selection
    host = state["host"]
    values, problem = flow_task.values(action._templar, task_vars, "verify", cache)
    if problem:
        _failed_before_node(state, steps, problem)
        return
    desired = desired_state.desired_state(values)
    first = "health" in steps  # the module itself stops a host that its health step did not clear
    tune = "tune" in steps and state.get("flow") == "runtime" and (first or may_tune(state))
    verify = "verify" in steps and (first and not state["check_mode"] or not first and may_verify(state))
    given = given_verification(state) if verify else None
    verified_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    gate = "runtime" if state.get("flow") == "runtime" else "full"
    requests = desired_state.runtime_requests(desired, values, tags.selected_families(
        "runtime", only, skip, action._task.tags)) if tune else None
    module_args = {
        "root": values["gpunode_tuning_root"], "command_timeouts": values.get("gpunode_tuning_command_timeouts"),
        "health": desired_state.health_options(values, desired, host) if first and state["health_gate"] else None,
        "tune": {"families": requests, "journal": values["gpunode_tuning_journal"],
                 "fail_on_error": False} if requests else None,
        "verify": desired_state.verify_options(values, desired, host, verified_at, gate)
        if verify and given is None else None}
    result = {}
    if first or module_args["tune"] or module_args["verify"]:
        try:
            result = action._execute_module(module_name="gpunode.tuning.tuning_rollout", module_args=module_args,
                                            task_vars=task_vars)
        except AnsibleConnectionFailure as exc:
            state.update(unreachable=True, unreachable_msg=to_text(exc), cleared=False)
            return
        out["modules"].append("tuning_rollout")
        for key in ("warnings", "deprecations"):  # the steps' own (a family's), shown as a task shows them
            if result.get(key):
                out[key] = result[key]
        if result.get("failed"):  # the module itself (its options, or a crash before any step)
            _failed_before_node(state, steps, result.get("msg") or "failed")
            return
    if first and not _health(state, result.get("health") or {}):
        return
    if tune:
        _tuned(state, result.get("tune"), task_vars, out, facts)
        if result.get("diff") is not None:
            out["diff"] = result["diff"]
    if verify and (given is not None or "verify" in result):
        judged, state["verify_error"] = _verified(action, state, given or result["verify"], given is not None,
                                                  (host, verified_at, gate), task_vars, values, out)
        state["verification"] = facts["gpunode_tuning_verification"] = judged


def _failed_before_node(state, steps, message):
    """The step failed before the node did anything (bad variables, the module's own options)."""
    if "health" in steps:
        key = "health_error" if state["health_gate"] else "tune_error"
        state.update({key: message, "cleared": False})
    elif "tune" in steps:
        state["tune_error"] = message
    else:
        state["verify_error"] = message


def _health(state, health):
    """The health step's findings into ``state``; whether the host is cleared for tuning."""
    if health.get("failed"):
        state["health_error"] = health.get("msg") or "failed"
    state["findings"] = list(health.get("health_findings") or [])
    state["cleared"] = not (state["findings"] or state.get("health_error"))
    return state["cleared"]


def _tuned(state, tuned, task_vars, out, facts):
    """The tuning step's result into ``state["tune_error"]``, the task's result and the flows' facts."""
    tuned = tuned or {"families": {}, "failed_families": {}, "summary": {}}
    lines, facts[flow_task.FAILURES_FACT] = flow_task.failures_record(tuned, task_vars)
    facts["gpunode_tuning_pending_kernel_args"] = flow_task.pending_kernel_args(tuned)
    for key in ("families", "failed_families", "summary"):
        out[key] = tuned.get(key) or {}
    out["changed"] = bool(tuned.get("changed"))
    if lines:
        state["tune_error"] = "these knob families failed (every other family ran): %s" % " | ".join(lines)
    elif tuned.get("failed"):
        state["tune_error"] = tuned.get("msg") or "failed"


def _verified(action, state, verified, given, when, task_vars, values, out):
    """``(verification, error or None)`` from the verification step (or the reboot's gate), the reports written.
    With the measure gate the host's report shows the benchmark too (docs/measure-gate.md)."""
    host, verified_at, gate = when
    judged = verified if given else verified.get("verification")
    if not given and (verified.get("failed") or not isinstance(judged, dict)):
        judged = verification.error_result(
            host, "the node could not be read and verified: %s" % (verified.get("msg") or "failed"), verified_at, gate)
    bench = state.get("benchmark")
    shown = dict(judged, benchmark=bench) if isinstance(bench, dict) and "metrics" in bench else judged
    try:
        written = reports.write(action._templar, task_vars, reports.absolute_dir(values["gpunode_tuning_report_dir"]),
                                result=shown, check_mode=False)
    except (AnsibleActionFail, ValueError) as exc:
        return judged, "the host's reports could not be written: %s" % to_text(exc)
    out["reports"] = written["files"]
    checked = judged.get("gate") or {}
    return judged, None if checked.get("ok") else "; ".join(checked.get("failures") or ["failed"])
