"""gpu_p2p and gpu_locality on AMD GPUs: the simulated MI300X node (tools/simnode's amd-smi stand-in).

P2P per GPU pair from amd-smi topology (the health gate's call, asked once for both families), xgmi -l's links,
the bandwidth of TransferBench p2p (else rocm-bandwidth-test) against min_gbps; the locality rows and report name
each AMD GPU's links to the others. The stand-in bandwidth tools print the real captures of tests/data/real/amd-bw-*.
"""

from __future__ import annotations

import os
from pathlib import Path

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_health, amd_p2p, command
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_locality, gpu_locality_verify, gpu_p2p
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verify import gather

PRESET = "mi300x-epyc-8gpu"
REAL = Path(__file__).resolve().parents[1] / "data" / "real"
TB_CAPTURE = "amd-bw-transferbench-p2p-8xmi300x-system-acceptance-docs.txt"
RBT_CAPTURE = "amd-bw-rocm-bandwidth-test-2.6.0-2xmi100-rccl-1370.txt"
BDFS = ["0000:%02x:00.0" % b for b in (0x05, 0x26, 0x46, 0x65, 0x85, 0xA5, 0xC5, 0xE5)]


def tools(root, seen, timeouts=None):
    """verify.Tools as tuning_info builds them on a simulated node (only the node's own usr/bin), bounded."""
    run = command.runner(timeouts)

    def find(name, _package):
        path = os.path.join(root, "usr/bin", name)
        return path if os.access(path, os.X_OK) else None

    def record(argv):
        seen.append([os.path.relpath(argv[0], root)] + argv[1:])
        return run(argv)
    return verify.Tools(find, record)


def probe(root, desired, seen=None, timeouts=None):
    facts = gather(Node(root))
    seen = [] if seen is None else seen
    facts["gpu_probe"] = verify.gpu_probe(Node(root), dict(verify.VERIFY_DEFAULTS), tools(root, seen, timeouts),
                                          desired, verify.gpu_vendors(facts))
    return facts


def p2p_rows(facts, desired):
    return {r["name"]: r for r in gpu_p2p.DEFINITION.evaluate(facts, desired, None)}


def capture(name):
    return (REAL / name).read_text(encoding="utf-8").split("==> capture follows <==\n", 1)[1]


def stand_in(root, tool, text, rc=0, sleep=0, where="usr/bin"):
    """A bandwidth tool on the node that prints ``text`` (a real capture) and records its arguments."""
    path = os.path.join(root, where, tool)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(os.path.join(root, "bw-output.txt"), "w", encoding="utf-8") as fh:
        fh.write(text)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("#!/bin/sh\necho \"$@\" >> '%s/bw-args.txt'\nsleep %s\ncat '%s/bw-output.txt'\nexit %d\n"
                 % (root, sleep, root, rc))
    os.chmod(path, 0o755)


def test_healthy_mi300x_every_pair_one_xgmi_hop_from_the_health_gates_own_calls(build_node):
    root = build_node(PRESET, cpus=4, amd_smi=True)
    desired = {"gpu_health": {}, "gpu_p2p": {}, "gpu_locality": {"remote_irqs_fail": False}}
    seen = []
    facts = probe(root, desired, seen)
    # One call per amd-smi subcommand for all three families: P2P and locality reuse topology and xgmi -l.
    assert seen == [["usr/bin/amd-smi"] + list(c.args) for c in amd_health.COMMANDS]
    rows = p2p_rows(facts, desired)
    assert set(rows) == {"amd.pairs", "amd.xgmi_links", "amd.bar0"}  # no NVIDIA row on a node of AMD GPUs only
    # Issue 44: the peers of an XGMI hive reach each other's memory over XGMI, not through the PCIe BAR0.
    bar0 = rows["amd.bar0"]
    assert (bar0["state"], bar0["vendor"]) == ("not_applicable", "amd")
    assert bar0["reason"].startswith("the GPUs are linked by XGMI (amd-smi topology)")
    pairs = rows["amd.pairs"]
    assert (pairs["state"], pairs["vendor"]) == ("applied", "amd")
    assert pairs["running"] == "XGMI, 1 hop, weight 15 on all 28 pairs of 8 GPUs"
    assert pairs["reason"].endswith("MI300X: one XGMI hop between any two GPUs, as found")
    assert rows["amd.xgmi_links"]["state"] == "applied"
    assert rows["amd.xgmi_links"]["reason"] == "56 XGMI link(s) up on 8 GPUs (amd-smi xgmi -l)"
    loc = {r["name"]: r for r in gpu_locality.DEFINITION.evaluate(facts, desired, None)}
    assert "GPU-to-GPU (amd-smi topology): XGMI, 1 hop, weight 15 to 7 GPUs" in loc[BDFS[3]]["reason"]
    report = gpu_locality_verify.report(facts, desired)
    assert "GPU-to-GPU links of the AMD GPUs (`amd-smi topology`" in report
    assert "| GPU3 (0000:65:00.0) | XGMI 1 | XGMI 1 | XGMI 1 | X | XGMI 1 |" in report
    assert "| GPU0 | GPU1 |" in gpu_p2p.report(facts, desired)


def test_an_xgmi_link_down_fails_the_pair_naming_both_gpus(build_node):
    root = build_node(PRESET, cpus=4, amd_smi=True, amd_faults={"xgmi_down": [3]})
    desired = {"gpu_p2p": {}}
    rows = p2p_rows(probe(root, desired), desired)
    bad = {n: r for n, r in rows.items() if r["state"] == "drifted"}
    assert set(bad) == {"amd.GPU3-GPU4", "amd.xgmi_links"}
    assert bad["amd.GPU3-GPU4"]["running"] == "XGMI, 1 hop, weight 15, DISABLED"
    assert bad["amd.GPU3-GPU4"]["reason"] == (
        "P2P between GPU 3 (0000:65:00.0) and GPU 4 (0000:85:00.0) is not as expected: GPU 3 cannot reach GPU 4's "
        "memory (link DISABLED); GPU 4 cannot reach GPU 3's memory (link DISABLED) (amd-smi topology)")
    assert bad["amd.xgmi_links"]["running"] == ("GPU 3 (0000:65:00.0): 1 XGMI link(s) down; "
                                                "GPU 4 (0000:85:00.0): 1 XGMI link(s) down")
    assert "amd.pairs" not in rows
    report = gpu_p2p.report(probe(root, desired), desired)
    assert "| GPU3 (0000:65:00.0) | XGMI 1 | XGMI 1 | XGMI 1 | X | XGMI 1 DISABLED |" in report


def test_amd_smi_missing_or_hanging_is_unsupported_and_no_bandwidth_is_measured(build_node):
    desired = {"gpu_p2p": {"min_gbps": 40}}
    for mode, words in (("absent", "amd-smi not found on the node's PATH nor in /opt/rocm/bin"),
                        ("hang", "did not answer within 2 s")):
        root = build_node(PRESET, cpus=4, amd_smi_mode=mode)
        stand_in(root, "TransferBench", capture(TB_CAPTURE))
        seen = []
        rows = p2p_rows(probe(root, desired, seen, timeouts={"amd_smi": 2}), desired)
        assert list(rows) == ["amd.pairs"], rows
        assert rows["amd.pairs"]["state"] == "unsupported" and words in rows["amd.pairs"]["reason"]
        # Missing amd-smi: TransferBench is still run (bounded), not judged without the pairs. A hanging amd-smi
        # means wedged GPUs: no other AMD tool is started on them (one timeout, not two).
        assert (["usr/bin/TransferBench", "p2p"] in seen) == (mode == "absent"), seen


def test_transferbench_p2p_against_the_floor(build_node):
    root = build_node(PRESET, cpus=4, amd_smi=True)
    stand_in(root, "TransferBench", capture(TB_CAPTURE))
    seen = []
    facts = probe(root, {"gpu_p2p": {"min_gbps": 40}}, seen)
    assert [c for c in seen if "amd-smi" not in c[0]] == [["usr/bin/TransferBench", "p2p"]]
    ok = p2p_rows(facts, {"gpu_p2p": {"min_gbps": 40}})["amd.bandwidth"]
    assert (ok["state"], ok["running"], ok["desired"]) == ("applied", "min 47.47 GB/s", ">= 40 GB/s")
    assert ok["reason"].startswith("56 GPU pairs measured by TransferBench (unidirectional copy")
    slow = {n: r for n, r in p2p_rows(facts, {"gpu_p2p": {"min_gbps": 47.7}}).items() if n.startswith("amd.band")}
    # The capture's pairs below 47.7 GB/s: GPU 00 -> GPU 06 (47.47), GPU 07 -> GPU 01 and 02 (47.69, 47.54);
    # GPU 07 -> GPU 00 and GPU 06 -> GPU 00 at 47.71 are not.
    assert sorted(slow) == ["amd.bandwidth.GPU0-GPU6", "amd.bandwidth.GPU7-GPU1", "amd.bandwidth.GPU7-GPU2"]
    row = slow["amd.bandwidth.GPU7-GPU2"]
    assert (row["state"], row["running"], row["vendor"]) == ("drifted", "47.54 GB/s", "amd")
    assert row["reason"] == "GPU 07 -> GPU 02 at 47.54 GB/s, below 47.7 GB/s (TransferBench, unidirectional copy)"


def test_rocm_bandwidth_test_when_transferbench_is_not_installed_and_neither(build_node):
    root = build_node(PRESET, cpus=4, amd_smi=True)
    desired = {"gpu_p2p": {"min_gbps": 49}}
    none = p2p_rows(probe(root, desired), desired)["amd.bandwidth"]
    assert (none["state"], none["reason"]) == ("unsupported", amd_p2p.BANDWIDTH_MISSING)
    stand_in(root, "rocm-bandwidth-test", capture(RBT_CAPTURE), where="opt/rocm/bin")  # ROCm's own directory
    seen = []
    rows = p2p_rows(probe(root, desired, seen), desired)
    assert [c for c in seen if "amd-smi" not in c[0]] == [["opt/rocm/bin/rocm-bandwidth-test", "-a"]]
    row = rows["amd.bandwidth.GPU2-GPU3"]
    assert row["reason"] == ("device 2 (bus 23:0.0) -> device 3 (bus 83:0.0) at 48.90 GB/s, below 49 GB/s "
                             "(rocm-bandwidth-test, unidirectional copy)")
    assert "amd.bandwidth.GPU3-GPU2" not in rows  # 49.92 GB/s


def test_a_hanging_or_failing_bandwidth_tool_is_a_finding_within_its_timeout(build_node):
    root = build_node(PRESET, cpus=4, amd_smi=True)
    desired = {"gpu_p2p": {"min_gbps": 40}}
    stand_in(root, "TransferBench", capture(TB_CAPTURE), sleep=30)
    rows = p2p_rows(probe(root, desired, timeouts={"rocm_bandwidth": 1}), desired)
    assert rows["amd.bandwidth"]["state"] == "drifted"
    assert "TransferBench did not answer within 1 s" in rows["amd.bandwidth"]["reason"]
    stand_in(root, "TransferBench", "[ERROR] No GPU devices found\n", rc=1)
    row = p2p_rows(probe(root, desired), desired)["amd.bandwidth"]
    assert (row["state"], row["reason"]) == ("drifted", "TransferBench (rc 1): [ERROR] No GPU devices found")


def test_a_node_with_both_vendors_gets_both_verdicts_and_nvidia_rows_stay_as_they_were():
    """NVIDIA's rows are computed as before (here: no nvidia-smi, not applicable); AMD's come beside them."""
    facts = {"pci": {"devices": [
        {"bdf": "0000:01:00.0", "vendor": "0x10de", "device": "0x2330", "class": "0x030200"},
        {"bdf": "0000:08:00.0", "vendor": "0x1002", "device": "0x74a1", "class": "0x120000"},
        {"bdf": "0000:44:00.0", "vendor": "0x1002", "device": "0x74a1", "class": "0x120000"}]}}
    topology = capture("amd-smi-topology-json-access-type-rocm6.1.1-changelog.txt")
    answers = {"probe": "absent", "amd_topology": {"rc": 0, "stdout": topology, "stderr": ""}}
    rows = gpu_p2p.DEFINITION.evaluate(facts, {"gpu_p2p": {}}, type("Ctx", (), {"gpu": answers})())
    assert [(r["name"], r["state"], r["vendor"]) for r in rows] == [
        ("pairs", "not_applicable", "nvidia"), ("amd.GPU0-GPU1", "drifted", "amd")]
    assert rows[0]["reason"] == "nvidia-smi is not installed on this node (no NVIDIA driver user space)"
    # Without AMD GPUs selected no AMD row, whatever the probe holds.
    nvidia_only = {"pci": {"devices": facts["pci"]["devices"][:1]}}
    assert [r["name"] for r in gpu_p2p.DEFINITION.evaluate(nvidia_only, {"gpu_p2p": {}},
                                                           type("Ctx", (), {"gpu": answers})())] == ["pairs"]


def test_xgmi_l_refused_with_amd_smis_own_error_document_judges_the_pairs_from_topology(build_node):
    """Issue 42: ``{"error": "Parameter '-l' is invalid. ...", "code": -2}`` with exit 0 is an amd-smi without
    ``xgmi -l``: no xgmi_links row, the pairs from topology, nothing failing."""
    root = build_node(PRESET, cpus=4, amd_smi_mode="refuse_link_status")
    desired = {"gpu_p2p": {}}
    rows = p2p_rows(probe(root, desired), desired)
    assert list(rows) == ["amd.pairs", "amd.bar0"]
    assert rows["amd.pairs"]["state"] == "applied"
    assert rows["amd.pairs"]["running"] == "XGMI, 1 hop, weight 15 on all 28 pairs of 8 GPUs"


def test_topology_refused_by_amd_smi_is_unsupported_naming_the_release():
    refusal = '{"error": "Command \'topology\' is not supported on the system. Run \'--help\' for more info.", ' \
              '"code": -7}\n'
    version = capture("amd-smi-version-rocm6.4.1-mi300a-legacy-rocm-build-4759.txt")
    answers = {"amd_topology": {"rc": 0, "stdout": refusal, "stderr": ""},
               "amd_version": {"rc": 0, "stdout": version, "stderr": ""}}
    (row,) = amd_p2p.pair_rows([], answers, lambda name, running, state, reason: {
        "name": name, "state": state, "reason": reason})
    assert row["state"] == "unsupported"
    assert row["reason"] == ("amd-smi (tool 25.4.2+aca1101, rocm 6.4.1) refused `amd-smi topology --json` (Command "
                             "'topology' is not supported on the system. Run '--help' for more info. (code -7)): this "
                             "release or system does not offer it")
