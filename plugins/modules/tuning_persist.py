# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: tuning_persist
short_description: Make a desired state survive reboots, or remove everything that did, in one module run
version_added: 1.0.0
description:
  - Writes (O(state=present)) or removes (O(state=absent)) the persistent artifacts of the selected O(concerns),
    each isolated from the others (module_utils/flows/persist.py), in one Python process on the node.
  # tools/generate.py writes what each concern does (Concern.description): BEGIN GENERATED tuning_persist.concerns
  - >-
    The concerns, in the order they run: V(sysctl) the sysctl drop-in (keys the node lacks are left out and fail the
    concern); V(kmod) modules-load.d and modprobe.d files for the optional modules that load; V(kernel_cmdline) the
    kernel arguments (configured, and those the other families need: a cpufreq driver switch, ACS by kernel argument,
    the IOMMU mode's) through GRUB or grubby; V(gpu_locality) the topology file for inference engines; V(boot_unit)
    the boot runner, its desired state and a systemd oneshot unit that re-applies the runtime-only settings at boot;
    V(udev) a udev rule that re-applies the hot-plug families (Family.hotplug) on a hot-added GPU; V(guard) the
    guard's config, oneshot service and timer that re-verify the node and write a status file and Prometheus metrics
    (docs/guard.md).
  # END GENERATED tuning_persist.concerns
  - V(absent) removes the concerns in the reverse order (the guard stopped first, the udev rule before the runner).
  - Files are written whole (temporary file and rename) and only when they differ; check mode writes nothing.
    System commands (sysctl, systemctl, udevadm, update-grub, grubby) run only when O(root) is V(/).
  - The role's persistent flow and rollback call it through the C(tuning_flow) action.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  state:
    description: V(present) writes, V(absent) removes everything of the concerns.
    type: str
    choices: [present, absent]
    default: present
  concerns:
    description: The concerns to persist or remove (always in the order of the choices; V(absent) reversed).
    type: list
    elements: str
    # tools/generate.py writes the registry's concerns: BEGIN GENERATED tuning_persist.choices
    choices: [sysctl, kmod, kernel_cmdline, gpu_locality, boot_unit, udev, guard]
    # END GENERATED tuning_persist.choices
    required: true
  desired:
    description: The desired state (the role's, one key per knob family).
    type: dict
    default: {}
  settings:
    description:
      - The role's persistence variables without their C(gpunode_tuning_) prefix (C(sysctl_file), C(boot_script),
        C(boot_python), C(boot_unit_before), C(udev_rule), C(kernel_cmdline_dropin), ...) and the GPUs' PCI selector.
    type: dict
    default: {}
  runner_src:
    description: Path on the node of the boot runner to install (the action transfers it); needed by V(boot_unit)
      and V(guard).
    type: path
  journal:
    description: Journal of original values (the V(kmod) concern loads the modules it persists, as at runtime).
    type: str
    default: /var/lib/gpunode-tuning/journal.json
  fail_on_error:
    description:
      - Fail the task when a concern failed (after every other one ran). V(false) returns ok with the failures in
        RV(failed_concerns), for a caller that reports them itself (the role fails the host once, at the end of a flow).
    type: bool
    default: true
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.command_timeouts
  - gpunode.tuning.node.writer
  - gpunode.tuning.node.attributes
"""

EXAMPLES = r"""
- name: Remove the persistent artifacts of this collection
  gpunode.tuning.tuning_persist:
    state: absent
    concerns: [sysctl, kmod, kernel_cmdline, gpu_locality, boot_unit, udev, guard]
    settings:
      sysctl_file: /etc/sysctl.d/90-gpunode-tuning.conf
      boot_script: /usr/local/lib/gpunode-tuning/apply-boot-tuning.sh
      udev_rule: /etc/udev/rules.d/70-gpunode-tuning.rules
"""

RETURN = r"""
concerns:
  description: Each concern's result (C(files) changed, C(skipped) with its reason, C(failed) with C(msg)).
  returned: always
  type: dict
failed_concerns:
  description: The message of each concern that failed.
  returned: always
  type: dict
reboot_required:
  description: Whether the kernel command line changed and only a reboot applies it.
  returned: always
  type: bool
pending_kernel_args:
  description: The kernel arguments configured for the next boot that the running kernel does not have yet.
  returned: always
  type: list
  elements: str
  sample: ["amd_pstate=active", "iommu=pt"]
not_rebooted_for:
  description:
    - The settings that would need a kernel argument and a reboot but that this node cannot take (fit before
      tuned), each with the cause (the unsupported setting's reason); no argument is written and no reboot is
      required for them, in check mode as in a real run.
  returned: always
  type: dict
  sample: {"cpufreq.driver": "amd-pstate active mode needs Linux 6.3 or newer with CONFIG_X86_AMD_PSTATE; this
    node runs 5.15.0-91-generic"}
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, command, lock  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import NODE_ARGUMENT_SPEC, Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import apply as flow
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import module_calls, persist, writers

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "absent"], default="present"),
    concerns=dict(type="list", elements="str", required=True, choices=[c.name for c in persist.concerns()]),
    desired=dict(type="dict", default={}),
    settings=dict(type="dict", default={}),
    runner_src=dict(type="path"),
    journal=dict(type="str", default="/var/lib/gpunode-tuning/journal.json"),
    fail_on_error=dict(type="bool", default=True),
    lock_timeout=dict(type="float", default=lock.DEFAULT_TIMEOUT),
    **NODE_ARGUMENT_SPEC,
    **command.ARGUMENT_SPEC,
)


def build_module():
    return AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)


def main():
    module = build_module()
    params = module.params
    try:
        node = Node.open(params["root"])
    except NodeError as exc:
        module.fail_json(msg=str(exc))
    settings = dict(params["settings"])
    if params["runner_src"]:
        with open(params["runner_src"], encoding="utf-8") as handle:
            settings["runner_text"] = handle.read()
    make_call = module_calls.call_maker(module)

    remove = params["state"] == "absent"
    wanted = [c for c in persist.concerns() if c.name in params["concerns"]]
    if remove:
        wanted.reverse()
    try:
        with writers.writing(node, params["journal"], "rollback" if remove else "persistent", module.check_mode,
                             timeout=params["lock_timeout"]) as held:

            def make_pc():
                pc = persist.persist_call(node, make_call.base, params["desired"], settings, make_call)
                pc.files.on_created = held.note_created
                return pc

            results = persist.run_concerns(wanted, make_pc, remove=remove)
    except lock.LockError as exc:
        module.fail_json(msg=str(exc))
    out = dict(changed=any(r.get("changed") for r in results.values()), concerns=results,
               failed_concerns=flow.failures(results), summary={n: r["summary"] for n, r in results.items()},
               reboot_required=any(bool(r.get("reboot_required")) for r in results.values()),
               pending_kernel_args=[arg for r in results.values() for arg, state in (r.get("arguments") or {}).items()
                                    if isinstance(state, dict) and state.get("pending_reboot")],
               not_rebooted_for={k: why for r in results.values() for k, why in
                                 (r.get("not_rebooted_for") or {}).items()})
    if module._diff:
        out["diff"] = flow.diffs(results)
    if out["failed_concerns"] and module.params["fail_on_error"]:
        module.fail_json(msg="these persistent concerns failed (every other concern ran): %s"
                         % " | ".join("%s: %s" % kv for kv in out["failed_concerns"].items()), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
