# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kernel_cmdline
short_description: Make kernel command-line arguments persistent and tell which need a reboot
version_added: 1.0.0
description:
  - Ensures kernel command-line arguments are present in (or absent from) the boot configuration.
  - Debian/Ubuntu (GRUB) - the arguments live in one drop-in under C(/etc/default/grub.d/) that appends
    to C(GRUB_CMDLINE_LINUX_DEFAULT); C(update-grub) runs only when the drop-in changed, O(root) is
    V(/), O(update_bootloader) is set and the command exists. With O(state=absent) the arguments
    leave the drop-in, and an empty drop-in is deleted.
  - RHEL family - C(grubby --update-kernel=ALL --args=...) or C(--remove-args=...), only when O(root) is
    V(/). On a simulated root nothing is run unless the node ships its own C(<root>/usr/sbin/grubby);
    otherwise the result says RV(supported=false), RV(arguments) has C(configured) null, and nothing
    is applied.
  - A V(key=value) argument replaces another value of the same key. Removing a bare V(key) removes it
    with any value.
  - Each argument is compared with the running command line (C(/proc/cmdline)) to tell an applied
    argument from one that is pending a reboot. The module never reboots.
author:
  - gpunode.tuning contributors (@gpunode)
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.command_timeouts
  - gpunode.tuning.node.attributes
options:
  arguments:
    description:
      - Kernel arguments, V(KEY) or V(KEY=VALUE), for example V(amd_pstate=active), V(iommu=pt).
      - No quotes, whitespace, control characters or shell characters (such as C($), C(`), C(;), C(|)),
        and no leading C(-), so that an argument fits the GRUB drop-in's double quotes and grubby's
        C(--args=); a key at most once. A bad argument fails the task naming it before anything is written.
      - The one exception is C(;) between the PCI addresses of V(pci=disable_acs_redir=BDF;BDF) (the kernel's
        separator); the GRUB drop-in writes that value in GRUB single quotes, so that neither the shell nor
        GRUB's C(linux) line splits it. Every address of that list, one or many, must be C([DDDD:]BB:DD.F)
        (device 00-1f, function 0-7); the list may be one of the comma-separated options of V(pci=).
      - May be empty when O(iommu_mode) gives the arguments.
    type: list
    elements: str
    required: true
  iommu_mode:
    description:
      - Also configure (or with O(state=absent) remove) the kernel arguments of this IOMMU mode, for the CPU
        vendor read from the node's own C(/proc/cpuinfo) below O(root).
      - V(passthrough) - V(iommu=pt) on x86, V(iommu.passthrough=1) on arm64. GPU peer-to-peer DMA is not
        translated, at the cost of DMA isolation between devices and the host.
      - V(translated) - V(iommu=nopt) on x86 (plus V(intel_iommu=on) on Intel), V(iommu.passthrough=0) on arm64.
      - With O(state=absent) every argument either vendor may have got for the mode is removed.
      - V(unmanaged) adds nothing.
    type: str
    choices: [passthrough, translated, unmanaged]
    default: unmanaged
  state:
    description: Whether the arguments should be configured (V(present)) or not (V(absent)).
    type: str
    choices: [present, absent]
    default: present
  bootloader:
    description:
      - How the boot configuration is changed. V(auto) picks V(grub) on Debian-like systems and
        V(grubby) on the RHEL family (from C(/etc/os-release) below O(root)).
    type: str
    choices: [auto, grub, grubby]
    default: auto
  dropin:
    description:
      - The GRUB drop-in, a V(NAME.cfg) file directly in C(/etc/default/grub.d) (resolved below O(root)).
      - A file there that does not carry the "Managed by gpunode.tuning" header is never overwritten.
    type: str
    default: /etc/default/grub.d/60-gpunode-tuning.cfg
  update_bootloader:
    description:
      - Run C(update-grub) after the drop-in changed. Only when O(root) is V(/).
    type: bool
    default: true
notes:
  - Diff mode shows the drop-in text before and after (grubby - the default kernel's arguments).
  - A drop-in that cannot be written (its directory read-only or immutable, the file immutable or a
    directory) fails the task naming it, in check mode too.
  - Files are written atomically (a temporary file in the target directory, then renamed).
seealso:
  - module: gpunode.tuning.kernel_tunables
"""

EXAMPLES = r"""
- name: Boot with amd_pstate in active mode and IOMMU passthrough
  gpunode.tuning.kernel_cmdline:
    arguments:
      - amd_pstate=active
      - iommu=pt
  register: gpunode_cmdline

- name: Boot into IOMMU passthrough (iommu=pt on x86, iommu.passthrough=1 on arm64, from the node's CPU)
  gpunode.tuning.kernel_cmdline:
    arguments: []
    iommu_mode: passthrough

- name: Tell the operator which hosts need a reboot
  ansible.builtin.debug:
    msg: >-
      Reboot needed for {{ gpunode_cmdline.arguments | dict2items
      | selectattr('value.pending_reboot') | map(attribute='key') | list }}
  when: gpunode_cmdline.reboot_required

- name: Remove pci=pcie_bus_perf (it clamps MRRS to MPS)
  gpunode.tuning.kernel_cmdline:
    arguments:
      - pci=pcie_bus_perf
    state: absent
"""

RETURN = r"""
arguments:
  description: Per argument as given.
  returned: always
  type: dict
  sample:
    amd_pstate=active:
      configured: true
      running: false
      pending_reboot: true
  contains:
    configured:
      description:
        - Whether the argument is in the boot configuration after the task (predicted in check mode).
        - Null when it cannot be known (grubby on a simulated root).
      type: bool
      sample: true
    running:
      description: Whether the argument is on the running command line (C(/proc/cmdline)).
      type: bool
      sample: false
    pending_reboot:
      description: Whether the configuration and the running kernel disagree about it (null when unknown).
      type: bool
      sample: true
reboot_required:
  description: Whether any argument is pending a reboot. The module never reboots.
  returned: always
  type: bool
  sample: true
bootloader:
  description: The bootloader tool used.
  returned: always
  type: str
  sample: grub
supported:
  description: Whether the boot configuration could be read and changed on this node.
  returned: always
  type: bool
  sample: true
bootloader_updated:
  description: Whether C(update-grub) or C(grubby) ran to change the boot entries.
  returned: always
  type: bool
  sample: false
dropin:
  description: The drop-in path on the node (GRUB), null for grubby.
  returned: always
  type: str
  sample: /etc/default/grub.d/60-gpunode-tuning.cfg
configured_cmdline:
  description: The arguments the boot configuration gives the kernel (GRUB or grubby), null when unknown.
  returned: always
  type: list
  elements: str
  sample: ["quiet", "amd_pstate=active"]
iommu_arguments:
  description: The arguments O(iommu_mode) added to O(arguments) (empty when unmanaged).
  returned: always
  type: list
  elements: str
  sample: ["iommu=pt"]
cpu_vendor:
  description: The node's CPU vendor the IOMMU arguments were chosen for (null without O(iommu_mode)).
  returned: always
  type: str
  sample: AuthenticAMD
changed:
  description: Whether the boot configuration changed (or would in check mode).
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.families import kernel_cmdline


def build_module():
    return AnsibleModule(argument_spec=kernel_cmdline.ARGUMENT_SPEC, supports_check_mode=True)


def main():
    calls.run_module(build_module(), kernel_cmdline.run)


if __name__ == "__main__":
    main()
