"""playbooks/rollout.yml end to end on simulated fleets (tools/simfleet.py).

Three small fleets, one rollout each (a few hosts cost ~5 s of CPU each on a 2-core machine):

* the default fleet, audited nodes on acpi-cpufreq among nodes on amd-pstate: canary, then
  batches; the runtime gate passes every host, the summary lists the hosts that still need the
  persistent flow and a reboot (the cpufreq driver), exit status 0;
* a fleet whose canary is a lockdown node (preset locked-bus-perf: setpci_mrrs refuses): the
  rollout stops after the canary, the later hosts are skipped and their trees are untouched;
* a fleet with an unreachable host: it is reported as unreachable (one connection attempt), the
  reachable hosts are done;
* a fleet whose canary has a GPU trained at x8 of x16 (simnode ``--gpu-fault x8=0``): the health
  gate finds it, the canary is not tuned, the rollout stops.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import simfleet
import simnode
from support.checkout import VENV_BIN
from support.nodes import JOURNAL
from support.playbooks import by_host, rollout
from support.trees import tree_digest


def test_default_runtime_rollout_passes_an_acpi_cpufreq_fleet_canary_first(tmp_path):
    # The default fleet: sim-0001 and sim-0003 are audited nodes on acpi-cpufreq (the canary among
    # them), sim-0002 runs amd-pstate. The runtime flow cannot switch the driver: its gate must
    # not stop at the canary for it. Run from the fleet's directory: reports/ is there.
    simfleet.build_fleet(str(tmp_path), 3, python=os.path.join(VENV_BIN, "python"))
    proc, summary, reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_batch=1", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert summary["stopped"] is None
    assert summary["counts"] == {"done": 3, "failed": 0, "unhealthy": 0, "unreachable": 0, "out_of_service": 0,
                                 "skipped": 0}
    results = by_host(summary)
    # The health gate ran on every host and found nothing.
    assert summary["settings"]["health_gate"] is True
    assert all(r["health"] == "healthy" and r["findings"] == [] for r in results.values())
    # The canary (1 host), then batches of one host each.
    assert [(h, results[h]["batch"]) for h in sorted(results)] == [("sim-0001", 1), ("sim-0002", 2), ("sim-0003", 3)]
    assert results["sim-0001"]["canary"] is True
    assert all(r["verification"] == "pass" for r in results.values())
    for host in results:
        assert os.path.exists(os.path.join(str(tmp_path), "nodes", host, JOURNAL)), host
        assert os.path.exists(os.path.join(reports, host + ".json")), host
    # What the acpi-cpufreq hosts still need, and for what.
    driver = "cpufreq driver: amd-pstate (active) wanted, acpi-cpufreq runs (needs the persistent flow and a reboot)"
    assert summary["needs_reboot_hosts"] == ["sim-0001", "sim-0003"]
    assert [results[h]["needs_reboot"] for h in sorted(results)] == [[driver], [], [driver]]
    # The host's own verification report still says the driver drifted, as verify.yml does.
    with open(os.path.join(reports, "sim-0001.json"), encoding="utf-8") as handle:
        host = json.load(handle)
    assert host["status"] == "fail" and host["failures"] == ["1 drifted: cpufreq driver"]
    assert host["gate"] == {"name": "runtime", "status": "pass", "ok": True, "failures": []}
    markdown = open(os.path.join(reports, "rollout-summary.md"), encoding="utf-8").read()
    assert "3 host(s): 3 done, 0 failed, 0 unhealthy, 0 unreachable, 0 skipped." in markdown
    assert "Every batch passed its gate." in markdown
    assert "## Still needing the persistent flow and a reboot" in markdown
    assert "| sim-0003 | done | %s |" % driver in markdown
    # The run ends by saying where the summaries are, as absolute paths.
    assert "rollout summary: %s/rollout-summary.md" % reports in proc.stdout
    assert "fleet summary (verification): %s/fleet-summary.md" % reports in proc.stdout
    assert "2 host(s) still need the persistent flow and a reboot" in proc.stdout


def test_failing_canary_stops_the_rollout(tmp_path):
    simfleet.build_fleet(str(tmp_path), 4, overrides={1: "locked-bus-perf"}, python=os.path.join(VENV_BIN, "python"))
    nodes = os.path.join(str(tmp_path), "nodes")
    before = {h: tree_digest(os.path.join(nodes, h)) for h in ("sim-0002", "sim-0003", "sim-0004")}
    proc, summary, reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_batch=2")
    assert proc.returncode != 0
    assert "Rollout stopped after batch 1" in proc.stdout
    stopped = summary["stopped"]
    assert stopped["batch"] == 1 and stopped["canary"] is True
    assert stopped["failed_hosts"] == ["sim-0001"]
    canary = by_host(summary)["sim-0001"]
    assert canary["status"] == "failed"
    assert "kernel lockdown" in canary["reason"]
    assert "verification failed" in canary["reason"] and "pcie_mrrs" in canary["reason"]
    assert canary["verification"] == "fail"
    assert summary["skipped"] == ["sim-0002", "sim-0003", "sim-0004"]
    # The later batches were not touched: no write, no journal, no report.
    for host, digest in before.items():
        assert tree_digest(os.path.join(nodes, host)) == digest, host
        assert not os.path.exists(os.path.join(reports, host + ".json")), host
    markdown = open(os.path.join(reports, "rollout-summary.md"), encoding="utf-8").read()
    assert "The rollout stopped after batch 1 (canary)" in markdown
    assert "sim-0002, sim-0003, sim-0004" in markdown


@pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs an ssh client to be refused by")
@pytest.mark.parametrize("health_gate", [True, False], ids=["health-gate", "no-health-gate"])
def test_unreachable_host_is_reported_once(tmp_path, health_gate):
    # Two nodes and one host that refuses connections; 50% of a batch may fail. The connection
    # attempt is the health gate's tuning_info call, or a ping when the gate is off.
    simfleet.build_fleet(str(tmp_path), 2, unreachable=1, python=os.path.join(VENV_BIN, "python"))
    counts_path = str(tmp_path / "module-runs.json")
    proc, summary, reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_batch=2",
                                     "-e", "gpunode_tuning_rollout_max_fail_percentage=50",
                                     "-e", "gpunode_tuning_rollout_health_gate=%s" % health_gate,
                                     module_runs=counts_path)
    assert proc.returncode != 0  # not every host is done
    results = by_host(summary)
    assert results["sim-0001"]["status"] == "done" and results["sim-0002"]["status"] == "done"
    dead = results["sim-0003"]
    assert dead["status"] == "unreachable"
    assert "Connection refused" in dead["reason"] or "connect" in dead["reason"].lower()
    assert dead["verification"] == "not run"
    assert summary["stopped"] is None  # 1 of 2 in the batch = 50%, not more than allowed
    # One connection attempt: only the first module run reports it, no task after it tried.
    assert proc.stdout.count("UNREACHABLE!") == 1, proc.stdout[-3000:]
    assert "[sim-0003]: FAILED!" not in proc.stdout, proc.stdout[-3000:]  # no task after it failed on it
    # The host's one module run (health gate, tuning, verification) is its connection attempt: no ping, with
    # the health gate off either.
    with open(counts_path, encoding="utf-8") as handle:
        runs = json.load(handle)["hosts"]
    for host in ("sim-0001", "sim-0002"):
        assert runs[host]["actions"] == {"tuning_rollout": 1}, runs[host]
        assert results[host]["health"] == ("healthy" if health_gate else "not checked"), results[host]
    # Its one attempt started no module (its precheck, rollout task and skipped include are counted as tasks).
    assert runs["sim-0003"]["node"] == 0 and runs["sim-0003"]["actions"] == {}, runs
    markdown = open(os.path.join(reports, "rollout-summary.md"), encoding="utf-8").read()
    assert "| sim-0003 | 2 | **unreachable** |" in markdown


# The canary's only GPU trained at x8 of x16; or its Blackwell GPU on the proprietary kernel modules, which it
# cannot run on (issue 43, fit before tuned): a finding of the health gate before tuning.
UNHEALTHY = {
    "x8": ({"gpu_faults": {"x8": [0]}}, "gpu_health.link_width: ", "%s link x8 of x16", "x8"),
    "proprietary-blackwell": ({"nvidia_driver": "proprietary:580.65.06"}, "gpu_health.driver_fitness: ",
                              "GPU %s (0x2bb5, blackwell) needs the open kernel modules; the driver 580.65.06 runs "
                              "the proprietary ones", "open kernel modules"),
}


@pytest.mark.parametrize("kind", sorted(UNHEALTHY))
def test_unhealthy_canary_is_not_tuned_and_stops_the_rollout(tmp_path, kind):
    build, prefix, finding, reason = UNHEALTHY[kind]
    simfleet.build_fleet(str(tmp_path), 3, python=os.path.join(VENV_BIN, "python"))
    nodes = os.path.join(str(tmp_path), "nodes")
    canary_root = os.path.join(nodes, "sim-0001")
    shutil.rmtree(canary_root)
    info = simnode.build(canary_root, "audited-epyc-8gpu", cpus=4, gpus=1, **build)
    before = {h: tree_digest(os.path.join(nodes, h)) for h in ("sim-0001", "sim-0002", "sim-0003")}
    proc, summary, reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_batch=2")
    assert proc.returncode != 0
    assert "Rollout stopped after batch 1" in proc.stdout
    assert summary["stopped"]["canary"] is True and summary["stopped"]["failed_hosts"] == ["sim-0001"]
    assert summary["counts"] == {"done": 0, "failed": 0, "unhealthy": 1, "unreachable": 0, "out_of_service": 0,
                                 "skipped": 2}
    canary = by_host(summary)["sim-0001"]
    assert canary["status"] == "unhealthy" and canary["health"] == "unhealthy"
    assert canary["verification"] == "not run"
    bdf = info["gpu_bdfs"][0]
    assert any(f.startswith(prefix) and finding % bdf in f for f in canary["findings"]), canary["findings"]
    assert reason in canary["reason"]
    # Not tuned (its MRRS and every other file as before, no journal) and not verified; the later
    # batches were not touched at all.
    for host, digest in before.items():
        assert tree_digest(os.path.join(nodes, host)) == digest, host
        assert not os.path.exists(os.path.join(reports, host + ".json")), host
    assert not os.path.exists(os.path.join(canary_root, JOURNAL))
    markdown = open(os.path.join(reports, "rollout-summary.md"), encoding="utf-8").read()
    assert "3 host(s): 0 done, 0 failed, 1 unhealthy, 0 unreachable, 2 skipped." in markdown
    assert "## Unhealthy hosts (not tuned, not verified)" in markdown
    assert "| sim-0001 | 1 (canary) | **unhealthy** | not run |" in markdown
    assert finding % bdf in markdown
