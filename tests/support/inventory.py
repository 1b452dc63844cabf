"""Inventories of simulated nodes: one local host per simulated root, in group gpunodes."""

from __future__ import annotations

import os
import tempfile

import yaml

from support.checkout import VENV_BIN

# Where the hosts' reports go unless a test names another directory: kept out of the checkout.
REPORT_DIR = tempfile.mkdtemp(prefix="gpunode-tuning-reports.")


def write_inventory(path, roots, report_dir=REPORT_DIR, host_vars=None, extra_hosts=None, **common):
    """Write a YAML inventory to ``path`` and return its path (a str).

    ``roots``: {host: simulated root}; each of these hosts gets ``gpunode_tuning_root``, the variables
    ``common`` and its own ``host_vars[host]``. ``extra_hosts``: {host: variables} of hosts without a root
    (an unreachable one). ``report_dir``: every host's ``gpunode_tuning_report_dir``; None leaves the
    role's default (``reports/`` in the working directory). Local connection, the venv's Python.
    """
    host_vars = host_vars or {}
    hosts = {name: dict(gpunode_tuning_root=str(root), **common, **host_vars.get(name, {}))
             for name, root in roots.items()}
    hosts.update(extra_hosts or {})
    group_vars = {"ansible_connection": "local", "ansible_python_interpreter": os.path.join(VENV_BIN, "python")}
    if report_dir is not None:
        group_vars["gpunode_tuning_report_dir"] = str(report_dir)
    inventory = {"all": {"children": {"gpunodes": {"hosts": hosts}}, "vars": group_vars}}
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(inventory, fh)
    return str(path)
