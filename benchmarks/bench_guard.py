"""CPU cost of one guard run, as gpunode-tuning-guard.service runs it, on simulated nodes.

The guard is installed the way the persistent flow installs it (the boot runner from
boot.runner_text carrying every module_utils file, the config from module_utils/flows/guard_files.py), the node is
tuned once by a guard run with reapply, and then the read-only runs are measured: a new process
each time (``python3 -I -B RUNNER guard --config ... --root NODE``, the node's python3), its user
plus system CPU from ``getrusage(RUSAGE_CHILDREN)``, process start and the code cache included.
"cold" is the first run without a code cache (it compiles the carried module_utils and writes the
cache); "warm" the later ones.

    .venv/bin/python benchmarks/bench_guard.py [--runs 15] [--python /usr/bin/python3] [--json]

Target (issue 23): at most 0.3 s of CPU per run on the 384-CPU / 16-GPU node. The script reports,
it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, ".collections"), os.path.join(REPO, "tools")]

import simnode  # noqa: E402  (tools/ is put on sys.path above)

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot, guard_files  # noqa: E402

RUNNER = "/usr/local/lib/gpunode-tuning/apply-boot-tuning.sh"
CACHE = "var/lib/gpunode-tuning/guard-code.cache"
NODES = [
    ("8 CPUs, 1 GPU", dict(cpus=8, gpus=1, kmsg_records=0)),
    ("384 CPUs, 16 GPUs", dict(cpus=384, gpus=16, kmsg_records=0)),
    ("384 CPUs, 16 GPUs, 100k-record kernel log", dict(cpus=384, gpus=16, kmsg_records=100_000)),
]
# The role's desired state for the inference-throughput preset (roles/tuning/vars/main.yml).
SELECTOR = {"vendor": "10de", "class_prefixes": ["0300", "0302"]}
SYSCTL = {"vm.swappiness": 10, "net.core.rmem_max": 134217728, "net.core.wmem_max": 134217728,
          "net.core.somaxconn": 65535, "kernel.numa_balancing": 0}
DESIRED = {
    "pcie_mrrs": dict(SELECTOR, mrrs=4096, device=None, bdfs=None, allow_empty=True),
    "cpuidle": {"disable": [], "max_latency_us": 100, "cpus": None},
    "cpufreq": {"governor": "performance", "epp": None, "boost": None, "driver": "native",
                "amd_pstate_mode": "active", "intel_pstate_status": None},
    "numa_balancing": 0, "thp": {"enabled": "madvise", "defrag": "defer+madvise"}, "sysctl": SYSCTL,
    "kmod": {"modules": [{"name": "nvidia_peermem", "params": {}, "required": False}]}, "kernel_cmdline": [],
    "pcie_acs": dict(SELECTOR, mode="disable_redirect", persist="boot_unit", device=None, bdfs=None, allow_empty=True),
    "gpu_health": {"gpu_count": None, "dcgm_diag": False}, "gpu_p2p": {"min_gbps": None},
}


def install(root, python, reapply):
    text = boot.runner_text(boot.carried_sources(os.path.join(REPO, "plugins", "module_utils")))
    files = [{"path": RUNNER, "content": text}] + guard_files.installed_files({
        "python": python, "runner": RUNNER, "journal": "/var/lib/gpunode-tuning/journal.json",
        "textfile_dir": "/" + simnode.NODE_EXPORTER_TEXTFILE_DIR, "interval": "5min", "reapply": reapply,
        "preset": "inference-throughput", "host": "bench", "desired": DESIRED,
        "facts": {"pci_selector": SELECTOR, "sysctls": sorted(SYSCTL), "modules": ["nvidia_peermem"],
                  "kmsg_levels": ["err", "warn"], "kmsg_ignore": None}, "verify": {}})
    for f in files:
        full = os.path.join(root, f["path"].lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(f["content"])


def run_once(root, python):
    """``(cpu seconds, wall seconds, stdout)`` of one guard process."""
    env = dict(os.environ, GPUNODE_TUNING_CODE_CACHE=os.path.join(root, CACHE))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([python, "-I", "-B", os.path.join(root, RUNNER.lstrip("/")), "guard", "--config",
                           guard_files.CONFIG_PATH, "--root", root], capture_output=True, text=True, check=False,
                          cwd="/", env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit("guard failed (rc %d): %s%s" % (proc.returncode, proc.stdout, proc.stderr))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.stdout.strip().splitlines()[-1]


def measure(label, spec, runs, python, base):
    root = os.path.join(base, label.split(",")[0].replace(" ", "-") + "-%d" % spec["kmsg_records"])
    simnode.build(root, "audited-epyc-8gpu", **spec)
    simnode.write_node_exporter_dir(root)
    install(root, python, reapply=True)
    run_once(root, python)  # tunes the node (MRRS, ACS, C-states, governor, THP) as the boot unit would
    for key, value in (("kernel/numa_balancing", "0"), ("vm/swappiness", "10"), ("net/core/rmem_max", "134217728"),
                       ("net/core/wmem_max", "134217728"), ("net/core/somaxconn", "65535")):
        with open(os.path.join(root, "proc/sys", key), "w", encoding="utf-8") as fh:
            fh.write(value + "\n")
    install(root, python, reapply=False)
    os.unlink(os.path.join(root, CACHE))
    cold = run_once(root, python)
    warm = [run_once(root, python) for _run in range(runs)]
    with open(os.path.join(root, "var/lib/prometheus/node-exporter/gpunode-tuning.prom"), encoding="utf-8") as fh:
        samples = sum(1 for line in fh if line.strip() and not line.startswith("#"))
    cpus = [c for c, _w, _o in warm]
    return {"node": label, "cold_cpu_s": round(cold[0], 3), "warm_cpu_s_min": round(min(cpus), 3),
            "warm_cpu_s_median": round(statistics.median(cpus), 3), "warm_cpu_s_max": round(max(cpus), 3),
            "warm_wall_s_median": round(statistics.median(w for _c, w, _o in warm), 3), "runs": runs,
            "series": samples, "last_line": warm[-1][2]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--python", default="/usr/bin/python3", help="the node's python3 the unit runs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-guard.") as base:
        rows = [measure(label, spec, args.runs, args.python, base) for label, spec in NODES]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print("| Node | cold CPU (s) | warm CPU min / median / max (s) | warm wall median (s) | series |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print("| %s | %.3f | %.3f / %.3f / %.3f | %.3f | %d |" % (
            r["node"], r["cold_cpu_s"], r["warm_cpu_s_min"], r["warm_cpu_s_median"], r["warm_cpu_s_max"],
            r["warm_wall_s_median"], r["series"]))
    print("\n%s (python %s, %d warm runs each; last run: %s)" % (
        time.strftime("%Y-%m-%d"), args.python, args.runs, rows[-1]["last_line"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
