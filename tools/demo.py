#!/usr/bin/env python
"""The whole gpunode.tuning workflow on a simulated copy of the audited node (`make demo`).

Builds a fresh simulated `audited-epyc-8gpu` node under .cache/simnodes/sim-audited and runs,
against it, what an operator runs against a fleet (inventories/simulated):

  1. audit       verify.yml                          drift expected: the node is untuned
  2. plan        tune.yml --tags runtime --check --diff   nothing written
  3. runtime     tune.yml --tags runtime             apply now, originals journaled
  4. verify      verify.yml                          applied, except the cpufreq driver
  5. persistent  tune.yml --tags persistent          drop-ins, boot unit, amd_pstate=active
  6. verify      verify.yml                          driver pending a reboot: passes
  7. rollback    rollback.yml                        journaled values back, our files gone
  8. verify      verify.yml                          drift again: the original node

Nothing outside the simulated tree and reports/demo/ is touched. The script fails when a step's
exit status is not the expected one, or when rollback does not give back the original tree.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

import simnode  # noqa: E402  (tools/ is put on sys.path above)

NODE = os.path.join(REPO, ".cache", "simnodes", "sim-audited")
REPORTS = os.path.join(REPO, "reports", "demo")
INVENTORY = os.path.join(REPO, "inventories", "simulated")
# The simulated modprobe appends nvidia_peermem's failure to the kernel log, as a kernel would;
# a kernel log is not something a rollback can or should undo.
APPEND_ONLY = {"dev/kmsg"}

STEPS = [
    ("audit", "verify.yml", [], 2, "the untuned node drifts from the inference-throughput preset"),
    ("plan", "tune.yml", ["--tags", "runtime", "--check", "--diff"], 0, "what runtime tuning would change"),
    ("runtime", "tune.yml", ["--tags", "runtime"], 0, "apply now; originals go to the journal"),
    ("verify", "verify.yml", [], 2, "all applied except the cpufreq driver: acpi-cpufreq -> amd-pstate needs a "
     "kernel argument and a reboot"),
    ("persistent", "tune.yml", ["--tags", "persistent"], 0, "survive reboot: drop-ins, boot unit, amd_pstate=active"),
    ("verify", "verify.yml", [], 0, "the driver is now pending a reboot, which alone does not fail"),
    ("rollback", "rollback.yml", [], 0, "restore the journaled values, remove every file of ours"),
    ("verify", "verify.yml", [], 2, "the original, untuned node again"),
]


def tree_digest(root):
    """sha256 over every path, file content and link target below root, except append-only files."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            h.update(rel.encode() + b"\0")
            if os.path.islink(full):
                h.update(os.readlink(full).encode())
            elif rel not in APPEND_ONLY:
                with open(full, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


def banner(text):
    print("\n" + "=" * 100 + "\n== " + text + "\n" + "=" * 100, flush=True)


def run_step(number, name, playbook, args, report_dir):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_DISPLAY_SKIPPED_HOSTS="false", ANSIBLE_NOCOLOR=os.environ.get("ANSIBLE_NOCOLOR", "1"))
    cmd = [os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", INVENTORY,
           os.path.join(REPO, "playbooks", playbook), *args]
    if playbook == "verify.yml":
        cmd += ["-e", "gpunode_tuning_report_dir=%s" % report_dir]
    shown = " ".join(["ansible-playbook", "-i", "inventories/simulated", "playbooks/" + playbook, *args])
    banner("step %d, %s: %s" % (number, name, shown))
    start = time.monotonic()
    rc = subprocess.call(cmd, cwd=REPO, env=env)
    return rc, time.monotonic() - start


def main():
    if os.path.exists(NODE):
        shutil.rmtree(NODE)
    if os.path.exists(REPORTS):
        shutil.rmtree(REPORTS)
    info = simnode.build(NODE, "audited-epyc-8gpu")
    original = tree_digest(NODE)
    banner("simulated node %s: %d CPUs, %d GPUs at %s" % (info["preset"], info["cpus"], info["gpus"],
                                                          os.path.relpath(NODE, REPO)))

    results = []
    for number, (name, playbook, args, expected, meaning) in enumerate(STEPS, 1):
        report_dir = os.path.join(REPORTS, "%d-%s" % (number, name))
        rc, seconds = run_step(number, name, playbook, args, report_dir)
        summary = os.path.join(report_dir, "fleet-summary.md")
        if playbook == "verify.yml" and os.path.exists(summary):
            with open(summary, encoding="utf-8") as fh:
                print("\n--- %s\n%s" % (os.path.relpath(summary, REPO), fh.read()))
        results.append((number, name, rc, expected, seconds, meaning))

    identical = tree_digest(NODE) == original
    banner("summary")
    print("%-3s %-11s %-4s %-9s %7s  %s" % ("#", "step", "rc", "expected", "seconds", "meaning"))
    ok = True
    for number, name, rc, expected, seconds, meaning in results:
        mark = "" if rc == expected else "  <-- UNEXPECTED"
        ok = ok and rc == expected
        print("%-3d %-11s %-4d %-9d %7.1f  %s%s" % (number, name, rc, expected, seconds, meaning, mark))
    print("\nafter rollback the simulated tree is %s its original (kernel log aside)"
          % ("identical to" if identical else "DIFFERENT from"))
    print("reports: %s (JSON, JUnit XML and Markdown per host; fleet-summary.md per step)"
          % os.path.relpath(REPORTS, REPO))
    if not (ok and identical):
        print("demo: FAILED", file=sys.stderr)
        return 1
    print("demo: every step behaved as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
