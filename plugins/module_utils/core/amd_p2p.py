# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU-to-GPU links and peer-to-peer bandwidth of AMD GPUs: what ``gpu_p2p`` and ``gpu_locality`` read on them.

The links come from the amd-smi calls the health gate already makes (``amd-smi topology --json``, and
``amd-smi xgmi -l --json`` from ROCm 6.4; the probe keys of core/amd_health.py, asked once for every family of the
run). ``links`` turns either topology shape (ROCm 6.1's ``gpu_N`` tables, 6.1.1's ``links`` list, ``N/A`` fields)
or ``rocm-smi --showtopo``'s tables into one map of directed GPU pairs. amd-smi's ``link_status`` of a pair
(``link_accessibility`` before 6.1.1: the library's ``amdsmi_is_P2P_accessible``) says whether the two GPUs can
reach each other's memory: that is the P2P verdict, with the link type and hops against what the node's GPUs
should have (every pair of MI300-class GPUs one XGMI hop apart).

The bandwidth, where ``desired["gpu_p2p"]["min_gbps"]`` asks for it, comes from ``TransferBench p2p`` or, where
TransferBench is not installed, ``rocm-bandwidth-test -a`` (one bounded run of whichever is found, on PATH or in
/opt/rocm/bin, never installed). ``read_bandwidth`` reads both formats: TransferBench's tables (``SRC+EXE\\DST``
header, ``GPU 00 ->`` rows) and rocm-bandwidth-test 2.x's ``D/D``
matrices with the ``Device: N`` list that says which devices are GPUs and on which bus.

Plain Python (3.8+), no Ansible import; names no family (the callers pass their row factory).
"""

from __future__ import annotations

import re
from typing import Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_health, amd_smi
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import GpuCommand

# The probe keys shared with the health gate (core/amd_health.COMMANDS): one run serves both families.
LINK_KEYS = ("amd_topology", "amd_xgmi_link_status")
LINK_COMMANDS = tuple(c for c in amd_health.COMMANDS if c.key in LINK_KEYS)
BANDWIDTH_KEY = "amd_bandwidth"
TRANSFERBENCH = "TransferBench"
RBT = "rocm-bandwidth-test"
BANDWIDTH_MISSING = ("neither TransferBench nor rocm-bandwidth-test found on the node's PATH nor in /opt/rocm/bin: "
                     "install ROCm's transferbench or rocm-bandwidth-test package to measure GPU pair bandwidth")
# TransferBench first (AMD's MI300X acceptance guide measures P2P with ``TransferBench p2p``); else the classic
# rocm-bandwidth-test, unidirectional copies among all devices (``-a``).
BANDWIDTH = GpuCommand(BANDWIDTH_KEY, ("p2p",), tool=TRANSFERBENCH, package="transferbench", missing=BANDWIDTH_MISSING,
                       standalone=True, dirs=amd_health.DIRS, vendor="amd", alternatives=((RBT, ("-a",)),))
# PCI device ids of MI300-class GPUs, whose XGMI mesh connects every pair of (up to 8) GPUs directly: one hop.
# AMD's MI300X platform data sheet and the ROCm MI300X system optimization guide ("fully connected", 7 links
# per OAM); 0x74a1 MI300X, 0x74a5 MI325X, 0x74a2 MI308X, 0x74a0 MI300A, 0x75a0 MI350X, 0x75a3 MI355X.
ONE_HOP_DEVICES = {"0x74a1": "MI300X", "0x74a5": "MI325X", "0x74a2": "MI308X", "0x74a0": "MI300A",
                   "0x75a0": "MI350X", "0x75a3": "MI355X"}
ACCESSIBLE = ("ENABLED", "UP", "ACCESSIBLE", "TRUE")
# amd-smi's weight of a pair: 15 per physical XGMI hop, 20 per PCIe segment (AMD SMI CLI docs, "Explain hops and
# weights", ROCm/rocm-systems PR 7372). Its hops read 1 for any XGMI path, direct or not (rocm-systems issue
# 5763; hwloc issue 775), so the weight is what tells a direct XGMI link. In CPX mode the driver reports other
# weights for partitions (13, 41: ROCm/rccl PR 1290): the weight is judged only where no GPU is partitioned.
XGMI_HOP_WEIGHT = 15

Row = Callable[..., dict]


# --- links between GPUs ----------------------------------------------------------------------------------


def links(topology: dict | None = None, showtopo: dict | None = None) -> dict:
    """``{"pairs": {(a, b): link}, "bdf": {index: address}}``: every directed GPU pair with its link.

    ``topology``: ``amd_smi.read_topology``'s reading (either JSON shape); ``showtopo``:
    ``amd_smi.read_rocm_smi_showtopo``'s (no link status there: None). A link is
    ``{"link_type", "link_status", "hops", "weight"}``, None where the tool printed ``N/A``.
    """
    pairs, bdf = {}, {}
    for g in (topology or {}).get("gpus") or []:
        if g.get("gpu") is None:
            continue
        if g.get("bdf"):
            bdf[g["gpu"]] = g["bdf"]
        for link in g.get("links") or []:
            if link.get("peer") is None or link["peer"] == g["gpu"]:
                continue
            pairs[(g["gpu"], link["peer"])] = {k: link.get(k) for k in ("link_type", "link_status", "hops", "weight")}
            if link.get("peer_bdf"):
                bdf.setdefault(link["peer"], link["peer_bdf"])
    for link in (showtopo or {}).get("links") or []:
        pairs.setdefault((link["gpu"], link["peer"]), {"link_type": link.get("link_type"), "link_status": None,
                                                       "hops": link.get("hops"), "weight": link.get("weight")})
    return {"pairs": pairs, "bdf": bdf}


_READ: dict = {}  # the last topology answer read: the families of one run read the same text (not to be changed)


def topology_links(answers: dict) -> dict | None:
    """The link map of the probe's ``amd-smi topology`` answer; None where it did not answer or read nothing.

    Read once per answer text (gpu_p2p and gpu_locality, rows and report, ask for the same one); callers do not
    change the map."""
    answer = (answers or {}).get("amd_topology") or {}
    if amd_health.call_failure("amd_topology", answer):
        return None
    text = answer.get("stdout") or ""
    if text not in _READ:
        reading = amd_smi.read_topology(text)
        _READ.clear()
        _READ[text] = None if reading["finding"] else links(reading)
    return _READ[text]


def peers(link_map: dict | None) -> dict:
    """``{address: "XGMI, 1 hop, weight 15 to 7 GPUs"}``: each GPU's links to the others, alike links counted."""
    out = {}
    if not link_map:
        return out
    for gpu in gpus_of(link_map):
        kinds = {}
        for (a, b), link in sorted(link_map["pairs"].items()):
            if a == gpu:
                text = link_text(dict(link, link_status=None))
                if accessible(link) is False:
                    text += ", no P2P access (%s)" % link["link_status"]
                kinds.setdefault(text, []).append(b)
        if gpu in link_map["bdf"] and kinds:
            out[link_map["bdf"][gpu]] = "; ".join(
                "%s to %s" % (k, "%d GPUs" % len(v) if len(v) > 2 else " and ".join("GPU %d" % i for i in v))
                for k, v in sorted(kinds.items()))
    return out


def table(link_map: dict | None) -> str | None:
    """A Markdown GPU x GPU table of a link map: ``XGMI 1`` (type, hops), the status added where not accessible."""
    gpus = gpus_of(link_map) if link_map else []
    if len(gpus) < 2:
        return None
    lines = ["| | " + " | ".join("GPU%d" % g for g in gpus) + " |", "|---|" + "---|" * len(gpus)]
    for a in gpus:
        cells = []
        for b in gpus:
            link = link_map["pairs"].get((a, b))
            if a == b or not link:
                cells.append("X" if a == b else "–")
                continue
            cell = "%s %s" % (link.get("link_type") or "N/A", "N/A" if link.get("hops") is None else link["hops"])
            cells.append(cell if accessible(link) is not False else "%s %s" % (cell, link["link_status"]))
        lines.append("| GPU%d (%s) | %s |" % (a, link_map["bdf"].get(a, "?"), " | ".join(cells)))
    return "\n".join(lines) + "\n"


def gpus_of(link_map: dict) -> list:
    """The GPU indices a link map names, sorted."""
    return sorted({i for pair in link_map["pairs"] for i in pair} | set(link_map["bdf"]))


def name(index: int, bdfs: dict) -> str:
    """``GPU 3 (0000:65:00.0)``: amd-smi's index and the address, as the health rows name a GPU."""
    return "GPU %d (%s)" % (index, bdfs[index]) if index in bdfs else "GPU %d" % index


def link_text(link: dict | None) -> str:
    """``XGMI, 1 hop, weight 15, ENABLED`` (N/A where amd-smi gave none)."""
    if not link:
        return "no link reported"
    hops = link.get("hops")
    hop_text = "N/A hops" if hops is None else "%d hop%s" % (hops, "" if hops == 1 else "s")
    parts = [link.get("link_type") or "N/A", hop_text,
             "weight %s" % ("N/A" if link.get("weight") is None else link["weight"])]
    if link.get("link_status"):
        parts.append(link["link_status"])
    return ", ".join(parts)


def accessible(link: dict | None) -> bool | None:
    """Whether the pair can reach each other's memory (amd-smi's link status); None where it says nothing."""
    status = (link or {}).get("link_status")
    if status is None:
        return None
    return status.upper() in ACCESSIBLE


def one_hop_model(devices: list) -> str | None:
    """The model name when every selected AMD GPU is MI300-class (one XGMI hop between any two), else None."""
    models = {ONE_HOP_DEVICES.get(str(d.get("device") or "").lower()) for d in devices}
    return models.pop() if len(models) == 1 and None not in models else None


def unpartitioned(link_map: dict) -> bool:
    """Whether every GPU amd-smi names is a whole GPU (function 0: no CPX/DPX/QPX partitions), addresses known."""
    gpus = gpus_of(link_map)
    return bool(gpus) and all((link_map["bdf"].get(g) or "").endswith(".0") for g in gpus)


def pair_problems(a: int, b: int, link_map: dict, xgmi_hive: bool, one_hop: str | None,
                  judge_weight: bool = False) -> list:
    """What is wrong with the pair ``a``-``b`` (both directions), empty when P2P between them is as expected.

    ``one_hop``: the model whose GPUs are all one XGMI hop apart (MI300-class), None for others;
    ``judge_weight``: also the weight (15 for one physical XGMI hop) of such a model's pairs."""
    there, back = link_map["pairs"].get((a, b)), link_map["pairs"].get((b, a))
    if there is None and back is None:
        return ["amd-smi topology gives no link between them"]
    problems = []
    for src, dst, link in ((a, b, there), (b, a, back)):
        if link is not None and accessible(link) is False:
            problems.append("GPU %d cannot reach GPU %d's memory (link %s)" % (src, dst, link["link_status"]))
    link = there or back
    kind = (link.get("link_type") or "").upper()
    if xgmi_hive and kind != "XGMI":
        problems.append("linked by %s where the other GPUs are on XGMI (an XGMI link missing or down)"
                        % (link.get("link_type") or "N/A"))
    elif one_hop and kind == "XGMI" and link.get("hops") not in (None, 1):
        problems.append("%d XGMI hops where %s GPUs are one hop apart" % (link["hops"], one_hop))
    elif one_hop and judge_weight and kind == "XGMI" and (link.get("weight") or 0) > XGMI_HOP_WEIGHT:
        problems.append("weight %d where %s GPUs are linked directly (weight %d, one physical XGMI hop): the "
                        "path crosses another GPU" % (link["weight"], one_hop, XGMI_HOP_WEIGHT))
    return list(dict.fromkeys(problems))  # each once, in order


def pair_rows(devices: list, probe: dict, row: Row) -> list:
    """The P2P rows of the AMD GPUs: one drifted row per pair not as expected (``GPU0-GPU1``), else one applied
    ``pairs`` row; an unsupported ``pairs`` row when amd-smi's topology is not there; ``xgmi_links`` from xgmi -l."""
    refused = amd_health.refusals(probe).get("amd_topology")
    if refused:
        return [row("pairs", None, "unsupported", amd_health.refused_reason(probe, "amd_topology", refused))]
    failure = amd_health.call_failure("amd_topology", probe.get("amd_topology"))
    if failure:
        return [row("pairs", None, "unsupported", failure)]
    link_map = topology_links(probe)
    if link_map is None:
        reading = amd_smi.read_topology(probe["amd_topology"].get("stdout"))
        return [row("pairs", None, "unsupported", "%s: %s" % (amd_health.argv_text("amd_topology"),
                                                              reading["finding"]))]
    return judge(link_map, devices, row) + xgmi_link_rows(probe, link_map["bdf"], row)


def judge(link_map: dict, devices: list, row: Row, source: str = "amd-smi topology") -> list:
    """The pair rows of a link map (``links``): a drifted row per pair not as expected, else one applied row."""
    gpus = gpus_of(link_map)
    if len(gpus) < 2:
        return [row("pairs", None, "not_applicable", "fewer than 2 GPUs (%d) in %s: no GPU pair"
                    % (len(gpus), source))]
    bdfs = link_map["bdf"]
    kinds = {(lk.get("link_type") or "").upper() for lk in link_map["pairs"].values()}
    xgmi_hive = "XGMI" in kinds
    one_hop = one_hop_model(devices)
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    weights = unpartitioned(link_map)  # rocm-smi --showtopo names no address: its weights are reported only
    out = []
    for a, b in pairs:
        problems = pair_problems(a, b, link_map, xgmi_hive, one_hop, weights)
        if problems:
            link = link_map["pairs"].get((a, b)) or link_map["pairs"].get((b, a))
            out.append(row("GPU%d-GPU%d" % (a, b), link_text(link), "drifted",
                           "P2P between %s and %s is not as expected: %s (%s)"
                           % (name(a, bdfs), name(b, bdfs), "; ".join(problems), source)))
    if not out:
        out.append(row("pairs", summary(link_map, pairs), "applied",
                       "no GPU pair is cut off or on a longer path than its GPUs should have (%s, link status %s)%s"
                       % (source, "/".join(sorted({(link_map["pairs"][p].get("link_status") or "N/A")
                                                   for p in link_map["pairs"]})),
                          "; %s: one XGMI hop between any two GPUs, as found" % one_hop if one_hop and xgmi_hive
                          else "")))
    return out


def summary(link_map: dict, pairs: list) -> str:
    """``XGMI, 1 hop, weight 15 on all 28 pairs of 8 GPUs`` (the link kinds found, counted)."""
    kinds = {}
    for a, b in pairs:
        link = link_map["pairs"].get((a, b)) or link_map["pairs"].get((b, a)) or {}
        hops = link.get("hops")
        text = "%s, %s hop%s, weight %s" % (link.get("link_type") or "N/A", "N/A" if hops is None else hops,
                                            "" if hops == 1 else "s",
                                            "N/A" if link.get("weight") is None else link["weight"])
        kinds[text] = kinds.get(text, 0) + 1
    gpus = len({i for p in pairs for i in p})
    if len(kinds) == 1:
        return "%s on all %d pairs of %d GPUs" % (next(iter(kinds)), len(pairs), gpus)
    return "; ".join("%s on %d pairs" % (k, n) for k, n in sorted(kinds.items())) + " of %d GPUs" % gpus


def xgmi_link_rows(probe: dict, bdfs: dict, row: Row) -> list:
    """``xgmi_links``: every XGMI link of every GPU up (``amd-smi xgmi -l``, ROCm 6.4 on); none without it.

    xgmi -l lists each GPU's link slots, not its peers: a link down is named by its GPU and counted.
    """
    answer = probe.get("amd_xgmi_link_status")
    if not answer or amd_smi.refused(amd_health.answer_result(answer)) or amd_health.call_failure(
            "amd_xgmi_link_status", answer):
        return []
    reading = amd_smi.read_xgmi_link_status(answer.get("stdout"))
    if reading["finding"]:
        return []
    down = ["%s: %d XGMI link(s) down" % (name(g["gpu"], bdfs), g["down"]) for g in reading["gpus"] if g["down"]]
    up = sum(g["up"] for g in reading["gpus"])
    if down:
        return [row("xgmi_links", "; ".join(down)[:300], "drifted",
                    "%s (amd-smi xgmi -l): peer traffic of these GPUs falls back to fewer links" % "; ".join(down))]
    return [row("xgmi_links", "all up", "applied", "%d XGMI link(s) up on %d GPUs (amd-smi xgmi -l)"
                % (up, len(reading["gpus"])))]


# --- bandwidth: TransferBench p2p and rocm-bandwidth-test ---------------------------------------------------

_TB_TITLE = re.compile(r"^\s*(Unidirectional|Bidirectional) copy peak bandwidth GB/s")
_TB_COLUMN = re.compile(r"(CPU|GPU)\s+(\d+)")
_TB_ROW = re.compile(r"^\s*(CPU|GPU)\s+(\d+)\s+(->|<-|<->)\s+(.*\S)\s*$")
_TB_AVERAGE = re.compile(r"^\s*Averages \(During (UniDir|BiDir)\):\s*(.*\S)\s*$")
_RBT_DEVICE = re.compile(r"^\s*Device:\s*(\d+),\s*(.*?)(?:,\s*(GPU-\S+),\s*([0-9a-fA-F]+:[0-9a-fA-F]+\.[0-7]))?\s*$")
_RBT_HEADER = re.compile(r"^\s*D/D((?:\s+\d+)+)\s*$")
_RBT_ROW = re.compile(r"^\s*(\d+)((?:\s+(?:N/A|\d+(?:\.\d+)?))+)\s*$")
_RBT_TABLES = {"Inter-Device Access": "access", "Unidirectional copy peak bandwidth GB/s": "unidirectional",
               "Bidirectional copy peak bandwidth GB/s": "bidirectional"}


def _cell(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_transferbench(text: str | None) -> dict:
    """``TransferBench p2p``: ``{"unidirectional": {(src, dst): GB/s or None}, "bidirectional": {...},
    "averages": {"UniDir": {"GPU->GPU": ...}}, "gpus": [index]}`` over the GPU pairs (the diagonal is not a pair).

    Rows ``GPU NN ->`` hold what the row's GPU copies to each column (``->``); of the bidirectional table's
    three rows per device (``->``, ``<-``, ``<->``) the ``<->`` sum is kept. ``N/A`` is a pair not measured.
    """
    out = {"unidirectional": {}, "bidirectional": {}, "averages": {}, "gpus": []}
    table = columns = None
    average_names = []
    gpus = set()
    for line in (text or "").splitlines():
        title = _TB_TITLE.match(line)
        if title:
            table, columns = ("unidirectional" if title.group(1) == "Unidirectional" else "bidirectional"), None
            continue
        if table and columns is None and "DST" in line:
            columns = [(kind, int(i)) for kind, i in _TB_COLUMN.findall(line.split("DST", 1)[1])]
            continue
        avg = _TB_AVERAGE.match(line)
        if avg:
            out["averages"][avg.group(1)] = dict(zip(average_names, (_cell(v) for v in avg.group(2).split())))
            continue
        if line.strip().startswith("CPU->CPU"):
            average_names = line.split()
            continue
        m = _TB_ROW.match(line)
        if not (m and table and columns):
            continue
        kind, src, arrow = m.group(1), int(m.group(2)), m.group(3)
        if kind == "GPU":
            gpus.add(src)
        wanted = "->" if table == "unidirectional" else "<->"
        if kind != "GPU" or arrow != wanted:
            continue
        for (col_kind, dst), cell in zip(columns, m.group(4).split()):
            if col_kind == "GPU":
                gpus.add(dst)
                if dst != src:
                    out[table][(src, dst)] = _cell(cell)
    out["gpus"] = sorted(gpus)
    return out


def read_rocm_bandwidth_test(text: str | None) -> dict:
    """rocm-bandwidth-test 2.x: ``{"devices": {n: {"name", "bus"}}, "gpus": [n], "access": {(a, b): 0/1},
    "unidirectional": {(a, b): GB/s or None}, "bidirectional": {...}}`` over GPU pairs, by its device numbers.

    Its devices are CPUs and GPUs (a GPU's line names its ``GPU-<id>`` and bus, ``23:0.0``); the diagonal of a
    GPU is its local copy, not a pair; ``N/A`` between two GPUs means the copy was not possible.
    """
    devices, tables, table, columns = {}, {}, None, None
    for line in (text or "").splitlines():
        dev = _RBT_DEVICE.match(line)
        if dev:
            devices[int(dev.group(1))] = {"name": dev.group(2).strip(), "bus": dev.group(4)}
            continue
        stripped = line.strip()
        if stripped in _RBT_TABLES or stripped.startswith("Inter-Device"):
            table, columns = _RBT_TABLES.get(stripped), None
            continue
        head = _RBT_HEADER.match(line)
        if head:
            columns = [int(c) for c in head.group(1).split()]
            continue
        row = _RBT_ROW.match(line)
        if table and columns and row:
            for col, cell in zip(columns, row.group(2).split()):
                tables.setdefault(table, {})[(int(row.group(1)), col)] = _cell(cell)
    gpus = sorted(n for n, d in devices.items() if d["bus"])
    out = {"devices": devices, "gpus": gpus}
    for key in ("access", "unidirectional", "bidirectional"):
        out[key] = {(a, b): v for (a, b), v in (tables.get(key) or {}).items() if a in gpus and b in gpus and a != b}
    return out


def read_bandwidth(text: str | None) -> dict:
    """Either tool's output: ``{"tool", "format", "pairs": {(a, b): GB/s or None}, "label": {n: text}, "gpus"}``
    over the unidirectional GPU-to-GPU copies; ``finding`` when neither format is there."""
    text = text or ""
    if re.search(r"^\s*GPU\s+\d+\s+->", text, re.M):
        tb = read_transferbench(text)
        label = {g: "GPU %02d" % g for g in tb["gpus"]}
        return {"tool": TRANSFERBENCH, "format": "transferbench", "pairs": tb["unidirectional"], "label": label,
                "gpus": tb["gpus"], "finding": None if tb["unidirectional"] else "no GPU-to-GPU bandwidth table"}
    if "D/D" in text:
        rbt = read_rocm_bandwidth_test(text)
        label = {n: "device %d (bus %s)" % (n, rbt["devices"][n]["bus"]) for n in rbt["gpus"]}
        return {"tool": RBT, "format": "rocm-bandwidth-test", "pairs": rbt["unidirectional"], "label": label,
                "gpus": rbt["gpus"], "bus": {n: rbt["devices"][n]["bus"] for n in rbt["gpus"]},
                "finding": None if rbt["unidirectional"] else "no GPU-to-GPU bandwidth matrix"}
    return {"tool": None, "format": None, "pairs": {}, "label": {}, "gpus": [],
            "finding": "neither a TransferBench nor a rocm-bandwidth-test bandwidth table"}


def by_bus(reading: dict, bdfs: dict | None) -> dict:
    """``{tool's device number: amd-smi index}`` for rocm-bandwidth-test's GPUs, by bus (``83:0.0`` is
    ``....:83:00.0``); empty unless every GPU it measured is one amd-smi named (TransferBench names no bus)."""
    index = {}
    for n, bus in (reading.get("bus") or {}).items():
        m = re.match(r"^([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])$", bus or "")
        want = "%02x:%02x.%s" % (int(m.group(1), 16), int(m.group(2), 16), m.group(3)) if m else None
        found = [i for i, bdf in (bdfs or {}).items() if want and bdf.lower().endswith(":" + want)]
        if len(found) != 1:
            return {}
        index[n] = found[0]
    return index


def bandwidth_rows(answer: dict | None, min_gbps: float, row: Row, bdfs: dict | None = None) -> list:
    """The measured GPU pair bandwidths against ``min_gbps``: a drifted row per slow or unmeasured pair, else one
    applied ``bandwidth`` row; missing tools are unsupported. Pairs are named by amd-smi's index where the tool
    names each GPU's bus (rocm-bandwidth-test, ``bdfs`` amd-smi's index -> address), else by the tool's own
    numbering (TransferBench numbers the GPUs as HIP does)."""
    want = ">= %g GB/s" % min_gbps
    if not answer:
        return [row("bandwidth", None, "unsupported", "no bandwidth tool was run", want)]
    if answer.get("rc") == 127:
        return [row("bandwidth", None, "unsupported", answer.get("stderr") or BANDWIDTH_MISSING, want)]
    tool = answer.get("tool") or TRANSFERBENCH
    reading = read_bandwidth(answer.get("stdout"))
    if answer.get("timed_out") or answer.get("rc", 0) != 0 or reading["finding"]:
        why = (answer.get("stderr") or answer.get("stdout") or "").strip()
        why = why.splitlines()[-1][-300:] if why else reading["finding"] or "no output"
        return [row("bandwidth", None, "drifted", "%s (rc %s): %s" % (tool, answer.get("rc"), why), want)]
    label, pairs = reading["label"], reading["pairs"]
    index = by_bus(reading, bdfs)
    if index:
        label = {index[n]: "%s = %s" % (name(index[n], bdfs), reading["label"][n]) for n in index}
        pairs = {(index[a], index[b]): v for (a, b), v in pairs.items()}
    unmeasured = [(a, b) for (a, b), v in sorted(pairs.items()) if v is None]
    slow = [(a, b, v) for (a, b), v in sorted(pairs.items()) if v is not None and v < min_gbps]
    out = [row("bandwidth.GPU%d-GPU%d" % (a, b), "N/A", "drifted",
               "%s -> %s not measured (N/A): %s could not copy between them, no peer-to-peer access"
               % (label.get(a, a), label.get(b, b), tool), want) for a, b in unmeasured]
    out += [row("bandwidth.GPU%d-GPU%d" % (a, b), "%.2f GB/s" % v, "drifted",
                "%s -> %s at %.2f GB/s, below %g GB/s (%s, unidirectional copy)"
                % (label.get(a, a), label.get(b, b), v, min_gbps, tool), want) for a, b, v in slow]
    if out:
        return out
    values = list(pairs.values())
    numbering = ("TransferBench numbers the GPUs as HIP does" if reading["format"] == "transferbench"
                 else "GPUs matched to amd-smi's by bus" if index
                 else "rocm-bandwidth-test numbers CPUs and GPUs together")
    return [row("bandwidth", "min %.2f GB/s" % min(values), "applied",
                "%d GPU pairs measured by %s (unidirectional copy; %s)" % (len(values), tool, numbering), want)]
