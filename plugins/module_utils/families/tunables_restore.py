# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tunables family's restore half: put the journaled originals back (kernel_tunables with restore=true).

Imported by ``run`` only when it restores, so that a run that applies does not compile it
(docs/dev/adding-a-family.md, "The restore half").
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import Journal
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    Node,
    NodeError,
    bracket_choices,
    selected_bracket,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import ValidationError, check_text
from ansible_collections.gpunode.tuning.plugins.module_utils.families.tunables import (
    NAME,
    PROC_SYS,
    THP_DIR,
    THP_FILES,
    THP_PREFIX,
    TunableError,
    failed_keys,
    key_components,
    missing_item,
    new_result,
    normalize,
    read_raw,
    readonly_reason,
    sysctl_path,
    write_item,
)


def restore_item(node: Node, key: str, original: Any) -> dict:
    """The item that puts one journaled original back; ``problem`` says why it cannot be restored."""
    if key.startswith(THP_PREFIX):
        name = key[len(THP_PREFIX):]
        rel = "%s/%s" % (THP_DIR, name)
        if name not in THP_FILES:  # never build a path from a journal entry we did not write
            return missing_item(key, rel, "thp", original, "%s is not a transparent hugepage setting" % key)
        try:
            text = read_raw(node, rel)
        except NodeError as exc:
            return missing_item(key, rel, "thp", original, "%s: %s" % (key, exc))
        choices = bracket_choices(text)
        return dict(key=key, path=rel, kind="thp", desired=original, before_raw=None, choices=choices,
                    before=selected_bracket(text) or (text if len(choices) == 1 else None), problem=None)
    try:
        rel = sysctl_path(key_components(key))
    except TunableError as exc:
        return missing_item(key, PROC_SYS, "sysctl", original, str(exc))
    try:
        # The original is written back as recorded: a tab between fields (tcp_rmem) is what the
        # kernel showed, any other control character is not.
        check_text("journaled value of %s" % key, str(original).replace("\t", " "))
        before_raw = read_raw(node, rel)
    except (ValidationError, NodeError) as exc:
        return missing_item(key, rel, "sysctl", original, str(exc))
    return dict(key=key, path=rel, kind="sysctl", desired=original, before=normalize(before_raw),
                before_raw=before_raw, choices=None, problem=None)


def restore_items(node: Node, journal: Journal) -> list[dict]:
    """Items that put the journaled originals back, one per journal entry (sorted by key)."""
    return [restore_item(node, key, original) for key, original in sorted(journal.entries(NAME).items())]


def restore(node: Node, journal: Journal, check_mode: bool = False,
            skip_readonly: bool = False) -> tuple[dict, list[str]]:
    """Write the journaled originals back, read back, drop restored entries, save."""
    results = {}
    for item in restore_items(node, journal):
        res = results[item["key"]] = new_result(item)
        if res["failed"]:
            continue
        res["desired"] = normalize(item["desired"]) if item["kind"] == "sysctl" else item["desired"]
        if res["before"] == res["desired"]:
            if not check_mode:
                journal.drop(NAME, item["key"])
            continue
        reason = readonly_reason(node, item["path"])
        if reason and skip_readonly:
            res.update(skipped=True, reason=reason + "; skipped (skip_readonly)")
            continue
        if check_mode:
            res.update(changed=True, after=res["desired"])
            continue
        _restore_one(node, journal, item, res)
    journal.save(check_mode=check_mode)
    return results, failed_keys(results)


def _restore_one(node, journal, item, res):
    """Write one original back; drop its journal entry only when it reads back."""
    try:
        after = write_item(node, item, item["desired"])
    except NodeError as exc:
        res.update(failed=True, reason=str(exc))
        return
    res["after"] = after
    if after == res["desired"]:
        res["changed"] = True
        journal.drop(NAME, item["key"])
    else:
        res.update(failed=True, reason="wrote %r but read back %r" % (item["desired"], after))
