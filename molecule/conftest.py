# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""testinfra hosts and fixtures of the Molecule scenarios (``molecule/<scenario>/tests``; the reads of the
simulated node they share are tests/support/molecule.py).

Molecule runs pytest from a scenario directory with ``MOLECULE_FILE`` pointing at the merged
configuration. Every platform in it becomes a ``podman://NAME`` host, so testinfra runs its
commands with ``podman exec`` (seconds) instead of going through Ansible (tens of seconds).
The simulated node lives at ``gpunode_tuning_root`` in each container; ``prepare.yml`` keeps a
pristine copy of it at ``PRISTINE``.
"""

from __future__ import annotations

import os

import pytest
from support.molecule import SimNode, molecule_config


def pytest_configure(config):
    """Point testinfra at the scenario's containers unless --hosts was given."""
    if config.option.hosts is None and "MOLECULE_FILE" in os.environ:
        names = [platform["name"] for platform in molecule_config()["platforms"]]
        config.option.hosts = ",".join("podman://%s" % name for name in names)


@pytest.fixture(scope="session")
def root():
    """The simulated node's root in the containers (gpunode_tuning_root of molecule/base.yml)."""
    group_vars = molecule_config()["provisioner"]["inventory"]["group_vars"]
    return group_vars["gpunodes"]["gpunode_tuning_root"].rstrip("/")


@pytest.fixture()
def node(host, root):
    return SimNode(host, root)
