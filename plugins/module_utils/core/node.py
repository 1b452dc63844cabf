# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node abstraction: every sysfs, procfs and /dev path lives below a root directory.

How it works and why: docs/dev/node-code.md, "core/node.py".
"""

from __future__ import annotations

import errno
import os
from typing import Any, Iterable

NODE_ARGUMENT_SPEC = dict(root=dict(type="path", default="/"))

SYSFS_CPU = "sys/devices/system/cpu"
SYSFS_PCI_DEVICES = "sys/bus/pci/devices"


class NodeError(Exception):
    """A node could not be read or written as asked; the message names the path."""


class BinaryNotFound(NodeError, LookupError):
    """A command the node lacks (``Node.bin_path``); the message names the package that provides it."""


ROOT_ALLOWED = "'/' for the running system, or the directory of a simulated node (tools/simnode)"


class Node:
    """A Linux node seen through a root directory."""

    def __init__(self, root: str = "/"):
        if not isinstance(root, str) or not root.strip():
            # An empty root used to fall back to "/": a module meant for a simulated node then
            # described, or planned writes to, the controller itself.
            raise NodeError("root is empty (%r); give %s" % (root, ROOT_ALLOWED))
        root = os.path.abspath(root)
        # "//", "/tmp/.." or a link to "/" are the running system too: system commands run there.
        self.root = "/" if os.path.realpath(root) == "/" else root

    @classmethod
    def open(cls, root: str) -> Node:
        """The node at ``root`` after checking that it is one: NodeError naming the root otherwise."""
        node = cls(root)
        node.check_root()
        return node

    def check_root(self) -> None:
        """Raise NodeError unless the root is a directory holding ``sys/`` (what every Linux root has)."""
        if not os.path.exists(self.root):
            raise NodeError("root %s does not exist; give %s" % (self.root, ROOT_ALLOWED))
        if not os.path.isdir(self.root):
            raise NodeError("root %s is not a directory; give %s" % (self.root, ROOT_ALLOWED))
        if not os.path.isdir(self.path("sys")):
            raise NodeError("root %s has no sys/ directory, so it is not the root of a Linux node and "
                            "nothing on it can be read; give %s" % (self.root, ROOT_ALLOWED))

    @property
    def is_live(self) -> bool:
        """True when the root is the running system's ``/`` (system commands may run)."""
        return self.root == "/"

    def path(self, *parts: str) -> str:
        """Return the absolute path of ``parts`` (relative to the node root)."""
        rel = os.path.join(*[p.lstrip("/") for p in parts]) if parts else ""
        return os.path.join(self.root, rel)

    def exists(self, *parts: str) -> bool:
        return os.path.exists(self.path(*parts))

    def isdir(self, *parts: str) -> bool:
        return os.path.isdir(self.path(*parts))

    def listdir(self, *parts: str) -> list[str]:
        """Sorted directory entries, or an empty list when the directory is absent."""
        try:
            return sorted(os.listdir(self.path(*parts)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read(self, *parts: str, default: str | None = None) -> str:
        """Return a file's content with surrounding whitespace stripped."""
        full = self.path(*parts)
        try:
            with open(full, encoding="utf-8", errors="replace") as fh:
                return fh.read().strip()
        except (FileNotFoundError, NotADirectoryError):
            if default is not None:
                return default
            raise NodeError("%s does not exist" % full) from None
        except OSError as exc:
            if default is not None:
                return default
            raise NodeError("cannot read %s: %s" % (full, exc.strerror or exc)) from exc

    def write(self, value: Any, *parts: str) -> None:
        """Write ``value`` (newline-terminated, as ``echo`` would) to a sysfs/procfs attribute."""
        full = self.path(*parts)
        data = str(value)
        if not data.endswith("\n"):
            data += "\n"
        payload = data.encode()
        try:
            fd = os.open(full, os.O_WRONLY)
        except OSError as exc:
            raise NodeError("cannot open %s for writing: %s" % (full, exc.strerror or exc)) from exc
        try:
            os.write(fd, payload)
            if not self.is_live:
                # A simulated attribute is a regular file: cut what a longer old value left
                # behind. Truncating after the write, not with O_TRUNC, avoids ext4's flush
                # on close of a truncated file (10-50x slower on a 384-CPU node).
                os.ftruncate(fd, len(payload))
        except OSError as exc:
            raise NodeError("writing %r to %s failed: %s" % (data.strip(), full, exc.strerror or exc)) from exc
        finally:
            os.close(fd)

    def write_problem(self, *parts: str) -> str | None:
        """Why ``Node.write`` of the attribute at ``parts`` would fail: a short reason, or None."""
        exc = write_refusal(self.path(*parts))
        if exc is None:
            return None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "does not exist"
        if exc.errno == errno.EISDIR:
            return "is a directory"
        return "is not writable (%s: %s)" % (exc.strerror or exc, _refusal_cause(exc.errno))

    def pciutils_args(self) -> list[str]:
        """Extra arguments that make lspci/setpci operate on this node's sysfs tree."""
        if self.is_live:
            return []
        return ["-O", "sysfs.path=%s" % self.path(SYSFS_PCI_DEVICES.rsplit("/", 1)[0])]

    def bin_path(self, module: Any, name: str, package: str, host: bool = True) -> str:
        """Find a system command for this node; ``BinaryNotFound`` names the package that provides it."""
        if not self.is_live:
            for d in ("usr/sbin", "sbin", "usr/bin", "bin"):
                candidate = self.path(d, name)
                if os.access(candidate, os.X_OK):
                    return candidate
            if not host:
                raise BinaryNotFound("the simulated node %s has no %s; the controller's is never run against it"
                                     % (self.root, name))
        path = module.get_bin_path(name)
        if not path:
            raise BinaryNotFound("%s not found: install the %s package on the node" % (name, package))
        return path


def read_small(path: str) -> str | None:
    """Stripped text of a small sysfs/procfs file (a full path), or None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def write_refusal(full: str) -> OSError | None:
    """The OSError that opening the file ``full`` for writing raises, or None when it would open."""
    if os.access(full, os.W_OK) and not os.path.isdir(full):
        return None
    try:
        os.close(os.open(full, os.O_WRONLY))
    except OSError as exc:
        return exc
    return None


def _refusal_cause(err):
    """The likely cause of a refused open for writing, by errno."""
    if err == errno.EPERM:
        return "the file is immutable or the kernel forbids the write"
    if err == errno.EROFS:
        return "the file system is read-only"
    if err == errno.EACCES:
        return "run as root (become: true)" if os.geteuid() != 0 else "a read-only attribute"
    return "refused by the kernel"


def parse_cpulist(text: str | None) -> list[int]:
    """Parse a kernel cpulist such as ``0-3,8,10-11`` into a sorted list of ints."""
    cpus = set()
    text = (text or "").strip()
    if not text:
        return []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        elif part:
            cpus.add(int(part))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU numbers as a compact kernel cpulist (inverse of ``parse_cpulist``)."""
    out = []
    start = prev = None
    for c in sorted(set(cpus)):
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.append(_cpu_range(start, prev))
            start = prev = c
    if start is not None:
        out.append(_cpu_range(start, prev))
    return ",".join(out)


def _cpu_range(start, end):
    return str(start) if start == end else "%d-%d" % (start, end)


def online_cpus(node: Node) -> list[int]:
    """CPU numbers that are online (falls back to the cpuN directories present)."""
    text = node.read(SYSFS_CPU, "online", default="")
    if text:
        return parse_cpulist(text)
    return sorted(int(n[3:]) for n in node.listdir(SYSFS_CPU) if n.startswith("cpu") and n[3:].isdigit())


def selected_bracket(text: str | None) -> str | None:
    """Return the bracketed choice of a sysfs multiple-choice file (``always [madvise] never``)."""
    for word in (text or "").split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def bracket_choices(text: str | None) -> list[str]:
    """Return every choice of a sysfs multiple-choice file, brackets removed."""
    return [w.strip("[]") for w in (text or "").split()]


def lockdown_mode(node: Node) -> str | None:
    """Return the kernel lockdown mode (none, integrity, confidentiality) or None if unknown."""
    return selected_bracket(node.read("sys/kernel/security/lockdown", default=""))


def cmdline_args(node: Node) -> list[str]:
    """Return the running kernel command line as a list of arguments."""
    return node.read("proc/cmdline", default="").split()
