"""What a node's image brings beside the kernel: the benchmark stand-in, sysctl files, systemd units, node exporter."""

from __future__ import annotations

import json
import os

from .tree import Tree

BENCHMARK_KINDS = ("normal", "inverse", "hang")
BENCHMARK_BIN = "usr/bin/gpunode-sim-bench"

# Stand-in for a node benchmark (the rollout's measure gate, gpunode_tuning_rollout_benchmark_command):
# one number, higher is better, computed from the node's simulated state, never a GPU. Per GPU:
# its MRRS / 512, plus 1 when no bridge above it redirects peer traffic (ACS ReqRedir/CmpltRedir
# off). The inverse kind prints 100 / that score, so tuning makes it WORSE. The node root is
# GPUNODE_ROOT, else the directory two levels above this file's usr/bin.
BENCH_SCRIPT = r"""#!/usr/bin/env python3
import glob, os, sys, time
ROOT = os.environ.get("GPUNODE_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KIND = "@KIND@"


def config(path):
    with open(os.path.join(path, "config"), "rb") as fh:
        return fh.read()


def word(cfg, pos, size=2):
    return int.from_bytes(cfg[pos:pos + size], "little")


def mrrs(cfg):
    pos = cfg[0x34]
    for _step in range(48):  # the standard capability list, to the PCI Express capability
        if pos < 0x40 or pos + 10 > len(cfg):
            return 128
        if cfg[pos] == 0x10:
            return 128 << ((word(cfg, pos + 8) >> 12) & 7)
        pos = cfg[pos + 1]
    return 128


def redirected(cfg):
    pos = 0x100
    for _step in range(64):  # the extended capability list, to ACS (ID 0x000D)
        header = word(cfg, pos, 4) if pos + 8 <= len(cfg) else 0
        if header & 0xFFFF == 0x000D:
            return bool(word(cfg, pos + 6) & 0x000C)
        if header == 0 or header >> 20 < 0x100:
            return False
        pos = header >> 20
    return False


def score(gpu):
    cfg = config(gpu)
    value = mrrs(cfg) / 512.0
    path = os.path.dirname(os.path.realpath(gpu))
    while len(os.path.basename(path)) == 12 and os.path.isfile(os.path.join(path, "config")):
        if redirected(config(path)):
            return value
        path = os.path.dirname(path)
    return value + 1.0


if KIND == "hang":  # a benchmark that never finishes (a wedged GPU under load)
    while True:
        time.sleep(3600)
total = 0.0
for dev in sorted(glob.glob(os.path.join(ROOT, "sys/bus/pci/devices/*"))):
    cfg = config(dev)
    if word(cfg, 0) == 0x10DE and cfg[0x0B] == 0x03:
        total += score(dev)
if total <= 0:
    sys.exit("gpunode-sim-bench: no GPU under %s" % ROOT)
print("%.4f" % (100.0 / total if KIND == "inverse" else total))
"""


def write_benchmark(root: str, kind: str = "normal") -> str:
    """Write the benchmark stand-in (<root>/usr/bin/gpunode-sim-bench) of ``kind``; return its path."""
    if kind not in BENCHMARK_KINDS:
        raise ValueError(f"benchmark {kind!r} is not one of {', '.join(BENCHMARK_KINDS)}")
    t = Tree(root)
    t.write(BENCHMARK_BIN, BENCH_SCRIPT.replace("@KIND@", kind).encode(), mode=0o755)
    return t.path(BENCHMARK_BIN)


# -- The node's own boot configuration: a sysctl file of its image, the state of a systemd unit

# What a cloud image ships (NVIDIA/aicr#239: Ubuntu 24.04.4 AMIs have /etc/sysctl.d/cloud-optimization.conf
# with vm.swappiness=60). Its name sorts after 90-gpunode-tuning.conf, so it wins at boot.
CLOUD_SYSCTL_FILE = "/etc/sysctl.d/cloud-optimization.conf"
CLOUD_SYSCTL = {"vm.swappiness": "60"}
UNIT_STATE = "var/lib/simnode/units.json"

# Stand-in for systemctl on a simulated node (written by tools/simnode): only `show
# --property=...` of the units in the node's own table (UNIT_STATE); anything else fails.
SYSTEMCTL_SCRIPT = r'''#!/usr/bin/env python3
import json, os, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
args = [a for a in sys.argv[1:] if a != "--"]
if not args or args[0] != "show":
    sys.stderr.write("systemctl (simulated node): only 'show' is simulated\n")
    sys.exit(1)
props = [p for a in args if a.startswith("--property=") for p in a.split("=", 1)[1].split(",")]
units = [a for a in args[1:] if not a.startswith("-")]
with open(os.path.join(ROOT, "@STATE@")) as fh:
    table = json.load(fh)
for unit in units:
    state = table.get(unit, {"ActiveState": "inactive", "SubState": "dead", "Result": "success",
                             "ExecMainStatus": "0"})
    for p in props or sorted(state):
        print("%s=%s" % (p, state.get(p, "")))
'''


def write_sysctl_file(root: str, path: str = CLOUD_SYSCTL_FILE, settings: dict | None = None) -> str:
    """A sysctl file of the node's own (``KEY = VALUE`` lines) at ``path``; the cloud image's by default."""
    t = Tree(root)
    lines = ["# written by tools/simnode: a file of the node's image, not of gpunode.tuning"]
    lines += ["%s = %s" % (k, v) for k, v in (CLOUD_SYSCTL if settings is None else settings).items()]
    t.write(path, "\n".join(lines))
    return t.path(path)


def write_unit_state(root: str, unit: str, active_state: str = "failed", result: str = "exit-code",
                     exec_main_status: int = 1) -> None:
    """Record a systemd unit's state in the node's table and ship the systemctl stand-in (``usr/bin``)."""
    t = Tree(root)
    table = {}
    if os.path.exists(t.path(UNIT_STATE)):
        with open(t.path(UNIT_STATE), encoding="utf-8") as fh:
            table = json.load(fh)
    table[unit] = {"ActiveState": active_state, "SubState": "failed" if active_state == "failed" else "exited",
                   "Result": result, "ExecMainStatus": str(exec_main_status)}
    t.write(UNIT_STATE, json.dumps(table, indent=1, sort_keys=True))
    t.write("usr/bin/systemctl", SYSTEMCTL_SCRIPT.replace("@STATE@", UNIT_STATE).encode(), mode=0o755)


NODE_EXPORTER_TEXTFILE_DIR = "var/lib/prometheus/node-exporter"


def write_node_exporter_dir(root: str) -> str:
    """The textfile collector directory Debian's prometheus-node-exporter package creates (empty)."""
    t = Tree(root)
    t.mkdir(NODE_EXPORTER_TEXTFILE_DIR)
    return t.path(NODE_EXPORTER_TEXTFILE_DIR)
