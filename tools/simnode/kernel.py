"""The running kernel: identity, release and its drivers (platform), kernel log, modules, modprobe, processes."""

from __future__ import annotations

import re

from . import modparams
from .cpu import CPU_BASE
from .machine import ACPI_GOVERNORS, DEFAULT_SYSCTLS, Preset
from .tree import Tree


def _kmsg_record(seq: int, level: int, usec: int, msg: str, facility: int = 0) -> str:
    return f"{(facility << 3) | level},{seq},{usec},-;{msg}\n"


def write_kmsg(tree: Tree, messages, extra_records: int = 0) -> None:
    """Write the kernel log in /dev/kmsg record format (PRI,SEQ,TIMESTAMP_US,FLAGS;MESSAGE)."""
    lines = []
    usec = 0
    seq = 0
    for level, msg in messages:
        usec += 137_000
        lines.append(_kmsg_record(seq, level, usec, msg))
        seq += 1
    for i in range(extra_records):
        usec += 997
        # Mostly informational noise with a sprinkle of warnings, as on a busy node.
        if i % 50 == 49:
            src = f"10.224.{(i // 256) % 256}.{i % 256}"
            lines.append(_kmsg_record(seq, 4, usec, f"vxlan: non-ECT from {src} with TOS=0x2"))
        else:
            lines.append(_kmsg_record(seq, 6, usec, f"eth0: rx queue {i % 64} refill ok"))
        seq += 1
    tree.write("dev/kmsg", "".join(lines).encode())


# The kernel release from which the simulated kernel has amd-pstate (5.17; its config then has
# CONFIG_X86_AMD_PSTATE=y): like a distribution kernel with the driver backported, it then takes every
# amd_pstate= mode, as core/platform.py judges a kernel whose configuration has the option.
AMD_PSTATE_SINCE = (5, 17)
NVIDIA_FLAVORS = ("open", "proprietary")


def _release_of(p: Preset) -> str:
    return next((m.split()[2] for _level, m in p.kmsg if m.startswith("Linux version")), "6.1.0-28-amd64")


def _release_numbers(release: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def fit_platform(p: Preset, kernel: str | None, cppc: bool, nvidia_driver: str | None) -> None:
    """Apply the platform options to the preset (before anything is written: a bad option writes nothing)."""
    if nvidia_driver is not None:
        flavor, _sep, version = nvidia_driver.partition(":")
        if flavor not in NVIDIA_FLAVORS or not re.match(r"^\d+(\.\d+)+$", version):
            raise ValueError(f"nvidia_driver {nvidia_driver!r} must be FLAVOR:VERSION with FLAVOR one of "
                             f"{', '.join(NVIDIA_FLAVORS)} (e.g. open:580.65.06)")
    if kernel is not None:
        if not re.match(r"^\d+\.\d+", kernel):
            raise ValueError(f"kernel {kernel!r} is not a release such as 5.15.0-91-generic")
        old = _release_of(p)
        p.kmsg = [(lvl, m.replace(old, kernel)) for lvl, m in p.kmsg]
        if not any(m.startswith("Linux version") for _lvl, m in p.kmsg):
            p.kmsg = [(6, f"Linux version {kernel} (simulated)")] + list(p.kmsg)
        p.cmdline = p.cmdline.replace(old, kernel)
    p.cppc = cppc and p.cpu_vendor == "AuthenticAMD"
    p.nvidia_driver = nvidia_driver
    if p.freq_driver and p.freq_driver.startswith("amd-pstate"):
        mode = p.amd_pstate_status or "active"
        if not kernel_runs_amd_pstate(_release_of(p), p.cppc, mode):
            p.freq_driver, p.governors, p.governor, p.epp, p.amd_pstate_status = (
                "acpi-cpufreq", ACPI_GOVERNORS, "schedutil", None, None)


def kernel_runs_amd_pstate(release: str, cppc: bool, mode: str | None) -> bool:
    """Whether the simulated kernel ``release`` on a CPU with (``cppc``) firmware CPPC can run amd-pstate in
    ``mode`` (None: any)."""
    return bool(cppc) and _release_numbers(release) >= AMD_PSTATE_SINCE


def write_platform(t: Tree, p: Preset) -> None:
    """The kernel's configuration and modules.builtin, ACPI CPPC, the NVIDIA driver's version files."""
    release = _release_of(p)
    has = _release_numbers(release) >= AMD_PSTATE_SINCE
    config = ["CONFIG_X86_ACPI_CPUFREQ=m"] + (["CONFIG_X86_AMD_PSTATE=y", "CONFIG_X86_AMD_PSTATE_DEFAULT_MODE=3"]
                                              if has else [])
    if p.arch == "x86_64":
        t.write(f"boot/config-{release}", "\n".join(["#", f"# Linux/x86 {release} Kernel Configuration", "#"]
                                                    + config) + "\n")
    builtin = ["kernel/drivers/cpufreq/amd-pstate.ko"] if has and p.arch == "x86_64" else []
    t.write(f"lib/modules/{release}/modules.builtin", "\n".join(builtin + ["kernel/drivers/pci/pcie/aspm.ko"]))
    if getattr(p, "cppc", False):
        for cpu in range(p.cpus):
            for name in ("highest_perf", "nominal_perf", "lowest_perf"):
                t.write(f"{CPU_BASE}/cpu{cpu}/acpi_cppc/{name}", {"highest_perf": 196}.get(name, 100))
    driver = getattr(p, "nvidia_driver", None)
    if driver:
        flavor, _sep, version = driver.partition(":")
        banner = ("NVIDIA UNIX Open Kernel Module for x86_64" if flavor == "open"
                  else "NVIDIA UNIX x86_64 Kernel Module")
        t.write("proc/driver/nvidia/version", f"NVRM version: {banner}  {version}  Release Build  (simulated)\n"
                "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
        t.write("sys/module/nvidia/version", version)


def write_identity(t: Tree, p: Preset) -> None:
    """OS release, command line, sysctls, uptime, boot id, lockdown, THP."""
    t.write("etc/os-release", f'ID={p.os_id}\nVERSION_ID="{p.os_version}"\nPRETTY_NAME="{p.os_id} {p.os_version}"')
    t.write("etc/hostname", "gpunode")
    t.write("proc/cmdline", p.cmdline)
    release = _release_of(p)
    sysctls = dict(DEFAULT_SYSCTLS)
    sysctls["kernel/numa_balancing"] = p.numa_balancing
    sysctls["kernel/osrelease"] = release
    for key, value in sysctls.items():
        t.write(f"proc/sys/{key}", value)
    t.write("proc/uptime", "86400.00 5529600.00")
    t.write("proc/sys/kernel/random/boot_id", "5f0c7a1e-3b2d-4c8e-9a61-0d2b7e4f9c13")
    t.write("proc/version", f"Linux version {release} (simulated node, preset {p.name})")
    t.write("sys/kernel/security/lockdown", p.lockdown)
    t.write("sys/kernel/mm/transparent_hugepage/enabled", p.thp_enabled)
    t.write("sys/kernel/mm/transparent_hugepage/defrag", p.thp_defrag)


def write_modules(t: Tree, p: Preset) -> None:
    lines = []
    for name, params in p.modules.items():
        t.write(f"sys/module/{name}/initstate", "live")
        t.write(f"sys/module/{name}/refcnt", "0")
        for k, v in params.items():
            t.write(f"sys/module/{name}/parameters/{k}", v)
        lines.append(f"{name} 65536 0 - Live 0x0000000000000000")
    t.write("proc/modules", "\n".join(lines) if lines else b"")
    modparams.write_params(t.root, p.modules)  # what the drivers export (modparams.py)
    # processor (ACPI processor driver, where acpi_idle's max_cstate lives) is x86's.
    for builtin in ("pcie_aspm", "processor") if p.arch == "x86_64" else ("pcie_aspm",):
        t.mkdir(f"sys/module/{builtin}/parameters")


def write_processes(t: Tree, p: Preset) -> None:
    """init, and the NVIDIA persistence daemon where a preset has one."""
    if p.persistenced:
        t.write("proc/2187/comm", "nvidia-persistenced")
        t.write("proc/2187/cmdline", b"/usr/bin/nvidia-persistenced\0--user\0nvidia-persistenced\0")
    t.write("proc/1/comm", "systemd")
    t.write("proc/1/cmdline", b"/sbin/init\0")


def write_standard_dirs(t: Tree, p: Preset) -> None:
    """The places the persistent tuning writes to, and the directories every Debian/RHEL node has.

    With them a rollback can be compared with the original tree byte for byte, without
    "standard directory created" exceptions.
    """
    for rel in ("etc/sysctl.d", "etc/modules-load.d", "etc/modprobe.d", "etc/systemd/system",
                "etc/systemd/system/multi-user.target.wants", "etc/systemd/system/timers.target.wants",
                "etc/udev/rules.d", "var/lib",
                "usr/local/bin", "usr/local/lib", "usr/local/sbin"):
        t.mkdir(rel)
    if p.os_id in ("debian", "ubuntu"):  # Ubuntu configures GRUB the same way
        t.write("etc/default/grub", "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
                "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
                'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""')
        t.mkdir("etc/default/grub.d")


MODPROBE_SCRIPT = r"""#!/bin/sh
# Simulated modprobe of a simulated node (written by tools/simnode). It understands the
# subset of modprobe that the collection uses and behaves like the real tool would on the
# preset's machine: known modules load (a /sys/module entry appears), nvidia_peermem fails
# with EINVAL as on a node without MOFED, anything else is not found.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
remove=0
name=""
params=""
for arg in "$@"; do
  case "$arg" in
    -r|--remove) remove=1 ;;
    -*) ;;
    *) if [ -z "$name" ]; then name="$arg"; else params="$params $arg"; fi ;;
  esac
done
name=$(echo "$name" | tr '-' '_')
kmsg() { seq=$(wc -l < "$ROOT/dev/kmsg"); echo "3,$seq,999999999,-;$1" >> "$ROOT/dev/kmsg"; }
if [ "$remove" = 1 ]; then
  [ -d "$ROOT/sys/module/$name" ] || { echo "modprobe: FATAL: Module $name is not in kernel." >&2; exit 1; }
  rm -rf "$ROOT/sys/module/$name"; exit 0
fi
[ -d "$ROOT/sys/module/$name" ] && exit 0
case " @LOADABLE@ " in
  *" $name "*)
    mkdir -p "$ROOT/sys/module/$name/parameters"
    echo live > "$ROOT/sys/module/$name/initstate"
    for p in $params; do echo "${p#*=}" > "$ROOT/sys/module/$name/parameters/${p%%=*}"; done
    exit 0 ;;
esac
case "$name" in
  nvidia_peermem)
    echo "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument" >&2
    kmsg "nvidia-peermem nv_mem_client_init:203 ERROR: ib_register_peer_memory_client failed"
    exit 1 ;;
esac
echo "modprobe: FATAL: Module $name not found in directory /lib/modules/@RELEASE@" >&2
exit 1
"""


def write_modprobe(t: Tree, p: Preset) -> None:
    """Install the simulated node's modprobe under <root>/usr/sbin/modprobe."""
    loadable = ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvme", "mlx5_core", "ib_core",
                "tcp_bbr", "br_netfilter", "overlay"]
    if p.arch == "x86_64":
        loadable += ["msr", "cpuid"]  # x86-only drivers
    release = open(t.path("proc/sys/kernel/osrelease")).read().strip()
    script = MODPROBE_SCRIPT.replace("@LOADABLE@", " ".join(loadable)).replace("@RELEASE@", release)
    t.write("usr/sbin/modprobe", script.encode(), mode=0o755)
