# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU peer-to-peer: the read-only verification family ``gpu_p2p``.

Tensor parallelism lives on GPU-to-GPU P2P. NVIDIA GPUs: on a live node with nvidia-smi,
``verify_node.gpu_probe`` runs ``nvidia-smi topo -p2p r``, ``w`` and ``n`` (read, write, NVLink);
this family judges each GPU pair from those matrices and names, for a pair that is not OK, the
bridges above either GPU that still redirect peer traffic (ACS, read from config space: ``read``).
When ``desired["gpu_p2p"]["min_gbps"]`` is set and ``nvbandwidth`` is installed, the probe also
measures the pair bandwidths, judged against it. Its report section shows nvidia-smi's topology and
the P2P read/write status of each pair. Nothing is installed or changed: no module, no boot step.

AMD GPUs (rows ``amd.*``, vendor ``amd``; core/amd_p2p.py): each pair from ``amd-smi topology`` (the call the
health gate makes, asked once for both): the link status (can the pair reach each other's memory), the link type
(XGMI where the GPUs are on XGMI) and the hops (one between any two MI300-class GPUs), with ``amd-smi xgmi -l``'s
links down; with ``min_gbps``, ``TransferBench p2p`` (else ``rocm-bandwidth-test -a``) measures the pairs. BAR0 (the
VRAM aperture a PCIe peer maps) is judged like NVIDIA's BAR1 unless the GPUs are linked by XGMI (``amd.bar0``).

NCCL's verdict (both vendors, core/nccl_tests.py): with ``nccl_tests`` (the path of nccl-tests' or rccl-tests'
``all_reduce_perf``) the probe runs it across the GPUs with ``NCCL_DEBUG=INFO``; a pair NCCL connects through host
memory (``via SHM``) fails, and so does the bus bandwidth at the largest size below ``min_busbw_gbps``. Read-only:
the benchmark runs in check mode too, as nvbandwidth does (verification reads, it changes nothing).
"""

from __future__ import annotations

import math
import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    amd_p2p,
    family,
    nccl_tests,
    nvidia_smi,
    pci,
    pci_bar,
    pci_isolation,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.nvidia_smi import (
    NVBANDWIDTH_TEST,
    parse_gpu_query,
    parse_p2p,
    smi_failure,
)

NAME = "gpu_p2p"
# tuning_info's RETURN of tuning_facts.gpu_p2p (tools/generate.py writes it there).
FACTS_DOC = r"""
description:
  - What stops peer-to-peer traffic of the selected GPUs that config space shows.
returned: always
type: dict
contains:
  redirect:
    description:
      - Per selected GPU with one, the bridges above it (the root port first) whose ACS control has P2P Request
        Redirect or Completion Redirect on, which sends its peer traffic up to the root complex.
    type: dict
    returned: always
    sample: {"0000:01:00.0": ["0000:00:01.1"]}
  bars:
    description:
      - Per selected GPU (core/pci_bar.py) its vendor, PCI device id, the size of each assigned memory BAR from
        sysfs C(resource) (index to bytes), the Resizable BAR capability of config space (index to C(current)
        and C(supported) sizes in bytes; null without one) and its memory in bytes (null when not known).
    type: dict
    returned: always
    sample: {"0000:41:00.0": {"vendor": "nvidia", "device": "0x2bb5", "bars": {"0": 67108864, "1": 268435456},
             "rebar": {"1": {"current": 268435456, "supported": [268435456, 137438953472]}},
             "memory": 103079215104}}
"""
# nvidia-smi's matrices as the GPU probe keys them (nvidia_smi.P2P_*), with what they test.
MATRICES = (("p2p_read", "read"), ("p2p_write", "write"), ("p2p_nvlink", "nvlink"))
# Read and write decide a pair's verdict; NVLink "NS" only says the pair talks over PCIe.
DECIDING = ("read", "write")
ALL_OK = "OK"


KEYS = ("min_gbps", "nccl_tests", "min_busbw_gbps")


def _gbps_problem(key: str, gbps: Any) -> list:
    if gbps is not None and (isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not 0 < gbps < math.inf):
        return [(key, "gpu_p2p.%s must be a number > 0 (GB/s, finite) or null, got %r" % (key, gbps))]
    return []


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["gpu_p2p"]``: ``{min_gbps, min_busbw_gbps: number > 0 or None, nccl_tests:
    the all_reduce_perf to run or None}``; a bus bandwidth floor needs the all_reduce_perf that measures it."""
    if want is None:
        return []
    if not isinstance(want, dict):
        return [("", "gpu_p2p must be a mapping with the keys %s, got %r" % (", ".join(KEYS), want))]
    unknown = sorted(set(want) - set(KEYS), key=str)
    out = [("", "gpu_p2p: unknown key(s) %s; allowed: %s" % (", ".join(map(str, unknown)), ", ".join(KEYS)))] \
        if unknown else []
    out += _gbps_problem("min_gbps", want.get("min_gbps")) + _gbps_problem("min_busbw_gbps", want.get("min_busbw_gbps"))
    path = want.get("nccl_tests")
    why = nccl_tests.path_problem(path) if path is not None else None
    if why:
        out.append(("nccl_tests", "gpu_p2p." + why))
    if want.get("min_busbw_gbps") is not None and path is None:
        out.append(("min_busbw_gbps", "gpu_p2p.min_busbw_gbps needs nccl_tests (the all_reduce_perf that measures the "
                                      "bus bandwidth), which is unset"))
    return out


def validate(want: Any) -> dict:
    """``desired["gpu_p2p"]`` with every key of ``KEYS`` (None where not given); EvaluationError naming what is
    allowed."""
    problems = desired_problems(want)
    if problems:
        raise family.EvaluationError(family.problems_text(problems))
    return {k: (want or {}).get(k) for k in KEYS}


def parse_nvbandwidth(text: str | None) -> dict:
    """The GPU x GPU matrix of ``nvbandwidth -t device_to_device_memcpy_read_ce``: ``{(row, col): GB/s}``.

    nvbandwidth prints ``memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)`` (the arrow points the
    other way in v0.8), a header of column indices, then one line per row index, indented or not. The
    diagonal is not a pair: before v0.2 it reads ``0.00``, later ``N/A`` (an unmeasured pair too); both
    are left out.
    """
    lines = (text or "").splitlines()
    start = next((i for i, line in enumerate(lines) if "bandwidth (GB/s)" in line and "GPU(row)" in line), None)
    if start is None:
        start = next((i for i, line in enumerate(lines) if "bandwidth (GB/s)" in line), None)
    if start is None or start + 1 >= len(lines):
        return {}
    cols = [int(c) for c in lines[start + 1].split() if c.isdigit()]
    out = {}
    for line in lines[start + 2:]:
        fields = line.split()
        if not fields or not fields[0].isdigit():
            break
        row = int(fields[0])
        for col, cell in zip(cols, fields[1:]):
            if col != row and re.match(r"^\d+(\.\d+)?$", cell):
                out[(row, col)] = float(cell)
    return out


def nvbandwidth_arrow(text: str | None) -> str:
    """The direction nvbandwidth printed for its matrix: ``<-`` (row reads from column) or ``->``."""
    m = re.search(r"GPU\(row\)\s*(<-|->|<->)\s*GPU\(column\)", text or "")
    return m.group(1) if m else "<-"


def nvbandwidth_waived(text: str | None) -> str | None:
    """The device-to-device test nvbandwidth waived (``Waiving device_to_device_memcpy_read_ce.``: the GPUs
    cannot map each other's memory), None when it waived none."""
    m = re.search(r"^Waiving (device_to_device_\S+?)\.?$", text or "", re.MULTILINE)
    return m.group(1) if m else None


def read(node: Node, selector: pci.DeviceSelector | None = None, query: Any = None) -> dict:
    """The family's facts (``facts["gpu_p2p"]``): per GPU the bridges above it that redirect peer traffic."""
    selector = selector or pci.DeviceSelector()
    devices = pci.listed(node, query)
    bars = {d["bdf"]: pci_bar.read_gpu(dict(d, vendor_name=pci.gpu_vendor(d))) for d in devices
            if pci.gpu_vendor(d) and selector.matches(d)}
    return {"redirect": pci_isolation.redirecting_bridges(node, selector, devices), "bars": bars}


def _redirecting(facts: dict) -> dict:
    """``{gpu bdf: [bridge bdf, ...]}``: bridges above each GPU with ACS ReqRedir or CmpltRedir on."""
    return dict((facts.get(NAME) or {}).get("redirect") or {})


def _row(name: str, running: Any, state: str, reason: str, desired: Any = ALL_OK) -> dict:
    return family.setting(NAME, name, desired, running, state, reason)


def _matrices(smi: dict) -> tuple:
    """``({kind: parse_p2p result}, [unsupported rows])`` of the read, write and NVLink matrices."""
    parsed, rows = {}, []
    for key, kind in MATRICES:
        res = smi.get(key)
        if not res:
            continue  # an older probe without the NVLink matrix
        if res.get("rc", 0) != 0 or res.get("timed_out"):
            rows.append(_row(kind, None, "unsupported", smi_failure(res, "nvidia-smi topo -p2p %s" % kind[0])))
            continue
        parsed[kind] = parse_p2p(res.get("stdout"))
    return parsed, rows


def _label(name: str, bdfs: dict) -> str:
    return "%s (%s)" % (name, bdfs[name]) if name in bdfs else name


def _pair_row(a: str, b: str, parsed: dict, bdfs: dict, redirect: dict) -> dict | None:
    """A pair that is not OK for read or write, in either direction: a drifted row with the reasons."""
    cells, bad = {}, []
    for kind, matrix in parsed.items():
        for p in matrix["pairs"]:
            if {p["a"], p["b"]} == {a, b}:
                cells.setdefault(kind, set()).add(p["status"])
                if kind in DECIDING and p["status"] != ALL_OK:
                    bad.append("%s %s->%s %s (%s)" % (kind, p["a"], p["b"], p["status"], p["meaning"]))
    if not bad:
        return None
    running = ", ".join("%s %s" % (k, "/".join(sorted(cells[k]))) for _key, k in MATRICES if k in cells)
    why = ["P2P between %s and %s is not OK: %s" % (_label(a, bdfs), _label(b, bdfs), "; ".join(bad))]
    for gpu in (a, b):
        bridges = redirect.get(bdfs.get(gpu, ""))
        if bridges:
            why.append("ACS redirect is on above %s (bridge %s)" % (_label(gpu, bdfs), ", ".join(bridges)))
    return _row("%s-%s" % (a, b), running, "drifted", "; ".join(why))


def _gpu_bdfs(smi: dict) -> dict:
    """``{"GPU0": bdf}`` from the nvidia-smi query (topo numbers GPUs as nvidia-smi indexes them)."""

    return {"GPU%d" % g["index"]: g["bdf"] for g in parse_gpu_query((smi.get("query") or {}).get("stdout"))}


def pair_rows(facts: dict, smi: dict) -> list:
    """One drifted row per GPU pair not OK, else one applied summary row; unsupported rows for failed matrices."""
    parsed, rows = _matrices(smi)
    if not all(k in parsed for k in DECIDING):
        return rows or [_row("pairs", None, "unsupported", "nvidia-smi gave no P2P read/write matrix")]
    names = parsed["read"]["gpus"]
    if len(names) < 2:
        return rows + [_row("pairs", None, "not_applicable", "fewer than 2 GPUs (%d): no GPU pair" % len(names))]
    bdfs, redirect = _gpu_bdfs(smi), _redirecting(facts)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    bad = [r for r in (_pair_row(a, b, parsed, bdfs, redirect) for a, b in pairs) if r]
    if bad:
        return rows + bad
    nvlink = sorted({p["status"] for p in (parsed.get("nvlink") or {}).get("pairs", [])})
    note = " (NVLink: %s)" % "/".join(nvlink) if nvlink else ""
    running = "read OK, write OK on all %d pairs of %d GPUs" % (len(pairs), len(names))
    return rows + [_row("pairs", running, "applied", "every GPU pair can read and write its peer directly%s" % note)]


def bandwidth_rows(bench: dict | None, min_gbps: float, bdfs: dict) -> list:
    """Measured pair bandwidths against ``min_gbps``: a drifted row per slow pair, else one applied row."""
    want = ">= %g GB/s" % min_gbps
    if not bench:
        return [_row("bandwidth", None, "unsupported", "nvbandwidth was not run", want)]
    if bench.get("rc") == 127:
        return [_row("bandwidth", None, "unsupported", bench.get("stderr") or "nvbandwidth is not installed", want)]
    text = bench.get("stdout") or ""
    values = parse_nvbandwidth(text)
    waived = nvbandwidth_waived(text)
    if waived:
        return [_row("bandwidth", "waived", "drifted", "nvbandwidth waived %s: the GPUs cannot map each other's memory "
                     "(no peer-to-peer access)" % waived, want)]
    if bench.get("rc", 0) != 0 or bench.get("timed_out") or not values:
        if bench.get("timed_out"):
            why = (bench.get("stderr") or "").strip().splitlines()[-1]
        else:
            why = (bench.get("stderr") or text).strip()[-300:] or "no bandwidth matrix"
        return [_row("bandwidth", None, "drifted", "nvbandwidth -t %s (rc %s): %s"
                     % (NVBANDWIDTH_TEST, bench.get("rc"), why), want)]
    slow = [(r, c, v) for (r, c), v in sorted(values.items()) if v < min_gbps]
    if not slow:
        return [_row("bandwidth", "min %.2f GB/s" % min(values.values()), "applied",
                     "%d GPU pairs measured by nvbandwidth (%s)" % (len(values), NVBANDWIDTH_TEST), want)]
    arrow = nvbandwidth_arrow(text)
    return [_row("bandwidth.GPU%d-GPU%d" % (r, c), "%.2f GB/s" % v, "drifted",
                 "%s %s %s at %.2f GB/s, below %g GB/s (nvbandwidth %s, GPU(row) %s GPU(column))"
                 % (_label("GPU%d" % r, bdfs), arrow, _label("GPU%d" % c, bdfs), v, min_gbps, NVBANDWIDTH_TEST,
                    arrow), want)
            for r, c, v in slow]


def _gpus(facts: dict, vendor: str) -> list:
    """The selected PCI devices that are GPUs of ``vendor`` (``pci.gpu_vendor``)."""
    return [d for d in (facts.get("pci") or {}).get("devices") or [] if pci.gpu_vendor(d) == vendor]


def evaluate(facts: dict, desired: dict, ctx: Any = None) -> list:
    """The P2P rows of a host; none when ``desired`` has no ``gpu_p2p`` key (the role always asks).

    The answers are ``verify_node.gpu_probe``'s result (``ctx.gpu``, else ``facts["gpu_probe"]``). NVIDIA's rows
    (nvidia-smi) unless the node's selected GPUs are all AMD's; AMD's rows (``amd.*``) where AMD GPUs are selected.
    """
    if NAME not in (desired or {}):
        return []
    want = validate(desired.get(NAME))
    answers = nvidia_smi.probe_answers(getattr(ctx, "gpu", None) or facts.get("gpu_probe"))
    amd = _gpus(facts, "amd")
    rows = nvidia_rows(facts, want, answers) if not amd or _gpus(facts, "nvidia") else []
    return rows + (amd_rows(amd, want, answers, facts) if amd else [])


def _amd_row(name: str, running: Any, state: str, reason: str, desired: Any = ALL_OK) -> dict:
    return family.setting(NAME, "amd." + name, desired, running, state, reason, vendor="amd")


def amd_rows(devices: list, want: dict, answers: dict, facts: dict | None = None) -> list:
    """The AMD GPUs' P2P rows (core/amd_p2p.py): the pairs from amd-smi topology, xgmi -l's links, the bandwidth."""
    if answers.get("probe") == "disabled":
        return [_amd_row("pairs", None, "not_applicable",
                         "GPU checks are disabled (gpunode_tuning_verify_gpu_enabled: false)")]
    rows = amd_p2p.pair_rows(devices, answers, _amd_row)
    if want["min_gbps"] is not None and not any(r["state"] in ("not_applicable", "unsupported") for r in rows):
        rows += amd_p2p.bandwidth_rows(answers.get(amd_p2p.BANDWIDTH_KEY), want["min_gbps"], _amd_row,
                                       (amd_p2p.topology_links(answers) or {}).get("bdf"))
    if want["nccl_tests"] is not None:
        rows += nccl_tests.rows(answers.get(nccl_tests.KEY), want["nccl_tests"], want["min_busbw_gbps"], _amd_row)
    return rows + amd_bar_rows(facts, answers)


def amd_bar_rows(facts: dict, answers: dict) -> list:
    """AMD GPUs' BAR0 (the VRAM aperture a PCIe peer maps: amdgpu lets a peer reach a GPU over PCIe only when BAR0
    shows all of its VRAM, "large BAR", amdgpu_device_is_peer_accessible): judged as NVIDIA's BAR1 where the GPUs
    are not all linked by XGMI; not_applicable where they are (peers reach each other's memory over XGMI). None
    without amd-smi's topology (the link type unknown: the pairs row already says why)."""
    bars = (facts.get(NAME) or {}).get("bars")
    link_map = amd_p2p.topology_links(answers)
    if bars is None or not link_map:
        return []  # facts read before the BAR check, or no topology
    kinds = {(link.get("link_type") or "").upper() for link in ((link_map or {}).get("pairs") or {}).values()}
    if kinds == {"XGMI"}:
        return [_amd_row("bar0", None, "not_applicable", "the GPUs are linked by XGMI (amd-smi topology): peers reach "
                         "each other's memory over XGMI, not through the PCIe BAR0", ">= the GPU's memory")]
    return pci_bar.peer_bar_rows(bars, "amd", _amd_row)


def nvidia_rows(facts: dict, want: dict, smi: dict) -> list:
    """NVIDIA's rows: the pairs of nvidia-smi's P2P matrices, and nvbandwidth's pairs with ``min_gbps``."""
    if smi.get("probe") != "present":
        why = {"disabled": "GPU checks are disabled (gpunode_tuning_verify_gpu_enabled: false)",
               "simulated": "simulated node without an nvidia-smi stand-in"}.get(
            smi.get("probe"), "nvidia-smi is not installed on this node (no NVIDIA driver user space)")
        return [_row("pairs", None, "not_applicable", why)]
    if (smi.get("query") or {}).get("rc", 0) != 0:

        return [_row("pairs", None, "unsupported", "the GPUs cannot be listed: %s" % smi_failure(smi["query"]))]
    rows = pair_rows(facts, smi)
    if want["min_gbps"] is not None and not any(r["state"] == "not_applicable" for r in rows):
        rows += bandwidth_rows(smi.get("nvbandwidth"), want["min_gbps"], _gpu_bdfs(smi))
    if want["nccl_tests"] is not None and not any(r["state"] == "not_applicable" for r in rows):
        rows += nccl_tests.rows(smi.get(nccl_tests.KEY), want["nccl_tests"], want["min_busbw_gbps"], _row,
                                lambda a, b: smi_says(smi, a, b))
    return rows + bar_rows(facts)


def smi_says(smi: dict, a: int, b: int) -> str | None:
    """What ``nvidia-smi topo -p2p r`` says of the pair GPU<a>-GPU<b>, for a pair NCCL did not connect directly."""
    names = {"GPU%d" % a, "GPU%d" % b}
    cells = [p for p in parse_p2p((smi.get("p2p_read") or {}).get("stdout"))["pairs"] if {p["a"], p["b"]} == names]
    if not cells:
        return None
    bad = [p for p in cells if p["status"] != ALL_OK]
    if not bad:
        return ("nvidia-smi topo -p2p r says OK for the pair: NCCL's own test refused it (an IOMMU translating peer "
                "traffic, ACS redirect, NCCL_P2P_DISABLE or NCCL_P2P_LEVEL; NCCL's troubleshooting guide)")
    return "nvidia-smi topo -p2p r says %s for the pair too" % ", ".join(
        "%s->%s %s (%s)" % (p["a"], p["b"], p["status"], p["meaning"]) for p in bad)


def bar_rows(facts: dict) -> list:
    """Each NVIDIA GPU's BAR1 (peers map its memory through it) against its memory (core/pci_bar.py)."""
    bars = (facts.get(NAME) or {}).get("bars")
    if bars is None:
        return []  # facts read before the BAR check
    return pci_bar.peer_bar_rows(bars, "nvidia", _row)


def gpu_commands(desired: dict) -> tuple:
    """The GPU list, the topology (the report) and the P2P matrices; nvbandwidth when a floor is wanted. Where AMD
    GPUs are: amd-smi topology and xgmi -l (the health gate's calls, run once), TransferBench with a floor. nccl-tests'
    all_reduce_perf where one is named (``nccl_tests``)."""
    want = (desired or {}).get(NAME) or {}
    floor = want.get("min_gbps") is not None
    nccl = (nccl_tests.command(want["nccl_tests"]),) if want.get("nccl_tests") else ()
    return (nvidia_smi.QUERY, nvidia_smi.TOPOLOGY, nvidia_smi.P2P_READ, nvidia_smi.P2P_WRITE, nvidia_smi.P2P_NVLINK) \
        + ((nvidia_smi.NVBANDWIDTH,) if floor else ()) + amd_p2p.LINK_COMMANDS \
        + ((amd_p2p.BANDWIDTH,) if floor else ()) + nccl


def _status_line(title: str, matrix: dict) -> str:
    """``P2P read: 27 of 28 GPU pairs OK; not OK: GPU0->GPU1 CNS (chipset not supported).``"""
    line = "%s: %d of %d GPU pairs OK" % (title, len(matrix["pairs"]) - len(matrix["not_ok"]), len(matrix["pairs"]))
    if matrix["not_ok"]:
        line += "; not OK: " + ", ".join("%s->%s %s (%s)" % (p["a"], p["b"], p["status"], p["meaning"])
                                         for p in matrix["not_ok"])
    return line + "."


def report(facts: dict, desired: dict, ctx: Any = None) -> str | None:
    """nvidia-smi's topology matrix and the P2P read/write status per GPU pair, where nvidia-smi answered.

    Reported, not judged here (the rows judge the pairs): across sockets ``CNS`` is normal.
    """
    smi = nvidia_smi.probe_answers(getattr(ctx, "gpu", None) or facts.get("gpu_probe"))
    amd = amd_report(smi) if _gpus(facts, "amd") else None
    if nvidia_smi.probe_status(smi, getattr(ctx, "root", "/"))[0] != "present" \
            or (smi.get("query") or {}).get("rc", 0) != 0:
        return amd
    topology = nvidia_smi.strip_ansi((smi.get("topology") or {}).get("stdout") or "").rstrip()
    parts = ["Topology (`nvidia-smi topo -m`):", "", "```", topology, "```", ""]
    for key, title in (("p2p_read", "P2P read"), ("p2p_write", "P2P write")):
        parts.append(_status_line(title, parse_p2p((smi.get(key) or {}).get("stdout"))))
        parts.append("")
    return "\n".join(parts + ([amd] if amd else [])).rstrip()


def amd_report(answers: dict) -> str | None:
    """amd-smi topology's GPU x GPU table (link type and hops per pair), where amd-smi answered."""
    table = amd_p2p.table(amd_p2p.topology_links(answers))
    return "AMD GPUs (`amd-smi topology`: link type and hops; the link status where P2P is not possible):\n\n" \
        + table if table else None


# Read-only: no module, nothing to re-apply at boot.
def from_role(v: dict, shared: dict) -> dict:
    gbps, busbw = v.get("gpunode_tuning_gpu_p2p_min_gbps"), v.get("gpunode_tuning_gpu_p2p_min_busbw_gbps")
    return {NAME: {"min_gbps": None if gbps is None else float(gbps),
                   "nccl_tests": v.get("gpunode_tuning_gpu_p2p_nccl_tests") or None,
                   "min_busbw_gbps": None if busbw is None else float(busbw)}}


def on_node(desired: dict, _node=None) -> dict:
    """``Family.on_node``: what the node keeps (the guard's config) has no bandwidth floor. The guard re-verifies
    a serving node every few minutes; a bandwidth run (nvbandwidth, TransferBench, rocm-bandwidth-test) would load
    every GPU each time (so would nccl-tests: ``nccl_tests`` and its floor go too). The topology and link checks
    stay; verify.yml and the rollout still measure."""
    want = desired.get(NAME)
    if not isinstance(want, dict) or all(want.get(k) is None for k in KEYS):
        return desired
    return dict(desired, **{NAME: dict(want, **{k: None for k in KEYS if k in want or k == "min_gbps"})})


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "GPU P2P"},
    read=read,
    facts_doc=FACTS_DOC,
    evaluate=family.with_vendor(evaluate, "nvidia"),  # nvidia-smi's settings and P2P status
    gpu_commands=gpu_commands,
    from_role=from_role,
    validate={NAME: desired_problems},
    on_node=on_node,
    report=report,
)
