"""Fixtures of the integration tests; their helpers are in tests/support (pytest.ini puts tests/ on sys.path)."""

from __future__ import annotations

import pytest
import simnode
from support.inventory import write_inventory
from support.nodes import build_node
from support.playbooks import assert_ok, run_playbook
from support.slurm import SlurmCluster, missing_tools
from support.trees import snapshot

SLURM_SETUP = "install them with scripts/setup.sh --tests (Debian packages slurmctld slurmd slurm-client munge)"


@pytest.fixture
def tuned_node(tmp_path):
    """``tuned_node(host)``: (root, inventory, snapshot before) of a simulated node with node_exporter's
    textfile directory, tuned by ``tune.yml --tags runtime,persistent`` (the guard installed)."""

    def _tune(host):
        root = build_node(tmp_path / "node", cpus=8, gpus=2)
        simnode.write_node_exporter_dir(root)
        inventory = write_inventory(tmp_path / "hosts.yml", {host: root})
        before = snapshot(root)
        assert_ok(run_playbook("tune.yml", inventory, "--tags", "runtime,persistent"))
        return root, inventory, before

    return _tune


@pytest.fixture
def slurm_cluster():
    """``slurm_cluster(nodes=6, **options)``: a started SlurmCluster (tests/support/slurm.py), stopped by its pid
    files when the test ends, also when it fails. Fails naming the packages when Slurm is not installed."""
    started = []

    def _start(nodes=6, **options):
        assert not missing_tools(), "missing %s: %s" % (", ".join(missing_tools()), SLURM_SETUP)
        started.append(SlurmCluster(nodes=nodes, **options).start())
        return started[-1]

    yield _start
    for cluster in started:
        cluster.stop()
