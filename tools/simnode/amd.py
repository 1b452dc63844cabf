"""AMD Instinct GPUs: the node-local amd-smi stand-in (its answers, faults and modes)."""

from __future__ import annotations

import json

from .machine import PciFunction, Preset, is_gpu
from .tree import Tree

# -- The node-local amd-smi (AMD Instinct presets)

# GPU faults of an AMD node (build(amd_faults={kind: [GPU index, ...]}), --amd-fault KIND=I[,J]).
AMD_FAULTS = {
    "ecc_uncorrectable": "amd-smi metric counts 2 uncorrectable ECC errors, in the UMC block",
    "bad_pages": "amd-smi bad-pages lists as many retired pages as the RAS threshold amd-smi static gives",
    "x8": "the GPU's link trained at x8 of x16 (amd-smi metric and config space)",
    "xgmi_down": "the GPU's XGMI link to the next GPU is down (xgmi -l: D on both ends; topology: DISABLED)",
    "gpu_reset": "the kernel log shows a GPU reset and VRAM lost, at info level as the driver logs them",
    "missing": "the GPU is on the PCI bus but amd-smi does not list it",
}
# How the stand-in answers: "answer"; "hang" never; "error" exit 1 with the library's init error on stderr;
# "invalid_json" its JSON cut short (as amdsmi issues #168/#184 show); "rocm_dir" answers, installed in
# opt/rocm/bin instead of usr/bin (not on PATH); "absent" no amd-smi at all; "set_refused" answers, but
# refuses every ``set`` (exit 1, AMDSMI_STATUS_NO_PERM, as without root). ``set`` changes the answers kept in
# AMD_SMI_STATE (static limit.socket_power, metric perf_level), so a read-back sees it.
# "refuse_link_status" and "refuse_bad_pages" answer that call with amd-smi's own error document on stdout and exit 0,
# as amd-smi up to ROCm 7.1 refuses an option or a command it lacks (amdsmi_cli_exceptions.py: -2 an invalid
# parameter, -7 a command not supported on the system; tests/data/real/amd-smi-error-*).
AMD_SMI_REFUSALS = {
    "refuse_link_status": ("xgmi_link_status", 0, "stdout",
                           '{"error": "Parameter \'-l\' is invalid. Run \'--help\' for more info.", "code": -2}'),
    "refuse_bad_pages": ("bad_pages", 0, "stdout", '{"error": "Command \'bad-pages\' is not supported on the system. '
                                                   'Run \'--help\' for more info.", "code": -7}'),
}
AMD_SMI_MODES = ("answer", "hang", "error", "invalid_json", "rocm_dir", "absent", "set_refused") + \
    tuple(AMD_SMI_REFUSALS)
AMD_SMI_STATE = "var/lib/simnode/amd-smi.json"
# ROCm 6.4.1's amd-smi, as tests/data/real/amd-smi-version-rocm6.4.1-mi300a-legacy-rocm-build-4759.txt prints it.
AMD_SMI_VERSION = ("AMDSMI Tool: 25.4.2+aca1101 | AMDSMI Library version: 25.4.0 | ROCm version: 6.4.1 | "
                   "amdgpu version: 6.10.5 | amd_hsmp version: N/A")
# The RAS bad-page threshold of tests/data/real/amd-smi-static-json-gpu-data-mi210-device-metrics-exporter.txt.
AMD_BAD_PAGE_THRESHOLD = 655
AMD_ECC_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL")

# Stand-in for amd-smi on a simulated node (written by tools/simnode): prints the answer simnode rendered
# for each subcommand (the shapes of ROCm 6.4's amd-smi: {"gpu_data": [...]}, topology a list, xgmi -l its table).
AMD_SMI_SCRIPT = r'''#!/usr/bin/env python3
import json, os, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) == "rocm":
    ROOT = os.path.dirname(ROOT)  # <root>/opt/rocm/bin/amd-smi
with open(os.path.join(ROOT, "@STATE@")) as f:
    RAW = f.read()
STATE = json.loads(RAW)
args = [a for a in sys.argv[1:] if a != "--json"]
if not args:
    sys.exit("usage: amd-smi [-h] {version,list,static,firmware,bad-pages,metric,process,topology,xgmi,set,reset} ...")
key = {"bad-pages": "bad_pages"}.get(args[0], args[0])
if key == "xgmi" and ("-l" in args or "--link-status" in args):
    key = "xgmi_link_status"
if key not in STATE["answers"]:
    sys.stderr.write("amd-smi: error: argument command: invalid choice: %r\n" % args[0])
    sys.exit(2)
mode = STATE.get("mode", "answer")
refusal = STATE.get("refuse", {}).get(key)
if refusal:  # [rc, stream, text]: amd-smi's own error document for a call it lacks
    (sys.stdout if refusal[1] == "stdout" else sys.stderr).write(refusal[2] + "\n")
    sys.exit(refusal[0])
if mode == "hang" and key != "version":
    time.sleep(3600)
if mode == "error" and key != "version":
    sys.stderr.write("ERROR:root:Unable to initialize amdsmi: AMDSMI_STATUS_DRIVER_NOT_LOADED\n")
    sys.exit(1)
if key == "set":  # amd-smi set -g I [J ...] --power-cap W | --perf-level LEVEL | --perf-determinism MHZ
    if mode == "set_refused":
        sys.stderr.write("AMDSMI_STATUS_NO_PERM - Command not permitted\n")
        sys.exit(1)
    opts = {"-o": "--power-cap", "-l": "--perf-level", "-d": "--perf-determinism"}
    ids, what, i = [], {}, 1
    while i < len(args):
        a = opts.get(args[i], args[i])
        if a == "-g":
            i += 1
            while i < len(args) and args[i].isdigit():
                ids.append(int(args[i]))
                i += 1
            continue
        if a in ("--power-cap", "--perf-level", "--perf-determinism") and i + 1 < len(args):
            what[a] = args[i + 1]
            i += 2
            continue
        sys.stderr.write("amd-smi set: error: unrecognized arguments: %s\n" % args[i])
        sys.exit(2)
    static, metric = json.loads(STATE["answers"]["static"]), json.loads(STATE["answers"]["metric"])
    for n in ids:
        if n >= len(static["gpu_data"]):
            sys.stderr.write("amd-smi set: error: GPU %d does not exist\n" % n)
            sys.exit(2)
    for n in ids:
        if "--power-cap" in what:
            watts = int(what["--power-cap"])
            lim = static["gpu_data"][n]["limit"]
            if not lim["min_power"]["value"] <= watts <= lim["max_power"]["value"]:
                sys.stderr.write("AMDSMI_STATUS_INVAL - Power cap %d W is out of range\n" % watts)
                sys.exit(1)
            lim["socket_power"]["value"] = watts
        level = "DETERMINISM" if "--perf-determinism" in what else what.get("--perf-level")
        if level:
            metric["gpu_data"][n]["perf_level"] = "AMDSMI_DEV_PERF_LEVEL_" + level.upper()
    STATE["answers"]["static"] = json.dumps(static, indent=4)
    STATE["answers"]["metric"] = json.dumps(metric, indent=4)
    with open(os.path.join(ROOT, "@STATE@"), "w") as f:
        f.write(json.dumps(STATE) + RAW[len(RAW.rstrip("\n")):])  # as simnode wrote it, to the byte
    sys.exit(0)
text = STATE["answers"][key]
if mode == "invalid_json" and key == "metric":
    text = text[: len(text) // 2]
sys.stdout.write(text + "\n")
'''


def _vt(value, unit: str) -> dict:
    return {"value": value, "unit": unit}


def _amd_uuid(index: int, bdf: str) -> str:
    """A UUID of the shape AMD's MI300X example shows (``afff74a1-0000-1000-80..-...``)."""
    return "%02xff74a1-0000-1000-80%02x-%012x" % ((index * 37 + 0xAF) % 256, int(bdf[5:7], 16), 0xE92B0A5D57C8 + index)


def amd_static_entry(index: int, f: PciFunction, p: Preset) -> dict:
    """``amd-smi static``'s record of one MI300X: the MI210 capture's fields, with an MI300X's values."""
    return {
        "gpu": index,
        "asic": {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002",
                 "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]", "subvendor_id": "0x1002",
                 "device_id": "0x%04x" % p.gpu_device, "rev_id": "0x00", "num_compute_units": 304,
                 "target_graphics_version": "gfx942"},
        "bus": {"bdf": f.bdf, "max_pcie_width": 16, "max_pcie_speed": _vt(32, "GT/s"),
                "pcie_interface_version": "Gen 5", "slot_type": "OAM"},
        "limit": {"max_power": _vt(750, "W"), "min_power": _vt(0, "W"), "socket_power": _vt(750, "W")},
        "driver": {"name": "amdgpu", "version": "6.10.5"},
        "ras": {"eeprom_version": "0x30000", "bad_page_threshold": AMD_BAD_PAGE_THRESHOLD,
                "parity_schema": "DISABLED", "single_bit_schema": "DISABLED", "double_bit_schema": "DISABLED",
                "poison_schema": "ENABLED", "ecc_block_state": {b: "ENABLED" for b in AMD_ECC_BLOCKS}},
        "partition": {"compute_partition": "SPX", "memory_partition": "NPS1"},
        "numa": {"node": max(f.numa_node, 0), "affinity": max(f.numa_node, 0)},
        "vram": {"type": "HBM", "vendor": "HYNIX", "size": _vt(196592, "MB"), "bit_width": 8192},
    }


def amd_metric_entry(index: int, f: PciFunction, faults: dict, i: int) -> dict:
    """``amd-smi metric``'s record of one idle MI300X: the RX 6600 capture's fields (6.1 names)."""
    unc = 2 if i in faults.get("ecc_uncorrectable", ()) else 0
    blocks = {b: {"correctable_count": 0, "uncorrectable_count": unc if b == "UMC" else 0, "deferred_count": 0}
              for b in AMD_ECC_BLOCKS}
    return {
        "gpu": index,
        "usage": {"gfx_activity": _vt(0, "%"), "umc_activity": _vt(0, "%"), "mm_activity": "N/A"},
        "power": {"socket_power": _vt(141, "W"), "gfx_voltage": _vt("N/A", "mV"), "power_management": "ENABLED",
                  "throttle_status": "UNTHROTTLED"},
        "pcie": {"width": f.link_width, "speed": _vt(32, "GT/s"), "bandwidth": "N/A", "replay_count": 0,
                 "l0_to_recovery_count": 0, "replay_roll_over_count": 0, "nak_sent_count": 0,
                 "nak_received_count": 0},
        "ecc": {"total_correctable_count": 0, "total_uncorrectable_count": unc, "total_deferred_count": 0,
                "cache_correctable_count": 0, "cache_uncorrectable_count": 0},
        "ecc_blocks": blocks,
        "perf_level": "AMDSMI_DEV_PERF_LEVEL_AUTO",
        "xgmi_err": "NONE",
    }


def _xgmi_up(i: int, j: int, faults: dict) -> bool:
    down = set(faults.get("xgmi_down", ()))
    return not ((i in down and j == (i + 1) % 8) or (j in down and i == (j + 1) % 8))


def amd_smi_answers(p: Preset, gpus: list, faults: dict) -> dict:
    """The stand-in's answer per subcommand: ``gpus`` the listed ``(fault index, PciFunction)`` in bus order."""
    listed = [(n, i, f) for n, (i, f) in enumerate(gpus)]

    def wrap(records):
        return json.dumps({"gpu_data": records}, indent=4)
    pages = []
    for n, i, _f in listed:
        retired = [{"page_address": "0x%x" % (0x1F0000 + k), "page_size": "4.00 KB", "status": "RESERVED"}
                   for k in range(AMD_BAD_PAGE_THRESHOLD)] if i in faults.get("bad_pages", ()) else \
            "No bad pages found."
        pages.append({"gpu": n, "retired": retired, "pending": "No bad pages found.", "un_res": "No bad pages found."})
    topology = [{"gpu": n, "bdf": f.bdf, "links": [
        {"gpu": m, "bdf": g.bdf, "weight": 0 if m == n else 15,
         "link_status": "ENABLED" if m == n or _xgmi_up(i, j, faults) else "DISABLED",
         "link_type": "SELF" if m == n else "XGMI", "num_hops": 0 if m == n else 1}
        for m, j, g in listed]} for n, i, f in listed]
    rows = ["XGMI LINK STATUS:", "    bdf           link_status"]
    for n, i, f in listed:
        cells = ["U" if _xgmi_up(i, j, faults) else "D" for m, j, _g in listed if m != n]
        rows.append("GPU%d   %s  %s" % (n, f.bdf, "  ".join(cells + ["X"])))
    rows += ["", "* U:Up D:Down X:Disabled"]
    return {
        "version": AMD_SMI_VERSION,
        "list": wrap([{"gpu": n, "bdf": f.bdf, "uuid": _amd_uuid(n, f.bdf), "kfd_id": 1000 + n, "node_id": 2 + n,
                       "partition_id": 0} for n, i, f in listed]),
        "static": wrap([amd_static_entry(n, f, p) for n, i, f in listed]),
        "metric": wrap([amd_metric_entry(n, f, faults, i) for n, i, f in listed]),
        "bad_pages": wrap(pages),
        "topology": json.dumps(topology, indent=4),
        "xgmi": wrap([]),
        "xgmi_link_status": "\n".join(rows),
        "set": "",
    }


def apply_amd_faults(p: Preset, funcs: list, faults: dict) -> None:
    """Check ``faults`` (AMD_FAULTS, GPU indices in bus order) and change ``funcs`` and ``p.kmsg`` for them."""
    unknown = sorted(set(faults) - set(AMD_FAULTS))
    if unknown:
        raise ValueError(f"unknown AMD GPU fault(s) {', '.join(unknown)}; available: {', '.join(AMD_FAULTS)}")
    gpus = sorted((f for f in funcs if is_gpu(f) and f.vendor == 0x1002), key=lambda f: f.bdf)
    for kind, indices in faults.items():
        for i in indices:
            if not isinstance(i, int) or not 0 <= i < len(gpus):
                raise ValueError(f"AMD GPU fault {kind}: GPU index {i!r} is not one of 0..{len(gpus) - 1}")
    by_bdf = {f.bdf: f for f in funcs}
    p.kmsg = list(p.kmsg)
    for i in faults.get("x8", ()):
        for f in (gpus[i], by_bdf.get(gpus[i].parent)):
            if f is not None:
                f.link_width = 8
    for i in faults.get("gpu_reset", ()):
        p.kmsg += [(6, f"amdgpu {gpus[i].bdf}: amdgpu: GPU reset begin!"),
                   (6, f"amdgpu {gpus[i].bdf}: amdgpu: VRAM is lost due to GPU reset!"),
                   (6, f"amdgpu {gpus[i].bdf}: amdgpu: GPU reset(2) succeeded!")]


def write_amd_smi(t: Tree, p: Preset, funcs: list, faults: dict, mode: str = "answer") -> None:
    """The node-local amd-smi (<root>/usr/bin, or opt/rocm/bin) and its answers, with the faults' fields set."""
    if mode == "absent":
        return
    gpus = sorted((f for f in funcs if is_gpu(f) and f.vendor == 0x1002), key=lambda f: f.bdf)
    shown = [(i, f) for i, f in enumerate(gpus) if i not in faults.get("missing", ())]
    state = {"mode": mode, "answers": amd_smi_answers(p, shown, faults)}
    if mode in AMD_SMI_REFUSALS:
        key, rc, stream, text = AMD_SMI_REFUSALS[mode]
        state["refuse"] = {key: [rc, stream, text]}
    t.write(AMD_SMI_STATE, json.dumps(state))
    where = "opt/rocm/bin/amd-smi" if mode == "rocm_dir" else "usr/bin/amd-smi"
    t.write(where, AMD_SMI_SCRIPT.replace("@STATE@", AMD_SMI_STATE).encode(), mode=0o755)
