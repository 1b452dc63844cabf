"""Count module runs per host: on the node, and on the controller on the host's behalf.

A benchmark aid (benchmarks/bench_ssh_fleet.py), not part of the collection. Enable it with
ANSIBLE_CALLBACK_PLUGINS=benchmarks/callback_plugins ANSIBLE_CALLBACKS_ENABLED=module_runs and
name the output with BENCH_MODULE_RUNS_OUT; at the end of the run it writes there
{"hosts": {HOST: {"node": N, "controller": N, "actions": {ACTION: N}, "tasks": N}}, "controller_plays": N}.
"tasks" counts every task result of the host (ok, failed, skipped, unreachable): each is a worker process
forked on the controller, so it is what the rollout's cost per host grows with besides the module runs.

A task result counts as one module run per loop item that was not skipped, except for actions
that never start a module (set_fact, debug, assert, ...). A task delegated to localhost counts
on the controller for the host it ran for; results of the host `localhost` itself (the rollout
summary play) count as ``controller_plays``. Action plugins that run several modules for one
task (template: stat, then copy) count once, as the task, except the collection's tuning_flow, whose
result says how many it ran (``module_runs``: 0 for the precheck, 2 for a rollback) and which
(``modules``: counted under their own names, e.g. tuning_info and tuning_apply).

The task result is read through the collection's plugin_utils/ansible_compat.py (its shape differs
between ansible-core versions), so the collection must be on the collections path, as it is for
every run from this repository.
"""

from __future__ import annotations

import collections
import json
import os

from ansible.plugins.callback import CallbackBase

from ansible_collections.gpunode.tuning.plugins.plugin_utils import ansible_compat

DOCUMENTATION = """
name: module_runs
type: aggregate
short_description: count module runs per host (benchmark aid)
description: Writes per-host module run counts to the file named by BENCH_MODULE_RUNS_OUT.
"""

# Actions that run on the controller only, without starting a module.
NO_MODULE = {"set_fact", "debug", "assert", "fail", "meta", "include_role", "include_tasks", "import_role",
             "import_tasks", "validate_argument_spec", "add_host", "group_by", "include_vars", "pause", "set_stats",
             "end_play", "end_host", "noop",
             # The collection's action that writes verification's reports on the controller itself.
             "verify_reports", "gpunode.tuning.verify_reports"}
CONTROLLER = {"localhost", "127.0.0.1"}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_runs"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hosts = collections.defaultdict(
            lambda: {"node": 0, "controller": 0, "actions": collections.Counter(), "tasks": 0})
        self.controller_plays = 0

    def _task(self, result):
        host = ansible_compat.task_result_parts(result)[0].get_name()
        if host not in CONTROLLER:
            self.hosts[host]["tasks"] += 1

    def _count(self, result):
        self._task(result)
        host, task, res = ansible_compat.task_result_parts(result)
        action = task.action.rsplit(".", 1)[-1]
        if action in NO_MODULE:
            return
        runs = sum(1 for item in res["results"] if not item.get("skipped")) if "results" in res else 1
        # The collection's tuning_flow action says how many modules it ran (0 for its precheck).
        runs = res.get("module_runs", runs)
        host = host.get_name()
        if not runs:
            return
        if host in CONTROLLER:
            self.controller_plays += runs
            return
        delegated = (res.get("_ansible_delegated_vars") or {}).get("ansible_delegated_host") or task.delegate_to
        where = "controller" if delegated in CONTROLLER else "node"
        self.hosts[host][where] += runs
        modules = res.get("modules")
        if isinstance(modules, list) and len(modules) == runs:
            for name in modules:
                self.hosts[host]["actions"][str(name)] += 1
        else:
            self.hosts[host]["actions"][action] += runs

    def v2_runner_on_ok(self, result):
        self._count(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count(result)

    def v2_runner_on_skipped(self, result):
        self._task(result)

    def v2_runner_on_unreachable(self, result):
        self._task(result)

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("BENCH_MODULE_RUNS_OUT")
        if not path:
            return
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"hosts": self.hosts, "controller_plays": self.controller_plays}, handle, indent=1)
