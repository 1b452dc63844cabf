"""The runner the persistent flow installs on a node, run as its units run it: the boot unit and the udev
rule (re-apply the desired state), the guard's service (verify, write status and metrics)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from support.checkout import VENV_BIN
from support.nodes import BOOT_DESIRED, BOOT_RUNNER

GUARD_CONFIG = "/etc/gpunode-tuning/guard.json"
# What a guard run writes below the node root.
GUARD_STATUS = "var/lib/gpunode-tuning/guard-status.json"
PROM = "var/lib/prometheus/node-exporter/gpunode-tuning.prom"
# The node's python3 where this machine has one (as the units name it), else this one.
NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def run_boot_runner(tuned, fresh, *extra):
    """The runner installed on ``tuned`` as the boot unit starts it (the venv's python3 standing for the
    node's), with ``tuned``'s desired state, against the node ``fresh``; ``extra``: more arguments (the
    udev rule's ``--only pcie_mrrs --bdf BDF``)."""
    desired = os.path.join(fresh, BOOT_DESIRED.lstrip("/"))
    if tuned != fresh:
        os.makedirs(os.path.dirname(desired), exist_ok=True)
        shutil.copy(os.path.join(tuned, BOOT_DESIRED.lstrip("/")), desired)
    cmd = [os.path.join(VENV_BIN, "python"), "-I", "-B", os.path.join(tuned, BOOT_RUNNER), "--desired", BOOT_DESIRED,
           "--root", fresh, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd="/")


def run_guard(root):
    """The installed runner as gpunode-tuning-guard.service runs it, against the simulated root; it must pass."""
    env = dict(os.environ, GPUNODE_TUNING_CODE_CACHE=os.path.join(root, "var/lib/gpunode-tuning/guard-code.cache"))
    proc = subprocess.run([NODE_PYTHON, "-I", "-B", os.path.join(root, BOOT_RUNNER), "guard", "--config", GUARD_CONFIG,
                           "--root", root], capture_output=True, text=True, check=False, cwd="/", env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc
