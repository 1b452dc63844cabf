# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: pcie_acs
short_description: Disable PCIe ACS P2P redirect on the bridges between the GPUs and their root ports
version_added: 1.0.0
description:
  - Finds the bridges (root ports, switch ports) on the sysfs path of each selected GPU and clears
    P2P Request Redirect, P2P Completion Redirect and P2P Egress Control (bits 2, 3 and 5) in the
    ACS Control register of their ACS extended capability (id C(0x000D)), so that peer-to-peer
    traffic between GPUs is not forced up to the root complex (NCCL slowdowns or hangs).
  - Writes with C(setpci) and the mask C(0x002c) only (C(setpci -s BDF ECAP_ACS+6.w=0000:002c)), so
    no other ACS Control bit, and no other bridge, is ever written. One C(setpci) process writes every
    bridge that changes; each one is read back from its sysfs C(config) file.
  - Bridges without an ACS capability are reported as skipped. When no bridge on any GPU path has ACS,
    RV(not_applicable) is true and nothing is written.
  - A bridge with a device bound to C(vfio-pci) below it is refused and reported as failed, because ACS
    redirect is what isolates a passthrough device; the other bridges are still set.
  - Refuses, before writing anything, when kernel lockdown (C(integrity) or C(confidentiality)) is active
    and a bridge would need a change.
  - One bridge that cannot be set never keeps the others from being set; the task fails at the end
    naming every failed bridge with its cause.
  - Firmware and the kernel set ACS redirect again at every boot, so the role re-applies this module's
    work at boot, or configures C(pci=disable_acs_redir=) (RV(kernel_arg)) through the command-line family.
  - Disabling ACS redirect gives up isolation between the devices behind the bridge. That matters for
    VM passthrough and multi-tenant nodes, not for a bare-metal inference node.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  mode:
    description:
      - V(disable_redirect) clears ReqRedir, CmpltRedir and EgressCtrl on the bridges of the GPU paths.
      - V(unmanaged) leaves ACS as it is and reads nothing.
    type: str
    default: disable_redirect
    choices: [disable_redirect, unmanaged]
  vendor:
    description:
      - PCI vendor ids in hex (V(10de) or V(0x10de)) of the devices whose paths are handled; any of them matches.
      - Every given selector must match. With no selector at all, NVIDIA GPUs are selected.
    type: list
    elements: str
  device:
    description:
      - PCI device id in hex (V(2bb5) or V(0x2bb5)).
    type: str
  class_prefixes:
    description:
      - PCI class prefixes in hex, each 2, 4 or 6 digits, for example V(["0300", "0302"]). Quote them in YAML.
    type: list
    elements: str
  bdfs:
    description:
      - PCI addresses of the devices, C(DDDD:BB:DD.F) or C(BB:DD.F). Every address must be present on the node.
    type: list
    elements: str
  allow_empty:
    description:
      - Succeed without changes when no device matches the selection. By default an empty selection fails.
    type: bool
    default: false
  preset_options:
    description:
      - The options whose value comes from a preset that sets them for every node (the role passes them). With
        V(mode) listed, a selection without ACS on its paths (RV(not_applicable=true)) is reported in the result
        only; otherwise it is also warned about, naming why.
    type: list
    elements: str
    choices: [mode, vendor, device, class_prefixes, bdfs]
    default: []
  journal:
    description:
      - Path, on the node, of the journal of original values. Before the first write the original ACS
        Control value of every bridge about to change is recorded there (family C(pcie_acs)).
      - Unset means no journal.
    type: str
  restore:
    description:
      - Write back the redirect bits of the originals recorded in O(journal), read them back and drop the
        restored entries. The selectors and O(mode) are not used.
    type: bool
    default: false
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.command_timeouts
  - gpunode.tuning.node.attributes
notes:
  - Needs root (the extended capabilities are only in the 4096-byte config space root reads) and the
    C(setpci) command from the C(pciutils) package.
seealso:
  - name: ACS registers (Linux pci_regs.h, PCI_EXT_CAP_ID_ACS and PCI_ACS_*)
    description: Layout of ACS Capability and ACS Control.
    link: https://github.com/torvalds/linux/blob/master/include/uapi/linux/pci_regs.h
"""

EXAMPLES = r"""
- name: Disable ACS redirect on the GPU paths, journaling the originals
  gpunode.tuning.pcie_acs:
    mode: disable_redirect
    journal: /var/lib/gpunode-tuning/journal.json

- name: Put back the ACS Control values recorded before tuning
  gpunode.tuning.pcie_acs:
    restore: true
    journal: /var/lib/gpunode-tuning/journal.json
"""

RETURN = r"""
bridges:
  description:
    - One entry per bridge on a selected GPU's path (with O(restore=true), per journaled bridge), sorted by address.
    - In check mode, RV(bridges[].acs_ctl_after) is the value that would be written.
  returned: always
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address of the bridge.
      type: str
      sample: "0000:40:01.1"
    port_type:
      description: PCI Express port type (root_port, upstream_port, downstream_port), null when unknown.
      type: str
      sample: root_port
    gpus:
      description: The selected devices below this bridge.
      type: list
      elements: str
      sample: ["0000:41:00.0"]
    acs:
      description: Whether the bridge has an ACS capability.
      type: bool
      sample: true
    acs_cap:
      description: ACS Capability register in hex, null without ACS.
      type: str
      sample: "0x005f"
    acs_ctl_before:
      description: ACS Control register before the task, in hex; null without ACS.
      type: str
      sample: "0x001d"
    acs_ctl_after:
      description: ACS Control register after the task, as read back (predicted in check mode).
      type: str
      sample: "0x0011"
    acs_ctl_decoded_before:
      description: RV(bridges[].acs_ctl_before) decoded as C(lspci -vvv) prints it.
      type: str
      sample: "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
    acs_ctl_decoded_after:
      description: RV(bridges[].acs_ctl_after) decoded.
      type: str
      sample: "SrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd+ EgressCtrl- DirectTrans-"
    vfio_devices:
      description: Devices below the bridge bound to vfio-pci.
      type: list
      elements: str
      sample: []
    changed:
      description: Whether ACS Control of this bridge changed (would change in check mode).
      type: bool
      sample: true
    skipped:
      description: Whether the bridge was left alone because it has no ACS capability (or is absent).
      type: bool
      sample: false
    failed:
      description: Whether the bridge could not be set (refused included).
      type: bool
      sample: false
    refused:
      description: Whether the bridge was refused because a device below it is bound to vfio-pci.
      type: bool
      sample: false
    reason:
      description: What was done, or why the bridge was skipped, refused or failed.
      type: str
      sample: set
gpus:
  description: The selected devices and the bridges on their paths, root port first.
  returned: always
  type: list
  elements: dict
  sample: [{"bdf": "0000:41:00.0", "bridges": ["0000:40:01.1"]}]
failed_bridges:
  description: Addresses of the bridges that could not be set; the task fails when it is not empty.
  returned: always
  type: list
  elements: str
  sample: []
not_applicable:
  description: True when no bridge on any selected device's path has an ACS capability.
  returned: always
  type: bool
  sample: false
kernel_arg:
  description:
    - The kernel argument that disables redirect on the same bridges at boot (C(pci=disable_acs_redir=BDF;BDF)),
      null when no bridge has ACS (or with O(restore=true)). Bridges above a vfio-pci device are left out.
    - Quote it in GRUB's configuration, where C(;) separates commands.
  returned: always
  type: str
  sample: "pci=disable_acs_redir=0000:40:01.1;0000:60:01.1"
lockdown:
  description: Kernel lockdown mode (V(none), V(integrity), V(confidentiality)); null when unknown.
  returned: always
  type: str
  sample: none
setpci_calls:
  description: Number of C(setpci) processes started (0 when nothing was written).
  returned: always
  type: int
  sample: 1
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs as acs


def build_module():
    """Build the AnsibleModule (tests use it without main())."""
    return AnsibleModule(argument_spec=acs.ARGUMENT_SPEC, supports_check_mode=True)


def main():
    calls.run_module(build_module(), acs.run)


if __name__ == "__main__":
    main()
