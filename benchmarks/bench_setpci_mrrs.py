"""Benchmark setpci_mrrs on large simulated nodes.

``bench_setpci_mrrs()`` is importable (a shared benchmark can call it and print its rows);
run as a script it prints a table. Measured per node size:

- ``main()`` in-process, wall time, for: check mode, the first apply (every GPU changes), a
  rerun (nothing changes), and the number of setpci processes (must not grow with GPUs);
- one ``ansible localhost -m gpunode.tuning.setpci_mrrs`` call end to end (module packaging,
  interpreter start-up and all), on a freshly built node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, ".collections"), os.path.join(REPO, "tools"), os.path.join(REPO, "benchmarks")]

import simnode  # noqa: E402  (tools/ is put on sys.path above)
from bench_modules import run_main  # noqa: E402  (one in-process runner for every benchmark)


def _ansible_cli(root, mrrs):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    argv = [os.path.join(REPO, ".venv/bin/ansible"), "localhost", "-m", "gpunode.tuning.setpci_mrrs",
            "-a", "mrrs=%d root=%s" % (mrrs, root),
            "-e", "ansible_python_interpreter=%s" % os.path.join(REPO, ".venv/bin/python")]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError("ansible failed (rc %d): %s" % (proc.returncode, proc.stdout[-2000:] + proc.stderr[-2000:]))
    return elapsed


def bench_setpci_mrrs(cpus=384, gpu_counts=(8, 16, 32), cli=True):
    """Return one row (dict) per GPU count with the timings described in the module docstring."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-setpci-mrrs.") as tmp:
        for gpus in gpu_counts:
            root = os.path.join(tmp, "node%d" % gpus)
            simnode.build(root, "audited-epyc-8gpu", cpus=cpus, gpus=gpus)
            base = {"mrrs": 4096, "root": root}
            t_check, _checked = run_main("setpci_mrrs", base, check=True)
            t_apply, applied = run_main("setpci_mrrs", base)
            t_rerun, rerun = run_main("setpci_mrrs", base)
            assert applied["changed"] and not rerun["changed"], (applied, rerun)
            row = {
                "cpus": cpus, "gpus": gpus, "devices_changed": sum(d["changed"] for d in applied["devices"]),
                "main_check_ms": round(t_check * 1000, 1), "main_apply_ms": round(t_apply * 1000, 1),
                "main_rerun_ms": round(t_rerun * 1000, 1), "setpci_processes_apply": applied["setpci_calls"],
                "setpci_processes_rerun": rerun["setpci_calls"],
            }
            if cli:
                fresh = os.path.join(tmp, "cli%d" % gpus)
                simnode.build(fresh, "audited-epyc-8gpu", cpus=cpus, gpus=gpus)
                row["ansible_cli_apply_s"] = round(_ansible_cli(fresh, 4096), 2)
                row["ansible_cli_rerun_s"] = round(_ansible_cli(fresh, 4096), 2)
            rows.append(row)
    return rows


def main():
    for row in bench_setpci_mrrs():
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
