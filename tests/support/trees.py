"""Snapshots of simulated node trees and their byte comparison (what a run wrote, or did not)."""

from __future__ import annotations

import hashlib
import os
import stat

# Left out of snapshots: the simulated kernel log, which the node's modprobe appends to as a real kernel
# would, and which no rollback can take back.
APPEND_ONLY = {"dev/kmsg"}


def snapshot(root):
    """Map every path below root to what it is: ('f', sha256, mode), ('l', target) or ('d',)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel in APPEND_ONLY:
                continue
            if os.path.islink(full):
                out[rel] = ("l", os.readlink(full))
            elif os.path.isdir(full):
                out[rel] = ("d",)
            else:
                with open(full, "rb") as fh:
                    out[rel] = ("f", hashlib.sha256(fh.read()).hexdigest(), stat.S_IMODE(os.lstat(full).st_mode))
    return out


def tree_changes(before, after):
    """Paths added, removed or changed between two snapshots (sorted, for assertion messages)."""
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def tree_digest(root):
    """Hash of every path, file content and symlink target under root (byte-identity checks)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            full = os.path.join(dirpath, name)
            h.update(os.path.relpath(full, root).encode() + b"\0")
            if os.path.islink(full):
                h.update(b"L" + os.readlink(full).encode())
            else:
                with open(full, "rb") as fh:
                    h.update(fh.read())
        for d in dirnames:
            h.update(os.path.relpath(os.path.join(dirpath, d), root).encode() + b"/\0")
    return h.hexdigest()
