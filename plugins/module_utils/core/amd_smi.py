# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading amd-smi (AMD SMI CLI) answers field by field, across its releases.

What differs between releases (the captures in tests/data/real/amd-smi-* show each):

- The JSON's shape. ROCm 5.7 and 6.0 print one GPU as a bare object (a list only for several), ROCm 6.1
  to 6.3 always a list, and from ROCm 6.4/7.0 most commands wrap the list: ``{"gpu_data": [...]}``
  (``xgmi`` as ``{"xgmi_metric": [...], "link_status": [...]}``). Every reader accepts each shape.
- Values: ROCm 6.0 prints bare numbers, 6.1 on ``{"value": 16, "unit": "GT/s"}``; text and CSV output
  (and some fields in JSON) print ``"16 GT/s"``. ``number`` reads all three. ``"N/A"`` (also inside a
  value object, ``{"value": "N/A", "unit": "mV"}``) reads as None and costs only that field: the row
  lists it in ``missing``, the other fields are read.
- Names: ROCm 6.0 has ``ecc.total_correctable``, ``ecc_block`` with ``correctable``/``uncorrectable``,
  ``pcie.current_lanes``/``current_speed`` and ``limit.current_power``; 6.1 on ``total_correctable_count``,
  ``ecc_blocks`` with ``*_count`` (``deferred_count`` from 6.2), ``pcie.width``/``speed`` and
  ``limit.socket_power``; the static partition is ``compute_partition`` up to 6.3, ``accelerator_partition``
  from 6.4. Each field is looked up under each of its names (``dig``).
- Noise around the JSON: the amdsmi Python package can print warnings on stdout before it (a
  SyntaxWarning under Python 3.14, a missing video/render group warning), watch mode prints a prompt
  line. Lines before the first line that opens a JSON value are skipped when the JSON after them is
  whole; JSON that does not decode (some releases print two documents or cut output) is a finding, an
  error string in the answer, never an exception.
- Commands: ``xgmi`` exists from ROCm 6.1, ``xgmi -l/--link-status`` from ROCm 6.4 (amd-smi 25.3).
  ``plan`` asks one call per subcommand for all GPUs (no ``-g``), with ``--json``; without ``xgmi -l`` the
  XGMI link state comes from ``topology`` (each link's ``link_status``/``link_accessibility`` and
  ``link_type``), which every release answers.
- Refusals: a release without a subcommand or option says so through argparse (exit 2) or, more often, with its
  own error document, ``{"error": "Parameter '-l' is invalid. Run '--help' for more info.", "code": -2}`` on
  stdout and exit 0 up to ROCm 7.1, the same text with ``Error code: N`` on stderr and a non-zero exit later.
  ``refusal`` tells such an answer from a failure; the readers never take an error document for GPU data.

The human-readable form of ``list`` and ``bad-pages`` (``GPU: 0`` blocks) and the tables of
``xgmi``/``xgmi --link-status``, the default view (``amd-smi`` alone, which shows the compute partition
mode) and ``rocm-smi --showtopo`` are read too: older nodes and published captures have only those.

In CPX/DPX/QPX compute-partition modes amd-smi lists one GPU per partition; the partitions of one
physical GPU share its PCI domain, bus and device and differ in the function amd-smi reports
(0000:05:00.0 and 0000:05:00.1 for the two DPX partitions of one MI300X). ``physical_bdf`` names the
physical GPU (function 0, as the PCI bus shows it) and ``count_against_bus`` counts them against the bus.

Plain Python (3.8+), no Ansible import. Nothing here runs a command: the caller runs ``plan``'s argv lists
(bounded, like every external command) and hands the answers to the readers.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable

# --- the calls ---------------------------------------------------------------------------------------------

# One call per subcommand, for all GPUs, asking for JSON. ``since``: the first ROCm release whose amd-smi
# has the subcommand or option (from the amdsmi changelog and --help of each release).
COMMANDS = {
    "version": {"argv": ["version", "--json"], "since": (5, 7)},
    "list": {"argv": ["list", "--json"], "since": (5, 7)},
    "static": {"argv": ["static", "--json"], "since": (5, 7)},
    "metric": {"argv": ["metric", "--json"], "since": (5, 7)},
    "bad_pages": {"argv": ["bad-pages", "--json"], "since": (5, 7)},
    "topology": {"argv": ["topology", "--json"], "since": (5, 7)},
    "xgmi": {"argv": ["xgmi", "--json"], "since": (6, 1)},
    "xgmi_link_status": {"argv": ["xgmi", "-l", "--json"], "since": (6, 4)},
}
BASE_COMMANDS = ("list", "static", "metric", "bad_pages", "topology")
NA_TEXT = ("N/A", "NA", "")
NO_BAD_PAGES = "no bad pages found"
_MAX_STARTS = 4  # lines tried as the start of the JSON document
# argparse's words for an option or subcommand a release does not know (exit 2).
_REFUSAL = ("unrecognized arguments", "invalid choice", "unrecognized argument")
# amd-smi's own error documents (amdsmi_cli/amdsmi_cli_exceptions.py): with --json ``{"error": text, "code": n}``
# (from ROCm 7.2 also ``"error_type"``), as text ``<text> Error code: n``, from 7.2 on stderr after the exception's
# name. Up to ROCm 7.1 amd-smi prints it on stdout and exits 0; later releases exit non-zero. The codes were renumbered
# (-2 became 194, then 195), so the text says what it is: the call's subcommand or option is one this amd-smi lacks
# (or does not offer on this system) -- a refusal -- or something else went wrong (a value, a device, the library).
_ERROR_LINE = re.compile(r"^\s*(?:amdsmi_cli_exceptions\.\w+:\s*)?(.*?\S)\s+Error code:\s*(-?\d+)(?:\s*\[(\w+)\])?\s*$")
_REFUSAL_MESSAGE = re.compile(r"\b(?:Command|Parameter) '[^']*' is (?:invalid|not supported on the system)")
_REFUSAL_TYPES = ("INVALID_COMMAND", "INVALID_PARAMETER", "COMMAND_NOT_SUPPORTED", "INVALID_SUBCOMMAND",
                  "PARAMETER_NOT_SUPPORTED")

_BDF = re.compile(r"^\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\s*$")
_NUMBER = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%/°]+(?:/[A-Za-z]+)?)?\s*$")
_VERSION_PART = re.compile(r"\s*([^|:]+?)\s*:\s*([^|]*?)\s*(?:\||$)")
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
_COMMAND_LINE = re.compile(r"^ {2,}([a-z][a-z-]*)(?: \([a-z]+\))?\s{2,}[A-Z]")


def plan(rocm: tuple | None = None, help_text: str | None = None) -> list:
    """``[(name, argv)]`` to run (argv after the amd-smi path), one call per subcommand for all GPUs.

    ``rocm``: the ROCm release (``read_version(...)["rocm_release"]``), ``help_text``: ``amd-smi xgmi --help``.
    ``xgmi -l`` is asked where the release or the help says it exists; with neither known it is asked
    too, and ``refused`` tells the caller to drop it (``topology`` is asked always and is the fallback).
    """
    names = list(BASE_COMMANDS)
    if xgmi_link_status_known(rocm, help_text) is not False:
        names.append("xgmi_link_status")
    return [(name, list(COMMANDS[name]["argv"])) for name in names]


def xgmi_link_status_known(rocm: tuple | None, help_text: str | None = None) -> bool | None:
    """Whether ``amd-smi xgmi -l`` exists: from the help when given, else the release; None when neither says."""
    if help_text:
        return "--link-status" in parse_help(help_text)["options"]
    if rocm:
        return tuple(rocm[:2]) >= COMMANDS["xgmi_link_status"]["since"]
    return None


def error_document(text: str | None) -> dict | None:
    """amd-smi's own error answer in ``text``: ``{"error", "code", "type", "refusal"}``, None when there is none.

    Read: the JSON document ``{"error": ..., "code": ...}`` (the whole answer, warning lines before it skipped) and
    the text line ``<message> Error code: <n>`` (with or without the exception's name before it). ``refusal``:
    the message says the call's command or parameter is invalid or not supported on the system (or ``error_type``
    names such a refusal): amd-smi lacks what was asked, as an older release does."""
    text = text or ""
    if '"error"' not in text and "Error code:" not in text:
        return None  # the common case, GPU data: not decoded a second time
    return _error_of(load_json(text)["data"] if "{" in text else None, text)


def _error_of(data: Any, text: str) -> dict | None:
    """``error_document`` of an answer whose JSON (``data``, None without one) is already decoded."""
    if isinstance(data, dict) and isinstance(data.get("error"), str) and "code" in data:
        doc = {"error": data["error"].strip(), "code": data["code"], "type": data.get("error_type")}
    elif data is None:
        found = (_ERROR_LINE.match(line) for line in text.splitlines())
        m = next((m for m in found if m), None)
        if not m:
            return None
        doc = {"error": m.group(1), "code": int(m.group(2)), "type": m.group(3)}
    else:
        return None
    doc["refusal"] = bool(_REFUSAL_MESSAGE.search(doc["error"])) or doc["type"] in _REFUSAL_TYPES
    return doc


def refusal(result: Any) -> str | None:
    """Why amd-smi refused the call's subcommand or option, None when it did not (``result``: rc, stdout, stderr).

    argparse's refusal (exit 2, "unrecognized arguments", "invalid choice"), or amd-smi's own error document for a
    command or parameter it lacks (any exit status: up to ROCm 7.1 it exits 0)."""
    if not result:
        return None
    for stream in (result[1], result[2]):
        doc = error_document(stream)
        if doc and doc["refusal"]:
            return "%s (code %s)" % (doc["error"], doc["code"])
    if result[0] == 0:
        return None
    for line in ("%s\n%s" % (result[2] or "", result[1] or "")).splitlines():
        if any(word in line.lower() for word in _REFUSAL):
            return line.strip()
    return None


def refused(result: Any) -> bool:
    """Whether amd-smi refused the call's subcommand or option (``refusal``)."""
    return refusal(result) is not None


def parse_help(text: str | None) -> dict:
    """``{"commands": set, "options": set}`` of an amd-smi ``--help`` answer (subcommands listed, options named)."""
    commands, options = set(), set()
    for line in (text or "").splitlines():
        m = _COMMAND_LINE.match(line)
        if m and not line.lstrip().startswith("-"):
            commands.add(m.group(1))
        options.update(_OPTION.findall(line))
    return {"commands": commands, "options": options}


def read_version(text: str | None) -> dict:
    """The versions ``amd-smi version`` prints (text or JSON): tool, library, ROCm, amdgpu; ``rocm_release``."""
    out = {"tool": None, "library": None, "rocm": None, "amdgpu": None, "rocm_release": None}
    pairs = _version_pairs(text or "")
    for key, raw in pairs.items():
        name = _version_key(key)
        if name and not is_na(raw):
            out[name] = raw.strip()
    m = _RELEASE.match(out["rocm"] or "")
    if m:
        out["rocm_release"] = tuple(int(g) for g in m.groups() if g is not None)
    return out


def _version_pairs(text: str) -> dict:
    loaded = load_json(text) if text.lstrip().startswith(("[", "{")) else {"data": None}
    data = loaded["data"]
    if isinstance(data, list) and data and isinstance(data[0], dict):
        data = data[0]
    if isinstance(data, dict):
        return {str(k): str(v) for k, v in data.items()}
    return {m.group(1): m.group(2) for m in _VERSION_PART.finditer(text.strip())}


def _version_key(key: str) -> str | None:
    low = key.lower()
    for word, name in (("rocm", "rocm"), ("library", "library"), ("amdgpu", "amdgpu"), ("tool", "tool")):
        if word in low:
            return name
    return "tool" if low == "version" else None


# --- JSON and values ---------------------------------------------------------------------------------------


def load_json(text: str | None) -> dict:
    """``{"data", "skipped", "finding"}``: the JSON amd-smi printed, the lines before it, or why there is none.

    Lines before the first line that opens a JSON value (``[`` or ``{`` in column 0) are skipped, and returned
    in ``skipped``, when the JSON from there on decodes whole; a candidate line that does not start a whole
    document (a warning that happens to start with ``[``) is skipped too. Nothing decodes: ``finding``.
    """
    lines = (text or "").splitlines(keepends=True)
    # amd-smi prints its JSON from column 0 (json.dumps); nested lines are indented, so only a few candidates.
    starts = [i for i, line in enumerate(lines) if line.startswith(("[", "{"))][:_MAX_STARTS]
    if not starts:
        what = "empty output" if not (text or "").strip() else "first line %r" % lines[0].strip()[:120]
        return {"data": None, "skipped": _kept(lines), "finding": "amd-smi printed no JSON (%s)" % what}
    first_error = None
    for start in starts:
        data, error, whole = _decode("".join(lines[start:]), start)
        if error is None:
            return {"data": data, "skipped": _kept(lines[:start]), "finding": None}
        first_error = first_error or error
        if whole:  # a document, then more: two documents (or output after one) is no answer to pick from
            break
    return {"data": None, "skipped": _kept(lines[:starts[0]]), "finding": first_error}


def _kept(lines: list) -> list:
    return [line.rstrip("\r\n") for line in lines if line.strip()]


def _decode(text: str, offset: int) -> tuple:
    """``(value, finding, whole)``: a JSON document, or why not (line numbers of the output) and whether one
    whole document decoded before the rest."""
    try:
        value, end = json.JSONDecoder().raw_decode(text.lstrip())
    except json.JSONDecodeError as exc:
        where = (exc.msg, exc.lineno + offset, exc.colno)
        return None, "amd-smi printed invalid JSON: %s (line %d, column %d)" % where, False
    rest = text.lstrip()[end:].strip()
    if rest:
        return None, "amd-smi printed more after its JSON: %r" % rest.splitlines()[0][:120], True
    return value, None, True


def entries(data: Any, key: str = "gpu_data") -> tuple:
    """``(records, finding)``: the per-GPU records of a list, a ``{key: [...]}`` wrapper or one bare GPU object."""
    if isinstance(data, list):
        items = data
    elif isinstance(data, dict) and isinstance(data.get(key), list):
        items = data[key]
    elif isinstance(data, dict) and "gpu" in data:
        items = [data]  # amd-smi before ROCm 6.1 printed a single GPU as a bare object
    else:
        keys = ", ".join(sorted(map(str, data))[:6]) if isinstance(data, dict) else type(data).__name__
        return [], "amd-smi's JSON holds no GPU list (neither a list nor {\"%s\": [...]}): %s" % (key, keys)
    return [item for item in items if isinstance(item, dict)], None


def is_na(raw: Any) -> bool:
    """Whether a field reads as not available: None, ``"N/A"`` (any case), or a value object holding one."""
    if isinstance(raw, dict) and "value" in raw:
        return is_na(raw["value"])
    return raw is None or (isinstance(raw, str) and raw.strip().upper() in NA_TEXT)


def value(raw: Any) -> Any:
    """A field's value: None for N/A, the ``value`` of a ``{"value", "unit"}`` object, else as printed."""
    if isinstance(raw, dict) and "value" in raw:
        raw = raw["value"]
    return None if is_na(raw) else raw


def unit(raw: Any) -> str | None:
    """The unit printed with a value (``{"value": 1, "unit": "W"}`` or ``"1 W"``), None without one."""
    if isinstance(raw, dict):
        return raw.get("unit") or None
    m = _NUMBER.match(raw) if isinstance(raw, str) else None
    return m.group(2) if m and m.group(2) else None


def number(raw: Any) -> int | float | None:
    """A number from ``16``, ``16.0``, ``{"value": 16, "unit": "GT/s"}`` or ``"16 GT/s"``; None for N/A or text."""
    raw = value(raw)
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, (int, float)):
        return raw
    m = _NUMBER.match(raw) if isinstance(raw, str) else None
    if not m:
        return None
    return float(m.group(1)) if "." in m.group(1) else int(m.group(1))


def integer(raw: Any) -> int | None:
    """A whole number (a count, an index), None when the field is N/A or not whole."""
    n = number(raw)
    return int(n) if n is not None and float(n).is_integer() else None


def text_value(raw: Any) -> str | None:
    """A field as text, None for N/A."""
    v = value(raw)
    return None if v is None else str(v).strip()


def gts(raw: Any) -> float | None:
    """A PCIe speed in GT/s; MT/s values (``16000``, as the library and some releases print) are converted."""
    n = number(raw)
    if n is None:
        return None
    if (unit(raw) or "").upper().startswith("MT") or n >= 1000:
        n = n / 1000.0
    return float(n)


def dig(entry: Any, *paths: tuple) -> Any:
    """The first of ``paths`` (tuples of keys) that holds a value in ``entry``, N/A read as absent; else None."""
    for path in paths:
        node = entry
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if not is_na(node):
            return node
    return None


def normalize_bdf(raw: Any) -> str | None:
    """A PCI address as sysfs writes it (0000:0b:00.0): lower case, a 4-digit domain, 0000 when none is given."""
    m = _BDF.match(raw) if isinstance(raw, str) else None
    if not m:
        return None
    domain = (m.group(1) or "0").lower()
    domain = "%04x" % int(domain, 16) if int(domain, 16) <= 0xFFFF else domain
    return "%s:%s:%s.%s" % (domain, m.group(2).lower(), m.group(3).lower(), m.group(4))


def physical_bdf(raw: Any) -> str | None:
    """The physical GPU of a (partition's) address: function 0 of its device, as the PCI bus shows it."""
    bdf = normalize_bdf(raw)
    return bdf[:-1] + "0" if bdf else None


def perf_level(raw: Any) -> str | None:
    """``AMDSMI_DEV_PERF_LEVEL_AUTO`` (and the bare ``auto`` of other releases) as ``auto``; None for N/A."""
    text = text_value(raw)
    if text is None:
        return None
    return text.upper().replace("AMDSMI_DEV_PERF_LEVEL_", "").lower()


def _flag(raw: Any) -> bool | None:
    text = text_value(raw)
    if text is None:
        return None
    return text.lower() in ("true", "yes", "1", "enabled")


# --- readers: one per subcommand -----------------------------------------------------------------------------


def _row(entry: dict, fields: dict) -> dict:
    """One GPU's row: ``gpu`` and every field of ``fields`` (name -> (converter, paths)); N/A ones in ``missing``."""
    row = {"gpu": integer(entry.get("gpu"))}
    for name, (convert, paths) in fields.items():
        row[name] = convert(dig(entry, *paths))
    row["missing"] = sorted(name for name in fields if row[name] is None)
    return row


def _answer(text: str | None, to_row: Callable[[dict], dict], key: str = "gpu_data",
            text_form: Callable[[str], list] | None = None) -> dict:
    """``{"gpus", "finding", "skipped"}`` of one command's answer, each GPU record read by ``to_row``."""
    loaded = load_json(text)
    error = _error_of(loaded["data"], text or "")
    if error is not None:  # amd-smi's own error in place of the answer: say so, not "no GPU list"
        return {"gpus": [], "finding": "amd-smi answered with its own error, not the GPUs: %s (code %s)"
                % (error["error"], error["code"]), "skipped": loaded["skipped"]}
    if loaded["data"] is None and text_form is not None:
        records, skipped = text_form(text or "")
        if records:  # the human-readable form (no JSON line reads as a GPU block)
            return {"gpus": [to_row(r) for r in records], "finding": None, "skipped": skipped}
    if loaded["finding"]:
        return {"gpus": [], "finding": loaded["finding"], "skipped": loaded["skipped"]}
    records, finding = entries(loaded["data"], key)
    return {"gpus": [to_row(r) for r in records], "finding": finding, "skipped": loaded["skipped"]}


LIST_FIELDS = {
    "bdf": (normalize_bdf, (("bdf",), ("gpu_bdf",))),
    "uuid": (text_value, (("uuid",), ("gpu_uuid",))),
    "kfd_id": (integer, (("kfd_id",),)),
    "node_id": (integer, (("node_id",),)),
    "partition_id": (integer, (("partition_id",),)),
}


def read_list(text: str | None) -> dict:
    """``amd-smi list`` (JSON or its ``GPU: 0`` text): index, BDF, UUID, KFD and node id, partition id per GPU.

    Each row also names its ``physical_bdf`` (``count_against_bus`` counts those against the PCI bus).
    """
    def to_row(entry):
        row = _row(entry, LIST_FIELDS)
        row["physical_bdf"] = physical_bdf(row["bdf"])
        return row
    return _answer(text, to_row, text_form=text_blocks)


STATIC_FIELDS = {
    "bdf": (normalize_bdf, (("bus", "bdf"),)),
    "market_name": (text_value, (("asic", "market_name"),)),
    "device_id": (text_value, (("asic", "device_id"),)),
    "max_pcie_width": (integer, (("bus", "max_pcie_width"), ("bus", "max_pcie_lanes"))),
    "max_pcie_speed_gts": (gts, (("bus", "max_pcie_speed"),)),
    "pcie_interface_version": (text_value, (("bus", "pcie_interface_version"),)),
    "bad_page_threshold": (integer, (("ras", "bad_page_threshold"),)),
    "bad_page_threshold_exceeded": (_flag, (("ras", "bad_page_threshold_exceeded"),)),
    "power_cap_w": (number, (("limit", "socket_power"), ("limit", "current_power"))),
    "power_cap_min_w": (number, (("limit", "min_power"),)),
    "power_cap_max_w": (number, (("limit", "max_power"),)),
    "compute_partition": (text_value, (("partition", "accelerator_partition"), ("partition", "compute_partition"),
                                       ("compute_partition",))),
    "memory_partition": (text_value, (("partition", "memory_partition"), ("memory_partition",))),
    "numa_node": (integer, (("numa", "node"),)),
    "vram_mb": (number, (("vram", "size"),)),
}


def read_static(text: str | None) -> dict:
    """``amd-smi static``: identity, PCIe maxima, RAS threshold and ECC block states, power cap, partitions.

    ``ecc_block_state``: ``{BLOCK: "ENABLED"|"DISABLED"}``, empty where the GPU has no RAS (N/A).
    """
    def to_row(entry):
        row = _row(entry, STATIC_FIELDS)
        states = dig(entry, ("ras", "ecc_block_state"))
        row["ecc_block_state"] = ({str(k): text_value(v) for k, v in states.items()}
                                  if isinstance(states, dict) else {})
        return row
    return _answer(text, to_row)


METRIC_FIELDS = {
    "ecc_correctable": (integer, (("ecc", "total_correctable_count"), ("ecc", "total_correctable"),
                                  ("ecc", "correctable_count"))),
    "ecc_uncorrectable": (integer, (("ecc", "total_uncorrectable_count"), ("ecc", "total_uncorrectable"),
                                    ("ecc", "uncorrectable_count"))),
    "ecc_deferred": (integer, (("ecc", "total_deferred_count"), ("ecc", "deferred_count"))),
    "pcie_width": (integer, (("pcie", "width"), ("pcie", "current_lanes"))),
    "pcie_speed_gts": (gts, (("pcie", "speed"), ("pcie", "current_speed"))),
    "pcie_replay_count": (integer, (("pcie", "replay_count"),)),
    "perf_level": (perf_level, (("perf_level",), ("performance_level",))),
    "power_w": (number, (("power", "socket_power"), ("power", "average_socket_power"))),
    "xgmi_err": (text_value, (("xgmi_err",),)),
}
_BLOCK_COUNTS = {"correctable": ("correctable_count", "correctable"),
                 "uncorrectable": ("uncorrectable_count", "uncorrectable"),
                 "deferred": ("deferred_count", "deferred")}


def read_metric(text: str | None) -> dict:
    """``amd-smi metric``: ECC totals, ECC per block, PCIe link width/speed, perf level, power, XGMI error state.

    ``ecc_blocks``: ``{BLOCK: {"correctable", "uncorrectable", "deferred"}}`` (None where N/A), empty when the
    release or GPU has no per-block counts (``"ecc_blocks": "N/A"``).
    """
    def to_row(entry):
        row = _row(entry, METRIC_FIELDS)
        row["ecc_blocks"] = ecc_blocks(dig(entry, ("ecc_blocks",), ("ecc_block",)))
        return row
    return _answer(text, to_row)


def ecc_blocks(raw: Any) -> dict:
    """Per-block ECC counts from ``ecc_blocks`` (6.1 on) or ``ecc_block`` (6.0), by upper-case block name."""
    if not isinstance(raw, dict):
        return {}
    out = {}
    for block, counts in raw.items():
        if isinstance(counts, dict):
            out[str(block).upper()] = {name: integer(dig(counts, *((k,) for k in keys)))
                                       for name, keys in _BLOCK_COUNTS.items()}
    return out


def read_bad_pages(text: str | None) -> dict:
    """``amd-smi bad-pages`` (JSON or its text): retired, pending and unreservable page counts per GPU.

    ``"No bad pages found."`` reads 0, ``"N/A"`` None (the count is missing, not zero), a list its length;
    ``pages`` keeps the listed pages' addresses by state.
    """
    return _answer(text, _bad_page_row, text_form=text_blocks)


def _bad_page_row(entry: dict) -> dict:
    row = {"gpu": integer(entry.get("gpu")), "pages": {}}
    for name, keys in (("retired", ("retired",)), ("pending", ("pending",)), ("unreservable", ("un_res", "unres"))):
        raw = dig(entry, *((k,) for k in keys))
        row[name], row["pages"][name] = _page_count(raw)
    row["missing"] = sorted(n for n in ("retired", "pending", "unreservable") if row[n] is None)
    return row


def _page_count(raw: Any) -> tuple:
    if isinstance(raw, dict):
        raw = [raw]
    if isinstance(raw, list):
        return len(raw), [text_value(dig(p, ("page_address",), ("address",))) for p in raw if isinstance(p, dict)]
    text = text_value(raw)
    if text is not None and NO_BAD_PAGES in text.lower():
        return 0, []
    return None, []


# --- links between GPUs ------------------------------------------------------------------------------------


def read_topology(text: str | None) -> dict:
    """``amd-smi topology``: each GPU's links (peer, type, status, weight, hops), in either JSON shape.

    ROCm 6.1.0 and before: dicts keyed ``gpu_N`` (``link_accessibility``, ``link_type``, ``weight``, ``hops``);
    6.1.1 on: ``links``, a list of ``{gpu, bdf, weight, link_status, link_type, num_hops}``.
    """
    return _answer(text, _topology_row)


def _topology_row(entry: dict) -> dict:
    links = entry.get("links")
    found = [_link(link) for link in links if isinstance(link, dict)] if isinstance(links, list) \
        else _old_links(entry)
    return {"gpu": integer(entry.get("gpu")), "bdf": normalize_bdf(entry.get("bdf")),
            "links": [link for link in found if link["peer"] != integer(entry.get("gpu"))]}


def _link(link: dict) -> dict:
    return {"peer": integer(link.get("gpu")), "peer_bdf": normalize_bdf(link.get("bdf")),
            "link_type": text_value(link.get("link_type")), "link_status": text_value(link.get("link_status")),
            "weight": integer(link.get("weight")), "hops": integer(dig(link, ("num_hops",), ("hops",)))}


def _old_links(entry: dict) -> list:
    tables = {name: entry.get(name) if isinstance(entry.get(name), dict) else {}
              for name in ("link_accessibility", "link_type", "weight", "hops")}
    peers = sorted({k for table in tables.values() for k in table}, key=lambda k: integer(k.split("_")[-1]) or 0)
    return [{"peer": integer(peer.split("_")[-1]), "peer_bdf": None,
             "link_type": text_value(tables["link_type"].get(peer)),
             "link_status": text_value(tables["link_accessibility"].get(peer)),
             "weight": integer(tables["weight"].get(peer)), "hops": integer(tables["hops"].get(peer))}
            for peer in peers]


_LINK_ROW = re.compile(r"^\s*GPU(\d+)\s+(\S+:\S+\.\d)\s+((?:(?:U|D|X|N/A)\s*)+)$")
LINK_STATES = {"U": "up", "D": "down", "X": "disabled"}


def read_xgmi_link_status(text: str | None) -> dict:
    """``amd-smi xgmi -l`` (ROCm 6.4 on; JSON or its table): each GPU's XGMI links, up (U), down (D), disabled (X).

    A row counts ``up``, ``down`` and ``disabled``; ``links`` keeps the letters in the tool's order.
    """
    if load_json(text)["data"] is not None:
        return _answer(text, _link_status_row, key="link_status")
    rows = []
    for line in (text or "").splitlines():
        m = _LINK_ROW.match(line)
        if m:
            entry = {"gpu": int(m.group(1)), "bdf": m.group(2), "link_status": m.group(3).split()}
            rows.append(_link_status_row(entry))
    finding = None if rows else "amd-smi xgmi -l printed no link status rows"
    return {"gpus": rows, "finding": finding, "skipped": []}


def _link_status_row(entry: dict) -> dict:
    raw = entry.get("link_status")
    links = [text_value(s) or "N/A" for s in raw] if isinstance(raw, list) else []
    row = {"gpu": integer(entry.get("gpu")), "bdf": normalize_bdf(entry.get("bdf")), "links": links}
    for letter, name in LINK_STATES.items():
        row[name] = sum(1 for s in links if s.upper() == letter)
    row["missing"] = [] if links else ["links"]
    return row


_XGMI_ROW = re.compile(r"^GPU(\d+)\s+(\S+:\S+\.\d)\s+(\S+ \S+)\s+(\S+ \S+)\s+(\S+)")


def read_xgmi_metric(text: str | None) -> dict:
    """``amd-smi xgmi`` (ROCm 6.1 on; JSON ``xgmi_metric`` or the LINK METRIC TABLE): bit rate, bandwidth, type."""
    if load_json(text)["data"] is not None:
        return _answer(text, _xgmi_metric_row, key="xgmi_metric")
    rows = []
    for line in (text or "").splitlines():
        m = _XGMI_ROW.match(line)
        if m:
            rows.append(_xgmi_metric_row({"gpu": int(m.group(1)), "bdf": m.group(2), "link_metrics": {
                "bit_rate": m.group(3), "max_bandwidth": m.group(4), "link_type": m.group(5)}}))
    return {"gpus": rows, "finding": None if rows else "amd-smi xgmi printed no link metric rows", "skipped": []}


def _xgmi_metric_row(entry: dict) -> dict:
    metrics = entry.get("link_metrics") if isinstance(entry.get("link_metrics"), dict) else entry
    return _row(dict(metrics, gpu=entry.get("gpu"), bdf=entry.get("bdf")), {
        "bdf": (normalize_bdf, (("bdf",),)),
        "bit_rate_gbps": (number, (("bit_rate",),)),
        "max_bandwidth_gbps": (number, (("max_bandwidth",),)),
        "link_type": (text_value, (("link_type",),)),
    })


# --- the human-readable forms ------------------------------------------------------------------------------

_TEXT_LINE = re.compile(r"^( *)([A-Za-z0-9_ ]+?):(?: (.*))?$")


def text_blocks(text: str) -> tuple:
    """``(records, skipped)``: the ``GPU: 0`` blocks of a human-readable answer as dicts (keys lower case).

    Nested sections (``    ASIC:`` over deeper lines) become dicts; other device kinds (``AI_NIC: 0``,
    ``CPU: 0``) and lines that are no ``KEY: value`` (``[output truncated]``) are left out, the latter listed.
    """
    records, skipped, stack = [], [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _TEXT_LINE.match(line.rstrip())
        if not m:
            skipped.append(line.strip())
            continue
        depth, key, raw = len(m.group(1)), m.group(2).strip().lower(), m.group(3)
        if depth == 0:
            stack = _new_block(records, key, raw)
            continue
        if stack:
            _put(stack, depth, key, raw)
    return [r for r in records if r is not None], skipped


def _new_block(records: list, key: str, raw: str | None) -> list:
    if key != "gpu":
        records.append(None)  # another device kind: its lines are dropped with it
        return []
    record = {"gpu": integer(raw)}
    records.append(record)
    return [(0, record)]


def _put(stack: list, depth: int, key: str, raw: str | None) -> None:
    while len(stack) > 1 and stack[-1][0] >= depth:
        stack.pop()
    parent = stack[-1][1]
    if raw is None or raw == "":
        parent[key] = {}
        stack.append((depth, parent[key]))
    else:
        parent[key] = raw.strip()


_VIEW_FIRST = re.compile(r"^\|\s*(\S+:\S+\.\d)\s+(.*?)\s*\|\s*\S+(?: %)?\s+\S+(?: °C)?\s+(\S+)")
_VIEW_SECOND = re.compile(r"^\|\s*(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*\|")


def read_default_view(text: str | None) -> dict:
    """The table ``amd-smi`` alone prints (ROCm 7.0 on): BDF, name, partition mode and UEC per GPU (partition).

    ``compute_partition``/``memory_partition`` come from the Partition-Mode column (``DPX/NPS1``); ``uec`` is
    the uncorrectable error count column.
    """
    rows, pending = [], None
    for line in (text or "").splitlines():
        first, second = _VIEW_FIRST.match(line), _VIEW_SECOND.match(line)
        if first:
            pending = {"bdf": normalize_bdf(first.group(1)), "name": first.group(2), "uec": integer(first.group(3))}
        elif second and pending is not None:
            rows.append(_view_row(pending, second))
            pending = None
    return {"gpus": rows, "finding": None if rows else "amd-smi printed no GPU rows", "skipped": []}


def _view_row(first: dict, second: Any) -> dict:
    mode = text_value(second.group(4))
    compute, _sep, memory = (mode or "").partition("/")
    row = dict(first, gpu=integer(second.group(1)), hip_id=integer(second.group(2)), oam_id=integer(second.group(3)),
               compute_partition=compute or None, memory_partition=memory or None)
    row["physical_bdf"] = physical_bdf(row["bdf"])
    row["missing"] = sorted(k for k in ("bdf", "uec", "compute_partition", "memory_partition") if row[k] is None)
    return row


_SECTION = re.compile(r"^=+ (.+?) =+$")
_MATRIX_HEAD = re.compile(r"^\s+((?:GPU\d+\s*)+)$")
_MATRIX_ROW = re.compile(r"^GPU(\d+)\s+(.*\S)\s*$")
_NUMA = re.compile(r"^GPU\[?\s*(\d+)\]?\s*:\s*\(Topology\) Numa (Node|Affinity):\s*(-?\d+)")
_SHOWTOPO_TABLES = {"Weight between two GPUs": "weight", "Hops between two GPUs": "hops",
                    "Link Type between two GPUs": "link_type"}


def read_rocm_smi_showtopo(text: str | None) -> dict:
    """``rocm-smi --showtopo``: weight, hops and link type between each pair of GPUs, and each GPU's NUMA node.

    ``{"links": [{"gpu", "peer", "weight", "hops", "link_type"}], "numa": [{"gpu", "node", "affinity"}],
    "warnings", "finding"}``; a WARNING line before the tables (a GPU in a low-power state) is kept in
    ``warnings``, not read as a table.
    """
    tables, numa, warnings = {}, {}, []
    table = None
    for line in (text or "").splitlines():
        section = _SECTION.match(line.strip())
        if section:
            table = _SHOWTOPO_TABLES.get(section.group(1))
            continue
        if line.startswith("WARNING"):
            warnings.append(line.strip())
        elif table:
            _matrix_line(tables.setdefault(table, {}), line)
        else:
            _numa_line(numa, line)
    links = _pairs(tables)
    numa_rows = [dict(numa[gpu], gpu=gpu) for gpu in sorted(numa)]
    return {"links": links, "numa": numa_rows, "warnings": warnings,
            "finding": None if links else "rocm-smi --showtopo printed no topology table"}


def _matrix_line(table: dict, line: str) -> None:
    row = _MATRIX_ROW.match(line)
    if row and not _MATRIX_HEAD.match(line):
        table[int(row.group(1))] = row.group(2).split()


def _numa_line(numa: dict, line: str) -> None:
    m = _NUMA.match(line.strip())
    if m:
        numa.setdefault(int(m.group(1)), {})[m.group(2).lower()] = int(m.group(3))


def _pairs(tables: dict) -> list:
    gpus = sorted({gpu for table in tables.values() for gpu in table})
    links = []
    for gpu in gpus:
        for peer in gpus:
            if peer != gpu:
                cells = {name: _cell(tables.get(name, {}), gpu, peer) for name in _SHOWTOPO_TABLES.values()}
                links.append({"gpu": gpu, "peer": peer, "weight": integer(cells["weight"]),
                              "hops": integer(cells["hops"]), "link_type": cells["link_type"]})
    return links


def _cell(table: dict, gpu: int, peer: int) -> str | None:
    row = table.get(gpu) or []
    return row[peer] if peer < len(row) else None


# --- GPUs against the bus ----------------------------------------------------------------------------------


def physical_gpus(gpus: Iterable[dict]) -> list:
    """The physical GPUs (``physical_bdf``) of rows amd-smi listed, one per physical GPU whatever its partitions."""
    return sorted({physical_bdf(row.get("bdf")) for row in gpus if physical_bdf(row.get("bdf"))})


def count_against_bus(gpus: Iterable[dict], bus_bdfs: Iterable[str]) -> dict:
    """amd-smi's GPUs counted as physical GPUs against the AMD GPUs the PCI bus shows.

    ``{"partitions", "physical", "bus", "missing", "unexpected"}``: ``missing`` are on the bus but not seen by
    amd-smi, ``unexpected`` seen by amd-smi but not on the bus (both by physical address).
    """
    rows = [row for row in gpus if normalize_bdf(row.get("bdf"))]
    physical = physical_gpus(rows)
    bus = sorted({physical_bdf(b) for b in bus_bdfs if physical_bdf(b)})
    return {"partitions": len(rows), "physical": physical, "bus": bus,
            "missing": [b for b in bus if b not in physical], "unexpected": [p for p in physical if p not in bus]}
