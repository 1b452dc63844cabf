# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kernel_tunables
short_description: Set /proc/sys keys and transparent hugepage settings at runtime
version_added: 1.0.0
description:
  - Sets any number of sysctl keys (files under C(/proc/sys)) and the transparent hugepage
    settings C(enabled) and C(defrag) (under C(/sys/kernel/mm/transparent_hugepage)) in one call,
    with the value before and after per key.
  - Runtime only; nothing here survives a reboot. Persistence (C(/etc/sysctl.d), the
    C(transparent_hugepage=) kernel argument) is the job of the persistent role and
    M(gpunode.tuning.kernel_cmdline).
  - Every key and value is validated before the first write, and bad input fails the task with
    nothing written. A key follows the sysctl name grammar (no leading C(-), no C(=), whitespace or
    control characters); a value has no control characters or line breaks (a tab between fields is
    written as a space) and starts with C(-) only as a negative integer, so that the same value can
    go into a C(/etc/sysctl.d) drop-in without adding a line.
    Where the current value is an integer (or integer fields, such as C(net.ipv4.tcp_rmem)) the new
    one must be too, each field within 64 bits; a transparent hugepage value must be one of the modes
    the kernel documents and one of the choices the file lists.
    Multi-field values are compared with whitespace normalized.
  - Where the kernel documents a range for a key, independent of the hardware, the value must be in it
    (C(vm.swappiness) 0-200, C(kernel.numa_balancing) 0-3, C(vm.overcommit_memory) 0-2, C(vm.dirty_ratio) and
    C(vm.dirty_background_ratio) 0-100, C(vm.zone_reclaim_mode) 0-7, C(vm.panic_on_oom) 0-2). A value the
    running kernel refuses on the write (EINVAL, for example C(vm.swappiness=150) before Linux 5.8) fails that
    key naming the value; the other keys are still applied.
  - A key that does not exist on this node (or transparent hugepages where the kernel has none)
    fails that key alone; the other keys are applied, and the task fails at the end naming the
    missing key and listing RV(applied_keys).
  - Each value is read back after it is written; a value that did not take fails that key, and
    the other keys are still applied.
author:
  - gpunode.tuning contributors (@gpunode)
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.attributes
options:
  sysctl:
    description:
      - Keys and values. A key is a sysctl name, dotted (V(vm.swappiness); a C(/) inside a
        component stands for a dot, as in sysctl(8)) or slash-separated (V(kernel/numa_balancing)).
        Absolute keys and keys containing C(..) are rejected.
      - A value is a string or number; a list is joined with spaces; a boolean becomes V(1)/V(0).
    type: dict
    default: {}
  transparent_hugepage:
    description: Transparent hugepage settings.
    type: dict
    suboptions:
      enabled:
        description: Value of C(enabled), one of the choices the file lists (V(always), V(madvise), V(never)).
        type: str
      defrag:
        description:
          - Value of C(defrag), one of the choices the file lists (V(always), V(defer),
            V(defer+madvise), V(madvise), V(never)).
        type: str
  skip_readonly:
    description:
      - When C(/proc/sys) (or C(/sys)) is mounted read-only, as in an unprivileged container, or a
        write fails with EROFS, EACCES or EPERM, report the key as skipped with the reason instead
        of failing.
    type: bool
    default: false
  sysctl_file:
    description:
      - A sysctl drop-in (absolute on the node, below O(root)) that the caller is about to write these
        values to, for example with M(ansible.posix.sysctl). The module checks, also in check mode, that
        it can be written (its directory accepts new files, an existing file is a regular file that is
        not immutable) and fails naming it before anything is written when it cannot.
      - Nothing is written to it by this module. Unset means no check.
    type: str
  journal:
    description:
      - Path of the journal on the node (below O(root)), for example C(/var/lib/gpunode-tuning/journal.json).
      - The original value of every key this task changes is recorded (family C(tunables)) before
        the first write. Unset means no journal.
    type: str
  restore:
    description:
      - Ignore O(sysctl) and O(transparent_hugepage); write back every original the journal holds
        for family C(tunables), read back, and drop the restored entries. Needs O(journal).
      - An entry that cannot be restored fails alone and stays in the journal for the next attempt;
        the others are restored.
    type: bool
    default: false
seealso:
  - module: ansible.posix.sysctl
  - module: gpunode.tuning.kernel_cmdline
"""

EXAMPLES = r"""
- name: Apply the inference sysctls and THP settings now
  gpunode.tuning.kernel_tunables:
    sysctl:
      kernel.numa_balancing: 0
      vm.swappiness: 10
      net.core.rmem_max: 67108864
      net.ipv4.tcp_rmem: "4096 131072 67108864"
    transparent_hugepage:
      enabled: madvise
      defrag: defer+madvise
    journal: /var/lib/gpunode-tuning/journal.json
  register: gpunode_tunables

- name: Check the values and that the drop-in can be written, before persisting them
  gpunode.tuning.kernel_tunables:
    sysctl:
      vm.swappiness: 10
    sysctl_file: /etc/sysctl.d/90-gpunode-tuning.conf
  check_mode: true

- name: In a container, skip what cannot be written
  gpunode.tuning.kernel_tunables:
    sysctl:
      vm.swappiness: 10
    skip_readonly: true

- name: Put the journaled values back
  gpunode.tuning.kernel_tunables:
    restore: true
    journal: /var/lib/gpunode-tuning/journal.json
"""

RETURN = r"""
settings:
  description:
    - One entry per key, by canonical name (dotted sysctl names; V(transparent_hugepage.enabled),
      V(transparent_hugepage.defrag)).
  returned: always
  type: dict
  sample:
    kernel.numa_balancing:
      key: kernel.numa_balancing
      path: /proc/sys/kernel/numa_balancing
      before: "1"
      after: "0"
      desired: "0"
      changed: true
      skipped: false
      failed: false
      reason: null
  contains:
    key:
      description: Canonical key name.
      type: str
      sample: vm.swappiness
    path:
      description: The file below O(root).
      type: str
      sample: /proc/sys/vm/swappiness
    before:
      description:
        - Value before the task (whitespace-normalized; for THP the selected choice).
        - Null when the key does not exist on this node.
      type: str
      sample: "60"
    after:
      description: Value read back after the task (in check mode, the predicted value).
      type: str
      sample: "10"
    desired:
      description: Value asked for (whitespace-normalized).
      type: str
      sample: "10"
    changed:
      description: Whether the value was (or in check mode would be) changed.
      type: bool
      sample: true
    skipped:
      description: Whether the key was skipped because it is read-only and O(skip_readonly) is set.
      type: bool
      sample: false
    failed:
      description: Whether the key does not exist here, writing it failed or its value did not read back.
      type: bool
      sample: false
    reason:
      description: Why the key was skipped or failed; null otherwise.
      type: str
      sample: null
failed_keys:
  description: Keys that failed (the task then fails too), among them keys that do not exist on this node.
  returned: always
  type: list
  elements: str
  sample: []
applied_keys:
  description:
    - Keys whose value is the desired one after the task (in check mode, would be), whether this task
      changed them or they were right already. With O(restore), the keys back at their original value.
  returned: always
  type: list
  elements: str
  sample: [vm.swappiness, transparent_hugepage.enabled]
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.families import tunables


def build_module():
    return AnsibleModule(argument_spec=tunables.ARGUMENT_SPEC, supports_check_mode=True)


def main():
    calls.run_module(build_module(), tunables.run)


if __name__ == "__main__":
    main()
