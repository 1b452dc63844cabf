"""playbooks/verify.yml end to end on simulated nodes: states, kernel-log classes, reports, exit status.

One runtime tuning (playbooks/tune.yml --tags runtime) prepares the tuned nodes; then verify runs
over all of them. Every node tree is hashed before and after each verify run: verification writes
nothing on a node, also without --check.
"""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest
import simnode
from support.checkout import REPO, VENV_BIN, ansible_env
from support.inventory import write_inventory
from support.nodes import JOURNAL
from support.playbooks import run_playbook
from support.trees import tree_digest

UPTIME = 86400.0  # simnode's /proc/uptime; the journal marker of a runtime tuning carries it

# Host -> (preset, tuned at runtime). Extra preparation per host happens in the fixture.
HOSTS = {
    "applied": ("epyc-pstate-epp", True),
    "pending": ("audited-epyc-8gpu", True),
    "untuned": ("audited-epyc-8gpu", False),
    "tiny": ("tiny-vm", True),
    "kmsg": ("epyc-pstate-epp", True),
    "rebooted": ("epyc-pstate-epp", True),
    "broken": ("tiny-vm", False),
}
HOST_VARS = {
    "kmsg": {
        # Noise from the overlay network only; the same message from elsewhere is "other".
        "gpunode_tuning_kmsg_ignore": [{"pattern": "^vxlan: non-ECT from", "cidr": "10.224.0.0/16"}],
        # The kernel logs lockdown refusals at notice level (security/lockdown/lockdown.c).
        "gpunode_tuning_kmsg_levels": ["err", "warn", "notice"],
    },
    # An invalid regex makes tuning_facts fail: the host must still be reported.
    "broken": {"gpunode_tuning_kmsg_ignore": [{"pattern": "(unclosed"}]},
}
# A host that never gets a result and must be listed as missing.
UNREACHABLE = {"unreachable": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
                               "ansible_python_interpreter": "/usr/bin/python3"}}


def append_kmsg(root, records):
    """Append (level, seconds since boot, message) records to a simulated node's kernel log."""
    path = os.path.join(root, "dev", "kmsg")
    with open(path, encoding="utf-8") as fh:
        seq = sum(1 for _line in fh)
    with open(path, "a", encoding="utf-8") as fh:
        for level, seconds, message in records:
            fh.write("%d,%d,%d,-;%s\n" % (level, seq, int(seconds * 1e6), message))
            seq += 1


KMSG_RECORDS = [
    # Before the runtime tuning: not counted.
    (3, UPTIME - 50, "pcieport 0000:40:01.1: AER: Uncorrected (Fatal) error received: 0000:41:00.0"),
    # After it: one of each class.
    (3, UPTIME + 10, "pcieport 0000:40:01.1: AER: Corrected error received: 0000:41:00.0"),
    (3, UPTIME + 10.5, "nvidia 0000:41:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"),
    (3, UPTIME + 11, "NVRM: Xid (PCI:0000:61:00): 79, pid=2231, name=python3, GPU has fallen off the bus."),
    (3, UPTIME + 12, "NVRM: GPU 0000:81:00.0: GPU has fallen off the bus."),
    (4, UPTIME + 13, "vxlan: non-ECT from 10.224.9.9 with TOS=0x2"),
    (4, UPTIME + 14, "vxlan: non-ECT from 192.168.7.7 with TOS=0x2"),
    (5, UPTIME + 15, "Lockdown: setpci: direct PCI access is restricted; see man kernel_lockdown.7"),
    (3, UPTIME + 16, "nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client"),
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("verify")
    roots = {}
    for name, (preset, _tuned) in HOSTS.items():
        roots[name] = str(base / "nodes" / name)
        simnode.build(roots[name], preset)
    tune_inv = write_inventory(base / "tune.yml", {n: r for n, r in roots.items() if HOSTS[n][1]}, base / "unused",
                               host_vars=HOST_VARS)
    proc = run_playbook("tune.yml", tune_inv, "--tags", "runtime")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # pending: amd_pstate=active configured in the GRUB drop-in, not on /proc/cmdline.
    dropin = os.path.join(roots["pending"], "etc/default/grub.d/60-gpunode-tuning.cfg")
    with open(dropin, "w", encoding="utf-8") as fh:
        fh.write("# Managed by gpunode.tuning (kernel_cmdline module). Do not edit: changes are overwritten.\n"
                 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active"\n')
    append_kmsg(roots["kmsg"], KMSG_RECORDS)
    # rebooted: the journal's marker belongs to an earlier boot, so the whole boot counts; an
    # Xid logged early in this boot (before the old marker's uptime) is then new.
    with open(os.path.join(roots["rebooted"], "proc/sys/kernel/random/boot_id"), "w", encoding="utf-8") as fh:
        fh.write("0a0a0a0a-1111-2222-3333-444444444444\n")
    append_kmsg(roots["rebooted"], [(3, 200.0, "NVRM: Xid (PCI:0000:41:00): 13, Graphics Exception")])
    for name in roots:
        assert os.path.exists(os.path.join(roots[name], JOURNAL)) == HOSTS[name][1], name
    reports = base / "reports"
    inv = write_inventory(base / "verify.yml", roots, reports, host_vars=HOST_VARS, extra_hosts=UNREACHABLE)
    before = {n: tree_digest(r) for n, r in roots.items()}
    proc = run_playbook("verify.yml", inv)
    after = {n: tree_digest(r) for n, r in roots.items()}
    results = {}
    for name in roots:
        path = reports / ("%s.json" % name)
        if path.exists():
            results[name] = json.loads(path.read_text())
    return {"roots": roots, "inventory": inv, "reports": reports, "proc": proc, "before": before,
            "after": after, "results": results, "base": base}


def states(result, family=None):
    return {s["id"]: s["state"] for s in result["settings"] if family is None or s["family"] == family}


def test_verify_leaves_every_node_byte_identical(fleet):
    assert fleet["before"] == fleet["after"]


def test_exit_status_is_nonzero_when_a_host_drifts(fleet):
    assert fleet["proc"].returncode != 0, fleet["proc"].stdout[-2000:]


def test_applied_after_runtime_tuning(fleet):
    res = fleet["results"]["applied"]
    assert res["status"] == "pass", res["failures"]
    got = states(res)
    assert got["cpufreq.driver"] == "applied"
    assert got["cpufreq.governor"] == "applied"
    assert got["cpuidle.C2"] == "applied"
    assert got["numa_balancing.kernel.numa_balancing"] == "applied"
    assert {v for k, v in got.items() if k.startswith("pcie_mrrs.")} == {"applied"}
    assert {v for k, v in got.items() if k.startswith("sysctl.")} == {"applied"}
    assert got["kmod.nvidia_peermem"] == "not_applicable"
    assert res["kernel_log"]["since_source"] == "journal"
    assert res["kernel_log"]["since"] == pytest.approx(UPTIME)


def test_pending_reboot_from_the_grub_dropin(fleet):
    res = fleet["results"]["pending"]
    setting = next(s for s in res["settings"] if s["id"] == "cpufreq.driver")
    assert setting["state"] == "pending_reboot"
    assert setting["running"] == "acpi-cpufreq"
    assert setting["persisted"] == "amd_pstate=active"
    assert res["status"] == "pass" and res["reboot_required"] is True
    assert "drifted" not in states(res).values()


def test_drifted_on_the_untuned_audited_node(fleet):
    res = fleet["results"]["untuned"]
    got = states(res)
    assert res["status"] == "fail"
    for key in ("cpuidle.C2", "cpufreq.driver", "cpufreq.governor", "numa_balancing.kernel.numa_balancing",
                "thp.enabled", "sysctl.vm.swappiness", "pcie_mrrs.0000:41:00.0"):
        assert got[key] == "drifted", key
    mrrs = next(s for s in res["settings"] if s["id"] == "pcie_mrrs.0000:41:00.0")
    assert (mrrs["desired"], mrrs["running"]) == (4096, 512)
    assert "power-up default" in mrrs["reason"]
    # No journal: the log counts since boot; the vxlan lines are known noise, not trouble.
    assert res["kernel_log"]["since_source"] == "boot"
    assert res["kernel_log"]["counts"]["noise"] == 2
    assert res["kernel_log"]["new_errors"] == 0


def test_not_applicable_on_tiny_vm(fleet):
    res = fleet["results"]["tiny"]
    got = states(res)
    assert res["status"] == "pass", res["failures"]
    # gpu_settings: only the persistence_mode row of the former GPU section here (no GPU setting is asked).
    for family in ("pcie_mrrs", "cpuidle", "cpufreq", "kmod", "gpu_settings"):
        fam = states(res, family)
        assert fam and set(fam.values()) == {"not_applicable"}, (family, fam)
    reasons = {s["id"]: s["reason"] for s in res["settings"]}
    assert "no PCI device" in reasons["pcie_mrrs.devices"]
    assert "no cpuidle driver" in reasons["cpuidle.states"]
    assert "no cpufreq driver" in reasons["cpufreq.driver"]
    assert "simulated node root" in reasons["gpu_health.driver_count"]
    assert "simulated node root" in reasons["gpu_settings.persistence_mode"]
    assert got["thp.defrag"] == "applied"


def test_kernel_log_classes(fleet):
    klog = fleet["results"]["kmsg"]["kernel_log"]
    assert klog["since_source"] == "journal"
    # The AER record logged before the tuning is not counted.
    assert klog["counts"] == {"aer": 2, "xid": 1, "fallen_off_bus": 1, "lockdown": 1, "module_failure": 1,
                              "noise": 1, "other": 1}
    # Xids are gpu_health's to judge (the role's default fail classes leave xid out): 79 is serious.
    assert klog["failing"] == {"aer": 2, "fallen_off_bus": 1}
    assert klog["new_errors"] == 3  # the records of failing classes: 2 aer, 1 fallen_off_bus
    assert klog["xid_codes"] == {"79": 1}
    res = fleet["results"]["kmsg"]
    assert res["status"] == "fail"
    assert [k for k, v in states(res).items() if v == "drifted"] == ["gpu_health.xid"]
    xid = next(s for s in res["settings"] if s["id"] == "gpu_health.xid")
    assert xid["reason"].startswith("Xid 79 ") and "on 0000:61:00.0" in xid["reason"]
    assert any(f.startswith("kernel log: 2 aer, 1 fallen_off_bus") for f in res["failures"])


def test_kernel_log_counts_from_boot_after_a_reboot(fleet):
    res = fleet["results"]["rebooted"]
    assert res["kernel_log"]["since_source"] == "boot"
    assert res["kernel_log"]["since"] == 0
    # The Xid of this boot counts (an earlier boot's marker does not hide it); Xid 13 (an
    # application's graphics exception) is reported by gpu_health, not failed.
    assert res["kernel_log"]["counts"]["xid"] == 1 and res["kernel_log"]["failing"] == {}
    xid = next(s for s in res["settings"] if s["id"] == "gpu_health.xid")
    assert (xid["state"], xid["running"]) == ("applied", "Xid 13") and xid["reason"].startswith("reported: Xid 13")


def test_a_host_that_errors_is_reported(fleet):
    res = fleet["results"]["broken"]
    assert res["status"] == "error"
    assert "kmsg_ignore" in res["failures"][0]


def test_junit_parses_as_testsuite_testcase(fleet):
    for name in ("untuned", "tiny", "pending", "kmsg", "broken"):
        root = ET.parse(fleet["reports"] / ("%s.junit.xml" % name)).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        assert suite is not None and suite.get("name") == name
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases) > 0
        assert int(suite.get("failures")) == sum(1 for c in cases if c.find("failure") is not None)
        assert int(suite.get("skipped")) == sum(1 for c in cases if c.find("skipped") is not None)
        assert all(c.get("name") and c.get("classname") for c in cases)
        res = fleet["results"][name]
        if name != "kmsg" and name != "broken":
            assert int(suite.get("failures")) == res["counts"]["drifted"]
            assert int(suite.get("skipped")) == res["counts"]["not_applicable"] + res["counts"]["unsupported"]
    kmsg = ET.parse(fleet["reports"] / "kmsg.junit.xml").getroot().find("testsuite")
    failed = {c.get("name") for c in kmsg.findall("testcase") if c.find("failure") is not None}
    assert failed == {"kernel_log.aer", "kernel_log.fallen_off_bus", "gpu_health.xid"}
    broken = ET.parse(fleet["reports"] / "broken.junit.xml").getroot().find("testsuite")
    assert broken.get("errors") == "1"


def test_markdown_reports_read_well(fleet):
    text = (fleet["reports"] / "untuned.md").read_text()
    assert text.startswith("# Verification of untuned: FAIL")
    assert "## Needs attention" in text and "## Settings" in text and "## Kernel log" in text
    assert "| pcie_mrrs | `0000:41:00.0` | **drifted** | 4096 | 512 |" in text
    assert "\n\n\n" not in text
    pending = (fleet["reports"] / "pending.md").read_text()
    assert "pending reboot" in pending and "amd_pstate=active" in pending


def test_fleet_summary_lists_failing_and_missing_hosts_first(fleet):
    text = (fleet["reports"] / "fleet-summary.md").read_text()
    assert text.startswith("# Fleet verification summary")
    failing = text.split("## Hosts that fail, worst first")[1].split("## Hosts by knob family")[0]
    order = [line.split("**")[1] for line in failing.splitlines() if line[:1].isdigit()]
    # rebooted's only new record is Xid 13, which gpu_health reports without failing.
    assert set(order) == {"untuned", "kmsg", "broken", "unreachable"}
    assert order[:2] == ["broken", "unreachable"] or order[:2] == ["unreachable", "broken"]
    assert order[2] == "untuned"
    table = text.split("## Hosts by knob family")[1]
    for host in HOSTS:
        assert "| %s |" % host in table
    assert "| unreachable | **missing** |" in table
    assert "Waiting for a reboot: pending" in text
    # The kernel releases with their hosts (issue 43).
    kernels = [line for line in text.split("## Versions")[1].splitlines() if line.startswith("| Kernel | ")]
    old = [line for line in kernels if line.startswith("| Kernel | 6.1.0-28-amd64 | – | ")]
    assert len(old) == 1 and "pending" in old[0] and "untuned" in old[0] and "applied" not in old[0], kernels


def test_exit_status_zero_when_only_pending(fleet):
    before = {n: tree_digest(fleet["roots"][n]) for n in ("applied", "pending", "tiny")}
    proc = run_playbook("verify.yml", fleet["inventory"], "--limit", "applied,pending,tiny")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert before == {n: tree_digest(fleet["roots"][n]) for n in before}


def test_fail_on_pending_fails_the_pending_host(fleet):
    proc = run_playbook("verify.yml", fleet["inventory"], "--limit", "pending",
                        "-e", "gpunode_tuning_verify_fail_on_pending=true")
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "pending a reboot" in proc.stdout


def test_check_mode_reads_the_same(fleet):
    proc = run_playbook("verify.yml", fleet["inventory"], "--limit", "untuned", "--check", "--diff")
    assert proc.returncode == 2
    res = json.loads((fleet["reports"] / "untuned.json").read_text())
    assert res["counts"] == fleet["results"]["untuned"]["counts"]


@pytest.mark.skipif(not os.environ.get("GPUNODE_PERF"), reason="timing check; set GPUNODE_PERF=1")
def test_large_node_costs_at_most_two_seconds_more(tmp_path):
    small, large = str(tmp_path / "small"), str(tmp_path / "large")
    simnode.build(small, "audited-epyc-8gpu")
    simnode.build(large, "audited-epyc-8gpu", cpus=384, gpus=16, kmsg_records=100000)
    walls = {}
    for name, root in (("small", small), ("large", large)) * 3:
        inv = write_inventory(tmp_path / ("%s.yml" % name), {name: root}, tmp_path / "reports")
        proc = run_playbook("verify.yml", inv)
        assert proc.returncode == 2
        walls[name] = min(walls.get(name, 1e9), proc.wall)
    assert walls["large"] - walls["small"] <= 2.0, walls


def test_reports_go_below_the_working_directory_and_the_run_says_where(fleet, tmp_path):
    # `ansible-playbook playbooks/verify.yml` wrote to playbooks/reports/ (the default reports/
    # resolved against the playbook's directory) and never said where. Run from elsewhere, with
    # the default gpunode_tuning_report_dir: the reports are in reports/ of that directory.
    work = tmp_path / "work"
    work.mkdir()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"gpunodes": {"hosts": {"cwd-applied": {
        "gpunode_tuning_root": fleet["roots"]["applied"], "ansible_connection": "local",
        "ansible_python_interpreter": os.path.join(VENV_BIN, "python")}}}}))
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", str(inventory), os.path.join(REPO, "playbooks",
                                                                                          "verify.yml")]
    proc = subprocess.run(cmd, cwd=str(work), env=ansible_env(), capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    reports = work / "reports"
    assert (reports / "cwd-applied.json").exists() and (reports / "fleet-summary.md").exists()
    assert not os.path.exists(os.path.join(REPO, "playbooks", "reports", "cwd-applied.json"))
    assert "Fleet summary: %s/fleet-summary.md" % reports in proc.stdout


# Actions that run on the controller only in verify.yml: facts, the verdict, the reports (an action plugin that
# starts no module). The precheck (tuning_flow) says itself that it ran no module (module_runs: 0).
CONTROLLER_ACTIONS = {"ansible.builtin." + a for a in ("set_fact", "assert", "debug", "fail")} | {
    "gpunode.tuning.verify_reports"}


def test_verification_is_one_module_run_on_the_node(fleet, tmp_path):
    # Before: slurps of the journal, boot id, GRUB and sysctl drop-ins, a find and tuning_facts
    # (plus grubby and nvidia-smi on live nodes), then the verdict in Jinja. Now one tuning_info run, made by
    # the verify flow's task (tuning_flow, which says how many modules it ran).
    inv = write_inventory(tmp_path / "one.yml", {"pending": fleet["roots"]["pending"]}, tmp_path / "reports")
    env = dict(ansible_env(), ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", inv, os.path.join(REPO, "playbooks", "verify.yml")]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [t["hosts"]["pending"] for p in json.loads(proc.stdout)["plays"] for t in p["tasks"]]
    ran = [(r["action"], r.get("module_runs", 1)) for r in results
           if not r.get("skipped") and r["action"] not in CONTROLLER_ACTIONS and r.get("module_runs", 1) > 0]
    assert ran == [("gpunode.tuning.tuning_flow", 1)], ran
    assert "verification" in next(r for r in results if r.get("module_runs") == 1)
