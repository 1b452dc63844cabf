"""The variables are checked first, on the controller, by every playbook (roles/tuning/tasks/precheck.yml).

Failing runs stop at the first task, so they cost a few seconds each; the two runs that pass
are check-mode runs of one family. Each asserts what a user sees (a short message naming the
variable, its value and what is allowed) and that nothing was planned or written.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import simfleet
import simnode
import yaml
from support.checkout import VENV_BIN
from support.inventory import write_inventory
from support.nodes import assert_host_untouched
from support.playbooks import run_playbook
from support.trees import tree_digest

FATAL = re.compile(r"^fatal: \[[^\]]+\]: FAILED! => (\{.*\})$", re.M)


def failure_text(proc):
    """What the run printed from its first task to the recap: the error a user reads.

    ansible-core 2.19 also prints a failed task's message as text; before it the message is only
    in the result's JSON, with its quotes escaped: the decoded messages are added to what is read.
    """
    out = proc.stdout
    text = out[out.index("TASK ["):out.index("PLAY RECAP")]
    messages = [json.loads(m.group(1)).get("msg", "") for m in FATAL.finditer(text)]
    return "\n".join([text, *messages])


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("precheck")
    root = str(base / "node")
    simnode.build(root, "audited-epyc-8gpu", cpus=4, gpus=1)
    return root, write_inventory(base / "hosts.yml", {"sim-pre": root}, base / "reports")


def assert_nothing_done(proc, root, digest):
    assert proc.returncode != 0
    counts = proc.recap["sim-pre"]
    assert (counts["ok"], counts["changed"], counts["failed"]) == (0, 0, 1), proc.stdout[-2000:]
    assert tree_digest(root) == digest
    assert_host_untouched()


def test_bad_variable_is_one_short_line(node):
    root, inventory = node
    digest = tree_digest(root)
    proc = run_playbook("tune.yml", inventory, "-e", "gpunode_tuning_pcie_mrrs=300")
    assert_nothing_done(proc, root, digest)
    text = failure_text(proc)
    assert "value of gpunode_tuning_pcie_mrrs must be one of: 128, 256, 512, 1024, 2048, 4096, got: 300" in text
    # Not Ansible's validation task with its dump of the whole argument spec (~10 KB).
    assert "argument_spec_data" not in proc.stdout and "Validating arguments against arg spec" not in proc.stdout
    assert len(text) < 2000, text


@pytest.mark.parametrize("playbook, extra, expected", [
    ("verify.yml", {"gpunode_tuning_pcie_mrrs_enabled": "maybe"},
     'value of gpunode_tuning_pcie_mrrs_enabled must be a boolean (true or false), got: "maybe"'),
    ("rollback.yml", {"gpunode_tuning_kernel_cmdline_bootloader": "lilo"},
     "value of gpunode_tuning_kernel_cmdline_bootloader must be one of: auto, grub, grubby, got: lilo"),
    ("tune.yml", {"gpunode_tuning_kmod_modules": [{"nam": "nvidia_peermem"}]},
     "value of gpunode_tuning_kmod_modules must be a list of dicts with keys name (required), params, required, "
     'state, got: [{"nam": "nvidia_peermem"}] (missing required arguments: name'),
    ("verify.yml", {"gpunode_tuning_cpuidle_max_latency_us": "low"},
     'value of gpunode_tuning_cpuidle_max_latency_us must be an integer, got: "low"'),
])
def test_every_playbook_names_the_variable_its_value_and_what_is_allowed(node, playbook, extra, expected):
    root, inventory = node
    digest = tree_digest(root)
    proc = run_playbook(playbook, inventory, "-e", yaml.safe_dump(extra, default_flow_style=True).strip())
    assert_nothing_done(proc, root, digest)
    text = failure_text(proc)
    assert expected in text
    assert len(text) < 2000, text


@pytest.mark.parametrize("value", ["", "relative/node"])
def test_an_empty_or_relative_root_plans_nothing(node, value):
    # Today an empty root is the controller's /: a check run plans writes to its /etc.
    root, inventory = node
    digest = tree_digest(root)
    proc = run_playbook("tune.yml", inventory, "--check", "--diff", "-e", "gpunode_tuning_root=%s" % value)
    assert_nothing_done(proc, root, digest)
    text = failure_text(proc)
    assert "value of gpunode_tuning_root must be an absolute path" in text
    assert "/etc/sysctl.d" not in proc.stdout and "/etc/default/grub.d" not in proc.stdout


def test_unknown_variable_warns_with_the_nearest_name(node):
    root, inventory = node
    digest = tree_digest(root)
    proc = run_playbook("tune.yml", inventory, "--check", "--diff", "--tags", "pcie_mrrs",
                        "-e", "gpunode_tuning_pcie_mrs=4096", "-e", "gpunode_tuning_mrrs=2048")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    warnings = " ".join(proc.stderr.split())  # before 2.19 a warning is wrapped at 80 columns
    assert ("[WARNING]: gpunode_tuning_pcie_mrs is not a variable of gpunode.tuning "
            "(did you mean gpunode_tuning_pcie_mrrs?)" in warnings), proc.stderr
    assert warnings.count("gpunode_tuning_pcie_mrs is not a variable") == 1
    # A name from before 1.0.0: the warning names its current name; the plan is the preset's 4096, not 2048.
    assert ("[WARNING]: gpunode_tuning_mrrs is not a variable of gpunode.tuning (renamed to gpunode_tuning_pcie_mrrs "
            "before 1.0.0)" in warnings), proc.stderr
    assert '+        "mrrs": 4096' in proc.stdout and '"mrrs": 2048' not in proc.stdout, proc.stdout[-3000:]
    assert tree_digest(root) == digest


def test_unknown_variable_fails_when_strict(node):
    root, inventory = node
    digest = tree_digest(root)
    proc = run_playbook("tune.yml", inventory, "-e", "gpunode_tuning_pcie_mrs=4096",
                        "-e", "gpunode_tuning_strict_vars=true")
    assert_nothing_done(proc, root, digest)
    assert "gpunode_tuning_pcie_mrs is not a variable of gpunode.tuning (did you mean gpunode_tuning_pcie_mrrs?)" in \
        failure_text(proc)


def test_rollout_stops_before_the_first_batch(tmp_path):
    # One host of the fleet has a bad value: no host of any batch is touched.
    simfleet.build_fleet(str(tmp_path), 2, preset="epyc-pstate-epp", python=os.path.join(VENV_BIN, "python"))
    inventory = tmp_path / "hosts.yml"
    inv = yaml.safe_load(inventory.read_text())
    inv["all"]["children"]["gpunodes"]["hosts"]["sim-0002"]["gpunode_tuning_thp_mode"] = "sometimes"
    inventory.write_text(yaml.safe_dump(inv))
    nodes = {h: str(tmp_path / "nodes" / h) for h in ("sim-0001", "sim-0002")}
    before = {h: tree_digest(r) for h, r in nodes.items()}
    proc = run_playbook("rollout.yml", str(inventory), "-e", "gpunode_tuning_report_dir=%s" % (tmp_path / "reports"))
    assert proc.returncode != 0
    assert "value of gpunode_tuning_thp_mode must be one of: always, madvise, never, got: sometimes" in proc.stdout
    assert "Count the batch" not in proc.stdout
    assert {h: tree_digest(r) for h, r in nodes.items()} == before


# Issue 22, class 1 and the role-level cases of class 4: everything that can be judged without the node is
# refused by the precheck, before any family ran (on 1752866 each of these applied the other families first,
# or wrote the value into a file).
NODE_FREE = [
    ({"gpunode_tuning_gpu_bdfs": ["bogus"]}, "value of gpunode_tuning_gpu_bdfs: 'bogus' is not a PCI address"),
    ({"gpunode_tuning_gpu_class_prefixes": ["030"]},
     "value of gpunode_tuning_gpu_class_prefixes: class prefix '030'"),
    ({"gpunode_tuning_gpu_settings_power_limits": {"bogus": 300}},
     "value of gpunode_tuning_gpu_settings_power_limits: 'bogus'"),
    ({"gpunode_tuning_gpu_settings_locked_clocks": {"min": 1500}},
     "value of gpunode_tuning_gpu_settings_locked_clocks: locked_clocks must be a map {min: MHz, max: MHz}"),
    ({"gpunode_tuning_cpuidle_disable": ["C2;reboot"]}, "value of gpunode_tuning_cpuidle_disable: idle state name"),
    ({"gpunode_tuning_cpuidle_cpus": "0-3,x"}, "value of gpunode_tuning_cpuidle_cpus: cpulist '0-3,x' is invalid"),
    ({"gpunode_tuning_sysctl_extra": {"vm swappiness": 1}}, "sysctl key 'vm swappiness' is invalid"),
    ({"gpunode_tuning_sysctl_extra": {"vm.swappiness": -5}}, "vm.swappiness: value '-5' is not accepted"),
    ({"gpunode_tuning_kmod_modules": [{"name": "-r"}]}, "value of gpunode_tuning_kmod_modules: module name '-r'"),
    ({"gpunode_tuning_kernel_cmdline_args": ["pci=disable_acs_redir=ZZZZ:00:01.1"]},
     "gpunode_tuning_kernel_cmdline_args"),
    ({"gpunode_tuning_pcie_acs": "disable_redirect", "gpunode_tuning_pcie_acs_persist": "kernel_arg",
      "gpunode_tuning_kernel_cmdline_enabled": False},
     "gpunode_tuning_pcie_acs_persist: kernel_arg needs gpunode_tuning_kernel_cmdline_enabled: true"),
    ({"gpunode_tuning_report_dir": "reports\nx"}, "value of gpunode_tuning_report_dir must be a directory path"),
]


@pytest.mark.parametrize("extra, expected", NODE_FREE, ids=[next(iter(e)).replace("gpunode_tuning_", "")
                                                            for e, _x in NODE_FREE])
def test_what_needs_no_node_is_refused_before_any_family_runs(node, extra, expected):
    root, inventory = node
    digest = tree_digest(root)
    proc = run_playbook("tune.yml", inventory, "-e", json.dumps(extra))
    assert_nothing_done(proc, root, digest)
    text = failure_text(proc)
    assert "bad variable(s), nothing was changed" in text and expected in text, text[-3000:]


# Issue 22, class 2: nonsense batch settings are refused before any host is touched (on 1752866 0 and -1
# became one batch of every host, "0%" batches of one, "abc" crashed ansible-playbook with rc 250).
@pytest.mark.parametrize("extra, variable", [
    ({"gpunode_tuning_rollout_batch": 0}, "gpunode_tuning_rollout_batch"),
    ({"gpunode_tuning_rollout_batch": -1}, "gpunode_tuning_rollout_batch"),
    ({"gpunode_tuning_rollout_batch": "0%"}, "gpunode_tuning_rollout_batch"),
    ({"gpunode_tuning_rollout_batch": "-50%"}, "gpunode_tuning_rollout_batch"),
    ({"gpunode_tuning_rollout_batch": "abc"}, "gpunode_tuning_rollout_batch"),
    ({"gpunode_tuning_rollout_batch": [1, "abc"]}, "gpunode_tuning_rollout_batch"),
    ({"gpunode_tuning_rollout_max_fail_percentage": "abc"}, "gpunode_tuning_rollout_max_fail_percentage"),
], ids=["batch-0", "batch-minus-1", "batch-0pct", "batch-minus-50pct", "batch-abc", "batch-list-abc", "maxfail-abc"])
def test_the_rollout_refuses_nonsense_batch_settings_before_any_host(node, extra, variable):
    root, inventory = node
    digest = tree_digest(root)
    proc = run_playbook("rollout.yml", inventory, "-e", json.dumps(extra))
    assert proc.returncode not in (0, 250), proc.stdout[-3000:]
    assert "Unexpected Exception" not in proc.stdout + proc.stderr
    assert "bad rollout setting(s), nothing was changed: %s must be" % variable in proc.stdout, proc.stdout[-3000:]
    assert tree_digest(root) == digest


def test_what_needs_the_node_stays_that_familys_failure_and_the_others_are_applied(tmp_path):
    # 0-999 is a well-formed cpulist: only the node can say that it has 4 CPUs.
    root = str(tmp_path / "node")
    simnode.build(root, "audited-epyc-8gpu", cpus=4, gpus=1)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-cpus": root}, gpunode_tuning_cpuidle_cpus="0-999")
    proc = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert proc.returncode != 0
    text = failure_text(proc)
    assert "failed for these knob families (every other family ran): cpuidle: cpus='0-999'" in text, text[-3000:]
    with open(os.path.join(root, "proc/sys/kernel/numa_balancing"), encoding="utf-8") as handle:
        assert handle.read().strip() == "0"  # the other families were applied
