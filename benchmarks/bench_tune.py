#!/usr/bin/env python
"""Does a runtime tuning cost the same on a small node and on a big one?

Builds fresh simulated nodes (tools/simnode, preset audited-epyc-8gpu) of two sizes,
8 CPUs / 1 GPU and 384 CPUs / 16 GPUs, runs ``playbooks/tune.yml --tags runtime`` against each
(first run: every knob changes), and reports

* the wall time of each run (median over --rounds, sizes alternated to spread machine noise),
  and the ratio big/small (target <= 1.10: the roles never loop over CPUs or devices);
* the module calls the runtime tag made per host, from the JSON callback: calls of the
  collection's modules (target: at most one per knob family) and all tasks run.

Usage: .venv/bin/python benchmarks/bench_tune.py [--rounds N] [--strict]
With --strict the exit status is 1 when a target is missed. Not a test: wall times depend on the
machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

import simnode  # noqa: E402  (tools/ is put on sys.path above)

VENV_BIN = os.path.join(REPO, ".venv", "bin")
SIZES = {"small": dict(cpus=8, gpus=1), "big": dict(cpus=384, gpus=16)}
FAMILIES = 5  # pcie_mrrs, cpuidle, cpufreq, tunables (numa_balancing, THP, sysctl), kmod
RATIO_TARGET = 1.10


def run_runtime(root, workdir):
    """Run the runtime tag against one simulated root; return (wall seconds, parsed JSON output)."""
    inventory = os.path.join(workdir, "hosts.ini")
    with open(inventory, "w") as fh:
        fh.write(
            "[gpunodes]\nsim ansible_connection=local ansible_python_interpreter=%s gpunode_tuning_root=%s\n"
            % (os.path.join(VENV_BIN, "python"), root)
        )
    env = dict(
        os.environ,
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".collections"),
        PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
    )
    cmd = [
        os.path.join(VENV_BIN, "ansible-playbook"),
        "-i",
        inventory,
        os.path.join(REPO, "playbooks", "tune.yml"),
        "--tags",
        "runtime",
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit("runtime run failed on %s:\n%s\n%s" % (root, proc.stdout[-4000:], proc.stderr[-2000:]))
    return wall, json.loads(proc.stdout)


def count_calls(report):
    """(collection module calls, all tasks run) for the single host of a JSON callback report."""
    modules = tasks = 0
    for play in report["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get("sim")
            if result is None or result.get("skipped"):
                continue
            tasks += 1
            if result.get("action", "").startswith("gpunode.tuning."):
                modules += 1
    return modules, tasks


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)

    walls = {name: [] for name in SIZES}
    calls = {}
    with tempfile.TemporaryDirectory(prefix="bench_tune.") as tmp:
        for rnd in range(args.rounds):
            order = list(SIZES) if rnd % 2 == 0 else list(reversed(SIZES))
            for name in order:
                work = os.path.join(tmp, "%s-%d" % (name, rnd))
                os.makedirs(work)
                root = os.path.join(work, "node")
                simnode.build(root, "audited-epyc-8gpu", **SIZES[name])
                wall, report = run_runtime(root, work)
                walls[name].append(wall)
                calls[name] = count_calls(report)
                print(
                    "round %d %-5s %3d CPUs %2d GPUs: %.2f s"
                    % (rnd + 1, name, SIZES[name]["cpus"], SIZES[name]["gpus"], wall),
                    flush=True,
                )

    med = {name: statistics.median(v) for name, v in walls.items()}
    ratio = med["big"] / med["small"]
    print()
    print("%-6s %6s %6s %10s %14s %10s" % ("node", "CPUs", "GPUs", "median s", "module calls", "tasks run"))
    for name in SIZES:
        print(
            "%-6s %6d %6d %10.2f %14d %10d"
            % (name, SIZES[name]["cpus"], SIZES[name]["gpus"], med[name], calls[name][0], calls[name][1])
        )
    ok_ratio = ratio <= RATIO_TARGET
    ok_calls = all(c[0] <= FAMILIES for c in calls.values())
    print("ratio big/small: %.3f (target <= %.2f): %s" % (ratio, RATIO_TARGET, "ok" if ok_ratio else "MISSED"))
    print(
        "collection module calls per host: %s (target <= %d, one per family; the journal is written by "
        "those calls): %s" % (sorted({c[0] for c in calls.values()}), FAMILIES, "ok" if ok_calls else "MISSED")
    )
    if args.strict and not (ok_ratio and ok_calls):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
