# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Persistent tuning on the node: the files of ours, and the concerns that write or remove them.

The role's persistent flow and its rollback are one task each (action tuning_flow) and one module
run on the node (tuning_persist). A *concern* is one thing that survives a reboot: the sysctl
drop-in (tunables), the module drop-ins (kmod), the kernel command line (cmdline, with the
arguments other families need), the boot unit and the udev rule (boot.py). Each family declares
its concern in the registry (``Family.persist``); each concern runs isolated, so one that fails
stops none of the others, and the run reports every failure at the end.

Files are written whole (a temporary file in the same directory, then rename), only when their
content or mode differs, and nothing at all in check mode. Plain Python, no Ansible import.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Callable, NamedTuple

from ansible_collections.gpunode.tuning.plugins.module_utils import report_files
from ansible_collections.gpunode.tuning.plugins.module_utils.family import Call, FamilyError, as_role_options
from ansible_collections.gpunode.tuning.plugins.module_utils.node import Node

HEADER = "# Managed by gpunode.tuning (role tuning); removed by playbooks/rollback.yml.\n"
FILE_PREFIX = "gpunode-tuning-"
FILE_MODE = 0o644
DIR_MODE = 0o755


class Concern(NamedTuple):
    """One thing the persistent flow makes survive a reboot, and how rollback takes it away."""

    name: str
    # Tags that select it in the persistent flow and rollback (besides persistent / rollback).
    tags: tuple
    # (PersistCall) -> dict: write what the desired state asks; raises FamilyError.
    persist: Callable[..., dict]
    # (PersistCall) -> dict: remove everything it may have written; raises FamilyError.
    remove: Callable[..., dict]
    # Whether it writes the kernel arguments other families need: then their tags select it too.
    kernel_args: bool = False


class PersistCall(NamedTuple):
    """What a concern gets: the node, the module's call, the desired state, the settings, the files."""

    node: Node
    call: Call
    desired: dict
    # The role's persistence settings (sysctl_file, boot_script, ...), by their names without prefix.
    settings: dict
    files: Any
    # (family, options, check_mode=None) -> the Call its ``run`` takes, options completed by its spec.
    make_call: Callable[..., Call]


class NodeFiles:
    """Changes to files below the node root, with check mode and diffs (``changes``: path -> what)."""

    def __init__(self, node: Node, check_mode: bool = False, diff: bool = False):
        self.node = node
        self.check_mode = check_mode
        self.diff = diff
        self.changes: dict = {}
        self.diffs: list = []

    def _full(self, path: str) -> str:
        if not path.startswith("/") or ".." in path.split("/"):
            raise FamilyError("%s is not an absolute path on the node without '..'" % path)
        return self.node.path(path)

    def read(self, path: str) -> str | None:
        try:
            with open(self._full(path), encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise FamilyError("cannot read %s: %s" % (path, exc)) from None

    def write(self, path: str, text: str, mode: int = FILE_MODE) -> bool:
        """Write ``text`` to ``path`` (parents created) when it differs; True when it changed (or would)."""
        full = self._full(path)
        try:
            created = report_files.ensure_dir(os.path.dirname(full), self.check_mode, what="directory")
            change = report_files.write_file(full, text.encode("utf-8"), self.check_mode, mode, what="file")
        except report_files.ReportError as exc:
            raise FamilyError(str(exc)) from None
        if change:
            self.changes[path] = change
            if self.diff and change != "mode":
                self.diffs.append({"before_header": path, "after_header": path,
                                   "before": "" if change == "created" else (self.read(path) or ""),
                                   "after": text})
        return bool(change or created)

    def link(self, path: str, target: str) -> bool:
        """``path`` as a symlink to ``target`` (replacing another link there); True when it changed."""
        full = self._full(path)
        if os.path.islink(full) and os.readlink(full) == target:
            return False
        if os.path.exists(full) and not os.path.islink(full):
            raise FamilyError("%s exists and is not a link; not replaced" % path)
        self.changes[path] = "linked"
        if not self.check_mode:
            try:
                report_files.ensure_dir(os.path.dirname(full), what="directory")
                if os.path.islink(full):
                    os.unlink(full)
                os.symlink(target, full)
            except (OSError, report_files.ReportError) as exc:
                raise FamilyError("cannot link %s to %s: %s" % (path, target, exc)) from None
        return True

    def remove(self, path: str) -> bool:
        """Remove the file, link or (empty or ours) directory ``path``; True when it was there."""
        full = self._full(path)
        if not os.path.lexists(full):
            return False
        self.changes[path] = "removed"
        if self.check_mode:
            return True
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                _remove_tree(full)
            else:
                os.unlink(full)
        except OSError as exc:
            raise FamilyError("cannot remove %s: %s" % (path, exc.strerror)) from None
        return True

    def ours(self, directory: str) -> list:
        """Node paths of this collection's ``gpunode-tuning-*.conf`` files in ``directory``."""
        full = self._full(directory)
        try:
            names = sorted(os.listdir(full)) if os.path.isdir(full) else []
        except OSError as exc:
            raise FamilyError("cannot list %s: %s" % (directory, exc.strerror)) from None
        return ["%s/%s" % (directory.rstrip("/"), n) for n in names if n.startswith(FILE_PREFIX)
                and n.endswith(".conf") and stat.S_ISREG(os.lstat(os.path.join(full, n)).st_mode)]


def _remove_tree(path: str) -> None:
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.rmdir(full)
    os.rmdir(path)


def run_family(pc: PersistCall, name: str, options: dict, check_mode: bool | None = None) -> dict:
    """A family's ``run`` with these options (check mode: the module's, or forced); FamilyError as it raises."""
    from ansible_collections.gpunode.tuning.plugins.module_utils import registry

    fam = registry.by_name(name)
    return fam.run(pc.make_call(fam, as_role_options(fam, options), check_mode))


def family_kernel_args(pc: PersistCall, remove: bool = False) -> list:
    """The kernel arguments every family asks for (``Family.kernel_args``), or may have added (``remove``)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils import registry

    out = []
    for fam in registry.FAMILIES:
        if fam.kernel_args is not None:
            out += [a for a in fam.kernel_args(pc, remove) if a not in out]
    return out


def run_command(pc: PersistCall, argv: list, what: str) -> str:
    """Run a system command of a live node (never on a simulated root, never in check mode); its stdout."""
    if not pc.node.is_live or pc.call.check_mode:
        return ""
    rc, out, err = pc.call.run_command(argv)
    if rc != 0:
        raise FamilyError("%s: %s exited %s: %s" % (what, " ".join(argv), rc, (err or out).strip()[:300]))
    return out


def systemd_running(node: Node) -> bool:
    """Whether the node's PID 1 is systemd (sd_booted: /run/systemd/system); never on a simulated root."""
    return node.is_live and os.path.isdir("/run/systemd/system")


def concern_line(result: dict) -> str:
    """One line of what a concern did, for the flow's report."""
    if result.get("failed"):
        return "failed: %s" % " ".join(str(result.get("msg") or "").split())
    if result.get("skipped"):
        return "skipped: %s" % result.get("reason", "")
    files = result.get("files") or {}
    return ", ".join("%s %s" % (path, what) for path, what in files.items()) or "unchanged"


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
        if pc.files.diffs:
            result["diff"] = list(pc.files.diffs)
        results[concern.name] = result
    return results


def concerns() -> list:
    """Every concern, in the order the persistent flow runs them: the families' (registry order), boot's, the guard.

    Rollback removes them in the reverse order (the guard stopped first, the udev rule before the runner).
    """
    from ansible_collections.gpunode.tuning.plugins.module_utils import boot, guard_files, registry

    arg_tags = tuple(t for fam in registry.FAMILIES if fam.kernel_args is not None or fam.reboot_only
                     for t in (fam.name, *fam.tags))
    out = [fam.persist for fam in registry.FAMILIES if fam.persist is not None]
    out = [c._replace(tags=tuple(sorted(set(c.tags + arg_tags)))) if c.kernel_args else c for c in out]
    return out + boot.concerns() + [guard_files.CONCERN]
