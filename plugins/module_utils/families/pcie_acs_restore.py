# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pcie_acs family's restore half: the journaled originals and their bridges (pcie_acs with restore=true).

Imported by ``execute`` only when it restores, so that a run that applies does not compile it
(docs/dev/adding-a-family.md, "The restore half").
"""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import SYSFS_PCI_DEVICES, Node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import device_dir
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_acs import NAME, read_bridge


def journal_bridges(node: Node, originals: dict) -> tuple:
    """The journaled bridges as ``gpu_paths`` entries (restore needs no GPU selection), and the absent ones."""
    bridges, absent = {}, []
    for bdf in sorted(originals):
        if not os.path.isdir(node.path(SYSFS_PCI_DEVICES, bdf)):
            absent.append(bdf)
            continue
        path = device_dir(node, bdf)
        bridges[bdf] = dict(read_bridge(bdf, path), path=path, gpus=[], vfio=[])
    return {"bridges": bridges}, absent


def originals(journal) -> dict:
    originals = journal.entries(NAME)
    bad = {b: v for b, v in originals.items() if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0xFFFF}
    if bad:
        raise family.FamilyError("journal %s holds invalid ACSCtl originals %s (a 16-bit integer each); fix or remove "
                                 "those entries" % (journal.path, bad), {"changed": False})
    return originals
