"""The gpu_locality family through the playbooks, on the 2-socket simulated node and its numa_node -1 variant.

verify.yml: every GPU's row gives its NUMA node, CPUs and nearest NIC/NVMe with the relation the
preset's layout has (tools/simnode/topology.py, _switches_topology), the remote IRQs per device, the -1
firmware as a finding, the Markdown section and <host>.topology.json beside the reports.
tune.yml --tags persistent: /etc/gpunode-tuning/topology.json (valid against docs/topology.schema.json,
a rerun changes nothing, --check writes nothing), the boot runner refreshes it, rollback.yml removes it.
"""

from __future__ import annotations

import json
import os
import subprocess

import jsonschema
import pytest
import simnode
from support.checkout import REPO, VENV_BIN, ansible_env
from support.inventory import write_inventory
from support.nodes import BOOT_DESIRED, assert_host_untouched
from support.playbooks import assert_ok, run_playbook
from support.runner import run_boot_runner
from support.trees import snapshot, tree_changes

SCHEMA = os.path.join(REPO, "docs", "topology.schema.json")
EXPORT = "etc/gpunode-tuning/topology.json"
CPUS = 16  # 2 NUMA nodes: CPUs 0-7 and 8-15
# The preset's layout: GPU -> (NUMA node, nearest NIC, relation, nearest NVMe, relation).
LAYOUT = {
    "0000:13:00.0": (0, "0000:15:00.0", "PIX", "0000:16:00.0", "PIX"),
    "0000:14:00.0": (0, "0000:15:00.0", "PIX", "0000:16:00.0", "PIX"),
    "0000:31:00.0": (0, "0000:15:00.0", "NODE", "0000:16:00.0", "NODE"),
    "0000:32:00.0": (0, "0000:15:00.0", "NODE", "0000:16:00.0", "NODE"),
    "0000:4f:00.0": (1, "0000:7a:00.0", "NODE", "0000:55:00.0", "PXB"),
    "0000:50:00.0": (1, "0000:7a:00.0", "NODE", "0000:55:00.0", "PXB"),
    "0000:6d:00.0": (1, "0000:7a:00.0", "PHB", "0000:55:00.0", "NODE"),
    "0000:6e:00.0": (1, "0000:7a:00.0", "PHB", "0000:55:00.0", "NODE"),
}
NAMES = {"0000:15:00.0": "(mlx5_0, ibp21s0)", "0000:7a:00.0": "(mlx5_1, enp122s0np0)",
         "0000:16:00.0": "(nvme0)", "0000:55:00.0": "(nvme1)"}


def schema():
    with open(SCHEMA, encoding="utf-8") as fh:
        return json.load(fh)


def rows(result):
    return {s["name"]: s for s in result["settings"] if s["family"] == "gpu_locality"}


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    base = tmp_path_factory.mktemp("locality")
    roots = {"loc": str(base / "loc"), "nonuma": str(base / "nonuma")}
    simnode.build(roots["loc"], "xeon-2s-8gpu-switches", cpus=CPUS, nvidia_smi=True)
    simnode.build(roots["nonuma"], "xeon-2s-8gpu-switches-nonuma", cpus=CPUS)
    before = {n: snapshot(r) for n, r in roots.items()}
    reports = base / "reports"
    proc = run_playbook("verify.yml", write_inventory(base / "inv.yml", roots, reports))
    after = {n: snapshot(r) for n, r in roots.items()}
    results = {n: json.loads((reports / ("%s.json" % n)).read_text()) for n in roots}
    return {"proc": proc, "reports": reports, "results": results, "before": before, "after": after}


def test_verify_reports_each_gpus_node_cpus_and_nearest_nic_as_the_preset_lays_them_out(verified):
    assert verified["before"] == verified["after"]  # verification writes nothing on the node
    got = rows(verified["results"]["loc"])
    for bdf, (numa, nic, nic_rel, nvme, nvme_rel) in LAYOUT.items():
        row = got[bdf]
        cpus = "0-7" if numa == 0 else "8-15"
        assert row["running"] == "node %d, CPUs %s; NIC %s %s %s; NVMe %s %s %s" % (
            numa, cpus, nic, NAMES[nic], nic_rel, nvme, NAMES[nvme], nvme_rel), row
        assert row["state"] == "applied", row
        # The node-local nvidia-smi stand-in prints topo -m's affinity columns from the GPU's sysfs.
        assert "nvidia-smi topo -m agrees on the CPU/NUMA affinity" in row["reason"]
    assert "1 of 1 MSI-X IRQ(s) served only on another NUMA node (CPUs 0)" in got["0000:50:00.0"]["reason"]
    assert "4 of 16 MSI-X IRQ(s) served only on another NUMA node (CPUs 12-15)" in got["nic.0000:15:00.0"]["reason"]
    assert got["nic.0000:15:00.0"]["state"] == "applied"
    assert got["nic.0000:7a:00.0"]["reason"] == "IRQs: 16 MSI-X IRQ(s), none served only on another NUMA node"
    assert got["irqbalance"]["running"].startswith("running (pid %d" % simnode.IRQBALANCE_PID)
    assert verified["results"]["loc"]["families"]["gpu_locality"]["applied"] == 11


def test_the_minus_one_firmware_is_a_finding_on_each_gpu_it_hides(verified):
    got = rows(verified["results"]["nonuma"])
    for bdf in ("0000:4f:00.0", "0000:50:00.0", "0000:6d:00.0", "0000:6e:00.0"):
        assert got[bdf]["state"] == "drifted"
        assert got[bdf]["reason"].startswith("firmware publishes no NUMA affinity for %s (numa_node -1)" % bdf)
        assert got[bdf]["running"].startswith("no NUMA node, CPUs 0-15;")
    assert all(got[b]["state"] == "applied" for b in ("0000:13:00.0", "0000:14:00.0", "0000:31:00.0", "0000:32:00.0"))
    text = (verified["reports"] / "nonuma.md").read_text()
    assert "| `gpu_locality.0000:4f:00.0` | **drifted** |" in text
    assert "gpu_locality (4)" in " ".join(verified["results"]["nonuma"]["failures"])


def test_the_markdown_section_and_the_topology_export_beside_the_reports(verified):
    text = (verified["reports"] / "loc.md").read_text()
    assert "## GPU locality\n" in text
    assert "| 0000:6d:00.0 | 6 | 1 | 8-15 | 0000:7a:00.0 (mlx5_1, enp122s0np0) | PHB | 0000:55:00.0 (nvme1) | NODE |" \
        in text
    assert "`numactl --cpunodebind=1 --membind=1 <command>`" in text
    assert "--numa-bind-nodes 0 0 0 0 1 1 1 1" in text and "--numa-node 0 0 0 0 1 1 1 1" in text
    document = json.loads((verified["reports"] / "loc.topology.json").read_text())
    jsonschema.validate(document, schema())
    assert [document["gpus"][b]["nvidia_smi_index"] for b in sorted(LAYOUT)] == list(range(8))
    assert {b: (g["numa_node"], g["nearest_nic"]["pci"], g["nearest_nic"]["relation"])
            for b, g in document["gpus"].items()} == {b: v[:3] for b, v in LAYOUT.items()}
    nonuma = json.loads((verified["reports"] / "nonuma.topology.json").read_text())
    jsonschema.validate(nonuma, schema())
    assert nonuma["gpus"]["0000:4f:00.0"]["numa_node"] is None
    assert "| GPU locality |" in (verified["reports"] / "fleet-summary.md").read_text()


def test_persistent_writes_the_export_the_boot_runner_refreshes_and_rollback_removes(tmp_path):
    root = str(tmp_path / "node")
    simnode.build(root, "xeon-2s-8gpu-switches", cpus=8, nvidia_smi=True)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-loc": root})
    before = snapshot(root)

    dry = run_playbook("tune.yml", inventory, "--tags", "persistent", "--check", "--diff")
    assert_ok(dry)
    assert snapshot(root) == before  # check mode writes nothing
    assert "topology.json" in dry.stdout

    tuned = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert_ok(tuned)
    with open(os.path.join(root, EXPORT), encoding="utf-8") as fh:
        text = fh.read()
    document = json.loads(text)
    jsonschema.validate(document, schema())
    assert document["gpus"]["0000:6d:00.0"]["nearest_nic"]["relation"] == "PHB"
    assert document["gpus"]["0000:13:00.0"]["nvidia_smi_index"] == 0
    with open(os.path.join(root, BOOT_DESIRED.lstrip("/")), encoding="utf-8") as fh:
        assert json.load(fh)["gpu_locality"] == {"remote_irqs_fail": False, "export": "/" + EXPORT}

    again = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert_ok(again)
    assert again.recap["sim-loc"]["changed"] == 0, again.stdout[-4000:]

    # The boot runner (the unit's ExecStart), with this node's desired state, on a node of the same
    # hardware that has no export yet (it re-applies the runtime families too, which rollback could not
    # undo here): it writes the same bytes.
    fresh = str(tmp_path / "fresh")
    simnode.build(fresh, "xeon-2s-8gpu-switches", cpus=8, nvidia_smi=True)
    run = run_boot_runner(root, fresh)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "gpunode-tuning-boot: gpu_locality: /%s written (8 GPUs, 2 NICs, 2 NVMe drives; nvidia-smi answered)" \
        % EXPORT in run.stdout
    with open(os.path.join(fresh, EXPORT), encoding="utf-8") as fh:
        assert fh.read() == text

    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    assert not os.path.lexists(os.path.join(root, EXPORT))
    left = tree_changes(before, snapshot(root))
    assert left == [], left
    assert_host_untouched()


def test_the_export_of_the_module_and_of_the_verification_are_the_same_bytes(tmp_path, verified):
    """What a launcher reads on the node and what the controller keeps agree for the same node."""
    root = str(tmp_path / "node")
    simnode.build(root, "xeon-2s-8gpu-switches", cpus=CPUS, nvidia_smi=True)
    cmd = [os.path.join(VENV_BIN, "ansible"), "localhost", "-c", "local", "-m", "gpunode.tuning.gpu_locality",
           "-a", "root=%s" % root, "-e", "ansible_python_interpreter=%s" % os.path.join(VENV_BIN, "python")]
    env = ansible_env()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(os.path.join(root, EXPORT), encoding="utf-8") as fh:
        node_text = fh.read()
    assert node_text == (verified["reports"] / "loc.topology.json").read_text()
