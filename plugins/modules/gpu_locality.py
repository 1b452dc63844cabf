# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_locality
short_description: Write the GPU locality export (topology.json) that launchers read
version_added: 1.0.0
description:
  - Reads, from sysfs alone, each NVIDIA GPU's NUMA node, its CPUs, its host bridge, root port and PCIe
    switches, and the relation of every NIC (classes 0x0200 and 0x0207) and NVMe drive (0x010802) to it in the
    legend of C(nvidia-smi topo -m) (PIX, PXB, PHB, NODE, SYS), with the nearest NIC and NVMe drive per GPU;
    then writes that as JSON to O(path) (below O(root)) for programs that place inference workers.
  - GPUs are keyed by PCI address. Where C(nvidia-smi) answers (within 30 seconds), each GPU also gets
    nvidia-smi's index, which is PCI bus order; CUDA numbers GPUs the same way only with
    C(CUDA_DEVICE_ORDER=PCI_BUS_ID). On a simulated node only the node's own C(<root>/usr/bin/nvidia-smi) runs.
  - The document holds no volatile values (no IRQ affinity), so an unchanged node gives the same file and a
    rerun reports no change. The schema is in C(docs/gpu-locality.md) and C(docs/topology.schema.json).
  - The persistent flow of C(roles/tuning) runs this module; the boot unit refreshes the file at every boot
    (module_utils/families/gpu_locality.py's C(boot)), since PCI addresses and NUMA can change with the hardware.
    Verification reads the same facts (C(gpunode.tuning.tuning_info), section C(gpu_locality)).
author:
  - gpunode.tuning contributors (@gpunode)
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.attributes
options:
  path:
    description:
      - The export on the node, an absolute path below O(root); its directory is created when missing.
    type: str
    default: /etc/gpunode-tuning/topology.json
notes:
  - Nothing about the node is changed; only O(path) is written, by a temporary file and a rename, mode 0644.
seealso:
  - module: gpunode.tuning.tuning_info
"""

EXAMPLES = r"""
- name: Write /etc/gpunode-tuning/topology.json
  gpunode.tuning.gpu_locality:

- name: Show what would change, write nothing
  gpunode.tuning.gpu_locality:
    path: /etc/gpunode-tuning/topology.json
  check_mode: true
  diff: true
"""

RETURN = r"""
path:
  description: The export written (on the node, below O(root)).
  returned: always
  type: str
  sample: /etc/gpunode-tuning/topology.json
gpus:
  description: Number of GPUs in the export.
  returned: always
  type: int
  sample: 8
nics:
  description: Number of NICs (physical functions) in the export.
  returned: always
  type: int
  sample: 2
nvme:
  description: Number of NVMe drives in the export.
  returned: always
  type: int
  sample: 2
nvidia_smi:
  description: Whether nvidia-smi gave the GPUs' indexes (C(nvidia-smi answered)), or why not.
  returned: always
  type: str
  sample: nvidia-smi answered
msg:
  description: What was done, in words.
  returned: always
  type: str
  sample: /etc/gpunode-tuning/topology.json written (8 GPUs, 2 NICs, 2 NVMe drives)
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_locality


def build_module():
    return AnsibleModule(argument_spec=gpu_locality.ARGUMENT_SPEC, supports_check_mode=True)


def main():
    calls.run_module(build_module(), gpu_locality.run)


if __name__ == "__main__":
    main()
