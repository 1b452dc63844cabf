# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: setpci_mrrs
short_description: Set the PCIe Max Read Request Size of selected devices
version_added: 1.0.0
description:
  - Sets the Max Read Request Size (MRRS, bits 14:12 of the PCI Express Device Control register)
    of the selected PCI functions at runtime with C(setpci), then reads it back.
  - Writes use the mask C(0x7000) only (C(setpci -s BDF CAP_EXP+08.w=V000:7000)), so Max Payload
    Size and bit 15 (Function Level Reset on endpoints) are never written.
  - One call handles every selected device with a constant number of C(setpci) processes
    (one write and one read-back for all devices that change; none when nothing changes or in
    check mode; more only after a failed write). Current values are read from the sysfs
    C(config) files.
  - Without a selector, the selection is the NVIDIA and AMD GPUs (vendor C(0x10de) or C(0x1002), class
    C(0x0300), C(0x0302), C(0x0380) or C(0x1200)); their HDMI-audio functions and NVSwitch bridges are not
    included.
  - One device that cannot be set never keeps the others from being set. A device whose config
    space is unusable (not present any more, too short to hold its PCI Express capability, not
    a file) or not writable (for example immutable) is failed before anything is written, in
    check mode too; a device that vanishes or refuses the write during the run, or whose value
    does not read back as written, is failed after. When the batched write fails, the devices it
    left unwritten are written one by one. The other devices are set (or restored) and reported,
    and the task fails at the end naming every failed device with its own cause.
  - A selected function without a PCI Express capability (conventional PCI) is skipped; one named in
    O(bdfs) is also warned about.
  - With O(restore=true), the entries of devices that could not be restored stay in the journal
    for the next attempt; the restored ones are removed.
  - Refuses, before writing anything, when kernel lockdown (C(integrity) or C(confidentiality))
    is active and a device would need a change. Warns when the kernel command line has
    C(pci=pcie_bus_perf), which lowers MRRS to MPS at boot.
  - Values set here do not survive a reboot or a hot-remove/rescan.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  mrrs:
    description:
      - Max Read Request Size in bytes.
      - Required unless O(restore=true).
    type: int
    choices: [128, 256, 512, 1024, 2048, 4096]
  vendor:
    description:
      - PCI vendor ids in hex (V(10de) or V(0x10de)); a device of any of them matches.
      - Every given selector must match. With no selector at all, NVIDIA GPUs are selected.
    type: list
    elements: str
  device:
    description:
      - PCI device id in hex (V(2bb5) or V(0x2bb5)).
    type: str
  class_prefixes:
    description:
      - PCI class prefixes in hex, each 2, 4 or 6 digits (base class, base class and subclass,
        or with the programming interface), for example V(["0300", "0302"]). Quote them in YAML.
      - A device matches when its class starts with one of them.
    type: list
    elements: str
  bdfs:
    description:
      - PCI addresses, C(DDDD:BB:DD.F) or C(BB:DD.F) (domain 0000 is assumed).
      - Every address must be present on the node.
    type: list
    elements: str
  allow_empty:
    description:
      - Succeed without changes when no PCI Express device matches the selection. By default an
        empty selection is a failure, so that a typo or a missing driver does not pass silently.
    type: bool
    default: false
  journal:
    description:
      - Path, on the node, of the journal of original values (for example
        V(/var/lib/gpunode-tuning/journal.json)). Before the first write, the original MRRS of
        every device about to change is recorded there (an original already recorded is kept).
      - Unset means no journal.
    type: str
  restore:
    description:
      - Write back the originals recorded in O(journal) for family C(pcie_mrrs), read them back and
        drop the restored entries. O(mrrs) and the selectors are not used.
    type: bool
    default: false
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.command_timeouts
  - gpunode.tuning.node.attributes
notes:
  - Needs root (only the first 64 bytes of config space are readable otherwise; the message
    says so only when the module does not run as root) and the C(setpci) command from the
    C(pciutils) package.
seealso:
  - name: PCI Express Device Control register (Linux pci_regs.h)
    description: Field layout of MRRS and MPS.
    link: https://github.com/torvalds/linux/blob/master/include/uapi/linux/pci_regs.h
"""

EXAMPLES = r"""
- name: Set MRRS to 4096 on every NVIDIA GPU, journaling the originals
  gpunode.tuning.setpci_mrrs:
    mrrs: 4096
    journal: /var/lib/gpunode-tuning/journal.json

- name: Set MRRS on ConnectX NICs, where present
  gpunode.tuning.setpci_mrrs:
    mrrs: 4096
    vendor: "15b3"
    class_prefixes: ["0200", "0207"]
    allow_empty: true

- name: Set MRRS on two devices by address
  gpunode.tuning.setpci_mrrs:
    mrrs: 2048
    bdfs: ["0000:41:00.0", "61:00.0"]

- name: Put back the MRRS values recorded before tuning
  gpunode.tuning.setpci_mrrs:
    restore: true
    journal: /var/lib/gpunode-tuning/journal.json
"""

RETURN = r"""
devices:
  description:
    - One entry per selected device (with O(restore=true), per journaled device), sorted by address.
    - In check mode, RV(devices[].mrrs_after) is the value that would be written.
  returned: always
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address with domain.
      type: str
      sample: "0000:41:00.0"
    vendor:
      description: Vendor id as in sysfs. Null for a journaled device that is not present.
      type: str
      sample: "0x10de"
    device:
      description: Device id as in sysfs. Null for a journaled device that is not present.
      type: str
      sample: "0x2bb5"
    class:
      description: 24-bit class code as in sysfs. Null for a journaled device that is not present.
      type: str
      sample: "0x030200"
    numa_node:
      description: NUMA node of the device, V(-1) when the platform reports none.
      type: int
      sample: 0
    mps:
      description: Max Payload Size in bytes (read, never written). Null without a PCIe capability.
      type: int
      sample: 256
    mrrs_before:
      description: MRRS in bytes before the task. Null without a PCIe capability.
      type: int
      sample: 512
    mrrs_after:
      description: MRRS in bytes after the task, as read back (predicted in check mode).
      type: int
      sample: 4096
    changed:
      description: Whether the MRRS of this device changed (would change in check mode).
      type: bool
      sample: true
    skipped:
      description: Whether the device was left alone (no PCIe capability, or not present).
      type: bool
      sample: false
    failed:
      description:
        - Whether the device could not be set (or restored); in check mode, whether it would fail.
      type: bool
      sample: false
    reason:
      description:
        - Why the device was skipped or failed, or what was done.
        - A failure names its cause, for example C(config space is only 64 bytes ...),
          C(device vanished ...), C(write refused ...) or C(... the write did not take ...).
      type: str
      sample: set
failed_devices:
  description:
    - Addresses of the devices that could not be set (in check mode, that would fail). The task
      fails when it is not empty, after every other device was set.
  returned: always
  type: list
  elements: str
  sample: []
lockdown:
  description: Kernel lockdown mode (V(none), V(integrity), V(confidentiality)); null when unknown.
  returned: always
  type: str
  sample: none
pcie_bus_perf:
  description:
    - Whether the kernel command line has C(pci=pcie_bus_perf) (MRRS clamped to MPS at boot).
    - A warning is issued too.
  returned: always
  type: bool
  sample: false
setpci_calls:
  description: Number of C(setpci) processes started (0 when nothing was written).
  returned: always
  type: int
  sample: 2
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_mrrs


def build_module():
    return AnsibleModule(
        argument_spec=pcie_mrrs.ARGUMENT_SPEC,
        supports_check_mode=True,
    )


def main():
    calls.run_module(build_module(), pcie_mrrs.run)


if __name__ == "__main__":
    main()
