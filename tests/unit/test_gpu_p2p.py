"""gpu_p2p: the P2P verdict per GPU pair from nvidia-smi's matrices, ACS named as the cause, nvbandwidth's floor."""

from __future__ import annotations

import os
import shutil

import pytest
from support.p2p import Ctx
from support.p2p import rows as _rows

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_p2p as p2p

needs_setpci = pytest.mark.skipif(shutil.which("setpci") is None, reason="setpci (pciutils) is not installed")

NVBANDWIDTH_OUT = """nvbandwidth Version: v0.7
Built from Git version: v0.7

CUDA Runtime Version: 12080
CUDA Driver Version: 12080
Driver Version: 570.124.06

Device 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (00000000:01:00.0)
Device 1: NVIDIA RTX PRO 6000 Blackwell Server Edition (00000000:21:00.0)

Running device_to_device_memcpy_read_ce.
memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)
           0         1
 0       N/A     51.20
 1     %s       N/A

SUM device_to_device_memcpy_read_ce 102.40
"""


def _nvbandwidth(root, slow="51.10", rc=0):
    path = os.path.join(root, "usr/bin/nvbandwidth")
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\ncat <<'EOF'\n%sEOF\nexit %d\n" % (NVBANDWIDTH_OUT % slow, rc))
    os.chmod(path, 0o755)


def test_acs_redirect_makes_every_pair_drift_naming_the_root_ports(build_node):
    # the audited EPYC: 8 GPUs, each under an AMD root port with ReqRedir+ CmpltRedir+
    root = build_node(cpus=4, nvidia_smi=True)
    rows = _rows(root)
    assert len(rows) == 28 and {r["state"] for r in rows.values()} == {"drifted"}
    row = rows["GPU0-GPU1"]
    assert row["family"] == "gpu_p2p" and row["desired"] == "OK"
    assert row["running"] == "read CNS, write CNS, nvlink NS"
    assert row["reason"].startswith("P2P between GPU0 (0000:01:00.0) and GPU1 (0000:21:00.0) is not OK: "
                                    "read GPU0->GPU1 CNS (chipset not supported)")
    assert "ACS redirect is on above GPU0 (0000:01:00.0) (bridge 0000:00:01.1)" in row["reason"]
    assert "ACS redirect is on above GPU1 (0000:21:00.0) (bridge 0000:20:01.1)" in row["reason"]


@needs_setpci
def test_pcie_acs_turns_the_p2p_verdict_into_one_applied_row(build_node, run_module):
    root = build_node("xeon-4gpu-switch", cpus=4, gpus=2, nvidia_smi=True)
    before = _rows(root)
    assert list(before) == ["GPU0-GPU1"] and before["GPU0-GPU1"]["state"] == "drifted"
    result, failed = run_module("pcie_acs", {"root": root})
    assert not failed, result["msg"]
    after = _rows(root)
    assert list(after) == ["pairs"]
    assert after["pairs"]["state"] == "applied"
    assert after["pairs"]["running"] == "read OK, write OK on all 1 pairs of 2 GPUs"
    assert "(NVLink: NS)" in after["pairs"]["reason"]


def test_not_applicable_without_nvidia_smi_or_a_second_gpu(build_node):
    assert _rows(build_node(cpus=4, gpus=2))["pairs"]["state"] == "not_applicable"  # no stand-in shipped
    one = _rows(build_node(cpus=4, gpus=1, nvidia_smi=True))["pairs"]
    assert one["state"] == "not_applicable" and "fewer than 2 GPUs" in one["reason"]
    absent = p2p.evaluate({}, {"gpu_p2p": {}}, Ctx({"probe": "absent"}))
    assert [(r["state"], r["reason"]) for r in absent] == [
        ("not_applicable", "nvidia-smi is not installed on this node (no NVIDIA driver user space)")]
    assert p2p.evaluate({}, {}, Ctx({"probe": "absent"})) == []  # not part of the desired state


def test_failing_matrix_is_unsupported_not_a_crash():
    probe = {"probe": "present", "query": {"rc": 0, "stdout": "0, 00000000:01:00.0, Enabled\n"},
             "p2p_read": {"rc": 9, "stdout": "", "stderr": "Unable to determine the device handle"},
             "p2p_write": {"rc": 9, "stdout": "", "stderr": "Unable to determine the device handle"}}
    rows = p2p.evaluate({}, {"gpu_p2p": {}}, Ctx(probe))
    assert [(r["name"], r["state"]) for r in rows] == [("read", "unsupported"), ("write", "unsupported")]
    assert "nvidia-smi topo -p2p r failed (rc 9): Unable to determine" in rows[0]["reason"]


def test_registered_loop_results_are_read_too():
    matrix = "\tGPU0\tGPU1\nGPU0\tX\tOK\nGPU1\tOK\tX\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n"
    probe = {"probe": "present", "results": [
        {"item": {"key": "query"}, "rc": 0, "stdout": "0, 00000000:01:00.0, Enabled\n1, 00000000:21:00.0, Enabled"},
        {"item": {"key": "p2p_read"}, "rc": 0, "stdout": matrix},
        {"item": {"key": "p2p_write"}, "rc": 0, "stdout": matrix.replace("GPU1\tOK", "GPU1\tTNS")}]}
    (row,) = p2p.evaluate({}, {"gpu_p2p": {}}, Ctx(probe))
    assert row["name"] == "GPU0-GPU1" and row["running"] == "read OK, write OK/TNS"
    assert "write GPU1->GPU0 TNS (topology not supported)" in row["reason"]


def test_bad_desired_is_refused_naming_what_is_allowed():
    for want, text in (({"min_gbs": 5}, "allowed: min_gbps"), ({"min_gbps": 0}, "a number > 0"),
                       ({"min_gbps": "fast"}, "a number > 0"), ("x", "a mapping")):
        with pytest.raises(family.EvaluationError, match=text):
            p2p.evaluate({}, {"gpu_p2p": want}, Ctx({"probe": "absent"}))


def test_parse_nvbandwidth_matrix():
    assert p2p.parse_nvbandwidth(NVBANDWIDTH_OUT % "12.50") == {(0, 1): 51.2, (1, 0): 12.5}
    assert p2p.parse_nvbandwidth("ERROR: no CUDA device") == {}


@needs_setpci
def test_nvbandwidth_floor_fails_the_slow_pair_only_when_asked(build_node, run_module):
    root = build_node("xeon-4gpu-switch", cpus=4, gpus=2, nvidia_smi=True)
    result, failed = run_module("pcie_acs", {"root": root})
    assert not failed, result["msg"]
    calls = []
    assert "bandwidth" not in _rows(root, calls=calls)  # no floor: nvbandwidth is neither looked up nor run
    missing = _rows(root, {"gpu_p2p": {"min_gbps": 40}})["bandwidth"]
    assert missing["state"] == "unsupported" and "nvbandwidth not found on the node" in missing["reason"]
    _nvbandwidth(root, slow="12.50")
    calls = []
    rows = _rows(root, {"gpu_p2p": {"min_gbps": 40}}, calls)
    assert [os.path.basename(c[0]) for c in calls].count("nvbandwidth") == 1
    assert calls[-1][1:] == ["-t", "device_to_device_memcpy_read_ce"]
    slow = rows["bandwidth.GPU1-GPU0"]
    assert (slow["state"], slow["running"], slow["desired"]) == ("drifted", "12.50 GB/s", ">= 40 GB/s")
    assert "GPU1 (0000:" in slow["reason"] and "below 40 GB/s" in slow["reason"]
    ok = _rows(root, {"gpu_p2p": {"min_gbps": 10}})["bandwidth"]
    assert (ok["state"], ok["running"]) == ("applied", "min 12.50 GB/s")


def test_failing_nvbandwidth_is_a_finding():
    rows = p2p.bandwidth_rows({"rc": 1, "stdout": "", "stderr": "cuInit failed"}, 40, {})
    assert [(r["name"], r["state"]) for r in rows] == [("bandwidth", "drifted")]
    assert "cuInit failed" in rows[0]["reason"]


def test_the_guard_keeps_no_bandwidth_floor_so_it_never_runs_a_bandwidth_benchmark(build_node):
    # all_families.node_desired is what the guard's config keeps of the desired state (flows/guard_files.py).
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families  # noqa: PLC0415

    node = Node(build_node("audited-epyc-8gpu", cpus=4))
    desired = {"gpu_p2p": {"min_gbps": 300.0}, "numa_balancing": 0}
    kept = all_families.node_desired(desired, node)
    assert kept["gpu_p2p"] == {"min_gbps": None} and kept["numa_balancing"] == 0
    assert desired["gpu_p2p"] == {"min_gbps": 300.0}  # the role's own desired state is not changed
    assert all_families.node_desired({"gpu_p2p": {"min_gbps": None}}, node) == {"gpu_p2p": {"min_gbps": None}}
