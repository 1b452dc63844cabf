# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a task of the role's flows shares, whichever action runs it: the role's variables as the task sees them,
and the facts a flow leaves for the tasks after it.

The action tuning_flow runs every flow with them; the rollout's steps (plugin_utils/rollout_steps.py) and the
reboot sequence's gate after a boot (action tuning_reboot) call the same functions, so a host's variables are
read, checked and reused one way.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.utils.display import Display

from ansible_collections.gpunode.tuning.plugins.plugin_utils import (
    ansible_compat,
    delegate,
    desired_state,
    role_variables,
)

display = Display()
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


def warn_once(task_vars, lines):
    """Each line once: by this process, and only for the play's first host."""
    hosts = task_vars.get("ansible_play_hosts_all") or []
    if hosts and task_vars.get("inventory_hostname") != hosts[0]:
        return
    for line in lines:
        if line not in _WARNED:
            _WARNED.add(line)
            display.warning(line)


def values(templar, task_vars, entry_point, cache=None):
    """``(validated variables, None)`` or ``(None, the message naming every bad variable)``.

    ``cache`` (a dict), when given, receives ``variables`` ("reused" or "templated") and ``resolved`` (the fact
    ``RESOLVED_FACT`` to leave for the host's next flow task, None when there is nothing new to leave)."""
    cache = {} if cache is None else cache
    try:
        raw, errors = _resolve(templar, task_vars, cache)
        validated, more, warnings = role_variables.check(raw, [entry_point])
    except role_variables.RoleVariablesError as exc:
        raise AnsibleActionFail("gpunode.tuning.tuning_flow: %s" % exc) from exc
    warn_once(task_vars, warnings)
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


def _resolve(templar, task_vars, cache):
    """``role_variables.resolve``, or what this host's earlier flow task resolved from the same inputs."""
    digest = role_variables.inputs_digest(task_vars)
    cached = ansible_compat.exported_fact(task_vars, RESOLVED_FACT)
    if (digest is not None and isinstance(cached, dict) and cached.get("digest") == digest
            and isinstance(cached.get("values"), dict)):
        cache["variables"] = "reused"
        return role_variables.plain(cached["values"]), []
    raw, errors = role_variables.resolve(templar, task_vars)
    cache["variables"] = "templated"
    if digest is not None and not errors:
        cache["resolved"] = {"digest": digest, "values": raw}
    return raw, errors


def failures_record(result, task_vars):
    """``(this flow's "NAME: message" lines, the host's record with them)`` (``FAILURES_FACT``)."""
    lines = ["%s: %s" % kv for kv in (result.get("failed_families") or {}).items()]
    return lines, list(ansible_compat.exported_fact(task_vars, FAILURES_FACT) or []) + lines


def pending_kernel_args(result):
    """The kernel arguments the runtime families said need a reboot (``gpunode_tuning_pending_kernel_args``)."""
    return [arg for r in (result.get("families") or {}).values() if isinstance(r, dict) and r.get("reboot_required")
            for arg in r.get("kernel_args") or []]


def read_node(action, task_vars, values, desired, gate="full"):
    """One tuning_info run by ``action``: the node read and judged against ``desired`` with ``gate``."""
    host = task_vars.get("inventory_hostname")
    verified_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    module_args = desired_state.verify_options(values, desired, host, verified_at, gate)
    result = action._execute_module(module_name="gpunode.tuning.tuning_info", module_args=module_args,
                                    task_vars=task_vars)
    result.update(module_runs=1, modules=["tuning_info"], verified_at=verified_at, desired=desired)
    return result


def gate(action, task_vars, name="full"):
    """``(ok, failures, verification)``: the host verified with the gate ``name`` against the role's desired
    state, from its variables as any flow task reads them (the reboot sequence's gate after a boot)."""
    values_, problem = values(action._templar, task_vars, "verify")
    if problem:
        return False, [problem], {}
    result = read_node(action, task_vars, values_, desired_state.desired_state(values_), name)
    judged = result.get("verification") or {}
    checked = judged.get("gate") or {}
    if result.get("failed") or not checked:
        return False, [result.get("msg") or "verification did not run"], judged
    return bool(checked.get("ok")), list(checked.get("failures") or []), judged
