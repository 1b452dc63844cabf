# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpu_locality family's verification half: ``FACTS_DOC``, the rows (``evaluate``), the report section and
the export, with nvidia-smi's ``topo -m`` affinity columns where it answered.

The facts themselves (``read``) are families/gpu_locality.py's: the module and the boot runner write topology.json
from them. Imported when verification first calls it (``family.later`` in families/gpu_locality.py), never by a
run that only applies (docs/dev/adding-a-family.md).

Verification (``evaluate``): one row per GPU, per NIC and one for irqbalance. A GPU without a NUMA node on a
multi-node system is drifted, as is a GPU whose CPU or NUMA affinity in ``nvidia-smi topo -m`` (where nvidia-smi
answered) disagrees with sysfs; an AMD GPU's row names its links to the other GPUs from ``amd-smi topology`` (type,
hops, weight; the call the health gate makes); remote IRQs are said in the reason and fail only with
``desired["gpu_locality"]["remote_irqs_fail"]``. The family exports ``topology.json`` (``export``: the
verification's ``<host>.topology.json``; ``run`` and ``boot`` write it on the node, see docs/gpu-locality.md for
its schema) and a report section (``report``).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_p2p, family, nvidia_smi
from ansible_collections.gpunode.tuning.plugins.module_utils.families.gpu_locality import (
    EXPORT_NAME,
    LEGEND,
    NAME,
    cpuset,
    export_document,
    parse_smi_query,
    validate,
)

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
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


# -- nvidia-smi (where it answered): topo -m's affinity columns

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
        line = ANSI_RE.sub("", raw)
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


# -- Verification

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


# -- The export (topology.json) and the report section

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


def gpu_commands(desired: dict) -> tuple:
    """The GPU list (nvidia-smi's numbering) and ``topo -m`` (its CPU and NUMA affinity column); where AMD GPUs are,
    ``amd-smi topology`` (the health gate's call, run once for both)."""
    return (nvidia_smi.QUERY, nvidia_smi.TOPOLOGY) + tuple(c for c in amd_p2p.LINK_COMMANDS if c.key == "amd_topology")
