# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runtime kernel tunables: /proc/sys keys and transparent hugepage settings.

How it works and why: docs/dev/node-code.md, "families/tunables.py"."""

from __future__ import annotations

import errno
import os
import re
from typing import Any, Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import (
    JOURNAL_ARGUMENT_SPEC,
    Journal,
    open_node,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    Node,
    NodeError,
    bracket_choices,
    selected_bracket,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import (
    ValidationError,
    check_text,
    sysctl_key_components,
    sysctl_value,
)

NAME = "tunables"
PROC_SYS = "proc/sys"
THP_DIR = "sys/kernel/mm/transparent_hugepage"
THP_FILES = ("enabled", "defrag")
THP_PREFIX = "transparent_hugepage."

INT_RE = re.compile(r"^-?[0-9]+$")
READONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)
# Ranges the kernel documents for a sysctl, independent of the hardware: ``{name: (low, high, where)}``.
# A value outside is refused before anything is written (module and precheck alike); a live kernel
# refuses it too (EINVAL), but a simulated node or an older kernel's silent clamp would not say so.
SYSCTL_RANGES = {
    # "as a value between 0 and 200" (Linux 5.8 and later; 0-100 before, which such a kernel refuses).
    "vm.swappiness": (0, 200, "Documentation/admin-guide/sysctl/vm.rst, swappiness"),
    # "the result of ORing": 0 disabled, 1 NUMA_BALANCING_NORMAL, 2 NUMA_BALANCING_MEMORY_TIERING.
    "kernel.numa_balancing": (0, 3, "Documentation/admin-guide/sysctl/kernel.rst, numa_balancing"),
    # 0 heuristic, 1 always, 2 never overcommit.
    "vm.overcommit_memory": (0, 2, "Documentation/admin-guide/sysctl/vm.rst, overcommit_memory"),
    # "as a percentage of total available memory".
    "vm.dirty_ratio": (0, 100, "Documentation/admin-guide/sysctl/vm.rst, dirty_ratio"),
    "vm.dirty_background_ratio": (0, 100, "Documentation/admin-guide/sysctl/vm.rst, dirty_background_ratio"),
    # "This is value OR'ed together of" 1, 2 and 4.
    "vm.zone_reclaim_mode": (0, 7, "Documentation/admin-guide/sysctl/vm.rst, zone_reclaim_mode"),
    # 0, 1 or 2.
    "vm.panic_on_oom": (0, 2, "Documentation/admin-guide/sysctl/vm.rst, panic_on_oom"),
}
# The widest integer a sysctl takes: proc_doulongvec parses an unsigned long, proc_dointvec an int, and
# larger numbers are refused with EINVAL (kernel/sysctl.c); nothing beyond 64 bits is ever accepted.
SYSCTL_INT_MIN = -(2 ** 63)
SYSCTL_INT_MAX = 2 ** 64 - 1
# The transparent hugepage modes (Documentation/admin-guide/mm/transhuge.rst); the node's own files
# list the ones its kernel has, and the module checks the value against them too.
THP_MODES = {"enabled": ("always", "madvise", "never"),
             "defrag": ("always", "defer", "defer+madvise", "madvise", "never")}


class TunableError(ValidationError):
    """An input that cannot be applied; the message names the key and what is allowed."""


def normalize(value: Any) -> str:
    """Whitespace-normalized form of a value (multi-field sysctls such as tcp_rmem)."""
    return " ".join(str(value).split())


def value_string(value: Any) -> str:
    """A desired value as text: booleans as 1/0, lists joined with spaces."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return " ".join(value_string(v) for v in value)
    if value is None:
        raise TunableError("null is not a value")
    return str(value)


def key_components(key: str) -> list[str]:
    """Split a sysctl name into its file path components below /proc/sys."""
    try:
        return sysctl_key_components(key)
    except ValidationError as exc:
        raise TunableError(str(exc)) from None


def canonical_key(parts: Iterable[str]) -> str:
    """The dotted name of path components (a dot inside a component is written as '/')."""
    return ".".join(p.replace(".", "/") for p in parts)


def sysctl_path(parts: Iterable[str]) -> str:
    return "/".join([PROC_SYS] + list(parts))


def _inside(node, rel, base):
    """True when ``rel`` resolves (symlinks followed) inside ``base`` below the node root."""
    real = os.path.realpath(node.path(rel))
    top = os.path.realpath(node.path(base))
    return real == top or real.startswith(top + os.sep)


def read_raw(node, rel):
    """Current content of an attribute with surrounding whitespace stripped (NodeError if unreadable)."""
    full = node.path(rel)
    if not os.path.isfile(full):
        raise NodeError("%s does not exist" % full)
    try:
        with open(full, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise NodeError("cannot read %s: %s" % (full, exc.strerror or exc)) from exc


def range_problem(name: str, text: str) -> str | None:
    """Why the sysctl value ``text`` of ``name`` (canonical dotted name) is outside the range the kernel
    documents for it (``SYSCTL_RANGES``), or None (also for a key without a documented range)."""
    if name not in SYSCTL_RANGES:
        return None
    low, high, where = SYSCTL_RANGES[name]
    fields = text.split()
    if len(fields) == 1 and INT_RE.match(fields[0]) and low <= int(fields[0]) <= high:
        return None
    return "%s: value %r is not accepted: allowed is one integer %d-%d (%s)" % (name, text, low, high, where)


def value_problem(name: str, value: Any) -> str | None:
    """Why a desired sysctl value is refused without looking at the node (``sysctl_problems`` and
    ``plan_sysctl`` alike): not a value, text a drop-in could not hold, outside a documented range."""
    try:
        text = sysctl_value(name, value_string(value))
    except ValidationError as exc:
        return str(exc)
    return range_problem(name, text)


def validate_sysctl_value(key: str, desired: str, current: str) -> str:
    """Check a desired value (text) against the current one; return the text to write."""
    try:
        text = sysctl_value(key, desired)
    except ValidationError as exc:
        raise TunableError(str(exc)) from None
    cur_fields = current.split()
    if cur_fields and all(INT_RE.match(f) for f in cur_fields):
        fields = text.split()
        if not all(INT_RE.match(f) for f in fields):
            raise TunableError("%s: value %r is not accepted: allowed are integers (%d field%s, current %r)"
                               % (key, desired, len(cur_fields), "s" if len(cur_fields) > 1 else "",
                                  normalize(current)))
        if len(fields) > len(cur_fields):
            raise TunableError("%s: value %r has %d fields; allowed are at most %d integers (current %r)"
                               % (key, desired, len(fields), len(cur_fields), normalize(current)))
        if not all(SYSCTL_INT_MIN <= int(f) <= SYSCTL_INT_MAX for f in fields):
            raise TunableError("%s: value %r does not fit in 64 bits: the kernel refuses it (allowed are integers "
                               "%d to %d at most)" % (key, desired, SYSCTL_INT_MIN, SYSCTL_INT_MAX))
    return text


def missing_item(key: str, path: str, kind: str, desired: Any, problem: str) -> dict:
    """A planned item that cannot be applied on this node (it is reported failed, never written)."""
    return dict(key=key, path=path, kind=kind, desired=desired, before=None, before_raw=None, choices=None,
                problem=problem)


def plan_sysctl(node: Node, key: str, value: Any, seen: dict) -> dict:
    """Plan one sysctl."""
    parts = key_components(key)
    name = canonical_key(parts)
    if name in seen:
        raise TunableError("%s is given twice (as %r and %r)" % (name, seen[name], key))
    seen[name] = key
    problem = value_problem(name, value)  # the node-free rules: they hold whether or not the key exists here
    if problem:
        raise TunableError(problem)
    text = value_string(value)
    rel = sysctl_path(parts)
    if not _inside(node, rel, PROC_SYS) or not os.path.isfile(node.path(rel)):
        return missing_item(name, rel, "sysctl", normalize(text),
                            "sysctl key %s does not exist on this node (no %s); allowed are existing keys under "
                            "/proc/sys" % (key, "/" + rel))
    try:
        before_raw = read_raw(node, rel)
    except NodeError as exc:
        return missing_item(name, rel, "sysctl", normalize(text),
                            "%s cannot be read (%s): only readable keys can be tuned and restored; write-only "
                            "keys such as vm.drop_caches are actions, not tunables" % (key, exc))
    desired = validate_sysctl_value(name, text, before_raw)
    return dict(key=name, path=rel, kind="sysctl", desired=desired, before=normalize(before_raw),
                before_raw=before_raw, choices=None, problem=None)


def plan_thp(node: Node, name: str, value: Any) -> dict:
    """Plan one transparent hugepage setting (``problem`` set when THP is not available here)."""
    key = THP_PREFIX + name
    problem = thp_problem(name, value)
    if problem:
        raise TunableError(problem)
    desired = value_string(value).strip()
    rel = "%s/%s" % (THP_DIR, name)
    try:
        text = read_raw(node, rel)
    except NodeError as exc:
        return missing_item(key, rel, "thp", desired,
                            "%s: transparent hugepages are not available on this node (%s)" % (key, exc))
    choices = bracket_choices(text)
    current = selected_bracket(text) or (text if len(choices) == 1 else None)
    if desired not in choices:
        raise TunableError("%s: value %r is not accepted; allowed are %s" % (key, desired, ", ".join(choices)))
    return dict(key=key, path=rel, kind="thp", desired=desired, before=current, before_raw=current,
                choices=choices, problem=None)


def thp_problem(name: str, value: Any) -> str | None:
    """Why a transparent hugepage setting is refused without the node: not ``enabled``/``defrag``, or a mode
    the kernel does not document for it (``THP_MODES``)."""
    if name not in THP_FILES:
        return "%s is not a transparent hugepage setting; allowed are %s" % (name, ", ".join(THP_FILES))
    key = THP_PREFIX + name
    try:
        check_text("%s: value %r" % (key, value), value_string(value))
    except ValidationError as exc:
        return str(exc)
    if not isinstance(value, str) or value.strip() not in THP_MODES[name]:
        return "%s: value %r is not accepted; allowed are %s (Documentation/admin-guide/mm/transhuge.rst)" % (
            key, value, ", ".join(THP_MODES[name]))
    return None


def plan_items(node: Node, sysctl: dict | None = None, thp: dict | None = None) -> list[dict]:
    """Validate every requested item and return the plan, or raise ``TunableError`` listing all bad input."""
    items = []
    errors = []
    seen = {}
    for key, value in (sysctl or {}).items():
        try:
            items.append(plan_sysctl(node, key, value, seen))
        except ValidationError as exc:
            errors.append(str(exc))
    for name, value in (thp or {}).items():
        if value is None:
            continue
        try:
            items.append(plan_thp(node, name, value))
        except ValidationError as exc:
            errors.append(str(exc))
    if errors:
        raise TunableError("; ".join(errors))
    return items


def readonly_reason(node: Node, rel: str) -> str | None:
    """Why ``rel`` cannot be written (read-only mount), or None when it looks writable."""
    try:
        st = os.statvfs(os.path.dirname(node.path(rel)))
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return "%s is mounted read-only (a container?)" % ("/proc/sys" if rel.startswith(PROC_SYS) else "/sys")
    return None


def write_errno(exc: NodeError) -> int | None:
    """The errno of the OSError behind a ``NodeError`` raised by ``Node.write`` (or None)."""
    ctx = exc.__cause__ or exc.__context__
    return getattr(ctx, "errno", None)


def read_current(node: Node, item: dict) -> str | None:
    """Read back an item: normalized sysctl value or the selected THP choice."""
    text = read_raw(node, item["path"])
    if item["kind"] == "thp":
        choices = bracket_choices(text)
        return selected_bracket(text) or (text if len(choices) == 1 else None)
    return normalize(text)


def write_item(node: Node, item: dict, value: str) -> str | None:
    """Write one value and read it back; returns the value read."""
    if item["kind"] == "thp" and not node.is_live:
        data = " ".join("[%s]" % c if c == value else c for c in item["choices"]) + "\n"
    else:
        data = value + "\n"
    node.write(data, item["path"])
    return read_current(node, item)


def new_result(item: dict) -> dict:
    """The result of one item before anything is done; an item with a ``problem`` is failed already."""
    res = dict(key=item["key"], path="/" + item["path"], before=item["before"], after=item["before"],
               desired=item["desired"], changed=False, skipped=False, failed=False, reason=None)
    if item.get("problem"):
        res.update(failed=True, reason=item["problem"])
    return res


def failed_keys(results: dict) -> list[str]:
    return [k for k, r in results.items() if r["failed"]]


def applied_keys(results: dict) -> list[str]:
    """Keys whose value is (in check mode: would be) the desired one after the task."""
    return [k for k, r in results.items() if not r["failed"] and not r["skipped"] and r["after"] == r["desired"]]


def _sort_out(node, items, check_mode, skip_readonly):
    """First pass of ``apply``: results for every item and the items that need a write."""
    results = {}
    todo = []
    for item in items:
        res = results[item["key"]] = new_result(item)
        if res["failed"] or item["before"] == item["desired"]:
            continue
        reason = readonly_reason(node, item["path"])
        if reason and skip_readonly:
            res.update(skipped=True, reason=reason + "; skipped (skip_readonly)")
            continue
        if check_mode:
            res.update(changed=True, after=item["desired"])
            continue
        todo.append(item)
    return results, todo


def apply(node: Node, items: list[dict], journal: Journal | None = None, check_mode: bool = False,
          skip_readonly: bool = False) -> tuple[dict, list[str]]:
    """Apply planned items. Returns ``(results by key, list of failed keys)``."""
    results, todo = _sort_out(node, items, check_mode, skip_readonly)
    if not todo:
        return results, failed_keys(results)
    recorded = set()
    if journal is not None:
        for item in todo:
            if journal.record(NAME, item["key"], item["before_raw"]):
                recorded.add(item["key"])
        journal.save()
    for item in todo:
        res = results[item["key"]]
        value = item["desired"]
        try:
            after = write_item(node, item, value)
        except NodeError as exc:
            if skip_readonly and write_errno(exc) in READONLY_ERRNOS:
                res.update(skipped=True, reason="%s; skipped (skip_readonly)" % exc)
                if item["key"] in recorded:
                    journal.drop(NAME, item["key"])
            else:
                res.update(failed=True, reason=write_failure(item, value, exc))
            continue
        res["after"] = after
        if after == item["desired"]:
            res["changed"] = True
        else:
            res.update(failed=True, changed=after != item["before"],
                       reason="wrote %r but read back %r: the kernel did not take the value" % (value, after))
    if journal is not None:
        journal.save()
    return results, failed_keys(results)


def write_failure(item: dict, value: str, exc: NodeError) -> str:
    """The reason of a refused write; EINVAL is the kernel refusing the value itself (out of its range)."""
    if write_errno(exc) == errno.EINVAL:
        return "the kernel refused %s = %r (Invalid argument: a value outside what this kernel accepts for it): %s" % (
            item["key"], value, exc)
    return str(exc)


def run(call: contract.Call) -> dict:
    """The kernel_tunables module: validate every key and value, journal, write, read back; returns the result."""
    params = call.params
    node, journal = open_node(params)
    items = None
    try:
        if not params["restore"]:
            items = plan_items(node, params["sysctl"], params["transparent_hugepage"])
        problem = None
        if params["sysctl_file"]:  # the persistent flow's check of its drop-in
            from ansible_collections.gpunode.tuning.plugins.module_utils.families import tunables_plan

            problem = tunables_plan.sysctl_file_problem(node, params["sysctl_file"])
    except TunableError as exc:
        raise contract.FamilyError("invalid input, nothing was written: %s" % exc) from None
    if problem:
        raise contract.FamilyError("%s; nothing was written" % problem)
    try:
        if params["restore"]:
            from ansible_collections.gpunode.tuning.plugins.module_utils.families import tunables_restore

            results, failed = tunables_restore.restore(node, journal, check_mode=call.check_mode,
                                                       skip_readonly=params["skip_readonly"])
        else:
            results, failed = apply(node, items, journal=journal, check_mode=call.check_mode,
                                    skip_readonly=params["skip_readonly"])
    except NodeError as exc:
        raise contract.FamilyError(str(exc)) from None
    applied = applied_keys(results)
    out = dict(changed=any(r["changed"] for r in results.values()), settings=results, failed_keys=failed,
               applied_keys=applied)
    if call.diff:
        out["diff"] = dict(before={k: r["before"] for k, r in results.items()},
                           after={k: r["after"] for k, r in results.items()})
    if failed:
        raise contract.FamilyError(failure_message(results, failed, applied, restore=params["restore"]), out)
    return out


def failure_message(results: dict, failed: list, applied: list, restore: bool = False) -> str:
    """One message that names every failed key with its reason and says what was applied (or restored)."""
    causes = "; ".join("%s (%s)" % (k, results[k]["reason"]) for k in failed)
    if restore:
        return "these keys were not restored and stay in the journal for the next rollback: %s. Restored or " \
               "already original: %s" % (causes, ", ".join(applied) or "none")
    return "these keys were not applied: %s. Applied: %s" % (causes, ", ".join(applied) or "none")


# The options of its module (kernel_tunables): the flow module completes each family's options with it too.
ARGUMENT_SPEC = dict(
    sysctl=dict(type="dict", default={}),
    transparent_hugepage=dict(type="dict", options=dict(
        enabled=dict(type="str"),
        defrag=dict(type="str"),
    )),
    skip_readonly=dict(type="bool", default=False),
    sysctl_file=dict(type="str"),
    **JOURNAL_ARGUMENT_SPEC,
    **NODE_ARGUMENT_SPEC,
)


def summary(result: dict) -> str:
    return ", ".join("%s=%s" % (k, r.get("after")) for k, r in (result.get("settings") or {}).items())


def _plan_half():
    """The plan half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import tunables_plan
    return tunables_plan


def _verification():
    """The verification half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import tunables_verify
    return tunables_verify


PERSIST = contract.Concern("sysctl", ("numa_balancing", "sysctl", NAME), contract.later(_plan_half, "persist_sysctl"),
                           contract.later(_plan_half, "remove_sysctl"),
                           description="the sysctl drop-in (keys the node lacks are left out and fail the concern)")


DEFINITION = Family(
    name=NAME,
    titles={"numa_balancing": "NUMA balancing", "thp": "THP", "sysctl": "sysctl"},
    module="kernel_tunables",
    read=contract.later(_verification, "read"),
    read_options={"sysctls": contract.later(_verification, "facts_keys")},
    facts_options=contract.later(_verification, "facts_options"),
    facts_doc=contract.later(_verification, "FACTS_DOC"),
    run=run,
    evaluate=contract.later(_verification, "evaluate"),
    boot_sysctls=contract.later(_verification, "boot_sysctls"),
    boot=contract.later(_plan_half, "boot"),
    boot_key="thp",
    tags=("numa_balancing", "thp", "sysctl"),
    from_role=contract.later(_plan_half, "from_role"),
    runtime_options=contract.later(_plan_half, "runtime_options"),
    restore_options=contract.later(_plan_half, "restore_options"),
    argument_spec=ARGUMENT_SPEC,
    persist=PERSIST,
    summary=summary,
    items="settings",
    validate={key: contract.later(_plan_half, "%s_problems" % key) for key in ("numa_balancing", "thp", "sysctl")},
)
