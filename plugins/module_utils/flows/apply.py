# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several knob families in one module run on the node: each isolated, every failure reported.

How it works and why: docs/dev/node-code.md, "flows/apply.py".
"""

from __future__ import annotations

import traceback
from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, lock
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Call, FamilyError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import NODE_ARGUMENT_SPEC, Node
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import writers

# The options of tuning_apply (and of the rollout's tuning step, module tuning_rollout).
ARGUMENT_SPEC = dict(
    families=dict(type="list", elements="dict", required=True, options=dict(
        name=dict(type="str", required=True),
        options=dict(type="dict", default={}),
    )),
    journal=dict(type="str", default="/var/lib/gpunode-tuning/journal.json"),
    fail_on_error=dict(type="bool", default=True),
    lock_timeout=dict(type="float", default=lock.DEFAULT_TIMEOUT),
    **NODE_ARGUMENT_SPEC,
    **command.ARGUMENT_SPEC,
)


def run_families(requests: list, make_call: Callable[[Any, dict], Call]) -> dict:
    """``{family name: result}`` of each ``{"name", "options"}`` request, in the order given."""
    results = {}
    for request in requests:
        fam = registry.by_name(request["name"])
        try:
            results[fam.name] = fam.run(make_call(fam, dict(request.get("options") or {})))
        except FamilyError as exc:
            result = dict(exc.result)
            result.update(failed=True, msg=str(exc))
            results[fam.name] = result
        except Exception as exc:  # noqa: BLE001  (a bug in one family must not stop the others)
            results[fam.name] = {"failed": True, "changed": False,
                                 "msg": "%s: %s (a bug: please report it)" % (type(exc).__name__, exc),
                                 "exception": traceback.format_exc()}
    return results


def failures(results: dict) -> dict:
    """``{family name: message}`` of the failed results."""
    return {name: " ".join(str(r.get("msg") or "failed without a message").split())
            for name, r in results.items() if isinstance(r, dict) and r.get("failed")}


def diffs(results: dict) -> list:
    """Every family's diff, each headed with the family's name (Ansible shows a list of diffs)."""
    out = []
    for name, result in results.items():
        diff = result.get("diff") if isinstance(result, dict) else None
        for one in diff if isinstance(diff, list) else [diff] if diff else []:
            one = dict(one)
            one.setdefault("before_header", name)
            one.setdefault("after_header", name)
            out.append(one)
    return out


def _items(result: dict, fam) -> list:
    """The items of a family's result, under its ``Family.items`` key (none when it declares none)."""
    value = result.get(fam.items) if fam is not None and fam.items else None
    if isinstance(value, dict):
        return [dict(v, name=k) for k, v in value.items() if isinstance(v, dict)]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, dict)]
    return []


def _changed(item: dict) -> bool:
    return bool(item.get("changed") or item.get("cpus_changed"))


def summary(result: dict, fam=None) -> str:
    """One line of what a family's run did, for the flow's report (the family's own words where it has them)."""
    if result.get("failed"):
        return "failed: %s" % " ".join(str(result.get("msg") or "").split())
    if fam is not None and fam.summary is not None:
        return fam.summary(result)
    if result.get("supported") is False or result.get("not_applicable"):
        return "not applicable: %s" % (result.get("reason") or "nothing on this node to tune")
    items = _items(result, fam)
    if not items:
        return "changed" if result.get("changed") else "nothing to do"
    changed = [i for i in items if _changed(i)]
    skipped = [i for i in items if not _changed(i) and i.get("skipped")]
    line = "%d changed, %d already as desired" % (len(changed), len(items) - len(changed) - len(skipped))
    if skipped:
        line += ", %d skipped" % len(skipped)
    if result.get("reboot_required") and result.get("kernel_args"):
        line += "; needs %s and a reboot (--tags persistent)" % " ".join(result["kernel_args"])
    return line


def restored(result: dict, fam=None):
    """What a family's rollback restored: the items' names, "nothing journaled", or its failure."""
    if result.get("failed"):
        return "failed: %s" % " ".join(str(result.get("msg") or "").split())
    names = [str(i.get("bdf") or i.get("name") or i.get("key") or "?") for i in _items(result, fam) if _changed(i)]
    return names or "nothing journaled"


def _runnable(fam) -> bool:
    return fam.run is not None and fam.argument_spec is not None


def runnable_names() -> list:
    """Names of the families this module can run: those with a module (``run`` and its options)."""
    return [fam.name for fam in registry.FAMILIES if _runnable(fam)]


def not_runnable(names) -> list:
    """The names among ``names`` that are no family this module can run (only those named are imported)."""
    return [name for name in names if name not in registry.NAMES or not _runnable(registry.by_name(name))]


def run(module, make_call: Callable[[Any, dict], Call]) -> dict:
    """tuning_apply's work on ``module.params`` (ARGUMENT_SPEC's): every requested family under the node's lock."""
    params = module.params
    unknown = not_runnable([r["name"] for r in params["families"]])
    if unknown:
        raise ValueError("families must be among: %s; got: %s" % (", ".join(runnable_names()), ", ".join(unknown)))
    restore = all((r.get("options") or {}).get("restore") for r in params["families"])
    node = Node.open(params["root"])
    with writers.writing(node, params["journal"], "rollback" if restore else "runtime", module.check_mode,
                         timeout=params["lock_timeout"]) as held:
        # A directory a family's write creates is journaled, so that rollback removes it (flows/writers.py).
        results = run_families(params["families"],
                               lambda fam, options: make_call(fam, options)._replace(on_created=held.note_created))
    lines = {n: (restored if restore else summary)(r, registry.by_name(n)) for n, r in results.items()}
    out = dict(changed=any(r.get("changed") for r in results.values()), families=results,
               failed_families=failures(results), summary=lines)
    if module._diff:
        out["diff"] = diffs(results)
    return out
