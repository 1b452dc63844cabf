# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Scenario ``persistent``: tune.yml --tags persistent; every file below the simulated root.

Where a real tool can judge a file without a booted kernel, it does: kmod parses the modprobe.d
file, systemctl --root reports the unit's enabled state, the shell evaluates the grub drop-in the
way grub-mkconfig does, and the boot runner (the collection's Python, with the container's python3)
runs against a scratch copy of the node.
"""

from __future__ import annotations

import json
import re

from support.molecule import CPUS, GPU_BDFS, PRISTINE

SYSCTLS = {
    "vm.swappiness": "10",
    "net.core.rmem_max": "134217728",
    "net.core.wmem_max": "134217728",
    "net.core.somaxconn": "65535",
    "kernel.numa_balancing": "0",
}
UNIT = "gpunode-tuning-boot.service"
BOOT_SCRIPT = "usr/local/lib/gpunode-tuning/apply-boot-tuning.sh"  # the runner: Python, 0.1 name kept
BOOT_DESIRED = "/etc/gpunode-tuning/desired.json"
# The boot families in the registry's order (gpu_locality refreshes topology.json at boot).
FAMILIES = ["pcie_mrrs", "pcie_acs", "pcie_aspm", "cpuidle", "cpufreq", "thp", "gpu_locality"]


def _conf_lines(text):
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_sysctl_dropin(node):
    lines = _conf_lines(node.read("etc/sysctl.d/90-gpunode-tuning.conf"))
    assert dict(re.split(r"\s*=\s*", line, maxsplit=1) for line in lines) == SYSCTLS


def test_modules_load_only_for_modules_that_load(node):
    files = node.read_glob("etc/modules-load.d/*")
    assert {path: _conf_lines(text) for path, text in files.items()} == {
        "etc/modules-load.d/gpunode-tuning-nvidia_drm.conf": ["nvidia_drm"],
        "etc/modules-load.d/gpunode-tuning-tcp_bbr.conf": ["tcp_bbr"],
    }


def test_modprobe_options_as_kmod_reads_them(node):
    assert sorted(node.read_glob("etc/modprobe.d/*")) == ["etc/modprobe.d/gpunode-tuning-nvidia_drm.conf"]
    config = node.host.check_output("modprobe -C %s -c", node.path("etc/modprobe.d"))
    assert "options nvidia_drm modeset=1" in config.splitlines()
    assert "nvidia_peermem" not in config


def test_grub_dropin_as_grub_mkconfig_reads_it(node):
    # grub-mkconfig sources /etc/default/grub and then /etc/default/grub.d/*.cfg in this order.
    script = ('. "$1/etc/default/grub"; '
              'for x in "$1"/etc/default/grub.d/*.cfg; do [ -e "$x" ] && . "$x"; done; '
              'printf %s "$GRUB_CMDLINE_LINUX_DEFAULT"')
    cmdline = node.host.check_output("sh -c %s sh %s", script, node.root)
    assert cmdline.split() == ["quiet", "amd_pstate=active"]


def test_boot_unit_installed_and_enabled(node):
    unit = node.read("etc/systemd/system/" + UNIT)
    assert "ExecStart=/usr/bin/python3 -I -B /%s --desired %s" % (BOOT_SCRIPT, BOOT_DESIRED) in unit.splitlines()
    assert "WantedBy=multi-user.target" in unit.splitlines()
    state = node.host.run("systemctl --root=%s is-enabled %s", node.root, UNIT)
    assert state.stdout.strip() == "enabled", state.stderr
    script = node.host.file(node.path(BOOT_SCRIPT))
    assert script.is_file and script.mode == 0o755
    # Valid Python for the node's python3 (compiled in memory: no __pycache__ left on the node).
    compiles = "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')"
    assert node.host.run("python3 -I -c %s %s", compiles, node.path(BOOT_SCRIPT)).rc == 0
    desired = json.loads(node.read(BOOT_DESIRED))
    assert sorted(k for k in desired if k != "version") == sorted(FAMILIES)
    assert desired["pcie_mrrs"]["mrrs"] == 4096


def test_boot_script_tunes_a_fresh_node(node):
    """What the unit does at boot, on a scratch copy of the untuned node (--root points at it)."""
    scratch = "/var/tmp/simnode-boot"
    node.host.check_output("rm -rf %s && cp -a %s %s && mkdir -p %s/etc/gpunode-tuning && cp %s %s%s",
                           scratch, PRISTINE, scratch, scratch, node.path(BOOT_DESIRED), scratch, BOOT_DESIRED)
    run = node.host.run("python3 -I -B %s --desired %s --root %s", node.path(BOOT_SCRIPT), BOOT_DESIRED, scratch)
    assert run.rc == 0, run.stdout + run.stderr
    assert [line.split(":")[1].strip() for line in run.stdout.splitlines()] == FAMILIES
    mrrs = node.lspci_mrrs(scratch)
    assert {bdf: mrrs[bdf] for bdf in GPU_BDFS} == {bdf: 4096 for bdf in GPU_BDFS}
    disabled = node.read_glob("sys/devices/system/cpu/cpu[0-9]*/cpuidle/state2/disable", base=scratch)
    assert sorted(v.strip() for v in disabled.values()) == ["1"] * CPUS
    again = node.host.run("python3 -I -B %s --desired %s --root %s", node.path(BOOT_SCRIPT), BOOT_DESIRED, scratch)
    assert again.rc == 0 and "(changed)" not in again.stdout and "set on 0 device(s)" in again.stdout, again.stdout


def test_udev_rule(node):
    # One line per GPU vendor of the default selector (NVIDIA's and AMD's), each running the same runner.
    rule = _conf_lines(node.read("etc/udev/rules.d/70-gpunode-tuning.rules"))
    assert [('ATTR{vendor}=="0x10de"' in rule[0]), ('ATTR{vendor}=="0x1002"' in rule[1])] == [True, True], rule
    run = 'RUN+="/usr/bin/python3 -I -B /%s --desired %s --only pcie_mrrs --bdf %%k"' % (BOOT_SCRIPT, BOOT_DESIRED)
    assert len(rule) == 2 and all(run in line for line in rule), rule


def test_runtime_state_untouched(node):
    """--tags persistent writes files only: sysfs and procfs keep their values."""
    changed = node.changed_paths()
    assert not [p for p in changed if p.startswith(("sys/devices", "sys/kernel", "proc/"))]
    assert node.read("proc/sys/kernel/numa_balancing").strip() == "1"


GUARD_UNIT = "gpunode-tuning-guard.service"
GUARD_TIMER = "gpunode-tuning-guard.timer"


def test_guard_units_installed_and_the_timer_enabled(node):
    service = node.read("etc/systemd/system/" + GUARD_UNIT).splitlines()
    assert "ExecStart=/usr/bin/python3 -I -B /%s guard --config /etc/gpunode-tuning/guard.json" % BOOT_SCRIPT in service
    assert "Type=oneshot" in service and "Nice=19" in service
    timer = node.read("etc/systemd/system/" + GUARD_TIMER).splitlines()
    assert "OnUnitActiveSec=300s" in timer and "WantedBy=timers.target" in timer
    state = node.host.run("systemctl --root=%s is-enabled %s", node.root, GUARD_TIMER)
    assert state.stdout.strip() == "enabled", state.stderr
    config = json.loads(node.read("etc/gpunode-tuning/guard.json"))
    assert config["desired"]["sysctl"] == {k: int(v) for k, v in SYSCTLS.items()}


def test_guard_runs_with_the_containers_python(node):
    """What the guard unit runs, on a scratch copy of the node (--root points at it), with the container's python3."""
    scratch = "/var/tmp/simnode-guard"
    node.host.check_output("rm -rf %s && cp -a %s %s && mkdir -p %s/var/lib/prometheus/node-exporter",
                           scratch, node.root, scratch, scratch)
    run = node.host.run("python3 -I -B %s/%s guard --config /etc/gpunode-tuning/guard.json --root %s",
                        scratch, BOOT_SCRIPT, scratch)
    assert run.rc == 0, run.stdout + run.stderr
    assert run.stdout.startswith("gpunode-tuning-guard: fail in ")  # --tags persistent only: nothing tuned now
    prom = node.host.file(scratch + "/var/lib/prometheus/node-exporter/gpunode-tuning.prom").content_string
    assert 'gpunode_tuning_host_verdict{verdict="fail"} 1' in prom.splitlines()
    assert ('gpunode_tuning_setting_state{family="numa_balancing",setting="kernel.numa_balancing",state="drifted"} 1'
            in prom.splitlines())
    status = json.loads(node.host.file(scratch + "/var/lib/gpunode-tuning/guard-status.json").content_string)
    assert status["run"]["success"] and status["metrics"]["written"]
