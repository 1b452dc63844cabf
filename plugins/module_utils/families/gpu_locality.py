# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU locality: the read-only family ``gpu_locality`` (which CPUs, memory, NICs and NVMe drives are near each GPU).

Everything comes from sysfs and procfs, so it works without the NVIDIA driver:

- per GPU its NUMA node (``numa_node``; -1 on a multi-socket node is a firmware finding, and the
  nearest bridge's node stands in when a bridge has one), its CPUs (``local_cpulist`` that are
  online), its host bridge, root port and PCIe switches;
- the NICs (class 0x0200 Ethernet, 0x0207 InfiniBand; SR-IOV virtual functions left out, they sit
  where their physical function is) and NVMe drives (0x010802), each with its relation to each GPU
  in the legend of ``nvidia-smi topo -m`` (``relation``), and the nearest NIC (GPUDirect RDMA:
  RDMA-capable NICs first) and NVMe drive (GPUDirect Storage) per GPU;
- the MSI/MSI-X IRQs of each GPU and NIC (``msi_irqs/``) with the CPUs that serve them
  (``/proc/irq/N/effective_affinity_list``, else ``smp_affinity_list``), counted per device as
  remote when served only outside the device's NUMA node, and whether irqbalance runs. Nothing is
  moved: this family only reports.

Verification (``evaluate``): one row per GPU, per NIC and one for irqbalance. A GPU without a NUMA
node on a multi-node system is drifted, as is a GPU whose CPU or NUMA affinity in ``nvidia-smi
topo -m`` (where nvidia-smi answered) disagrees with sysfs; an AMD GPU's row names its links to the other GPUs
from ``amd-smi topology`` (type, hops, weight; the call the health gate makes); remote IRQs are said in the reason and
fail only with ``desired["gpu_locality"]["remote_irqs_fail"]``. The family exports
``topology.json`` (``export``: the verification's ``<host>.topology.json``; ``run`` and ``boot``
write it on the node, see docs/gpu-locality.md for its schema) and a report section (``report``).

Plain Python (3.8+), no Ansible import: the boot runner loads this on the node without Ansible.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    amd_p2p,
    command,
    family,
    files,
    nvidia_smi,
    persistence,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    SYSFS_PCI_DEVICES,
    BinaryNotFound,
    Node,
    NodeError,
    format_cpulist,
    parse_cpulist,
    read_small,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import DeviceSelector

NAME = "gpu_locality"
# tuning_info's RETURN of tuning_facts.gpu_locality (tools/generate.py writes it there).
FACTS_DOC = r"""
description:
  - Where each GPU sits (module_utils/families/gpu_locality.py, the C(gpu_locality) family's read;
    docs/gpu-locality.md), from sysfs alone. C(gpus) per selected GPU its C(numa_node) (null when unknown;
    C(numa_source) says whether the device or its nearest bridge published it, C(numa_node_published) the raw
    value), C(cpus) (its local CPUs that are online), C(host_bridge), C(root_port), C(switches), C(irqs), C(nics)
    and C(nvme) (every NIC and NVMe drive with its C(relation) in the legend of C(nvidia-smi topo -m), one of PIX,
    PXB, PHB, NODE, SYS, nearest first) and C(nearest_nic) (RDMA-capable NICs first) and C(nearest_nvme).
  - C(nics) (classes 0x0200 and 0x0207, physical functions) and C(nvme) (0x010802) with the same placement fields
    and their names (C(netdevs), C(rdma), C(names)); C(irqs) of GPUs and NICs counts the MSI/MSI-X IRQs and
    those served only on another NUMA node (C(remote), C(remote_cpus)). C(irqbalance) says whether it runs;
    C(numa_nodes), C(multi_node), C(online_cpus), C(host_bridges) (host bridge -> NUMA node) and C(hostname).
returned: always
type: dict
"""
EXPORT_NAME = "topology.json"
EXPORT_PATH = "/etc/gpunode-tuning/topology.json"
SCHEMA = "gpunode.tuning/topology"
SCHEMA_VERSION = 1
# nvidia-smi topo -m's legend, nearest first (the rank nearest-device choices sort by).
RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")
LEGEND = {
    "PIX": "at most one PCIe switch between them",
    "PXB": "several PCIe switches between them, not the host bridge",
    "PHB": "through a PCIe host bridge (the CPU's root complex)",
    "NODE": "across host bridges of one NUMA node",
    "SYS": "across NUMA nodes (the SMP interconnect)",
}
GPU_CLASSES = ("0300", "0302", "0380", "1200")  # NVIDIA display/3D, AMD Instinct MI200/MI300
NIC_CLASSES = {"0200": "ethernet", "0207": "infiniband"}
NVME_CLASS = "010802"
# nvidia-smi's numbering of the export; bounded (a wedged driver must not hang the flow or a boot).
SMI_QUERY = ["--query-gpu=index,pci.bus_id", "--format=csv,noheader"]
SMI_TIMEOUT = 30
BOOT_SMI_TIMEOUT = 10
INDEX_ORDER = ("nvidia_smi_index is nvidia-smi's number of the GPU (PCI bus order); CUDA numbers devices the "
               "same way only with CUDA_DEVICE_ORDER=PCI_BUS_ID (its default puts the fastest first)")
IRQBALANCE = "irqbalance"
_HOST_BRIDGE = re.compile(r"^pci([0-9a-f]{4,}:[0-9a-f]{2})$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CPULIST = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
_SMI_BUS_ID = re.compile(r"^0*([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# ---------------------------------------------------------------------------------------------
# Small reads: one open and one read per attribute
# ---------------------------------------------------------------------------------------------


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip(), 0)
    except (TypeError, ValueError):
        return None


def _listdir(path: str) -> list:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


# ---------------------------------------------------------------------------------------------
# PCI paths and the relation of two devices
# ---------------------------------------------------------------------------------------------


def parse_path(components: list) -> dict:
    """A device's place in the PCI tree from its sysfs path components below ``/sys/devices``.

    ``["pci0000:40", "0000:40:01.1", "0000:41:00.0"]`` -> ``{host_bridge: "0000:40", bridges:
    ["0000:40:01.1"], device: "0000:41:00.0"}``. Components before the first ``pciDDDD:BB`` (arm64
    device-tree platform devices, Hyper-V's VMBus) are not part of the PCI tree; a nested
    ``pciDDDD:BB`` below a device (Intel VMD) counts as one more bridge on the path.
    """
    parts = [str(c).lower() for c in components if c]
    start = next((i for i, c in enumerate(parts) if _HOST_BRIDGE.match(c)), None)
    if start is None:
        return {"host_bridge": None, "bridges": parts[:-1], "device": parts[-1] if parts else None}
    below = parts[start + 1:]
    return {"host_bridge": _HOST_BRIDGE.match(parts[start]).group(1), "bridges": below[:-1],
            "device": below[-1] if below else None}


def _levels(bridges: list, start: int) -> set:
    """Switch levels of the bridges from index ``start`` down: the root port is level 0, then each
    switch (its upstream port and the downstream port below it) one level."""
    return {0 if i == 0 else (i + 1) // 2 for i in range(start, len(bridges))}


def relation(a: dict, b: dict, host_bridge_nodes: dict) -> str:
    """The relation of two devices (``parse_path`` results) in nvidia-smi topo -m's legend.

    Other host bridges: NODE when both bridges' NUMA nodes are known and equal, else SYS (unknown
    nodes count as different: the conservative answer). One host bridge: PHB when the paths part
    at it (other root ports, or devices on the root bus); below a common bridge, PIX when at most
    one PCIe switch (or the root port of a multi-function device) joins them, else PXB.
    """
    if a["host_bridge"] != b["host_bridge"]:
        node_a, node_b = host_bridge_nodes.get(a["host_bridge"]), host_bridge_nodes.get(b["host_bridge"])
        return "NODE" if node_a is not None and node_a == node_b else "SYS"
    common = 0
    for x, y in zip(a["bridges"], b["bridges"]):
        if x != y:
            break
        common += 1
    if common == 0:
        return "PHB"
    meet = common - 1
    switches = len(_levels(a["bridges"], meet)) + len(_levels(b["bridges"], meet)) - 1
    return "PIX" if switches <= 1 else "PXB"


def hops(a: dict, b: dict) -> int:
    """Bridges on the path between two devices (host bridges count as two): the tie-break of equal relations."""
    if a["host_bridge"] != b["host_bridge"]:
        return len(a["bridges"]) + len(b["bridges"]) + 2
    common = 0
    for x, y in zip(a["bridges"], b["bridges"]):
        if x != y:
            break
        common += 1
    return len(a["bridges"]) + len(b["bridges"]) - 2 * common + (1 if common else 2)


def device_path(node: Node, bdf: str) -> tuple:
    """``(parse_path result, the device's real directory)`` from its /sys/bus/pci/devices link."""
    real = os.path.realpath(node.path(SYSFS_PCI_DEVICES, bdf))
    base = os.path.realpath(node.path("sys/devices"))
    rel = os.path.relpath(real, base) if real.startswith(base + os.sep) else real.strip(os.sep)
    return parse_path(rel.split(os.sep)), real


# ---------------------------------------------------------------------------------------------
# Reading the node
# ---------------------------------------------------------------------------------------------


def cpuset(text: str | None) -> set:
    """The CPUs of a kernel cpulist; empty for anything that is not one (a read error, a VM's odd file)."""
    text = (text or "").strip()
    return set(parse_cpulist(text)) if _CPULIST.match(text) else set()


def numa_layout(node: Node) -> tuple:
    """``({node: set of online CPUs}, set of online CPUs)`` from /sys/devices/system."""
    online = cpuset(read_small(node.path("sys/devices/system/cpu/online")))
    nodes = {}
    for n in sorted(cpuset(read_small(node.path("sys/devices/system/node/online")))):
        cpus = cpuset(read_small(node.path("sys/devices/system/node/node%d/cpulist" % n)))
        nodes[n] = (cpus & online) if online else cpus
    return nodes, online


def _kind(cls: str) -> str | None:
    if cls[:4] in GPU_CLASSES:
        return "gpu"
    if cls[:4] in NIC_CLASSES:
        return "nic"
    return "nvme" if cls[:6] == NVME_CLASS else None


def _base(node: Node, bdf: str, kind: str) -> dict:
    """One device's own reads: ids, NUMA node, local CPUs, place in the tree."""
    d = node.path(SYSFS_PCI_DEVICES, bdf)
    path, real = device_path(node, bdf)
    return {
        "bdf": bdf, "kind": kind,
        "vendor": (read_small(os.path.join(d, "vendor")) or "").lower(),
        "device": (read_small(os.path.join(d, "device")) or "").lower(),
        "numa_node_published": _int(read_small(os.path.join(d, "numa_node"))),
        "local_cpulist": read_small(os.path.join(d, "local_cpulist")),
        "path": path, "dir": real,
    }


def scan(node: Node, selector: DeviceSelector) -> list:
    """The GPUs (selected, display or 3D class), physical NICs and NVMe drives, each read once."""
    out = []
    for bdf in node.listdir(SYSFS_PCI_DEVICES):
        d = node.path(SYSFS_PCI_DEVICES, bdf)
        cls = (read_small(os.path.join(d, "class")) or "").lower().replace("0x", "")
        kind = _kind(cls)
        if kind is None or (kind == "nic" and os.path.lexists(os.path.join(d, "physfn"))):
            continue
        dev = _base(node, bdf.lower(), kind)
        dev["class"] = "0x" + cls
        if kind == "gpu" and not selector.matches(dev):
            continue
        if kind == "nic":
            dev.update(nic_class=NIC_CLASSES[cls[:4]], netdevs=_listdir(os.path.join(d, "net")),
                       rdma=_listdir(os.path.join(d, "infiniband")))
        if kind == "nvme":
            dev["names"] = _listdir(os.path.join(d, "nvme"))
        if kind in ("gpu", "nic"):
            dev["irq_numbers"] = [int(n) for n in _listdir(os.path.join(d, "msi_irqs")) if n.isdigit()]
            first = dev["irq_numbers"][:1]
            dev["irq_mode"] = read_small(os.path.join(d, "msi_irqs", str(first[0]))) if first else None
        out.append(dev)
    return out


def _ancestor_dirs(dev: dict) -> list:
    """The real directories of the device's bridges, nearest first (its parent directories)."""
    dirs, d = [], os.path.dirname(dev["dir"])
    for _bridge in reversed(dev["path"]["bridges"]):
        dirs.append(d)
        d = os.path.dirname(d)
    return dirs


def host_bridge_nodes(devices: list) -> dict:
    """Host bridge -> its NUMA node (the node its root-bus function publishes), None when unknown."""
    out = {}
    for dev in devices:
        hb = dev["path"]["host_bridge"]
        if out.get(hb) is not None:
            continue
        top = _ancestor_dirs(dev)[-1] if dev["path"]["bridges"] else dev["dir"]
        number = _int(read_small(os.path.join(top, "numa_node")))
        out[hb] = number if number is not None and number >= 0 else out.get(hb)
    return out


def resolve_numa(dev: dict) -> tuple:
    """``(node or None, source)``: the device's own numa_node, else its nearest bridge's that has one."""
    own = dev["numa_node_published"]
    if own is not None and own >= 0:
        return own, "device"
    for bridge, d in zip(reversed(dev["path"]["bridges"]), _ancestor_dirs(dev)):
        number = _int(read_small(os.path.join(d, "numa_node")))
        if number is not None and number >= 0:
            return number, "bridge %s" % bridge
    return None, None


def irq_summary(node: Node, numbers: list, mode: str | None, local: set | None) -> dict:
    """A device's MSI/MSI-X IRQs counted: how many, served only off ``local`` (remote), unreadable.

    The CPUs of an IRQ are ``/proc/irq/N/effective_affinity_list`` (where the kernel delivers it),
    else ``smp_affinity_list`` (what was asked): one read per IRQ, the second only where the first
    is missing; equal lists are parsed once.
    """
    base = node.path("proc/irq") + os.sep
    parsed: dict = {}
    remote, remote_cpus, unread, sources = 0, set(), 0, {"effective": 0, "smp": 0}
    for irq in numbers:
        cpus = source = None
        for name, kind in (("/effective_affinity_list", "effective"), ("/smp_affinity_list", "smp")):
            text = read_small(base + str(irq) + name)
            cpus = parsed[text] if text in parsed else parsed.setdefault(text, cpuset(text))
            if cpus:
                source = kind
                break
        if source is None:
            unread += 1
            continue
        sources[source] += 1
        if local and not cpus & local:
            remote += 1
            remote_cpus |= cpus
    return {"count": len(numbers), "mode": mode, "remote": remote if local else None,
            "remote_cpus": format_cpulist(remote_cpus), "unread": unread, "sources": sources}


def irqbalance_facts(node: Node) -> dict:
    """Whether irqbalance runs: a scan of /proc/*/comm, with its command line (its options)."""
    pids, cmdline = [], None
    for entry in node.listdir("proc"):
        if entry.isdigit() and read_small(node.path("proc", entry, "comm")) == IRQBALANCE:
            pids.append(int(entry))
            if cmdline is None:
                raw = read_small(node.path("proc", entry, "cmdline")) or ""
                cmdline = " ".join(p for p in raw.split("\0") if p)
    return {"running": bool(pids), "pids": sorted(pids), "cmdline": cmdline}


# ---------------------------------------------------------------------------------------------
# The facts
# ---------------------------------------------------------------------------------------------


def _located(dev: dict, nodes: dict, online: set) -> dict:
    """The public fields of a device: NUMA node (resolved), CPUs, place in the tree."""
    numa, source = resolve_numa(dev)
    if numa is None and len(nodes) == 1:
        numa, source = next(iter(nodes)), "the only NUMA node"
    local = cpuset(dev["local_cpulist"])
    cpus = (local & online) if online else local
    bridges = dev["path"]["bridges"]
    out = {"bdf": dev["bdf"], "vendor": dev["vendor"], "device": dev["device"], "class": dev["class"],
           "numa_node": numa, "numa_node_published": dev["numa_node_published"], "numa_source": source,
           "cpus": format_cpulist(cpus) if cpus else format_cpulist(nodes.get(numa) or online),
           "host_bridge": dev["path"]["host_bridge"], "root_port": bridges[0] if bridges else None,
           "switches": [b for i, b in enumerate(bridges) if i % 2 == 1]}
    for key in ("nic_class", "netdevs", "rdma", "names"):
        if key in dev:
            out[key] = dev[key]
    return out


def _nearest(gpu: dict, others: list, hb_nodes: dict) -> list:
    """``[{bdf, relation}]`` of ``others`` seen from ``gpu``, nearest first (relation, bridges between, address)."""
    ranked = []
    for other in others:
        rel = relation(gpu["path"], other["path"], hb_nodes)
        ranked.append(((RELATIONS.index(rel), hops(gpu["path"], other["path"]), other["bdf"]), other, rel))
    ranked.sort(key=lambda item: item[0])
    return [{"bdf": other["bdf"], "relation": rel} for _key, other, rel in ranked]


def _nearest_of(ranked: list, pool: list, names: tuple) -> dict | None:
    """The first of ``ranked`` whose device is in ``pool``, with its names."""
    in_pool = {d["bdf"]: d for d in pool}
    for entry in ranked:
        dev = in_pool.get(entry["bdf"])
        if dev is not None:
            return dict(entry, **{k: dev[k] for k in names if k in dev})
    return None


def read(node: Node, selector: DeviceSelector | None = None, query: Any = None) -> dict:
    """The family's facts (``facts["gpu_locality"]``); see the module docstring and docs/gpu-locality.md."""
    selector = selector or DeviceSelector()
    nodes, online = numa_layout(node)
    devices = scan(node, selector)
    hb_nodes = host_bridge_nodes(devices)
    by_kind = {k: [d for d in devices if d["kind"] == k] for k in ("gpu", "nic", "nvme")}
    public = {d["bdf"]: _located(d, nodes, online) for d in devices}
    for d in by_kind["gpu"] + by_kind["nic"]:
        numa = public[d["bdf"]]["numa_node"]
        public[d["bdf"]]["irqs"] = irq_summary(node, d["irq_numbers"], d["irq_mode"], nodes.get(numa))
    rdma = [d for d in by_kind["nic"] if d.get("rdma")] or by_kind["nic"]
    gpus = []
    for d in by_kind["gpu"]:
        g = dict(public[d["bdf"]])
        g["nics"] = _nearest(d, by_kind["nic"], hb_nodes)
        g["nvme"] = _nearest(d, by_kind["nvme"], hb_nodes)
        g["nearest_nic"] = _nearest_of(g["nics"], [public[n["bdf"]] for n in rdma], ("nic_class", "netdevs", "rdma"))
        g["nearest_nvme"] = _nearest_of(g["nvme"], [public[n["bdf"]] for n in by_kind["nvme"]], ("names",))
        gpus.append(g)
    return {
        "hostname": read_small(node.path("proc/sys/kernel/hostname")),
        "numa_nodes": [{"node": n, "cpus": format_cpulist(c)} for n, c in sorted(nodes.items())],
        "multi_node": len(nodes) > 1,
        "online_cpus": format_cpulist(online),
        "host_bridges": {hb: n for hb, n in sorted(hb_nodes.items()) if hb is not None},
        "gpus": gpus,
        "nics": [public[d["bdf"]] for d in by_kind["nic"]],
        "nvme": [public[d["bdf"]] for d in by_kind["nvme"]],
        "irqbalance": irqbalance_facts(node),
    }


# ---------------------------------------------------------------------------------------------
# nvidia-smi (where it answered): topo -m's affinity columns and the query's numbering
# ---------------------------------------------------------------------------------------------


def parse_topo(text: str | None) -> dict:
    """``nvidia-smi topo -m``: its columns, per row the link cells and the CPU/NUMA affinity, the NIC legend.

    ``{columns: [GPU0, ..., NIC0 | mlx5_0, ...], rows: {name: {cells: {column: cell}, cpu_affinity,
    numa_affinity}}, nic_legend: {NIC0: mlx5_0}}``. Rows are split on whitespace (tab-separated or as
    a terminal copied them); the affinity columns follow the link cells; the header's ANSI underline
    (drivers 590 and later) is dropped. Affinity is None where the output has no such column.
    """
    columns, rows, legend = [], {}, {}
    has_cpu = has_numa = False
    for raw in (text or "").splitlines():
        line = _ANSI.sub("", raw)
        tokens = line.split()
        if not tokens:
            continue
        # The header row is indented (its first cell is empty); matrix rows start with their name.
        if not columns and line[:1].isspace() and any(re.match(r"^GPU\d+$", t) for t in tokens):
            stop = tokens.index("CPU") if "CPU" in tokens else len(tokens)
            columns, has_cpu = tokens[:stop], "CPU" in tokens
            has_numa = any(a == "NUMA" and b == "Affinity" for a, b in zip(tokens[stop:], tokens[stop + 1:]))
            continue
        m = re.match(r"^(NIC\d+):\s*(\S+)$", " ".join(tokens))
        if m:
            legend[m.group(1)] = m.group(2)
        elif columns and tokens[0] in columns:
            rest = tokens[1 + len(columns):]
            rows[tokens[0]] = {"cells": dict(zip(columns, tokens[1:1 + len(columns)])),
                               "cpu_affinity": rest[0] if has_cpu and rest else None,
                               "numa_affinity": rest[1] if has_numa and len(rest) > 1 else None}
    return {"columns": columns, "rows": rows, "nic_legend": legend}


def parse_smi_query(text: str | None) -> dict:
    """``{bdf: index}`` from ``nvidia-smi --query-gpu=index,pci.bus_id[,...] --format=csv,noheader``."""
    out = {}
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        m = _SMI_BUS_ID.match(parts[1].lower()) if len(parts) > 1 and parts[0].isdigit() else None
        if m:
            out[m.group(1)] = int(parts[0])
    return out


def _probe(ctx: Any, facts: dict) -> dict:
    """nvidia-smi's answers of the verification (verify_node.gpu_probe), ``{}`` when it was not asked."""
    probe = dict(getattr(ctx, "gpu", None) or facts.get("gpu_probe") or {})
    for res in probe.pop("results", None) or []:
        key = (res.get("item") or {}).get("key")
        if key and not res.get("skipped"):
            probe[key] = {"rc": res.get("rc"), "stdout": res.get("stdout"), "stderr": res.get("stderr")}
    return probe if probe.get("probe") == "present" else {}


def smi_view(probe: dict) -> dict:
    """``{index: {bdf: n}, affinity: {bdf: {cpus, numa}}, note}`` of a probe (empty where nvidia-smi did not answer)."""
    query = probe.get("query") or {}
    if not probe:
        return {"index": {}, "affinity": {}, "note": "nvidia-smi was not asked (not installed, or a simulated node)"}
    if query.get("rc", 0) != 0:
        return {"index": {}, "affinity": {}, "note": "nvidia-smi failed (rc %s)" % query.get("rc")}
    index = parse_smi_query(query.get("stdout"))
    topo = probe.get("topology") or {}
    parsed = parse_topo(topo.get("stdout")) if topo.get("rc", 0) == 0 else {"rows": {}}
    affinity = {}
    for bdf, i in index.items():
        row = parsed["rows"].get("GPU%d" % i) or {}
        if row.get("cpu_affinity") is not None or row.get("numa_affinity") is not None:
            affinity[bdf] = {"cpus": row.get("cpu_affinity"), "numa": row.get("numa_affinity")}
    note = "" if affinity else "nvidia-smi topo -m printed no CPU/NUMA affinity column"
    return {"index": index, "affinity": affinity, "note": note}


def affinity_disagreement(gpu: dict, smi: dict | None) -> str | None:
    """What nvidia-smi's affinity columns say differently from sysfs for one GPU, or None."""
    if not smi:
        return None
    problems = []
    cpus = smi.get("cpus")
    if cpuset(cpus) and cpuset(cpus) != cpuset(gpu["cpus"]):
        problems.append("CPU affinity %s (sysfs: %s)" % (cpus, gpu["cpus"] or "none"))
    numa = smi.get("numa")
    if cpuset(numa) and gpu["numa_node"] not in cpuset(numa):
        mine = "none" if gpu["numa_node"] is None else gpu["numa_node"]
        problems.append("NUMA affinity %s (sysfs: %s)" % (numa, mine))
    return "nvidia-smi topo -m gives %s" % "; ".join(problems) if problems else None


# ---------------------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------------------


def validate(want: Any) -> dict:
    """``desired["gpu_locality"]``: ``{remote_irqs_fail: bool, export: absolute path or None}``."""
    if want is not None and not isinstance(want, dict):
        raise family.EvaluationError("gpu_locality must be a mapping with the keys remote_irqs_fail, export; got %r"
                                     % (want,))
    want = dict(want or {})
    unknown = sorted(set(want) - {"remote_irqs_fail", "export"})
    if unknown:
        raise family.EvaluationError("gpu_locality: unknown key(s) %s; allowed: remote_irqs_fail, export"
                                     % ", ".join(unknown))
    if not isinstance(want.get("remote_irqs_fail", False), bool):
        raise family.EvaluationError("gpu_locality.remote_irqs_fail must be true or false, got %r"
                                     % (want["remote_irqs_fail"],))
    path = want.get("export")
    if path is not None and (not isinstance(path, str) or not path.startswith("/") or _CONTROL.search(path)
                             or path.endswith("/") or "/../" in path + "/"):
        raise family.EvaluationError("gpu_locality.export must be an absolute file path without control "
                                     "characters or '..', got %r" % (path,))
    return {"remote_irqs_fail": bool(want.get("remote_irqs_fail")), "export": path}


def wanted(desired: dict | None) -> dict | None:
    """The validated ``desired["gpu_locality"]``, or None when the family is not part of the desired state.

    The role sets it to null when gpunode_tuning_gpu_locality_enabled is false (a null that ansible-core before
    2.19 templates as "": that too means off).
    """
    raw = (desired or {}).get(NAME, None)
    if raw is None or raw == "":
        return None
    return validate(raw)


def _row(name: str, desired: Any, running: Any, state: str, reason: str = "") -> dict:
    return family.setting(NAME, name, desired, running, state, reason)


def _name(dev: dict | None) -> str:
    """``0000:15:00.0 (mlx5_0, ibp21s0)``: an address with the device's names."""
    if not dev:
        return "none"
    names = list(dev.get("rdma") or []) + list(dev.get("netdevs") or []) + list(dev.get("names") or [])
    return "%s (%s)" % (dev["bdf"], ", ".join(names)) if names else dev["bdf"]


def irq_text(irqs: dict | None) -> str:
    """``4 of 16 MSI-X IRQs served only on another NUMA node (CPUs 12-15)``, or what is known."""
    if not irqs or not irqs.get("count"):
        return "no MSI/MSI-X IRQ listed (msi_irqs/)"
    kind = {"msix": "MSI-X", "msi": "MSI"}.get(irqs.get("mode") or "", "MSI/MSI-X")
    if irqs.get("remote") is None:
        text = "%d %s IRQ(s), not judged (NUMA node unknown)" % (irqs["count"], kind)
    elif irqs["remote"]:
        text = "%d of %d %s IRQ(s) served only on another NUMA node (CPUs %s)" % (
            irqs["remote"], irqs["count"], kind, irqs["remote_cpus"])
    else:
        text = "%d %s IRQ(s), none served only on another NUMA node" % (irqs["count"], kind)
    return text + ("; %d without an affinity in /proc/irq" % irqs["unread"] if irqs.get("unread") else "")


def _numa_finding(gpu: dict, multi_node: bool) -> str | None:
    if gpu["numa_node_published"] is not None and gpu["numa_node_published"] >= 0:
        return None
    if not multi_node:
        return None
    found = (" (its %s is on node %d)" % (gpu["numa_source"], gpu["numa_node"])) if gpu["numa_node"] is not None else ""
    return ("firmware publishes no NUMA affinity for %s (numa_node -1)%s: enable the BIOS/firmware setting that "
            "reports PCIe proximity (ACPI _PXM), or the kernel places its memory and threads anywhere"
            % (gpu["bdf"], found))


def amd_links(ctx: Any, facts: dict) -> dict | None:
    """amd-smi topology's link map (core/amd_p2p.links) from the verification's GPU probe, None without it."""
    return amd_p2p.topology_links(nvidia_smi.probe_answers(getattr(ctx, "gpu", None) or facts.get("gpu_probe")))


def gpu_row(gpu: dict, loc: dict, want: dict, smi: dict, peers: dict | None = None) -> dict:
    """One GPU: NUMA node, CPUs, nearest NIC and NVMe with their relation; the findings in the reason; ``peers``
    (address -> text, core/amd_p2p.peers) its links to the other GPUs where amd-smi gave them."""
    numa = "node %s" % gpu["numa_node"] if gpu["numa_node"] is not None else "no NUMA node"
    running = "%s, CPUs %s; NIC %s; NVMe %s" % (
        numa, gpu["cpus"], _relation_text(gpu["nearest_nic"]), _relation_text(gpu["nearest_nvme"]))
    disagreement = affinity_disagreement(gpu, smi["affinity"].get(gpu["bdf"]))
    findings = [f for f in (_numa_finding(gpu, loc["multi_node"]), disagreement) if f]
    irqs = gpu.get("irqs") or {}
    notes = ["IRQs: %s" % irq_text(irqs)]
    if gpu["bdf"] in smi["affinity"] and disagreement is None:
        notes.append("nvidia-smi topo -m agrees on the CPU/NUMA affinity")
    if (peers or {}).get(gpu["bdf"]):
        notes.append("GPU-to-GPU (amd-smi topology): %s" % peers[gpu["bdf"]])
    if gpu["numa_node_published"] is not None and gpu["numa_node_published"] < 0 and not loc["multi_node"]:
        notes.append("numa_node -1 on a single NUMA node: nothing to bind")
    remote = bool(irqs.get("remote"))
    state = "drifted" if findings or (remote and want["remote_irqs_fail"]) else "applied"
    if remote and want["remote_irqs_fail"]:
        findings.append("remote IRQs fail verification (gpunode_tuning_gpu_locality_remote_irqs_fail)")
    desired = "NUMA affinity published" + ("; IRQs on the GPU's node" if want["remote_irqs_fail"] else "")
    return _row(gpu["bdf"], desired, running, state, "; ".join(findings + notes))


def _relation_text(near: dict | None) -> str:
    return "%s %s" % (_name(near), near["relation"]) if near else "none"


def nic_row(nic: dict, want: dict, multi_node: bool) -> dict:
    """One NIC: its NUMA node and its remote IRQs (report only unless remote_irqs_fail)."""
    numa = "node %s" % nic["numa_node"] if nic["numa_node"] is not None else "no NUMA node"
    irqs = nic.get("irqs") or {}
    remote = bool(irqs.get("remote"))
    reasons = ["IRQs: %s" % irq_text(irqs)]
    if nic["numa_node"] is None and multi_node:
        reasons.append("firmware publishes no NUMA affinity for this NIC (numa_node -1)")
    state = "drifted" if remote and want["remote_irqs_fail"] else "applied"
    if state == "drifted":
        reasons.append("remote IRQs fail verification (gpunode_tuning_gpu_locality_remote_irqs_fail)")
    running = "%s %s, %s, CPUs %s" % (nic.get("nic_class"), _name(nic), numa, nic["cpus"])
    return _row("nic.%s" % nic["bdf"], "IRQs on the NIC's node" if want["remote_irqs_fail"] else None, running,
                state, "; ".join(reasons))


def irqbalance_row(loc: dict) -> dict:
    """Whether irqbalance runs: reported only (it moves IRQs, so a pinning without banning them does not last)."""
    ib = loc.get("irqbalance") or {}
    if ib.get("running"):
        running = "running (pid %s%s)" % (", ".join(str(p) for p in ib["pids"]),
                                          ": " + ib["cmdline"] if ib.get("cmdline") else "")
        why = ("irqbalance moves IRQs periodically: a pinning of GPU or NIC IRQs lasts only for IRQs it is told to "
               "leave alone (IRQBALANCE_BANNED_CPULIST, --banirq); reported only, no IRQ is moved")
    else:
        running = "not running"
        why = "IRQ affinities stay where the kernel or an administrator put them; reported only, no IRQ is moved"
    return _row("irqbalance", None, running, "applied", why)


def evaluate(facts: dict, desired: dict, ctx: Any = None) -> list:
    """The locality rows of a host; none when ``desired`` has no ``gpu_locality`` key (the role always asks)."""
    want = wanted(desired)
    if want is None:
        return []
    loc = facts.get(NAME)
    if not loc:
        return [_row("gpus", None, None, "unsupported", "no gpu_locality facts were read (tuning_info without the "
                                                        "family's read)")]
    if not loc.get("gpus"):
        return [_row("gpus", None, None, "not_applicable", "no selected GPU on this node")]
    smi = smi_view(_probe(ctx, facts))
    peers = amd_p2p.peers(amd_links(ctx, facts))
    rows = [gpu_row(g, loc, want, smi, peers) for g in loc["gpus"]]
    rows += [nic_row(n, want, loc["multi_node"]) for n in loc.get("nics") or []]
    return rows + [irqbalance_row(loc)]


def row_vendor(row: dict, facts: dict) -> str | None:
    """A locality row's vendor: its GPU's (the row is named by the GPU's address), None for a NIC or irqbalance."""
    return ((facts.get("pci") or {}).get("gpu_vendors") or {}).get(row["name"])


# ---------------------------------------------------------------------------------------------
# The export (topology.json) and the report section
# ---------------------------------------------------------------------------------------------


def _export_near(near: dict | None) -> dict | None:
    if not near:
        return None
    out = {"pci": near["bdf"], "relation": near["relation"]}
    for key in ("netdevs", "rdma", "names"):
        if key in near:
            out["rdma_devices" if key == "rdma" else key] = near[key]
    return out


def export_document(loc: dict, smi_index: dict) -> dict:
    """The topology.json document (docs/gpu-locality.md, docs/topology.schema.json): no volatile values
    (no IRQ affinity), so that an unchanged node gives the same bytes."""
    gpus = {}
    for g in loc.get("gpus") or []:
        gpus[g["bdf"]] = {
            "nvidia_smi_index": smi_index.get(g["bdf"]),
            "numa_node": g["numa_node"], "numa_source": g["numa_source"], "cpus": g["cpus"],
            "host_bridge": g["host_bridge"], "root_port": g["root_port"], "switches": g["switches"],
            "nearest_nic": _export_near(g["nearest_nic"]), "nearest_nvme": _export_near(g["nearest_nvme"]),
            "nics": {n["bdf"]: n["relation"] for n in g["nics"]},
            "nvme": {n["bdf"]: n["relation"] for n in g["nvme"]},
        }
    nics = {n["bdf"]: {"class": n["nic_class"], "numa_node": n["numa_node"], "cpus": n["cpus"],
                       "netdevs": n["netdevs"], "rdma_devices": n["rdma"]} for n in loc.get("nics") or []}
    nvme = {n["bdf"]: {"numa_node": n["numa_node"], "cpus": n["cpus"], "names": n["names"]}
            for n in loc.get("nvme") or []}
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "host": loc.get("hostname"),
            "index_order": INDEX_ORDER, "relations": dict(LEGEND),
            "numa_nodes": {str(n["node"]): {"cpus": n["cpus"]} for n in loc.get("numa_nodes") or []},
            "gpus": gpus, "nics": nics, "nvme": nvme}


def export(facts: dict, desired: dict, ctx: Any = None) -> dict:
    """``{"topology.json": document}`` for the verification's exports (the host's <host>.topology.json)."""
    if wanted(desired) is None or not facts.get(NAME):
        return {}
    return {EXPORT_NAME: export_document(facts[NAME], smi_view(_probe(ctx, facts))["index"])}


def _groups(gpus: list) -> list:
    """``[(numa node or None, [gpu, ...])]`` in node order, the GPUs in PCI bus order."""
    groups = {}
    for g in sorted(gpus, key=lambda g: g["bdf"]):
        groups.setdefault(g["numa_node"], []).append(g)
    return sorted(groups.items(), key=lambda item: (item[0] is None, item[0] if item[0] is not None else 0))


def _indexes(gpus: list, index: dict) -> str:
    known = [str(index[g["bdf"]]) for g in gpus if g["bdf"] in index]
    return " (nvidia-smi %s)" % ", ".join(known) if known else ""


def hints(loc: dict, index: dict) -> list:
    """Launch hints in Markdown lines: numactl per NUMA group and the engines' documented NUMA options."""
    gpus = sorted(loc["gpus"], key=lambda g: g["bdf"])
    lines = []
    for numa, group in _groups(gpus):
        names = ", ".join(g["bdf"] for g in group) + _indexes(group, index)
        if numa is None:
            lines.append("- GPUs %s: no NUMA node known, no binding to suggest" % names)
        else:
            lines.append("- GPUs %s: `numactl --cpunodebind=%d --membind=%d <command>`" % (names, numa, numa))
    if not loc.get("multi_node"):
        return lines + ["", "One NUMA node: binding changes nothing here."]
    if any(g["numa_node"] is None for g in gpus):
        return lines + ["", "Not every GPU has a NUMA node: the engines' per-GPU NUMA lists are left out."]
    nodes = " ".join(str(g["numa_node"]) for g in gpus)
    return lines + [
        "",
        "Per-GPU NUMA lists below are in PCI bus order: run the engine with every GPU visible and "
        "`CUDA_DEVICE_ORDER=PCI_BUS_ID`, so that its GPU i is the i-th of this list.",
        "- vLLM (`--numa-bind`, `--numa-bind-nodes`: one NUMA node per visible GPU): "
        "`vllm serve <model> --tensor-parallel-size %d --numa-bind --numa-bind-nodes %s`" % (len(gpus), nodes),
        "- SGLang (`--numa-node`: the i-th element for the i-th subprocess): "
        "`python3 -m sglang.launch_server --model-path <model> --tp %d --numa-node %s`" % (len(gpus), nodes),
        "- TensorRT-LLM documents no per-GPU NUMA option: it sets each worker's CPU affinity from the NUMA "
        "topology when the affinity is not already constrained; `TLLM_NUMA_AWARE_WORKER_AFFINITY=1` makes it "
        "unconditional.",
    ]


def report(facts: dict, desired: dict, ctx: Any = None) -> str | None:
    """The host report's section: the GPU table, the IRQ findings and the launch hints (Markdown)."""
    loc = facts.get(NAME) if wanted(desired) is not None else None
    if not loc or not loc.get("gpus"):
        return None
    index = smi_view(_probe(ctx, facts))["index"]
    lines = ["| GPU | nvidia-smi | NUMA node | CPUs | Nearest NIC | Relation | Nearest NVMe | Relation |",
             "|---|---|---|---|---|---|---|---|"]
    for g in sorted(loc["gpus"], key=lambda g: g["bdf"]):
        nic, nvme = g["nearest_nic"], g["nearest_nvme"]
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            g["bdf"], index.get(g["bdf"], "–"), "–" if g["numa_node"] is None else g["numa_node"], g["cpus"],
            _name(nic) if nic else "–", nic["relation"] if nic else "–",
            _name(nvme) if nvme else "–", nvme["relation"] if nvme else "–"))
    lines += ["", "Relations as `nvidia-smi topo -m` names them: " + "; ".join(
        "%s %s" % (k, v) for k, v in LEGEND.items()) + ".", "", "Interrupts (reported, nothing moved):", ""]
    for dev in sorted(loc["gpus"], key=lambda g: g["bdf"]) + list(loc.get("nics") or []):
        lines.append("- %s: %s" % (_name(dev), irq_text(dev.get("irqs"))))
    lines += ["- irqbalance: %s" % irqbalance_row(loc)["running"], ""]
    links = amd_p2p.table(amd_links(ctx, facts))
    if links:
        lines += ["GPU-to-GPU links of the AMD GPUs (`amd-smi topology`: link type and hops):", "", links]
    lines += ["Launch hints:", ""]
    return "\n".join(lines + hints(loc, index))


# ---------------------------------------------------------------------------------------------
# Writing topology.json on the node: the module (persistent flow) and the boot runner
# ---------------------------------------------------------------------------------------------


def query_smi(node: Node, lookup: Any = None, timeout: int = SMI_TIMEOUT) -> dict | None:
    """``{rc, stdout, stderr}`` of nvidia-smi's GPU numbering, None without nvidia-smi; bounded by ``timeout``.

    A simulated node answers only through the nvidia-smi it ships, never the controller's.
    """
    try:
        smi = node.bin_path(lookup or family.SystemLookup, "nvidia-smi", "nvidia-utils", host=False)
    except BinaryNotFound:
        return None
    rc, stdout, stderr = command.run([smi, *SMI_QUERY], timeout, {"PATH": family.SYSTEM_PATH})
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def node_document(node: Node, lookup: Any = None, timeout: int = SMI_TIMEOUT) -> tuple:
    """``(document, how nvidia-smi answered)`` read on the node itself (module and boot runner)."""
    loc = read(node, DeviceSelector())
    smi = query_smi(node, lookup, timeout)
    if smi is None:
        said = "nvidia-smi not installed: no nvidia_smi_index"
    elif smi["rc"] != 0:
        said = "nvidia-smi failed (rc %s): %s" % (smi["rc"], (smi["stderr"] or smi["stdout"]).strip()[:200])
    else:
        said = "nvidia-smi answered"
    index = parse_smi_query(smi["stdout"]) if smi and smi["rc"] == 0 else {}
    return export_document(loc, index), said


def render(document: dict) -> str:
    """The file's text: sorted keys, 2-space indent, a final newline (the same document, the same bytes)."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def write_export(node: Node, path: str, document: dict, check_mode: bool = False) -> tuple:
    """``(changed, before text or None, after text)``; written by temporary file and rename, mode 0644."""
    full = node.path(path)
    text = render(document)
    try:
        with open(full, encoding="utf-8") as fh:
            before = fh.read()
    except FileNotFoundError:
        before = None
    except OSError as exc:
        raise NodeError("cannot read %s: %s" % (full, exc.strerror or exc)) from exc
    try:
        files.ensure_dir(os.path.dirname(full), check_mode, what="directory")
        change = files.write_file(full, text.encode("utf-8"), check_mode, what="file")
    except files.ReportError as exc:
        raise NodeError(str(exc)) from exc
    return bool(change), before, text


def _summary(document: dict) -> str:
    return "%d GPUs, %d NICs, %d NVMe drives" % (len(document["gpus"]), len(document["nics"]), len(document["nvme"]))


def run(call: family.Call) -> dict:
    """The module gpu_locality: write (refresh) topology.json on the node; check mode writes nothing."""
    p = call.params
    try:
        want = validate({"export": p.get("path") or EXPORT_PATH})
        node = Node.open(p["root"])
        document, said = node_document(node, call.lookup)
        changed, before, after = write_export(node, want["export"], document, call.check_mode)
    except (family.EvaluationError, NodeError) as exc:
        raise family.FamilyError(str(exc), {"changed": False}) from exc
    result = {"changed": changed, "path": want["export"], "gpus": len(document["gpus"]),
              "nics": len(document["nics"]), "nvme": len(document["nvme"]), "nvidia_smi": said,
              "msg": "%s %s (%s)" % (want["export"], "written" if changed else "unchanged", _summary(document))}
    if call.diff:
        result["diff"] = {"before": before or "", "after": after, "before_header": want["export"],
                          "after_header": want["export"]}
    return result


def boot(node: Node, want: dict) -> tuple:
    """Refresh topology.json at boot (PCI addresses and NUMA can change with the hardware); ``(ok, message)``."""
    want = validate(want)
    path = want["export"] or EXPORT_PATH
    document, said = node_document(node, timeout=BOOT_SMI_TIMEOUT)
    changed, _before, _after = write_export(node, path, document)
    return True, "%s %s (%s; %s)" % (path, "written" if changed else "unchanged", _summary(document), said)


# The options of its module (gpu_locality).
ARGUMENT_SPEC = dict(
    path=dict(type="str", default=EXPORT_PATH),
    **NODE_ARGUMENT_SPEC,
)


def from_role(v: dict, shared: dict) -> dict:
    """Read-only; the export lives beside the boot unit's desired state."""
    if not v.get("gpunode_tuning_gpu_locality_enabled", True):
        return {NAME: None}
    return {NAME: {"remote_irqs_fail": bool(v.get("gpunode_tuning_gpu_locality_remote_irqs_fail", False)),
                   "export": EXPORT_PATH}}


def persist_export(pc) -> dict:
    """topology.json for launchers (the boot unit refreshes it at every boot)."""
    want = pc.desired.get(NAME)
    if not want:
        return {"changed": False, "skipped": True, "reason": "gpunode_tuning_gpu_locality_enabled is false"}
    want = validate(want)
    document, said = node_document(pc.node, pc.call.lookup)
    pc.files.write(want["export"] or EXPORT_PATH, render(document))
    return {"summary": "%s (%s; %s)" % (want["export"] or EXPORT_PATH, _summary(document), said)}


def remove_export(pc) -> dict:
    pc.files.remove(EXPORT_PATH)
    return {}


PERSIST = persistence.Concern(NAME, (NAME,), persist_export, remove_export,
                              description="the topology file for inference engines")


def gpu_commands(desired: dict) -> tuple:
    """The GPU list (nvidia-smi's numbering) and ``topo -m`` (its CPU and NUMA affinity column); where AMD GPUs are,
    ``amd-smi topology`` (the health gate's call, run once for both)."""
    return (nvidia_smi.QUERY, nvidia_smi.TOPOLOGY) + tuple(c for c in amd_p2p.LINK_COMMANDS if c.key == "amd_topology")


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "GPU locality"},
    module="gpu_locality",
    read=read,
    facts_doc=FACTS_DOC,
    run=run,
    evaluate=family.with_vendor(evaluate, row_vendor),
    gpu_commands=gpu_commands,
    boot=boot,
    export=export,
    report=report,
    from_role=from_role,
    argument_spec=ARGUMENT_SPEC,
    persist=PERSIST,
)
