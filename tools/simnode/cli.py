"""The command line of the simulator: ``python tools/simnode build|list|reboot`` (usage: the package's docstring,
simnode/__init__.py, and ``--help``)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import parts
from .amd import AMD_FAULTS, AMD_SMI_MODES
from .boot import GRUB_DROPIN, JOURNAL, reboot
from .locality import IOMMU_TYPES
from .node import build
from .nvidia import GPU_FAULTS, SMI_DRIVERS, SMI_MODES
from .pci import MIB, set_aer, set_gpu_bar
from .presets import PRESETS
from .services import (
    BENCHMARK_KINDS,
    CLOUD_SYSCTL_FILE,
    NODE_EXPORTER_TEXTFILE_DIR,
    write_node_exporter_dir,
    write_sysctl_file,
    write_unit_state,
)


def _parse_sysctl_file(spec: str) -> tuple:
    """``PATH:KEY=VALUE[,KEY=VALUE]`` -> ``(path, {key: value})``; ValueError names the form."""
    path, sep, pairs = spec.partition(":")
    settings = dict(p.split("=", 1) for p in pairs.split(",") if "=" in p) if sep else {}
    if not path.startswith("/") or not settings:
        raise ValueError(f"--sysctl-file {spec!r}: expected /ABSOLUTE/PATH.conf:KEY=VALUE[,KEY=VALUE...]")
    return path, settings


def _parse_faults(specs: list) -> dict:
    """``["x8=3", "xid79=3,5"]`` -> ``{"x8": [3], "xid79": [3, 5]}``; ValueError names the form."""
    faults: dict = {}
    for spec in specs:
        kind, sep, indices = spec.partition("=")
        try:
            faults.setdefault(kind, []).extend(int(i) for i in indices.split(","))
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--gpu-fault {spec!r}: expected KIND=INDEX[,INDEX...] (kinds: {', '.join(GPU_FAULTS)})")
    return faults


def _reboot_command(args) -> int:
    """0: the node came back as the tuning wants it; 1: it came back with problems; 3: it never came back."""
    if not os.path.isfile(os.path.join(args.dir, "proc/sys/kernel/random/boot_id")):
        print(f"simnode: {args.dir} is not a simulated node (no proc/sys/kernel/random/boot_id)", file=sys.stderr)
        return 2
    report = reboot(args.dir, dropin=args.dropin, journal=args.journal)
    print(json.dumps(report, indent=1, sort_keys=True))
    if not report["returned"]:
        return 3
    return 1 if report["problems"] else 0


def _bars_and_aer(args) -> bool:
    """``--bar`` and ``--aer`` on the built node; False (said on stderr) when one is wrong."""
    try:
        for spec in args.bar:
            where, _eq, mib = spec.rpartition("=")
            bdf, _c, index = where.rpartition(":")
            set_gpu_bar(args.dir, bdf, int(index), int(mib) * MIB)
        for spec in args.aer:
            where, _eq, count = spec.rpartition("=")
            bdf_sev, _c, name = where.rpartition(":")
            bdf, _c, severity = bdf_sev.rpartition(":")
            set_aer(args.dir, bdf, severity, {name: int(count)})
    except (ValueError, OSError) as exc:
        print(f"simnode: {exc}", file=sys.stderr)
        return False
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="simnode", description=sys.modules[__package__].__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write a simulated node under DIR")
    b.add_argument("--preset", required=True, choices=sorted(PRESETS))
    b.add_argument("--cpus", type=int)
    b.add_argument("--gpus", type=int)
    b.add_argument("--kmsg-records", type=int, default=0, help="extra kernel log records (benchmarks)")
    b.add_argument("--nvidia-smi", action="store_true", help="ship a node-local nvidia-smi stand-in")
    b.add_argument("--gpu-fault", action="append", default=[], metavar="KIND=I[,J]",
                   help="a sick GPU (implies --nvidia-smi); kinds: " + ", ".join(GPU_FAULTS))
    b.add_argument("--smi-driver", choices=sorted(SMI_DRIVERS), default="current",
                   help="the driver the nvidia-smi stand-in plays (r470: no clocks_event_reasons, no remapped_rows)")
    b.add_argument("--smi-mode", choices=SMI_MODES, default="answer",
                   help="how the nvidia-smi stand-in answers (hang: never; exit9: driver unreachable)")
    b.add_argument("--smi-ansi", action="store_true", help="ANSI-underlined topo header (drivers 590-610)")
    b.add_argument("--amd-smi", action="store_true", help="ship a node-local amd-smi stand-in (AMD presets)")
    b.add_argument("--amd-fault", action="append", default=[], metavar="KIND=I[,J]",
                   help="an AMD GPU fault (kinds: %s)" % ", ".join(AMD_FAULTS))
    b.add_argument("--amd-smi-mode", choices=AMD_SMI_MODES, default="answer",
                   help="how the amd-smi stand-in answers (implies --amd-smi)")
    b.add_argument("--iommu", choices=IOMMU_TYPES, help="an active IOMMU, groups of this default domain type")
    b.add_argument("--vfio", action="append", default=[], metavar="BDF", help="bind this function to vfio-pci")
    b.add_argument("--benchmark", choices=BENCHMARK_KINDS,
                   help="ship the benchmark stand-in usr/bin/gpunode-sim-bench (inverse: tuning makes it worse)")
    b.add_argument("--sysctl-file", action="append", default=[], metavar="PATH:KEY=VALUE[,KEY=VALUE]",
                   help="a sysctl file of the node's image (e.g. %s:vm.swappiness=60)" % CLOUD_SYSCTL_FILE)
    b.add_argument("--unit-failed", action="append", default=[], metavar="UNIT",
                   help="this systemd unit failed (ships a systemctl stand-in that answers 'show')")
    b.add_argument("--node-exporter", action="store_true",
                   help="the textfile directory of Debian's prometheus-node-exporter (/%s)"
                   % NODE_EXPORTER_TEXTFILE_DIR)
    b.add_argument("--bar", action="append", default=[], metavar="BDF:INDEX=MIB",
                   help="a GPU's BAR at this size in MiB, as firmware without Resizable BAR leaves it "
                   "(0000:41:00.0:1=256)")
    b.add_argument("--aer", action="append", default=[], metavar="BDF:SEVERITY:NAME=N",
                   help="an AER count of a GPU or bridge (severity correctable, nonfatal, fatal; "
                   "0000:40:01.1:fatal:DLP=1)")
    b.add_argument("--kernel", metavar="RELEASE", help="the running kernel's release (e.g. 5.15.0-91-generic)")
    b.add_argument("--cppc-off", action="store_true", help="firmware with ACPI CPPC off (no cpuN/acpi_cppc/)")
    b.add_argument("--nvidia-driver", metavar="FLAVOR:VERSION", help="open:580.65.06 or proprietary:570.86.15")
    parts.add_arguments(b)  # the plugged parts' options (parts.PART_MODULES)
    b.add_argument("dir")
    sub.add_parser("list", help="list presets")
    r = sub.add_parser("reboot", help="reboot the simulated node at DIR (prints what the boot did, as JSON)")
    r.add_argument("--dropin", default=GRUB_DROPIN, help="the GRUB drop-in of the kernel arguments (%(default)s)")
    r.add_argument("--journal", default=JOURNAL, help="the journal of original values (%(default)s)")
    r.add_argument("dir")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for name, spec in sorted(PRESETS.items()):
            print(f"{name}: {spec['description']}")
        return 0
    if args.cmd == "reboot":
        return _reboot_command(args)
    try:
        faults = _parse_faults(args.gpu_fault)
        amd_faults = _parse_faults(args.amd_fault)
        sysctl_files = [_parse_sysctl_file(spec) for spec in args.sysctl_file]
        info = build(args.dir, args.preset, cpus=args.cpus, gpus=args.gpus, kmsg_records=args.kmsg_records,
                     nvidia_smi=args.nvidia_smi, gpu_faults=faults, iommu=args.iommu, vfio=args.vfio,
                     benchmark=args.benchmark, smi_driver=args.smi_driver, smi_mode=args.smi_mode,
                     smi_ansi=args.smi_ansi, amd_smi=args.amd_smi, amd_faults=amd_faults,
                     amd_smi_mode=args.amd_smi_mode, kernel=args.kernel, cppc=not args.cppc_off,
                     nvidia_driver=args.nvidia_driver, **parts.from_args(args))
    except ValueError as exc:
        print(f"simnode: {exc}", file=sys.stderr)
        return 2
    for path, settings in sysctl_files:
        write_sysctl_file(args.dir, path, settings)
    for unit in args.unit_failed:
        write_unit_state(args.dir, unit)
    if not _bars_and_aer(args):
        return 2
    if args.node_exporter:
        write_node_exporter_dir(args.dir)
    print(f"built {info['preset']} at {info['root']}: {info['cpus']} CPUs, {info['gpus']} GPUs")
    return 0
