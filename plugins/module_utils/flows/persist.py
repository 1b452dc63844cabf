# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Persistent tuning on the node: the files of ours, and the concerns that write or remove them.

The role's persistent flow and its rollback are one task each (action tuning_flow) and one module
run on the node (tuning_persist). A *concern* is one thing that survives a reboot: the sysctl
drop-in, the module drop-ins, the kernel command line (with the arguments other families need:
``Family.kernel_args``), the boot unit and the udev rule (boot.py), the guard. Each family declares
its concern in the registry (``Family.persist``); each concern runs isolated, so one that fails
stops none of the others, and the run reports every failure at the end.

Files are written whole (a temporary file in the same directory, then rename), only when their
content or mode differs, and nothing at all in check mode. Plain Python, no Ansible import.
"""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import FamilyError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.persistence import (
    NodeFiles,
    PersistCall,
    as_role_options,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families


def persist_call(node, call, desired: dict, settings: dict, make_call: Callable[..., Any]) -> PersistCall:
    """A concern's PersistCall, with fresh NodeFiles and the families' runs bound to the registry."""
    pc = None

    def run(name, options, check_mode=None):
        return run_family(pc, name, options, check_mode)

    def kernel_args(remove=False):
        return family_kernel_args(pc, remove)

    pc = PersistCall(node=node, call=call, desired=desired, settings=settings,
                     files=NodeFiles(node, call.check_mode, call.diff), make_call=make_call,
                     run_family=run, family_kernel_args=kernel_args, unfit={})
    return pc


def run_family(pc: PersistCall, name: str, options: dict, check_mode: bool | None = None) -> dict:
    """A family's ``run`` with these options (check mode: the module's, or forced); FamilyError as it raises."""
    fam = registry.by_name(name)
    call = pc.make_call(fam, as_role_options(fam, options), check_mode)

    def created(full_paths):  # the family's new directories, journaled as the concern's own files' are (NodeFiles)
        if pc.files.on_created is not None:
            pc.files.on_created(full_paths)
    return fam.run(call._replace(on_created=created))


def family_kernel_args(pc: PersistCall, remove: bool = False) -> list:
    """The kernel arguments every family asks for (``Family.kernel_args``), or may have added (``remove``)."""
    out = []
    for fam in registry.FAMILIES:
        if fam.kernel_args is not None:
            out += [a for a in fam.kernel_args(pc, remove) if a not in out]
    return out


def concern_line(result: dict) -> str:
    """One line of what a concern did, for the flow's report."""
    if result.get("failed"):
        return "failed: %s" % " ".join(str(result.get("msg") or "").split())
    if result.get("skipped"):
        return "skipped: %s" % result.get("reason", "")
    files = result.get("files") or {}
    return ", ".join("%s %s" % (path, what) for path, what in files.items()) or "unchanged"


def unfit_line(unfit: dict) -> str:
    """What the kernel command line left out because the node cannot take it (``PersistCall.unfit``)."""
    return "; ".join("not rebooted for %s (the node cannot take it): %s" % kv for kv in sorted(unfit.items()))


def run_concerns(concerns: list, make_pc: Callable[[], PersistCall], remove: bool = False) -> dict:
    """``{concern name: result}``: each concern persisted (or removed), each isolated from the others."""
    results = {}
    for concern in concerns:
        pc = make_pc()
        try:
            result = (concern.remove if remove else concern.persist)(pc)
            result.setdefault("changed", bool(pc.files.changes))
        except FamilyError as exc:
            result = dict(exc.result, failed=True, msg=str(exc), changed=bool(pc.files.changes))
        except Exception as exc:  # noqa: BLE001  (a bug in one concern must not stop the others)
            result = {"failed": True, "changed": bool(pc.files.changes),
                      "msg": "%s: %s (a bug: please report it)" % (type(exc).__name__, exc)}
        result["files"] = dict(pc.files.changes)
        result.setdefault("summary", concern_line(result))
        if pc.unfit:
            result["not_rebooted_for"] = dict(pc.unfit)
            result["summary"] += "; " + unfit_line(pc.unfit)
        if pc.files.diffs:
            result["diff"] = list(pc.files.diffs)
        results[concern.name] = result
    return results


def concerns() -> list:
    """Every concern, in the order the persistent flow runs them: the families' (registry order), boot's, the guard.

    Rollback removes them in the reverse order (the guard stopped first, the udev rule before the runner).
    """
    from ansible_collections.gpunode.tuning.plugins.module_utils import registry
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot, guard_files

    arg_tags = tuple(t for fam in registry.FAMILIES if fam.kernel_args is not None or fam.reboot_only
                     for t in all_families.selecting_tags(fam))
    out = [fam.persist for fam in registry.FAMILIES if fam.persist is not None]
    out = [c._replace(tags=tuple(sorted(set(c.tags + arg_tags)))) if c.kernel_args else c for c in out]
    return out + boot.concerns() + [guard_files.CONCERN]
