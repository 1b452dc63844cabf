# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runtime kernel tunables: /proc/sys keys and transparent hugepage settings.

Keys are sysctl names. As in sysctl(8), a name whose first separator is a dot is dotted
(``net.ipv4.conf.eth0/100.rp_filter``: a ``/`` inside a component stands for a dot in the
file name); one whose first separator is a slash is a path below /proc/sys. Transparent
hugepage settings are the multiple-choice files ``enabled`` and ``defrag`` under
/sys/kernel/mm/transparent_hugepage, named ``transparent_hugepage.enabled`` / ``.defrag`` in
results and in the journal.

The flow is validate (every key and value, nothing written) -> plan -> journal -> write ->
read back; ``run`` is the kernel_tunables module's whole flow. Nothing here knows about Ansible.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any, Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.family import Family, same, setting
from ansible_collections.gpunode.tuning.plugins.module_utils.journal import Journal, open_node
from ansible_collections.gpunode.tuning.plugins.module_utils.node import (
    Node,
    NodeError,
    bracket_choices,
    selected_bracket,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.validate import (
    SYSCTL_KEY_ALLOWED,
    ValidationError,
    absolute_path,
    check_text,
    sysctl_key_components,
    sysctl_value,
    write_problem,
)

FAMILY = "tunables"
PROC_SYS = "proc/sys"
THP_DIR = "sys/kernel/mm/transparent_hugepage"
THP_FILES = ("enabled", "defrag")
THP_PREFIX = "transparent_hugepage."

KEY_ALLOWED = SYSCTL_KEY_ALLOWED
INT_RE = re.compile(r"^-?[0-9]+$")
READONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


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
    """Split a sysctl name into its file path components below /proc/sys.

    Raises ``TunableError`` for names outside the sysctl key grammar (validate.py): empty,
    absolute, traversing, option-like or holding control characters.
    """
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


def _read_raw(node, rel):
    """Current content of an attribute with surrounding whitespace stripped (NodeError if unreadable)."""
    full = node.path(rel)
    if not os.path.isfile(full):
        raise NodeError("%s does not exist" % full)
    try:
        with open(full, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise NodeError("cannot read %s: %s" % (full, exc.strerror or exc)) from exc


def validate_sysctl_value(key: str, desired: str, current: str) -> str:
    """Check a desired value (text) against the current one; return the text to write.

    The text check is the one the persistent drop-in gets too (``validate.sysctl_value``: no
    control characters, no line breaks, no option-like leading '-'). Where every field of the
    current value is an integer, the desired value must be integers too, with no more fields
    than the current value has.
    """
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
    return text


def missing_item(key: str, path: str, kind: str, desired: Any, problem: str) -> dict:
    """A planned item that cannot be applied on this node (it is reported failed, never written)."""
    return dict(key=key, path=path, kind=kind, desired=desired, before=None, before_raw=None, choices=None,
                problem=problem)


def plan_sysctl(node: Node, key: str, value: Any, seen: dict) -> dict:
    """Plan one sysctl. Raises ``TunableError`` for bad input; a key missing on this node is an item
    with ``problem`` set, so that the other keys are still applied."""
    parts = key_components(key)
    name = canonical_key(parts)
    if name in seen:
        raise TunableError("%s is given twice (as %r and %r)" % (name, seen[name], key))
    seen[name] = key
    text = value_string(value)
    rel = sysctl_path(parts)
    if not _inside(node, rel, PROC_SYS) or not os.path.isfile(node.path(rel)):
        try:  # the text checks hold whether or not the key exists here
            sysctl_value(name, text)
        except ValidationError as exc:
            raise TunableError(str(exc)) from None
        return missing_item(name, rel, "sysctl", normalize(text),
                            "sysctl key %s does not exist on this node (no %s); allowed are existing keys under "
                            "/proc/sys" % (key, "/" + rel))
    try:
        before_raw = _read_raw(node, rel)
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
    if name not in THP_FILES:
        raise TunableError("%s is not a transparent hugepage setting; allowed are %s" % (name, ", ".join(THP_FILES)))
    desired = check_text("%s: value %r" % (key, value), value_string(value)).strip()
    rel = "%s/%s" % (THP_DIR, name)
    try:
        text = _read_raw(node, rel)
    except NodeError as exc:
        return missing_item(key, rel, "thp", desired,
                            "%s: transparent hugepages are not available on this node (%s)" % (key, exc))
    choices = bracket_choices(text)
    current = selected_bracket(text) or (text if len(choices) == 1 else None)
    if desired not in choices:
        raise TunableError("%s: value %r is not accepted; allowed are %s" % (key, desired, ", ".join(choices)))
    return dict(key=key, path=rel, kind="thp", desired=desired, before=current, before_raw=current,
                choices=choices, problem=None)


def plan_items(node: Node, sysctl: dict | None = None, thp: dict | None = None) -> list[dict]:
    """Validate every requested item and return the plan, or raise ``TunableError`` listing all bad input.

    Each item: ``{key, path, kind, desired, before, before_raw, choices, problem}``. ``problem``
    is set for a key this node does not have: that item fails alone, the others are applied.
    Nothing is written.
    """
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


def sysctl_file_problem(node: Node, path: str) -> str | None:
    """Why the sysctl drop-in ``path`` (absolute on the node) could not be written, or None.

    Raises ``TunableError`` for a path that is not a plain absolute path.
    """
    try:
        absolute_path(path)
    except ValidationError as exc:
        raise TunableError("sysctl_file: %s" % exc) from None
    problem = write_problem(node.path(path))
    if problem:
        return "the sysctl drop-in %s cannot be written: %s" % (node.path(path), problem)
    return None


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
    text = _read_raw(node, item["path"])
    if item["kind"] == "thp":
        choices = bracket_choices(text)
        return selected_bracket(text) or (text if len(choices) == 1 else None)
    return normalize(text)


def write_item(node: Node, item: dict, value: str) -> str | None:
    """Write one value and read it back; returns the value read.

    A simulated node has no kernel behind its files, so for a multiple-choice file the choice
    list is written the way the kernel would show it after the write (``always [madvise] never``);
    on a live node the choice alone is written.
    """
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
    """Apply planned items. Returns ``(results by key, list of failed keys)``.

    Originals are recorded in the journal (and it is saved) before the first write; an item
    that cannot be applied here (``problem``) or whose value does not read back as desired is
    failed, the others are still applied.
    """
    results, todo = _sort_out(node, items, check_mode, skip_readonly)
    if not todo:
        return results, failed_keys(results)
    recorded = set()
    if journal is not None:
        for item in todo:
            if journal.record(FAMILY, item["key"], item["before_raw"]):
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
                    journal.drop(FAMILY, item["key"])
            else:
                res.update(failed=True, reason=str(exc))
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


def restore_item(node: Node, key: str, original: Any) -> dict:
    """The item that puts one journaled original back; ``problem`` says why it cannot be restored."""
    if key.startswith(THP_PREFIX):
        name = key[len(THP_PREFIX):]
        rel = "%s/%s" % (THP_DIR, name)
        if name not in THP_FILES:  # never build a path from a journal entry we did not write
            return missing_item(key, rel, "thp", original, "%s is not a transparent hugepage setting" % key)
        try:
            text = _read_raw(node, rel)
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
        before_raw = _read_raw(node, rel)
    except (ValidationError, NodeError) as exc:
        return missing_item(key, rel, "sysctl", original, str(exc))
    return dict(key=key, path=rel, kind="sysctl", desired=original, before=normalize(before_raw),
                before_raw=before_raw, choices=None, problem=None)


def restore_items(node: Node, journal: Journal) -> list[dict]:
    """Items that put the journaled originals back, one per journal entry (sorted by key)."""
    return [restore_item(node, key, original) for key, original in sorted(journal.entries(FAMILY).items())]


def restore(node: Node, journal: Journal, check_mode: bool = False,
            skip_readonly: bool = False) -> tuple[dict, list[str]]:
    """Write the journaled originals back, read back, drop restored entries, save.

    The original text is written as recorded (a tab-separated tcp_rmem stays tab-separated). An
    entry that cannot be restored is failed and stays in the journal for the next attempt; the
    others are restored. Returns ``(results by key, failed keys)``.
    """
    results = {}
    for item in restore_items(node, journal):
        res = results[item["key"]] = new_result(item)
        if res["failed"]:
            continue
        res["desired"] = normalize(item["desired"]) if item["kind"] == "sysctl" else item["desired"]
        if res["before"] == res["desired"]:
            if not check_mode:
                journal.drop(FAMILY, item["key"])
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
        journal.drop(FAMILY, item["key"])
    else:
        res.update(failed=True, reason="wrote %r but read back %r" % (item["desired"], after))


def run(call: contract.Call) -> dict:
    """The kernel_tunables module: validate every key and value, journal, write, read back; returns the result.

    Raises FamilyError on bad input (nothing written) and, after every other key was applied or
    restored, naming each key that was not with its reason (the full result goes with it).
    """
    params = call.params
    node, journal = open_node(params)
    items = None
    try:
        if not params["restore"]:
            items = plan_items(node, params["sysctl"], params["transparent_hugepage"])
        problem = sysctl_file_problem(node, params["sysctl_file"]) if params["sysctl_file"] else None
    except TunableError as exc:
        raise contract.FamilyError("invalid input, nothing was written: %s" % exc) from None
    if problem:
        raise contract.FamilyError("%s; nothing was written" % problem)
    try:
        if params["restore"]:
            results, failed = restore(node, journal, check_mode=call.check_mode, skip_readonly=params["skip_readonly"])
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

# --- verification and boot: the rows of this family's settings, and its re-apply at boot ---


# The directories systemd-sysctl and `sysctl --system` read at boot, in precedence order: a file name
# found in an earlier one hides the same name in the later ones; the files apply sorted by name, and
# /etc/sysctl.conf after all of them (procps; Debian links it as /etc/sysctl.d/99-sysctl.conf too).
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
SYSCTL_CONF = "/etc/sysctl.conf"


def sysctl_load_order(listing: dict) -> list:
    """The sysctl files a boot applies, first to last, from ``{directory: [file names]}`` (``SYSCTL_DIRS``).

    Only ``*.conf`` names count; a name is taken from the first directory of ``SYSCTL_DIRS`` that
    has it; the result is sorted by file name, then ``SYSCTL_CONF`` when ``listing`` holds it
    (``{"/etc": ["sysctl.conf"]}``).
    """
    chosen: dict = {}
    for directory in SYSCTL_DIRS:
        for name in listing.get(directory) or []:
            if name.endswith(".conf") and name not in chosen:
                chosen[name] = "%s/%s" % (directory, name)
    order = [chosen[name] for name in sorted(chosen)]
    if os.path.basename(SYSCTL_CONF) in (listing.get(os.path.dirname(SYSCTL_CONF)) or []):
        order.append(SYSCTL_CONF)
    return order


def sysctl_overrides(files: list, ours: str, wanted: dict) -> dict:
    """``{key: {"file", "value"}}``: the wanted keys whose last setting at boot is another file's, with another value.

    ``files``: ``[(path, parsed {key: value})]`` in load order (``sysctl_load_order``, each parsed
    with ``verification.parse_sysctl_conf``); ``ours``: our drop-in's path; ``wanted``: key ->
    desired value. A file that sets a key to the desired value overrides nothing.
    """
    last: dict = {}
    for path, values in files:
        for key in wanted:
            if key in values:
                last[key] = (path, values[key])
    return {key: {"file": path, "value": value} for key, (path, value) in sorted(last.items())
            if path != ours and not same(value, wanted[key])}


def _override_reason(key, want, running, over):
    """Why a key is or will be drifted because a later sysctl file sets it."""
    if same(running, want):
        return ("applied now, but %s sets %s = %s after this collection's drop-in: it wins at the next boot"
                % (over["file"], key, over["value"]))
    return "%s sets %s = %s after this collection's drop-in, and wins at boot" % (over["file"], key, over["value"])


def _sysctl_setting(family, key, want, running, ctx):
    persisted = None if ctx.sysctl_persisted is None else ctx.sysctl_persisted.get(key)
    if running is None:
        return setting(family, key, want, None, "not_applicable",
                       "this kernel has no %s (/proc/sys/%s)" % (key, key.replace(".", "/")), persisted)
    over = (getattr(ctx, "sysctl_overrides", None) or {}).get(key)
    if same(running, want):
        row = setting(family, key, want, running, "applied", _override_reason(key, want, running, over) if over
                      else "", persisted)
    else:
        why = ""
        if over:
            why = _override_reason(key, want, running, over)
        elif persisted is not None and same(persisted, want):
            why = "the drop-in sets %s at boot, but the running value differs (changed since)" % want
        row = setting(family, key, want, running, "drifted", why, persisted)
    if over:
        row["cause"] = {"kind": "sysctl_override", "file": over["file"], "value": over["value"]}
    return row


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """NUMA balancing, transparent hugepages and the other sysctls (the desired state's keys of those names)."""
    out = []
    sysctl = facts.get("sysctl") or {}
    if desired.get("numa_balancing") is not None:
        running = (facts.get("memory") or {}).get("numa_balancing")
        if running is None:
            running = sysctl.get("kernel.numa_balancing")
        out.append(_sysctl_setting("numa_balancing", "kernel.numa_balancing", desired["numa_balancing"], running, ctx))
    thp = (facts.get("memory") or {}).get("thp") or {}
    for key, want in sorted((desired.get("thp") or {}).items(), key=lambda kv: kv[0] != "enabled"):
        if want in (None, ""):
            continue
        running = thp.get(key)
        persisted = ctx.boot_persisted(want)
        if running is None:
            out.append(setting("thp", key, want, None, "not_applicable",
                               "no transparent hugepages (/sys/kernel/mm/transparent_hugepage/%s)" % key, persisted))
        else:
            out.append(setting("thp", key, want, running, "applied" if running == want else "drifted", "", persisted))
    for key, want in sorted((desired.get("sysctl") or {}).items()):
        if key == "kernel.numa_balancing" and desired.get("numa_balancing") is not None:
            continue
        out.append(_sysctl_setting("sysctl", key, want, sysctl.get(key), ctx))
    return out


def boot(node: Node, want: dict) -> tuple[bool, str]:
    """kernel_tunables' plan and writes of the transparent hugepage settings, without a journal."""
    items = plan_items(node, thp=want)
    results, failed = apply(node, items)
    if failed:
        return False, "; ".join("%s: %s" % (k, results[k]["reason"]) for k in failed)
    return True, ", ".join("%s=%s%s" % (k, r["after"], " (changed)" if r["changed"] else "")
                           for k, r in sorted(results.items()))


DEFINITION = Family(name=FAMILY, titles={"numa_balancing": "NUMA balancing", "thp": "THP", "sysctl": "sysctl"},
                    module="kernel_tunables", run=run, evaluate=evaluate, boot=boot, boot_key="thp")
