"""The default flows on an arm64 GPU node (tools/simnode preset grace-arm64-4gpu).

Grace-class nodes run psci_idle and cppc_cpufreq and have no vendor_id in /proc/cpuinfo. The
default preset asks for ``driver: native`` (the CPU vendor's pstate driver), which such a CPU
does not have: the running driver is kept and reported not applicable, and everything else
(MRRS, C-states, governor, tunables) is applied, verified and rolled back as on x86 nodes.

One node goes through what tools/demo.py runs against the audited EPYC node: audit, runtime
tuning, verification, persistent tuning, rollback.

The same rule serves an x86 node pinned to another driver than the preset's: the audited EPYC
with ``-e gpunode_tuning_cpufreq_driver=acpi-cpufreq`` and the default preset's
``amd_pstate_mode: active``, which applies to amd-pstate only.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from support.inventory import REPORT_DIR, write_inventory
from support.nodes import JOURNAL, PERSISTENT_FILES, assert_host_untouched, build_node, cstate_disabled, read_mrrs
from support.playbooks import assert_ok, run_playbook
from support.trees import snapshot, tree_changes

PRESET = "grace-arm64-4gpu"
HOST = "sim-arm64"
GPUS = ["0001:01:00.0", "0002:01:00.0", "0003:01:00.0", "0004:01:00.0"]
CPUS = set(range(72))
KEEP_DRIVER = "so the running driver cppc_cpufreq is kept"


def report():
    with open(os.path.join(REPORT_DIR, HOST + ".json"), encoding="utf-8") as fh:
        return json.load(fh)


def rows(rep, family):
    return {s["name"]: s for s in rep["settings"] if s["family"] == family}


def sysfs(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read().strip()


def governors(root):
    return {sysfs(root, os.path.join(p, "scaling_governor"))
            for p in glob.glob(os.path.join(root, "sys/devices/system/cpu/cpufreq/policy*"))}


@pytest.fixture(scope="module")
def arm_node(tmp_path_factory):
    base = tmp_path_factory.mktemp("arm64")
    root = build_node(base / "node", PRESET)
    inventory = write_inventory(base / "hosts.yml", {HOST: root})
    return root, inventory


def test_the_preset_is_an_arm64_node_without_x86_files(arm_node):
    root, _inventory = arm_node
    cpuinfo = sysfs(root, "proc/cpuinfo")
    assert "CPU implementer\t: 0x41" in cpuinfo and "vendor_id" not in cpuinfo and "model name" not in cpuinfo
    assert sysfs(root, "sys/devices/system/cpu/cpuidle/current_driver") == "psci_idle"
    assert sysfs(root, "sys/devices/system/cpu/cpufreq/policy0/scaling_driver") == "cppc_cpufreq"
    for x86 in ("amd_pstate", "intel_pstate", "cpufreq/boost", "cpu0/cpufreq/energy_performance_preference"):
        assert not os.path.exists(os.path.join(root, "sys/devices/system/cpu", x86)), x86
    assert not os.path.exists(os.path.join(root, "sys/module/processor"))
    for bdf in GPUS:
        assert sysfs(root, "sys/bus/pci/devices/%s/class" % bdf) == "0x030200"
        assert read_mrrs(root, bdf) == 512


def test_default_flows_on_an_arm64_node(arm_node):
    root, inventory = arm_node
    before = snapshot(root)

    # 1. audit: the untuned node drifts (MRRS, C-states, governor, tunables); nothing fails to evaluate.
    audit = run_playbook("verify.yml", inventory)
    assert audit.returncode == 2, audit.stdout[-6000:]
    rep = report()
    assert rep["status"] == "fail"
    driver = rows(rep, "cpufreq")["driver"]
    assert driver["state"] == "not_applicable" and KEEP_DRIVER in driver["reason"], driver
    assert rows(rep, "cpufreq")["governor"]["state"] == "drifted"
    assert tree_changes(before, snapshot(root)) == []

    # 2. runtime tuning: every family applied; the driver is kept and says why (-v shows the results).
    tuned = run_playbook("tune.yml", inventory, "--tags", "runtime", "-v")
    assert_ok(tuned)
    assert tuned.recap[HOST]["failed"] == 0
    assert [read_mrrs(root, bdf) for bdf in GPUS] == [4096] * 4
    assert cstate_disabled(root, "cpu-sleep-0") == CPUS and cstate_disabled(root, "cluster-sleep-0") == CPUS
    assert cstate_disabled(root, "WFI") == set()
    assert governors(root) == {"performance"}
    assert sysfs(root, "proc/sys/kernel/numa_balancing") == "0"
    assert sysfs(root, "proc/sys/vm/swappiness") == "10"
    assert "[madvise]" in sysfs(root, "sys/kernel/mm/transparent_hugepage/enabled")
    assert KEEP_DRIVER in tuned.stdout
    assert "CPU vendor is unknown" not in tuned.stdout
    assert os.path.isfile(os.path.join(root, JOURNAL))

    # 3. verify: passes; the driver is not applicable, not drifted.
    verified = run_playbook("verify.yml", inventory)
    assert verified.returncode == 0, verified.stdout[-6000:]
    rep = report()
    cpufreq = rows(rep, "cpufreq")
    assert cpufreq["driver"]["state"] == "not_applicable" and KEEP_DRIVER in cpufreq["driver"]["reason"]
    assert cpufreq["governor"]["state"] == "applied"
    assert not [s for s in rep["settings"] if s["state"] == "drifted"]

    # 4. persistent: no kernel argument for a driver switch (there is none to switch to).
    persistent = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert_ok(persistent)
    assert not os.path.exists(os.path.join(root, "etc/default/grub.d/60-gpunode-tuning.cfg"))
    assert os.path.isfile(os.path.join(root, "etc/sysctl.d/90-gpunode-tuning.conf"))

    # 5. rollback: the original tree (the kernel log aside).
    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    left = tree_changes(before, snapshot(root))
    assert left == [], left
    assert not PERSISTENT_FILES & set(snapshot(root))
    assert_host_untouched()


def test_pinning_acpi_cpufreq_with_the_default_preset_tunes_and_verifies(tmp_path):
    root = build_node(tmp_path / "node")
    inventory = write_inventory(tmp_path / "hosts.yml", {HOST: root})
    pin = ("-e", "gpunode_tuning_cpufreq_driver=acpi-cpufreq")
    tuned = run_playbook("tune.yml", inventory, "--tags", "runtime", "-v", *pin)
    assert_ok(tuned)
    assert "amd_pstate_mode applies to the amd-pstate driver only; the desired driver is acpi-cpufreq" in tuned.stdout
    assert "switching the driver needs" not in tuned.stdout
    assert governors(root) == {"performance"}
    assert cstate_disabled(root, "C2") == set(range(128))
    verified = run_playbook("verify.yml", inventory, *pin)
    assert verified.returncode == 0, verified.stdout[-6000:]
    cpufreq = rows(report(), "cpufreq")
    assert cpufreq["driver"]["state"] == "applied" and cpufreq["driver"]["desired"] == "acpi-cpufreq"
    assert cpufreq["governor"]["state"] == "applied"
