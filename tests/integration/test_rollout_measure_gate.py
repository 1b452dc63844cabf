"""The rollout's measure gate (gpunode_tuning_rollout_benchmark_command) on a simulated fleet.

Each node gets the benchmark stand-in of tools/simnode (``usr/bin/gpunode-sim-bench``), whose
number comes from the node's MRRS and ACS state: the ``inverse`` kind gets worse with tuning, so
the canary misses the gate, is rolled back, and the rollout stops; the ``normal`` kind gets better,
so the canary passes with its gain in the summary.
"""

from __future__ import annotations

import glob
import json
import os

import simfleet
import simnode
from support.checkout import VENV_BIN
from support.nodes import JOURNAL
from support.playbooks import by_host, rollout
from support.trees import tree_digest

# Jinja in an extra var: each host runs the stand-in of its own simulated root.
STAND_IN = "{{ gpunode_tuning_root }}/usr/bin/gpunode-sim-bench"
BENCH = json.dumps({"gpunode_tuning_rollout_benchmark_command": [STAND_IN]})


def pci_configs(root):
    """The bytes of every PCI function's config space (MRRS and ACS live there)."""
    return {path: open(path, "rb").read() for path in sorted(glob.glob(os.path.join(root, "sys/devices/pci*/**/config"),
                                                                       recursive=True))}


def test_benchmark_that_gets_worse_rolls_the_canary_back_and_stops_the_rollout(tmp_path):
    simfleet.build_fleet(str(tmp_path), 3, python=os.path.join(VENV_BIN, "python"))
    # A min_gain that is no fraction stops the rollout in its variable checks, before any write.
    proc, _summary, _reports = rollout(str(tmp_path), "-e", BENCH, "-e", "gpunode_tuning_rollout_benchmark_min_gain=x")
    assert proc.returncode != 0
    assert "gpunode_tuning_rollout_benchmark_min_gain must be a fraction above -1" in proc.stdout
    assert "(got x)" in proc.stdout
    assert not glob.glob(os.path.join(str(tmp_path), "nodes", "*", JOURNAL))
    nodes = os.path.join(str(tmp_path), "nodes")
    for host in ("sim-0001", "sim-0002", "sim-0003"):
        simnode.write_benchmark(os.path.join(nodes, host), "inverse")
    canary_root = os.path.join(nodes, "sim-0001")
    configs = pci_configs(canary_root)
    assert configs
    later = {h: tree_digest(os.path.join(nodes, h)) for h in ("sim-0002", "sim-0003")}
    proc, summary, reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_batch=2", "-e", BENCH)
    assert proc.returncode != 0
    assert "Rollout stopped after batch 1" in proc.stdout, proc.stdout[-3000:]
    assert summary["stopped"]["canary"] is True and summary["stopped"]["failed_hosts"] == ["sim-0001"]
    assert summary["skipped"] == ["sim-0002", "sim-0003"]
    canary = by_host(summary)["sim-0001"]
    bench = canary["benchmark"]
    assert canary["status"] == "failed" and canary["verification"] == "not run"
    assert bench["after"] < bench["before"] and bench["gain"] < 0
    assert bench["min_gain"] == 0.0 and bench["kept"] is False and bench["rolled_back"] is True
    assert canary["reason"] == ("measure gate: gain %s below min_gain 0.0 (benchmark before %s, after %s); "
                                "runtime tuning rolled back" % (bench["gain"], bench["before"], bench["after"]))
    # Rolled back: the canary's MRRS (and ACS) are the originals again; later hosts untouched.
    assert pci_configs(canary_root) == configs
    for host, digest in later.items():
        assert tree_digest(os.path.join(nodes, host)) == digest, host
    markdown = open(os.path.join(reports, "rollout-summary.md"), encoding="utf-8").read()
    assert "## Measure gate" in markdown
    row = "| sim-0001 | %s | %s | %+.2f%% | rolled back |" % (bench["before"], bench["after"], bench["gain"] * 100)
    assert row in markdown

    # The normal stand-in gets better with tuning: the canary (the only host targeted) passes.
    for host in ("sim-0001", "sim-0002", "sim-0003"):
        simnode.write_benchmark(os.path.join(nodes, host), "normal")
    proc, summary, reports = rollout(str(tmp_path), "-e", "gpunode_tuning_hosts=sim-0001", "-e", BENCH)
    assert proc.returncode == 0, proc.stdout[-3000:]
    canary = by_host(summary)["sim-0001"]
    bench = canary["benchmark"]
    assert canary["status"] == "done" and canary["verification"] == "pass"
    assert bench["gain"] > 0 and bench["after"] > bench["before"] and bench["kept"] is True
    assert "rolled_back" not in bench
    assert pci_configs(canary_root) != configs  # tuned, and kept
