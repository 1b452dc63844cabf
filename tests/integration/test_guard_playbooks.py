"""The guard through the playbooks: the persistent flow installs it, a drift is named exactly, rollback removes it.

tune.yml installs the guard on a simulated node (its config, service, timer and wants link, the boot
runner it runs); the test runs the installed runner as the service does, with the node's python3
(``/usr/bin/python3``: no Ansible there) and ``--root``, injects the drift of issue 23 (NUMA
balancing back to 1, one GPU's MRRS back to 512) and checks that the status file and the metrics
name exactly those settings; rollback must leave the tree as it was before (the kernel log aside).
verify.yml's reports name the sysctl file that overrides a key at boot.
"""

from __future__ import annotations

import json
import os

import simnode
from support.inventory import REPORT_DIR, write_inventory
from support.nodes import BOOT_RUNNER, assert_host_untouched, build_node, inject_drift
from support.playbooks import assert_ok, run_playbook
from support.runner import GUARD_CONFIG, GUARD_STATUS, PROM, run_guard
from support.trees import snapshot, tree_changes

GUARD_FILES = {
    "etc/gpunode-tuning/guard.json",
    "etc/systemd/system/gpunode-tuning-guard.service",
    "etc/systemd/system/gpunode-tuning-guard.timer",
    "etc/systemd/system/timers.target.wants/gpunode-tuning-guard.timer",
}


def guard_status(root):
    with open(os.path.join(root, GUARD_STATUS), encoding="utf-8") as fh:
        return json.load(fh)


def drifted_series(root):
    """``{(family, setting)}`` whose drifted state series is 1 in the .prom file."""
    out = set()
    with open(os.path.join(root, PROM), encoding="utf-8") as fh:
        for line in fh:
            if line.startswith('gpunode_tuning_setting_state{') and 'state="drifted"} 1' in line:
                labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split('",'))
                out.add((labels["family"].strip('"'), labels["setting"].strip('"')))
    return out


def test_persistent_guard_names_exactly_the_drift_and_rollback_removes_it(tmp_path, tuned_node):
    root, inventory, before = tuned_node("sim-guard")
    added = set(snapshot(root)) - set(before)
    assert GUARD_FILES <= added, sorted(GUARD_FILES - added)
    service = (tmp_path / "node/etc/systemd/system/gpunode-tuning-guard.service").read_text().splitlines()
    assert "ExecStart=/usr/bin/python3 -I -B /%s guard --config %s" % (BOOT_RUNNER, GUARD_CONFIG) in service
    timer = (tmp_path / "node/etc/systemd/system/gpunode-tuning-guard.timer").read_text().splitlines()
    assert "OnUnitActiveSec=300s" in timer
    # Everything verification needs is on the node; desired.json keeps its format for the boot runner.
    with open(os.path.join(root, GUARD_CONFIG.lstrip("/")), encoding="utf-8") as fh:
        config = json.load(fh)
    assert config["desired"]["sysctl"]["vm.swappiness"] == 10 and config["desired"]["numa_balancing"] == 0
    assert {"pcie_mrrs", "cpuidle", "cpufreq", "thp", "kmod", "kernel_cmdline", "gpu_health", "pcie_acs"} <= set(
        config["desired"])
    # The GPUs' selector as verification gets it (what is not set is left out).
    assert config["facts"]["pci_selector"] == {"vendor": ["10de", "1002"],
                                               "class_prefixes": ["0300", "0302", "0380", "1200"]}
    assert config["verify"]["host"] == "sim-guard" and config["guard"]["textfile_dir"] == "/var/lib/prometheus/" \
                                                                                          "node-exporter"
    with open(os.path.join(root, "etc/gpunode-tuning/desired.json"), encoding="utf-8") as fh:
        assert "sysctl" not in json.load(fh)

    first = run_guard(root)
    st = guard_status(root)
    assert st["verdict"] == "pass", first.stdout
    assert [s["id"] for s in st["settings"] if s["state"] == "drifted"] == []
    assert drifted_series(root) == set()

    inject_drift(root)
    run_guard(root)
    st = guard_status(root)
    assert st["verdict"] == "fail"
    assert {s["id"] for s in st["settings"] if s["state"] == "drifted"} == {
        "numa_balancing.kernel.numa_balancing", "pcie_mrrs.0000:61:00.0"}
    assert drifted_series(root) == {("numa_balancing", "kernel.numa_balancing"), ("pcie_mrrs", "0000:61:00.0")}
    assert all(s["first_seen_drifted"] for s in st["settings"] if s["state"] == "drifted")

    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    left = tree_changes(before, snapshot(root))
    assert left == [], left
    assert_host_untouched()


def test_guard_disabled_installs_nothing_of_it(tmp_path):
    root = build_node(tmp_path / "node", cpus=2, gpus=1)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-noguard": root})
    before = snapshot(root)
    proc = run_playbook("tune.yml", inventory, "--tags", "guard", "-e", "gpunode_tuning_guard_enabled=false")
    assert_ok(proc)
    assert tree_changes(before, snapshot(root)) == []


def test_a_later_sysctl_file_is_named_in_verify_reports(tmp_path):
    """A cloud image's /etc/sysctl.d/cloud-optimization.conf (NVIDIA/aicr#239) wins over the drop-in at boot."""
    root = build_node(tmp_path / "node", cpus=4, gpus=1)
    simnode.write_sysctl_file(root)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-cloud": root})
    assert_ok(run_playbook("tune.yml", inventory, "--tags", "runtime,sysctl"))
    # The next boot: systemd-sysctl applies our drop-in, then the image's file.
    with open(os.path.join(root, "proc/sys/vm/swappiness"), "w", encoding="utf-8") as fh:
        fh.write("60\n")
    report_dir = os.path.join(REPORT_DIR, "cloud")
    proc = run_playbook("verify.yml", inventory, "-e", "gpunode_tuning_report_dir=%s" % report_dir)
    assert proc.returncode == 2, proc.stdout[-3000:]
    with open(os.path.join(report_dir, "sim-cloud.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    swap = next(s for s in report["settings"] if s["id"] == "sysctl.vm.swappiness")
    assert swap["state"] == "drifted" and swap["persisted"] == "10"
    assert swap["cause"] == {"kind": "sysctl_override", "file": "/etc/sysctl.d/cloud-optimization.conf",
                             "value": "60"}
    assert "/etc/sysctl.d/cloud-optimization.conf sets vm.swappiness = 60 after" in swap["reason"]
    with open(os.path.join(report_dir, "sim-cloud.md"), encoding="utf-8") as fh:
        assert "/etc/sysctl.d/cloud-optimization.conf" in fh.read()


def test_without_node_exporter_the_guard_runs_metrics_off_and_turning_it_off_removes_it(tmp_path):
    """No textfile directory: the persistent flow says so once and installs the guard; its runs succeed writing
    the status only. gpunode_tuning_guard_enabled=false and the persistent flow again: nothing of it is left."""
    root = build_node(tmp_path / "node", cpus=2, gpus=1)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-noexporter": root})
    before = snapshot(root)
    proc = run_playbook("tune.yml", inventory, "--tags", "guard")
    assert_ok(proc)
    said = " ".join((proc.stdout + proc.stderr).split())
    assert said.count("textfile directory /var/lib/prometheus/node-exporter does not exist") == 1, proc.stdout[-3000:]
    assert "prometheus-node-exporter" in said and "gpunode_tuning_guard_textfile_dir" in said
    assert GUARD_FILES <= set(snapshot(root))
    run_guard(root)  # exit 0 (run_guard asserts it)
    st = guard_status(root)
    assert st["run"]["success"] and st["metrics"]["off"] and not os.path.exists(os.path.join(root, PROM))
    proc = run_playbook("tune.yml", inventory, "--tags", "guard", "-e", "gpunode_tuning_guard_enabled=false")
    assert_ok(proc)
    left = tree_changes(before, snapshot(root))
    assert left == [], left
