"""AMD GPU pair bandwidth and links as other people posted them (tests/data/real/amd-bw-*, amd-smi topology and
rocm-smi --showtopo captures), read by core/amd_p2p.py.

TransferBench p2p of 8 MI300X (AMD's acceptance guide) and rocm-bandwidth-test 2.6.0 of 2 MI100 and of 2 RX 7900 XTX
that cannot reach each other (N/A between the GPUs); the P2P verdict of amd-smi topology's both JSON shapes
(a PCIe pair whose link reads DISABLED: no peer access) and of rocm-smi --showtopo (8 MI308X one XGMI hop apart,
4 GPUs on PCIe).
"""

from __future__ import annotations

import os
from pathlib import Path

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_p2p, amd_smi

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
CAPTURES = (
    "amd-bw-rocm-bandwidth-test-2.6.0-2xmi100-rccl-1370.txt",
    "amd-bw-rocm-bandwidth-test-2.6.0-no-p2p-rx7900xtx-rocm-2253.txt",
    "amd-bw-transferbench-p2p-8xmi300x-system-acceptance-docs.txt",
)


def body(name):
    return (REAL / name).read_text(encoding="utf-8").split("==> capture follows <==\n", 1)[1]


def row(name, running, state, reason, desired="OK"):
    return {"name": name, "running": running, "state": state, "reason": reason, "desired": desired}


def test_every_bandwidth_capture_is_read_here_and_named_in_the_readme():
    assert sorted(n for n in os.listdir(REAL) if n.startswith("amd-bw-")) == sorted(CAPTURES)
    readme = (REAL / "README.md").read_text(encoding="utf-8")
    assert [n for n in CAPTURES if "| %s |" % n not in readme] == []


def test_transferbench_p2p_of_eight_mi300x():
    text = body("amd-bw-transferbench-p2p-8xmi300x-system-acceptance-docs.txt")
    tb = amd_p2p.read_transferbench(text)
    assert tb["gpus"] == list(range(8))
    assert len(tb["unidirectional"]) == 56 and len(tb["bidirectional"]) == 56  # no diagonal, no CPU
    assert tb["unidirectional"][(0, 1)] == 48.46 and tb["unidirectional"][(1, 0)] == 48.51
    assert tb["unidirectional"][(0, 6)] == 47.47 and tb["unidirectional"][(7, 2)] == 47.54
    assert tb["bidirectional"][(0, 1)] == 92.20 and tb["bidirectional"][(4, 2)] == 92.98  # the <-> rows
    assert tb["averages"]["UniDir"] == {"CPU->CPU": 35.85, "CPU->GPU": 41.98, "GPU->CPU": 55.24, "GPU->GPU": 48.44}
    assert tb["averages"]["BiDir"]["GPU->GPU"] == 46.24
    reading = amd_p2p.read_bandwidth(text)
    assert (reading["tool"], reading["finding"], reading["label"][3]) == ("TransferBench", None, "GPU 03")
    # AMD's pass mark for the unidirectional GPU->GPU average is 33.9 GB/s: every pair of this run is above it.
    (ok,) = amd_p2p.bandwidth_rows({"rc": 0, "stdout": text, "tool": "TransferBench"}, 33.9, row)
    assert (ok["name"], ok["state"], ok["running"]) == ("bandwidth", "applied", "min 47.47 GB/s")
    slow = amd_p2p.bandwidth_rows({"rc": 0, "stdout": text, "tool": "TransferBench"}, 47.5, row)
    assert [(r["name"], r["running"]) for r in slow] == [("bandwidth.GPU0-GPU6", "47.47 GB/s")]


def test_rocm_bandwidth_test_of_two_mi100_numbers_cpus_and_gpus_together():
    text = body("amd-bw-rocm-bandwidth-test-2.6.0-2xmi100-rccl-1370.txt")
    rbt = amd_p2p.read_rocm_bandwidth_test(text)
    assert {n: d["bus"] for n, d in rbt["devices"].items()} == {0: None, 1: None, 2: "23:0.0", 3: "83:0.0"}
    assert rbt["devices"][2]["name"] == "AMD Instinct MI100"
    assert rbt["gpus"] == [2, 3]
    # The GPU pair only: not the CPUs' N/A, not a GPU's local copy (925.889 on the diagonal).
    assert rbt["unidirectional"] == {(2, 3): 48.902, (3, 2): 49.920}
    assert rbt["bidirectional"] == {(2, 3): 97.678, (3, 2): 97.678}
    assert rbt["access"] == {(2, 3): 1.0, (3, 2): 1.0}
    reading = amd_p2p.read_bandwidth(text)
    assert reading["tool"] == "rocm-bandwidth-test" and reading["label"][3] == "device 3 (bus 83:0.0)"
    # Named by amd-smi's index where amd-smi lists a GPU on each bus; else by the tool's device numbers.
    answer = {"rc": 0, "stdout": text, "tool": "rocm-bandwidth-test"}
    (slow,) = amd_p2p.bandwidth_rows(answer, 49, row, {0: "0000:23:00.0", 1: "0000:83:00.0"})
    assert slow["name"] == "bandwidth.GPU0-GPU1"
    assert slow["reason"].startswith("GPU 0 (0000:23:00.0) = device 2 (bus 23:0.0) -> GPU 1 (0000:83:00.0) = "
                                     "device 3 (bus 83:0.0) at 48.90 GB/s")
    (slow,) = amd_p2p.bandwidth_rows(answer, 49, row, {0: "0000:23:00.0", 1: "0000:c3:00.0"})  # one bus unknown
    assert slow["name"] == "bandwidth.GPU2-GPU3"


def test_rocm_bandwidth_test_gpus_without_peer_access_fail_as_unmeasured():
    text = body("amd-bw-rocm-bandwidth-test-2.6.0-no-p2p-rx7900xtx-rocm-2253.txt")
    rbt = amd_p2p.read_rocm_bandwidth_test(text)
    assert rbt["gpus"] == [1, 2] and rbt["access"] == {(1, 2): 0.0, (2, 1): 0.0}
    assert rbt["unidirectional"] == {(1, 2): None, (2, 1): None}
    rows = amd_p2p.bandwidth_rows({"rc": 0, "stdout": text, "tool": "rocm-bandwidth-test"}, 10, row)
    assert [(r["name"], r["state"], r["running"]) for r in rows] == [
        ("bandwidth.GPU1-GPU2", "drifted", "N/A"), ("bandwidth.GPU2-GPU1", "drifted", "N/A")]
    assert rows[0]["reason"] == ("device 1 (bus 83:0.0) -> device 2 (bus 03:0.0) not measured (N/A): "
                                 "rocm-bandwidth-test could not copy between them, no peer-to-peer access")


def test_output_of_neither_tool_is_a_finding_not_a_pass():
    reading = amd_p2p.read_bandwidth("TransferBench v1.66\n[ERROR] Unable to find any GPUs\n")
    assert reading["pairs"] == {} and reading["finding"]
    (bad,) = amd_p2p.bandwidth_rows({"rc": 0, "stdout": "usage: TransferBench config <N>\n"}, 10, row)
    assert bad["state"] == "drifted" and bad["reason"] == "TransferBench (rc 0): usage: TransferBench config <N>"


def test_topology_json_of_both_shapes_a_disabled_pcie_link_is_no_peer_access():
    for name, running, who in (
            ("amd-smi-topology-json-access-type-rocm6.1.1-changelog.txt", "PCIE, N/A hops, weight N/A, DISABLED",
             "GPU 0 (0000:08:00.0) and GPU 1 (0000:44:00.0)"),
            ("amd-smi-topology-json-list-old-shape-rocm6.1-changelog.txt", "PCIE, 2 hops, weight 40, DISABLED",
             "GPU 0 and GPU 1")):
        link_map = amd_p2p.links(amd_smi.read_topology(body(name)))
        assert amd_p2p.gpus_of(link_map) == [0, 1]
        (pair,) = amd_p2p.judge(link_map, [], row)
        assert (pair["name"], pair["state"], pair["running"]) == ("GPU0-GPU1", "drifted", running)
        assert pair["reason"] == ("P2P between %s is not as expected: GPU 0 cannot reach GPU 1's memory (link "
                                  "DISABLED); GPU 1 cannot reach GPU 0's memory (link DISABLED) (amd-smi topology)"
                                  % who)
    link_map = amd_p2p.links(amd_smi.read_topology(body("amd-smi-topology-json-access-type-rocm6.1.1-changelog.txt")))
    assert amd_p2p.peers(link_map) == {
        "0000:08:00.0": "PCIE, N/A hops, weight N/A, no P2P access (DISABLED) to GPU 1",
        "0000:44:00.0": "PCIE, N/A hops, weight N/A, no P2P access (DISABLED) to GPU 0"}
    assert "| GPU0 (0000:08:00.0) | X | PCIE N/A DISABLED |" in amd_p2p.table(link_map)


def test_showtopo_of_eight_mi308x_one_xgmi_hop_and_of_four_gpus_on_pcie():
    xgmi = amd_p2p.links(showtopo=amd_smi.read_rocm_smi_showtopo(
        body("amd-rocm-smi-showtopo-8gpu-mi308x-warning-ms-swift.txt")))
    (ok,) = amd_p2p.judge(xgmi, [{"device": "0x74a2"}] * 8, row, source="rocm-smi --showtopo")
    assert (ok["state"], ok["running"]) == ("applied", "XGMI, 1 hop, weight 15 on all 28 pairs of 8 GPUs")
    assert ok["reason"].endswith("MI308X: one XGMI hop between any two GPUs, as found")
    # The same mesh with one pair two hops apart is no longer what MI308X GPUs have; on other GPUs it is reported.
    xgmi["pairs"][(2, 5)] = dict(xgmi["pairs"][(2, 5)], hops=2)
    (bad,) = amd_p2p.judge(xgmi, [{"device": "0x74a2"}] * 8, row, source="rocm-smi --showtopo")
    assert bad["name"] == "GPU2-GPU5" and "2 XGMI hops where MI308X GPUs are one hop apart" in bad["reason"]
    assert amd_p2p.judge(xgmi, [{"device": "0x740f"}], row)[0]["state"] == "applied"  # MI210: hops not judged
    # amd-smi's hops read 1 for any XGMI path (rocm-systems issue 5763): the weight, 15 per physical XGMI hop,
    # tells a pair that crosses another GPU. Judged where amd-smi names whole GPUs (function 0, no partitions).
    xgmi["pairs"][(2, 5)] = dict(xgmi["pairs"][(2, 5)], hops=1, weight=30)
    assert amd_p2p.judge(xgmi, [{"device": "0x74a2"}], row)[0]["state"] == "applied"  # showtopo: no addresses
    xgmi["bdf"] = {i: "0000:%02x:00.0" % (0x05 + 0x20 * i) for i in range(8)}
    (bad,) = amd_p2p.judge(xgmi, [{"device": "0x74a2"}], row)
    assert bad["reason"].endswith("weight 30 where MI308X GPUs are linked directly (weight 15, one physical XGMI "
                                  "hop): the path crosses another GPU (amd-smi topology)")
    xgmi["bdf"][3] = "0000:65:00.1"  # a partition (CPX/DPX): the driver's weights differ there, not judged
    assert amd_p2p.judge(xgmi, [{"device": "0x74a2"}], row)[0]["state"] == "applied"
    pcie = amd_p2p.links(showtopo=amd_smi.read_rocm_smi_showtopo(
        body("amd-rocm-smi-showtopo-4gpu-pcie-cut-rocm-smi-lib-108.txt")))
    (ok,) = amd_p2p.judge(pcie, [], row)
    assert (ok["state"], ok["running"]) == ("applied", "PCIE, 3 hops, weight 52 on all 6 pairs of 4 GPUs")
    # A PCIe pair among GPUs on XGMI: the XGMI link between them is missing.
    xgmi["pairs"][(2, 5)] = dict(xgmi["pairs"][(2, 5)], link_type="PCIE", hops=3)
    (bad,) = amd_p2p.judge(xgmi, [], row)
    assert "linked by PCIE where the other GPUs are on XGMI" in bad["reason"]


def test_topology_json_that_does_not_decode_is_unsupported_with_the_finding_never_a_traceback():
    text = body("amd-smi-topology-json-edited-invalid-rocm6.1.1-changelog.txt")
    (bad,) = amd_p2p.pair_rows([], {"amd_topology": {"rc": 0, "stdout": text, "stderr": ""}}, row)
    assert (bad["name"], bad["state"]) == ("pairs", "unsupported")
    assert bad["reason"].startswith("amd-smi topology --json: ") and "invalid JSON" in bad["reason"]
    assert amd_p2p.topology_links({"amd_topology": {"rc": 0, "stdout": text}}) is None
