"""The flows with facts injected as variables and without (``inject_facts_as_vars``).

The collection's actions export values with their results' ``ansible_facts`` (the host's failures in this run,
whether it needs a reboot, its verification in the rollout, the templated role variables); later tasks and
actions read them. Ansible keeps facts in ``ansible_facts`` always, and as top-level variables only while
``inject_facts_as_vars`` is on: many ansible.cfg files turn it off, ansible-core 2.21 deprecates its default
(a warning on every such read) and 2.24 ends it. Before the reads went through ``ansible_facts``, a knob family
that failed did not fail its host with it off. The checkout's ansible.cfg turns it off for every test; this one
runs the flows with the default too.
"""

from __future__ import annotations

import json
import os

import pytest
import simnode
from support.checkout import REPO, ansible_env
from support.inventory import write_inventory
from support.playbooks import failure_summary, run_playbook

BOOT_ID = "proc/sys/kernel/random/boot_id"


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read().strip()


def config_without_inject(tmp_path):
    """The checkout's ansible.cfg (which turns the injection off) without that line, its paths made absolute."""
    with open(os.path.join(REPO, "ansible.cfg"), encoding="utf-8") as fh:
        lines = [line.replace("./", REPO + "/") for line in fh if not line.startswith("inject_facts_as_vars")]
    path = tmp_path / "ansible.cfg"
    path.write_text("".join(lines))
    return str(path)


def no_fact_deprecation(proc):
    output = proc.stdout + proc.stderr
    assert "INJECT_FACTS_AS_VARS" not in output and "top-level facts" not in output, output[-3000:]


@pytest.mark.parametrize("inject", [None, "False"], ids=["default", "off"])
def test_failures_reboots_reuse_and_the_rollout_read_what_the_flows_exported(tmp_path, inject):
    env = ansible_env(ANSIBLE_CONFIG=config_without_inject(tmp_path))
    env.pop("ANSIBLE_INJECT_FACT_VARS", None)  # the default: on, deprecated from 2.21 (only the default warns)
    if inject:
        env["ANSIBLE_INJECT_FACT_VARS"] = inject
    roots = {"locked": str(tmp_path / "locked"), "audited": str(tmp_path / "audited")}
    simnode.build(roots["locked"], "locked-bus-perf", cpus=2, gpus=1)  # MRRS refused: a failed family
    simnode.build(roots["audited"], "audited-epyc-8gpu", cpus=2, gpus=1)  # needs amd_pstate=active and a reboot
    reports = tmp_path / "reports"
    inventory = write_inventory(tmp_path / "hosts.yml", roots, report_dir=reports, gpunode_tuning_reboot_ok=True,
                                gpunode_tuning_drain="none", gpunode_tuning_reboot_poll_interval=0.2)
    boot_ids = {h: read(r, BOOT_ID) for h, r in roots.items()}

    # Runtime, persistent and the reboot sequence in one run: the failed family fails its host at the end
    # (the failures record), keeps it from being rebooted, and the other host is rebooted (reboot_required).
    proc = run_playbook("tune.yml", inventory, "--tags", "runtime,persistent", env=env)
    assert proc.returncode == 2, proc.stdout[-4000:]
    assert "pcie_mrrs: kernel lockdown" in failure_summary(proc, "locked")
    assert "Not rebooting: tuning failed on this host in this run (pcie_mrrs: kernel lockdown" in proc.stdout
    assert read(roots["locked"], BOOT_ID) == boot_ids["locked"]
    assert read(roots["audited"], BOOT_ID) != boot_ids["audited"]
    assert proc.recap["audited"]["failed"] == 0
    no_fact_deprecation(proc)

    # The second flow task of a run reuses what the first templated (the resolved variables' fact).
    proc = run_playbook("tune.yml", inventory, "--tags", "runtime", "--limit", "audited",
                        env=dict(env, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    assert proc.returncode == 0, proc.stdout[-4000:]
    flows = [t["hosts"]["audited"] for p in json.loads(proc.stdout)["plays"] for t in p["tasks"]
             if t["hosts"].get("audited", {}).get("action") == "gpunode.tuning.tuning_flow"
             and "role_variables" in t["hosts"]["audited"]]
    assert [f["role_variables"] for f in flows] == ["templated", "reused"]

    # The one-task rollout's verification fleet summary reads each host's verification (its fact).
    proc = run_playbook("rollout.yml", inventory, "--limit", "audited", env=env)
    assert proc.returncode == 0, proc.stdout[-4000:]
    summary = (reports / "fleet-summary.md").read_text()
    assert "| audited |" in summary and "missing" not in summary, summary
    no_fact_deprecation(proc)
