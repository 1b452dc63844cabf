"""gpu_settings verified on AMD GPUs: power cap, perf level, determinism and the verified-only partitions.

The rows come from the GPU probe's ``amd-smi static``/``metric`` answers (the calls gpu_health asks, never one more
per GPU): on the simulated MI300X node (tools/simnode's stand-in, which keeps what ``amd-smi set`` changes) and
on real captures (tests/data/real/amd-smi-static-*, amd-smi-metric-*).
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_health, amd_settings_rows, command, family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_settings, gpu_settings_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verify import gather

AMD = "mi300x-epyc-8gpu"
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
BUS = ["0000:%02x:00.0" % b for b in (0x05, 0x26, 0x46, 0x65, 0x85, 0xA5, 0xC5, 0xE5)]


def _tools(root, seen):
    run = command.runner(None)

    def find(name, _package):
        path = os.path.join(root, "usr/bin", name)
        return path if os.access(path, os.X_OK) else None

    def record(argv):
        seen.append([os.path.basename(argv[0])] + argv[1:])
        return run(argv)
    return verify.Tools(find, record)


def settings_rows(root, want, seen=None):
    """gpu_settings' rows of a simulated node, probed as verification probes it (gpu_health asked too)."""
    seen = [] if seen is None else seen
    desired = {"gpu_health": {}, "gpu_settings": want}
    facts = gather(Node(root))
    probe = verify.gpu_probe(Node(root), dict(verify.VERIFY_DEFAULTS), _tools(root, seen), desired,
                             verify.gpu_vendors(facts))
    return {r["name"]: r for r in gpu_settings.DEFINITION.evaluate(facts, desired, type("C", (), {"gpu": probe})())}


def test_settings_as_wanted_are_applied_rows_of_vendor_amd_from_the_probes_calls_only(build_node):
    root = build_node(AMD, cpus=4, amd_smi=True)
    seen = []
    rows = settings_rows(root, {"power_limit": 750, "perf_level": "AUTO", "compute_partition": "spx",
                                "memory_partition": "NPS1"}, seen)
    assert seen == [["amd-smi"] + list(c.args) for c in amd_health.COMMANDS]  # each call once, none per GPU
    amd = {n: r for n, r in rows.items() if r.get("vendor") == "amd"}
    assert {n: r["state"] for n, r in amd.items()} == {
        "power_limit": "applied", "perf_level": "applied", "compute_partition": "applied",
        "memory_partition": "applied"}
    assert amd["compute_partition"]["running"] == "SPX" and amd["compute_partition"]["reason"] == "8 GPU(s) in SPX"
    # nvidia-smi's settings are not asked for; persistence_mode stays NVIDIA's (not applicable here)
    assert rows["persistence_mode"]["vendor"] == "nvidia" and rows["persistence_mode"]["state"] == "not_applicable"


def test_a_cap_and_level_that_differ_are_drifted_naming_each_gpu_desired_and_actual(build_node, run_module):
    root = build_node(AMD, cpus=4, amd_smi=True)
    result, failed = run_module("gpu_settings", {"root": root, "journal": JOURNAL, "power_limits": {BUS[3]: 600},
                                                 "perf_level": "stable_peak"})
    assert not failed, result
    rows = settings_rows(root, {"power_limit": 750, "perf_level": "auto"})
    power, level = rows["power_limit"], rows["perf_level"]
    assert power["state"] == "drifted" and power["vendor"] == "amd"
    assert power["reason"] == "power cap differs: GPU 3 (0000:65:00.0): cap 600 W, wanted 750 W"
    assert level["state"] == "drifted"
    assert "GPU 0 (0000:05:00.0): stable_peak, wanted auto" in level["reason"]
    assert level["reason"].count("wanted auto") == 8
    # what the module set reads back as applied
    rows = settings_rows(root, {"power_limits": {BUS[3]: 600}, "power_limit": 750, "perf_level": "stable_peak"})
    assert rows["power_limit"]["state"] == "applied" and rows["perf_level"]["state"] == "applied"


def test_determinism_is_verified_as_the_level_and_says_so(build_node, run_module):
    root = build_node(AMD, cpus=4, amd_smi=True)
    rows = settings_rows(root, {"perf_determinism_mhz": 1900})
    assert rows["perf_determinism_mhz"]["state"] == "drifted"
    assert "GPU 7 (0000:e5:00.0): auto, wanted determinism" in rows["perf_determinism_mhz"]["reason"]
    assert "perf_level" not in rows
    result, failed = run_module("gpu_settings", {"root": root, "journal": JOURNAL, "perf_determinism_mhz": 1900})
    assert not failed, result
    row = settings_rows(root, {"perf_determinism_mhz": 1900, "perf_level": "determinism"})["perf_determinism_mhz"]
    assert row["state"] == "applied" and row["running"] == "determinism"
    assert "amd-smi reports no determinism ceiling" in row["reason"]


@pytest.mark.parametrize(("key", "wanted", "option"), [
    ("compute_partition", "CPX", "--compute-partition"),
    ("memory_partition", "nps4", "--memory-partition"),
])
def test_a_partition_mismatch_is_drifted_naming_the_command_and_nothing_changes_it(
        build_node, run_module, digest, key, wanted, option):
    root = build_node(AMD, cpus=4, amd_smi=True)
    rows = settings_rows(root, {key: wanted})
    row = rows[key]
    assert row["state"] == "drifted" and row["vendor"] == "amd"
    have = "SPX" if key == "compute_partition" else "NPS1"
    assert "GPU 3 (0000:65:00.0): %s, wanted %s" % (have, wanted.upper()) in row["reason"]
    assert "`amd-smi set -g 0 1 2 3 4 5 6 7 %s %s` changes it" % (option, wanted.upper()) in row["reason"]
    assert "never changes" in row["reason"]
    # runtime tuning never writes a partition: the role's options leave it out, the module has no such option
    before = digest(root)
    options = gpu_settings.runtime_options({"gpu_settings": {key: wanted}}, {})
    assert options is None
    options = gpu_settings.runtime_options({"gpu_settings": {key: wanted, "power_limit": 750}}, {})
    assert options == {"power_limit": 750}
    result, failed = run_module("gpu_settings", dict(options, root=root, journal=JOURNAL))
    assert not failed and not result["changed"], result
    assert digest(root) == before
    ok, message = gpu_settings.boot(Node(root), {key: wanted})
    assert ok and "verified only" in message and digest(root) == before


@pytest.mark.parametrize(("want", "words"), [
    ({"compute_partition": "SPX4"}, "compute_partition must be one of SPX, DPX, TPX, QPX, CPX"),
    ({"memory_partition": "NPS3"}, "memory_partition must be one of NPS1, NPS2, NPS4, NPS8"),
    ({"perf_level": "auto", "perf_determinism_mhz": 1900}, "contradict each other"),
])
def test_bad_values_are_refused_naming_what_is_allowed(want, words):
    problems = gpu_settings.desired_problems(want)
    assert problems and words in family.problems_text(problems)


def test_on_an_nvidia_node_the_amd_only_settings_are_not_applicable(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4)
    rows = settings_rows(root, {"perf_level": "auto", "compute_partition": "SPX"})
    assert rows["perf_level"]["state"] == "not_applicable" and rows["perf_level"]["vendor"] == "nvidia"
    assert "AMD Instinct GPUs only" in rows["compute_partition"]["reason"]


def test_amd_smi_missing_leaves_the_settings_unverified_with_the_reason(build_node):
    root = build_node(AMD, cpus=4, amd_smi_mode="absent")
    rows = settings_rows(root, {"power_limit": 750, "compute_partition": "SPX"})
    assert {rows[k]["state"] for k in ("power_limit", "compute_partition")} == {"unsupported"}
    assert "amd-smi not found on the node's PATH nor in /opt/rocm/bin" in rows["power_limit"]["reason"]


# --- real captures: the static and metric JSON other people posted ----------------------------------------


def _probe(real, static, metric=None):
    probe = {"amd_static": {"rc": 0, "stdout": real(static).text, "stderr": ""}}
    if metric:
        probe["amd_metric"] = {"rc": 0, "stdout": real(metric).text, "stderr": ""}
    return probe


def test_the_rx6600_capture_reads_its_cap_and_level_and_has_no_partition(real):
    probe = _probe(real, "amd-smi-static-json-list-rx6600-luckylinux.txt",
                   "amd-smi-metric-json-list-rx6600-luckylinux.txt")
    rows = {r["name"]: r for r in gpu_settings_verify.amd_rows({"power_limit": 100, "perf_level": "auto",
                                                                "compute_partition": "SPX"}, probe)}
    assert rows["power_limit"]["state"] == "applied" and rows["perf_level"]["state"] == "applied"
    assert rows["compute_partition"]["state"] == "unsupported"
    assert "no compute partition (N/A) for GPU 0 (0000:0b:00.0)" in rows["compute_partition"]["reason"]
    drifted = {r["name"]: r for r in gpu_settings_verify.amd_rows({"power_limit": 95}, probe)}["power_limit"]
    assert drifted["reason"] == "power cap differs: GPU 0 (0000:0b:00.0): cap 100 W, wanted 95 W"


def test_the_mi210_gpu_data_capture_reads_its_cap(real):
    probe = _probe(real, "amd-smi-static-json-gpu-data-mi210-device-metrics-exporter.txt")
    gpus, why = amd_settings_rows.amd_probe_gpus(probe, need_metric=False)
    assert why is None and len(gpus) == 1 and gpus[0]["index"] == 0
    assert gpus[0]["limit"] == 300.0 and gpus[0]["compute_partition"] is None


def test_a_cut_static_answer_is_a_reason_not_a_traceback(real):
    probe = _probe(real, "amd-smi-static-json-warnings-cut-rx7800xt-ajean-39.txt")
    rows = gpu_settings_verify.amd_rows({"power_limit": 100}, probe)
    assert rows[0]["state"] == "unsupported" and "amd-smi static --json" in rows[0]["reason"]
