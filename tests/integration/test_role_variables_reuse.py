"""The role's variables are templated once per host and reused by its later flow tasks while nothing they are
templated from changed (action tuning_flow, role_variables.inputs_digest; issue 31).

One playbook run, controller side only (precheck flows: nothing runs on the node): a set_fact of a role
variable, a set_fact of a variable a role variable's template names, and an include_vars between two flow
tasks must each be seen; a fact the role exports (a flow's result) is no input; a variable built with a
lookup is never reused.
"""

from __future__ import annotations

import json

import yaml
from support.checkout import ansible_env
from support.inventory import write_inventory
from support.nodes import build_node
from support.playbooks import assert_ok, run_playbook

STEPS = ("first", "second", "after_set_fact", "after_indirect", "after_include_vars", "again")


def _precheck(register):
    return {"name": "Run the precheck flow (%s)" % register,
            "ansible.builtin.include_role": {"name": "gpunode.tuning.tuning", "tasks_from": "precheck"}}, {
        "name": "Keep what it returned (%s)" % register,
        "ansible.builtin.set_fact": {register: "{{ __gpunode_tuning_state }}"}}


def test_later_flow_tasks_reuse_the_variables_and_see_every_change(tmp_path):
    root = build_node(tmp_path / "node", cpus=2, gpus=1)
    inventory = write_inventory(
        tmp_path / "hosts.yml", {"sim-plain": root, "sim-lookup": root},
        host_vars={"sim-plain": {"my_swappiness": 10,
                                 "gpunode_tuning_sysctl_extra": {"vm.swappiness": "{{ my_swappiness }}"}},
                   "sim-lookup": {"my_swappiness": 10,
                                  "gpunode_tuning_sysctl_extra": {
                                      "vm.swappiness": "{{ lookup('ansible.builtin.env', 'GPUNODE_SWAPPINESS') }}"}}})
    (tmp_path / "more.yml").write_text("gpunode_tuning_numa_balancing: 1\n", encoding="utf-8")
    tasks = [*_precheck("first"), *_precheck("second"),
             {"name": "Change a role variable", "ansible.builtin.set_fact": {"gpunode_tuning_thp_mode": "never"}},
             *_precheck("after_set_fact"),
             {"name": "Change what a role variable is templated from",
              "ansible.builtin.set_fact": {"my_swappiness": 33}},
             *_precheck("after_indirect"),
             {"name": "Load a role variable from a file",
              "ansible.builtin.include_vars": {"file": str(tmp_path / "more.yml")}},
             *_precheck("after_include_vars"),
             {"name": "Export a fact as a flow does (an output of the role, not an input)",
              "ansible.builtin.set_fact": {"gpunode_tuning_pending_kernel_args": ["iommu=pt"]}},
             *_precheck("again"),
             {"name": "Write what each step returned", "ansible.builtin.copy": {
                 "dest": str(tmp_path) + "/{{ inventory_hostname }}.json",
                 "content": "{{ {%s} | to_json }}" % ", ".join("'%s': %s" % (s, s) for s in STEPS)}}]
    playbook = tmp_path / "reuse.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Reuse", "hosts": "gpunodes", "gather_facts": False,
                                         "tasks": tasks}]), encoding="utf-8")
    proc = run_playbook(str(playbook), inventory, "-f", "2", env=dict(ansible_env(), GPUNODE_SWAPPINESS="20"))
    assert_ok(proc)

    plain = json.loads((tmp_path / "sim-plain.json").read_text(encoding="utf-8"))
    assert {s: plain[s]["role_variables"] for s in STEPS} == {
        "first": "templated", "second": "reused", "after_set_fact": "templated", "after_indirect": "templated",
        "after_include_vars": "templated", "again": "reused"}
    desired = {s: plain[s]["desired"] for s in STEPS}
    assert desired["second"] == desired["first"]
    assert desired["first"]["thp"]["enabled"] == "madvise"
    assert desired["after_set_fact"]["thp"]["enabled"] == "never"
    assert desired["after_set_fact"]["sysctl"]["vm.swappiness"] == 10
    assert desired["after_indirect"]["sysctl"]["vm.swappiness"] == 33
    assert desired["after_indirect"]["numa_balancing"] == 0
    assert desired["after_include_vars"]["numa_balancing"] == 1
    assert desired["again"] == desired["after_include_vars"]

    looked_up = json.loads((tmp_path / "sim-lookup.json").read_text(encoding="utf-8"))
    assert {looked_up[s]["role_variables"] for s in STEPS} == {"templated"}
    assert str(looked_up["again"]["desired"]["sysctl"]["vm.swappiness"]) == "20"
