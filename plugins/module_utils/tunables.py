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
read back. Nothing here knows about Ansible.
"""

from __future__ import annotations

import errno
import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils.node import (
    NodeError,
    bracket_choices,
    selected_bracket,
)

FAMILY = "tunables"
PROC_SYS = "proc/sys"
THP_DIR = "sys/kernel/mm/transparent_hugepage"
THP_FILES = ("enabled", "defrag")
THP_PREFIX = "transparent_hugepage."

COMPONENT_RE = re.compile(r"^[A-Za-z0-9_:@+-][A-Za-z0-9_.:@+-]*$")
KEY_ALLOWED = ("a sysctl name under /proc/sys such as vm.swappiness or kernel/numa_balancing: components of "
               "letters, digits and _ - : @ +, separated by dots (or slashes); no '..', no leading '/'")
INT_RE = re.compile(r"^-?[0-9]+$")
READONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


class TunableError(ValueError):
    """An input that cannot be applied; the message names the key and what is allowed."""


def normalize(value):
    """Whitespace-normalized form of a value (multi-field sysctls such as tcp_rmem)."""
    return " ".join(str(value).split())


def value_string(value):
    """A desired value as text: booleans as 1/0, lists joined with spaces."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return " ".join(value_string(v) for v in value)
    if value is None:
        raise TunableError("null is not a value")
    return str(value)


def key_components(key):
    """Split a sysctl name into its file path components below /proc/sys.

    Raises ``TunableError`` for empty, absolute or traversing names.
    """
    if not isinstance(key, str) or not key or len(key) > 256:
        raise TunableError("sysctl key %r is invalid: allowed is %s" % (key, KEY_ALLOWED))
    if key.startswith(("/", ".")) or ".." in key or "\x00" in key:
        raise TunableError("sysctl key %r is invalid: allowed is %s" % (key, KEY_ALLOWED))
    first = min((i for i in (key.find("."), key.find("/")) if i >= 0), default=-1)
    if first >= 0 and key[first] == "/":
        parts = key.split("/")
    else:
        parts = [p.replace("/", ".") for p in key.split(".")]
    for part in parts:
        if not part or part in (".", "..") or not COMPONENT_RE.match(part):
            raise TunableError("sysctl key %r is invalid: allowed is %s" % (key, KEY_ALLOWED))
    return parts


def canonical_key(parts):
    """The dotted name of path components (a dot inside a component is written as '/')."""
    return ".".join(p.replace(".", "/") for p in parts)


def sysctl_path(parts):
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


def validate_sysctl_value(key, desired, current):
    """Check a desired value against the current one; return the text to write.

    Where every field of the current value is an integer, the desired value must be integers
    too, with no more fields than the current value has.
    """
    text = normalize(desired)
    if not text:
        raise TunableError("%s: an empty value is not allowed" % key)
    if any(ord(c) < 32 for c in str(desired) if c not in "\t\n "):
        raise TunableError("%s: value %r contains control characters" % (key, desired))
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


def plan_items(node, sysctl=None, thp=None):
    """Validate every requested item and return the plan, or raise ``TunableError`` listing all problems.

    Each item: ``{key, path, kind, desired, before, before_raw, choices}``. Nothing is written.
    """
    items = []
    errors = []
    seen = {}
    for key, value in (sysctl or {}).items():
        try:
            parts = key_components(key)
            name = canonical_key(parts)
            if name in seen:
                raise TunableError("%s is given twice (as %r and %r)" % (name, seen[name], key))
            seen[name] = key
            rel = sysctl_path(parts)
            if not _inside(node, rel, PROC_SYS) or not os.path.isfile(node.path(rel)):
                raise TunableError("sysctl key %s does not exist on this node (no %s); allowed are existing "
                                   "keys under /proc/sys" % (key, "/" + rel))
            try:
                before_raw = _read_raw(node, rel)
            except NodeError as exc:
                raise TunableError(
                    "%s cannot be read (%s): only readable keys can be tuned and restored; "
                    "write-only keys such as vm.drop_caches are actions, not tunables" % (key, exc)) from exc
            desired = validate_sysctl_value(name, value_string(value), before_raw)
            items.append(dict(key=name, path=rel, kind="sysctl", desired=desired, before=normalize(before_raw),
                              before_raw=before_raw, choices=None))
        except TunableError as exc:
            errors.append(str(exc))
    for name, value in (thp or {}).items():
        if value is None:
            continue
        key = THP_PREFIX + name
        try:
            if name not in THP_FILES:
                raise TunableError("%s is not a transparent hugepage setting; allowed are %s"
                                   % (name, ", ".join(THP_FILES)))
            rel = "%s/%s" % (THP_DIR, name)
            try:
                text = _read_raw(node, rel)
            except NodeError as exc:
                raise TunableError(
                    "%s: transparent hugepages are not available on this node (%s)" % (key, exc)) from exc
            choices = bracket_choices(text)
            current = selected_bracket(text) or (text if len(choices) == 1 else None)
            desired = value_string(value).strip()
            if desired not in choices:
                raise TunableError("%s: value %r is not accepted; allowed are %s"
                                   % (key, desired, ", ".join(choices)))
            items.append(dict(key=key, path=rel, kind="thp", desired=desired, before=current, before_raw=current,
                              choices=choices))
        except TunableError as exc:
            errors.append(str(exc))
    if errors:
        raise TunableError("; ".join(errors))
    return items


def readonly_reason(node, rel):
    """Why ``rel`` cannot be written (read-only mount), or None when it looks writable."""
    try:
        st = os.statvfs(os.path.dirname(node.path(rel)))
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return "%s is mounted read-only (a container?)" % ("/proc/sys" if rel.startswith(PROC_SYS) else "/sys")
    return None


def write_errno(exc):
    """The errno of the OSError behind a ``NodeError`` raised by ``Node.write`` (or None)."""
    ctx = exc.__cause__ or exc.__context__
    return getattr(ctx, "errno", None)


def read_current(node, item):
    """Read back an item: normalized sysctl value or the selected THP choice."""
    text = _read_raw(node, item["path"])
    if item["kind"] == "thp":
        choices = bracket_choices(text)
        return selected_bracket(text) or (text if len(choices) == 1 else None)
    return normalize(text)


def write_item(node, item, value):
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


def new_result(item):
    return dict(key=item["key"], path="/" + item["path"], before=item["before"], after=item["before"],
                desired=item["desired"], changed=False, skipped=False, failed=False, reason=None)


def apply(node, items, journal=None, check_mode=False, skip_readonly=False):
    """Apply planned items. Returns ``(results by key, list of failed keys)``.

    Originals are recorded in the journal (and it is saved) before the first write; an item
    whose value does not read back as desired is failed, the others are still applied.
    """
    results = {}
    todo = []
    for item in items:
        res = results[item["key"]] = new_result(item)
        if item["before"] == item["desired"]:
            continue
        reason = readonly_reason(node, item["path"])
        if reason and skip_readonly:
            res.update(skipped=True, reason=reason + "; skipped (skip_readonly)")
            continue
        if check_mode:
            res.update(changed=True, after=item["desired"])
            continue
        todo.append(item)
    if not todo:
        return results, [k for k, r in results.items() if r["failed"]]
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
    return results, [k for k, r in results.items() if r["failed"]]


def restore_items(node, journal):
    """Items that put the journaled originals back. Raises ``TunableError`` for unknown entries."""
    items = []
    errors = []
    for key, original in sorted(journal.entries(FAMILY).items()):
        if key.startswith(THP_PREFIX):
            name = key[len(THP_PREFIX):]
            rel = "%s/%s" % (THP_DIR, name)
            try:
                text = _read_raw(node, rel)
            except NodeError as exc:
                errors.append("%s: %s" % (key, exc))
                continue
            choices = bracket_choices(text)
            items.append(dict(key=key, path=rel, kind="thp", desired=original, before_raw=None, choices=choices,
                              before=selected_bracket(text) or (text if len(choices) == 1 else None)))
            continue
        try:
            rel = sysctl_path(key_components(key))
            before_raw = _read_raw(node, rel)
        except (TunableError, NodeError) as exc:
            errors.append("%s: %s" % (key, exc))
            continue
        items.append(dict(key=key, path=rel, kind="sysctl", desired=original, before=normalize(before_raw),
                          before_raw=before_raw, choices=None))
    if errors:
        raise TunableError("journaled tunables cannot be restored: " + "; ".join(errors))
    return items


def restore(node, journal, check_mode=False, skip_readonly=False):
    """Write the journaled originals back, read back, drop restored entries, save.

    The original text is written as recorded (a tab-separated tcp_rmem stays tab-separated).
    Returns ``(results by key, failed keys)``.
    """
    items = restore_items(node, journal)
    results = {}
    failed = []
    for item in items:
        res = results[item["key"]] = new_result(item)
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
        try:
            after = write_item(node, item, item["desired"])
        except NodeError as exc:
            res.update(failed=True, reason=str(exc))
            failed.append(item["key"])
            continue
        res["after"] = after
        if after == res["desired"]:
            res["changed"] = True
            journal.drop(FAMILY, item["key"])
        else:
            res.update(failed=True, reason="wrote %r but read back %r" % (item["desired"], after))
            failed.append(item["key"])
    journal.save(check_mode=check_mode)
    return results, failed
