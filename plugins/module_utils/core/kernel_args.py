# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel-argument vocabulary several families share: the IOMMU mode's arguments per CPU vendor.

The IOMMU family evaluates the mode, the command-line family writes its arguments: a named core piece,
so neither imports the other. Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

from typing import NamedTuple

MODES = ("passthrough", "translated", "unmanaged")


ARM64_PREFIX = "arm64"  # cpu.vendor_from_cpuinfo's vendor on arm64


class IommuArgs(NamedTuple):
    """The answer of ``iommu_kernel_args``: what one node needs, and what any node may have got."""

    needed: list
    """Kernel arguments that boot this node (of ``cpu_vendor``) into the mode."""
    removable: list
    """Every argument the persistent flow may configure for the mode on a node of any vendor (rollback)."""


def iommu_kernel_args(mode: str | None, cpu_vendor: str | None = None) -> IommuArgs:
    """The one mapping of a desired IOMMU mode to kernel arguments (kernel-parameters.txt).

    passthrough: ``iommu=pt`` on x86 (AMD and Intel alike), ``iommu.passthrough=1`` on arm64
    (``iommu=`` is x86 only). translated: ``iommu=nopt`` on x86, plus ``intel_iommu=on`` on Intel,
    whose IOMMU many distribution kernels leave off by default (the AMD IOMMU is on when the
    firmware enables it); ``iommu.passthrough=0`` on arm64. ``amd_iommu=on`` is not a value the
    AMD driver documents, so it is never added. An unknown vendor gets the x86 arguments (Intel's
    included: the DMAR driver ignores it on AMD). unmanaged: nothing.
    """
    if mode in (None, "", "unmanaged"):
        return IommuArgs([], [])
    if mode not in MODES:
        raise ValueError("iommu mode must be one of %s, got %r" % (", ".join(MODES), mode))
    vendor = cpu_vendor or ""
    if mode == "passthrough":
        needed = ["iommu.passthrough=1"] if vendor.startswith(ARM64_PREFIX) else ["iommu=pt"]
        return IommuArgs(needed, ["iommu=pt", "iommu.passthrough=1"])
    if vendor.startswith(ARM64_PREFIX):
        needed = ["iommu.passthrough=0"]
    elif vendor == "AuthenticAMD":
        needed = ["iommu=nopt"]
    else:
        needed = ["iommu=nopt", "intel_iommu=on"]
    return IommuArgs(needed, ["iommu=nopt", "intel_iommu=on", "iommu.passthrough=0"])


def arg_key(arg: str) -> str:
    """The key of an argument (``amd_pstate`` for ``amd_pstate=active``)."""
    return arg.split("=", 1)[0]


def has_arg(args: list[str], arg: str) -> bool:
    """Whether ``arg`` is in effect in the list ``args`` (for key=value: the last value of the key)."""
    key = arg_key(arg)
    last = None
    for a in args:
        if arg_key(a) == key:
            last = a
    return last == arg if last is not None else False


def has_key(args: list[str], key: str) -> bool:
    return any(arg_key(a) == key for a in args)


def is_configured(args: list[str], arg: str, state: str) -> bool:
    """Whether ``arg`` is present in ``args``; for removal of a bare key, any value of the key counts."""
    if state == "absent" and "=" not in arg:
        return has_key(args, arg)
    return has_arg(args, arg)
