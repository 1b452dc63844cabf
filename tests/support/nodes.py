"""Simulated nodes (tools/simnode): building them, what the flows write on them, reading them back."""

from __future__ import annotations

import os
import re
import subprocess
import time

import simnode

from support.background import Background

JOURNAL = "var/lib/gpunode-tuning/journal.json"
# The boot runner (gpunode_tuning_boot_script, Python despite its name) and the desired state it re-applies.
BOOT_RUNNER = "usr/local/lib/gpunode-tuning/apply-boot-tuning.sh"
BOOT_DESIRED = "/etc/gpunode-tuning/desired.json"
# What the persistent flow writes (relative to the node root).
PERSISTENT_FILES = {
    "etc/sysctl.d/90-gpunode-tuning.conf",
    "etc/systemd/system/gpunode-tuning-boot.service",
    "etc/systemd/system/multi-user.target.wants/gpunode-tuning-boot.service",
    BOOT_RUNNER,
    BOOT_DESIRED.lstrip("/"),
    "etc/udev/rules.d/70-gpunode-tuning.rules",
    "etc/default/grub.d/60-gpunode-tuning.cfg",
    # The guard (on by default with the persistent flow).
    "etc/gpunode-tuning/guard.json",
    "etc/systemd/system/gpunode-tuning-guard.service",
    "etc/systemd/system/gpunode-tuning-guard.timer",
    "etc/systemd/system/timers.target.wants/gpunode-tuning-guard.timer",
}
# Paths on the controller that must never appear: the runs target simulated roots only.
HOST_PATHS = [
    "/etc/sysctl.d/90-gpunode-tuning.conf",
    "/etc/systemd/system/gpunode-tuning-boot.service",
    "/etc/systemd/system/gpunode-tuning-guard.service",
    "/etc/systemd/system/gpunode-tuning-guard.timer",
    "/etc/udev/rules.d/70-gpunode-tuning.rules",
    "/etc/default/grub.d/60-gpunode-tuning.cfg",
    "/usr/local/lib/gpunode-tuning",
    "/etc/gpunode-tuning",
    "/var/lib/gpunode-tuning",
]
CPU = "sys/devices/system/cpu"


def build_node(path, preset="audited-epyc-8gpu", **kwargs):
    """Build a simulated node of ``preset`` at ``path`` (simnode.build's options); its root as a str."""
    simnode.build(str(path), preset, **kwargs)
    return str(path)


def assert_host_untouched():
    for path in HOST_PATHS:
        assert not os.path.lexists(path), "a run against a simulated root wrote %s on the controller" % path


def read_file(root, rel, default=None):
    """The text of ``rel`` below ``root``, or ``default`` when it does not exist."""
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        return default
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def write_file(root, rel, text):
    """Write ``text`` to ``rel`` below ``root``, creating its directories."""
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def read_mrrs(root, bdf):
    """MRRS of one device of a simulated node, read with the real setpci (DevCtl bits 14:12)."""
    out = subprocess.run(
        ["setpci", "-O", "sysfs.path=%s/sys/bus/pci" % root, "-s", bdf, "CAP_EXP+08.w"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return 128 << ((int(out, 16) & 0x7000) >> 12)


def cstate_disabled(root, name):
    """Set of CPUs on which the idle state ``name`` is disabled."""
    cpu_dir = os.path.join(root, CPU)
    out = set()
    for cpu in os.listdir(cpu_dir):
        if not re.fullmatch(r"cpu\d+", cpu):
            continue
        idle = os.path.join(cpu_dir, cpu, "cpuidle")
        for state in os.listdir(idle) if os.path.isdir(idle) else []:
            with open(os.path.join(idle, state, "name")) as fh:
                if fh.read().strip() != name:
                    continue
            with open(os.path.join(idle, state, "disable")) as fh:
                if fh.read().strip() == "1":
                    out.add(int(cpu[3:]))
    return out


def set_cpufreq_driver(root, tmp_path, driver, mode):
    """Give the node the cpufreq layout of ``driver`` in ``mode`` (what the kernel shows after a boot into it).

    simnode's own (the layout of the driver family's preset, as its simulated reboot switches drivers);
    ``tmp_path`` is not needed any more and kept for the callers.
    """
    del tmp_path
    simnode.set_cpufreq_driver(root, driver, mode)


def inject_drift(root, bdf="0000:61:00.0"):
    """Issue 23's drift: kernel.numa_balancing back to 1, one GPU's MRRS back to 512 (the real setpci)."""
    with open(os.path.join(root, "proc/sys/kernel/numa_balancing"), "w", encoding="utf-8") as fh:
        fh.write("1\n")
    subprocess.run(["setpci", "-O", "sysfs.path=%s/sys/bus/pci" % root, "-s", bdf, "CAP_EXP+08.w=2000:7000"],
                   check=True)


class BootWatcher(Background):
    """Calls ``on_boot(host)`` each time a simulated root gets a new boot id: the reboot sequence rebooted it, and
    the scheduler or the API stand-in should see that reboot (a slurmd restarted, a node's new bootID).

    ``rebooted`` lists the hosts whose ``on_boot`` returned, ``when`` their boot times (monotonic), ``errors`` what
    ``on_boot`` raised (for the test to report).
    """

    def __init__(self, roots, on_boot):
        super().__init__()
        self.roots, self.on_boot, self.errors, self.rebooted, self.when = roots, on_boot, [], [], {}
        self._ids = {h: self._boot_id(h) for h in roots}

    def _boot_id(self, host):
        with open(os.path.join(self.roots[host], "proc/sys/kernel/random/boot_id"), encoding="ascii") as fh:
            return fh.read().strip()

    def _run(self):
        while not self._stop.is_set():
            for host in self.roots:
                now = self._boot_id(host)
                # simnode rewrites the file in place: an empty read is the write in progress, not a new boot
                if now and now != self._ids[host]:
                    self._ids[host] = now
                    self.when[host] = time.monotonic()
                    try:
                        self.on_boot(host)
                        self.rebooted.append(host)
                    except Exception as exc:  # noqa: BLE001  (reported by the test)
                        self.errors.append("%s: %s" % (host, exc))
            time.sleep(0.1)
