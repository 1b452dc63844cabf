# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cpu_freq
short_description: Set the cpufreq governor, energy performance preference, boost and pstate mode on every CPU
version_added: 1.0.0
description:
  - Sets the scaling governor and the energy performance preference (EPP) of every cpufreq policy, CPU boost,
    and the runtime mode of amd-pstate or intel_pstate, in one call; every write is read back.
  - Values are checked before the node is read (the governor one of the kernel's governors V(performance),
    V(powersave), V(schedutil), V(ondemand), V(conservative), V(userspace); the EPP one of V(default),
    V(performance), V(balance_performance), V(balance_power), V(power) or a raw 0-255), then against the node
    before anything is written. The governor must be in C(scaling_available_governors), the EPP in
    C(energy_performance_available_preferences).
  - Governor and EPP are written in an order the driver accepts. amd-pstate-epp and intel_pstate refuse an EPP
    other than V(performance) while the governor is V(performance) (EBUSY), so the governor is written first and
    that combination is refused before anything is written.
  - A mode switch (O(amd_pstate_mode), O(intel_pstate_status)) is written first; the driver then re-registers
    (amd-pstate-epp in V(active) mode, amd-pstate in V(passive)/V(guided)) with another governor list, so the
    policies are read again before the governor and EPP are set.
  - The cpufreq driver itself changes only at boot. With O(driver) different from the running driver the module
    changes nothing about the driver and returns RV(reboot_required=true) and the RV(kernel_args) for the
    persistent path (for example V(amd_pstate=active) on a node running acpi-cpufreq).
  - All changes last until reboot. On a node without cpufreq (typical of VMs) the module returns
    RV(supported=false) and changes nothing; it fails there only with O(required=true).
  - In check mode each file that would be written (mode, governor, EPP, boost) is checked for writability (it
    exists, is a file, is not immutable or read-only); one that is not fails the task as the real run would,
    naming the setting, CPUs, file and cause, while the other planned changes are still reported. Nothing is
    written.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  governor:
    description:
      - Scaling governor for every policy, for example V(performance). Must be available with the running
        driver (after a mode switch, with the driver of the new mode).
    type: str
  epp:
    description:
      - Energy performance preference for every policy, for example V(performance) or V(balance_performance).
      - Needs a driver with EPP (amd-pstate-epp, intel_pstate with HWP). When the driver the node is meant to run
        has none (acpi-cpufreq, cppc_cpufreq, amd-pstate in V(passive) or V(guided) mode), the setting is not
        applicable and reported as skipped with the reason, as it is when O(driver=amd-pstate) is pending a reboot.
      - With the V(performance) governor only V(performance) is accepted.
    type: str
  boost:
    description:
      - Turn CPU boost (turbo) on or off. Writes C(cpufreq/boost), or C(intel_pstate/no_turbo) (inverted) on
        intel_pstate.
      - On a node with neither file (cppc_cpufreq without boost, for example) the setting is skipped with the
        reason.
    type: bool
  amd_pstate_mode:
    description:
      - Runtime mode of amd-pstate, written to C(/sys/devices/system/cpu/amd_pstate/status).
      - Applies only when the desired driver is amd-pstate (O(driver=amd-pstate), O(driver=native) on AMD, or
        no O(driver) on a node running amd-pstate). Otherwise it is skipped with the reason, never an error, so
        that one desired state serves nodes pinned to another driver.
      - With O(driver=amd-pstate) on a node running acpi-cpufreq the mode goes into RV(kernel_args)
        (V(amd_pstate=MODE)).
    type: str
    choices: [active, passive, guided]
  intel_pstate_status:
    description:
      - Runtime mode of intel_pstate, written to C(/sys/devices/system/cpu/intel_pstate/status).
      - Applies only when the desired driver is intel_pstate; otherwise skipped with the reason.
    type: str
    choices: [active, passive]
  driver:
    description:
      - The cpufreq driver family the node should run. Never switched at runtime; when it differs from the
        running driver the result has RV(reboot_required=true) and the RV(kernel_args) that select it.
      - V(native) is the CPU vendor's own driver, amd-pstate on AMD and intel_pstate on Intel, so one desired
        state serves a mixed fleet; on Intel an O(amd_pstate_mode) is then skipped with a reason.
      - On a CPU without a vendor pstate driver (arm64 with cppc_cpufreq, for example) V(native) keeps the running
        driver; the setting is reported as skipped with the reason. The other values exist on x86 only and fail
        on arm64.
    type: str
    choices: [native, amd-pstate, acpi-cpufreq, intel_pstate]
  required:
    description:
      - Fail when the node has no cpufreq policies, instead of returning RV(supported=false).
    type: bool
    default: false
  preset_options:
    description:
      - The desired-value options whose value comes from a preset that sets them for every node (the role
        passes them). That such an option does not apply on this node (no cpufreq, EPP on a driver without
        EPP, a pstate mode for another driver) is reported in the result only.
      - Any other option given that does not apply on this node is also warned about, naming why.
    type: list
    elements: str
    choices: [governor, epp, boost, driver, amd_pstate_mode, intel_pstate_status]
    default: []
  journal:
    description:
      - Path of the journal of original values on the node, for example V(/var/lib/gpunode-tuning/journal.json).
      - Before the first write the originals of what is about to change are recorded in family C(cpufreq), namely the
        pstate mode, governor and EPP per CPU (a governor change or mode switch moves the EPP too), boost.
        An original already recorded is never overwritten.
      - Unset means no journal.
    type: str
  restore:
    description:
      - Write back the originals recorded in O(journal) for the C(cpufreq) family (mode first, then governor, EPP
        and boost), read them back and drop them from the journal. The desired-value options are ignored.
      - What cannot be restored (an immutable or vanished file, a CPU without its policy) does not stop the
        rest; the task fails naming the CPUs and causes, and exactly those originals stay in the journal.
      - Needs O(journal).
    type: bool
    default: false
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.attributes
seealso:
  - name: amd-pstate CPU performance scaling driver
    description: Modes, EPP and the status file.
    link: https://docs.kernel.org/admin-guide/pm/amd-pstate.html
  - name: intel_pstate CPU performance scaling driver
    description: Modes, EPP and no_turbo.
    link: https://docs.kernel.org/admin-guide/pm/intel_pstate.html
"""

EXAMPLES = r"""
- name: Run every CPU with the performance governor and boost on
  gpunode.tuning.cpu_freq:
    governor: performance
    boost: true
    journal: /var/lib/gpunode-tuning/journal.json

- name: Ask for amd-pstate; on acpi-cpufreq nodes this reports the kernel argument and a pending reboot
  gpunode.tuning.cpu_freq:
    driver: amd-pstate
    amd_pstate_mode: active
    governor: performance
  register: gpunode_cpufreq

- name: Balanced EPP under powersave (governor written first, then EPP)
  gpunode.tuning.cpu_freq:
    governor: powersave
    epp: balance_performance

- name: Put the original cpufreq settings back
  gpunode.tuning.cpu_freq:
    restore: true
    journal: /var/lib/gpunode-tuning/journal.json
"""

RETURN = r"""
supported:
  description: Whether the node has cpufreq policies.
  returned: always
  type: bool
  sample: true
driver:
  description: The running scaling driver after the call (planned one in check mode); null without cpufreq.
  returned: always
  type: str
  sample: amd-pstate-epp
reason:
  description: Why the node is not supported.
  returned: when supported is false
  type: str
  sample: this node has no cpufreq policies (sys/devices/system/cpu/cpufreq is empty or missing; typical of VMs)
reboot_required:
  description: Whether O(driver) asks for a driver that only a reboot with RV(kernel_args) can bring.
  returned: always
  type: bool
  sample: true
kernel_args:
  description: Kernel command-line arguments that select the wanted driver (empty when none are needed).
  returned: always
  type: list
  elements: str
  sample: [amd_pstate=active]
unsupported:
  description:
    - What this node cannot take, by setting (V(driver), V(amd_pstate_mode), V(epp)), with the cause - a kernel
      without amd-pstate (its release, configuration or module tree), ACPI CPPC off in the firmware, or a kernel
      that loads amd-pstate by itself (Zen 5 on Linux 6.13 or newer). Nothing is written for it, no kernel
      argument is asked for and no reboot is needed for it (module_utils/core/platform.py).
  returned: when the desired driver is amd-pstate and the node cannot take it, or needs no argument for it
  type: dict
  sample: {driver: "amd-pstate active mode needs Linux 6.3 or newer with CONFIG_X86_AMD_PSTATE; this node runs
                    5.15.0-91-generic and the driver is neither built in nor in /lib/modules/5.15.0-91-generic:
                    boot a kernel that has it"}
settings:
  description:
    - One entry per requested setting (V(governor), V(epp), V(boost), V(amd_pstate_mode), V(intel_pstate_status),
      V(driver)); with O(restore), per restored setting.
    - Per-CPU settings (governor, epp) aggregate their values as C(value -> cpulist), never one entry per CPU.
  returned: always
  type: dict
  sample:
    governor:
      desired: performance
      before: {schedutil: 0-127}
      after: {performance: 0-127}
      cpus: 128
      cpus_desired: 128
      cpus_changed: 128
      changed: true
      skipped: false
      reason: null
    boost:
      desired: true
      before: false
      after: true
      cpus_changed: 0
      changed: true
      skipped: false
      reason: null
      file: sys/devices/system/cpu/cpufreq/boost
  contains:
    desired:
      description:
        - The value asked for; with O(restore), the journaled original (C(value -> cpulist) for per-CPU settings).
      type: raw
      returned: always
      sample: performance
    before:
      description: Value before; for per-CPU settings a dict C(value -> cpulist).
      type: raw
      returned: always
      sample: {schedutil: 0-127}
    after:
      description: Value after (read back; planned in check mode); for per-CPU settings a dict C(value -> cpulist).
      type: raw
      returned: always
      sample: {performance: 0-127}
    cpus:
      description: Number of CPUs covered by a per-CPU setting.
      type: int
      returned: for governor and epp
      sample: 128
    cpus_desired:
      description: Number of CPUs at the desired value after the call (null with O(restore)).
      type: int
      returned: for governor and epp
      sample: 128
    cpus_changed:
      description: Number of CPUs whose value changed (0 for node-wide settings).
      type: int
      returned: always
      sample: 128
    changed:
      description: Whether this setting changed (would change in check mode).
      type: bool
      returned: always
      sample: true
    skipped:
      description:
        - Whether the setting was left alone, for example EPP or the mode before a reboot into amd-pstate, a
          setting for another driver than the desired one, or O(driver=native) on a CPU without a vendor pstate
          driver.
      type: bool
      returned: always
      sample: false
    reason:
      description: Why the setting was skipped; null otherwise.
      type: str
      returned: always
      sample: null
    file:
      description: The file that controls boost (C(cpufreq/boost) or C(intel_pstate/no_turbo)); null without one.
      type: str
      returned: for boost
      sample: sys/devices/system/cpu/cpufreq/boost
failed_settings:
  description:
    - Settings whose write did not take on some CPU (the task fails naming the CPUs and causes; the others were
      still applied). With O(restore), the settings whose originals could not be restored.
  returned: on failure after writing, and in check mode when a write would fail
  type: list
  elements: str
  sample: [epp]
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpufreq


def build_module():
    """Build the AnsibleModule (tests use it without main())."""
    return AnsibleModule(argument_spec=cpufreq.ARGUMENT_SPEC, supports_check_mode=True)


def main():
    calls.run_module(build_module(), cpufreq.run)


if __name__ == "__main__":
    main()
