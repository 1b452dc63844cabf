"""The gpu_locality family (module_utils/families/gpu_locality.py) and its module, on real layouts and simulated nodes.

The relations are proven on real machines: tests/data/real/locality-*.txt hold `lspci -tv` and
`nvidia-smi topo -m` captured on the same machine by other people (each file names its source); a
test tree is built from the `lspci -tv` text (one sysfs directory per function, below its bridges, as
the kernel nests them) with the NUMA nodes the capture's `lspci -vvv` shows, and every GPU/NIC pair's
relation is compared with nvidia-smi's cell.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import jsonschema
import pytest
import simnode

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, parse_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_locality, gpu_locality_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL = os.path.join(REPO, "tests", "data", "real")
SCHEMA = os.path.join(REPO, "docs", "topology.schema.json")
DESIRED = {"gpu_locality": {"remote_irqs_fail": False, "export": gpu_locality.EXPORT_PATH}}


def capture(name):
    with open(os.path.join(REAL, name), encoding="utf-8") as fh:
        text = fh.read()
    sections, current = {}, None
    for line in text.splitlines():
        if line.startswith("=== "):
            current = line[4:]
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {k: "\n".join(v) for k, v in sections.items()} if sections else text


# -- A sysfs tree from `lspci -tv`

_TOKEN = re.compile(r"\[(?P<domain>[0-9a-f]{4}):(?P<root>[0-9a-f]{2})\]|\[(?P<bus>[0-9a-f]{2})(?:-[0-9a-f]{2})?\]"
                    r"|(?<=-)(?P<fn>[0-9a-f]{2}\.[0-7])(?=-|  |$)")


def parse_lspci_tree(text):
    """``[(bdf, host bridge dir name, [bridge bdfs], is_bridge, name)]`` from `lspci -tv` (column by column)."""
    frames, out = [], []  # frame: (column, domain, bus, chain of bridges, host bridge)
    for line in text.splitlines():
        leaf = re.search(r"[0-9a-f]{2}\.[0-7]  (.*)$", line)
        tree = line[:leaf.start(1)] if leaf else line
        last = None
        for m in _TOKEN.finditer(tree):
            col = m.start()
            while frames and frames[-1][0] >= col and not m.group("bus"):
                frames.pop()
            if m.group("domain"):
                hb = "pci%s:%s" % (m.group("domain"), m.group("root"))
                frames.append((col, m.group("domain"), m.group("root"), [], hb))
            elif m.group("fn"):
                _c, domain, bus, chain, hb = frames[-1]
                last = ["%s:%s:%s" % (domain, bus, m.group("fn")), hb, chain, False, ""]
                out.append(last)
            else:
                last[3] = True
                frames.append((col, last[0][:4], m.group("bus"), last[2] + [last[0]], last[1]))
        if leaf and last is not None:
            last[4] = leaf.group(1)
    return [tuple(d) for d in out]


def _classify(name, is_bridge):
    if is_bridge:
        return "0x060400", "0x1022"
    if "NVIDIA" in name:
        return ("0x040300" if "Audio" in name else "0x030000"), "0x10de"
    if "Mellanox" in name:
        return "0x020000", "0x15b3"
    if "Ethernet" in name:
        return "0x020000", "0x8086"
    if "NVMe SSD" in name:
        return "0x010802", "0x144d"
    return "0x088000", "0x1022"


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")


def build_tree(root, devices, nodes):
    """A node root with ``devices`` (``(bdf, host bridge, chain, class, vendor, numa_node)``) and NUMA ``nodes``.

    ``nodes``: ``{node: cpulist}``. Each function's directory is nested below its bridges, linked from
    /sys/bus/pci/devices, with class, vendor, device, numa_node and local_cpulist (all CPUs for -1).
    """
    root = str(root)
    all_cpus = sorted(c for cpus in nodes.values() for c in parse_cpulist(cpus))
    write(os.path.join(root, "sys/devices/system/cpu/online"), "%d-%d" % (all_cpus[0], all_cpus[-1]))
    write(os.path.join(root, "sys/devices/system/node/online"), ",".join(str(n) for n in sorted(nodes)))
    for n, cpus in nodes.items():
        write(os.path.join(root, "sys/devices/system/node/node%d/cpulist" % n), cpus)
    os.makedirs(os.path.join(root, "sys/bus/pci/devices"), exist_ok=True)
    for bdf, hb, chain, cls, vendor, numa in devices:
        rel = "/".join([hb] + list(chain) + [bdf])
        d = os.path.join(root, "sys/devices", rel)
        for key, value in (("class", cls), ("vendor", vendor), ("device", "0x0001"), ("numa_node", str(numa)),
                           ("local_cpulist", nodes.get(numa, "%d-%d" % (all_cpus[0], all_cpus[-1])))):
            write(os.path.join(d, key), value)
        os.symlink("../../../devices/" + rel, os.path.join(root, "sys/bus/pci/devices", bdf))
    return root


def tree_from_capture(root, name):
    """The test tree of a real capture: its lspci -tv, NUMA node per host bridge from its lspci -vvv lines."""
    cap = capture(name)
    devices = parse_lspci_tree(cap["lspci -tv"])
    hb_node = {}
    vvv = cap.get("lspci -vvv NUMA node", "").splitlines()
    for head, numa in zip(vvv, vvv[1:], strict=False):
        m = re.match(r"^([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", head)
        n = re.match(r"^\s+NUMA node: (\d+)$", numa)
        if m and n:
            hb = next(d[1] for d in devices if d[0] == "0000:" + m.group(1))
            hb_node[hb] = int(n.group(1))
    nodes = {0: "0-31", 1: "32-63"} if hb_node else {0: "0-23"}
    rows = []
    for bdf, hb, chain, is_bridge, label in devices:
        cls, vendor = _classify(label, is_bridge)
        rows.append((bdf, hb, chain, cls, vendor, hb_node.get(hb, 0)))
    build_tree(root, rows, nodes)
    mlx = sorted(b for b, _h, _c, br, label in devices if "Mellanox" in label)
    for i, bdf in enumerate(mlx):  # mlx5_N in probe (PCI bus) order, as the driver numbers them
        os.makedirs(os.path.realpath(os.path.join(str(root), "sys/bus/pci/devices", bdf, "infiniband", "mlx5_%d" % i)))
    return cap, devices


def matrix_check(node, cap):
    """The capture's matrix cells against ours: ``([(row, col, theirs, ours)] that differ, cells seen, ...)``."""
    loc = gpu_locality.read(node)
    topo = gpu_locality_verify.parse_topo(cap["nvidia-smi topo -m"])
    gpus = sorted(g["bdf"] for g in loc["gpus"])
    rdma = {n["rdma"][0]: n["bdf"] for n in loc["nics"] if n["rdma"]}
    names = {"GPU%d" % i: b for i, b in enumerate(gpus)}
    names.update({nic: rdma[dev] for nic, dev in topo["nic_legend"].items()})
    paths = {b: gpu_locality.device_path(node, b)[0] for b in names.values()}
    wrong, seen = [], 0
    for row, entry in topo["rows"].items():
        for col, cell in entry["cells"].items():
            if cell == "X":
                continue
            ours = gpu_locality.relation(paths[names[row]], paths[names[col]], loc["host_bridges"])
            seen += 1
            if ours != cell:
                wrong.append((row, col, cell, ours))
    return wrong, seen, loc, topo


# -- Real machines: lspci -tv and nvidia-smi topo -m of the same node


def test_lspci_tree_of_the_asus_capture_nests_functions_below_their_bridges():
    devices = {d[0]: d for d in parse_lspci_tree(capture("locality-asus-esc8000a-e12.txt")["lspci -tv"])}
    assert devices["0000:01:00.0"][1:3] == ("pci0000:00", ["0000:00:01.1"])
    assert devices["0000:21:00.1"][1:3] == ("pci0000:20", ["0000:20:03.1"])
    # The HighPoint carrier: a switch below a switch below root port 60:01.1.
    assert devices["0000:65:00.0"][1:3] == ("pci0000:60", ["0000:60:01.1", "0000:61:00.0", "0000:62:00.0",
                                                           "0000:63:00.0", "0000:64:10.0"])
    assert devices["0000:6e:00.0"][2][-1] == "0000:6a:0c.0"
    assert devices["0000:e1:00.0"][1] == "pci0000:e0"


@pytest.mark.parametrize("name,cells", [("locality-asus-esc8000a-e12.txt", 56),
                                        ("locality-puget-threadripper-pro-wrx90.txt", 12)])
def test_every_relation_matches_nvidia_smi_on_real_machines(tmp_path, name, cells):
    """ASUS ESC8000A-E12 (2 sockets, 8 host bridges): NODE, SYS and PIX (two ports of one ConnectX-7);
    Puget WRX90 (1 socket): PHB (two root ports of one host bridge), NODE, PIX."""
    cap, _devices = tree_from_capture(tmp_path, name)
    wrong, seen, _loc, _topo = matrix_check(Node.open(str(tmp_path)), cap)
    assert seen == cells
    assert wrong == []


def test_nearest_nic_on_the_asus_node_is_its_sockets_connectx(tmp_path):
    tree_from_capture(tmp_path, "locality-asus-esc8000a-e12.txt")
    loc = gpu_locality.read(Node.open(str(tmp_path)))
    near = {g["bdf"]: (g["numa_node"], g["cpus"], g["nearest_nic"]["bdf"], g["nearest_nic"]["relation"])
            for g in loc["gpus"]}
    assert near == {"0000:01:00.0": (0, "0-31", "0000:21:00.0", "NODE"),
                    "0000:41:00.0": (0, "0-31", "0000:21:00.0", "NODE"),
                    "0000:c1:00.0": (1, "32-63", "0000:81:00.0", "NODE"),
                    "0000:e1:00.0": (1, "32-63", "0000:81:00.0", "NODE")}
    # The X710 at 82:00.0 is as near to the socket-1 GPUs, but not RDMA-capable: the ConnectX-7 is chosen.
    x710 = next(n for n in loc["gpus"][2]["nics"] if n["bdf"] == "0000:82:00.0")
    assert x710["relation"] == "NODE"
    # The NVMe drive on 0000:00's root port 05.1, beside GPU 01:00.0's root port 01.1.
    assert loc["gpus"][0]["nearest_nvme"] == {"bdf": "0000:02:00.0", "relation": "PHB", "names": []}


def test_a_switch_below_a_switch_on_the_real_highpoint_tree():
    """The HighPoint SSD7540 carriers of the ASUS capture: drives on one switch are PIX, on sibling switches
    below a common switch PXB (NVML's levels: SINGLE is one switch, MULTIPLE several without the host bridge).
    nvidia-smi shows no NVMe drives, so these expectations are the legend's, on the real tree."""
    devices = {d[0]: d for d in parse_lspci_tree(capture("locality-asus-esc8000a-e12.txt")["lspci -tv"])}

    def path(bdf):
        return gpu_locality.parse_path([devices[bdf][1]] + devices[bdf][2] + [bdf])

    nodes = {"0000:60": 0, "0000:a0": 1}
    assert gpu_locality.relation(path("0000:65:00.0"), path("0000:66:00.0"), nodes) == "PIX"
    assert gpu_locality.relation(path("0000:65:00.0"), path("0000:6b:00.0"), nodes) == "PXB"
    assert gpu_locality.relation(path("0000:65:00.0"), path("0000:a5:00.0"), nodes) == "SYS"
    assert gpu_locality.relation(path("0000:65:00.0"), path("0000:75:00.0"), nodes) == "PHB"  # the BMC's VGA


def test_affinity_columns_agree_with_sysfs_on_the_real_capture_and_a_wrong_node_is_a_finding(tmp_path):
    cap, _devices = tree_from_capture(tmp_path, "locality-asus-esc8000a-e12.txt")
    node = Node.open(str(tmp_path))
    query = "".join("%d, 00000000:%s\n" % (i, b[5:].upper()) for i, b in
                    enumerate(["0000:01:00.0", "0000:41:00.0", "0000:c1:00.0", "0000:e1:00.0"]))
    probe = {"probe": "present", "query": {"rc": 0, "stdout": query},
             "topology": {"rc": 0, "stdout": cap["nvidia-smi topo -m"]}}
    ctx = verification.Context()
    ctx.gpu = probe
    facts = {"gpu_locality": gpu_locality.read(node)}
    rows = [r for r in gpu_locality_verify.evaluate(facts, DESIRED, ctx) if r["name"].startswith("0000:")]
    assert [r["state"] for r in rows] == ["applied"] * 4
    assert all("nvidia-smi topo -m agrees on the CPU/NUMA affinity" in r["reason"] for r in rows)
    # GPU c1:00.0's firmware now says node 0 (local CPUs 0-31): nvidia-smi's row says 32-63 and node 1.
    d = os.path.realpath(os.path.join(str(tmp_path), "sys/bus/pci/devices/0000:c1:00.0"))
    write(os.path.join(d, "numa_node"), "0")
    write(os.path.join(d, "local_cpulist"), "0-31")
    rows = {r["name"]: r for r in gpu_locality_verify.evaluate({"gpu_locality": gpu_locality.read(node)}, DESIRED, ctx)}
    assert rows["0000:c1:00.0"]["state"] == "drifted"
    assert "nvidia-smi topo -m gives CPU affinity 32-63 (sysfs: 0-31); NUMA affinity 1 (sysfs: 0)" in \
        rows["0000:c1:00.0"]["reason"]
    assert rows["0000:01:00.0"]["state"] == "applied"


def test_parse_topo_reads_the_affinity_columns_of_real_outputs():
    tabs = gpu_locality_verify.parse_topo(capture("locality-topo-threadripper-2gpu-tabs.txt"))
    assert tabs["columns"] == ["GPU0", "GPU1"]
    assert tabs["rows"]["GPU1"] == {"cells": {"GPU0": "PHB", "GPU1": "X"}, "cpu_affinity": "0-63", "numa_affinity": "0"}
    dgx = gpu_locality_verify.parse_topo(capture("locality-topo-dgx-a100-mlx5-columns.txt"))
    assert len(dgx["columns"]) == 20 and dgx["columns"][8] == "mlx5_0"
    assert dgx["rows"]["GPU6"]["cells"]["mlx5_8"] == "PXB" and dgx["rows"]["GPU6"]["cells"]["mlx5_6"] == "SYS"
    assert (dgx["rows"]["GPU6"]["cpu_affinity"], dgx["rows"]["GPU6"]["numa_affinity"]) == ("112-127,240-255", "6-7")
    assert dgx["rows"]["mlx5_0"]["cpu_affinity"] is None
    old = gpu_locality_verify.parse_topo(capture("locality-topo-8gpu-mlx4-cpu-affinity-only.txt"))
    assert old["rows"]["GPU4"]["cpu_affinity"] == "10-19,30-39" and old["rows"]["GPU4"]["numa_affinity"] is None
    asus = gpu_locality_verify.parse_topo(capture("locality-asus-esc8000a-e12.txt")["nvidia-smi topo -m"])
    assert asus["nic_legend"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}
    assert asus["rows"]["GPU2"]["cpu_affinity"] == "32-63" and asus["rows"]["NIC3"]["cells"]["NIC2"] == "PIX"
    # Drivers 590 and later underline the header row (knobs.md): the same capture with it parses the same.
    text = capture("locality-topo-threadripper-2gpu-tabs.txt").splitlines()
    header = next(i for i, line in enumerate(text) if line.startswith("\tGPU0"))
    text[header] = "\x1b[4m" + text[header] + "\x1b[0m"
    assert gpu_locality_verify.parse_topo("\n".join(text)) == tabs


def test_an_affinity_range_with_the_gpus_node_agrees():
    gpu = {"cpus": "112-127,240-255", "numa_node": 7}
    assert gpu_locality_verify.affinity_disagreement(gpu, {"cpus": "112-127,240-255", "numa": "6-7"}) is None
    assert gpu_locality_verify.affinity_disagreement(gpu, {"cpus": "N/A", "numa": "N/A"}) is None
    assert "NUMA affinity 6 (sysfs: 7)" in gpu_locality_verify.affinity_disagreement(gpu, {"cpus": None, "numa": "6"})


# -- Layouts real nodes have that the presets do not


def P(*components):
    return gpu_locality.parse_path(list(components))


def test_relations_of_layouts_beyond_the_presets():
    nodes = {"0000:00": 0, "0000:40": 0, "0000:80": 1, "0008:00": 0, "0009:00": 1}
    rp, sw = "0000:00:01.0", ["0000:00:01.0", "0000:01:00.0"]
    # Devices on the root bus (no bridge, e.g. integrated functions) and on other root ports: PHB.
    assert gpu_locality.relation(P("pci0000:00", "0000:00:1f.6"), P("pci0000:00", "0000:00:14.0"), nodes) == "PHB"
    assert gpu_locality.relation(P("pci0000:00", rp, "0000:01:00.0"), P("pci0000:00", "0000:00:02.0", "0000:02:00.0"),
                                 nodes) == "PHB"
    # Two functions of one device on a root port (a dual-port NIC): PIX, as nvidia-smi says for NIC0/NIC1.
    assert gpu_locality.relation(P("pci0000:00", rp, "0000:01:00.0"), P("pci0000:00", rp, "0000:01:00.1"),
                                 nodes) == "PIX"
    # One switch: PIX; a GPU behind a switch below a switch, the NIC on the upper switch: PXB.
    gpu_a = P("pci0000:00", *sw, "0000:02:00.0", "0000:03:00.0")
    gpu_b = P("pci0000:00", *sw, "0000:02:01.0", "0000:04:00.0")
    deep = P("pci0000:00", *sw, "0000:02:02.0", "0000:05:00.0", "0000:06:00.0", "0000:07:00.0")
    assert gpu_locality.relation(gpu_a, gpu_b, nodes) == "PIX"
    assert gpu_locality.relation(gpu_a, deep, nodes) == "PXB"
    assert gpu_locality.relation(P("pci0000:00", *sw, "0000:02:02.0", "0000:05:00.0", "0000:06:00.0", "0000:07:00.0"),
                                 P("pci0000:00", *sw, "0000:02:02.0", "0000:05:00.0", "0000:06:01.0", "0000:08:00.0"),
                                 nodes) == "PIX"
    # Other host bridges: NODE on one node, SYS across nodes and when a node is unknown.
    assert gpu_locality.relation(gpu_a, P("pci0000:40", "0000:40:01.1", "0000:41:00.0"), nodes) == "NODE"
    assert gpu_locality.relation(gpu_a, P("pci0000:80", "0000:80:01.1", "0000:81:00.0"), nodes) == "SYS"
    assert gpu_locality.relation(gpu_a, P("pci0000:c0", "0000:c0:01.1", "0000:c1:00.0"), nodes) == "SYS"


def test_paths_of_arm64_segments_device_tree_platforms_and_vmd():
    # Grace: one PCI segment (domain) per root port, each its own host bridge.
    grace = P("pci0008:00", "0008:00:00.0", "0008:01:00.0")
    assert grace == {"host_bridge": "0008:00", "bridges": ["0008:00:00.0"], "device": "0008:01:00.0"}
    assert gpu_locality.relation(grace, P("pci0009:00", "0009:00:00.0", "0009:01:00.0"),
                                 {"0008:00": 0, "0009:00": 0}) == "NODE"
    # arm64 device tree: the host bridge below a platform device.
    dt = P("platform", "soc", "1f00000000.pcie", "pci0000:00", "0000:00:00.0", "0000:01:00.0")
    assert dt["host_bridge"] == "0000:00" and dt["bridges"] == ["0000:00:00.0"]
    # Intel VMD: devices behind the VMD endpoint get a domain of 5 hex digits; the VMD is on their path.
    vmd = P("pci0000:00", "0000:00:0e.0", "pci10000:00", "10000:00:02.0", "10000:01:00.0")
    assert vmd["host_bridge"] == "0000:00"
    assert vmd["bridges"] == ["0000:00:0e.0", "pci10000:00", "10000:00:02.0"]


def test_a_gpu_without_numa_takes_its_nearest_bridges_node_and_is_a_finding(tmp_path):
    nodes = {0: "0-3", 1: "4-7"}
    devices = [
        ("0000:40:01.1", "pci0000:40", [], "0x060400", "0x1022", 1),
        ("0000:41:00.0", "pci0000:40", ["0000:40:01.1"], "0x030200", "0x10de", -1),
        ("0000:c0:01.1", "pci0000:c0", [], "0x060400", "0x1022", -1),
        ("0000:c1:00.0", "pci0000:c0", ["0000:c0:01.1"], "0x030200", "0x10de", -1),
    ]
    node = Node.open(build_tree(tmp_path, devices, nodes))
    loc = gpu_locality.read(node)
    g41, gc1 = loc["gpus"]
    assert (g41["numa_node"], g41["numa_source"], g41["numa_node_published"]) == (1, "bridge 0000:40:01.1", -1)
    assert (gc1["numa_node"], gc1["numa_source"]) == (None, None)
    assert gc1["cpus"] == "0-7"  # local_cpulist of a device without a node: every CPU
    rows = {r["name"]: r for r in gpu_locality_verify.evaluate({"gpu_locality": loc}, DESIRED)}
    assert rows["0000:41:00.0"]["state"] == "drifted"
    assert rows["0000:41:00.0"]["reason"].startswith(
        "firmware publishes no NUMA affinity for 0000:41:00.0 (numa_node -1) (its bridge 0000:40:01.1 is on node 1)")
    assert rows["0000:c1:00.0"]["state"] == "drifted"
    assert "firmware publishes no NUMA affinity for 0000:c1:00.0 (numa_node -1):" in rows["0000:c1:00.0"]["reason"]
    assert rows["0000:c1:00.0"]["running"].startswith("no NUMA node, CPUs 0-7")


def test_numa_minus_one_on_a_single_node_is_no_finding(tmp_path):
    devices = [("0000:00:01.0", "pci0000:00", [], "0x060400", "0x8086", -1),
               ("0000:01:00.0", "pci0000:00", ["0000:00:01.0"], "0x030000", "0x10de", -1)]
    loc = gpu_locality.read(Node.open(build_tree(tmp_path, devices, {0: "0-3"})))
    (row, ib) = gpu_locality_verify.evaluate({"gpu_locality": loc}, DESIRED)
    assert row["state"] == "applied" and "numa_node -1 on a single NUMA node: nothing to bind" in row["reason"]
    assert ib["name"] == "irqbalance" and ib["running"] == "not running"
    assert "One NUMA node: binding changes nothing here." in gpu_locality_verify.report({"gpu_locality": loc}, DESIRED)


def test_virtual_functions_are_left_out_and_nics_without_rdma_are_nearest_only_without_rdma_nics(tmp_path):
    nodes = {0: "0-3"}
    devices = [("0000:00:01.0", "pci0000:00", [], "0x060400", "0x8086", 0),
               ("0000:01:00.0", "pci0000:00", ["0000:00:01.0"], "0x030200", "0x10de", 0),
               ("0000:00:02.0", "pci0000:00", [], "0x060400", "0x8086", 0),
               ("0000:02:00.0", "pci0000:00", ["0000:00:02.0"], "0x020000", "0x8086", 0),
               ("0000:02:00.2", "pci0000:00", ["0000:00:02.0"], "0x020000", "0x8086", 0)]
    root = build_tree(tmp_path, devices, nodes)
    vf = os.path.realpath(os.path.join(root, "sys/bus/pci/devices/0000:02:00.2"))
    os.symlink("../0000:02:00.0", os.path.join(vf, "physfn"))
    loc = gpu_locality.read(Node.open(root))
    assert [n["bdf"] for n in loc["nics"]] == ["0000:02:00.0"]
    assert loc["gpus"][0]["nearest_nic"]["bdf"] == "0000:02:00.0"
    assert loc["gpus"][0]["nearest_nvme"] is None


# -- The 2-socket preset: its layout, IRQs, irqbalance, the -1 variant

# The preset's layout (tools/simnode/topology.py, _switches_topology): GPU -> (NUMA node, root port, switch,
# nearest NIC, relation, nearest NVMe, relation).
LAYOUT = {
    "0000:13:00.0": (0, "0000:10:01.0", "0000:11:00.0", "0000:15:00.0", "PIX", "0000:16:00.0", "PIX"),
    "0000:14:00.0": (0, "0000:10:01.0", "0000:11:00.0", "0000:15:00.0", "PIX", "0000:16:00.0", "PIX"),
    "0000:31:00.0": (0, "0000:2e:01.0", "0000:2f:00.0", "0000:15:00.0", "NODE", "0000:16:00.0", "NODE"),
    "0000:32:00.0": (0, "0000:2e:01.0", "0000:2f:00.0", "0000:15:00.0", "NODE", "0000:16:00.0", "NODE"),
    "0000:4f:00.0": (1, "0000:4c:01.0", "0000:4d:00.0", "0000:7a:00.0", "NODE", "0000:55:00.0", "PXB"),
    "0000:50:00.0": (1, "0000:4c:01.0", "0000:4d:00.0", "0000:7a:00.0", "NODE", "0000:55:00.0", "PXB"),
    "0000:6d:00.0": (1, "0000:6a:01.0", "0000:6b:00.0", "0000:7a:00.0", "PHB", "0000:55:00.0", "NODE"),
    "0000:6e:00.0": (1, "0000:6a:01.0", "0000:6b:00.0", "0000:7a:00.0", "PHB", "0000:55:00.0", "NODE"),
}


def test_the_two_socket_preset_reads_as_its_layout(build_node):
    root = build_node("xeon-2s-8gpu-switches", cpus=16)
    loc = gpu_locality.read(Node.open(root))
    got = {g["bdf"]: (g["numa_node"], g["root_port"], g["switches"][0], g["nearest_nic"]["bdf"],
                      g["nearest_nic"]["relation"], g["nearest_nvme"]["bdf"], g["nearest_nvme"]["relation"])
           for g in loc["gpus"]}
    assert got == LAYOUT
    assert {g["bdf"]: g["cpus"] for g in loc["gpus"]} == {b: "0-7" if v[0] == 0 else "8-15" for b, v in LAYOUT.items()}
    # Every relation of the legend occurs, SYS for the other socket's NIC.
    gpu0 = loc["gpus"][0]
    assert {n["bdf"]: n["relation"] for n in gpu0["nics"]} == {"0000:15:00.0": "PIX", "0000:7a:00.0": "SYS"}
    assert gpu0["nearest_nic"]["rdma"] == ["mlx5_0"] and gpu0["nearest_nic"]["netdevs"] == ["ibp21s0"]
    assert loc["gpus"][4]["switches"] == ["0000:4d:00.0"]
    assert [(n["bdf"], n["nic_class"], n["numa_node"]) for n in loc["nics"]] == [
        ("0000:15:00.0", "infiniband", 0), ("0000:7a:00.0", "ethernet", 1)]
    assert loc["host_bridges"] == {"0000:10": 0, "0000:2e": 0, "0000:4c": 1, "0000:6a": 1}
    assert loc["multi_node"] is True and loc["hostname"] == "gpunode"


def test_remote_irqs_are_counted_per_device_and_fail_only_when_asked(build_node):
    root = build_node("xeon-2s-8gpu-switches", cpus=16)
    facts = {"gpu_locality": gpu_locality.read(Node.open(root))}
    loc = facts["gpu_locality"]
    irqs = {d["bdf"]: (d["irqs"]["count"], d["irqs"]["remote"], d["irqs"]["remote_cpus"])
            for d in loc["gpus"] + loc["nics"]}
    assert irqs["0000:15:00.0"] == (16, 4, "12-15") and irqs["0000:7a:00.0"] == (16, 0, "")
    assert irqs["0000:50:00.0"] == (1, 1, "0") and irqs["0000:13:00.0"] == (1, 0, "")
    assert loc["irqbalance"] == {"running": True, "pids": [simnode.IRQBALANCE_PID],
                                 "cmdline": "/usr/sbin/irqbalance --foreground"}
    rows = {r["name"]: r for r in gpu_locality_verify.evaluate(facts, DESIRED)}
    assert {r["state"] for r in rows.values()} == {"applied"}
    assert "4 of 16 MSI-X IRQ(s) served only on another NUMA node (CPUs 12-15)" in rows["nic.0000:15:00.0"]["reason"]
    assert "1 of 1 MSI-X IRQ(s) served only on another NUMA node (CPUs 0)" in rows["0000:50:00.0"]["reason"]
    assert rows["irqbalance"]["running"] == "running (pid 3104: /usr/sbin/irqbalance --foreground)"
    strict = {"gpu_locality": {"remote_irqs_fail": True}}
    rows = {r["name"]: r for r in gpu_locality_verify.evaluate(facts, strict)}
    assert sorted(n for n, r in rows.items() if r["state"] == "drifted") == ["0000:50:00.0", "nic.0000:15:00.0"]
    assert ("remote IRQs fail verification (gpunode_tuning_gpu_locality_remote_irqs_fail)"
            in rows["0000:50:00.0"]["reason"])


def test_irq_affinity_falls_back_to_smp_affinity_list_and_unreadable_irqs_are_counted(build_node):
    root = build_node("xeon-2s-8gpu-switches", cpus=16)
    nic_irqs = sorted(int(n) for n in os.listdir(os.path.join(root, "sys/bus/pci/devices/0000:15:00.0/msi_irqs")))
    os.unlink(os.path.join(root, "proc/irq/%d/effective_affinity_list" % nic_irqs[-1]))  # remote, smp_affinity 15
    os.unlink(os.path.join(root, "proc/irq/%d/effective_affinity_list" % nic_irqs[0]))
    os.unlink(os.path.join(root, "proc/irq/%d/smp_affinity_list" % nic_irqs[0]))
    nic = gpu_locality.read(Node.open(root))["nics"][0]
    assert nic["irqs"] == {"count": 16, "mode": "msix", "remote": 4, "remote_cpus": "12-15", "unread": 1,
                           "sources": {"effective": 14, "smp": 1}}
    assert gpu_locality_verify.irq_text(nic["irqs"]).endswith("; 1 without an affinity in /proc/irq")


def test_the_variant_without_numa_affinity_is_a_finding_for_each_gpu_of_that_socket(build_node):
    root = build_node("xeon-2s-8gpu-switches-nonuma", cpus=16)
    facts = {"gpu_locality": gpu_locality.read(Node.open(root))}
    loc = facts["gpu_locality"]
    assert [g["numa_node"] for g in loc["gpus"]] == [0, 0, 0, 0, None, None, None, None]
    assert loc["host_bridges"] == {"0000:10": 0, "0000:2e": 0, "0000:4c": None, "0000:6a": None}
    # Unknown nodes: across host bridges the relation is SYS (not provably one node; the fewest bridges
    # between them decide among equals); one host bridge: PHB.
    assert [(g["nearest_nic"]["bdf"], g["nearest_nic"]["relation"]) for g in loc["gpus"][4:]] == [
        ("0000:7a:00.0", "SYS"), ("0000:7a:00.0", "SYS"), ("0000:7a:00.0", "PHB"), ("0000:7a:00.0", "PHB")]
    rows = {r["name"]: r for r in gpu_locality_verify.evaluate(facts, DESIRED)}
    for bdf in ("0000:4f:00.0", "0000:50:00.0", "0000:6d:00.0", "0000:6e:00.0"):
        assert rows[bdf]["state"] == "drifted"
        assert rows[bdf]["reason"].startswith("firmware publishes no NUMA affinity for %s (numa_node -1)" % bdf)
        assert "not judged (NUMA node unknown)" in rows[bdf]["reason"]
    assert rows["0000:13:00.0"]["state"] == "applied"
    text = gpu_locality_verify.report(facts, DESIRED)
    assert "- GPUs 0000:4f:00.0, 0000:50:00.0, 0000:6d:00.0, 0000:6e:00.0: no NUMA node known" in text
    assert "Not every GPU has a NUMA node" in text and "--numa-bind-nodes" not in text


def test_nodes_without_gpus_or_facts_and_a_disabled_family():
    assert gpu_locality_verify.evaluate({"gpu_locality": {"gpus": []}}, DESIRED)[0]["state"] == "not_applicable"
    assert gpu_locality_verify.evaluate({}, DESIRED)[0]["state"] == "unsupported"
    for desired in ({}, {"gpu_locality": None}, {"gpu_locality": ""}):
        assert gpu_locality_verify.evaluate({"gpu_locality": {"gpus": [{}]}}, desired) == []
        assert gpu_locality_verify.export({"gpu_locality": {"gpus": []}}, desired) == {}
        assert gpu_locality_verify.report({"gpu_locality": {"gpus": [{}]}}, desired) is None


@pytest.mark.parametrize("want,message", [
    ("yes", "gpu_locality must be a mapping"),
    ({"remote_irqs": True}, "unknown key(s) remote_irqs; allowed: remote_irqs_fail, export"),
    ({"remote_irqs_fail": "no"}, "remote_irqs_fail must be true or false"),
    ({"export": "etc/topology.json"}, "must be an absolute file path"),
    ({"export": "/etc/../topology.json"}, "must be an absolute file path"),
    ({"export": "/etc/x\ny.json"}, "must be an absolute file path"),
])
def test_validate_names_what_is_allowed(want, message):
    with pytest.raises(family.EvaluationError, match=re.escape(message)):
        gpu_locality.validate(want)


def test_the_launch_hints_are_the_engines_documented_options(build_node):
    root = build_node("xeon-2s-8gpu-switches", cpus=16, nvidia_smi=True)
    facts = {"gpu_locality": gpu_locality.read(Node.open(root))}
    ctx = verification.Context()
    ctx.gpu = {"probe": "present", "query": {"rc": 0, "stdout": "".join(
        "%d, 00000000:%s, Enabled\n" % (i, b[5:].upper()) for i, b in enumerate(sorted(LAYOUT)))}}
    text = gpu_locality_verify.report(facts, DESIRED, ctx)
    assert "| 0000:13:00.0 | 0 | 0 | 0-7 | 0000:15:00.0 (mlx5_0, ibp21s0) | PIX | 0000:16:00.0 (nvme0) | PIX |" in text
    assert ("- GPUs 0000:13:00.0, 0000:14:00.0, 0000:31:00.0, 0000:32:00.0 (nvidia-smi 0, 1, 2, 3): "
            "`numactl --cpunodebind=0 --membind=0 <command>`") in text
    assert "`vllm serve <model> --tensor-parallel-size 8 --numa-bind --numa-bind-nodes 0 0 0 0 1 1 1 1`" in text
    assert "`python3 -m sglang.launch_server --model-path <model> --tp 8 --numa-node 0 0 0 0 1 1 1 1`" in text
    assert "`TLLM_NUMA_AWARE_WORKER_AFFINITY=1`" in text and "TensorRT-LLM documents no per-GPU NUMA option" in text
    assert "- 0000:15:00.0 (mlx5_0, ibp21s0): 4 of 16 MSI-X IRQ(s) served only on another NUMA node" in text


# -- topology.json: the document, the module (persistent flow) and the boot step


def schema():
    with open(SCHEMA, encoding="utf-8") as fh:
        return json.load(fh)


def test_the_export_validates_against_the_documented_schema_and_is_stable(build_node):
    root = build_node("xeon-2s-8gpu-switches", cpus=16, nvidia_smi=True)
    node = Node.open(root)
    document, said = gpu_locality.node_document(node)
    assert said == "nvidia-smi answered"
    jsonschema.validate(document, schema())
    gpu = document["gpus"]["0000:4f:00.0"]
    assert gpu["nvidia_smi_index"] == 4 and gpu["numa_node"] == 1 and gpu["cpus"] == "8-15"
    assert gpu["nearest_nvme"] == {"pci": "0000:55:00.0", "relation": "PXB", "names": ["nvme1"]}
    assert gpu["nics"] == {"0000:7a:00.0": "NODE", "0000:15:00.0": "SYS"}
    assert document["nics"]["0000:15:00.0"]["rdma_devices"] == ["mlx5_0"]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in document["index_order"]
    # No volatile value: an IRQ moved elsewhere (what irqbalance does) leaves the document as it was.
    irq = os.listdir(os.path.join(root, "sys/bus/pci/devices/0000:15:00.0/msi_irqs"))[0]
    write(os.path.join(root, "proc/irq", irq, "effective_affinity_list"), "9")
    assert gpu_locality.node_document(node)[0] == document
    # A node without nvidia-smi: the same document, no index.
    bare = gpu_locality.node_document(Node.open(build_node("xeon-2s-8gpu-switches", cpus=16)))[0]
    jsonschema.validate(bare, schema())
    assert {g["nvidia_smi_index"] for g in bare["gpus"].values()} == {None}


def test_the_verification_export_is_the_node_export(build_node):
    root = build_node("xeon-2s-8gpu-switches", cpus=16, nvidia_smi=True)
    node = Node.open(root)
    facts = {"gpu_locality": gpu_locality.read(node), "kernel": {}}
    smi = os.path.join(root, "usr/bin/nvidia-smi")
    query = subprocess.run([smi, "--query-gpu=index,pci.bus_id,persistence_mode", "--format=csv,noheader"],
                           capture_output=True, text=True, check=True).stdout
    ctx = verification.Context()
    ctx.gpu = {"probe": "present", "query": {"rc": 0, "stdout": query}}
    exported = gpu_locality_verify.export(facts, DESIRED, ctx)
    assert list(exported) == ["topology.json"]
    assert gpu_locality.render(exported["topology.json"]) == gpu_locality.render(gpu_locality.node_document(node)[0])


def test_module_check_mode_writes_nothing_then_writes_once(build_node, run_module, digest):
    root = build_node("xeon-2s-8gpu-switches", cpus=16)
    before = digest(root)
    res, failed = run_module("gpu_locality", {"root": root}, check=True, diff=True)
    assert not failed and res["changed"] is True and digest(root) == before
    assert res["diff"]["before"] == "" and json.loads(res["diff"]["after"])["schema"] == "gpunode.tuning/topology"
    res, failed = run_module("gpu_locality", {"root": root})
    assert not failed and res["changed"] is True, res
    assert res["msg"] == "/etc/gpunode-tuning/topology.json written (8 GPUs, 2 NICs, 2 NVMe drives)"
    assert res["nvidia_smi"] == "nvidia-smi not installed: no nvidia_smi_index"
    path = os.path.join(root, "etc/gpunode-tuning/topology.json")
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    jsonschema.validate(json.load(open(path, encoding="utf-8")), schema())
    assert sorted(os.listdir(os.path.dirname(path))) == ["topology.json"]  # no temporary file left
    after = digest(root)
    res, failed = run_module("gpu_locality", {"root": root}, check=True)
    assert not failed and res["changed"] is False
    res, failed = run_module("gpu_locality", {"root": root})
    assert not failed and res["changed"] is False and digest(root) == after


def test_module_refuses_a_relative_path_and_a_root_that_is_no_node(build_node, run_module, tmp_path):
    root = build_node("tiny-vm")
    res, failed = run_module("gpu_locality", {"root": root, "path": "etc/topology.json"})
    assert failed and "gpu_locality.export must be an absolute file path" in res["msg"]
    res, failed = run_module("gpu_locality", {"root": str(tmp_path / "nothing")})
    assert failed and "does not exist" in res["msg"]


def test_boot_refreshes_the_export_when_the_hardware_changed(build_node):
    root = build_node("xeon-2s-8gpu-switches", cpus=16)
    node = Node.open(root)
    ok, msg = gpu_locality.boot(node, DESIRED["gpu_locality"])
    assert ok and msg.startswith("/etc/gpunode-tuning/topology.json written (8 GPUs, 2 NICs, 2 NVMe drives; ")
    assert gpu_locality.boot(node, DESIRED["gpu_locality"])[1].startswith("/etc/gpunode-tuning/topology.json unchanged")
    # A firmware update that now publishes node 0 for GPU 4f:00.0.
    d = os.path.realpath(os.path.join(root, "sys/bus/pci/devices/0000:4f:00.0"))
    write(os.path.join(d, "numa_node"), "0")
    write(os.path.join(d, "local_cpulist"), "0-7")
    assert "written" in gpu_locality.boot(node, DESIRED["gpu_locality"])[1]
    with open(os.path.join(root, "etc/gpunode-tuning/topology.json"), encoding="utf-8") as fh:
        assert json.load(fh)["gpus"]["0000:4f:00.0"]["numa_node"] == 0


def test_a_hanging_nvidia_smi_is_cut_off(build_node):
    root = build_node("tiny-vm")
    smi = os.path.join(root, "usr/bin/nvidia-smi")
    write(smi, "#!/bin/sh\nsleep 30\n")
    os.chmod(smi, 0o755)
    res = gpu_locality.query_smi(Node.open(root), timeout=1)
    assert res == {"rc": 124, "stdout": "",
                   "stderr": "nvidia-smi did not answer within 1 s: a wedged GPU or driver; it was killed"}
    assert gpu_locality.query_smi(Node.open(build_node("tiny-vm"))) is None  # the controller's is never run


def test_the_family_is_registered_with_its_hooks():
    from ansible_collections.gpunode.tuning.plugins.module_utils import registry
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families

    fam = registry.by_name("gpu_locality")
    assert fam.module == "gpu_locality" and fam.read is gpu_locality.read and fam.boot is gpu_locality.boot
    assert fam.runtime_options is None and fam.persist is gpu_locality.PERSIST  # read-only: persisted, never tuned
    # The verification half is imported when first called (family.later): resolve() gives what a field stands for.
    assert family.resolve(fam.export) is gpu_locality_verify.export
    assert family.resolve(fam.report) is gpu_locality_verify.report
    assert ("gpu_locality", fam) in all_families.boot_families()


def test_odd_or_missing_files_leave_the_values_unknown_and_never_stop_the_read(build_node):
    root = build_node("xeon-2s-8gpu-switches", cpus=16)
    d = os.path.realpath(os.path.join(root, "sys/bus/pci/devices/0000:13:00.0"))
    write(os.path.join(d, "local_cpulist"), "garbage")
    os.unlink(os.path.join(d, "numa_node"))
    for irq in os.listdir(os.path.join(d, "msi_irqs")):
        write(os.path.join(root, "proc/irq", irq, "effective_affinity_list"), "ff,zz")
        write(os.path.join(root, "proc/irq", irq, "smp_affinity_list"), "")
    write(os.path.join(root, "sys/devices/system/node/node1/cpulist"), "?")
    loc = gpu_locality.read(Node.open(root))
    gpu = loc["gpus"][0]
    # numa_node gone: the switch's downstream port above it still says node 0.
    assert (gpu["numa_node"], gpu["numa_source"], gpu["numa_node_published"]) == (0, "bridge 0000:12:00.0", None)
    assert gpu["cpus"] == "0-7" and gpu["irqs"]["unread"] == 1
    assert [n["node"] for n in loc["numa_nodes"]] == [0, 1] and loc["numa_nodes"][1]["cpus"] == ""


def test_tuning_info_returns_the_facts_of_the_preset_and_writes_nothing(build_node, run_module, digest):
    root = build_node("xeon-2s-8gpu-switches", cpus=16)
    before = digest(root)
    result, failed = run_module("tuning_info", {"root": root})
    assert not failed and result["changed"] is False and digest(root) == before
    loc = result["tuning_facts"]["gpu_locality"]
    assert {g["bdf"]: (g["numa_node"], g["nearest_nic"]["bdf"], g["nearest_nic"]["relation"],
                       g["nearest_nvme"]["bdf"], g["nearest_nvme"]["relation"]) for g in loc["gpus"]} == {
        b: (v[0],) + v[3:] for b, v in LAYOUT.items()}
    assert {n["bdf"]: n["irqs"]["remote"] for n in loc["nics"]} == {"0000:15:00.0": 4, "0000:7a:00.0": 0}
