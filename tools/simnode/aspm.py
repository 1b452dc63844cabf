"""PCIe ASPM on a simulated node (issue 44, the ``pcie_aspm`` family): the policy, the link attributes, Link Control.

What a real kernel shows, written after the built-in parts of the node (a plugged part, parts.py):

- ``sys/module/pcie_aspm/parameters/policy``: ``[default] performance powersave powersupersave `` (the kernel
  prints a space after each name; the real capture tests/data/real/sysfs-pcie-aspm-policy-default-bdwex0-pepc.txt).
- ``link/l0s_aspm`` and ``link/l1_aspm`` on the downstream function of each PCIe link (a GPU below its root or
  switch downstream port, a switch's upstream port below its root port), as Linux 5.5+ shows them
  (Documentation/ABI/testing/sysfs-bus-pci); the simulated links support L0s and L1 (Link Capabilities) and no
  L1 substates or clock PM, so those attributes are absent as the kernel hides them.
- the ASPM Control field (bits 1:0) of Link Control on both ends of each such link, matching the attributes.

Modes (``MODES``): ``disabled`` (default: the firmware left ASPM off, the attributes read 0), ``l1`` (the firmware
enabled L1 on every GPU link: attributes ``l1_aspm`` 1, Link Control L1), and the nodes whose kernel cannot take
the family's writes, all with L1 enabled by the firmware: ``off`` (``pcie_aspm=off`` on the command line: no link
attributes), ``firmware`` (the firmware kept ASPM control through the ACPI FADT or ``_OSC``: no link attributes,
and the kernel log line Linux prints then), ``no-policy`` (a kernel without CONFIG_PCIEASPM: no policy file, no
attributes), ``old-kernel`` (no link attributes, as before Linux 5.5: build it with ``kernel`` below 5.5).

At a simulated reboot (``after_boot``) a ``pcie_aspm.policy=`` argument on the new command line sets the policy,
and ``performance`` clears the links' ASPM field, as the kernel does at boot.

``build(..., aspm="disabled")`` and ``simnode build --aspm MODE`` come from ``PART`` below; boot.reboot calls
``after_boot``.
"""

from __future__ import annotations

import os
import struct

from . import parts

MODES = ("disabled", "l1", "off", "firmware", "no-policy", "old-kernel")
POLICY = "sys/module/pcie_aspm/parameters/policy"
POLICIES = ("default", "performance", "powersave", "powersupersave")
PCIE_CAP = 0x78  # where pci.config_space puts the PCI Express capability
LNKCTL = PCIE_CAP + 0x10
FADT_LINE = "acpi PNP0A08:00: FADT indicates ASPM is unsupported, using BIOS configuration"


def policy_text(current: str) -> str:
    """The policy file as the kernel prints it, ``current`` bracketed, a space after each name, then a newline."""
    return "".join(("[%s] " if p == current else "%s ") % p for p in POLICIES) + "\n"


def links(funcs: list) -> list:
    """``[(upstream bdf, downstream bdf)]`` of the simulated PCIe links that end at a GPU or a switch's upstream
    port (a switch's internal bus, upstream port to downstream port, is not a link)."""
    by_bdf = {f.bdf: f for f in funcs}
    out = []
    for f in funcs:
        up = by_bdf.get(f.parent) if f.parent else None
        if up is None or not f.pcie or not up.pcie or up.kind == "upstream":
            continue
        if f.kind == "upstream" or (f.kind == "endpoint" and f.class_code >> 8 in (0x0300, 0x0302, 0x0380, 0x1200)):
            out.append((up.bdf, f.bdf))
    return out


def _path(root: str, *parts: str) -> str:
    return os.path.join(root, *[p.lstrip("/") for p in parts])


def _write(root: str, rel: str, text: str) -> None:
    os.makedirs(os.path.dirname(_path(root, rel)), exist_ok=True)
    with open(_path(root, rel), "w", encoding="utf-8") as fh:
        fh.write(text)


def set_lnkctl_aspm(root: str, bdf: str, bits: int) -> None:
    """Set the ASPM Control field (bits 1:0) of a function's Link Control, nothing else."""
    with open(_path(root, "sys/bus/pci/devices", bdf, "config"), "r+b") as fh:
        fh.seek(LNKCTL)
        value = struct.unpack("<H", fh.read(2))[0]
        fh.seek(LNKCTL)
        fh.write(struct.pack("<H", (value & ~0x3) | (bits & 0x3)))


def _append(root: str, rel: str, text: str) -> None:
    with open(_path(root, rel), "a", encoding="utf-8") as fh:
        fh.write(text)


def check(mode: str) -> None:
    """ValueError naming the modes for an unknown one (before the node is written)."""
    if mode not in MODES:
        raise ValueError("aspm mode %r is not one of %s" % (mode, ", ".join(MODES)))


def write(root: str, funcs: list, mode: str = "disabled") -> list:
    """Write the policy, the link attributes and Link Control's ASPM field for ``mode``; returns the links."""
    check(mode)
    pairs = links(funcs)
    if mode != "no-policy":
        _write(root, POLICY, policy_text("default"))
    l1 = mode != "disabled"
    dead = {f.bdf for f in funcs if getattr(f, "dead", False)}
    for up, down in pairs:
        if mode in ("disabled", "l1"):
            _write(root, "sys/bus/pci/devices/%s/link/l0s_aspm" % down, "0\n")
            _write(root, "sys/bus/pci/devices/%s/link/l1_aspm" % down, "1\n" if l1 else "0\n")
        for bdf in (up, down) if l1 else ():
            if bdf not in dead:  # a function off the bus reads all 0xff
                set_lnkctl_aspm(root, bdf, 0x2)
    if mode == "off":
        with open(_path(root, "proc/cmdline"), encoding="utf-8") as fh:
            cmdline = fh.read().strip()
        _write(root, "proc/cmdline", (cmdline + " pcie_aspm=off").strip() + "\n")
    if mode == "firmware" and os.path.exists(_path(root, "dev/kmsg")):
        _append(root, "dev/kmsg", "6,9000,210000,-;%s\n" % FADT_LINE)
    return pairs


def after_boot(root: str, args: list) -> str | None:
    """A booted ``pcie_aspm.policy=`` argument (the last one wins): the policy file, and with ``performance`` every
    link's Link Control ASPM field cleared and its attributes reading 0. Returns the policy set, None without one."""
    wanted = [a.split("=", 1)[1] for a in args if a.startswith("pcie_aspm.policy=")]
    if not wanted or wanted[-1] not in POLICIES or "pcie_aspm=off" in args \
            or not os.path.exists(_path(root, POLICY)):
        return None
    _write(root, POLICY, policy_text(wanted[-1]))
    if wanted[-1] == "performance":
        base = _path(root, "sys/bus/pci/devices")
        for bdf in sorted(os.listdir(base)):
            attr = os.path.join(base, bdf, "link", "l1_aspm")
            if os.path.exists(attr):
                for name in ("l0s_aspm", "l1_aspm"):
                    if os.path.exists(os.path.join(base, bdf, "link", name)):
                        _write(root, "sys/bus/pci/devices/%s/link/%s" % (bdf, name), "0\n")
                set_lnkctl_aspm(root, bdf, 0)
                parent = os.path.basename(os.path.dirname(os.path.realpath(os.path.join(base, bdf))))
                if os.path.exists(os.path.join(base, parent, "config")):
                    set_lnkctl_aspm(root, parent, 0)
    return wanted[-1]


def _add_arguments(parser) -> None:
    parser.add_argument("--aspm", choices=MODES, default="disabled", help="PCIe ASPM (simnode/aspm.py)")


# `build(aspm=MODE)` and `simnode build --aspm MODE` (parts.py): written after the built-in parts.
PART = parts.Part("aspm", options={"aspm": "disabled"}, check=lambda _preset, _funcs, opts: check(opts["aspm"]),
                  write=lambda tree, _preset, funcs, opts: write(tree.root, funcs, opts["aspm"]),
                  add_arguments=_add_arguments, from_args=lambda args: {"aspm": args.aspm})
