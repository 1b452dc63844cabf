# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pcie_mrrs family's restore half: the journaled originals and their devices (setpci_mrrs with restore=true).

Imported by ``run_mrrs`` only when it restores, so that a run that applies does not compile it
(docs/dev/adding-a-family.md, "The restore half").
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import MRRS_CHOICES, list_devices
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_mrrs import NAME, MrrsError


def _absent_result(bdf):
    return {"bdf": bdf, "vendor": None, "device": None, "class": None, "numa_node": None, "mps": None,
            "mrrs_before": None, "mrrs_after": None, "changed": False, "skipped": True, "failed": False,
            "reason": "recorded in the journal but not present on the node; journal entry kept"}


def restore_wanted(node, journal, base):
    """The journal's originals and the devices to restore; absent devices are reported skipped."""
    originals = journal.entries(NAME)
    bad = {b: v for b, v in originals.items() if v not in MRRS_CHOICES}
    if bad:
        raise MrrsError("journal %s holds invalid MRRS originals %s (allowed %s); fix or remove those entries"
                        % (journal.path, bad, ", ".join(map(str, MRRS_CHOICES))), base)
    by_bdf = {d["bdf"]: d for d in list_devices(node)}
    for bdf in sorted(set(originals) - set(by_bdf)):
        base["devices"].append(_absent_result(bdf))
        base["warnings"].append("%s: %s" % (bdf, base["devices"][-1]["reason"]))
    return originals, [by_bdf[b] for b in sorted(originals) if b in by_bdf]
