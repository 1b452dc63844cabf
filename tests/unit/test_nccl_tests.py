"""NCCL's verdict in the P2P check (core/nccl_tests.py, families/gpu_p2p.py): all_reduce_perf's table, its average
and the transport NCCL chose per GPU pair, read from real outputs other people posted (tests/data/real/nccl-tests-*,
rccl-tests-*); the verdict; the probe running the stand-in (tools/simnode/nccl.py) on a simulated node."""

from __future__ import annotations

import os

import pytest
from simnode import nccl as simnode_nccl
from support.p2p import rows as p2p_rows

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, family, nccl_tests
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_p2p
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families

REAL = os.path.join(os.path.dirname(__file__), os.pardir, "data", "real")
CAPTURES = (
    "nccl-tests-all-reduce-4x4090-p2p-cut-tinygrad-ogkm-22.txt",
    "nccl-tests-all-reduce-8x4090-shm-cut-nccl-tests-307.txt",
    "nccl-tests-all-reduce-8xl20-shm-cut-nccl-1817.txt",
    "nccl-tests-all-reduce-tail-2node-nccl-tests-252.txt",
    "rccl-tests-all-reduce-8xmi300x-cut-hpc-ai-envs-30.txt",
    "rccl-tests-all-reduce-tail-ainic-rccl-2078.txt",
    "rccl-tests-info-2x4-mi250x-cut-rccl-1026.txt",
)
PATH = "/opt/nccl-tests/build/all_reduce_perf"


def row(name, running, state, reason, desired):
    return {"name": name, "running": running, "state": state, "reason": reason, "desired": desired}


def verdict(text, floor=None, rc=0, **answer):
    return {r["name"]: r for r in nccl_tests.rows(dict(answer, rc=rc, stdout=text), PATH, floor, row)}


def test_every_capture_is_read_here_and_named_in_the_readme():
    on_disk = sorted(n for n in os.listdir(REAL) if n.startswith(("nccl-tests-", "rccl-tests-")))
    with open(os.path.join(REAL, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert on_disk == sorted(CAPTURES)
    assert [n for n in on_disk if "| %s |" % n not in readme] == []


def test_four_rtx_4090_with_p2p_direct_pointer_pass_and_fail_a_floor_above_their_busbw(real):
    text = real(CAPTURES[0]).text
    parsed = nccl_tests.parse(text)
    # 11 whole rows; the stored copy ends inside the 64 MiB row, which is not read as one
    assert [r["size"] for r in parsed["rows"]] == [32768 << i for i in range(11)]
    big = nccl_tests.largest(parsed)
    assert (big["size"], big["oop"], big["ip"]["busbw"]) == (
        33554432, {"time": 3966.7, "algbw": 8.46, "busbw": 12.69, "wrong": 0}, 12.77)
    assert nccl_tests.transports(parsed) == ["P2P/direct pointer"]
    assert len(parsed["links"]) == 6 and nccl_tests.not_peer_pairs(parsed) == {}
    ok = verdict(text)["nccl"]
    assert (ok["state"], ok["running"], ok["desired"]) == ("applied", "12.69 GB/s", "P2P")
    assert ok["reason"].endswith("busbw 12.69 GB/s at 33554432 bytes out of place (in place 12.77); NCCL connected "
                                 "the GPUs via P2P/direct")
    assert verdict(text, floor=10)["nccl"]["state"] == "applied"
    slow = verdict(text, floor=20)
    assert list(slow) == ["nccl.busbw"]
    assert (slow["nccl.busbw"]["state"], slow["nccl.busbw"]["running"]) == ("drifted", "12.69 GB/s")
    assert slow["nccl.busbw"]["reason"].endswith("busbw 12.69 GB/s at 33554432 bytes out of place (in place 12.77), "
                                                 "below the floor 20 GB/s")


def test_eight_l20_through_host_memory_fail_naming_each_pair_and_its_gpus(real):
    text = real(CAPTURES[2]).text
    parsed = nccl_tests.parse(text)
    assert parsed["avg_busbw"] == 6.13096 and parsed["out_of_bounds"] == (0, "OK")
    assert parsed["ranks"][4] == {"host": "sh9-machine-20250813085604-64df4c99dc-m27xf", "device": 4,
                                  "bus": "0000:91:00", "name": "NVIDIA L20"}
    assert sorted(nccl_tests.not_peer_pairs(parsed)) == [(0, 4), (1, 5), (2, 6), (2, 7), (3, 7)]
    rows = verdict(text, floor=20)
    # the stored copy has no table: no bus bandwidth measured, and the transports are judged all the same
    assert rows["nccl"]["state"] == "drifted" and "printed no result table" in rows["nccl"]["reason"]
    pair = rows["nccl.GPU0-GPU4"]
    assert (pair["state"], pair["running"], pair["desired"]) == ("drifted", "SHM/direct/direct", "P2P")
    assert pair["reason"].startswith("NCCL connected GPU0 (0000:12:00) and GPU4 (0000:91:00) through "
                                     "SHM/direct/direct (channels 00, 01), not GPU to GPU")
    assert "rank 7" in rows["nccl.GPU3-GPU7"]["reason"]  # rank 7's device line is not in the stored copy


def test_eight_rtx_4090_without_p2p_ring_lines_are_not_connections(real):
    parsed = nccl_tests.parse(real(CAPTURES[1]).text)
    assert len(parsed["links"]) == 9  # "Ring 00 : 7 -> 0 -> 1" is the ring order, and the cut last line is not read
    assert sorted(nccl_tests.not_peer_pairs(parsed)) == [(0, 1), (0, 7), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6),
                                                         (6, 7)]
    assert nccl_tests.not_peer_pairs(parsed)[(2, 3)]["channels"] == ["00", "01"]


def test_a_two_node_table_below_a_floor_and_the_average(real):
    text = real(CAPTURES[3]).text
    parsed = nccl_tests.parse(text)
    assert len(parsed["rows"]) == 5 and parsed["avg_busbw"] == 95.3009
    assert nccl_tests.largest(parsed)["oop"]["busbw"] == 95.10
    rows = verdict(text, floor=100)
    assert rows["nccl.busbw"]["running"] == "95.10 GB/s"
    assert "below the floor 100 GB/s" in rows["nccl.busbw"]["reason"]
    assert "# Avg bus bandwidth 95.3009 GB/s" in rows["nccl.busbw"]["reason"]
    ok = verdict(text, floor=90)["nccl"]
    assert ok["state"] == "applied" and "NCCL printed no transport" in ok["reason"]


def test_rccl_tests_outputs_read_the_same(real):
    mi300x = nccl_tests.parse(real(CAPTURES[4]).text)
    assert len(mi300x["ranks"]) == 8 and mi300x["ranks"][7]["bus"] == "0000:e7:00"
    assert [(r["size"], r["oop"]["busbw"], r["ip"]["busbw"]) for r in mi300x["rows"]] == [(8388608, 161.14, 154.63)]
    tail = nccl_tests.parse(real(CAPTURES[5]).text)
    assert [r["size"] for r in tail["rows"]] == [2147483648 << i for i in range(4)]
    assert tail["avg_busbw"] == 142.652 and nccl_tests.largest(tail)["oop"]["busbw"] == 360.98
    a3mega = nccl_tests.parse(real("bench-nccl-tests-all-reduce-16xh100-a3mega.txt").text)
    assert len(a3mega["rows"]) == 31 and len({r["host"] for r in a3mega["ranks"].values()}) == 2


def test_rccls_own_info_lines_p2p_ipc_between_gpus_and_net_between_nodes(real):
    parsed = nccl_tests.parse(real(CAPTURES[6]).text)
    assert len(parsed["links"]) == 9  # "Connected all rings ... busId" and the cut last line are not connections
    first = parsed["links"][0]
    assert (first["src"], first["src_id"], first["dst"], first["direction"], first["via"]) == (
        1, "c6000", 4, "receive", "NET/Socket/1")  # "comm 0x95cdeb0 nRanks 08" is not part of the transport
    assert nccl_tests.transports(parsed) == ["NET/Socket/1", "NET/Socket/2", "P2P/IPC"]
    assert nccl_tests.not_peer_pairs(parsed) == {}  # NET to the other node is no finding: the hosts are unknown
    one_host = "#  Rank  1 Group  0 Pid 1 on g1064 device  1 [0000:c6:00] MI250X\n" \
               "#  Rank  4 Group  0 Pid 1 on g1064 device  4 [0000:c1:00] MI250X\n"
    both = nccl_tests.parse(one_host + real(CAPTURES[6]).text)
    assert nccl_tests.not_peer_pairs(both) == {(1, 4): {"transports": ["NET/Socket/1"], "channels": ["02"]}}


def test_row_forms_of_other_releases():
    # mpirun's output tag (aws/aws-k8s-tester#503, a p5.48xlarge)
    tagged = "[1,0]<stdout>:           8             2     float     sum      -1    12.90    0.00    0.00      0" \
             "    12.87    0.00    0.00      0"
    assert nccl_tests.parse(tagged)["rows"][0]["oop"]["time"] == 12.90
    # no root column, an error column (nccl-tests before 2.10, NVIDIA/nccl#583's header)
    old = nccl_tests.parse_row("   134217728      33554432   float     sum    2603.1   51.56   90.23  5e-07    2601.4"
                               "   51.60   90.30  5e-07")
    assert (old["root"], old["oop"]["busbw"], old["oop"]["wrong"]) == (None, 90.23, None)
    assert nccl_tests.parse_row("     8388608       2097152     float     sum      -1    91.10   92.08") is None
    assert nccl_tests.parse("NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0")["links"][0]["transport"] \
        == "NET"


def test_wrong_values_fail_and_a_failed_or_missing_run_is_a_finding(real):
    text = real(CAPTURES[0]).text.replace("8.46   12.69      0", "8.46   12.69      3")  # derived: 3 wrong
    rows = verdict(text + "# Out of bounds values : 3 FAILED\n")
    assert rows["nccl.wrong"]["running"] == "3 wrong" and "3 FAILED" in rows["nccl.wrong"]["reason"]
    missing = verdict("", rc=127, stderr="")["nccl"]
    assert missing["state"] == "unsupported" and "not found on the node" in missing["reason"]
    hung = verdict(real(CAPTURES[2]).text, rc=command.TIMEOUT_RC, timed_out=True,
                   stderr="all_reduce_perf did not answer within 600 s: a wedged GPU")
    assert hung["nccl"]["reason"] == "all_reduce_perf did not answer within 600 s: a wedged GPU"
    assert "nccl.GPU0-GPU4" in hung  # what NCCL printed before it hung is judged
    failed = verdict("", rc=1, stderr="Cuda failure 'invalid device ordinal'")["nccl"]
    assert failed["reason"] == (PATH + " -b 8 -e 1G -f 2 -g <GPUs> failed (rc 1): Cuda failure 'invalid device "
                                "ordinal'")


def test_bad_desired_is_refused_naming_what_is_allowed():
    for want, text in (({"nccl_tests": "/opt/bin/ib_write_bw"}, "all_reduce_perf or all_reduce_perf_mpi"),
                       ({"nccl_tests": "all_reduce_perf -g 8"}, r"path \(or name on PATH\)"),
                       ({"min_busbw_gbps": 20}, "needs nccl_tests"),
                       ({"nccl_tests": PATH, "min_busbw_gbps": -1}, "a number > 0"),
                       ({"nccl": PATH}, "allowed: min_gbps, nccl_tests, min_busbw_gbps")):
        with pytest.raises(family.EvaluationError, match=text):
            gpu_p2p.validate(want)
    assert gpu_p2p.validate({"nccl_tests": "all_reduce_perf_mpi", "min_busbw_gbps": 20})["min_busbw_gbps"] == 20


def test_the_guard_never_runs_it(build_node):
    node = Node(build_node("audited-epyc-8gpu", cpus=4))
    desired = {"gpu_p2p": {"min_gbps": 40.0, "nccl_tests": PATH, "min_busbw_gbps": 20.0}}
    kept = all_families.node_desired(desired, node)
    assert kept["gpu_p2p"] == {"min_gbps": None, "nccl_tests": None, "min_busbw_gbps": None}
    assert gpu_p2p.gpu_commands(kept) == gpu_p2p.gpu_commands({"gpu_p2p": {}})


def test_the_probe_runs_the_stand_in_with_nccl_debug_on_every_gpu_and_judges_it(build_node):
    root = build_node("xeon-4gpu-switch", cpus=4, gpus=2, nvidia_smi=True)
    desired = {"gpu_p2p": {"nccl_tests": PATH, "min_busbw_gbps": 20}}
    missing = p2p_rows(root, desired)["nccl"]
    assert missing["state"] == "unsupported" and "%s not found on the node" % PATH in missing["reason"]
    simnode_nccl.write(root, "p2p")
    calls = []
    rows = p2p_rows(root, desired, calls)
    assert [c[1:] for c in calls if c[0].endswith("all_reduce_perf")] == [["-b", "8", "-e", "1G", "-f", "2", "-g",
                                                                           "2"]]
    assert simnode_nccl.calls(root) == ["NCCL_DEBUG=INFO -b 8 -e 1G -f 2 -g 2"]
    assert rows["nccl.busbw"]["state"] == "drifted" and rows["nccl.busbw"]["running"] == "12.69 GB/s"
    assert command.kind_of([os.path.join(root, PATH.lstrip("/"))]) == "nccl_tests"
    shm = build_node("xeon-4gpu-switch", cpus=4, gpus=2, nvidia_smi=True)
    simnode_nccl.write(shm, "shm")
    pair = p2p_rows(shm, {"gpu_p2p": {"nccl_tests": PATH}})["nccl.GPU0-GPU4"]
    # the stand-in's two GPUs are not OK for nvidia-smi either (ACS redirect on this preset): said beside NCCL's
    assert pair["state"] == "drifted" and "SHM/direct/direct" in pair["reason"]


def test_tuning_info_runs_it_through_the_bounded_runner_with_nccl_debug(build_node, run_module):
    """The module's own path: verify_probed counts the GPUs, command.runner sets NCCL_DEBUG=INFO for this one
    command (the stand-in prints NCCL's INFO lines only then) and bounds it by the nccl_tests timeout."""
    root = build_node("xeon-4gpu-switch", cpus=2, gpus=2, nvidia_smi=True)
    simnode_nccl.write(root, "shm")
    desired = {"gpu_p2p": {"nccl_tests": PATH}}
    result, failed = run_module("tuning_info", {"root": root, "desired": desired})
    assert not failed, result
    rows = {s["id"]: s for s in result["verification"]["settings"]}
    assert rows["gpu_p2p.nccl.GPU0-GPU4"]["state"] == "drifted"
    assert simnode_nccl.calls(root) == ["NCCL_DEBUG=INFO -b 8 -e 1G -f 2 -g 2"]
    simnode_nccl.write(root, "p2p", sleep=5)
    result, failed = run_module("tuning_info", {"root": root, "desired": desired,
                                                "command_timeouts": {"nccl_tests": 1}})
    hung = {s["id"]: s for s in result["verification"]["settings"]}["gpu_p2p.nccl"]
    assert hung["state"] == "drifted" and "all_reduce_perf did not answer within 1 s" in hung["reason"]


def test_smi_says_what_nvidia_smi_thinks_of_a_pair_nccl_sent_through_host_memory():
    matrix = "\tGPU0\tGPU1\nGPU0\tX\tOK\nGPU1\tOK\tX\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n"
    smi = {"p2p_read": {"rc": 0, "stdout": matrix}}
    assert gpu_p2p.smi_says(smi, 1, 0).startswith("nvidia-smi topo -p2p r says OK for the pair: NCCL's own test "
                                                  "refused it")
    one_way = {"p2p_read": {"stdout": matrix.replace("GPU1\tOK", "GPU1\tCNS")}}
    assert gpu_p2p.smi_says(one_way, 0, 1) == gpu_p2p.smi_says(one_way, 1, 0) == (
        "nvidia-smi topo -p2p r says GPU1->GPU0 CNS (chipset not supported) for the pair too")
    assert gpu_p2p.smi_says(smi, 0, 4) is None


def test_amd_bar0_is_judged_where_the_gpus_talk_over_pcie(monkeypatch):
    gib, mib = 1 << 30, 1 << 20
    small = {"vendor": "amd", "device": "0x744c", "bars": {"0": 256 * mib, "2": 2 * mib}, "memory": 24 * gib,
             "rebar": {"0": {"current": 256 * mib, "supported": [256 * mib, 32 * gib]}}}
    full = dict(small, bars={"0": 32 * gib}, rebar={"0": {"current": 32 * gib, "supported": [32 * gib]}})
    facts = {"gpu_p2p": {"bars": {"0000:03:00.0": small, "0000:83:00.0": full}}}
    for kind, expect in (("PCIE", ["amd.bar0.0000:03:00.0"]), ("XGMI", ["amd.bar0"])):
        link = {"link_type": kind}
        monkeypatch.setattr(gpu_p2p.amd_p2p, "topology_links", lambda _a, link=link: {"pairs": {(0, 1): link}})
        rows = gpu_p2p.amd_bar_rows(facts, {})
        assert [r["name"] for r in rows] == expect
    monkeypatch.setattr(gpu_p2p.amd_p2p, "topology_links", lambda _a: {"pairs": {(0, 1): {"link_type": "PCIE"}}})
    (bad,) = gpu_p2p.amd_bar_rows(facts, {})
    assert (bad["state"], bad["vendor"], bad["running"]) == ("drifted", "amd", "256 MiB")
    assert "GPU 0000:03:00.0 BAR0: 256 MiB, smaller than the GPU's 24 GiB of memory" in bad["reason"]
    by_design = dict(small, rebar=None)
    facts["gpu_p2p"]["bars"]["0000:03:00.0"] = by_design
    (ok,) = gpu_p2p.amd_bar_rows(facts, {})
    assert ok["state"] == "applied" and "amdgpu gives PCIe peers access only to a GPU whose BAR0 shows all" \
        in ok["reason"]
    monkeypatch.setattr(gpu_p2p.amd_p2p, "topology_links", lambda _a: None)
    assert gpu_p2p.amd_bar_rows(facts, {}) == []
