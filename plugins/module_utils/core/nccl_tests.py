# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""NCCL's own verdict on GPU peer-to-peer: nccl-tests' ``all_reduce_perf`` (rccl-tests' on AMD), read-only (issue 44).

Inference engines move tensors with NCCL (RCCL on AMD). NCCL can fall back to host memory (``via SHM``) when
peer-to-peer is refused, even where ``nvidia-smi topo -p2p`` says OK (NCCL's troubleshooting guide), and loses
most of its bus bandwidth there. The P2P check (families/gpu_p2p.py) runs the ``all_reduce_perf`` the user names
(``gpunode_tuning_gpu_p2p_nccl_tests``; never installed) across the node's GPUs, ``ARGS``: 8 bytes to 1 GiB,
doubling, one process driving every GPU (``-g``: the GPUs on the bus), validation on (nccl-tests' default), with
``NCCL_DEBUG=INFO`` so that NCCL names the transport it chose for each peer. Bounded by the ``nccl_tests``
command timeout. What is read (nccl-tests' src/common.cu prints it, rccl-tests the same):

- the result table: ``size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong`` (out of
  place, then in place; older releases have no ``root`` column and an ``error`` column instead of ``#wrong``), its
  lines possibly tagged by mpirun (``[1,0]<stdout>:``); busbw is the bandwidth normalised to what each link carries
  (nccl-tests' doc/PERFORMANCE.md: for all-reduce, algbw x 2(n-1)/n), comparable across GPU counts;
- ``# Avg bus bandwidth    : 6.13096`` and ``# Out of bounds values : 0 OK``;
- ``#  Rank  0 Group  0 Pid 3884652 on host device  0 [0000:12:00] NVIDIA L20``: which GPU each rank drives;
- NCCL's INFO lines ``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC`` (``via P2P/CUMEM``, ``P2P/direct pointer``,
  ``SHM/direct/direct``, ``NET/IB/0``, ...; ``Channel 00 : 0[1000] -> 1[3000]`` with bus ids before 2.12,
  ``Ring 00 :`` before 2.4): the transport of each connection from one rank to another.

Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import GPU_COUNT_ARG, GpuCommand

KEY = "nccl_tests"
# 8 B to 1 GiB, doubling: the small sizes show the latency, the large ones the bandwidth a PCIe or NVLink path
# settles at (busbw is flat from a few hundred MiB on); one process, every GPU (-g).
ARGS = ("-b", "8", "-e", "1G", "-f", "2", "-g", GPU_COUNT_ARG)
ENV = (("NCCL_DEBUG", "INFO"),)
# The names the binary may have (nccl-tests' and rccl-tests' build; NAME_SUFFIX=_mpi of an MPI build).
BINARIES = ("all_reduce_perf", "all_reduce_perf_mpi")
MISSING = ("%s not found on the node: build nccl-tests (github.com/NVIDIA/nccl-tests; rccl-tests on AMD) and set "
           "gpunode_tuning_gpu_p2p_nccl_tests to its all_reduce_perf")
# Transports that are not a direct GPU-to-GPU path: host memory, or a network card between two GPUs of one node.
HOST_MEMORY = "SHM"
NOT_PEER = (HOST_MEMORY, "NET")

_MPI_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)")
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)"
                   r"\s+\[([^\]]*)\]\s*(.*)$")
_VIA = re.compile(r"(?:Channel|Ring)\s+(\d+)(?:/(\d+))?\s*:\s*(\d+)(?:\[([0-9a-fA-Fx]+)\])?\s*->\s*(\d+)"
                  r"(?:\[([0-9a-fA-Fx]+)\])?\s*(?:\[(send|receive)\]\s*)?via\s+(.+?)\s*(?:comm 0x\w+.*)?$")
_FLOAT = re.compile(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?$")


def command(path: str) -> GpuCommand:
    """The probe's command for ``gpunode_tuning_gpu_p2p_nccl_tests``: an absolute path below the node's root, or a
    name looked up on PATH."""
    return GpuCommand(KEY, ARGS, tool=path, package="nccl-tests", missing=MISSING % path, standalone=True, env=ENV)


def path_problem(path) -> str | None:
    """Why ``path`` cannot be the ``all_reduce_perf`` to run (None: it can)."""
    if not isinstance(path, str) or not path.strip() or any(c.isspace() for c in path):
        return "nccl_tests must be the path (or name on PATH) of nccl-tests' all_reduce_perf, got %r" % (path,)
    if os.path.basename(path) not in BINARIES:
        return ("nccl_tests must name the all_reduce_perf binary (%s; its timeout is command_timeouts.nccl_tests), "
                "got %r" % (" or ".join(BINARIES), path))
    return None


def _number(text: str):
    return float(text) if _FLOAT.match(text) else None


def _wrong(text: str):
    """``#wrong``: a count (an asterisk marks one over rccl-tests' threshold); None for N/A or an older max error."""
    text = text.rstrip("*")
    return int(text) if text.isdigit() else None


def parse_row(line: str) -> dict | None:
    """One line of the result table: ``{size, count, type, redop, root, oop: {time, algbw, busbw, wrong},
    ip: {...} or None}``; None for any other line."""
    fields = line.split()
    if len(fields) < 8 or not fields[0].isdigit() or not fields[1].isdigit() or fields[2][:1].isdigit():
        return None
    rest = fields[4:]
    if len(rest) not in (4, 5, 8, 9):
        return None
    root = rest.pop(0) if len(rest) in (5, 9) else None
    parts = []
    for chunk in (rest[:4], rest[4:8]):
        if not chunk:
            parts.append(None)
            continue
        values = [_number(v) for v in chunk[:3]]
        if None in values:
            return None
        parts.append({"time": values[0], "algbw": values[1], "busbw": values[2], "wrong": _wrong(chunk[3])})
    return {"size": int(fields[0]), "count": int(fields[1]), "type": fields[2], "redop": fields[3], "root": root,
            "oop": parts[0], "ip": parts[1]}


def parse(text: str | None) -> dict:
    """``all_reduce_perf``'s output: ``{rows, avg_busbw, out_of_bounds: (count, word) or None, ranks: {rank:
    {host, device, bus, name}}, links: [{channel, src, dst, src_id, dst_id, direction, via, transport}]}``."""
    out = {"rows": [], "avg_busbw": None, "out_of_bounds": None, "ranks": {}, "links": []}
    for raw in (text or "").splitlines():
        line = _MPI_TAG.sub("", raw).strip()
        m = _VIA.search(line)
        if m and ("NCCL INFO" in line or line.startswith(("Channel", "Ring"))):
            via = m.group(8)
            out["links"].append({"channel": m.group(1), "src": int(m.group(3)), "dst": int(m.group(5)),
                                 "src_id": m.group(4), "dst_id": m.group(6), "direction": m.group(7), "via": via,
                                 "transport": via.split("/")[0].split()[0].upper()})
            continue
        m = _RANK.match(line)
        if m:
            out["ranks"][int(m.group(1))] = {"host": m.group(2), "device": int(m.group(3)), "bus": m.group(4),
                                             "name": m.group(5).strip()}
            continue
        m = _AVG.match(line)
        if m and _number(m.group(1)) is not None:
            out["avg_busbw"] = float(m.group(1))
            continue
        m = _OOB.match(line)
        if m:
            out["out_of_bounds"] = (int(m.group(1)), m.group(2))
            continue
        row = parse_row(line)
        if row:
            out["rows"].append(row)
    return out


def largest(parsed: dict) -> dict | None:
    """The table's row of the largest size (the last one of that size)."""
    rows = parsed.get("rows") or []
    return max(reversed(rows), key=lambda r: r["size"]) if rows else None


def gpu_label(parsed: dict, rank: int) -> str:
    """``GPU4 (0000:91:00)``: the CUDA/HIP device a rank drives and its bus as nccl-tests printed them."""
    info = (parsed.get("ranks") or {}).get(rank)
    if not info:
        return "rank %d" % rank
    return "GPU%d (%s)" % (info["device"], info["bus"]) if info["bus"] else "GPU%d" % info["device"]


def same_host(parsed: dict, a: int, b: int) -> bool:
    """Whether two ranks run on one node, as nccl-tests' ``# Using devices`` lines say (unknown: False)."""
    ranks = parsed.get("ranks") or {}
    return a in ranks and b in ranks and ranks[a]["host"] == ranks[b]["host"]


def not_peer_pairs(parsed: dict) -> dict:
    """``{(rank, rank): {"transports": [via, ...], "channels": [..]}}`` (the lower rank first) of the connections
    between two GPUs of one node that do not go GPU to GPU: host memory (SHM, always within a node), or a network
    card (NET) between two ranks that ``# Using devices`` puts on one host (else NET is the way to another node)."""
    out: dict = {}
    for link in parsed.get("links") or []:
        if link["transport"] not in NOT_PEER or link["src"] == link["dst"]:
            continue
        if link["transport"] != HOST_MEMORY and not same_host(parsed, link["src"], link["dst"]):
            continue
        pair = out.setdefault(tuple(sorted((link["src"], link["dst"]))), {"transports": [], "channels": []})
        for key, value in (("transports", link["via"]), ("channels", link["channel"])):
            if value not in pair[key]:
                pair[key].append(value)
    return out


def transports(parsed: dict) -> list:
    """The distinct ``via`` of the connections, in order of first sight."""
    return list(dict.fromkeys(link["via"] for link in parsed.get("links") or []))


def _failure(answer: dict, path: str) -> str | None:
    """Why the run gave no verdict (its hang, its exit and last words, or no table), None when it did."""
    text = answer.get("stdout") or ""
    if answer.get("timed_out"):
        return (answer.get("stderr") or "").strip().splitlines()[-1]
    run = "%s %s" % (path, " ".join(ARGS).replace(GPU_COUNT_ARG, "<GPUs>"))
    if answer.get("rc", 0) != 0:
        tail = " ".join(((answer.get("stderr") or "").strip() or text.strip())[-300:].split())
        return "%s failed (rc %s): %s" % (run, answer.get("rc"), tail or "no message")
    if not parse(text)["rows"]:
        return "%s printed no result table (rc 0): no bus bandwidth measured" % run
    return None


def _measured(parsed: dict) -> str:
    row = largest(parsed)
    ip = " (in place %.2f)" % row["ip"]["busbw"] if row["ip"] else ""
    avg = "; # Avg bus bandwidth %g GB/s" % parsed["avg_busbw"] if parsed["avg_busbw"] is not None else ""
    return "busbw %.2f GB/s at %d bytes out of place%s%s" % (row["oop"]["busbw"], row["size"], ip, avg)


def pair_rows(parsed: dict, make, p2p_of=None) -> list:
    """A drifted row ``nccl.GPU<a>-GPU<b>`` per pair of GPUs NCCL connected through host memory or a network card.
    ``p2p_of(device, device)``: what the driver's own P2P check says of the pair (None: not known)."""
    out = []
    for (a, b), seen in sorted(not_peer_pairs(parsed).items()):
        ranks = parsed.get("ranks") or {}
        dev = [ranks[r]["device"] if r in ranks else r for r in (a, b)]
        said = p2p_of(dev[0], dev[1]) if p2p_of else None
        why = ("NCCL connected %s and %s through %s (channels %s), not GPU to GPU: P2P between them is refused or "
               "disabled" % (gpu_label(parsed, a), gpu_label(parsed, b), ", ".join(seen["transports"]),
                             ", ".join(seen["channels"])))
        if said:
            why += "; %s" % said
        out.append(make("nccl.GPU%d-GPU%d" % (dev[0], dev[1]), ", ".join(seen["transports"]), "drifted", why,
                        "P2P"))
    return out


def rows(answer: dict | None, path: str, floor: float | None, make, p2p_of=None) -> list:
    """The NCCL rows of ``all_reduce_perf``'s answer: ``nccl.busbw`` (drifted below ``floor``, GB/s at the largest
    size), ``nccl.wrong`` (wrong values: the data did not arrive intact), ``nccl.GPUa-GPUb`` per pair through host
    memory (judged on whatever NCCL printed, a run that failed or hung included); a drifted ``nccl`` row for a run
    that gave no table; one applied ``nccl`` row when none fails. ``make(name, running, state, reason, desired)``."""
    want = ">= %g GB/s busbw" % floor if floor is not None else "P2P"
    if not answer:
        return [make("nccl", None, "unsupported", "all_reduce_perf was not run", want)]
    if answer.get("rc") == 127:
        return [make("nccl", None, "unsupported", answer.get("stderr") or MISSING % path, want)]
    parsed = parse(answer.get("stdout"))
    pairs = pair_rows(parsed, make, p2p_of)
    why = _failure(answer, path)
    if why:
        return [make("nccl", None, "drifted", why, want)] + pairs
    out = _table_rows(parsed, floor, make, want) + pairs
    if out:
        return out
    seen = transports(parsed)
    how = ("NCCL connected the GPUs via %s" % ", ".join(sorted({v.split()[0] for v in seen})) if seen else
           "NCCL printed no transport (NCCL_DEBUG=INFO lines missing): the transports are not judged")
    return [make("nccl", "%.2f GB/s" % largest(parsed)["oop"]["busbw"], "applied", "all_reduce_perf across %s: "
                 "%s; %s" % (_gpus(parsed), _measured(parsed), how), want)]


def _gpus(parsed: dict) -> str:
    return "%d GPUs" % len(parsed["ranks"]) if parsed["ranks"] else "the GPUs"


def _table_rows(parsed: dict, floor: float | None, make, want: str) -> list:
    """``nccl.busbw`` below the floor and ``nccl.wrong`` (wrong values, out of bounds values not OK)."""
    out = []
    busbw = largest(parsed)["oop"]["busbw"]
    if floor is not None and busbw < floor:
        out.append(make("nccl.busbw", "%.2f GB/s" % busbw, "drifted", "all_reduce_perf across %s: %s, below the "
                        "floor %g GB/s" % (_gpus(parsed), _measured(parsed), floor), want))
    wrong = sum((r[p] or {}).get("wrong") or 0 for r in parsed["rows"] for p in ("oop", "ip"))
    bounds = parsed["out_of_bounds"]
    if wrong or (bounds and bounds[1] != "OK"):
        out.append(make("nccl.wrong", "%d wrong" % wrong, "drifted", "all_reduce_perf found wrong values (%d in the "
                        "table; out of bounds values: %s): data between the GPUs arrived corrupted"
                        % (wrong, " ".join(map(str, bounds)) if bounds else "not printed"), "0 wrong"))
    return out
