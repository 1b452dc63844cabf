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

Verification (``evaluate``, the report section and the ``topology.json`` export) is families/gpu_locality_verify.py,
imported only when verification calls it; ``run`` and ``boot`` write topology.json on the node (docs/gpu-locality.md).

Plain Python (3.8+), no Ansible import: the boot runner loads this on the node without Ansible.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    calls,
    command,
    family,
    file_updates,
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
_CPULIST = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
_SMI_BUS_ID = re.compile(r"^0*([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# -- Small reads: one open and one read per attribute


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


# -- PCI paths and the relation of two devices


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


# -- Reading the node


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


# -- The facts


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


# -- nvidia-smi's numbering of the GPUs (the export's nvidia_smi_index)


def parse_smi_query(text: str | None) -> dict:
    """``{bdf: index}`` from ``nvidia-smi --query-gpu=index,pci.bus_id[,...] --format=csv,noheader``."""
    out = {}
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        m = _SMI_BUS_ID.match(parts[1].lower()) if len(parts) > 1 and parts[0].isdigit() else None
        if m:
            out[m.group(1)] = int(parts[0])
    return out


# -- The desired state's entry


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


# -- The export document (topology.json)


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


# -- Writing topology.json on the node: the module (persistent flow) and the boot runner


def query_smi(node: Node, lookup: Any = None, timeout: int = SMI_TIMEOUT) -> dict | None:
    """``{rc, stdout, stderr}`` of nvidia-smi's GPU numbering, None without nvidia-smi; bounded by ``timeout``.

    A simulated node answers only through the nvidia-smi it ships, never the controller's.
    """
    try:
        smi = node.bin_path(lookup or calls.SystemLookup, "nvidia-smi", "nvidia-utils", host=False)
    except BinaryNotFound:
        return None
    rc, stdout, stderr = command.run([smi, *SMI_QUERY], timeout, {"PATH": calls.SYSTEM_PATH})
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
        file_updates.ensure_dir(os.path.dirname(full), check_mode, what="directory")
        change = file_updates.write_file(full, text.encode("utf-8"), check_mode, what="file")
    except file_updates.ReportError as exc:
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


def _verification():
    """The verification half (families/gpu_locality_verify.py), imported when verification first calls it."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_locality_verify
    return gpu_locality_verify


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "GPU locality"},
    module="gpu_locality",
    read=read,
    facts_doc=family.later(_verification, "FACTS_DOC"),
    run=run,
    evaluate=family.with_vendor(family.later(_verification, "evaluate"), family.later(_verification, "row_vendor")),
    gpu_commands=family.later(_verification, "gpu_commands"),
    boot=boot,
    export=family.later(_verification, "export"),
    report=family.later(_verification, "report"),
    from_role=from_role,
    argument_spec=ARGUMENT_SPEC,
    persist=PERSIST,
)
