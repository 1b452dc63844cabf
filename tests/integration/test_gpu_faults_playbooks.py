"""The playbooks on nodes whose GPUs or driver misbehave as real ones do (issues 21 and 22, classes 3 and 6).

Simulated nodes (tools/simnode) with: an R470-era nvidia-smi (no clocks_event_reasons, no
remapped_rows), one GPU whose config space reads all 0xff, an nvidia-smi that never answers, one
that exits 9 ("couldn't communicate with the NVIDIA driver"), and a benchmark that never finishes.
The hang tests use small timeouts (gpunode_tuning_command_timeouts), so each costs seconds.
Three playbook runs: verify over the sick nodes, runtime tuning of the node with the dead GPU, and
one rollout over a healthy host and every sick one.
"""

from __future__ import annotations

import json
import os
import struct

import simnode
from support.inventory import write_inventory
from support.nodes import JOURNAL
from support.playbooks import by_host, rollout, run_playbook
from support.trees import tree_digest

PRESET = "audited-epyc-8gpu"
DEAD = 2  # the GPU index (simnode's gpu_bdfs order) that falls off the bus
TIMEOUTS = json.dumps({"gpunode_tuning_command_timeouts": {"nvidia_smi": 2, "benchmark": 3}})
BENCH_STAND_IN = "{{ gpunode_tuning_root }}/usr/bin/gpunode-sim-bench"


def inventory(directory, roots, host_vars=None):
    """``directory/hosts.yml`` of the simulated nodes ``roots`` (name -> root), reports to ``directory/reports``
    (the fleet directory of ``rollout``)."""
    return write_inventory(os.path.join(directory, "hosts.yml"), roots, report_dir=os.path.join(directory, "reports"),
                           host_vars=host_vars)


def gpu_rows(report):
    return {s["name"]: s for s in report["settings"] if s["family"] == "gpu_health"}


def mrrs(root, bdf):
    """MRRS of a device, decoded from the PCI Express capability of its config space (0 for a dead one)."""
    with open(os.path.join(root, "sys/bus/pci/devices", bdf, "config"), "rb") as handle:
        cfg = handle.read()
    if cfg[:2] == b"\xff\xff":
        return 0
    pos = cfg[0x34]
    while cfg[pos] != 0x10:
        pos = cfg[pos + 1]
    return 128 << ((struct.unpack_from("<H", cfg, pos + 8)[0] >> 12) & 7)


def test_verify_judges_an_r470_driver_a_dead_gpu_and_a_hanging_nvidia_smi(tmp_path):
    roots = {name: str(tmp_path / "nodes" / name) for name in ("r470", "dead", "hang")}
    simnode.build(roots["r470"], PRESET, cpus=4, smi_driver="r470")
    dead = simnode.build(roots["dead"], PRESET, cpus=4, gpu_faults={"dead": [DEAD]})["gpu_bdfs"][DEAD]
    simnode.build(roots["hang"], PRESET, cpus=4, smi_mode="hang")
    before = {name: tree_digest(root) for name, root in roots.items()}
    proc = run_playbook("verify.yml", inventory(str(tmp_path), roots), "-e", TIMEOUTS)
    assert proc.returncode != 0, proc.stdout[-3000:]
    reports = tmp_path / "reports"
    load = {name: json.loads((reports / (name + ".json")).read_text()) for name in roots}

    # R470: exactly the two fields it lacks are unsupported; link width, ECC, Xid and persistence judged.
    rows = gpu_rows(load["r470"])
    assert sorted(n for n, r in rows.items() if r["state"] == "unsupported") == [
        "remapped_rows.failure", "remapped_rows.pending"]
    assert "driver (470.256.02) does not know the nvidia-smi field remapped_rows.pending" in \
        rows["remapped_rows.pending"]["reason"]
    assert {n: rows[n]["state"] for n in ("link_width", "ecc_mode", "ecc_uncorrected", "xid", "clocks_event")} == \
        dict.fromkeys(("link_width", "ecc_mode", "ecc_uncorrected", "xid", "clocks_event"), "applied")
    persistence = [s for s in load["r470"]["settings"] if s["id"] == "gpu_settings.persistence_mode"][0]
    assert persistence["state"] == "applied"

    # The dead GPU fails gpu_health, named; the seven others are judged.
    rows = gpu_rows(load["dead"])
    assert rows["responding"]["state"] == "drifted"
    assert rows["responding"]["reason"].startswith(dead + " not responding: config space reads 0xff")
    assert rows["link_width"]["reason"] == "7 GPU link(s) at their capable width"
    assert "gpu_health responding" in " ".join(load["dead"]["failures"])

    # The hanging nvidia-smi: one timeout, named; the report says what it is.
    rows = gpu_rows(load["hang"])
    assert rows["nvidia_smi"]["state"] == "drifted"
    assert rows["nvidia_smi"]["reason"] == "nvidia-smi did not answer within 2 s: a wedged GPU or driver; it was killed"
    assert "did not answer within 2 s" in (reports / "hang.md").read_text()
    # Verification wrote nothing on any node.
    assert {name: tree_digest(root) for name, root in roots.items()} == before


def test_runtime_tuning_tunes_the_other_gpus_and_names_the_dead_one(tmp_path):
    root = str(tmp_path / "nodes" / "dead")
    info = simnode.build(root, PRESET, cpus=4, gpu_faults={"dead": [DEAD]})
    dead = info["gpu_bdfs"][DEAD]
    with open(os.path.join(root, "sys/bus/pci/devices", dead, "config"), "rb") as handle:
        dead_config = handle.read()
    proc = run_playbook("tune.yml", inventory(str(tmp_path), {"dead": root}), "--tags", "runtime")
    assert proc.returncode != 0
    assert "%s: not responding: config space reads 0xff" % dead in proc.stdout, proc.stdout[-3000:]
    others = [b for b in info["gpu_bdfs"] if b != dead]
    assert {b: mrrs(root, b) for b in others} == dict.fromkeys(others, 4096)
    with open(os.path.join(root, "sys/bus/pci/devices", dead, "config"), "rb") as handle:
        assert handle.read() == dead_config  # never written


def test_rollout_marks_every_sick_host_unhealthy_and_goes_on_with_the_others(tmp_path):
    names = ("healthy", "hang", "exit9", "dead", "slowbench")
    roots = {name: str(tmp_path / "nodes" / name) for name in names}
    simnode.build(roots["healthy"], PRESET, cpus=4, nvidia_smi=True)
    simnode.build(roots["hang"], PRESET, cpus=4, smi_mode="hang")
    simnode.build(roots["exit9"], PRESET, cpus=4, smi_mode="exit9")
    dead = simnode.build(roots["dead"], PRESET, cpus=4, gpu_faults={"dead": [DEAD]})["gpu_bdfs"][DEAD]
    simnode.build(roots["slowbench"], PRESET, cpus=4, benchmark="hang")
    sick = ("hang", "exit9", "dead", "slowbench")
    before = {name: tree_digest(roots[name]) for name in sick}
    inventory(str(tmp_path), roots, {"slowbench": {"gpunode_tuning_rollout_benchmark_command": [BENCH_STAND_IN]}})
    proc, summary, _reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_canary=0",
                                      "-e", "gpunode_tuning_rollout_batch=100%",
                                      "-e", "gpunode_tuning_rollout_max_fail_percentage=100", "-e", TIMEOUTS)
    assert proc.returncode != 0  # not every host is done
    assert summary["stopped"] is None, summary["stopped"]
    results = by_host(summary)
    assert results["healthy"]["status"] == "done" and results["healthy"]["verification"] == "pass"
    unhealthy = ("hang", "exit9", "dead")
    assert {h: results[h]["status"] for h in unhealthy} == dict.fromkeys(unhealthy, "unhealthy")
    assert results["hang"]["findings"] == [
        "gpu_health.nvidia_smi: nvidia-smi did not answer within 2 s: a wedged GPU or driver; it was killed"]
    assert any("couldn't communicate with the NVIDIA driver" in f for f in results["exit9"]["findings"])
    assert any(f.startswith("gpu_health.responding: " + dead + " not responding: config space reads 0xff")
               for f in results["dead"]["findings"])
    # The benchmark that never finishes: killed at 3 s, the host failed before anything was tuned.
    slow = results["slowbench"]
    assert slow["status"] == "failed" and "did not answer within 3 s" in slow["reason"], slow["reason"]
    # No sick host was tuned: not a byte written, no journal.
    for name in sick:
        assert tree_digest(roots[name]) == before[name], name
        assert not os.path.exists(os.path.join(roots[name], JOURNAL)), name
