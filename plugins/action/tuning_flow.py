# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action gpunode.tuning.tuning_flow: one of the tuning role's flows as one task.

On the controller it reads the role's variables as the inventory, the role defaults and the
presets hold them, with their types on every supported ansible-core (plugin_utils/role_variables.py),
checks them against the role's argument specs and the combinations no spec can express, and builds
the one desired state from the registry of knob families (plugin_utils/desired_state.py). Then:

- ``precheck``: nothing runs on the node; a bad variable fails the host naming it, its value and what
  is allowed, and the result carries the desired state for the tasks that follow.
- ``runtime``: the families the run's tags select, in one module run on the node (tuning_apply),
  each family isolated: one that fails is reported and the others still run. The task does not fail
  for a family: its result names them (``failed_families``) and the role fails the host once, at the
  end of the flow, naming every one.
- ``rollback``: every selected family restores what its journal holds, in the same one module run.

The families come from the registry (each declares its tags; ``--tags pcie_mrrs`` or ``--skip-tags
cpuidle`` select as a task of its own per family would), and this task decides itself which families
the run's tags select.

Documented in plugins/modules/tuning_flow.py.
"""

from __future__ import annotations

import json
import os
import time

import yaml
from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot, verification
from ansible_collections.gpunode.tuning.plugins.plugin_utils import (
    ansible_compat,
    delegate,
    desired_state,
    reports,
    role_variables,
    rollout,
    tags,
)

display = Display()
ARGUMENT_SPEC = {
    "flow": {"type": "str", "required": True,
             "choices": ["precheck", "runtime", "persistent", "rollback", "verify", "health", "rollout"]},
    "gate": {"type": "str", "default": "full"},
    "entry_point": {"type": "str"},
    "include_persistent": {"type": "bool", "default": True},
    "selected_by": {"type": "str", "choices": ["flow", "family"], "default": "flow"},
    "defer_failures": {"type": "bool", "default": False},
    # The rollout's settings as plugin_utils/rollout.py decided them, the host's batch and whether it is a canary.
    "rollout": {"type": "dict"},
    "batch": {"type": "int", "default": 0},
    "canary": {"type": "bool", "default": False},
}
# The entry point whose options each flow is checked against (precheck: the playbook says which).
ENTRY_POINTS = {"runtime": "runtime", "persistent": "persistent", "rollback": "rollback", "verify": "verify",
                "health": "verify", "rollout": "verify"}
MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
COLLECTION_DIR = os.path.dirname(os.path.dirname(MODULE_UTILS))
# The host's record of what failed in the flows of this run: one "NAME: message" line each. The role's
# family_failures.yml fails the host with it at the end of a flow (and main's at the end of both).
FAILURES_FACT = "__gpunode_tuning_failures"
# The role's variables as this host's last flow task templated them, with the digest of what they were
# templated from (role_variables.inputs_digest): a later flow task whose inputs have the same digest reuses
# them instead of templating about a hundred variables again (issue 31). A set_fact or include_vars in
# between changes the digest, so the values are templated again.
RESOLVED_FACT = "__gpunode_tuning_resolved"
# Warnings already shown by this process (one per unknown variable name, not one per host).
_WARNED = set()
# The role's argument specs and defaults, parsed once in the process that forks the task workers.
role_variables.preload()


class ActionModule(ActionBase):
    """Build the desired state from the role's variables and run one flow."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        task_vars = task_vars or {}
        self._resolved = self._variables = None
        result = self._run_flow(task_vars)
        if self._variables is not None:
            result["role_variables"] = self._variables
        if self._resolved is not None and not result.get("failed"):
            result.setdefault("ansible_facts", {})[RESOLVED_FACT] = self._resolved
        return result

    def _run_flow(self, task_vars):
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        flow = args["flow"]
        only, skip = tags.run_tags(task_vars)
        by_family = args["selected_by"] == "family"
        if by_family and (flow not in tags.TAGGED_FLOWS or tags.own_task_runs(flow, self._task.tags, only, skip)):
            # Decided before any variable is read: the flow's own task, which runs too, does the work.
            return {"changed": False, "skipped": True, "module_runs": 0,
                    "skip_reason": "the %s flow's own task runs every family the tags select" % flow}
        inherited = tags.inherited_tags(flow, self._task.tags, by_family) if flow in tags.TAGGED_FLOWS else ()
        selection = self._selection(flow, only, skip, inherited)
        if selection is not None and not any(selection):
            return {"changed": False, "skipped": True, "module_runs": 0, "families": {}, "failed_families": {},
                    "summary": {}, "skip_reason": "the run's tags select no knob family or concern of this flow"}
        if flow == "rollout":
            return self._rollout(args, task_vars, only, skip)
        if flow == "precheck" and args["rollout"] is not None:
            # The rollout's settings first: a bad one stops the rollout before any variable is read.
            errors = rollout.settings(args["rollout"])[1]
            if errors:
                return {"failed": True, "changed": False, "module_runs": 0,
                        "msg": "%s: bad rollout setting(s), nothing was changed: %s"
                               % (task_vars.get("inventory_hostname"), "; ".join(errors))}
        values, problem = self._values(task_vars, args["entry_point"] or ENTRY_POINTS.get(flow) or "main")
        if problem:
            return {"failed": True, "changed": False, "msg": problem}
        desired = desired_state.desired_state(values) if flow != "rollback" else None
        if flow == "precheck":
            return {"changed": False, "desired": desired, "msg": "the role's variables are valid", "module_runs": 0}
        if flow in ("verify", "health"):
            return self._verify(flow, args["gate"], values, desired, task_vars)
        if flow == "runtime":
            result = dict(self._apply(desired_state.runtime_requests(desired, values, selection[0]), values,
                                      task_vars), desired=desired)
            result.setdefault("ansible_facts", {})["gpunode_tuning_pending_kernel_args"] = _pending_kernel_args(
                result)
        elif flow == "persistent":
            result = dict(self._persist(selection[1], desired, values, task_vars), desired=desired)
            result.setdefault("ansible_facts", {})["gpunode_tuning_reboot_required"] = bool(
                result.get("reboot_required"))
        else:
            removed = self._persist(selection[1] if args["include_persistent"] else [], {}, values, task_vars,
                                    remove=True)
            restored = self._apply(desired_state.restore_requests(values, selection[0]), values, task_vars)
            result = dict(desired_state.rollback_result(removed, restored),
                          module_runs=removed.get("module_runs", 1) + restored.get("module_runs", 1),
                          modules=removed.get("modules", []) + restored.get("modules", []))
            result["ansible_facts"] = {"gpunode_tuning_reboot_required": bool(result.get("reboot_required"))}
        return self._record_failures(result, task_vars, flow, only, skip, inherited, args["defer_failures"])

    def _rollout(self, args, task_vars, only, skip):
        """One host's runtime rollout in one task (playbooks/rollout.yml, issue 31).

        What the rollout's steps as tasks do (playbooks/tasks/rollout_steps.yml), in their order and with their
        messages, in ONE module run on the node (tuning_rollout): the health gate (a host with findings, or
        whose check failed, is not tuned), the runtime flow, and unless in check mode verification with the
        gate ``runtime``. That run is the host's only connection attempt: a host that does not answer is
        unreachable and tried no more. Then, on the controller, the host's reports and its record
        (plugin_utils/rollout.py host_result), as the fact ``gpunode_tuning_rollout_result`` and in the result
        (``rollout_result``, also for an unreachable host, whose result carries no facts). Nothing here fails
        the task: every failure is the record's, and the batch gate decides. The measure gate and the
        persistent flow keep their own tasks (the benchmark and the reboot sequence run between the steps).
        """
        settings = args["rollout"] or {}
        host = task_vars.get("inventory_hostname")
        check_mode = bool(self._task.check_mode)
        state = {"host": host, "batch": args["batch"], "canary": args["canary"], "check_mode": check_mode,
                 "health_gate": bool(settings.get("health_gate", True)), "measure": False, "measure_failed": False,
                 "unreachable": False, "reboot_required": False, "reboot": {}}
        out = {"changed": False, "module_runs": 0, "modules": []}
        facts = {}
        try:
            unreachable = self._rollout_steps(state, out, facts, task_vars, only, skip)
        except AnsibleError as exc:  # a fault of this host's step is its record's, never the batch's
            state["tune_error" if state.get("cleared") else "health_error"] = "the rollout task failed: %s" % (
                to_text(exc))
            state.setdefault("cleared", False)
            unreachable = False
        record = rollout.host_result(state)
        self._show(record)
        out["module_runs"] = len(out["modules"])
        if unreachable:
            # An unreachable result sets no fact: the batch gate reads the record from the registered result.
            return dict(out, unreachable=True, msg=state["unreachable_msg"], rollout_result=record)
        facts["gpunode_tuning_rollout_result"] = record
        return dict(out, rollout_result=record, health_findings=state.get("findings") or [], ansible_facts=facts)

    def _rollout_steps(self, state, out, facts, task_vars, only, skip):
        """The steps of ``_rollout`` in one tuning_rollout run, recorded in ``state``; True when the host does not
        answer (the run is the host's only connection attempt)."""
        host = task_vars.get("inventory_hostname")
        values, problem = self._values(task_vars, "verify")
        if problem:
            self._first_step_failed(state, problem)
            return False
        desired = desired_state.desired_state(values)
        selection = tags.selected_families("runtime", only, skip, self._task.tags)
        requests = desired_state.runtime_requests(desired, values, selection)
        verified_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        module_args = {
            "root": values["gpunode_tuning_root"], "command_timeouts": values.get("gpunode_tuning_command_timeouts"),
            "health": desired_state.health_options(values, desired, host) if state["health_gate"] else None,
            "tune": {"families": requests, "journal": values["gpunode_tuning_journal"],
                     "fail_on_error": False} if requests else None,
            "verify": None if state["check_mode"] else desired_state.verify_options(
                values, desired, host, verified_at, "runtime")}
        try:
            result = self._execute_module(module_name="gpunode.tuning.tuning_rollout", module_args=module_args,
                                          task_vars=task_vars)
        except AnsibleConnectionFailure as exc:
            state.update(unreachable=True, unreachable_msg=to_text(exc), cleared=False)
            return True
        out["modules"].append("tuning_rollout")
        for key in ("warnings", "deprecations"):  # the steps' own (a family's), shown as the steps' tasks show them
            if result.get(key):
                out[key] = result[key]
        if result.get("failed"):  # the module itself (its options, or a crash before any step)
            self._first_step_failed(state, result.get("msg") or "failed")
            return False
        health = result.get("health") or {}
        if health.get("failed"):
            state["health_error"] = "Check the health of the host's GPUs: %s" % (health.get("msg") or "failed")
        state["findings"] = list(health.get("health_findings") or [])
        state["cleared"] = not (state["findings"] or state.get("health_error"))
        if not state["cleared"]:
            return False
        self._rollout_tune(state, result.get("tune"), task_vars, out, facts)
        if result.get("diff") is not None:
            out["diff"] = result["diff"]
        if "verify" in result:
            state["verification"], state["verify_error"] = self._rollout_report(result["verify"], host, verified_at,
                                                                                task_vars, values, out)
            facts["gpunode_tuning_verification"] = state["verification"]
        return False

    @staticmethod
    def _first_step_failed(state, message):
        """Nothing ran on the host: the failure is its first step's, named as that step's task was."""
        if state["health_gate"]:
            state["health_error"] = "Check the health of the host's GPUs: %s" % message
        else:
            state["tune_error"] = "Apply runtime tuning of every selected knob family: %s" % message
        state["cleared"] = False

    @staticmethod
    def _rollout_tune(state, tuned, task_vars, out, facts):
        """The tuning step's result in ``state["tune_error"]`` and the facts, as the role's runtime flow words them."""
        tuned = tuned or {"families": {}, "failed_families": {}, "summary": {}}
        lines, facts[FAILURES_FACT] = _failures_record(tuned, task_vars)
        facts["gpunode_tuning_pending_kernel_args"] = _pending_kernel_args(tuned)
        for key in ("families", "failed_families", "summary"):
            out[key] = tuned.get(key) or {}
        out["changed"] = bool(tuned.get("changed"))
        if lines:
            state["tune_error"] = ("Fail the host for the knob families that failed: Runtime tuning failed for these "
                                   "knob families (every other family ran): %s" % " | ".join(facts[FAILURES_FACT]))
        elif tuned.get("failed"):
            state["tune_error"] = "Apply runtime tuning of every selected knob family: %s" % (
                tuned.get("msg") or "failed")

    def _rollout_report(self, verified, host, verified_at, task_vars, values, out):
        """``(verification, error or None)`` from the verification step, the host's reports written."""
        judged = verified.get("verification")
        if verified.get("failed") or not isinstance(judged, dict):
            judged = verification.error_result(
                host, "Read the node and verify it against the desired state: %s" % (verified.get("msg") or "failed"),
                verified_at, "runtime")
        try:
            written = reports.write(self._templar, task_vars, reports.absolute_dir(values["gpunode_tuning_report_dir"]),
                                    result=judged, check_mode=False)
        except (AnsibleActionFail, ValueError) as exc:
            return judged, "Write the host's reports (JSON, JUnit XML, Markdown): %s" % to_text(exc)
        out["reports"] = written["files"]
        gate = judged.get("gate") or {}
        return judged, None if gate.get("ok") else "; ".join(gate.get("failures") or ["failed"])

    @staticmethod
    def _show(record):
        """A host that is not done is named in the run's output, as the failed task of its step was."""
        if record["status"] != "done":
            display.warning("rollout: %s is %s: %s" % (record["host"], record["status"], record["reason"]))

    @staticmethod
    def _selection(flow, only, skip, inherited):
        """``(families, concerns)`` the flow runs under the run's tags; None for the flows tags do not narrow."""
        if flow == "runtime":
            return tags.selected_families(flow, only, skip, inherited), []
        if flow == "persistent":
            return [], tags.selected_concerns(flow, only, skip, inherited)
        if flow == "rollback":
            concerns, families = tags.rollback_selection(only, skip, inherited)
            return families, concerns
        return None

    @staticmethod
    def _record_failures(result, task_vars, flow, only, skip, inherited, defer):
        """The flow's failures added to the host's record (``FAILURES_FACT``), which the role fails the host with.

        The role's failing task is tagged ``always``: under ``--skip-tags always`` it does not run, so the flow
        fails its own task instead (nothing deferred). In the main entry point the runtime flow's failures wait
        for the persistent flow when it runs (``defer_failures``), so that one failing family stops neither.
        """
        lines, record = _failures_record(result, task_vars)
        result.setdefault("ansible_facts", {})[FAILURES_FACT] = record
        persistent_inherited = (set(inherited) - {"runtime"}) | {"persistent"}
        persistent_runs = flow == "runtime" and defer and bool(
            tags.selected_concerns("persistent", only, skip, persistent_inherited))
        if lines and "always" in skip and not persistent_runs:
            result.update(failed=True, msg="%s tuning failed for these knob families (every other family ran): %s"
                          % (flow.capitalize(), " | ".join(record)))
        return result

    def _warn_once(self, task_vars, lines):
        """Each line once: by this process, and only for the play's first host."""
        hosts = task_vars.get("ansible_play_hosts_all") or []
        if hosts and task_vars.get("inventory_hostname") != hosts[0]:
            return
        for line in lines:
            if line not in _WARNED:
                _WARNED.add(line)
                display.warning(line)

    def _values(self, task_vars, entry_point):
        """``(validated variables, None)`` or ``(None, the message naming every bad variable)``."""
        try:
            raw, errors = self._resolve(task_vars)
            validated, more, warnings = role_variables.check(raw, [entry_point])
        except role_variables.RoleVariablesError as exc:
            raise AnsibleActionFail("gpunode.tuning.tuning_flow: %s" % exc) from exc
        self._warn_once(task_vars, warnings)
        errors += more
        if not errors:
            merged = dict(raw)
            merged.update(validated)
            errors += desired_state.combination_problems(merged, entry_point)
            if entry_point != "rollback":
                errors += desired_state.desired_problems(desired_state.desired_state(merged), merged)
                # Only the controller knows the inventory: the Slurm delegate must be a host of it.
                errors += delegate.delegate_problems(merged.get(delegate.VARIABLE),
                                                     (task_vars.get("groups") or {}).get("all"))
            validated = merged
        if errors:
            return None, "%d bad variable(s), nothing was changed:\n%s" % (len(errors), "\n".join(errors))
        return validated, None

    def _resolve(self, task_vars):
        """``role_variables.resolve``, or what this host's earlier flow task resolved from the same inputs."""
        digest = role_variables.inputs_digest(task_vars)
        cached = ansible_compat.exported_fact(task_vars, RESOLVED_FACT)
        if (digest is not None and isinstance(cached, dict) and cached.get("digest") == digest
                and isinstance(cached.get("values"), dict)):
            self._variables = "reused"
            return role_variables.plain(cached["values"]), []
        raw, errors = role_variables.resolve(self._templar, task_vars)
        self._variables = "templated"
        if digest is not None and not errors:
            self._resolved = {"digest": digest, "values": raw}
        return raw, errors

    def _apply(self, requests, values, task_vars):
        if not requests:
            return {"changed": False, "skipped": True, "families": {}, "failed_families": {}, "summary": {},
                    "module_runs": 0,
                    "skip_reason": "no knob family of this flow is selected by the tags or has anything to do"}
        module_args = {"families": requests, "root": values["gpunode_tuning_root"],
                       "journal": values["gpunode_tuning_journal"], "fail_on_error": False,
                       "command_timeouts": values.get("gpunode_tuning_command_timeouts")}
        result = self._execute_module(module_name="gpunode.tuning.tuning_apply", module_args=module_args,
                                      task_vars=task_vars)
        for key in ("families", "failed_families", "summary"):
            result.setdefault(key, {})
        result.update(module_runs=1, modules=["tuning_apply"])
        if result["failed_families"]:
            # The families' failures are the flow's to report, after every family ran (family_failures.yml).
            result["msg"] = "knob families failed: %s" % ", ".join(result["failed_families"])
        return result

    def _verify(self, flow, gate, values, desired, task_vars):
        """One tuning_info run: the node read and judged (verification), or its GPUs' health alone (health)."""
        host = task_vars.get("inventory_hostname")
        verified_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if flow == "verify":
            module_args = desired_state.verify_options(values, desired, host, verified_at, gate)
        else:
            module_args = desired_state.health_options(values, desired, host)
        result = self._execute_module(module_name="gpunode.tuning.tuning_info", module_args=module_args,
                                      task_vars=task_vars)
        result.update(module_runs=1, modules=["tuning_info"], verified_at=verified_at, desired=desired)
        if flow == "health" and isinstance(result.get("verification"), dict) and not result.get("failed"):
            # The rollout's health gate reads them here: no task of its own per host to derive them.
            try:
                result["health_findings"] = verification.health_findings(result["verification"])
            except family.EvaluationError as exc:
                result.update(failed=True, msg="the health check's result cannot be judged: %s" % exc)
        return result

    def _persist(self, concerns, desired, values, task_vars, remove=False):
        """One tuning_persist run for the selected concerns (the boot runner transferred first when needed)."""
        if not concerns:
            return {"changed": False, "skipped": True, "concerns": {}, "failed_concerns": {}, "module_runs": 0,
                    "skip_reason": "no persistent concern is selected by the tags"}
        names = [c.name for c in concerns]
        settings = desired_state.persist_settings(values)
        if not remove and "guard" in names:
            # The guard's config holds tuning_info's options as verification runs them (flows/guard_files.py).
            settings["guard_inputs"] = desired_state.guard_inputs(
                values, desired, task_vars.get("inventory_hostname"), collection_version())
        module_args = {"state": "absent" if remove else "present", "concerns": names,
                       "desired": desired, "settings": settings,
                       "root": values["gpunode_tuning_root"], "journal": values["gpunode_tuning_journal"],
                       "fail_on_error": False, "command_timeouts": values.get("gpunode_tuning_command_timeouts")}
        try:
            if not remove and {"boot_unit", "guard"} & set(names):
                tmp = ansible_compat.remote_tmpdir(self._connection) or self._make_tmp_path()
                src = ansible_compat.remote_join(self._connection, tmp, "gpunode-tuning-boot.py")
                self._transfer_data(src, boot.runner_text(_module_utils_sources()))
                self._fixup_perms2((tmp, src))
                module_args["runner_src"] = src
            result = self._execute_module(module_name="gpunode.tuning.tuning_persist", module_args=module_args,
                                          task_vars=task_vars)
        finally:
            self._remove_tmp_path(ansible_compat.remote_tmpdir(self._connection))
        for key in ("concerns", "failed_concerns"):
            result.setdefault(key, {})
        result.update(module_runs=1, modules=["tuning_persist"])
        # Named as the family failures of the other flows are, for the summary that ends the role.
        result["families"] = {"persistent " + name: r for name, r in result["concerns"].items()}
        result["failed_families"] = {"persistent " + name: msg for name, msg in result["failed_concerns"].items()}
        if result["failed_concerns"]:
            result["msg"] = "persistent concerns failed: %s" % ", ".join(result["failed_concerns"])
        return result


def _failures_record(result, task_vars):
    """``(this flow's "NAME: message" lines, the host's record with them)`` (``FAILURES_FACT``)."""
    lines = ["%s: %s" % kv for kv in (result.get("failed_families") or {}).items()]
    return lines, list(ansible_compat.exported_fact(task_vars, FAILURES_FACT) or []) + lines


def _pending_kernel_args(result):
    """The kernel arguments the runtime families said need a reboot (``gpunode_tuning_pending_kernel_args``)."""
    return [arg for r in (result.get("families") or {}).values() if isinstance(r, dict) and r.get("reboot_required")
            for arg in r.get("kernel_args") or []]


def collection_version(directory: str = COLLECTION_DIR) -> str | None:
    """The collection's version: MANIFEST.json of an installed collection, else galaxy.yml of a checkout."""
    try:
        with open(os.path.join(directory, "MANIFEST.json"), encoding="utf-8") as handle:
            return str(json.load(handle)["collection_info"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        with open(os.path.join(directory, "galaxy.yml"), encoding="utf-8") as handle:
            return str(yaml.safe_load(handle)["version"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def _module_utils_sources():
    """``{name: source}`` of every module_utils file of this collection: what the boot runner carries."""
    try:
        return boot.carried_sources(MODULE_UTILS)
    except OSError as exc:
        raise AnsibleActionFail("gpunode.tuning.tuning_flow: cannot read %s: %s" % (MODULE_UTILS, exc)) from exc
