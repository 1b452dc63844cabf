"""module_utils/flows/guard.py, the guard, run as its unit runs it: the boot runner's ``guard`` subcommand.

Each test installs what the persistent flow installs (the runner as boot.runner_text writes it, the
config from guard_files.installed_files) into a simulated node and runs the runner as a subprocess
with ``python -I -B RUNNER guard --config ... --root ROOT``; the results are read back from the
status file and the ``.prom`` file the guard wrote. The Xid parser is proven on kernel-log lines
posted in public issue threads (each with its source).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess

import pytest
import simnode
from support.guard import (
    CACHE,
    DESIRED,
    GPUS,
    JOURNAL,
    OPTIONS,
    PROM,
    RUNNER,
    STATUS,
    TEXTFILE_DIR,
    install,
    metrics,
    run_guard,
    series,
    status,
)

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import guard, guard_files, guard_metrics

# Kernel-log lines posted in public threads (message text as the kernel wrote it).
XID_CAPTURES = [
    # NVIDIA/NVSentinel#155 (a maintainer quoting the line that duplicates "fallen off the bus")
    ("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus", "0000:44:00", 79),
    # NVIDIA/open-gpu-kernel-modules#1150: a second "Xid" later on the line names an earlier event
    ("NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
     "0000:dc:00", 45),
    # leptonai/gpud#46 (dmesg of an H100 node)
    ("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
     "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter", "0000:cb:00", 13),
    ("NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH "
     "TIMEOUT, Info 0x58005", "0000:cb:00", 109),
    # leptonai/gpud#1174 (NVLink Xid of a GB200 node: PCI domain 0019)
    ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 "
     "0x00000000 0x00000000)", "0019:01:00", 149),
]


def kmsg(records):
    """kmsg bytes of ``[(pri, seq, message)]`` with a continuation line after each, as /dev/kmsg gives them."""
    return b"".join(b"%d,%d,%d,-;%s\n SUBSYSTEM=pci\n" % (pri, seq, 1000 * (seq + 1), msg.encode())
                    for pri, seq, msg in records)


def setpci(root, bdf, value=None):
    """Device Control of ``bdf`` read (or written, MRRS field only) with the real setpci."""
    args = ["setpci", "-O", "sysfs.path=%s/sys/bus/pci" % root, "-s", bdf]
    if value is None:
        return int(subprocess.run(args + ["CAP_EXP+08.w"], capture_output=True, text=True, check=True).stdout, 16)
    subprocess.run(args + ["CAP_EXP+08.w=%04x:7000" % value], check=True)
    return None


def write(root, rel, text):
    with open(os.path.join(root, rel), "w", encoding="utf-8") as fh:
        fh.write(text)


def tree(root, skip=("var/lib/gpunode-tuning", "var/lib/prometheus")):
    """Every file's bytes and mode below ``root`` but the guard's own output directories."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if os.path.join(rel, d).lstrip("./") not in skip]
        for name in filenames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                out[full] = os.readlink(full)
            else:
                with open(full, "rb") as fh:
                    out[full] = (fh.read(), os.stat(full).st_mode)
    return out


@pytest.fixture
def node(build_node):
    """A simulated audited node with 8 CPUs and 2 GPUs, node_exporter's directory and the guard installed."""

    def _node(**kwargs):
        root = build_node(cpus=8, gpus=2, **kwargs)
        simnode.write_node_exporter_dir(root)
        return root

    return _node


# -- Xid events since boot


def test_xid_events_read_real_kernel_lines():
    data = kmsg([(4, 10 + i, msg) for i, (msg, _dev, _code) in enumerate(XID_CAPTURES)])
    events = guard.xid_events(data)
    assert [(dev, code) for _seq, dev, code in events] == [(d, c) for _m, d, c in XID_CAPTURES]
    assert [seq for seq, _d, _c in events] == list(range(10, 10 + len(XID_CAPTURES)))
    assert [c for _s, _d, c in guard.xid_events(data, after_seq=12)] == [109, 149]


def test_xid_events_count_kernel_records_only():
    """A line user space wrote to /dev/kmsg (facility 1) is not the kernel's Xid; other records are no events."""
    data = kmsg([(14, 1, XID_CAPTURES[0][0]), (6, 2, "eth0: rx queue 3 refill ok"),
                 (3, 3, "NVRM: GPU at PCI:0000:44:00: GPU-2fcd2d8c"), (3, 4, XID_CAPTURES[0][0])])
    assert guard.xid_events(data) == [(4, "0000:44:00", 79)]
    assert guard.last_seq(data) == 4
    assert guard.last_seq(b"") is None


def test_xid_counters_grow_within_a_boot_and_restart_at_the_next():
    gpus = ["0000:44:00.0", "0000:cb:00.0"]
    log = [(3, 5, XID_CAPTURES[0][0]), (4, 6, XID_CAPTURES[2][0])]
    first = guard.update_xids(None, "boot-a", kmsg(log), gpus)
    assert first["counts"] == {"0000:44:00.0": {"79": 1}, "0000:cb:00.0": {"13": 1}}
    assert first["serious"] == {"0000:44:00.0": 1, "0000:cb:00.0": 0}  # 13 is not serious, 79 is
    # The next run sees the same records and one more: only the new one counts.
    log.append((3, 9, XID_CAPTURES[0][0]))
    second = guard.update_xids(first, "boot-a", kmsg(log), gpus)
    assert second["counts"]["0000:44:00.0"] == {"79": 2} and second["last_seq"] == 9
    # An unreadable log keeps the counts.
    kept = guard.update_xids(second, "boot-a", None, gpus)
    assert kept["counts"] == second["counts"] and kept["available"] is False
    # After a reboot the counters start again from what this boot logged.
    rebooted = guard.update_xids(second, "boot-b", kmsg([(4, 0, XID_CAPTURES[3][0])]), gpus)
    assert rebooted["counts"] == {"0000:cb:00.0": {"109": 1}}
    assert rebooted["serious"] == {"0000:44:00.0": 0, "0000:cb:00.0": 0}
    # A log rebuilt under the same boot id (newest record older than the last counted) starts again too.
    rebuilt = guard.update_xids(second, "boot-a", kmsg([(3, 2, XID_CAPTURES[0][0])]), gpus)
    assert rebuilt["counts"] == {"0000:44:00.0": {"79": 1}}


# -- The guard run


def test_guard_is_read_only_and_writes_status_and_metrics(node):
    root = install(node())
    before = tree(root)
    run = run_guard(root)
    assert run.returncode == 0, run.stdout + run.stderr  # a drifted node is not a failed run
    assert tree(root) == before, "the guard changed the node in read-only mode"
    st = status(root)
    assert st["verdict"] == "fail" and st["run"]["success"] and st["mode"] == "read-only"
    drifted = {s["id"] for s in st["settings"] if s["state"] == "drifted"}
    assert {"pcie_mrrs.0000:41:00.0", "cpuidle.C2", "numa_balancing.kernel.numa_balancing"} <= drifted
    assert run.stdout.startswith("gpunode-tuning-guard: fail in ")
    m = metrics(root)
    assert series(m, "gpunode_tuning_host_verdict", verdict="fail") == [1]
    assert sum(series(m, "gpunode_tuning_settings")) == len(st["settings"])
    for s in st["settings"]:  # one series per state, exactly the current one at 1
        values = {state: series(m, "gpunode_tuning_setting_state", family=s["family"], setting=s["name"],
                                state=state) for state in ("applied", "pending_reboot", "drifted", "not_applicable",
                                                           "unsupported")}
        assert values == {state: [1.0 if state == s["state"] else 0.0] for state in values}, s["id"]
    assert series(m, "gpunode_tuning_setting_drifted_cpus", family="cpuidle", setting="C2") == [8]
    assert series(m, "gpunode_tuning_gpu_serious_xid_errors_total") == [0, 0]
    assert series(m, "gpunode_tuning_info", version="1.0.0", preset="inference-throughput") == [1]
    # Written through a temporary file and a rename: nothing else is left in either directory.
    assert os.listdir(os.path.join(root, "var/lib/prometheus/node-exporter")) == ["gpunode-tuning.prom"]
    assert sorted(os.listdir(os.path.join(root, "var/lib/gpunode-tuning"))) == ["guard-code.cache",
                                                                                "guard-status.json"]
    assert stat.S_IMODE(os.stat(os.path.join(root, PROM)).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(os.path.join(root, CACHE)).st_mode) == 0o600


def test_drift_names_exactly_the_drifted_settings_with_first_seen_kept(node):
    root = install(node())
    run_guard(root, cache=False)  # the node untuned: everything drifts; now tune it as the runtime flow would
    st = status(root)
    swap_first = next(s for s in st["settings"] if s["id"] == "sysctl.vm.swappiness")["first_seen_drifted"]
    assert swap_first == pytest.approx(st["run"]["timestamp"])
    # Fix every family but vm.swappiness by re-applying with the guard itself, then inject the drift.
    install(root, reapply=True)
    run_guard(root, cache=False)
    for key, value in (("kernel/numa_balancing", "0"), ("net/core/rmem_max", "134217728"),
                       ("net/core/wmem_max", "134217728"), ("net/core/somaxconn", "65535")):
        write(root, "proc/sys/" + key, value + "\n")
    install(root, reapply=False)
    run_guard(root, cache=False)
    st = status(root)
    left = {s["id"] for s in st["settings"] if s["state"] == "drifted"}
    assert left == {"sysctl.vm.swappiness", "cpufreq.driver"}
    kept = next(s for s in st["settings"] if s["id"] == "sysctl.vm.swappiness")
    assert kept["first_seen_drifted"] == swap_first, "first seen drifted must survive later runs"
    # The drift of the issue: NUMA balancing back to 1, one GPU's MRRS back to 512.
    write(root, "proc/sys/kernel/numa_balancing", "1\n")
    setpci(root, "0000:61:00.0", 0x2000)
    write(root, "proc/sys/vm/swappiness", "10\n")
    run = run_guard(root, cache=False)
    assert run.returncode == 0
    st = status(root)
    drifted = {s["id"] for s in st["settings"] if s["state"] == "drifted"}
    assert drifted == {"numa_balancing.kernel.numa_balancing", "pcie_mrrs.0000:61:00.0", "cpufreq.driver"}
    m = metrics(root)
    on = {(dict(p)["family"], dict(p)["setting"]) for (n, p), v in m.items()
          if n == "gpunode_tuning_setting_state" and dict(p)["state"] == "drifted" and v == 1}
    assert on == {("numa_balancing", "kernel.numa_balancing"), ("pcie_mrrs", "0000:61:00.0"), ("cpufreq", "driver")}
    first = {(dict(p)["family"], dict(p)["setting"]) for (n, p), _v in m.items()
             if n == "gpunode_tuning_setting_drift_first_seen_timestamp_seconds"}
    assert first == on
    assert not any(s["first_seen_drifted"] for s in st["settings"] if s["id"] == "sysctl.vm.swappiness")


def test_reapply_brings_back_runtime_families_only_and_keeps_the_journal(node):
    root = install(node(), reapply=True)
    os.makedirs(os.path.join(root, "var/lib/gpunode-tuning"), mode=0o700)
    journal = b'{"families": {"pcie_mrrs": {"0000:41:00.0": {"original": 512}}}, "version": 1}\n'
    with open(os.path.join(root, JOURNAL.lstrip("/")), "wb") as fh:
        fh.write(journal)
    run = run_guard(root)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [ln.split(":")[1].strip() for ln in run.stdout.splitlines() if ": re-applied " in ln]
    assert lines == ["re-applied pcie_mrrs", "re-applied pcie_acs", "re-applied cpuidle", "re-applied cpufreq",
                     "re-applied thp"]
    assert [setpci(root, bdf) & 0x7000 for bdf in GPUS] == [0x5000, 0x5000]
    with open(os.path.join(root, "sys/devices/system/cpu/cpu3/cpufreq/scaling_governor")) as fh:
        assert fh.read().strip() == "performance"
    with open(os.path.join(root, JOURNAL.lstrip("/")), "rb") as fh:
        assert fh.read() == journal, "the journal keeps the originals of the first tuning"
    st = status(root)
    assert st["mode"] == "reapply"
    drifted = {s["id"] for s in st["settings"] if s["state"] == "drifted"}
    # What the boot unit does not re-apply stays drifted: sysctls persist through their drop-in and
    # the cpufreq driver needs a kernel argument and a reboot.
    assert drifted == {"cpufreq.driver", "numa_balancing.kernel.numa_balancing", "sysctl.net.core.rmem_max",
                       "sysctl.net.core.somaxconn", "sysctl.net.core.wmem_max", "sysctl.vm.swappiness"}
    assert st["reapply"]["counts"] == {"pcie_mrrs": 1, "pcie_acs": 1, "cpuidle": 1, "cpufreq": 1, "thp": 1}
    assert series(metrics(root), "gpunode_tuning_guard_reapplied_total", family="pcie_mrrs") == [1]
    again = run_guard(root)  # nothing left to re-apply: the counters stay
    assert ": re-applied " not in again.stdout and status(root)["reapply"]["counts"]["cpuidle"] == 1


def test_a_second_run_while_one_holds_the_lock_does_nothing(node):
    root = install(node())
    lock_dir = os.path.join(root, "var/lib/gpunode-tuning")
    fd = guard.lock_directory(lock_dir)
    try:
        run = run_guard(root)
    finally:
        os.close(fd)
    assert run.returncode == 0
    assert "another guard run holds" in run.stdout
    assert not os.path.exists(os.path.join(root, STATUS)) and not os.path.exists(os.path.join(root, PROM))
    fd = os.open(lock_dir, os.O_RDONLY)
    try:  # released when the holder's descriptor closes
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_a_missing_textfile_directory_is_metrics_off_and_they_start_once_it_exists(build_node):
    """No node_exporter yet: the run succeeds writing the status only, says why once, and creates nothing of
    node_exporter's; the first run after the directory exists writes the metrics."""
    root = install(build_node(cpus=2, gpus=1))
    run = run_guard(root)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "FAILED" not in run.stdout
    said = [line for line in run.stdout.splitlines() if "textfile directory" in line]
    assert len(said) == 1 and "/var/lib/prometheus/node-exporter does not exist: metrics are off" in said[0]
    assert "install prometheus-node-exporter" in said[0] and "gpunode_tuning_guard_textfile_dir" in said[0]
    assert not os.path.exists(os.path.join(root, "var/lib/prometheus"))
    st = status(root)
    assert st["metrics"]["written"] is False and st["metrics"]["off"] is True and st["run"]["success"] is True
    os.makedirs(os.path.join(root, TEXTFILE_DIR.lstrip("/")))
    run = run_guard(root)
    assert run.returncode == 0 and "textfile directory" not in run.stdout, run.stdout
    assert status(root)["metrics"] == {"file": "/" + PROM, "written": True, "off": False, "reason": ""}
    with open(os.path.join(root, PROM), encoding="utf-8") as fh:
        assert "gpunode_tuning_guard_last_run_success 1\n" in fh.read()


def test_a_textfile_path_that_cannot_be_written_names_the_path_and_errno(build_node):
    root = install(build_node(cpus=2, gpus=1))
    os.makedirs(os.path.join(root, "var/lib/prometheus"))
    write(root, TEXTFILE_DIR.lstrip("/"), "a file where the directory should be")
    run = run_guard(root)
    assert run.returncode == 1
    assert ("FAILED: cannot write the metrics /var/lib/prometheus/node-exporter/gpunode-tuning.prom: Not a directory "
            "(errno ENOTDIR)") in run.stdout, run.stdout
    assert status(root)["run"]["success"] is True  # the status is written all the same


def test_a_bad_config_is_exit_2_naming_the_file_and_what_is_allowed(node):
    root = install(node())
    path = os.path.join(root, guard_files.CONFIG_PATH.lstrip("/"))
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["guard"]["textfile"] = "/tmp"
    write(root, guard_files.CONFIG_PATH.lstrip("/"), json.dumps(doc))
    run = run_guard(root)
    assert run.returncode == 2
    assert "%s: unknown guard keys textfile; allowed: textfile_dir, status_file" % path in run.stdout
    assert not os.path.exists(os.path.join(root, STATUS))
    write(root, guard_files.CONFIG_PATH.lstrip("/"), "{")
    assert "cannot read the guard config %s" % path in run_guard(root).stdout


def test_the_code_cache_is_reused_and_a_foreign_one_ignored(node):
    root = install(node())
    first = run_guard(root)
    cache = os.path.join(root, CACHE)
    stamp = os.stat(cache).st_mtime_ns
    second = run_guard(root)
    assert second.returncode == first.returncode == 0
    assert os.stat(cache).st_mtime_ns == stamp, "a current cache is read, not written again"
    # Writable by the group: not trusted, the code is compiled from the runner and the cache replaced.
    os.chmod(cache, 0o664)
    third = run_guard(root)
    assert third.returncode == 0 and stat.S_IMODE(os.stat(cache).st_mode) == 0o600
    write(root, CACHE, "not marshal data")
    os.chmod(cache, 0o600)
    assert run_guard(root).returncode == 0
    assert status(root)["verdict"] == "fail"


def test_a_sick_gpu_is_a_finding_a_link_and_an_xid_counter_of_that_gpu(node):
    root = install(node(gpu_faults={"x8": [1], "xid79": [1]}))
    assert run_guard(root).returncode == 0
    m = metrics(root)
    assert series(m, "gpunode_tuning_gpu_link_width", gpu=GPUS[1]) == [8]
    assert series(m, "gpunode_tuning_gpu_link_max_width", gpu=GPUS[1]) == [16]
    assert series(m, "gpunode_tuning_gpu_link_width", gpu=GPUS[0]) == [16]
    assert series(m, "gpunode_tuning_gpu_link_transfers_per_second", gpu=GPUS[0]) == [32e9]
    findings = {(dict(p)["gpu"], dict(p)["check"], dict(p)["state"]) for (n, p), _v in m.items()
                if n == "gpunode_tuning_gpu_health_finding"}
    assert findings == {(GPUS[1], "link_width", "drifted"), (GPUS[1], "xid", "drifted")}
    assert series(m, "gpunode_tuning_gpu_xid_errors_total", gpu=GPUS[1], code="79") == [1]
    assert series(m, "gpunode_tuning_gpu_serious_xid_errors_total", gpu=GPUS[1]) == [1]
    assert series(m, "gpunode_tuning_gpu_serious_xid_errors_total", gpu=GPUS[0]) == [0]
    # A later run (and a tuning run) does not count the same record again.
    install(root, reapply=True)
    run_guard(root)
    assert series(metrics(root), "gpunode_tuning_gpu_xid_errors_total", gpu=GPUS[1], code="79") == [1]


def test_a_per_cpu_drift_is_one_series_with_the_number_of_cpus(node):
    root = install(node())
    for cpu in range(6):  # C2 off on CPUs 0-5 only; governor performance on CPUs 0-4 only
        write(root, "sys/devices/system/cpu/cpu%d/cpuidle/state2/disable" % cpu, "1\n")
    for cpu in range(5):
        write(root, "sys/devices/system/cpu/cpufreq/policy%d/scaling_governor" % cpu, "performance\n")
    run_guard(root)
    m = metrics(root)
    assert series(m, "gpunode_tuning_setting_drifted_cpus", family="cpuidle", setting="C2") == [2]
    assert series(m, "gpunode_tuning_setting_drifted_cpus", family="cpufreq", setting="governor") == [3]
    assert series(m, "gpunode_tuning_setting_drifted_cpus", family="cpuidle", setting="C1") == [0]
    assert len([k for k in m if k[0] == "gpunode_tuning_setting_drifted_cpus"]) == 4  # POLL, C1, C2, governor


def test_a_later_sysctl_file_and_a_failed_boot_unit_are_named_as_causes(node):
    root = install(node())
    simnode.write_sysctl_file(root)  # /etc/sysctl.d/cloud-optimization.conf: vm.swappiness = 60
    simnode.write_sysctl_file(root, "/etc/sysctl.d/10-early.conf", {"net.core.somaxconn": "128"})
    simnode.write_unit_state(root, "gpunode-tuning-boot.service")
    write(root, "etc/sysctl.d/90-gpunode-tuning.conf", "".join("%s=%s\n" % kv for kv in DESIRED["sysctl"].items()))
    os.symlink("/etc/systemd/system/gpunode-tuning-boot.service",
               os.path.join(root, "etc/systemd/system/multi-user.target.wants/gpunode-tuning-boot.service"))
    run_guard(root)
    by_id = {s["id"]: s for s in status(root)["settings"]}
    swap = by_id["sysctl.vm.swappiness"]
    assert swap["cause"] == {"kind": "sysctl_override", "file": "/etc/sysctl.d/cloud-optimization.conf",
                             "value": "60"}
    assert swap["reason"] == ("/etc/sysctl.d/cloud-optimization.conf sets vm.swappiness = 60 after this "
                              "collection's drop-in, and wins at boot")
    assert "cause" not in by_id["sysctl.net.core.somaxconn"], "a file applied before ours overrides nothing"
    mrrs = by_id["pcie_mrrs.0000:41:00.0"]
    assert mrrs["cause"] == {"kind": "boot_unit_failed", "unit": "gpunode-tuning-boot.service",
                             "result": "exit-code"}
    assert "the boot unit gpunode-tuning-boot.service failed at boot (failed, result exit-code" in mrrs["reason"]
    assert "cause" not in by_id["cpufreq.driver"], "a driver switch is the reboot's, not the boot unit's"
    m = metrics(root)
    assert series(m, "gpunode_tuning_boot_unit_failed") == [1]
    assert series(m, "gpunode_tuning_setting_cause_info", setting="vm.swappiness", cause="sysctl_override",
                  source="/etc/sysctl.d/cloud-optimization.conf") == [1]


# -- Pure parts: the config, the units, the metrics text


@pytest.mark.parametrize(("text", "seconds"), [("5min", 300), ("30s", 30), ("1h 30min", 5400), ("90", 90),
                                               (600, 600), ("2 min", 120), ("1d", 86400)])
def test_interval_spans(text, seconds):
    assert guard_files.interval_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "5 fortnights", "5min;x", "-5min", "9s", True, "5min\nExecStart=/bin/sh"])
def test_bad_intervals_name_what_is_allowed(text):
    with pytest.raises(guard_files.ValidationError, match="gpunode_tuning_guard_interval must be a time span"):
        guard_files.interval_seconds(text)


def test_units_run_the_runner_niced_and_bounded():
    service = guard_files.service_unit(OPTIONS).splitlines()
    assert "ExecStart=/usr/bin/python3 -I -B %s guard --config /etc/gpunode-tuning/guard.json" % RUNNER in service
    assert {"Type=oneshot", "Nice=19", "TimeoutStartSec=300",
            "Environment=GPUNODE_TUNING_CODE_CACHE=/var/lib/gpunode-tuning/guard-code.cache"} <= set(service)
    timer = guard_files.timer_unit(dict(OPTIONS, interval="90s")).splitlines()
    assert {"OnBootSec=1min", "OnUnitActiveSec=90s", "Unit=gpunode-tuning-guard.service",
            "WantedBy=timers.target"} <= set(timer)
    with pytest.raises(guard_files.ValidationError, match="absolute path"):
        guard_files.service_unit(dict(OPTIONS, runner="x y"))


def test_removal_lists_every_file_installed_or_written():
    installed = {f["path"] for f in guard_files.installed_files(OPTIONS)}
    removed = set(guard_files.removal_paths(OPTIONS))
    assert installed | {guard_files.TIMER_WANTS_LINK, "/" + STATUS, "/" + CACHE, "/" + PROM} == removed
    assert guard_files.removal_dirs(OPTIONS) == ["/var/lib/gpunode-tuning"]
    assert "/" + PROM not in guard_files.removal_paths(dict(OPTIONS, textfile_dir=""))


def test_config_values_are_validated_before_anything_is_written():
    with pytest.raises(guard_files.ValidationError, match="absolute path"):
        guard_files.installed_files(dict(OPTIONS, textfile_dir="var/lib/node-exporter"))
    with pytest.raises(guard_files.ValidationError, match="guard.reapply must be true or false"):
        guard_files.installed_files(dict(OPTIONS, reapply="yes"))
    with pytest.raises(guard_files.ValidationError, match="unknown facts keys detail"):
        guard_files.installed_files(dict(OPTIONS, facts={"detail": True}))


def test_metrics_text_follows_the_format_and_naming_rules():
    st = {"collection_version": "1.0.0", "preset": 'odd "name"\\\n', "mode": "read-only", "interval_seconds": 60,
          "run": {"timestamp": 1796131061.5, "duration_seconds": 0.25, "success": True}, "verdict": "pass",
          "counts": {"applied": 1},
          "settings": [{"family": "sysctl", "name": "vm.swappiness", "state": "applied",
                        "cause": {"kind": "sysctl_override", "file": "/etc/x.conf"}}],
          "xid": {"counts": {GPUS[0]: {"13": 2}}, "serious": {GPUS[0]: 0}},
          "gpu_faults": {"counts": {"0000:65:00.0": {"gpu_reset": 1, "vram_lost": 1}}, "serious": {"0000:65:00.0": 2},
                         "vendor": {"0000:65:00.0": "amd"}},
          "gpus": [{"gpu": "0000:65:00.0", "vendor": "amd", "link_width": 8, "link_max_width": 16}],
          "health_findings": [{"gpu": "0000:65:00.0", "vendor": "amd", "check": "amd_ecc", "state": "drifted"}]}
    text = guard_metrics.render(st)
    assert 'preset="odd \\"name\\"\\\\\\n"' in text
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names))
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _h, _t, name, kind = line.split()
            assert name.startswith("gpunode_tuning_") and (name.endswith("_total") == (kind == "counter")), line
        elif not line.startswith("#"):
            rest = line.rsplit("}", 1)[1] if "}" in line else line.split(" ", 1)[1]
            assert len(rest.split()) == 1, "a sample with a timestamp: %s" % line
    assert "gpunode_tuning_guard_last_run_timestamp_seconds 1796131061.5\n" in text
    assert 'gpunode_tuning_gpu_xid_errors_total{gpu="0000:41:00.0",vendor="nvidia",code="13"} 2\n' in text
    # Every GPU series names its vendor; AMD's kernel-log faults are counters like the Xid ones.
    for sample in ('gpunode_tuning_gpu_fault_events_total{gpu="0000:65:00.0",vendor="amd",class="gpu_reset"} 1\n',
                   'gpunode_tuning_gpu_serious_fault_events_total{gpu="0000:65:00.0",vendor="amd"} 2\n',
                   'gpunode_tuning_gpu_link_width{gpu="0000:65:00.0",vendor="amd"} 8\n',
                   'gpunode_tuning_gpu_health_finding{gpu="0000:65:00.0",vendor="amd",check="amd_ecc",'
                   'state="drifted"} 1\n'):
        assert sample in text, sample
    assert ('gpunode_tuning_setting_cause_info{family="sysctl",setting="vm.swappiness",cause="sysctl_override",'
            'source="/etc/x.conf"} 1\n') in text
