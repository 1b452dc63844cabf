# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard as its unit runs it, for the tests of module_utils/flows/guard.py: what the persistent flow installs
(the runner, the config, the units) below a simulated node's root, the runner run as a subprocess, and readers of
the status file and the ``.prom`` file it writes."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot, guard_files
from support.checkout import REPO

RUNNER = "/usr/local/lib/gpunode-tuning/apply-boot-tuning.sh"
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
STATUS = "var/lib/gpunode-tuning/guard-status.json"
CACHE = "var/lib/gpunode-tuning/guard-code.cache"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
PROM = "var/lib/prometheus/node-exporter/gpunode-tuning.prom"
GPUS = ["0000:41:00.0", "0000:61:00.0"]  # audited-epyc-8gpu with gpus=2
# The role's desired state for the inference-throughput preset (vars/main.yml, defaults/main.yml).
DESIRED = {
    "pcie_mrrs": {"mrrs": 4096, "vendor": "10de", "device": None, "class_prefixes": ["0300", "0302"], "bdfs": None,
                  "allow_empty": True},
    "cpuidle": {"disable": [], "max_latency_us": 100, "cpus": None},
    "cpufreq": {"governor": "performance", "epp": None, "boost": None, "driver": "native",
                "amd_pstate_mode": "active", "intel_pstate_status": None},
    "numa_balancing": 0,
    "thp": {"enabled": "madvise", "defrag": "defer+madvise"},
    "sysctl": {"vm.swappiness": 10, "net.core.rmem_max": 134217728, "net.core.wmem_max": 134217728,
               "net.core.somaxconn": 65535, "kernel.numa_balancing": 0},
    "kmod": {"modules": [{"name": "nvidia_peermem", "params": {}, "required": False}]},
    "kernel_cmdline": [],
    "pcie_acs": {"mode": "disable_redirect", "persist": "boot_unit", "vendor": "10de", "device": None,
                 "class_prefixes": ["0300", "0302"], "bdfs": None, "allow_empty": True},
    "iommu": None,
    "gpu_settings": None,
    "gpu_health": {"gpu_count": None, "dcgm_diag": False},
    "gpu_p2p": {"min_gbps": None},
}
OPTIONS = {
    "python": "/usr/bin/python3", "runner": RUNNER, "journal": JOURNAL, "textfile_dir": TEXTFILE_DIR,
    "interval": "5min", "reapply": False, "preset": "inference-throughput", "collection_version": "1.0.0",
    "host": "sim", "desired": DESIRED,
    "facts": {"pci_selector": {"vendor": "10de", "class_prefixes": ["0300", "0302"]},
              "sysctls": sorted(DESIRED["sysctl"]), "modules": ["nvidia_peermem"], "kmsg_levels": ["err", "warn"],
              "kmsg_ignore": None},
    "verify": {},
}


def render_runner():
    """The runner as the persistent flow installs it (boot.runner_text over the collection's module_utils)."""
    return boot.runner_text(boot.carried_sources(os.path.join(REPO, "plugins", "module_utils")))


RUNNER_TEXT = render_runner()


def install(root, **options):
    """The runner, the guard's config and its units below ``root``, as the persistent flow writes them."""
    opts = dict(copy.deepcopy(OPTIONS), **options)
    path = os.path.join(root, RUNNER.lstrip("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(RUNNER_TEXT)
    for f in guard_files.installed_files(opts):
        full = os.path.join(root, f["path"].lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(f["content"])
    return root


def run_guard(root, cache=True):
    """The runner as the unit runs it (isolated mode), its code cache below the root."""
    env = dict(os.environ)
    env.pop(guard_files.CODE_CACHE_ENV, None)
    if cache:
        env[guard_files.CODE_CACHE_ENV] = os.path.join(root, CACHE)
    return subprocess.run([sys.executable, "-I", "-B", os.path.join(root, RUNNER.lstrip("/")), "guard", "--config",
                           guard_files.CONFIG_PATH, "--root", root], capture_output=True, text=True, check=False,
                          cwd="/", env=env)


def status(root):
    with open(os.path.join(root, STATUS), encoding="utf-8") as fh:
        return json.load(fh)


def metrics(root):
    """``{(name, ((label, value), ...)): value}`` of the .prom file (a small reader of the format we write)."""
    out = {}
    with open(os.path.join(root, PROM), encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("#") or not line.strip():
                continue
            head, value = line.rsplit(" ", 1)
            name, _brace, labels = head.partition("{")
            pairs = tuple(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
            out[(name, pairs)] = float(value)
    return out


def series(m, name, **labels):
    """Values of the series of ``name`` whose labels include ``labels``."""
    return [v for (n, pairs), v in m.items() if n == name and set(labels.items()) <= set(pairs)]
