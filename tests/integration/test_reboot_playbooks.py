"""The reboot sequence without a scheduler (gpunode_tuning_drain: none) on simulated hosts: tune.yml --tags
persistent reboots only the hosts that need it, within the budget, once; a rerun changes nothing; check mode
names who would be rebooted and writes nothing; reboot_ok without a drain is refused before anything changes.
"""

from __future__ import annotations

import json
import os

import simfleet
import simnode
from support.inventory import write_inventory
from support.playbooks import by_host, failure_summary, rollout, run_playbook
from support.trees import snapshot, tree_changes

DRIVER = "sys/devices/system/cpu/cpufreq/policy0/scaling_driver"
BOOT_ID = "proc/sys/kernel/random/boot_id"
DROPIN = "etc/default/grub.d/60-gpunode-tuning.cfg"


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read().strip()


def fleet(tmp_path, **common):
    roots = {"a1": str(tmp_path / "a1"), "a2": str(tmp_path / "a2"), "ok": str(tmp_path / "ok"),
             "old": str(tmp_path / "old")}
    simnode.build(roots["a1"], "audited-epyc-8gpu", cpus=2, gpus=1)
    simnode.build(roots["a2"], "audited-epyc-8gpu", cpus=2, gpus=1)
    simnode.build(roots["ok"], "epyc-pstate-epp", cpus=2, gpus=1)  # nothing pending: never rebooted
    # Ubuntu 22.04's GA kernel: no amd-pstate, so no argument and no reboot for it (issue 43).
    simnode.build(roots["old"], "audited-epyc-8gpu", cpus=2, gpus=1, kernel="5.15.0-91-generic")
    reports = tmp_path / "reports"
    inventory = write_inventory(tmp_path / "hosts.yml", roots, report_dir=reports, gpunode_tuning_reboot_ok=True,
                                gpunode_tuning_reboot_poll_interval=0.2, **common)
    return roots, inventory, reports


def assert_not_rebooted_for_the_old_kernel(proc):
    """The persistent flow's report (its summary per concern) names the one host not rebooted, and why."""
    said = [line for line in proc.stdout.splitlines() if "not rebooted for cpufreq.driver" in line]
    assert len(said) == 1 and "(the node cannot take it): amd-pstate active mode needs Linux 6.3" in said[0] \
        and "5.15.0-91-generic" in said[0], said


def test_reboot_ok_without_a_drain_backend_fails_the_precheck_naming_the_choices(tmp_path):
    roots, inventory, _reports = fleet(tmp_path)
    before = {h: snapshot(r) for h, r in roots.items()}
    proc = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert proc.returncode != 0
    msg = failure_summary(proc, "a1")
    assert "nothing was changed" in msg and "gpunode_tuning_drain must say how hosts leave service" in msg, msg
    assert "one of none, slurm, kubernetes, command" in msg
    for host, root in roots.items():
        assert tree_changes(before[host], snapshot(root)) == [], host


def test_check_mode_names_who_would_be_rebooted_and_writes_nothing(tmp_path):
    roots, inventory, reports = fleet(tmp_path, gpunode_tuning_drain="none")
    before = {h: snapshot(r) for h, r in roots.items()}
    proc = run_playbook("tune.yml", inventory, "--tags", "persistent", "--check")
    assert proc.returncode == 0, proc.stdout[-4000:]
    for host in ("a1", "a2"):
        assert "would reboot without a drain %s: gpunode.tuning: reboot for amd_pstate=active" % host in proc.stdout
    assert "would reboot without a drain ok" not in proc.stdout
    assert "would reboot without a drain old" not in proc.stdout
    assert_not_rebooted_for_the_old_kernel(proc)
    for host, root in roots.items():
        assert tree_changes(before[host], snapshot(root)) == [], host
    assert not os.path.exists(reports / "reboots" / "a1.json")


def test_the_hosts_that_need_it_reboot_once_within_the_budget_and_a_rerun_changes_nothing(tmp_path):
    roots, inventory, reports = fleet(tmp_path, gpunode_tuning_drain="none")
    boot_ids = {h: read(r, BOOT_ID) for h, r in roots.items()}
    proc = run_playbook("tune.yml", inventory, "--tags", "persistent", "-f", "4")
    assert proc.returncode == 0, proc.stdout[-6000:]
    for host in ("a1", "a2"):
        assert read(roots[host], BOOT_ID) != boot_ids[host], host
        assert read(roots[host], DRIVER) == "amd-pstate-epp", host
        with open(reports / "reboots" / ("%s.json" % host), encoding="utf-8") as fh:
            assert json.load(fh)["state"] == "done"
    for host in ("ok", "old"):  # needed nothing, or could not take what it would need: not rebooted
        assert read(roots[host], BOOT_ID) == boot_ids[host], host
        assert not os.path.exists(reports / "reboots" / ("%s.json" % host)), host
    # The old kernel: every other family applied, no amd_pstate argument, the driver unsupported with the cause.
    assert read(roots["old"], DRIVER) == "acpi-cpufreq"
    assert not os.path.exists(os.path.join(roots["old"], DROPIN))  # no argument at all: no drop-in
    assert os.path.exists(os.path.join(roots["old"], "etc/sysctl.d/90-gpunode-tuning.conf"))  # the others are
    # The flow says so (check mode says the same: the cpu_freq plan runs in check mode either way).
    warning = [line for line in (proc.stdout + proc.stderr).splitlines() if "amd-pstate is unsupported" in line]
    assert warning and "5.15.0-91-generic" in warning[0] and "Linux 6.3" in warning[0], warning
    assert_not_rebooted_for_the_old_kernel(proc)
    # Budget 1: the two reboots did not overlap (each took its slot after the other's return).
    records = [json.load(open(reports / "reboots" / ("%s.json" % h), encoding="utf-8")) for h in ("a1", "a2")]
    first, second = sorted(records, key=lambda r: r["slot_at"])
    assert second["slot_at"] >= first["updated"] - 0.01, records
    again = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert again.returncode == 0 and all(r["changed"] == 0 for r in again.recap.values()), again.stdout[-3000:]
    assert {h: read(r, BOOT_ID) for h, r in roots.items() if h in ("a1", "a2")} == {
        h: read(roots[h], BOOT_ID) for h in ("a1", "a2")}


def test_skip_tags_reboot_tunes_without_rebooting(tmp_path):
    roots, inventory, _reports = fleet(tmp_path, gpunode_tuning_drain="none")
    boot_id = read(roots["a1"], BOOT_ID)
    proc = run_playbook("tune.yml", inventory, "--tags", "persistent", "--skip-tags", "reboot")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert read(roots["a1"], BOOT_ID) == boot_id and read(roots["a1"], DRIVER) == "acpi-cpufreq"
    assert os.path.exists(os.path.join(roots["a1"], simnode.GRUB_DROPIN.lstrip("/")))


def test_an_unreachable_host_of_the_run_holds_the_budget_and_the_run_says_why(tmp_path):
    """Budget 1 and a host of the run that Ansible cannot reach: it counts as out of service, so neither host
    that needs a reboot is rebooted, in the rollout (whose first run keeps it in the play, as unreachable) and
    in tune.yml (where Ansible takes it out of the play); each says that it waited for the unreachable host."""
    roots = {"a1": str(tmp_path / "a1"), "a2": str(tmp_path / "a2"), "old": str(tmp_path / "old")}
    for host, root in roots.items():
        simnode.build(root, "audited-epyc-8gpu", cpus=2, gpus=1, **({"kernel": "5.15.0-91-generic"}
                                                                    if host == "old" else {}))
    reports = tmp_path / "reports"
    write_inventory(tmp_path / "hosts.yml", roots, report_dir=reports, gpunode_tuning_reboot_ok=True,
                    gpunode_tuning_drain="none", gpunode_tuning_reboot_poll_interval=0.2,
                    gpunode_tuning_reboot_wait_timeout=3,
                    extra_hosts={"gone": dict(simfleet.UNREACHABLE_VARS, gpunode_tuning_root="/nonexistent")})
    boot_ids = {h: read(r, BOOT_ID) for h, r in roots.items()}
    proc, summary, _reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_flow=persistent",
                                      "-e", "gpunode_tuning_rollout_canary=0",
                                      "-e", "gpunode_tuning_rollout_batch=100%",
                                      "-e", "gpunode_tuning_rollout_max_fail_percentage=100")
    assert proc.returncode != 0
    results = by_host(summary)
    assert results["gone"]["status"] == "unreachable", results["gone"]
    assert {h: read(r, BOOT_ID) for h, r in roots.items()} == boot_ids  # nobody rebooted
    first = results["a1"]["reboot"]
    assert first["failed"] and "waited 3 s for a slot" in first["msg"], first
    assert "counted out of service as unreachable: gone (unreachable:" in first["msg"], first
    assert "not rebooted" in results["a2"]["reboot"]["msg"], results["a2"]
    # The old kernel needs no reboot (it cannot take amd-pstate): the summary says so, with the cause.
    assert [(n["host"], n["setting"]) for n in summary["not_rebooted"]] == [("old", "cpufreq.driver")], summary
    assert "5.15.0-91-generic" in summary["not_rebooted"][0]["reason"] and results["old"]["reboot"] is None
    with open(reports / "rollout-summary.md", encoding="utf-8") as fh:
        text = fh.read()
    assert "## Not rebooted for what the node cannot take" in text and \
        "| old | cpufreq.driver | amd-pstate active mode needs Linux 6.3" in text, text
    with open(reports / "reboots" / "a1.json", encoding="utf-8") as fh:
        record = json.load(fh)
    assert record["state"] == "not_rebooted" and "gone" in record["unreachable"], record

    again = run_playbook("tune.yml", str(tmp_path / "hosts.yml"), "--tags", "persistent")
    assert again.returncode != 0 and again.recap["gone"]["unreachable"] == 1
    assert {h: read(r, BOOT_ID) for h, r in roots.items()} == boot_ids
    msg = failure_summary(again, "a1")
    assert "counted out of service as unreachable: gone (no longer in the play" in msg, msg
