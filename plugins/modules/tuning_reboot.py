# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: the action plugin plugins/action/tuning_reboot.py does the work.

from __future__ import annotations

DOCUMENTATION = r"""
module: tuning_reboot
short_description: Drain, reboot within a budget, and return GPU nodes to service
version_added: 1.0.0
description:
  - One phase of the fleet reboot sequence (docs/rebooting.md) per task, run on the controller.
  - V(survey), run once, names the hosts of the play out of service before the run and not by this collection
    (skipped, never drained, rebooted or resumed) and those drained by it in an earlier run (adopted).
  - V(reboot) waits for a slot in C(gpunode_tuning_reboot_max_unavailable), counting every host of the play (with the
    V(fleet) scope, every node of the fleet) out of service for any reason (polled from the backend, plus the hosts
    this run drains and the hosts Ansible cannot reach), drains the host (C(gpunode_tuning_drain)), waits until it is
    drained or C(gpunode_tuning_drain_timeout), reboots it (the simulated reboot on a simulated root), and waits for a
    new boot id (C(gpunode_tuning_reboot_timeout)), the boot unit and the GPUs. Then it verifies the host with the
    full gate and returns it to service, unless O(hold). A host that fails there stays drained with the reason, and no
    later host of the run reboots.
  - V(return), for a host that V(reboot) held after its gate (O(hold), the rollout's measure gate), returns it to
    service when O(kept); otherwise it stays drained with the reason (it needs a reboot to restore the kernel
    command line), and no later host of the run reboots.
  - 'It reads these variables of the task: C(gpunode_tuning_reboot_ok), C(gpunode_tuning_drain),
    C(gpunode_tuning_reboot_max_unavailable), C(gpunode_tuning_reboot_timeout), C(gpunode_tuning_reboot_wait_timeout),
    C(gpunode_tuning_drain_timeout), C(gpunode_tuning_reboot_poll_interval),
    C(gpunode_tuning_reboot_claim_lease), C(gpunode_tuning_reboot_budget_scope),
    C(gpunode_tuning_drain_slurm_delegate) (where sinfo and scontrol run), C(gpunode_tuning_drain_slurm_node) (of
    every host of the play), C(gpunode_tuning_drain_slurm_fleet_partitions),
    C(gpunode_tuning_drain_kubernetes_fleet_selector), the four command variables, C(gpunode_tuning_root),
    C(gpunode_tuning_report_dir) (the records live in its C(reboots/) directory) and C(ansible_play_hosts_all).'
  - A drain is a claim (docs/rebooting.md) naming the run, its controller and start, and a lease the live run
    renews; a node another live run claims counts against the budget and is waited for, never touched.
  - Meant for the role (C(roles/tuning/tasks/persistent_reboot.yml)) and the rollout.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  phase:
    description: The phase to run.
    type: str
    required: true
    choices: [survey, reboot, return]
  pending:
    description: With V(reboot), what the reboot applies (the pending kernel arguments), named in the drain reason.
    type: list
    elements: str
    default: []
  reboot:
    description: With V(reboot), whether the host needs its reboot; V(false) for a host adopted from an earlier run
      that needs only the gate and the return.
    type: bool
    default: true
  survey:
    description: With V(reboot), the V(survey) phase's result (the hosts skipped and adopted).
    type: dict
  hold:
    description: With V(reboot), keep a host that passed its gate out of service (its record says V(gated)) until
      a V(return) task; the rollout sets it when its measure gate runs. Ignored in check mode.
    type: bool
    default: false
  hold_for:
    description: With O(hold), how long (seconds) the measure gate may hold the host after its gate; the claim's
      lease is at least that plus 600 s, since the run does not renew it while the benchmark runs.
    type: float
    default: 0
  kept:
    description: With V(return), whether the measure gate kept the host's tuning (back to service) or not (it
      stays drained).
    type: bool
    default: false
  why:
    description: With V(return), why the measure gate did not keep the tuning (kept in the drain reason).
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Check mode names each host it would drain and reboot, with the reason, and changes nothing.
  diff_mode:
    description: The sequence reports what it did or would do in its message; it has no diff.
    support: none
  platform:
    platforms: linux
    support: full
    description: Linux nodes; Slurm's commands run on the host, the command backend's on the controller.
"""

EXAMPLES = r"""
- name: Drain and reboot the host within the budget
  gpunode.tuning.tuning_reboot:
    phase: reboot
    pending: [amd_pstate=active]
  register: __gpunode_tuning_reboot
"""

RETURN = r"""
out_of_service:
  description: With V(survey), each host out of service before the run and not by this collection, and why.
  returned: survey
  type: dict
ours:
  description: With V(survey), the hosts this collection drained in an earlier, interrupted run whose claim ran
    out (adopted).
  returned: survey
  type: list
claimed:
  description: With V(survey), each host whose node another live run claims (its drain, within its lease), and
    why; tuned, then waited for, never drained, rebooted, resumed or adopted while the claim holds.
  returned: survey
  type: dict
rebooted:
  description: With V(reboot), whether the host rebooted and came back.
  returned: reboot
  type: bool
reason:
  description: The drain reason (it starts with C(gpunode.tuning:)).
  returned: reboot
  type: str
waited:
  description: Seconds the host waited for a slot in the budget.
  returned: reboot
  type: float
stays_drained:
  description: The host failed after it was drained and stays out of service with the reason.
  returned: on such a failure
  type: bool
released:
  description: Our claim on the node ended while the sequence held it (someone resumed it, or its reason is no
    longer this run's); the node is left as it is, not rebooted, never drained again.
  returned: on such an end
  type: bool
already_booted:
  description: The node's running command line already holds every pending argument (another run rebooted it
    while this one waited), so it is not rebooted again; its gate ran.
  returned: reboot, in that case
  type: bool
returned:
  description: The host is back in service.
  returned: reboot or return, when it passed
  type: bool
held:
  description: The host passed its gate and is held out of service for the measure gate (O(hold)).
  returned: reboot and return, with O(hold)
  type: bool
gate:
  description: The gate after the reboot, C(ok), C(failures) and C(status).
  returned: reboot, when the gate ran
  type: dict
verification:
  description: The gate's whole verification result (the shape of C(tuning_flow)'s V(verify) flow); the rollout
    uses it for the host instead of verifying it again.
  returned: reboot, when the gate ran
  type: dict
"""
