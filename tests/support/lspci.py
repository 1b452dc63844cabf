"""The real lspci's view of a simulated node: an independent read-back of what the modules decode and write."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

_LSPCI_SLOT_RE = re.compile(r"^([0-9a-fA-F]{4}:)?([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")
_LSPCI_SIZES_RE = re.compile(r"MaxPayload (\d+) bytes, MaxReadReq (\d+) bytes")


def parse_lspci_devctl(text: str) -> dict:
    """Parse ``lspci -vvv`` (or ``-D -vvv``) output into ``{bdf: {"mps": int, "mrrs": int}}``.

    The sizes are those of the ``DevCtl:`` block (its ``MaxPayload N bytes, MaxReadReq M bytes``
    line); the ``DevCap:`` line shows what is supported, not what is set, and has no MaxReadReq.
    BDFs printed without a domain get ``0000:``.
    """
    out = {}
    bdf = None
    for line in text.splitlines():
        m = _LSPCI_SLOT_RE.match(line)
        if m:
            bdf = (m.group(1) or "0000:").lower() + m.group(2).lower()
            continue
        sizes = _LSPCI_SIZES_RE.search(line)
        if sizes and bdf:
            out[bdf] = {"mps": int(sizes.group(1)), "mrrs": int(sizes.group(2))}
    return out


def lspci_vvv(root: str) -> str:
    """``lspci -D -vvv`` of the node below ``root``: the real pciutils reading its sysfs (``-O sysfs.path=``)."""
    argv = [shutil.which("lspci") or "lspci", "-O", "sysfs.path=%s" % os.path.join(root, "sys/bus/pci"), "-D", "-vvv"]
    return subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), timeout=60,
                          check=True).stdout
