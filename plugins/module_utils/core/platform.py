# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the node can take (issue 43, "fit before tuned"): read-only platform facts and the floors.

How it works and why: docs/dev/node-code.md, "core/platform.py"."""

from __future__ import annotations

import gzip
import os
import re
from typing import Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils.core.kernel_release import (  # noqa: F401 (re-exported)
    parse_release,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import SYSFS_CPU, Node, read_small

# Kernel options a setting needs (read from the running kernel's configuration).
KERNEL_OPTIONS = ("CONFIG_X86_AMD_PSTATE", "CONFIG_X86_AMD_PSTATE_DEFAULT_MODE")
# The kernel module files of a driver, as modules.builtin and the module tree name them.
DRIVER_MODULES = {"amd-pstate": "kernel/drivers/cpufreq/amd-pstate.ko"}
_MODULE_SUFFIXES = ("", ".zst", ".xz", ".gz")
_CONFIG_GZ_LIMIT = 4 << 20  # bytes of proc/config.gz read, uncompressed (a config is ~250 KB)

# --- the floors: what each setting and each GPU generation needs, with its source ---

AMD_PSTATE_DOC = "https://docs.kernel.org/admin-guide/pm/amd-pstate.html"
FLOORS = {
    "amd_pstate": {
        # The amd_pstate=<mode> argument: passive from 6.1 (5.17 had only a loadable module with
        # shared_mem), active (EPP) from 6.3, guided from 6.4.
        "modes": {"passive": (6, 1), "active": (6, 3), "guided": (6, 4)},
        "option": "CONFIG_X86_AMD_PSTATE",
        "firmware": "ACPI CPPC (_CPC objects)",
        "source": AMD_PSTATE_DOC,
        # amd-pstate is the default cpufreq driver, in active mode, on server CPUs of family 0x1A and
        # later from Linux 6.13 (commit ddf7f2529b91 "amd-pstate: Switch to amd-pstate by default on
        # some Server platforms", merged with pm-6.13-rc1).
        "default_family": 0x1A,
        "default_since": (6, 13),
        "default_source": "https://git.kernel.org/torvalds/c/ddf7f2529b91",
    },
    "gpu": {
        # NVIDIA: "For cutting-edge platforms such as NVIDIA Grace Hopper or NVIDIA Blackwell, you must use
        # the open-source GPU kernel modules."
        "blackwell": {"flavor": "open", "nvidia_driver": None,
                      "source": "https://developer.nvidia.com/blog/"
                                "nvidia-transitions-fully-towards-open-source-gpu-kernel-modules/"},
    },
    # Device ids with a driver minimum of their own (NVIDIA's cluster recipes).
    "gpu_devices": {
        "0x2bb5": {"nvidia_driver": "575.57.08", "source": "https://github.com/NVIDIA/aicr/pull/2446"},
    },
    # Driver branches past their end of life: a warning, never a failure.
    "nvidia_eol_branch_max": 535,
    "nvidia_eol_source": "https://github.com/NVIDIA/gpu-operator/issues/2613",
}


# --- readers ---


def parse_kernel_config(text: str, options: Iterable[str] = KERNEL_OPTIONS) -> dict:
    """``{option: value}`` of a kernel .config: ``y``/``m``/a value, ``n`` for "is not set", None when absent."""
    wanted = set(options)
    out = dict.fromkeys(wanted)
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"^# (CONFIG_\w+) is not set$", line)
        if m and m.group(1) in wanted:
            out[m.group(1)] = "n"
            continue
        key, sep, value = line.partition("=")
        if sep and key in wanted:
            out[key] = value.strip().strip('"')
    return out


def _read_text(path: str, limit: int = _CONFIG_GZ_LIMIT) -> str | None:
    """A whole text file up to ``limit`` bytes (a kernel config is ~250 KB: more than ``read_small`` reads)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


def read_kernel_config(node: Node, release: str | None) -> tuple:
    """``(options or None, source)``: ``boot/config-<release>``, else ``proc/config.gz``; None when neither."""
    if release:
        text = _read_text(node.path("boot", "config-%s" % release))
        if text is not None:
            return parse_kernel_config(text), "/boot/config-%s" % release
    try:
        with gzip.open(node.path("proc/config.gz"), "rt", encoding="utf-8", errors="replace") as fh:
            return parse_kernel_config(fh.read(_CONFIG_GZ_LIMIT)), "/proc/config.gz"
    except (OSError, EOFError):
        return None, None


def driver_presence(node: Node, release: str | None, driver: str) -> str | None:
    """``builtin``, ``module`` or ``absent`` for a driver of ``DRIVER_MODULES``; None when the node does not say
    (no ``modules.builtin`` for this release)."""
    if not release:
        return None
    base = node.path("lib/modules", release)
    builtin = _read_text(os.path.join(base, "modules.builtin"))
    if builtin is None:
        return None
    name = DRIVER_MODULES[driver]
    if name in builtin.split():
        return "builtin"
    if any(os.path.exists(os.path.join(base, name + s)) for s in _MODULE_SUFFIXES):
        return "module"
    return "absent"


def parse_cpuinfo(text: str) -> dict:
    """Vendor, family, model, model name and flags of the first CPU of ``/proc/cpuinfo`` (or ``lscpu``'s keys)."""
    out = {"vendor": None, "family": None, "model": None, "model_name": None, "flags": None}
    keys = {"vendor_id": "vendor", "vendor id": "vendor", "cpu family": "family", "model": "model",
            "model name": "model_name", "flags": "flags"}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if out["vendor"] and not line.strip():
                break  # the end of the first CPU's block
            continue
        field = keys.get(key.strip().lower())
        if field and out[field] is None:
            value = value.strip()
            if field in ("family", "model"):
                out[field] = int(value) if value.isdigit() else None
            elif field == "flags":
                out[field] = value.split()
            else:
                out[field] = value
    return out


def acpi_cppc(node: Node) -> bool | None:
    """Whether the firmware exposes ACPI CPPC (``cpuN/acpi_cppc/`` of the first CPU); None without a cpu0."""
    if not node.isdir(SYSFS_CPU, "cpu0"):
        return None
    return node.isdir(SYSFS_CPU, "cpu0", "acpi_cppc")


def parse_nvidia_version(text: str | None) -> dict:
    """``/proc/driver/nvidia/version``'s first line: ``{version, flavor, arch}`` (``open`` or ``proprietary``)."""
    first = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    m = re.search(r"NVIDIA UNIX Open Kernel Module for (\S+)\s+(\d[\w.]*)", first)
    if m:
        return {"version": m.group(2), "flavor": "open", "arch": m.group(1)}
    m = re.search(r"NVIDIA UNIX (\S+) Kernel Module\s+(\d[\w.]*)", first)
    if m:
        return {"version": m.group(2), "flavor": "proprietary", "arch": m.group(1)}
    return {"version": None, "flavor": None, "arch": None}


def nvidia_driver(node: Node) -> dict:
    """The loaded NVIDIA driver: ``{version, flavor, source}`` from the two files (flavour: the proc file only)."""
    parsed = parse_nvidia_version(read_small(node.path("proc/driver/nvidia/version")))
    version = read_small(node.path("sys/module/nvidia/version"))
    source = "/proc/driver/nvidia/version" if parsed["version"] else None
    if version:
        source = "/sys/module/nvidia/version"
    return {"version": (version or "").strip() or parsed["version"], "flavor": parsed["flavor"], "source": source}


def read(node: Node) -> dict:
    """``tuning_facts.platform``: kernel (release, numbers, config options and their source, amd-pstate's
    presence), CPU (vendor, family, model, cppc flag), ACPI CPPC, the NVIDIA and AMD drivers' versions."""
    release = (read_small(node.path("proc/sys/kernel/osrelease")) or "").strip() or None
    config, config_source = read_kernel_config(node, release)
    try:
        with open(node.path("proc/cpuinfo"), encoding="utf-8", errors="replace") as fh:
            cpu = parse_cpuinfo(fh.read(65536))
    except OSError:
        cpu = parse_cpuinfo("")
    flags = cpu.pop("flags")
    cpu["cppc_flag"] = None if flags is None else "cppc" in flags
    amdgpu = (read_small(node.path("sys/module/amdgpu/version")) or "").strip() or None
    return {
        "kernel": {"release": release, "version": list(parse_release(release) or []) or None,
                   "config": config, "config_source": config_source,
                   "amd_pstate_driver": driver_presence(node, release, "amd-pstate")},
        "cpu": cpu,
        "acpi_cppc": acpi_cppc(node),
        "nvidia_driver": nvidia_driver(node),
        "amd_driver": {"version": amdgpu, "source": "/sys/module/amdgpu/version" if amdgpu else None},
    }


# --- judgements ---


def _option_on(platform: dict, option: str) -> bool | None:
    config = (platform.get("kernel") or {}).get("config")
    if config is None:
        return None
    return config.get(option) in ("y", "m")


def amd_pstate_default(platform: dict) -> bool:
    """Whether this kernel makes amd-pstate the default on this CPU (family 0x1A servers, Linux 6.13+)."""
    version = tuple((platform.get("kernel") or {}).get("version") or ())
    family = (platform.get("cpu") or {}).get("family")
    floor = FLOORS["amd_pstate"]
    return bool(version) and family is not None and family >= floor["default_family"] \
        and version[:2] >= floor["default_since"]


def amd_pstate_feasibility(platform: dict | None, mode: str | None, cmdline: Iterable[str] = ()) -> dict:
    """Can this node boot into amd-pstate ``mode`` (None: active)? ``{ok, reason, default}``."""
    if not platform:
        return {"ok": True, "reason": "", "default": False}
    floor = FLOORS["amd_pstate"]
    mode = mode or "active"
    kernel = platform.get("kernel") or {}
    release, version = kernel.get("release"), tuple(kernel.get("version") or ())
    need = floor["modes"].get(mode, floor["modes"]["active"])
    option, presence = _option_on(platform, floor["option"]), kernel.get("amd_pstate_driver")
    needs = "amd-pstate %s mode needs Linux %d.%d or newer with %s" % (mode, need[0], need[1], floor["option"])
    where = "this node runs %s" % (release or "an unknown kernel release")
    # The configuration first; the driver's presence where the configuration does not say.
    if option is False or (option is None and presence == "absent"):
        how = "its configuration (%s) has %s not set" % (kernel.get("config_source"), floor["option"]) \
            if option is False else "the driver is neither built in nor in /lib/modules/%s" % release
        return {"ok": False, "default": False,
                "reason": "%s; %s and %s: boot a kernel that has it" % (needs, where, how)}
    if option is None and presence is None and version and version[:2] < need:
        return {"ok": False, "default": False,
                "reason": "%s; %s: upgrade the kernel (e.g. the distribution's HWE kernel)" % (needs, where)}
    if platform.get("acpi_cppc") is False:
        return {"ok": False, "default": False,
                "reason": "ACPI CPPC is off (no /sys/devices/system/cpu/cpu0/acpi_cppc): enable CPPC in the "
                          "firmware (BIOS) setup; amd-pstate cannot load without it"}
    if amd_pstate_default(platform):
        disabled = [a for a in cmdline if a == "amd_pstate=disable"]
        cause = ("%s is on the command line" % disabled[0]) if disabled else \
            "the driver did not register (dmesg | grep amd_pstate tells why)"
        since, family = floor["default_since"], (platform.get("cpu") or {}).get("family") or 0
        return {"ok": True, "default": True,
                "reason": "amd-pstate is Linux %d.%d's default on CPU family 0x%X (%s), so no argument and no "
                          "reboot are needed, yet it does not run: %s" % (since[0], since[1], family, release, cause)}
    return {"ok": True, "reason": "", "default": False}
