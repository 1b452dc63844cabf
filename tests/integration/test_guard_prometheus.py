"""The guard's metrics and rules with the real tools: promtool, node_exporter and a Prometheus server.

Debian's ``prometheus`` (with promtool) and ``prometheus-node-exporter`` packages, installed by
``scripts/setup.sh --tests`` without their services: the end-to-end test starts its own
node_exporter (textfile collector only) and Prometheus (the shipped rules loaded, 1 s scrape and
evaluation) on loopback ports picked at run time, waits for each answer with a deadline, and stops
both at the end, also when it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from support.checkout import REPO
from support.nodes import inject_drift
from support.runner import PROM, run_guard

RULES = os.path.join(REPO, "roles/tuning/files/prometheus/gpunode-tuning.rules.yml")
RULE_TESTS = os.path.join(REPO, "tests/prometheus/gpunode-tuning.rules.test.yml")
SETUP = "install it with scripts/setup.sh --tests (Debian packages prometheus and prometheus-node-exporter)"
WAIT = 60  # seconds any one answer may take


def tool(name):
    path = shutil.which(name) or (("/usr/bin/" + name) if os.access("/usr/bin/" + name, os.X_OK) else None)
    assert path, "%s is not installed: %s" % (name, SETUP)
    return path


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback URLs the test built)
        return resp.read().decode()


def wait_for(what, check, procs, deadline=WAIT):
    """Poll ``check()`` until it returns something true; fail naming ``what`` (and a process that died)."""
    end = time.monotonic() + deadline
    last = None
    while time.monotonic() < end:
        for name, proc in procs.items():
            assert proc.poll() is None, "%s exited with %s while waiting for %s" % (name, proc.returncode, what)
        try:
            result = check()
        except OSError as exc:  # not listening yet
            result, last = None, exc
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError("no %s within %d s (last error: %s)" % (what, deadline, last))


def query(port, expr):
    """The vector result of an instant query of Prometheus' HTTP API."""
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": expr}))
    body = json.loads(get(url))
    assert body["status"] == "success", body
    return body["data"]["result"]


def stop(procs):
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def test_rules_pass_promtool_check_and_their_unit_tests():
    promtool = tool("promtool")
    check = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 15 rules found" in check.stdout
    tests = subprocess.run([promtool, "test", "rules", os.path.basename(RULE_TESTS)], capture_output=True, text=True,
                           check=False, cwd=os.path.dirname(RULE_TESTS))
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "SUCCESS" in tests.stdout


def start(name, argv, log_dir):
    """A process with its output in ``log_dir/NAME.log`` (the file is closed when the process is stopped)."""
    with open(os.path.join(log_dir, name + ".log"), "wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=log_dir)


def prometheus_config(path, exporter_port):
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                 "rule_files:\n  - %s\n"
                 "scrape_configs:\n  - job_name: node\n    static_configs:\n"
                 "      - targets: ['127.0.0.1:%d']\n" % (RULES, exporter_port))


def test_drift_reaches_prometheus_and_the_drift_alert(tmp_path, tuned_node):
    promtool, exporter, prometheus = tool("promtool"), tool("prometheus-node-exporter"), tool("prometheus")
    root, _inventory, _before = tuned_node("sim-e2e")
    run_guard(root)
    prom = os.path.join(root, PROM)
    with open(prom, "rb") as fh:
        lint = subprocess.run([promtool, "check", "metrics"], input=fh.read(), capture_output=True, check=False)
    assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()

    exporter_port, prometheus_port = free_port(), free_port()
    prometheus_config(tmp_path / "prometheus.yml", exporter_port)
    logs = str(tmp_path)
    procs = {}
    passed = False
    try:
        procs["node_exporter"] = start("node_exporter", [
            exporter, "--web.listen-address=127.0.0.1:%d" % exporter_port, "--collector.disable-defaults",
            "--collector.textfile", "--collector.textfile.directory=%s" % os.path.dirname(prom)], logs)
        wait_for("gpunode_tuning_info from node_exporter",
                 lambda: "gpunode_tuning_info{" in get("http://127.0.0.1:%d/metrics" % exporter_port), procs)
        procs["prometheus"] = start("prometheus", [
            prometheus, "--config.file=%s" % (tmp_path / "prometheus.yml"),
            "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
            "--web.listen-address=127.0.0.1:%d" % prometheus_port], logs)
        wait_for("the guard's verdict in Prometheus",
                 lambda: query(prometheus_port, 'gpunode_tuning_host_verdict{verdict="pass"} == 1'), procs)
        assert query(prometheus_port, 'node_textfile_mtime_seconds{file=~".*gpunode-tuning.prom"}')
        assert query(prometheus_port, 'gpunode_tuning_setting_state{state="drifted"} == 1') == []

        inject_drift(root)
        run_guard(root)

        def drifted():
            result = query(prometheus_port, 'gpunode_tuning_setting_state{state="drifted"} == 1')
            return {(r["metric"]["family"], r["metric"]["setting"]) for r in result}

        wait_for("the drift in Prometheus", lambda: drifted() == {("numa_balancing", "kernel.numa_balancing"),
                                                                  ("pcie_mrrs", "0000:61:00.0")}, procs)
        assert query(prometheus_port, 'gpunode_tuning_host_verdict{verdict="fail"} == 1')
        first_seen = query(prometheus_port, "gpunode_tuning_setting_drift_first_seen_timestamp_seconds")
        assert {r["metric"]["setting"] for r in first_seen} == {"kernel.numa_balancing", "0000:61:00.0"}

        def alerts():
            result = query(prometheus_port, 'ALERTS{alertname="GpunodeTuningDrifted"}')
            return {(r["metric"]["family"], r["metric"]["alertstate"]) for r in result}

        states = wait_for("GpunodeTuningDrifted pending", lambda: alerts() if len(alerts()) == 2 else None, procs)
        assert {family for family, _s in states} == {"numa_balancing", "pcie_mrrs"}
        assert {s for _f, s in states} <= {"pending", "firing"}
        passed = True
    finally:
        stop(procs)
        for name in procs if not passed else ():
            with open(tmp_path / (name + ".log"), "rb") as fh:
                sys.stderr.write("--- %s log (tail)\n%s\n" % (name, fh.read()[-3000:].decode("utf-8", "replace")))
    assert all(p.poll() is not None for p in procs.values())


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    """Loopback requests never go through a proxy of the environment."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
