"""A node written by hand, not by tools/simnode: the kernel's sysfs/procfs layout as a real box shows it.

What a user who builds a test node of their own would write, with what real kernels do that a builder of ours
might not: cpu0 has no ``online`` file (x86 cannot offline it), an offline CPU has neither ``cpuidle`` nor a
``cpufreq`` link, every ``cpuN/cpufreq`` is a link to its ``policyN``, idle states carry the files newer kernels
add (``above``, ``below``, ``default_status``), and there is no ``modprobe`` below the root. The PCI devices'
config space is real: an NVIDIA GP108M (3D controller, MaxReadReq 512) and, above it, an Intel Haswell-E root
port with ACS P2P redirect on, both from pciutils' own test data (tests/data/real/lspci-vvv-xxxx-*). Ubuntu's
os-release and a GRUB configuration with an administrator's drop-in of its own.
"""

from __future__ import annotations

import os

from support.captures import Capture, config_bytes

GPU = "0000:03:00.0"
ROOT_PORT = "0000:00:02.0"
CPUS = 4
OFFLINE_CPU = 3
ADMIN_DROPIN = "etc/default/grub.d/50-admin.cfg"
_GPU_DUMP = "lspci-vvv-xxxx-gpu-gp108m-x4-pciutils.txt"  # its root port's secondary bus is 03 (next dump)
_PORT_DUMP = "lspci-vvv-xxxx-root-port-acs-redirect-haswell-e-pciutils.txt"
_STATES = (("POLL", "CPUIDLE CORE POLL IDLE", 0, 0), ("C1", "ACPI FFH MWAIT 0x0", 1, 2),
           ("C2", "ACPI IOPORT 0x814", 400, 800))
_GOVERNORS = "conservative ondemand userspace powersave performance schedutil"


def _write(root, rel, content):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(content, bytes) else "w") as fh:
        fh.write(content)
    os.chmod(path, 0o644)


def _link(root, target, rel):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def _procfs(root):
    _write(root, "proc/cmdline", "BOOT_IMAGE=/vmlinuz-6.8.0-45-generic root=UUID=0c5f7d8e-4a1b-4c2d-9e3f-445566778899 "
                                 "ro quiet splash\n")
    _write(root, "proc/cpuinfo", "".join("processor\t: %d\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
                                         "model name\t: AMD EPYC 7763 64-Core Processor\n\n" % i for i in range(CPUS)))
    _write(root, "proc/uptime", "3600.12 7000.00\n")
    _write(root, "proc/sys/kernel/random/boot_id", "8d2c6a4e-9b1f-4c7e-a1d2-3e4f5a6b7c8d\n")
    for rel, value in (("kernel/numa_balancing", 1), ("vm/swappiness", 60), ("net/core/rmem_max", 212992),
                       ("net/core/wmem_max", 212992), ("net/core/somaxconn", 4096)):
        _write(root, "proc/sys/" + rel, "%d\n" % value)


def _cpus(root):
    cpu = "sys/devices/system/cpu/"
    online = [i for i in range(CPUS) if i != OFFLINE_CPU]
    for name, text in (("online", "0-%d" % (OFFLINE_CPU - 1)), ("possible", "0-%d" % (CPUS - 1)),
                       ("present", "0-%d" % (CPUS - 1)), ("offline", str(OFFLINE_CPU)),
                       ("cpuidle/current_driver", "acpi_idle"), ("cpuidle/current_governor_ro", "menu"),
                       ("cpufreq/boost", "1")):
        _write(root, cpu + name, text + "\n")
    for i in range(CPUS):
        base = cpu + "cpu%d/" % i
        if i:
            _write(root, base + "online", "0\n" if i == OFFLINE_CPU else "1\n")
        _write(root, base + "topology/physical_package_id", "0\n")
        _write(root, base + "topology/core_id", "%d\n" % i)
    for i in online:
        _write(root, cpu + "cpu%d/acpi_cppc/highest_perf" % i, "196\n")  # the firmware's CPPC is on (_CPC)
        for n, (name, desc, latency, residency) in enumerate(_STATES):
            state = cpu + "cpu%d/cpuidle/state%d/" % (i, n)
            for key, value in (("name", name), ("desc", desc), ("latency", latency), ("residency", residency),
                               ("disable", 0), ("usage", 12345), ("time", 999), ("above", 0), ("below", 0),
                               ("default_status", "enabled")):
                _write(root, state + key, "%s\n" % value)
        policy = cpu + "cpufreq/policy%d/" % i
        for key, value in (("scaling_driver", "acpi-cpufreq"), ("scaling_governor", "schedutil"),
                           ("scaling_available_governors", _GOVERNORS), ("affected_cpus", i), ("related_cpus", i),
                           ("cpuinfo_min_freq", 1500000), ("cpuinfo_max_freq", 2450000),
                           ("scaling_min_freq", 1500000), ("scaling_max_freq", 2450000),
                           ("scaling_cur_freq", 1500000)):
            _write(root, policy + key, "%s\n" % value)
        _link(root, "../cpufreq/policy%d" % i, cpu + "cpu%d/cpufreq" % i)
    _write(root, "sys/devices/system/node/online", "0\n")
    _write(root, "sys/devices/system/node/node0/cpulist", "0-%d\n" % (CPUS - 1))


def _pci_device(root, rel, cfg, klass):
    for key, value in (("vendor", "0x%02x%02x" % (cfg[1], cfg[0])), ("device", "0x%02x%02x" % (cfg[3], cfg[2])),
                       ("class", klass), ("numa_node", "0"), ("irq", "0"), ("enable", "1"),
                       ("current_link_speed", "8.0 GT/s PCIe"), ("current_link_width", "4"),
                       ("max_link_speed", "8.0 GT/s PCIe"), ("max_link_width", "4")):
        _write(root, "%s/%s" % (rel, key), value + "\n")
    _write(root, rel + "/resource", "0x0000000000000000 0x0000000000000000 0x0000000000000000\n" * 13)
    _write(root, rel + "/config", cfg.ljust(4096, b"\0"))


def _pci(root):
    port = "sys/devices/pci0000:00/" + ROOT_PORT
    _pci_device(root, port, config_bytes(Capture(_PORT_DUMP).text), "0x060400")
    _pci_device(root, "%s/%s" % (port, GPU), config_bytes(Capture(_GPU_DUMP).text), "0x030200")
    for bdf, rel in ((ROOT_PORT, port), (GPU, "%s/%s" % (port, GPU))):
        _link(root, "../../../devices/" + rel.split("sys/devices/", 1)[1], "sys/bus/pci/devices/" + bdf)


def build(root):
    """Write the node below ``root`` (a directory that does not exist yet); return ``root``."""
    _procfs(root)
    _cpus(root)
    _pci(root)
    _write(root, "sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n")
    _write(root, "sys/kernel/mm/transparent_hugepage/defrag", "always defer defer+madvise [madvise] never\n")
    _write(root, "sys/kernel/security/lockdown", "[none] integrity confidentiality\n")
    for module in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
        _write(root, "sys/module/%s/initstate" % module, "live\n")
    _write(root, "dev/kmsg", "6,100,1000000,-;Linux version 6.8.0-45-generic\n4,101,2000000,-;ACPI: BIOS bug\n")
    _write(root, "etc/os-release", 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
                                   "ID=ubuntu\nID_LIKE=debian\n")
    _write(root, "etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
                                     'GRUB_CMDLINE_LINUX=""\n')
    _write(root, ADMIN_DROPIN, "GRUB_TIMEOUT=1\n")
    return str(root)
