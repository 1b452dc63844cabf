"""ansible-playbook runs from the checkout, and what tests read from their output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

from support.checkout import REPO, VENV_BIN, ansible_env

RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.M)
_RECAP_KEYS = ("ok", "changed", "unreachable", "failed", "skipped")


def recap(stdout):
    """The PLAY RECAP of a run: ``{host: {"ok": n, "changed": n, "unreachable": n, "failed": n, "skipped": n}}``."""
    return {m.group(1): dict(zip(_RECAP_KEYS, map(int, m.groups()[1:]), strict=True)) for m in RECAP.finditer(stdout)}


def run_playbook(playbook, inventory, *args, env=None):
    """Run ``playbooks/<playbook>`` of the checkout against ``inventory`` (from the checkout, whose
    ansible.cfg applies); the completed process, with ``recap`` and ``wall`` (seconds) added."""
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", str(inventory), os.path.join(REPO, "playbooks", playbook),
           *args]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env or ansible_env(), capture_output=True, text=True, timeout=600,
                          check=False)
    proc.wall = time.monotonic() - start
    proc.recap = recap(proc.stdout)
    return proc


def assert_ok(proc):
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def failure_summary(proc, host):
    """The message of the host's last failed task: the summary that ends a flow."""
    prefix = "fatal: [%s]: FAILED! => " % host
    lines = [line for line in proc.stdout.splitlines() if line.startswith(prefix)]
    assert lines, proc.stdout[-6000:]
    return json.loads(lines[-1][len(prefix):])["msg"]


def rollout(fleet_dir, *extra, cwd=REPO, module_runs=None):
    """Run playbooks/rollout.yml over the fleet in fleet_dir (tools/simfleet.py); return (process,
    summary dict or None, report dir).

    From the checkout, reports go to fleet_dir/reports (an absolute gpunode_tuning_report_dir);
    from another ``cwd``, to the default reports/ there. ``module_runs``: a file the module runs are
    counted into per host (benchmarks/callback_plugins/module_runs.py).
    """
    reports = os.path.join(fleet_dir, "reports") if cwd == REPO else os.path.join(cwd, "reports")
    env = ansible_env()
    if module_runs:
        env.update(ANSIBLE_CALLBACK_PLUGINS=os.path.join(REPO, "benchmarks", "callback_plugins"),
                   ANSIBLE_CALLBACKS_ENABLED="module_runs", BENCH_MODULE_RUNS_OUT=module_runs)
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", os.path.join(fleet_dir, "hosts.yml"),
           os.path.join(REPO, "playbooks", "rollout.yml"), "-f", "4"]
    if cwd == REPO:
        cmd += ["-e", "gpunode_tuning_report_dir=%s" % reports]
    cmd += list(extra)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    path = os.path.join(reports, "rollout-summary.json")
    summary = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)
    return proc, summary, reports


def by_host(summary):
    """The rollout summary's results by host name."""
    return {r["host"]: r for r in summary["results"]}
