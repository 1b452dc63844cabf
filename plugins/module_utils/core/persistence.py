# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a family's persistent concern gets and uses: its call, the node's files, system commands.

How it works and why: docs/dev/node-code.md, "core/persistence.py".
"""

from __future__ import annotations

import os
import stat
from typing import Any, Callable, NamedTuple

from ansible_collections.gpunode.tuning.plugins.module_utils.core import file_updates
from ansible_collections.gpunode.tuning.plugins.module_utils.core import files as node_files
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import (  # noqa: F401 (Concern: re-exported)  # pylint: disable=unused-import
    Call,
    Concern,
    FamilyError,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node

HEADER = "# Managed by gpunode.tuning (role tuning); removed by playbooks/rollback.yml.\n"
FILE_PREFIX = "gpunode-tuning-"
FILE_MODE = 0o644


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
    # (family name, options, check_mode=None) -> that family's ``run`` result, as its module runs it (flow-bound).
    run_family: Callable[..., dict] | None = None
    # (remove=False) -> the kernel arguments every family asks for, or may have added (the flow binds it).
    family_kernel_args: Callable[..., list] | None = None
    # {setting id: reason}: what a family's kernel_args left out because the node cannot take it (fit before
    # tuned), so no reboot for it; the flow makes it fresh per concern and the kernel command line reports it.
    unfit: dict | None = None


class NodeFiles:
    """Changes to files below the node root, with check mode and diffs (``changes``: path -> what)."""

    def __init__(self, node: Node, check_mode: bool = False, diff: bool = False):
        self.node = node
        self.check_mode = check_mode
        self.diff = diff
        self.changes: dict = {}
        self.diffs: list = []
        # Told of the directories a write creates (full paths, outermost first): the flow records them in the
        # journal, so that rollback removes them (flows/writers.py).
        self.on_created: Callable[[list], None] | None = None

    def _ensure_dir(self, directory: str) -> bool:
        missing = node_files.missing_dirs(directory)
        created = file_updates.ensure_dir(directory, self.check_mode, what="directory")
        if created and not self.check_mode and self.on_created is not None:
            self.on_created(missing)
        return created

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
            why = node_files.os_error(exc) if isinstance(exc, OSError) else exc
            raise FamilyError("cannot read %s: %s" % (path, why)) from None

    def write(self, path: str, text: str, mode: int = FILE_MODE) -> bool:
        """Write ``text`` to ``path`` (parents created) when it differs; True when it changed (or would)."""
        full = self._full(path)
        try:
            created = self._ensure_dir(os.path.dirname(full))
            change = file_updates.write_file(full, text.encode("utf-8"), self.check_mode, mode, what="file")
        except file_updates.ReportError as exc:
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
                self._ensure_dir(os.path.dirname(full))
                if os.path.islink(full):
                    os.unlink(full)
                os.symlink(target, full)
            except OSError as exc:
                raise FamilyError("cannot link %s to %s: %s" % (path, target, node_files.os_error(exc))) from None
            except file_updates.ReportError as exc:
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
            raise FamilyError("cannot remove %s: %s" % (path, node_files.os_error(exc))) from None
        return True

    def ours(self, directory: str) -> list:
        """Node paths of this collection's ``gpunode-tuning-*.conf`` files in ``directory``."""
        full = self._full(directory)
        try:
            names = sorted(os.listdir(full)) if os.path.isdir(full) else []
        except OSError as exc:
            raise FamilyError("cannot list %s: %s" % (directory, node_files.os_error(exc))) from None
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


def as_role_options(fam: Any, options: dict) -> dict:
    """``options`` as the role passes them: every value is the role's (a preset's, for every node), so
    the module does not warn about one that does not apply here (``preset_options``, where it has them)."""
    spec = (fam.argument_spec or {}).get("preset_options")
    if not spec:
        return options
    return dict(options, preset_options=[k for k in spec["choices"] if k in options])
