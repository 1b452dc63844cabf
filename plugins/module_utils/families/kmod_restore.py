# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kmod family's restore half: unload the modules the journal records as loaded by this collection
(kmod_optional with restore=true).

Imported by ``run`` only when it restores, so that a run that applies does not compile it
(docs/dev/adding-a-family.md, "The restore half").
"""

from __future__ import annotations

from typing import Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import Journal
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import ValidationError, kmod_name
from ansible_collections.gpunode.tuning.plugins.module_utils.families.kmod import NAME, Runner, new_result, plan, unload


def plan_restore(node: Node, req: dict) -> tuple[dict, str | None]:
    """Plan the unload of a journaled module; a name that fails validation is never passed on."""
    try:
        kmod_name(req["name"])
    except ValidationError as exc:
        res = new_result(dict(req, name=str(req["name"])))
        res.update(reason_class="invalid_name", message="journal entry not restored: %s" % exc)
        return res, None
    return plan(node, req)


def restore(node: Node, journal: Journal, run: Runner, find_modprobe: Callable[[], str],
            check_mode: bool = False) -> list[dict]:
    """Unload the modules the journal records as loaded by this collection."""
    entries = journal.entries(NAME)
    planned = []
    for name in sorted(entries):
        req = {"name": name, "state": "absent", "params": {}, "required": True}
        planned.append((req,) + plan_restore(node, req))
    if not check_mode and any(action for _req, _res, action in planned):
        modprobe = find_modprobe()
    results = []
    for req, res, action in planned:
        if check_mode:
            results.append(res)
            continue
        if action == "unload":
            unload(node, req, res, run, modprobe)
            if res["changed"]:
                journal.drop(NAME, req["name"])
        elif res["reason_class"] is None:
            journal.drop(NAME, req["name"])  # already gone: nothing to undo
        results.append(res)
    journal.save(check_mode=check_mode)
    return results
