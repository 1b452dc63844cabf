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

import yaml
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot
from ansible_collections.gpunode.tuning.plugins.plugin_utils import (
    ansible_compat,
    desired_state,
    flow_task,
    role_variables,
    rollout,
    rollout_steps,
    tags,
)

ARGUMENT_SPEC = {
    "flow": {"type": "str", "required": True,
             "choices": ["precheck", "runtime", "persistent", "rollback", "verify", "rollout"]},
    "gate": {"type": "str", "default": "full"},
    "entry_point": {"type": "str"},
    "include_persistent": {"type": "bool", "default": True},
    "selected_by": {"type": "str", "choices": ["flow", "family"], "default": "flow"},
    "defer_failures": {"type": "bool", "default": False},
    # The rollout's settings as plugin_utils/rollout.py decided them, the host's batch and whether it is a canary.
    "rollout": {"type": "dict"},
    "batch": {"type": "int", "default": 0},
    "canary": {"type": "bool", "default": False},
    # The rollout's steps this task runs (plugin_utils/rollout_steps.py): all four in one task, or one at a time
    # with the state the host's previous step returned (rollout_state) and what the play's own tasks found.
    "steps": {"type": "list", "elements": "str", "choices": list(rollout_steps.STEPS),
              "default": list(rollout_steps.STEPS)},
    "state": {"type": "dict"},
    "outcome": {"type": "dict", "default": {}},
}
# The entry point whose options each flow is checked against (precheck: the playbook says which).
ENTRY_POINTS = {"runtime": "runtime", "persistent": "persistent", "rollback": "rollback", "verify": "verify",
                "rollout": "verify"}
MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
COLLECTION_DIR = os.path.dirname(os.path.dirname(MODULE_UTILS))
# The role's argument specs and defaults, parsed once in the process that forks the task workers.
role_variables.preload()


class ActionModule(ActionBase):
    """Build the desired state from the role's variables and run one flow."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        task_vars = task_vars or {}
        self._cache = {}
        result = self._run_flow(task_vars)
        if self._cache.get("variables") is not None:
            result["role_variables"] = self._cache["variables"]
        if self._cache.get("resolved") is not None and not result.get("failed") and not result.get("unreachable"):
            result.setdefault("ansible_facts", {})[flow_task.RESOLVED_FACT] = self._cache["resolved"]
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
            return rollout_steps.run(self, task_vars, args, only, skip, self._cache)
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
        if flow == "verify":
            return flow_task.read_node(self, task_vars, values, desired, args["gate"])
        if flow == "runtime":
            result = dict(self._apply(desired_state.runtime_requests(desired, values, selection[0]), values,
                                      task_vars), desired=desired)
            pending = flow_task.pending_kernel_args(result)
            result.setdefault("ansible_facts", {})["gpunode_tuning_pending_kernel_args"] = pending
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
        lines, record = flow_task.failures_record(result, task_vars)
        result.setdefault("ansible_facts", {})[flow_task.FAILURES_FACT] = record
        persistent_inherited = (set(inherited) - {"runtime"}) | {"persistent"}
        persistent_runs = flow == "runtime" and defer and bool(
            tags.selected_concerns("persistent", only, skip, persistent_inherited))
        if lines and "always" in skip and not persistent_runs:
            result.update(failed=True, msg="%s tuning failed for these knob families (every other family ran): %s"
                          % (flow.capitalize(), " | ".join(record)))
        return result

    def _values(self, task_vars, entry_point):
        """``(validated variables, None)`` or ``(None, the message naming every bad variable)``."""
        return flow_task.values(self._templar, task_vars, entry_point, self._cache)

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
