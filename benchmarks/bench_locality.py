#!/usr/bin/env python
"""Cost of the gpu_locality family's read on a large node, against a small one (docs/gpu-locality.md).

Builds two simulated nodes from the 2-socket switch preset (tools/simnode): a small one (8 CPUs,
2 GPUs, 16 MSI-X vectors per NIC) and a large one (384 CPUs, 16 GPUs behind 8 switches, a NIC under
every switch and one on a root port, 384 MSI-X vectors per NIC: one per CPU, as mlx5 allocates them,
so thousands of IRQs), then times, best of N rounds each: ``gpu_locality.read`` (the facts),
``evaluate`` + ``export`` + ``report`` (verification's share) and the whole ``facts.gather`` of
tuning_info. Prints a table and writes it as JSON with --json.

    .venv/bin/python benchmarks/bench_locality.py [--rounds 5] [--json reports/bench_locality.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, ".collections"))
sys.path.insert(0, os.path.join(REPO, "tools"))

import simnode  # noqa: E402

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node  # noqa: E402
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_locality, gpu_locality_verify  # noqa: E402
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify as facts  # noqa: E402

DESIRED = {"gpu_locality": {"remote_irqs_fail": False, "export": gpu_locality.EXPORT_PATH}}
NODES = {
    "small": dict(cpus=8, gpus=2, nic_queues=16, nics_every=0),
    "large": dict(cpus=384, gpus=16, nic_queues=384, nics_every=1),
}


def best(fn, rounds):
    times = []
    for _round in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(root, rounds):
    node = Node.open(root)
    loc = gpu_locality.read(node)
    f = {"gpu_locality": loc}
    irqs = sum(d["irqs"]["count"] for d in loc["gpus"] + loc["nics"])
    return {
        "pci_functions": len(os.listdir(os.path.join(root, "sys/bus/pci/devices"))),
        "gpus": len(loc["gpus"]), "nics": len(loc["nics"]), "irqs": irqs,
        "read_s": best(lambda: gpu_locality.read(node), rounds),
        "verify_s": best(lambda: (gpu_locality_verify.evaluate(f, DESIRED), gpu_locality_verify.export(f, DESIRED),
                                  gpu_locality_verify.report(f, DESIRED)), rounds),
        "gather_s": best(lambda: facts.gather(node), rounds),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-locality.") as tmp:
        for name, spec in NODES.items():
            preset = "bench-locality-%s" % name
            simnode.PRESETS[preset] = dict(simnode.PRESETS["xeon-2s-8gpu-switches"], nic_queues=spec["nic_queues"],
                                           nics_every=spec["nics_every"])
            root = os.path.join(tmp, name)
            simnode.build(root, preset, cpus=spec["cpus"], gpus=spec["gpus"])
            out[name] = dict(measure(root, args.rounds), cpus=spec["cpus"])
    print("| node | CPUs | GPUs | NICs | PCI functions | IRQs | read | evaluate+export+report | tuning_info gather |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, m in out.items():
        print("| %s | %d | %d | %d | %d | %d | %.1f ms | %.1f ms | %.1f ms |" % (
            name, m["cpus"], m["gpus"], m["nics"], m["pci_functions"], m["irqs"], m["read_s"] * 1e3,
            m["verify_s"] * 1e3, m["gather_s"] * 1e3))
    ratio = out["large"]["read_s"] / out["small"]["read_s"]
    print("\nread, large / small: x%.1f for x%.0f IRQs" % (ratio, out["large"]["irqs"] / out["small"]["irqs"]))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
