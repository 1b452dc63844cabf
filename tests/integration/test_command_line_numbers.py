"""Numbers given on the command line (``-e name=1`` arrives as the string "1") mean what the precheck accepted,
down to the reboot sequence (issue 42): with ``-e gpunode_tuning_reboot_poll_interval=0.2`` the sequence polls
every 0.2 s, not its 5 s fallback.

One cheap playbook run on the controller: the role's precheck, then the reboot action's slot wait for a host
whose budget (1) is held by a host the run found unreachable; ``-e gpunode_tuning_reboot_wait_timeout=1`` bounds
the wait. Polled every 5 s the wait would end after 5 s; every 0.2 s it ends after about 1 s. Nothing is drained,
rebooted or written on a node.
"""

from __future__ import annotations

import json
import re

from support.inventory import write_inventory
from support.playbooks import run_playbook

PLAY = """
- name: Precheck, then wait for a reboot slot that the unreachable host holds
  hosts: gpunodes
  gather_facts: false
  tasks:
    - name: Check the role variables
      ansible.builtin.import_role:
        name: gpunode.tuning.tuning
        tasks_from: precheck
    - name: Take a slot
      gpunode.tuning.tuning_reboot:
        phase: reboot
        pending: [amd_pstate=active]
        unreachable: {gone: "simulated: no route to host"}
      register: slot
      when: inventory_hostname == 'a1'
      ignore_errors: true
    - name: Show what the wait did
      ansible.builtin.debug:
        msg: "SLOT {{ slot | to_json }}"
      when: inventory_hostname == 'a1'
"""


def test_poll_interval_and_wait_timeout_given_as_text_reach_the_reboot_sequence_as_numbers(tmp_path):
    playbook = tmp_path / "slot.yml"
    playbook.write_text(PLAY, encoding="utf-8")
    inventory = write_inventory(tmp_path / "hosts.yml", {"a1": tmp_path / "a1", "gone": tmp_path / "gone"},
                                report_dir=tmp_path / "reports", gpunode_tuning_reboot_ok=True,
                                gpunode_tuning_drain="none")
    proc = run_playbook(str(playbook), inventory, "-e", "gpunode_tuning_reboot_poll_interval=0.2",
                        "-e", "gpunode_tuning_reboot_wait_timeout=1")
    assert proc.returncode == 0, proc.stdout[-4000:]  # the precheck accepted both strings
    slot = json.loads(re.search(r'"msg": "SLOT (.*)"\n', proc.stdout).group(1).replace('\\"', '"'))
    assert slot["failed"] and "waited 1 s for a slot (gpunode_tuning_reboot_wait_timeout)" in slot["msg"], slot
    assert "counted out of service as unreachable: gone" in slot["msg"], slot
    assert 1 <= slot["waited"] < 3, slot  # polled every 0.2 s; every 5 s it would be 5 s or more
