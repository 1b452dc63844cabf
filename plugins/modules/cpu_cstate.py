# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cpu_cstate
short_description: Disable or re-enable CPU idle states (C-states) on every CPU in one call
version_added: 1.0.0
description:
  - Writes the per-CPU C(/sys/devices/system/cpu/cpuN/cpuidle/stateM/disable) files of all online CPUs,
    or of the CPUs in O(cpus), and reads each one back.
  - States are selected by name (O(disable)) or by an exit-latency bound (O(max_latency_us)), and are
    matched by name on every CPU; state indexes differ between platforms and are never used for selection.
  - The change lasts until reboot. For a persistent change use the kernel parameters
    C(processor.max_cstate=N) (acpi_idle) or C(intel_idle.max_cstate=N), or run this module at boot.
  - On a node without a cpuidle driver (C(current_driver) is V(none), typical of VMs) the module returns
    RV(supported=false) and changes nothing; it fails there only with O(required=true).
  - In check mode each C(disable) file that would change is checked for writability (it exists, is a file,
    is not immutable or read-only); one that is not fails the task as the real run would, naming the CPUs,
    states and causes, while the other planned changes are still reported. Nothing is written.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  disable:
    description:
      - Names of the idle states to act on, as in C(cpuidle/stateM/name), for example V(C2) or V(C6).
      - A name the node does not have fails the task, listing the node's state names; nothing is written.
      - An empty list changes nothing and reports the states.
      - Mutually exclusive with O(max_latency_us).
    type: list
    elements: str
  max_latency_us:
    description:
      - Exit-latency bound in microseconds. States whose C(latency) is above it are disabled and all
        other states are enabled (a state disabled earlier is re-enabled).
      - V(POLL) is never disabled by the bound; disable it by name if that is really wanted.
      - Mutually exclusive with O(disable).
    type: int
  state:
    description:
      - What to do with the states named in O(disable).
      - V(enabled) cannot be combined with O(max_latency_us).
    type: str
    choices: [disabled, enabled]
    default: disabled
  cpus:
    description:
      - CPUs to act on, as a kernel cpulist such as V(0-15,32-47). Every CPU must be online.
      - Default is every online CPU.
    type: str
  required:
    description:
      - Fail when the node has no cpuidle driver, instead of returning RV(supported=false).
    type: bool
    default: false
  preset_options:
    description:
      - The desired-value options whose value comes from a preset that sets them for every node (the role
        passes them). On a node without a cpuidle driver or idle states such an option is reported in the
        result only (RV(supported=false)); any other O(disable) or O(max_latency_us) given is also warned
        about, naming why.
    type: list
    elements: str
    choices: [disable, max_latency_us, cpus]
    default: []
  journal:
    description:
      - Path of the journal of original values on the node, for example V(/var/lib/gpunode-tuning/journal.json).
      - Before the first write the original C(disable) value of every CPU and state about to change is
        recorded (family C(cpuidle)); an original already recorded is never overwritten.
      - Unset means no journal.
    type: str
  restore:
    description:
      - Write back the originals recorded in O(journal) for the C(cpuidle) family, read them back and drop
        them from the journal. O(disable), O(max_latency_us), O(state) and O(cpus) are ignored.
      - A CPU whose state cannot be restored (an immutable or vanished C(disable) file, a state that is gone)
        does not stop the others; the task fails naming the states, CPUs and causes, and exactly those
        originals stay in the journal.
      - Needs O(journal).
    type: bool
    default: false
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.attributes
notes:
  - Disabling deep states lowers wake latency and costs turbo headroom and idle power.
seealso:
  - name: Linux CPU idle time management
    description: The cpuidle sysfs interface.
    link: https://docs.kernel.org/admin-guide/pm/cpuidle.html
"""

EXAMPLES = r"""
- name: Disable C2 on every CPU, keeping the originals for a rollback
  gpunode.tuning.cpu_cstate:
    disable: [C2]
    journal: /var/lib/gpunode-tuning/journal.json

- name: Allow only idle states with an exit latency of at most 10 us
  gpunode.tuning.cpu_cstate:
    max_latency_us: 10

- name: Re-enable C6 on the first socket only
  gpunode.tuning.cpu_cstate:
    disable: [C6]
    state: enabled
    cpus: 0-55

- name: Put the original idle states back
  gpunode.tuning.cpu_cstate:
    restore: true
    journal: /var/lib/gpunode-tuning/journal.json
"""

RETURN = r"""
supported:
  description: Whether the node has a cpuidle driver with idle states.
  returned: always
  type: bool
  sample: true
driver:
  description: The cpuidle driver (C(cpuidle/current_driver)), null when the node has none.
  returned: always
  type: str
  sample: acpi_idle
reason:
  description: Why the node is not supported.
  returned: when supported is false
  type: str
  sample: "this node has no cpuidle driver (sys/devices/system/cpu/cpuidle/current_driver is 'none')"
cpus:
  description: The CPUs acted on, as a cpulist (with O(restore), the CPUs recorded in the journal).
  returned: when supported
  type: str
  sample: 0-127
states:
  description:
    - One entry per idle state name found on the selected CPUs, including states that were not asked for
      (their RV(states.desired) is null).
  returned: always
  type: dict
  sample:
    C2:
      latency: 400
      desired: disabled
      cpus: 0-127
      cpus_changed: 128
      disabled_before: 0
      disabled_after: 128
      disabled_cpus: 0-127
  contains:
    latency:
      description: Exit latency in microseconds (the highest over the CPUs when they differ).
      type: int
      returned: always
      sample: 400
    desired:
      description: V(disabled), V(enabled), V(mixed) (a latency bound that differs per CPU), or null when untouched.
      type: str
      returned: always
      sample: disabled
    cpus:
      description: Selected CPUs that have this state, as a cpulist.
      type: str
      returned: always
      sample: 0-127
    cpus_changed:
      description: Number of CPUs whose C(disable) value changed (would change in check mode).
      type: int
      returned: always
      sample: 128
    disabled_before:
      description: Number of CPUs on which the state was disabled before.
      type: int
      returned: always
      sample: 0
    disabled_after:
      description: Number of CPUs on which the state is disabled after (read back; planned in check mode).
      type: int
      returned: always
      sample: 128
    disabled_cpus:
      description: CPUs on which the state is disabled after, as a cpulist.
      type: str
      returned: always
      sample: 0-127
failed_states:
  description:
    - State names whose write did not take on some CPU (the task fails naming the CPUs and causes; every other
      CPU and state was still written). With O(restore), the states whose originals could not be restored.
  returned: on failure after writing, and in check mode when a write would fail
  type: list
  elements: str
  sample: [C2]
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpuidle


def build_module():
    """Build the AnsibleModule (tests use it without main())."""
    return AnsibleModule(argument_spec=cpuidle.ARGUMENT_SPEC, mutually_exclusive=cpuidle.MUTUALLY_EXCLUSIVE,
                         supports_check_mode=True)


def main():
    calls.run_module(build_module(), cpuidle.run)


if __name__ == "__main__":
    main()
