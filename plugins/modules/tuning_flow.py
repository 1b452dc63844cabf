# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: the action plugin plugins/action/tuning_flow.py does the work.

from __future__ import annotations

DOCUMENTATION = r"""
module: tuning_flow
short_description: Run one of the tuning role's flows from the role's variables
version_added: 0.3.0
description:
  - The tuning role's flows as one task each. On the controller, the role's variables (C(gpunode_tuning_*),
    with the selected preset's values) are read with their types on every supported ansible-core, checked
    against the role's argument specs, and turned into the one desired state from the registry of knob
    families. A bad variable fails the host naming it, its value and what is allowed, before anything runs
    on the node.
  - V(precheck) runs nothing on the node; its result holds the desired state.
  - V(runtime) runs every knob family the run's tags select (C(--tags mrrs), C(--skip-tags cstate), the
    flow's own tag V(runtime), or none) in one M(gpunode.tuning.tuning_apply) run on the node. A family
    that fails does not stop the others, and does not fail this task; RV(failed_families) names it and the
    role fails the host once, at the end of the flow.
  - V(persistent) writes the selected persistent concerns (sysctl drop-in, module drop-ins, kernel arguments,
    boot unit, udev rule, the GPU locality export) in one M(gpunode.tuning.tuning_persist) run.
  - V(rollback) removes them (one M(gpunode.tuning.tuning_persist) run) and restores what the journal holds
    for every selected family (one M(gpunode.tuning.tuning_apply) run).
  - V(verify) reads the node and judges it against the whole desired state in one M(gpunode.tuning.tuning_info)
    run; V(health) judges the GPUs' health alone (the rollout's health gate).
  - Meant for the role (C(roles/tuning/tasks)). It reads the role's variables from the task's variables.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  flow:
    description: The flow to run.
    type: str
    required: true
    choices: [precheck, runtime, persistent, rollback, verify, health]
  entry_point:
    description:
      - The role entry point whose options the variables are checked against; default the flow's own (V(main)
        for V(precheck)).
    type: str
  gate:
    description: With V(verify), the verdict's gate (V(full), or V(runtime) for the runtime rollout).
    type: str
    default: full
  include_persistent:
    description:
      - With V(rollback), also remove the persistent artifacts. V(false) only restores the journal, as the
        rollout's measure gate does for the runtime flow.
    type: bool
    default: true
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
summary:
  description: One line per family of what the flow did.
  returned: when a family ran
  type: dict
"""
