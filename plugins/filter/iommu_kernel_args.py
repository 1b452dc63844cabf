# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side view of the IOMMU mode -> kernel argument mapping of module_utils/iommu.py.

The persistent entry point configures ``needed`` through the command-line family, the rollback
removes ``removable``; verification judges with the same mapping, so none of them can disagree.
Documented in iommu_kernel_args.yml next to this file.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.module_utils import iommu


def iommu_kernel_args(mode, cpu_vendor=None, removable=False):
    """The kernel arguments of an IOMMU ``mode``: this node's (``needed``), or any node's (``removable``)."""
    if mode in (None, ""):
        return []
    if mode not in iommu.MODES:
        raise AnsibleFilterError("gpunode.tuning.iommu_kernel_args: mode must be one of: %s (got %r)"
                                 % (", ".join(iommu.MODES), mode))
    args = iommu.iommu_kernel_args(mode, cpu_vendor or None)
    return list(args.removable if removable else args.needed)


class FilterModule:
    """gpunode.tuning IOMMU filters."""

    def filters(self):
        return {"iommu_kernel_args": iommu_kernel_args}
