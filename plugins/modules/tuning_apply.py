# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: tuning_apply
short_description: Run several knob families' runtime tuning or rollback in one module run
version_added: 1.0.0
description:
  - Runs each family in O(families), in the order given, with the options its own module takes
    (M(gpunode.tuning.setpci_mrrs), M(gpunode.tuning.pcie_acs), M(gpunode.tuning.cpu_cstate),
    M(gpunode.tuning.cpu_freq), M(gpunode.tuning.kernel_tunables), M(gpunode.tuning.kmod_optional),
    M(gpunode.tuning.gpu_settings), M(gpunode.tuning.kernel_cmdline)). It is the same family code, validated
    and completed with the same argument spec, in one Python process on the node.
  - Each family is isolated. One that fails (bad options, a device that refuses a write, kernel lockdown) or
    crashes is recorded with its message and the next family still runs; the module fails at the end naming
    every failed family, and returns every family's result either way.
  - The role's runtime and rollback flows call it through the C(tuning_flow) action, which builds the
    families' options from the role's variables; it can be called directly too.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  families:
    description:
      - The families to run, in order, each with its module's options. O(root) and O(journal) are added to
        the options of each family whose module takes them, unless the options set them.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - Registry name of the family (V(pcie_mrrs), V(pcie_acs), V(cpuidle), V(cpufreq), V(tunables),
            V(kmod), V(gpu_settings), V(cmdline)).
        type: str
        required: true
      options:
        description:
          - The options of the family's module, for example C(restore=true) to restore the journal.
        type: dict
        default: {}
  journal:
    description:
      - Journal of original values on the node (below O(root)), for the families that journal.
    type: str
    default: /var/lib/gpunode-tuning/journal.json
  fail_on_error:
    description:
      - Fail the task when a family failed (after every other one ran). V(false) returns ok with the failures in
        RV(failed_families), for a caller that reports them itself (the role fails the host once, at the end of a flow).
    type: bool
    default: true
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.command_timeouts
  - gpunode.tuning.node.writer
  - gpunode.tuning.node.attributes
"""

EXAMPLES = r"""
- name: Tune MRRS and C-states in one module run
  gpunode.tuning.tuning_apply:
    families:
      - name: pcie_mrrs
        options: {mrrs: 4096}
      - name: cpuidle
        options: {max_latency_us: 100}

- name: Restore what the journal holds of both
  gpunode.tuning.tuning_apply:
    families:
      - name: pcie_mrrs
        options: {restore: true, allow_empty: true}
      - name: cpuidle
        options: {restore: true}
"""

RETURN = r"""
families:
  description: Each family's result, keyed by its registry name, as its own module returns it.
  returned: always
  type: dict
  sample: {"pcie_mrrs": {"changed": true, "devices": []}}
failed_families:
  description: The message of each family that failed, keyed by its name.
  returned: always
  type: dict
  sample: {"pcie_mrrs": "kernel lockdown (integrity) refuses PCI config writes"}
summary:
  description: One line per family of what its run did (or restored), for reports.
  returned: always
  type: dict
  sample: {"pcie_mrrs": "8 changed, 0 already as desired"}
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, lock  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import apply, module_calls

ARGUMENT_SPEC = apply.ARGUMENT_SPEC


def build_module():
    return AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)


def main():
    module = build_module()
    # Only the requested families are imported: a run pays for what it runs (registry.by_name).
    try:
        out = apply.run(module, module_calls.call_maker(module))
    except (ValueError, NodeError, lock.LockError) as exc:
        module.fail_json(msg=str(exc))
    if out["failed_families"] and module.params["fail_on_error"]:
        module.fail_json(msg="these knob families failed (every other family ran): %s"
                         % " | ".join("%s: %s" % kv for kv in out["failed_families"].items()), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
