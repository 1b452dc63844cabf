# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kmod_optional
short_description: Load optional kernel modules and explain why one does not load
version_added: 1.0.0
description:
  - Loads (or unloads) kernel modules with C(modprobe). A module that does not load is reported
    with a reason class instead of failing the task, unless it is marked O(required).
  - The reason comes from modprobe's output and the kernel log records written during the attempt
    (C(/dev/kmsg) below O(root), read non-blocking from its end; C(dmesg) when it cannot be opened).
    Classes are V(not_found), V(invalid_argument), V(dependency_missing), V(symbol_mismatch),
    V(denied), V(in_use), V(builtin), V(no_modprobe) (the node has no C(modprobe); nothing ran) and
    V(unknown).
  - C(nvidia_peermem) (legacy name C(nv_peer_mem)) fails with C(Invalid argument) when the MOFED
    peer-memory symbols are absent; on a node without RDMA that is expected and harmless.
  - A module that is already loaded is never reloaded. When its parameters in
    C(/sys/module/NAME/parameters) differ from O(params), the difference is reported as
    RV(modules[].param_drift); the role's persistent flow writes the options line and the module takes it at the
    next boot (verification says V(pending_reboot) until then). Values are compared as the kernel shows them (a
    bool parameter reads V(Y) or V(N)); a parameter the module does not show there is listed in
    RV(modules[].param_unsupported), not compared.
  - On a simulated node (O(root) other than V(/)) only the node's own C(<root>/usr/sbin/modprobe)
    is run, never the controller's.
  - With O(journal), each module this task loads is recorded; O(restore=true) unloads those.
    Modules unloaded with O(state=absent) are not recorded.
  - Every name and parameter is validated before modprobe runs; modprobe gets C(--) before the
    module name, so nothing given here can be read as one of its options.
author:
  - gpunode.tuning contributors (@gpunode)
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.command_timeouts
  - gpunode.tuning.node.attributes
options:
  name:
    description:
      - Name of one module. Letters, digits, V(_) and V(-), not starting with V(-), at most 64 characters.
      - Mutually exclusive with O(modules).
    type: str
  params:
    description:
      - Module parameters for O(name), passed to modprobe as C(KEY=VALUE).
      - A C(KEY) starts with a letter or V(_), then letters, digits, V(_), V(.), V(-).
      - "Values may contain letters, digits and C(, . _ : / + @ % = -) (no whitespace, quotes or control
        characters, so a value can neither split modprobe's arguments nor a C(/etc/modprobe.d) line);
        booleans become V(1)/V(0)."
    type: dict
  state:
    description:
      - Whether the module should be loaded (V(present)) or unloaded (V(absent)).
      - Also the default for entries of O(modules) that do not set their own.
    type: str
    choices: [present, absent]
    default: present
  required:
    description:
      - When V(true), a module that does not reach O(state) fails the task.
      - Also the default for entries of O(modules) that do not set their own.
    type: bool
    default: false
  modules:
    description:
      - Several modules in one call. Each entry takes the same keys as the single form.
      - Mutually exclusive with O(name).
    type: list
    elements: dict
    suboptions:
      name:
        description: Module name.
        type: str
        required: true
      params:
        description: Module parameters.
        type: dict
      state:
        description: Desired state; defaults to the top-level O(state).
        type: str
        choices: [present, absent]
      required:
        description: Whether failing fails the task; defaults to the top-level O(required).
        type: bool
  journal:
    description:
      - Path of the journal on the node (below O(root)), for example C(/var/lib/gpunode-tuning/journal.json).
      - Modules this task loads are recorded in family C(kmod). Unset means no journal.
    type: str
  restore:
    description:
      - Ignore O(name) and O(modules); unload every module the journal records as loaded by this
        collection and drop those entries. Needs O(journal).
      - A module that cannot be unloaded (or a journal entry that is not a module name) fails the task
        and stays in the journal for the next attempt; the other modules are still unloaded.
    type: bool
    default: false
notes:
  - Loading a module is runtime state; persistence (C(/etc/modules-load.d)) is the role's job,
    and only for modules with RV(modules[].persist_ok=true).
  - In check mode nothing runs; a module that is not loaded is predicted as V(would load).
seealso:
  - module: community.general.modprobe
"""

EXAMPLES = r"""
- name: Try to load nvidia_peermem (harmless when it fails on a node without RDMA)
  gpunode.tuning.kmod_optional:
    name: nvidia_peermem
    journal: /var/lib/gpunode-tuning/journal.json

- name: Load several modules in one call, one of them required
  gpunode.tuning.kmod_optional:
    modules:
      - name: nvidia_uvm
        required: true
      - name: tcp_bbr
      - name: nvidia_peermem
    journal: /var/lib/gpunode-tuning/journal.json
  register: gpunode_kmods

- name: Unload the modules this collection loaded
  gpunode.tuning.kmod_optional:
    restore: true
    journal: /var/lib/gpunode-tuning/journal.json
"""

RETURN = r"""
modules:
  description: One entry per module, in the order given (restore - the journaled modules).
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Module name as given.
      type: str
      sample: nvidia_peermem
    state:
      description: Desired state.
      type: str
      sample: present
    required:
      description: Whether a failure of this module fails the task.
      type: bool
      sample: false
    loaded:
      description: Whether the module is loaded after the task (predicted in check mode).
      type: bool
      sample: false
    already_loaded:
      description: Whether it was loaded (or built in) before the task.
      type: bool
      sample: false
    builtin:
      description: Whether the module is built into the kernel.
      type: bool
      sample: false
    changed:
      description: Whether this task loaded or unloaded it.
      type: bool
      sample: false
    reason_class:
      description:
        - Why the module did not reach its state; null when it did.
        - One of V(not_found), V(invalid_argument), V(dependency_missing), V(symbol_mismatch),
          V(denied), V(in_use), V(builtin), V(invalid_name) (restore - a journal entry that is not a
          module name, never passed to modprobe), V(no_modprobe) (the node has no C(modprobe), or a
          simulated node none of its own), V(unknown).
      type: str
      sample: invalid_argument
    message:
      description: What happened, in words.
      type: str
      sample: "nvidia_peermem did not load (Invalid argument): it needs the MOFED/ib_core peer-memory support ..."
    param_drift:
      description:
        - "Requested parameters whose loaded value differs: parameter name -> dict with C(requested) and C(current)."
        - Compared as the kernel shows them (C(1), C(on), C(true) are a bool parameter's C(Y)).
      type: dict
      sample: {"uvm_disable_hmm": {"requested": "1", "current": "N"}}
    param_unsupported:
      description:
        - Requested parameters that C(/sys/module/NAME/parameters) does not show (declared with mode 0, such as the
          NVIDIA driver's C(NVreg_*), or not readable), so they cannot be compared.
      type: list
      elements: str
      sample: []
    persist_ok:
      description: True only when the module is loaded; the persistent role persists only those.
      type: bool
      sample: false
    modprobe_options:
      description:
        - The validated C(/etc/modprobe.d) line that sets the requested parameters at boot
          (C(options NAME KEY=VALUE ...)); null when no parameters were requested.
        - The persistent role writes it as it is.
      type: str
      sample: options nvidia NVreg_EnableGpuFirmware=0
    log:
      description: Kernel log lines of a failed attempt that concern the module.
      type: list
      elements: str
      sample: ["nvidia-peermem nv_mem_client_init:203 ERROR: ib_register_peer_memory_client failed"]
name:
  description: With O(name), the same as RV(modules[].name); likewise for every key of RV(modules).
  returned: when O(name) is given
  type: str
  sample: nvidia_peermem
loaded:
  description: With O(name), whether it is loaded.
  returned: when O(name) is given
  type: bool
  sample: false
already_loaded:
  description: With O(name), whether it was loaded before.
  returned: when O(name) is given
  type: bool
  sample: false
builtin:
  description: With O(name), whether it is built in.
  returned: when O(name) is given
  type: bool
  sample: false
required:
  description: With O(name), whether a failure fails the task.
  returned: when O(name) is given
  type: bool
  sample: false
state:
  description: With O(name), the desired state.
  returned: when O(name) is given
  type: str
  sample: present
reason_class:
  description: With O(name), why it did not reach its state (null when it did).
  returned: when O(name) is given
  type: str
  sample: invalid_argument
message:
  description: With O(name), what happened.
  returned: when O(name) is given
  type: str
  sample: loaded
param_drift:
  description: With O(name), requested parameters whose loaded value differs.
  returned: when O(name) is given
  type: dict
  sample: {}
param_unsupported:
  description: With O(name), requested parameters the module does not show in sysfs.
  returned: when O(name) is given
  type: list
  elements: str
  sample: []
persist_ok:
  description: With O(name), true only when it is loaded.
  returned: when O(name) is given
  type: bool
  sample: true
modprobe_options:
  description: With O(name), the C(/etc/modprobe.d) line for its parameters (null without parameters).
  returned: when O(name) is given
  type: str
  sample: null
log:
  description: With O(name), kernel log lines of a failed attempt.
  returned: when O(name) is given
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.families import kmod


def build_module():
    return AnsibleModule(argument_spec=kmod.ARGUMENT_SPEC, supports_check_mode=True,
                         mutually_exclusive=[("name", "modules"), ("params", "modules")])


def main():
    calls.run_module(build_module(), kmod.run)


if __name__ == "__main__":
    main()
