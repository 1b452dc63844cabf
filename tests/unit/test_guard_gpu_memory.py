"""The guard's ECC and bad-page series (flows/guard.py ``gpu_memory``, flows/guard_metrics.py), for both vendors.

The guard runs as its unit runs it (the installed runner, test_guard's helpers) on a simulated MI300X node whose
amd-smi stand-in counts ECC errors and retired pages (tools/simnode's faults) and on a simulated NVIDIA node
whose nvidia-smi table is edited to count uncorrectable errors and a row-remapping failure. The counts come from
the GPU probe verification already runs: no amd-smi or nvidia-smi call of their own.
"""

from __future__ import annotations

import json
import os

import simnode
from support.guard import OPTIONS, install, metrics, run_guard, series, status

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import guard, guard_metrics

SICK = "0000:65:00.0"  # GPU 3 of mi300x-epyc-8gpu
BOTH = {"vendor": ["10de", "1002"], "class_prefixes": ["0300", "0302", "0380", "1200"]}


def _amd_node(build_node, **faults):
    root = build_node("mi300x-epyc-8gpu", cpus=4, amd_faults=faults or None, amd_smi=True)
    simnode.write_node_exporter_dir(root)
    return install(root, facts=dict(OPTIONS["facts"], pci_selector=BOTH))


def test_amd_ecc_counts_by_type_and_block_and_bad_pages_by_state_with_the_threshold(build_node):
    root = _amd_node(build_node, ecc_uncorrectable=[3], bad_pages=[3])
    proc = run_guard(root)
    assert proc.returncode == 0, proc.stderr
    m = metrics(root)
    assert series(m, "gpunode_tuning_gpu_ecc_errors_total", gpu=SICK, vendor="amd", type="uncorrectable") == [2]
    assert series(m, "gpunode_tuning_gpu_ecc_errors_total", gpu=SICK, type="correctable") == [0]
    assert series(m, "gpunode_tuning_gpu_ecc_errors_total", gpu=SICK, type="deferred") == [0]
    # every GPU has its counter from the first run, so the first error is an increase
    assert len(series(m, "gpunode_tuning_gpu_ecc_errors_total", vendor="amd", type="uncorrectable")) == 8
    assert sum(series(m, "gpunode_tuning_gpu_ecc_errors_total", type="uncorrectable")) == 2
    assert series(m, "gpunode_tuning_gpu_ecc_block_errors_total", gpu=SICK, type="uncorrectable", block="UMC") == [2]
    assert series(m, "gpunode_tuning_gpu_ecc_block_errors_total", gpu=SICK, type="correctable", block="UMC") == [0]
    assert {dict(p)["gpu"] for (n, p), _v in m.items() if n == "gpunode_tuning_gpu_ecc_block_errors_total"} == {SICK}
    assert series(m, "gpunode_tuning_gpu_bad_pages", gpu=SICK, vendor="amd", state="retired") == [655]
    assert series(m, "gpunode_tuning_gpu_bad_pages", gpu="0000:05:00.0", state="retired") == [0]
    assert series(m, "gpunode_tuning_gpu_bad_pages", gpu=SICK, state="pending") == [0]
    assert series(m, "gpunode_tuning_gpu_bad_page_threshold", gpu=SICK, vendor="amd") == [655]
    assert series(m, "gpunode_tuning_gpu_bad_page_threshold_reached", gpu=SICK, vendor="amd") == [1]
    assert series(m, "gpunode_tuning_gpu_bad_page_threshold_reached", gpu="0000:05:00.0") == [0]
    assert status(root)["gpu_memory"]["ecc"][0]["vendor"] == "amd"


def test_a_healthy_amd_node_exports_zeros_and_amd_smi_absent_exports_no_count(build_node):
    m = metrics(_amd_root_run(build_node))
    assert set(series(m, "gpunode_tuning_gpu_ecc_errors_total", vendor="amd")) == {0}
    assert set(series(m, "gpunode_tuning_gpu_bad_page_threshold_reached", vendor="amd")) == {0}
    root = build_node("mi300x-epyc-8gpu", cpus=4, amd_smi_mode="absent")
    simnode.write_node_exporter_dir(root)
    install(root, facts=dict(OPTIONS["facts"], pci_selector=BOTH))
    assert run_guard(root).returncode == 0
    m = metrics(root)
    assert series(m, "gpunode_tuning_gpu_ecc_errors_total") == []  # a missing count is never a zero
    assert series(m, "gpunode_tuning_gpu_health_finding", check="amd_smi") == [1]  # the node-wide finding


def _amd_root_run(build_node):
    root = _amd_node(build_node)
    assert run_guard(root).returncode == 0
    return root


def test_nvidia_uncorrectable_ecc_and_a_row_remap_failure(build_node):
    root = build_node(cpus=8, gpus=2, nvidia_smi=True)
    simnode.write_node_exporter_dir(root)
    path = os.path.join(root, simnode.SMI_STATE)
    with open(path, encoding="utf-8") as fh:
        table = json.load(fh)
    table["gpus"][1].update({"ecc.errors.uncorrected.volatile.total": "3", "remapped_rows.failure": "Yes"})
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(table, fh)
    install(root)
    assert run_guard(root).returncode == 0
    m = metrics(root)
    gpus = ["0000:41:00.0", "0000:61:00.0"]
    assert series(m, "gpunode_tuning_gpu_ecc_errors_total", gpu=gpus[1], vendor="nvidia", type="uncorrectable") == [3]
    assert series(m, "gpunode_tuning_gpu_ecc_errors_total", gpu=gpus[0], vendor="nvidia", type="uncorrectable") == [0]
    assert series(m, "gpunode_tuning_gpu_bad_page_threshold_reached", gpu=gpus[1], vendor="nvidia") == [1]
    assert series(m, "gpunode_tuning_gpu_bad_page_threshold_reached", gpu=gpus[0], vendor="nvidia") == [0]
    assert series(m, "gpunode_tuning_gpu_ecc_errors_total", type="correctable") == []  # the query has none


def test_the_series_follow_the_naming_rules_and_the_reader_skips_what_is_not_given():
    memory = guard.gpu_memory({"probe": "simulated", "amd_metric": {"rc": 0, "stdout": "not json"}},
                              {"pci": {"gpu_vendors": {SICK: "amd"}}})
    assert memory == guard.NO_GPU_MEMORY
    text = guard_metrics.render({"gpu_memory": {
        "ecc": [{"gpu": SICK, "vendor": "amd", "type": "deferred", "count": 1}],
        "ecc_blocks": [{"gpu": SICK, "vendor": "amd", "type": "deferred", "block": "SDMA", "count": 1}],
        "bad_pages": [{"gpu": SICK, "vendor": "amd", "state": "pending", "count": 4}],
        "bad_page_thresholds": [{"gpu": SICK, "vendor": "amd", "threshold": None, "reached": None}]}})
    assert "# TYPE gpunode_tuning_gpu_ecc_errors_total counter\n" in text
    assert "# TYPE gpunode_tuning_gpu_ecc_block_errors_total counter\n" in text
    assert "# TYPE gpunode_tuning_gpu_bad_pages gauge\n" in text
    assert 'gpunode_tuning_gpu_ecc_block_errors_total{gpu="%s",vendor="amd",type="deferred",block="SDMA"} 1\n' % SICK \
        in text
    assert 'gpunode_tuning_gpu_bad_pages{gpu="%s",vendor="amd",state="pending"} 4\n' % SICK in text
    assert "threshold" not in text  # nothing known about the threshold: no sample


def test_real_captures_give_their_counts_and_na_gives_no_sample(real):
    """amd-smi answers other people posted: the MI300X list and bad-pages text (rocm-blogs), an MI210's static
    JSON (RAS threshold 655), an RX 6600's metric JSON (ECC 0) and ROCm 6.1's power-only metric (ECC N/A)."""
    def answer(name):
        return {"rc": 0, "stdout": real(name).text, "stderr": ""}
    probe = {"probe": "simulated", "amd_list": answer("amd-smi-list-text-mi300x-rocm-blogs.txt"),
             "amd_bad_pages": answer("amd-smi-bad-pages-text-mi300x-rocm-blogs.txt"),
             "amd_static": answer("amd-smi-static-json-gpu-data-mi210-device-metrics-exporter.txt"),
             "amd_metric": answer("amd-smi-metric-json-list-rx6600-luckylinux.txt")}
    memory = guard.gpu_memory(probe, {"pci": {"gpu_vendors": {"0000:05:00.0": "amd"}}})
    assert memory["ecc"] == [{"gpu": "0000:05:00.0", "vendor": "amd", "type": t, "count": 0}
                             for t in ("correctable", "uncorrectable", "deferred")]
    assert memory["ecc_blocks"] == []
    assert {(p["gpu"], p["state"], p["count"]) for p in memory["bad_pages"] if p["gpu"] == "0000:26:00.0"} == {
        ("0000:26:00.0", "retired", 0), ("0000:26:00.0", "pending", 0), ("0000:26:00.0", "unreservable", 0)}
    assert memory["bad_page_thresholds"] == [{"gpu": "0000:05:00.0", "vendor": "amd", "threshold": 655,
                                              "reached": False}]
    probe["amd_metric"] = answer("amd-smi-metric-power-json-list-rocm6.1-changelog.txt")
    assert guard.gpu_memory(probe, {"pci": {"gpu_vendors": {"0000:05:00.0": "amd"}}})["ecc"] == []
