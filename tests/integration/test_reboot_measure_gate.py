"""The rollout's measure gate inside the reboot sequence (issue 30), on simulated hosts with the ``command`` drain
backend, whose drain state is a file per host that these tests read themselves (not the collection's records).

A host that needs a reboot is drained, rebooted and gated, and its benchmark after tuning runs while it is still
drained; only then is it returned, or, when the measure gate rolls it back, it stays drained (its kernel command
line needs a reboot to go back) and no later host reboots. A rebooted host is verified once, by the sequence's
gate; a host that needs no reboot keeps its own verification and is never drained.
"""

from __future__ import annotations

import json
import os

import simnode
from support.inventory import write_inventory
from support.playbooks import by_host, rollout
from support.trees import snapshot, tree_changes

BOOT_ID = "proc/sys/kernel/random/boot_id"
DRIVER = "sys/devices/system/cpu/cpufreq/policy0/scaling_driver"
CMDLINE = "proc/cmdline"


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read().strip()


def fleet(tmp_path, kind):
    """Two hosts that need a reboot (acpi-cpufreq: amd_pstate=active) and one that does not, each with the
    benchmark stand-in of ``kind``; the command backend keeps a file per drained host under drained/."""
    roots = {"a1": str(tmp_path / "nodes" / "a1"), "a2": str(tmp_path / "nodes" / "a2"),
             "ok": str(tmp_path / "nodes" / "ok")}
    simnode.build(roots["a1"], "audited-epyc-8gpu", cpus=2, gpus=1)
    simnode.build(roots["a2"], "audited-epyc-8gpu", cpus=2, gpus=1)
    simnode.build(roots["ok"], "epyc-pstate-epp", cpus=2, gpus=1)
    for root in roots.values():
        simnode.write_benchmark(root, kind)
    drained = tmp_path / "drained"
    drained.mkdir()
    log = tmp_path / "events.log"
    sh = "sh", "-c"
    write_inventory(str(tmp_path / "hosts.yml"), roots, report_dir=str(tmp_path / "reports"),
                    gpunode_tuning_reboot_ok=True, gpunode_tuning_drain="command",
                    gpunode_tuning_reboot_poll_interval=0.2,
                    gpunode_tuning_drain_command=[*sh, 'touch "%s/$GPUNODE_HOST" && echo "drain $GPUNODE_HOST" >> %s'
                                                  % (drained, log)],
                    gpunode_tuning_drain_check_command=[*sh, 'test -e "%s/$GPUNODE_HOST"' % drained],
                    gpunode_tuning_undrain_command=[*sh, 'rm -f "%s/$GPUNODE_HOST" && echo "undrain $GPUNODE_HOST" '
                                                    '>> %s' % (drained, log)])
    # The benchmark notes, each time it runs, whether its host is drained at that moment.
    # (GPUNODE_ROOT is the host's simulated root, named after the host.)
    bench = ["sh", "-c", 'h=$(basename "$GPUNODE_ROOT"); if test -e "%s/$h"; then s=drained; else s=in-service; fi; '
             'echo "bench $h $s" >> %s; exec "$GPUNODE_ROOT/usr/bin/gpunode-sim-bench"' % (drained, log)]
    extra = ("-e", "gpunode_tuning_rollout_flow=persistent", "-e", "gpunode_tuning_rollout_canary=1",
             "-e", "gpunode_tuning_rollout_batch=100%",
             "-e", json.dumps({"gpunode_tuning_rollout_benchmark_command": bench}))
    return roots, drained, log, extra


def changed_tasks(stdout):
    """``{task name: [hosts it changed]}`` from a run's output."""
    out, task = {}, None
    for line in stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[6:line.rindex("]")]
        elif line.startswith("changed: [") and task:
            out.setdefault(task, []).append(line[10:line.index("]")])
    return out


def events(log):
    return log.read_text().splitlines() if log.exists() else []


def test_the_benchmark_runs_after_the_gate_while_drained_and_a_rolled_back_host_stays_drained(tmp_path):
    roots, drained, log, extra = fleet(tmp_path, "inverse")
    boot_ids = {h: read(r, BOOT_ID) for h, r in roots.items()}
    later = {h: snapshot(roots[h]) for h in ("a2", "ok")}
    proc, summary, reports = rollout(str(tmp_path), *extra)
    assert proc.returncode != 0
    assert "Rollout stopped after batch 1" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-3000:]
    # The canary was drained, rebooted (the driver switched), gated, measured while still drained, rolled back.
    assert read(roots["a1"], BOOT_ID) != boot_ids["a1"]
    assert read(roots["a1"], DRIVER) == "amd-pstate-epp"
    assert events(log) == ["bench a1 in-service", "drain a1", "bench a1 drained"], events(log)
    # It stays drained: the rollback removed the boot configuration, but the command line still holds it.
    assert os.path.exists(drained / "a1")
    assert "amd_pstate=active" in read(roots["a1"], CMDLINE)
    assert not os.path.exists(os.path.join(roots["a1"], simnode.GRUB_DROPIN.lstrip("/")))
    canary = by_host(summary)["a1"]
    assert canary["status"] == "failed", canary
    # Rolled back, but for cpufreq: its journaled governor belongs to acpi-cpufreq, which only a reboot without
    # amd_pstate=active brings back (the rollout says so: "rollback failed: cpufreq").
    assert canary["benchmark"]["kept"] is False and canary["benchmark"]["reason"].startswith("measure gate: gain ")
    assert canary["verification"] == "not run"
    reboot = canary["reboot"]
    assert reboot["stays_drained"] is True and reboot["stage"] == "measure" and reboot["rebooted"] is True, reboot
    assert "needs a reboot to restore the kernel command line" in reboot["msg"], reboot
    assert "needs a reboot to restore the kernel command line" in canary["reason"], canary["reason"]
    with open(os.path.join(reports, "reboots", "a1.json"), encoding="utf-8") as fh:
        record = json.load(fh)
    assert record["state"] == "failed" and record["stage"] == "measure", record
    with open(os.path.join(reports, "reboots", "halt.json"), encoding="utf-8") as fh:
        assert json.load(fh)["host"] == "a1"
    assert summary["stopped"]["stays_drained"] == ["a1"]
    # No later host was reached: not drained, not rebooted, not touched.
    assert summary["skipped"] == ["a2", "ok"]
    for host, before in later.items():
        assert tree_changes(before, snapshot(roots[host])) == [], host
    assert "| a1 | stays drained |" in open(os.path.join(reports, "rollout-summary.md"), encoding="utf-8").read()


def test_a_kept_host_returns_after_the_benchmark_and_is_verified_once(tmp_path):
    roots, drained, log, extra = fleet(tmp_path, "normal")
    boot_ids = {h: read(r, BOOT_ID) for h, r in roots.items()}
    # Check mode: nothing measured, drained, rebooted or written; the summary names who would be rebooted.
    before = {h: snapshot(r) for h, r in roots.items()}
    proc, summary, reports = rollout(str(tmp_path), *extra, "--check")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert {h: tree_changes(before[h], snapshot(r)) for h, r in roots.items()} == dict.fromkeys(roots, [])
    assert events(log) == [] and not os.path.exists(os.path.join(reports, "reboots", "a1.json"))
    assert by_host(summary)["a1"]["reboot"]["would"] == "drain (command) and reboot"
    runs = tmp_path / "module-runs.json"
    proc, summary, _reports = rollout(str(tmp_path), *extra, "-e", "gpunode_tuning_reboot_max_unavailable=2",
                                      module_runs=str(runs))
    assert proc.returncode == 0, proc.stdout[-6000:]
    results = by_host(summary)
    assert {h: r["status"] for h, r in results.items()} == dict.fromkeys(roots, "done"), results
    for host in ("a1", "a2"):
        assert read(roots[host], BOOT_ID) != boot_ids[host], host
        r = results[host]
        assert r["verification"] == "pass" and r["benchmark"]["kept"] is True, r
        assert r["reboot"]["returned"] is True and r["reboot"]["held"] is True, r["reboot"]
        assert "passed its gate and the measure gate and is back in service" in r["reboot"]["msg"], r["reboot"]
        # Drained before the benchmark after tuning, back only after it.
        got = [e for e in events(log) if e.endswith(" " + host) or (" %s " % host) in e]
        assert got == ["bench %s in-service" % host, "drain " + host, "bench %s drained" % host, "undrain " + host], got
    assert read(roots["ok"], BOOT_ID) == boot_ids["ok"]
    assert [e for e in events(log) if "ok" in e.split()] == ["bench ok in-service", "bench ok in-service"]
    assert results["ok"]["reboot"] is None and results["ok"]["verification"] == "pass"
    assert os.listdir(drained) == []
    # Verified once: the rollout's verification (one tuning_info) ran for the host that needed no reboot only;
    # the rebooted hosts' verification is their gate's, inside the sequence.
    counted = json.loads(runs.read_text())["hosts"]
    reboot_ran = {h: counted[h]["actions"].get("tuning_reboot", 0) for h in roots}
    assert reboot_ran == {"a1": 3, "a2": 2, "ok": 0}, counted  # a1 also ran the survey, once for the run
    # The rollout's steps (tuning_rollout: the health gate, then verification), the runtime and persistent flows.
    flows = {h: sum(counted[h]["actions"].get(m, 0)
                    for m in ("tuning_rollout", "tuning_info", "tuning_apply", "tuning_persist")) for h in roots}
    assert flows["a1"] == flows["a2"] == flows["ok"] - 1, counted
    assert {h: counted[h]["actions"].get("tuning_rollout", 0) for h in roots} == {"a1": 1, "a2": 1, "ok": 2}, counted

    # A rerun: nothing needs a reboot any more, nothing is drained, nothing changes.
    seen = len(events(log))
    again, summary, _reports = rollout(str(tmp_path), *extra, "-e", "gpunode_tuning_reboot_max_unavailable=2")
    assert again.returncode == 0, again.stdout[-4000:]
    # What changes on a rerun is the reports on the controller (their timestamps), never a node or a drain.
    changed = changed_tasks(again.stdout)
    on_nodes = {t: hosts for t, hosts in changed.items() if any(not h.endswith("localhost") for h in hosts)}
    assert on_nodes == {}, changed
    assert all("report" in t or "summary" in t for t in changed), changed
    assert not [e for e in events(log)[seen:] if not e.startswith("bench ")]
    assert all(r["reboot"] is None for r in summary["results"])
