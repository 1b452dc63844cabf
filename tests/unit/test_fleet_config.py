"""inventories/example/ansible.cfg: the fleet settings that docs/performance.md ("Over SSH") measured.

Read back through ansible-config, as Ansible resolves them: a misspelt key or section would be
ignored silently by a playbook run, not here.
"""

from __future__ import annotations

import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")


def test_example_fleet_config_sets_pipelining_controlpersist_and_forks():
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "inventories", "example", "ansible.cfg"))
    for name in ("ANSIBLE_PIPELINING", "ANSIBLE_SSH_ARGS", "ANSIBLE_FORKS", "ANSIBLE_SSH_PIPELINING"):
        env.pop(name, None)
    out = subprocess.run([os.path.join(VENV_BIN, "ansible-config"), "dump", "--only-changed", "-t", "all"],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert re.search(r"^DEFAULT_FORKS\(.*example/ansible\.cfg\) = 32$", out, re.MULTILINE), out
    assert re.search(r"^pipelining\(.*example/ansible\.cfg\) = True$", out, re.MULTILINE), out
    ssh_args = re.search(r"^ssh_args\(.*example/ansible\.cfg\) = (.*)$", out, re.MULTILINE)
    assert ssh_args, out
    assert "ControlMaster=auto" in ssh_args.group(1)
    assert re.search(r"ControlPersist=\d+", ssh_args.group(1))
