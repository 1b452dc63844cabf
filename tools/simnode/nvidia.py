"""NVIDIA GPUs: GPU faults and the node-local nvidia-smi stand-in (its table, driver flavours and modes)."""

from __future__ import annotations

import json

from .machine import Preset
from .tree import Tree

# -- GPU faults and the node-local nvidia-smi

# build(gpu_faults={kind: [GPU index, ...]}): what a sick GPU looks like on this node.
GPU_FAULTS = {
    "x8": "the GPU's link trained at x8 of its x16 capability (Link Status width 8)",
    "row_remap_pending": "nvidia-smi reports a remapped row pending (a GPU reset activates it)",
    "xid79": "the kernel log has Xid 79 (GPU has fallen off the bus) for the GPU",
    "driver_missing": "the GPU is on the PCI bus but nvidia-smi does not list it",
    "dead": "the GPU fell off the bus: its config space reads all 0xff (lspci: rev ff), nvidia-smi does not list it",
}
SMI_STATE = "var/lib/simnode/nvidia-smi.json"
SMI_IDLE_CLOCK = 180  # MHz: the graphics clock of an idle, unlocked GPU in the stand-in

# Stand-in for nvidia-smi on a simulated node (written by tools/simnode): the subset the
# collection uses, answered from and written to the node's own table (SMI_STATE), never a GPU.
NVIDIA_SMI_SCRIPT = r'''#!/usr/bin/env python3
import json, os, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE = os.path.join(ROOT, "@STATE@")
DRIVER = json.loads(@DRIVER@)  # {fields, mode, ansi}: the driver this stand-in plays (simnode SMI_DRIVERS)
ALIASES = {"pci.bus_id": "gpu_bus_id", "name": "gpu_name", "index": "gpu_index"}
UNITS = {"power.limit": " W", "power.default_limit": " W", "power.max_limit": " W", "power.min_limit": " W",
         "utilization.gpu": " %"}
UNITS.update({k: " MHz" for k in ("clocks.current.graphics", "clocks.applications.graphics",
                                  "clocks.applications.memory", "clocks.default_applications.graphics",
                                  "clocks.default_applications.memory", "clocks.max.graphics", "clocks.max.memory")})
IDLE_CLOCK = @IDLE_CLOCK@  # MHz of an idle, unlocked GPU (simnode's table starts there)


def fail(msg, rc=2):
    sys.stderr.write(msg + "\n")
    sys.exit(rc)


def save(table):
    with open(STATE + ".tmp", "w") as fh:
        fh.write(json.dumps(table, indent=1) + "\n")  # as simnode wrote it: a rollback is byte-identical
    os.replace(STATE + ".tmp", STATE)


def selected(gpus, ids):
    if ids is None:
        return gpus
    want = ids.split(",")
    chosen = [g for g in gpus if g["index"] in want or g["pci.bus_id"].lower() in [w.lower() for w in want]]
    if len(chosen) != len(want):
        fail("No devices were found matching the ID %s" % ids, 6)
    return chosen


def query(gpus, fields, fmt, known):
    names = fields.split(",")
    for name in names:
        if name not in known:  # as the real one: the message on stdout, stderr empty, exit 2
            print('Field "%s" is not a valid field to query.' % name)
            print("")
            sys.exit(2)
    for g in gpus:
        vals = [g.get(n, "[N/A]") + ("" if "nounits" in fmt else UNITS.get(n, "")) for n in names]
        if DRIVER.get("mode") == "garbled":
            vals = vals[:-1]  # an answer that does not match the query: one column short
        print(", ".join(vals))


def help_query_gpu(known):
    """The field list in nvidia-smi's format: a quoted name (aliases joined by "or"), its description."""
    print('List of valid properties to query for the switch "--query-gpu":')
    print("")
    for name in sorted(known):
        alias = ALIASES.get(name)
        print('"%s"' % name + (' or "%s"' % alias if alias else ""))
        print("The %s of the GPU (simulated)." % name)
        print("")


def acs_redirect(bus_id):
    """Whether a bridge above the GPU has ACS ReqRedir or CmpltRedir set (the simulated P2P verdict)."""
    path = os.path.realpath(os.path.join(ROOT, "sys/bus/pci/devices", bus_id.lower()[-12:]))
    while True:
        path = os.path.dirname(path)
        if len(os.path.basename(path)) != 12 or not os.path.isfile(os.path.join(path, "config")):
            return False  # pci0000:40: the root bus, no bridge above
        with open(os.path.join(path, "config"), "rb") as fh:
            cfg = fh.read()
        pos = 0x100
        for _step in range(64):
            header = int.from_bytes(cfg[pos:pos + 4], "little") if pos + 8 <= len(cfg) else 0
            if header & 0xFFFF == 0x000D and int.from_bytes(cfg[pos + 6:pos + 8], "little") & 0x000C:
                return True
            if header & 0xFFFF in (0, 0x000D) or header >> 20 < 0x100:
                break
            pos = header >> 20


def p2p_cell(gpus, i, j, kind):
    """NVLink: not supported (PCIe GPUs); read/write: CNS where ACS redirect sends peer traffic upstream."""
    if kind == "n":
        return "NS"
    return "CNS" if acs_redirect(gpus[i]["pci.bus_id"]) or acs_redirect(gpus[j]["pci.bus_id"]) else "OK"


def affinity(g):
    """topo -m's CPU Affinity, NUMA Affinity and GPU NUMA ID cells, from the GPU's sysfs as the driver reads it."""
    d = os.path.join(ROOT, "sys/bus/pci/devices", g["pci.bus_id"].lower()[-12:])
    cells = []
    for name in ("local_cpulist", "numa_node"):
        try:
            with open(os.path.join(d, name)) as fh:
                cells.append(fh.read().strip())
        except OSError:
            cells.append("N/A")
    return [cells[0], "N/A" if cells[1].startswith("-") else cells[1], "", "N/A"]


def topo(gpus, args):
    n = len(gpus)
    kind = args[args.index("-p2p") + 1] if "-p2p" in args and args.index("-p2p") + 1 < len(args) else None
    if DRIVER.get("ansi"):
        return topo_ansi(gpus, kind)
    extra = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"] if "-m" in args else []
    print("\t" + "\t".join(["GPU%d" % i for i in range(n)] + extra))
    for i in range(n):
        print("GPU%d\t" % i + "\t".join(["X" if i == j else ("NODE" if "-m" in args else p2p_cell(gpus, i, j, kind))
                                          for j in range(n)] + (affinity(gpus[i]) if "-m" in args else [])))
    legend = "\n  OK   = Status Ok\n  CNS  = Chipset not supported\n  NS   = Not supported" if kind else ""
    print("\nLegend:\n\n  X    = Self" + legend)


def clocks(g, key, value):
    """-lgc min,max: an idle GPU then runs at min (no query shows the lock); -ac mem,gr within the maxima."""
    pair = [int(v) for v in value.split(",") if v.strip().isdigit()]
    if key in ("-lgc", "-ac") and len(pair) != 2:
        fail('Invalid clock pair "%s"' % value)
    top_gr, top_mem = int(g["clocks.max.graphics"]), int(g["clocks.max.memory"])
    if key == "-lgc":
        if not 0 < pair[0] <= pair[1] <= top_gr:
            fail("Invalid clock range %s for GPU %s (max %d MHz)" % (value, g["pci.bus_id"], top_gr))
        g["clocks.current.graphics"] = str(max(IDLE_CLOCK, pair[0]))
        print("GPU clocks set to \"(gpcClkMin %d, gpcClkMax %d)\" for GPU %s" % (pair[0], pair[1], g["pci.bus_id"]))
    elif key == "-rgc":
        g["clocks.current.graphics"] = str(IDLE_CLOCK)
        print("All done.")
    elif key == "-ac":
        if not (0 < pair[0] <= top_mem and 0 < pair[1] <= top_gr):
            fail("Specified clock combination \"(MEM %s, SM %s)\" is not supported for GPU %s"
                 % (pair[0], pair[1], g["pci.bus_id"]))
        g["clocks.applications.memory"], g["clocks.applications.graphics"] = str(pair[0]), str(pair[1])
        print("Applications clocks set to \"(MEM %d, SM %d)\" for GPU %s" % (pair[0], pair[1], g["pci.bus_id"]))
    else:
        g["clocks.applications.memory"] = g["clocks.default_applications.memory"]
        g["clocks.applications.graphics"] = g["clocks.default_applications.graphics"]
        print("All done.")


def topo_ansi(gpus, kind):
    """As drivers 590-610 print it: the header row underlined with ANSI escapes even into a pipe."""
    n = len(gpus)
    if kind is None:
        head = "\t".join("GPU%d" % i for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
        print("\t\x1b[4m" + head + "\x1b[0m")
        for i in range(n):
            print("GPU%d\t" % i + "\t".join(" X " if i == j else "NODE" for j in range(n)) + "\t"
                  + "\t".join(affinity(gpus[i])))
        print("\nLegend:\n\n  X    = Self\n  NODE = Connection traversing PCIe as well as the interconnect "
              "between PCIe Host Bridges within a NUMA node")
        return 0
    print(" \t\x1b[4m" + "\t".join("GPU%d" % i for i in range(n)) + "\t\x1b[0m")
    for i in range(n):
        print(" GPU%d\t" % i + "\t".join("X" if i == j else p2p_cell(gpus, i, j, kind) for j in range(n)) + "\t")
    print("\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n  CNS  = Chipset not supported\n  GNS  = GPU not supported"
          "\n  TNS  = Topology not supported\n  NS   = Not supported\n  DR   = Disabled by regkey\n  U    = Unknown")
    return 0


def misbehave():
    """The driver's failure modes: a wedged GPU (never answers), a driver user space cannot reach (exit 9)."""
    if DRIVER.get("mode") == "hang":
        while True:
            time.sleep(3600)
    if DRIVER.get("mode") == "exit9":
        msg = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.")
        print(msg + "\n")
        sys.stderr.write(msg + "\n")
        sys.exit(9)


def main(argv):
    misbehave()
    with open(STATE) as fh:
        table = json.load(fh)
    gpus = table["gpus"]
    known = set(DRIVER.get("fields") or (gpus[0] if gpus else {}))
    ids = fields = fmt = None
    action = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-i", "--id"):
            i += 1
            ids = argv[i]
        elif a.startswith("--id="):
            ids = a.split("=", 1)[1]
        elif a.startswith("--query-gpu="):
            fields = a.split("=", 1)[1]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a in ("-pm", "-pl", "-lgc", "-ac"):
            i += 1
            action = (a, argv[i] if i < len(argv) else "")
        elif a in ("-rgc", "-rac"):
            action = (a, "")
        elif a == "topo":
            return topo(gpus, argv[i + 1:])
        elif a == "--help-query-gpu":
            return help_query_gpu(known)
        else:
            fail("Invalid combination of input arguments: %s" % a)
        i += 1
    if fields:
        return query(selected(gpus, ids), fields, fmt or "csv", known)
    if action is None:
        fail("this stand-in answers --query-gpu, topo, -pm, -pl, -lgc, -rgc, -ac and -rac only")
    key, value = action
    for g in selected(gpus, ids):
        if key in ("-lgc", "-rgc", "-ac", "-rac"):
            clocks(g, key, value)
        elif key == "-pm":
            if value not in ("0", "1"):
                fail('Invalid value "%s" for persistence mode' % value)
            g["persistence_mode"] = "Enabled" if value == "1" else "Disabled"
            print("%s persistence mode for GPU %s." % (g["persistence_mode"], g["pci.bus_id"]))
        else:
            watts = float(value) if value.replace(".", "", 1).isdigit() else -1
            low, high = float(g["power.min_limit"]), float(g["power.max_limit"])
            if not low <= watts <= high:
                fail("Provided power limit %s W is not a valid power limit which should be between %.2f W and "
                     "%.2f W for GPU %s" % (value, low, high, g["pci.bus_id"]))
            print("Power limit for GPU %s was set to %.2f W from %s W." % (g["pci.bus_id"], watts, g["power.limit"]))
            g["power.limit"] = "%.2f" % watts
    save(table)
    return 0


sys.exit(main(sys.argv[1:]))
'''


def _driver_version(p: Preset) -> str:
    for _level, msg in p.kmsg:
        if msg.startswith("NVRM: loading NVIDIA"):
            return msg.split()[-1]
    return "580.65.06"


def gpu_table_entry(index: int, bdf: str, p: Preset) -> dict:
    """One GPU of the nvidia-smi stand-in's table: a healthy, idle RTX PRO 6000 Blackwell."""
    return {
        "index": str(index), "pci.bus_id": "0000" + bdf.upper(), "name": "NVIDIA RTX PRO 6000 Blackwell",
        "persistence_mode": "Enabled" if p.persistenced else "Disabled",
        "ecc.mode.current": "Enabled", "ecc.mode.pending": "Enabled",
        "ecc.errors.uncorrected.volatile.total": "0", "ecc.errors.uncorrected.aggregate.total": "0",
        "retired_pages.pending": "No", "remapped_rows.pending": "No", "remapped_rows.failure": "No",
        "power.limit": "600.00", "power.default_limit": "600.00", "power.max_limit": "600.00",
        "power.min_limit": "150.00", "clocks_event_reasons.active": "0x0000000000000001",
        "utilization.gpu": "0", "driver_version": _driver_version(p),
        "clocks.current.graphics": str(SMI_IDLE_CLOCK), "clocks.applications.graphics": "2430",
        "clocks.applications.memory": "14001", "clocks.default_applications.graphics": "2430",
        "clocks.default_applications.memory": "14001", "clocks.max.graphics": "3090", "clocks.max.memory": "14001",
    }


def apply_gpu_faults(p: Preset, funcs: list, faults: dict) -> set:
    """Change ``funcs`` and ``p.kmsg`` for ``faults``; return the GPU indices the driver does not list."""
    unknown = sorted(set(faults) - set(GPU_FAULTS))
    if unknown:
        raise ValueError(f"unknown GPU fault(s) {', '.join(unknown)}; available: {', '.join(GPU_FAULTS)}")
    gpus = [f for f in funcs if f.vendor == 0x10DE and (f.class_code >> 8) in (0x0300, 0x0302)]
    by_bdf = {f.bdf: f for f in funcs}
    for kind, indices in faults.items():
        for i in indices:
            if not isinstance(i, int) or not 0 <= i < len(gpus):
                raise ValueError(f"GPU fault {kind}: GPU index {i!r} is not one of 0..{len(gpus) - 1}")
    p.kmsg = list(p.kmsg)  # the preset's list is shared by every build
    for i in faults.get("x8", ()):
        for f in (gpus[i], by_bdf.get(gpus[i].parent)):
            if f is not None:
                f.link_width = 8
    for i in faults.get("dead", ()):
        gpus[i].dead = True
    for i in faults.get("xid79", ()):
        p.kmsg.append((3, f"NVRM: Xid (PCI:{gpus[i].bdf[:-2]}): 79, pid='<unknown>', name=<unknown>, "
                          "GPU has fallen off the bus."))
    return set(faults.get("driver_missing", ())) | set(faults.get("dead", ()))


# The drivers the stand-in can play (build(smi_driver=...)): the field set it knows and its version.
# "r470": an R470-era driver, before the clocks_event_reasons rename (it knows only clocks_throttle_reasons.*)
# and without remapped_rows.*; it refuses an unknown field as the real one does (exit 2, message on stdout).
SMI_DRIVERS = {
    "current": None,
    "r470": {"version": "470.256.02",
             "drop": ("clocks_event_reasons.active", "remapped_rows.pending", "remapped_rows.failure"),
             "add": {"clocks_throttle_reasons.active": "clocks_event_reasons.active"}},
}
# How the stand-in answers (build(smi_mode=...)): "answer" as a healthy driver, "hang" never (a wedged GPU),
# "exit9" exit 9 "couldn't communicate with the NVIDIA driver", "garbled" a query answer one column short.
SMI_MODES = ("answer", "hang", "exit9", "garbled")


def smi_driver_of(p: Preset, smi_driver: str, smi_mode: str, smi_ansi: bool) -> dict:
    """What the stand-in plays ({} for a current driver answering in the default format)."""
    if smi_driver not in SMI_DRIVERS:
        raise ValueError(f"smi_driver {smi_driver!r} is not one of {', '.join(SMI_DRIVERS)}")
    if smi_mode not in SMI_MODES:
        raise ValueError(f"smi_mode {smi_mode!r} is not one of {', '.join(SMI_MODES)}")
    out = {}
    if smi_mode != "answer":
        out["mode"] = smi_mode
    if smi_ansi:
        out["ansi"] = True
    return out


def _driver_entry(entry: dict, driver: dict | None) -> dict:
    """A table entry as an older driver reports it: its fields renamed or absent, its version."""
    if not driver:
        return entry
    out = {k: v for k, v in entry.items() if k not in driver["drop"]}
    out.update({new: entry[old] for new, old in driver["add"].items()})
    out["driver_version"] = driver["version"]
    return out


def write_nvidia_smi(t: Tree, p: Preset, funcs: list, faults: dict, missing: set, smi_driver: str = "current",
                     smi_mode: str = "answer", smi_ansi: bool = False) -> None:
    """The node-local nvidia-smi (<root>/usr/bin) and its table, with the faults' fields set."""
    gpus = [f for f in funcs if f.vendor == 0x10DE and (f.class_code >> 8) in (0x0300, 0x0302)]
    driver = SMI_DRIVERS[smi_driver]
    plays = smi_driver_of(p, smi_driver, smi_mode, smi_ansi)
    table = []
    # nvidia-smi numbers GPUs in PCI bus order; fault indices follow build()'s gpu_bdfs.
    for i, f in sorted(enumerate(gpus), key=lambda item: item[1].bdf):
        if i in missing:
            continue
        entry = gpu_table_entry(len(table), f.bdf, p)
        if i in faults.get("row_remap_pending", ()):
            entry["remapped_rows.pending"] = "Yes"
        table.append(_driver_entry(entry, driver))
    t.write(SMI_STATE, json.dumps({"gpus": table}, indent=1))
    if "nvidia" in p.modules:  # the loaded kernel module's version, which nvidia-smi's must match
        t.write("sys/module/nvidia/version", driver["version"] if driver else _driver_version(p))
    script = NVIDIA_SMI_SCRIPT.replace("@STATE@", SMI_STATE).replace("@IDLE_CLOCK@", str(SMI_IDLE_CLOCK))
    script = script.replace("@DRIVER@", repr(json.dumps(plays, sort_keys=True)))
    t.write("usr/bin/nvidia-smi", script.encode(), mode=0o755)
