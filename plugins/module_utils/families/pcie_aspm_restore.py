# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pcie_aspm family's restore half: the journaled policy and link attributes as items to write back.

Imported by ``execute`` only when it restores, so that a run that applies does not compile it
(docs/dev/adding-a-family.md, "The restore half").
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, read_small
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_aspm import (
    ATTRS,
    KEY_POLICY,
    NAME,
    POLICY_FILE,
    attr_path,
    parse_policy,
    plan_item,
)


def restore_items(node: Node, journal: Any) -> list:
    """The journaled originals as items: the policy first, then the links, L1 before its substates."""
    originals = journal.entries(NAME) if journal is not None else {}
    items = []
    if KEY_POLICY in originals:
        items.append(plan_item(KEY_POLICY, POLICY_FILE, parse_policy(read_small(node.path(POLICY_FILE)))["current"],
                               originals[KEY_POLICY]))
    order = {a: i for i, a in enumerate(ATTRS)}
    for key in sorted((k for k in originals if k != KEY_POLICY), key=lambda k: (k.split("/")[0],
                                                                                order.get(k.split("/")[-1], 9))):
        bdf, _sep, attr = key.partition("/")
        path = attr_path(bdf, attr)
        text = read_small(node.path(path))
        if text is None or attr not in ATTRS:
            item = plan_item(key, path, None, originals[key])
            item.update(changed=False, skipped=True, reason="recorded in the journal but not on the node; kept")
            items.append(item)
            continue
        items.append(plan_item(key, path, int(text.strip()) if text.strip() in ("0", "1") else text.strip(),
                               originals[key]))
    return items
