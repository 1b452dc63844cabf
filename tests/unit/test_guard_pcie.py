"""The guard's PCIe series (issue 44): each GPU's BAR sizes and the AER counters of the GPUs and the bridges above
them, and a non-fatal AER count that grows between two guard runs failing the second one.

The guard runs as its unit runs it (the installed runner, test_guard's helpers) on a simulated 2-GPU node whose
sysfs counters tools/simnode sets between the runs.
"""

from __future__ import annotations

import simnode
from support.guard import install, metrics, run_guard, series, status

GPU, BRIDGE = "0000:41:00.0", "0000:40:01.1"


def test_bar_sizes_and_aer_counters_and_a_growing_nonfatal_count_between_two_runs(build_node):
    root = build_node(cpus=8, gpus=2)
    simnode.write_node_exporter_dir(root)
    install(root)
    simnode.set_aer(root, GPU, "nonfatal", {"CmpltTO": 1})
    simnode.set_gpu_bar(root, "0000:61:00.0", 1, 256 << 20)
    assert run_guard(root).returncode == 0
    m, first = metrics(root), status(root)
    assert series(m, "gpunode_tuning_gpu_bar_size_bytes", gpu=GPU, vendor="nvidia", bar="1") == [128 << 30]
    assert series(m, "gpunode_tuning_gpu_bar_size_bytes", gpu="0000:61:00.0", bar="1") == [256 << 20]
    assert series(m, "gpunode_tuning_gpu_bar_max_supported_bytes", gpu="0000:61:00.0", bar="1") == [128 << 30]
    assert series(m, "gpunode_tuning_gpu_memory_bytes", gpu=GPU) == [96 << 30]
    assert series(m, "gpunode_tuning_pcie_aer_errors_total", device=GPU, gpu=GPU, severity="nonfatal",
                  error="total") == [1]
    assert series(m, "gpunode_tuning_pcie_aer_errors_total", device=GPU, severity="nonfatal", error="CmpltTO") == [1]
    # every device's totals exist from the first run (at 0), so the first error is an increase
    assert series(m, "gpunode_tuning_pcie_aer_errors_total", device=BRIDGE, gpu=GPU, severity="fatal",
                  error="total") == [0]
    assert first["aer"]["devices"][GPU]["nonfatal"]["CmpltTO"] == 1
    rows = {s["name"]: s for s in first["settings"] if s["family"] == "gpu_health"}
    assert rows["aer_nonfatal"]["state"] == "applied" and "reported: GPU %s: CmpltTO 1" % GPU in rows[
        "aer_nonfatal"]["reason"]
    simnode.set_aer(root, GPU, "nonfatal", {"CmpltTO": 3})
    assert run_guard(root).returncode == 0
    second = status(root)
    assert second["verdict"] == "fail"
    rows = {s["name"]: s for s in second["settings"] if s["family"] == "gpu_health"}
    assert rows["aer_nonfatal"]["state"] == "drifted"
    assert rows["aer_nonfatal"]["reason"] == ("GPU %s: CmpltTO 2 more since the guard's last reading (CmpltTO 3 in "
                                              "all since boot)" % GPU)
    assert {f["check"] for f in second["health_findings"]} == {"aer_nonfatal"}
    p2p = {s["name"]: s for s in second["settings"] if s["family"] == "gpu_p2p"}
    assert "bar1" not in p2p  # no nvidia-smi stand-in: the P2P check does not run, nor its BAR rows
