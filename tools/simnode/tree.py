"""The writer of a simulated node's tree (paths relative to its root) and small helpers every part uses."""

from __future__ import annotations

import os


class Tree:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def write(self, rel: str, content, mode: int = 0o644) -> None:
        full = self.path(rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        data = content if isinstance(content, bytes) else (str(content) + "\n").encode()
        with open(full, "wb") as fh:
            fh.write(data)
        os.chmod(full, mode)

    def symlink(self, target: str, rel: str) -> None:
        full = self.path(rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.symlink(target, full)

    def mkdir(self, rel: str) -> None:
        os.makedirs(self.path(rel), exist_ok=True)


def cpulist(cpus) -> str:
    """Format a sorted list of CPU numbers as a kernel cpulist ("0-3,8-11")."""
    parts = []
    start = prev = None
    for c in cpus:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = c
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(parts)


def read_rel(t: Tree, rel: str, default: str | None = None) -> str | None:
    try:
        with open(t.path(rel), encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return default
