# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's boot configuration as the command-line family writes it and verification reads it.

Which bootloader a node has (GRUB with its drop-in directory, or grubby), this collection's GRUB drop-in
and how a GRUB_CMDLINE_LINUX* line parses. A named core piece: the command-line family and verification
share it. Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

import os
import re
from typing import Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node

BOOTLOADERS = ("auto", "grub", "grubby")


GRUB_DROPIN_DIR = "/etc/default/grub.d"


DEFAULT_DROPIN = GRUB_DROPIN_DIR + "/60-gpunode-tuning.cfg"


MANAGED_MARK = "Managed by gpunode.tuning"


DEBIAN_IDS = ("debian", "ubuntu", "linuxmint", "pop", "raspbian")


RHEL_IDS = ("rhel", "fedora", "centos", "rocky", "almalinux", "ol", "amzn")


_VAR_RE = re.compile(r"\$\{?(GRUB_CMDLINE_LINUX(?:_DEFAULT)?)\}?")


ASSIGN_RE = re.compile(r"^\s*(?:export\s+)?(GRUB_CMDLINE_LINUX(?:_DEFAULT)?)=(.*)$")


def grub_unquote(word: str) -> str:
    """The argument GRUB passes to the kernel for a drop-in word (its single quotes removed)."""
    return word.replace("'", "")


def shell_value(raw, env):
    """The value of a simple shell assignment's right-hand side (quotes, $VAR of the two GRUB variables)."""
    raw = raw.strip()
    if raw.startswith('"'):
        end = raw.find('"', 1)
        inner = raw[1:end] if end > 0 else raw[1:]
        return _VAR_RE.sub(lambda m: env.get(m.group(1), ""), inner)
    if raw.startswith("'"):
        end = raw.find("'", 1)
        return raw[1:end] if end > 0 else raw[1:]
    word = raw.split()[0] if raw.split() else ""
    return _VAR_RE.sub(lambda m: env.get(m.group(1), ""), word)


def parse_dropin(text: str | None) -> tuple[bool, list[str]]:
    """Return ``(managed, args)`` of a drop-in: whether it carries our header, and the arguments it adds."""
    if text is None:
        return True, []
    managed = MANAGED_MARK in text
    args = []
    for line in text.splitlines():
        m = ASSIGN_RE.match(line)
        if m and m.group(1) == "GRUB_CMDLINE_LINUX_DEFAULT":
            args = [grub_unquote(w) for w in shell_value(m.group(2), {}).split()]
    return managed, args


def read_text(node: Node, path: str) -> str | None:
    """Content of a file below the node root, or None when it does not exist."""
    full = node.path(path)
    if not os.path.isfile(full):
        return None
    with open(full, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def os_ids(node: Node) -> list[str]:
    """ID and ID_LIKE words of /etc/os-release below the root."""
    ids = []
    for line in (read_text(node, "/etc/os-release") or "").splitlines():
        key, _sep, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            ids.extend(value.strip().strip('"').strip("'").split())
    return ids


def detect_bootloader(node: Node, have_grubby: bool = False) -> str | None:
    """``grub`` or ``grubby`` for this node, from os-release, else from what exists; None if unknown."""
    ids = os_ids(node)
    if any(i in DEBIAN_IDS for i in ids):
        return "grub"
    if any(i in RHEL_IDS for i in ids):
        return "grubby"
    if have_grubby:
        return "grubby"
    if node.isdir(GRUB_DROPIN_DIR) or node.exists("etc/default/grub"):
        return "grub"
    return None


def choose_bootloader(node: Node, requested: str, find: Callable[[str, str], str | None]) -> str | None:
    """The bootloader to use: ``requested`` unless it is ``auto``, else ``detect_bootloader``'s (None: unknown).

    The one detection, for kernel_cmdline and for verification. ``find(name, package)`` gives a
    command's path or None (``Node.bin_path``); grubby on the PATH counts on a live node only.
    """
    if requested != "auto":
        return requested
    have_grubby = node.is_live and bool(find("grubby", "grubby"))
    return detect_bootloader(node, have_grubby=have_grubby)


def parse_grubby_info(text: str | None) -> list[str]:
    """Arguments of the first ``args="..."`` line of ``grubby --info`` output."""
    for line in (text or "").splitlines():
        m = re.match(r'^\s*args="?(.*?)"?\s*$', line)
        if m:
            return m.group(1).split()
    return []
