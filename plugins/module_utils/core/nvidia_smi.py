# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Talking to nvidia-smi across drivers: which fields the driver knows, a query that survives one it does not.

nvidia-smi refuses a whole ``--query-gpu`` when one field is unknown to the running driver: exit 2 and
``Field "NAME" is not a valid field to query.`` on stdout (stderr empty). ``clocks_event_reasons.*``
exist from R535 on (older drivers know only ``clocks_throttle_reasons.*``, newer ones both); R465-era
drivers and non-datacenter GPUs lack ``remapped_rows.*``. So a query here is built from the fields the
driver lists in ``nvidia-smi --help-query-gpu`` (``"a" or "b"`` lines, aliases included), uses the old
throttle name where only it exists, and drops a field the driver still refuses, retrying once per
refusal: a field the driver lacks costs only the rows that need it (``missing``).

A driver that does not answer (killed at the timeout, exit 9 "couldn't communicate with the NVIDIA
driver", NVML that cannot initialise) is ``driver_down``: the callers stop asking it more questions.

Plain Python (3.8+), no Ansible import. Captures of real output: tests/data/real/.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import GpuCommand

HELP_ARGS = ["--help-query-gpu"]
CSV_FORMAT = "--format=csv,noheader,nounits"
# The renamed clock reason fields: new name -> the name older drivers (before R535) know.
OLD_NAMES = {"clocks_event_reasons.": "clocks_throttle_reasons."}
# What nvidia-smi prints in a cell for a GPU it lost track of (a GPU off the bus, a wedged driver).
LOST_VALUES = ("[Unknown Error]", "[GPU is lost]")
DEPRECATED = "[Requested functionality has been deprecated]"
# nvidia-smi's exit codes (nvidia-smi(1) RETURN VALUE) that mean the driver does not answer at all.
DRIVER_DOWN_RC = {9: "NVIDIA driver is not loaded", 12: "NVML shared library could not be loaded",
                  15: "a GPU is lost (fallen off the bus?)", 255: "unknown error"}
_DRIVER_DOWN_TEXT = ("couldn't communicate with the nvidia driver", "failed to initialize nvml",
                     "unable to determine the device handle", "gpu is lost")
_HELP_LINE = re.compile(r'^"([A-Za-z0-9_.\[\]]+)"((?:\s+or\s+"[A-Za-z0-9_.\[\]]+")*)\s*$')
_ALIAS = re.compile(r'"([A-Za-z0-9_.\[\]]+)"')
_REFUSED = re.compile(r'Field "([^"]+)" is not a valid field to query')
_BDF = re.compile(r"^0*([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$")


def parse_help_fields(text: str | None) -> set | None:
    """The field names (and aliases) ``nvidia-smi --help-query-gpu`` lists; None when it lists none."""
    names = set()
    for line in (text or "").splitlines():
        m = _HELP_LINE.match(line.strip())
        if m:
            names.update(_ALIAS.findall(line))
    return names or None


def refused_field(result: Any) -> str | None:
    """The field nvidia-smi refused (``Field "X" is not a valid field to query.``), None for another failure."""
    if not result or result[0] == 0:
        return None
    m = _REFUSED.search("%s\n%s" % (result[1] or "", result[2] or ""))
    return m.group(1) if m else None


def driver_down(result: Any) -> str | None:
    """Why the driver does not answer at all (a hang, exit 9, NVML down), None for any other result."""
    if command.timed_out(result):
        return command.failure("nvidia-smi", result)
    if not result or result[0] == 0 or refused_field(result):
        return None
    text = "%s %s" % (result[1] or "", result[2] or "")
    if result[0] in DRIVER_DOWN_RC or any(t in text.lower() for t in _DRIVER_DOWN_TEXT):
        return command.failure("nvidia-smi", result)
    return None


def old_name(field: str) -> str | None:
    """The name a pre-R535 driver knows for ``field`` (clocks_throttle_reasons.*), None when not renamed."""
    for new, old in OLD_NAMES.items():
        if field.startswith(new):
            return old + field[len(new):]
    return None


def plan(wanted: tuple, known: set | None) -> tuple:
    """``([(field, name to query)], [fields the driver lacks])``: the old name where only it is known."""
    if known is None:  # no field list: ask for everything, refusals decide (``query``)
        return [(f, f) for f in wanted], []
    asked, missing = [], []
    for field in wanted:
        alt = old_name(field)
        if field in known:
            asked.append((field, field))
        elif alt and alt in known:
            asked.append((field, alt))
        else:
            missing.append(field)
    return asked, missing


def _without(asked: list, refused: str) -> tuple:
    """The plan after a refusal: the old name instead of a new one, else without the field."""
    out = []
    dropped = None
    for field, name in asked:
        if name != refused:
            out.append((field, name))
        elif old_name(name):
            out.append((field, old_name(name)))
        else:
            dropped = field
    return out, dropped


def query(run: Callable[[list], Any], smi: str, wanted: tuple, known: set | None = None,
          required: tuple = ("index", "pci.bus_id")) -> dict:
    """``nvidia-smi --query-gpu`` of ``wanted``, negotiated: ``{rc, stdout, stderr, timed_out, fields, missing}``.

    ``fields``: the columns of ``stdout``, in order, by the names asked for (a column asked by its old
    name is keyed by the new one); ``missing``: the wanted fields the driver does not know.
    """
    asked, missing = plan(tuple(wanted), known)
    result = None
    for _attempt in range(len(wanted) + 1):
        result = run([smi, "--query-gpu=" + ",".join(name for _f, name in asked), CSV_FORMAT])
        refused = refused_field(result)
        if refused is None or refused in required:
            break
        asked, dropped = _without(asked, refused)
        if dropped:
            missing.append(dropped)
        if not asked:
            break
    return {"rc": result[0], "stdout": result[1], "stderr": result[2], "timed_out": command.timed_out(result),
            "fields": [f for f, _n in asked], "missing": [f for f in wanted if f in missing]}


def normalize_bus_id(bus_id: str) -> str:
    """nvidia-smi's 8-digit domain (00000000:41:00.0) as sysfs writes it (0000:41:00.0)."""
    text = (bus_id or "").strip().lower()
    m = _BDF.match(text)
    return m.group(1) if m else text


def parse_csv(text: str | None, fields: list) -> tuple:
    """``(gpus, unparsed lines)`` of a ``--format=csv,noheader`` answer with the columns ``fields``.

    A GPU row has one cell per field, a decimal ``index`` and a PCI ``pci.bus_id`` (when asked); every other
    non-empty line (fewer columns than asked, an error line of a lost GPU) is returned as unparsed.
    """
    gpus, unparsed = [], []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        row = dict(zip(fields, parts))
        ok = len(parts) == len(fields) and (("index" not in row) or row["index"].isdigit())
        if ok and "pci.bus_id" in row:
            row["bdf"] = normalize_bus_id(row["pci.bus_id"])
            ok = bool(_BDF.match(row["bdf"]))
        if ok:
            gpus.append(row)
        else:
            unparsed.append(line.strip())
    return gpus, unparsed


def lost_fields(gpu: dict) -> list:
    """The fields of a GPU row whose cell says the GPU is lost (``[Unknown Error]``, ``[GPU is lost]``)."""
    return sorted(k for k, v in gpu.items() if v in LOST_VALUES)


def mismatch(unparsed: list, fields: list) -> str:
    """What an answer that does not match the query looks like, for a message."""
    first = unparsed[0]
    return ("nvidia-smi answered %d line(s) that do not match the query of %d field(s) (%s): %r"
            % (len(unparsed), len(fields), ", ".join(fields[:4]) + (", ..." if len(fields) > 4 else ""),
               first[:200]))


# --- the GPU tools' vocabulary the GPU families and verification share (named core pieces) ---

# nvidia-smi --query-gpu fields of the health check, in the order of the CSV columns. Each one the driver
# does not know is left out (nvidia_smi.query) and costs only the rows that need it.
HEALTH_FIELDS = (
    "index", "pci.bus_id", "persistence_mode", "ecc.mode.current", "ecc.mode.pending",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure",
    "power.limit", "power.default_limit", "power.max_limit", "clocks_event_reasons.active",
    "utilization.gpu", "driver_version",
) + (
    # gpu_settings' clock rows; last, and optional in parse_health: a probe stored before them still parses.
    "clocks.current.graphics", "clocks.applications.graphics", "clocks.applications.memory",
)


DCGM_ARGS = ["diag", "-r", "1"]


def parse_health(text: str | None, fields: list | None = None) -> list:
    """The CSV of the health query: one dict per GPU keyed by field name, plus ``bdf``.

    ``fields``: the columns asked for (the probe's ``fields``); without them, the columns of ``HEALTH_FIELDS``
    (a probe stored before the clock fields has three fewer).
    """
    if fields is None:
        short = list(HEALTH_FIELDS[:-3])
        gpus = parse_csv(text, list(HEALTH_FIELDS))[0]
        return gpus or parse_csv(text, short)[0]
    return parse_csv(text, list(fields))[0]


NVBANDWIDTH_TEST = "device_to_device_memcpy_read_ce"


NVBANDWIDTH_ARGS = ["-t", NVBANDWIDTH_TEST]


# --- nvidia-smi topo matrices, the GPU list, a failed call (verification and the GPU families) ---

# The codes of nvidia-smi topo -p2p, as its legend spells them (drivers 525-610); a legend the output
# prints itself explains a code missing here (parse_p2p).
P2P_LEGEND = {
    "X": "self",
    "OK": "ok",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}
# ANSI escapes (drivers 590-610 underline the topo header row even when stdout is a file or a pipe).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_LEGEND_LINE = re.compile(r"^\s*([A-Z#]+)\s+=\s+(.+?)\s*$")


def strip_ansi(text: str | None) -> str:
    """``text`` without ANSI escape sequences."""
    return _ANSI.sub("", text or "")


def _matrix(text):
    """GPU x GPU cells of an ``nvidia-smi topo`` matrix: ``(names, {(row, col): cell})``.

    Tolerant of what real output and pastes of it look like: ANSI escapes around the header, tabs or
    runs of spaces, a leading space or indentation, a trailing tab, NIC rows and columns after the GPUs,
    a legend with or without a blank line before it.
    """
    names = []
    cells = {}
    for line in strip_ansi(text).splitlines():
        fields = line.replace("\t", " ").split()
        if not fields:
            if names and cells:
                break
            continue
        if fields[0] == "Legend:":
            break
        if not names:
            if re.match(r"^GPU\d+$", fields[0]):
                names = [f for f in fields if re.match(r"^GPU\d+$", f)]
            continue
        if re.match(r"^GPU\d+$", fields[0]):
            row = fields[0]
            for col, cell in zip(names, fields[1:1 + len(names)]):
                cells[(row, col)] = cell
    return names, cells


def parse_legend(text: str | None) -> dict:
    """``{code: meaning}`` of the legend an ``nvidia-smi topo`` output prints below its matrix."""
    out = {}
    lines = strip_ansi(text).splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Legend:"), None)
    for line in lines[start + 1:] if start is not None else []:
        m = _LEGEND_LINE.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def parse_topology(text: str | None) -> dict:
    """``nvidia-smi topo -m``: ``{gpus, links: [{a, b, link}]}`` for each unordered GPU pair."""
    names, cells = _matrix(text)
    links = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if (a, b) in cells:
                links.append({"a": a, "b": b, "link": cells[(a, b)]})
    return {"gpus": names, "links": links}


def parse_p2p(text: str | None) -> dict:
    """``nvidia-smi topo -p2p r|w``: ``{gpus, pairs: [{a, b, status, meaning}], not_ok: [...]}``.

    Pairs are ordered (a -> b); the diagonal is left out.
    """
    names, cells = _matrix(text)
    legend = parse_legend(text)
    pairs = []
    for a in names:
        for b in names:
            if a == b or (a, b) not in cells:
                continue
            status = cells[(a, b)]
            meaning = P2P_LEGEND.get(status) or (legend.get(status) or "unknown code").lower()
            pairs.append({"a": a, "b": b, "status": status, "meaning": meaning})
    return {"gpus": names, "pairs": pairs, "not_ok": [p for p in pairs if p["status"] != "OK"]}


def parse_gpu_query(text):
    """``nvidia-smi --query-gpu=index,pci.bus_id,persistence_mode --format=csv,noheader`` lines."""
    gpus = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        bus_id = parts[1].lower()
        # nvidia-smi prints an 8-digit domain (00000000:41:00.0); sysfs uses 4.
        m = re.match(r"^0*([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$", bus_id)
        gpus.append({"index": int(parts[0]), "bdf": m.group(1) if m else bus_id, "persistence_mode": parts[2]})
    return gpus


def smi_failure(res: dict, what: str = "nvidia-smi") -> str:
    """Why an nvidia-smi answer (``{rc, stdout, stderr, timed_out}``) failed: its hang, or its exit and message."""
    result = command.Result(res.get("rc"), res.get("stdout") or "", res.get("stderr") or "",
                            timed_out=bool(res.get("timed_out")))
    return command.failure(what, result)


# --- the GPU probe's commands (flows/verify.gpu_probe); each family names those it reads (Family.gpu_commands) ---

# The GPUs the driver lists, with their persistence mode (parse_gpu_query).
QUERY = GpuCommand("query", ("--query-gpu=index,pci.bus_id,persistence_mode", "--format=csv,noheader"))
# The health fields, negotiated with --help-query-gpu (query()): ``fields`` and ``missing`` in the answer.
HEALTH = GpuCommand("health", fields=HEALTH_FIELDS)
TOPOLOGY = GpuCommand("topology", ("topo", "-m"))
P2P_READ = GpuCommand("p2p_read", ("topo", "-p2p", "r"))
P2P_WRITE = GpuCommand("p2p_write", ("topo", "-p2p", "w"))
P2P_NVLINK = GpuCommand("p2p_nvlink", ("topo", "-p2p", "n"))
DCGM = GpuCommand("dcgm", tuple(DCGM_ARGS), tool="dcgmi", package="datacenter-gpu-manager",
                  missing="dcgmi not found: install DCGM (datacenter-gpu-manager) on the node")
NVBANDWIDTH = GpuCommand("nvbandwidth", tuple(NVBANDWIDTH_ARGS), tool="nvbandwidth", package="nvbandwidth",
                         missing="nvbandwidth not found on the node: build it from github.com/NVIDIA/nvbandwidth to "
                                 "measure GPU pair bandwidth")


def probe_answers(probe: dict | None) -> dict:
    """The probe's answers keyed by command, also from the verify tasks' registered loop (``results``, item.key)."""
    out = dict(probe or {})
    for res in out.pop("results", None) or []:
        key = (res.get("item") or {}).get("key")
        if key and not res.get("skipped"):
            out[key] = {"rc": res.get("rc"), "stdout": res.get("stdout"), "stderr": res.get("stderr") or res.get("msg")}
    return out


def probe_status(probe: dict | None, root: str = "/") -> tuple:
    """``(state, reason)`` of the GPU probe: ``present`` (nvidia-smi was asked), ``disabled`` (verification was told
    not to ask it) or ``not_applicable`` with why: a simulated root, or no nvidia-smi on the node."""
    root = root or "/"
    probe = (probe or {}).get("probe") or ("simulated" if root != "/" else "absent")
    if probe == "present":
        return "present", ""
    if probe == "disabled":
        return "disabled", "gpunode_tuning_verify_gpu_enabled is false"
    reasons = {
        "simulated": "simulated node root (%s): nvidia-smi is not run" % root,
        "absent": "nvidia-smi is not installed on this node (no NVIDIA driver user space)",
    }
    return "not_applicable", reasons.get(probe, "nvidia-smi unavailable")
