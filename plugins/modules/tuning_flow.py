# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: the action plugin plugins/action/tuning_flow.py does the work.

from __future__ import annotations

DOCUMENTATION = r"""
module: tuning_flow
short_description: Run one of the tuning role's flows from the role's variables
version_added: 1.0.0
description:
  - The tuning role's flows as one task each. On the controller, the role's variables are read with their types
    on every supported ansible-core, checked against the role's argument specs, and turned into the one desired
    state from the registry of knob families. A bad variable fails the host naming it, its value and what is
    allowed, before anything runs on the node.
  - 'It reads these variables of the task (not options: the role sets them): every C(gpunode_tuning_*) option of
    the role entry point O(entry_point) (docs/variables.md, generated from the role''s argument specs);
    C(ansible_run_tags) and
    C(ansible_skip_tags), which select the families; C(inventory_hostname), C(ansible_play_hosts_all) (one
    warning per play, not per host) and C(__gpunode_tuning_failures), the failures of the run''s earlier flows
    on the host.'
  - V(precheck) runs nothing on the node; its result holds the desired state.
  - V(runtime) runs every knob family the run's tags select in one M(gpunode.tuning.tuning_apply) run on the
    node. A family that fails does not stop the others, and does not fail this task; RV(failed_families) names
    it, the host's C(__gpunode_tuning_failures) fact records it, and the role fails the host once, at the end of
    the flow.
  - V(persistent) writes the selected persistent concerns (sysctl drop-in, module drop-ins, kernel arguments,
    boot unit, udev rule, the GPU locality export, the guard) in one M(gpunode.tuning.tuning_persist) run.
  - V(rollback) removes them (one M(gpunode.tuning.tuning_persist) run) and restores what the journal holds
    for every selected family (one M(gpunode.tuning.tuning_apply) run).
  - V(verify) reads the node and judges it against the whole desired state in one M(gpunode.tuning.tuning_info)
    run.
  - 'V(rollout) runs the rollout''s steps for one host (C(plugins/plugin_utils/rollout_steps.py), the one
    implementation of both ways C(playbooks/rollout.yml) rolls a host out): the health gate, the runtime flow on a
    healthy host, verification (not in check mode; gate V(runtime) for the runtime flow, V(full) for the
    persistent flow) with the host''s reports, and its record (RV(rollout_result)). O(steps) all four (the default
    rollout) is one task and one M(gpunode.tuning.tuning_rollout) run on the node; the persistent flow and the
    measure gate ask for one step at a time with the O(state) the previous step returned (RV(rollout_state)).
    A host that does not answer gives an unreachable result and is tried no more. A failure of the host is its
    record''s and never fails the task; the batch gate decides.'
  - 'Tags: a family counts as tagged with its name, its settings'' tags and the flow''s tag,
    as separate tasks per family would be (docs/flows.md, "Tags"). The role runs each flow as two tasks: one
    with O(selected_by=family), tagged with every family and concern tag of the flow, and one tagged with the
    flow''s own tag; the first returns at once, before any variable is read, when the second runs too.'
  - Meant for the role (C(roles/tuning/tasks)).
author:
  - gpunode.tuning contributors (@gpunode)
options:
  flow:
    description: The flow to run.
    type: str
    required: true
    choices: [precheck, runtime, persistent, rollback, verify, rollout]
  entry_point:
    description:
      - The role entry point whose options the variables are checked against; default the flow's own (V(main)
        for V(precheck)).
    type: str
  gate:
    description: With V(verify), the verdict's gate (V(full), or V(runtime) for the runtime rollout).
    type: str
    default: full
  selected_by:
    description:
      - V(flow) (the task carries the flow's own tag) runs every family the run's tags leave selected.
      - V(family) (the task carries the flow's family and concern tags) does the same when the run's tags do not
        select the flow's own task, and nothing otherwise (that task runs the flow).
    type: str
    choices: [flow, family]
    default: flow
  defer_failures:
    description:
      - With V(runtime), leave the host's failure to the persistent flow that follows (the role's main entry
        point), when the run's tags select it.
    type: bool
    default: false
  include_persistent:
    description:
      - With V(rollback), also remove the persistent artifacts. V(false) only restores the journal, as the
        rollout's measure gate does for the runtime flow.
    type: bool
    default: true
  rollout:
    description:
      - With V(rollout), the rollout's settings as the filter P(gpunode.tuning.rollout_settings#filter) decided them
        (C(health_gate) is read).
      - With V(precheck), the rollout's settings as given (C(flow), C(canary), C(batch), ...); a bad one fails the
        host naming it and what is allowed, before any variable is read.
    type: dict
  batch:
    description: With V(rollout), the host's batch number (1 for the first).
    type: int
    default: 0
  canary:
    description: With V(rollout), whether the host's batch is the canary batch.
    type: bool
    default: false
  steps:
    description:
      - With V(rollout), the steps this task runs, in this order - V(health) (the host's first connection; with the
        health gate off it only tells that the host answers), V(tune) (the runtime flow), V(verify) (and the
        host's reports), V(record).
    type: list
    elements: str
    choices: [health, tune, verify, record]
    default: [health, tune, verify, record]
  state:
    description:
      - With V(rollout) and O(steps) without V(health), the host's state as its previous step returned it
        (RV(rollout_state)).
    type: dict
  outcome:
    description:
      - With V(rollout), what the play's own tasks between the steps found, for the host's report and record -
        C(tune_error) (the persistent flow's tuning), C(benchmark), C(benchmark_error), C(measure_failed) (the
        measure gate), C(reboot), C(reboot_error), C(reboot_required), C(not_rebooted_for) (the reboot sequence;
        its C(verification) is used instead of verifying the host again).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description: Check mode reaches the module run on the node, which writes nothing then.
  diff_mode:
    support: full
    description: Each family's before and after.
  platform:
    platforms: linux
    support: full
    description: Linux nodes.
"""

EXAMPLES = r"""
- name: Check the role's variables before anything changes
  gpunode.tuning.tuning_flow:
    flow: precheck
    entry_point: verify
  register: __gpunode_tuning_state
"""

RETURN = r"""
desired:
  description: The desired state built from the role's variables, one key per knob family.
  returned: always
  type: dict
families:
  description: Each family's result, as its module returns it (V(runtime), V(rollback)).
  returned: when a family ran
  type: dict
failed_families:
  description: The message of each family that failed, keyed by its name.
  returned: when a family ran
  type: dict
ansible_facts:
  description:
    - "C(__gpunode_tuning_failures), the host's failures in this run (one C(NAME: message) line each, the earlier
      flows' included); V(runtime) also C(gpunode_tuning_pending_kernel_args), V(persistent) and V(rollback)
      C(gpunode_tuning_reboot_required); every flow that read the role's variables also
      C(__gpunode_tuning_resolved), the variables as templated with a digest of their inputs, which the
      host's next flow task reuses while that digest holds."
  returned: when a flow ran
  type: dict
health_findings:
  description:
    - "V(rollout) only. The health gate's findings, one line per failing or reset-pending row of a health family,
      C(<row id>: <reason>); empty when the GPUs are healthy (or the gate did not run)."
  returned: with the rollout flow, for a host that answered
  type: list
  elements: str
role_variables:
  description:
    - V(templated) when this task templated the role's variables, V(reused) when it took them from the
      host's earlier flow task (nothing they are templated from changed since).
  returned: when the task read the role's variables
  type: str
  sample: reused
modules:
  description: The modules the task ran on the node, in order (their count is C(module_runs)).
  returned: when the flow ran a module
  type: list
  elements: str
  sample: [tuning_info, tuning_apply, tuning_info]
rollout_result:
  description:
    - V(rollout) only. The host's record for the rollout summary (status V(done), V(failed), V(unhealthy) or
      V(unreachable), the reason, the batch, the verification's verdict, ...); also set as the fact
      C(gpunode_tuning_rollout_result), except for an unreachable host, whose result sets no fact.
  returned: with the rollout flow, when the record step ran or the host did not answer
  type: dict
rollout_state:
  description:
    - V(rollout) only. The host's state after this task's steps, for its next step (O(state)).
  returned: with the rollout flow
  type: dict
summary:
  description: One line per family of what the flow did.
  returned: when a family ran
  type: dict
"""
