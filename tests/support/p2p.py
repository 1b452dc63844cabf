"""The P2P family as verification runs it on a simulated node: the node's own commands as tools, gather, the GPU
probe and the family's evaluate (tests/unit/test_gpu_p2p.py, test_pci_bar.py)."""

from __future__ import annotations

import os
import subprocess

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_p2p as p2p
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verify import gather


class Ctx:
    def __init__(self, gpu):
        self.gpu = gpu


def tools(root, calls=None):
    """verify.Tools as tuning_info builds them for a simulated node: only commands the node ships."""
    def find(name, _package):
        path = os.path.join(root, "usr/bin", name)
        return path if os.access(path, os.X_OK) else None

    def run(argv, env=None):
        if calls is not None:
            calls.append(argv)
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60,
                              env=dict(os.environ, **env) if env else None)
        return proc.returncode, proc.stdout, proc.stderr

    return verify.Tools(find, run)


def rows(root, desired=None, calls=None, bars=False):
    """gather (ACS facts included) + gpu_probe + the family's evaluate: {row name: row}; the BAR rows only with
    ``bars``."""
    desired = {"gpu_p2p": {}} if desired is None else desired
    facts = gather(Node(root))
    probe = verify.gpu_probe(Node(root), dict(verify.VERIFY_DEFAULTS), tools(root, calls), desired,
                             gpus=verify.gpu_count(facts))
    return {r["name"]: r for r in p2p.evaluate(facts, desired, Ctx(probe)) if bars or not r["name"].startswith("bar")}
