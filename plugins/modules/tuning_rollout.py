# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: tuning_rollout
short_description: One host's runtime rollout in one module run - health gate, tuning, verification
version_added: 1.0.0
description:
  - The rollout's three steps on one node in one Python process, each the same code and options as its own module
    run would be - O(health) as M(gpunode.tuning.tuning_info) with the health desired state, O(tune) as
    M(gpunode.tuning.tuning_apply), O(verify) as M(gpunode.tuning.tuning_info) with the whole desired state.
  - A node whose health step fails or finds anything is neither tuned nor verified. A step that fails (bad
    options, a node error, a crash) is that step's result, with its message; the steps after it still run
    (a node whose tuning failed is verified too, its reports show what is not applied). The module itself
    fails only for its own options.
  - In check mode the tuning step plans and writes nothing, and O(verify) is not run (nothing was applied).
  - The rollout (C(playbooks/rollout.yml)) calls it through the C(tuning_flow) action (flow V(rollout)), which
    builds the options from the role's variables and turns the result into the host's record.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  health:
    description:
      - The options of M(gpunode.tuning.tuning_info) for the health gate (its
        O(gpunode.tuning.tuning_info#module:desired) holds the health families only). Omitted, the node is not
        checked (the run still tells that it answers).
      - O(root) and O(command_timeouts) are this module's unless set here.
    type: dict
  tune:
    description:
      - The options of M(gpunode.tuning.tuning_apply) (O(gpunode.tuning.tuning_apply#module:families) and the rest).
        Omitted, nothing is tuned.
    type: dict
  verify:
    description:
      - The options of M(gpunode.tuning.tuning_info) for verification (O(gpunode.tuning.tuning_info#module:desired)
        and O(gpunode.tuning.tuning_info#module:verify)). Omitted, or in check mode, the node is not verified.
    type: dict
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.command_timeouts
attributes:
  check_mode:
    support: full
    description: The tuning step writes nothing and verification does not run.
  diff_mode:
    support: full
    description: The tuning step's before and after per family (RV(diff)).
  platform:
    platforms: linux
    support: full
    description: Linux only; reads and writes sysfs and procfs.
"""

EXAMPLES = r"""
- name: Check, tune and verify the node in one module run (as the rollout does)
  gpunode.tuning.tuning_rollout:
    health:
      desired: {gpu_health: {}}
    tune:
      families:
        - name: pcie_mrrs
          options: {mrrs: 4096}
      fail_on_error: false
    verify:
      desired: {pcie_mrrs: {mrrs: 4096}}
      verify: {gate: runtime}
"""

RETURN = r"""
health:
  description:
    - 'The health step''s findings (C(health_findings) - one C(<row id>: <reason>) line per failing row, empty when
      healthy), or C(failed) and C(msg). The node''s facts and the health rows are not returned.'
  returned: with O(health)
  type: dict
tune:
  description: The tuning step's result as M(gpunode.tuning.tuning_apply) returns it, or C(failed) and C(msg).
  returned: when the node was tuned
  type: dict
verify:
  description:
    - The verification step's result (RV(gpunode.tuning.tuning_info#module:verification); the node's facts are
      not returned), or C(failed) and C(msg).
  returned: when the node was verified
  type: dict
steps:
  description: The steps that ran, in order.
  returned: always
  type: list
  elements: str
  sample: [health, tune, verify]
diff:
  description: The tuning step's diff.
  returned: in diff mode, when the node was tuned
  type: list
  elements: dict
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, command, kernel_log  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import EvaluationError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import NODE_ARGUMENT_SPEC
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import apply, module_calls, verification
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify as verify_node

ARGUMENT_SPEC = dict(
    health=dict(type="dict"),
    tune=dict(type="dict"),
    verify=dict(type="dict"),
    **NODE_ARGUMENT_SPEC,
    **command.ARGUMENT_SPEC,
)


class _Step:
    """The module as one step sees it: the step's own validated params, everything else the module's."""

    def __init__(self, module, params):
        self._module = module
        self.params = params

    def __getattr__(self, name):
        return getattr(self._module, name)


def _info(step):
    if kernel_log.needs_netaddr(step.params["kmsg_ignore"]):
        raise ValueError(missing_required_lib("netaddr", reason="for kmsg_ignore rules with a cidr"))
    return verify_node.run(step)


def _apply(step):
    return apply.run(step, module_calls.call_maker(step))


def run_step(module, spec, options, work):
    """One step's result: ``work`` on its options (checked by ``spec``); a failure or crash is the step's."""
    params = dict(options)
    for key in ("root", "command_timeouts"):
        params.setdefault(key, module.params[key])
    checked = ArgumentSpecValidator(spec).validate(params)
    if checked.error_messages:
        return {"failed": True, "msg": "; ".join(checked.error_messages)}
    try:
        return work(_Step(module, checked.validated_parameters))
    except Exception as exc:  # isolated as a module run of its own would be: the next step still runs
        return {"failed": True, "msg": str(exc) or exc.__class__.__name__, "exception": traceback.format_exc()}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    out = {"changed": False, "steps": []}
    if p["health"] is not None:
        health = out["health"] = run_step(module, verify_node.ARGUMENT_SPEC, p["health"], _info)
        out["steps"].append("health")
        if not health.get("failed"):
            try:
                health["health_findings"] = verification.health_findings(health.get("verification") or {})
            except EvaluationError as exc:
                health.update(failed=True, msg="the health check's result cannot be judged: %s" % exc)
        # What the rollout reads of the health step is its findings: the node's facts and the rows (about 25 KB
        # on a 64-CPU node) would only be held per host in the controller's memory.
        health.pop("tuning_facts", None)
        health.pop("verification", None)
        if health.get("failed") or health.get("health_findings"):
            module.exit_json(**out)  # a sick node, or one whose health is unknown, is not tuned
    if p["tune"] is not None:
        tune = out["tune"] = run_step(module, apply.ARGUMENT_SPEC, p["tune"], _apply)
        out["steps"].append("tune")
        out["changed"] = bool(tune.get("changed"))
        if "diff" in tune:
            out["diff"] = tune.pop("diff")
    if p["verify"] is not None and not module.check_mode:
        out["verify"] = run_step(module, verify_node.ARGUMENT_SPEC, p["verify"], _info)
        out["verify"].pop("tuning_facts", None)  # the verification holds what the reports and the record need
        out["steps"].append("verify")
    module.exit_json(**out)


if __name__ == "__main__":
    main()
