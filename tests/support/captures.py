"""Real output other people posted (tests/data/real): one capture with its header, and lspci's hex dumps as bytes."""

from __future__ import annotations

import os
import re

from support.checkout import REPO

REAL_CAPTURES = os.path.join(REPO, "tests", "data", "real")
CAPTURE_MARK = "==> capture follows <==\n"
_DUMP = re.compile(r"^([0-9a-f]{2,3}): ((?:[0-9a-f]{2} ?){1,16})$")


class Capture:
    """One file of tests/data/real: its header (source, who/when, command, converted) and the output itself."""

    def __init__(self, name):
        with open(os.path.join(REAL_CAPTURES, name), encoding="utf-8", newline="") as fh:
            head, sep, self.text = fh.read().partition(CAPTURE_MARK)
        assert sep, "%s has no %r line" % (name, CAPTURE_MARK)
        self.name = name
        self.meta = dict(line.split(": ", 1) for line in head.splitlines())
        assert self.meta.get("source"), "%s names no source" % name


def config_bytes(text):
    """The config space of an lspci hex dump (``-xxx``: 256 bytes, ``-xxxx``: 4096): each line's bytes at its
    offset, as sysfs' ``config`` file holds them."""
    out = bytearray()
    for line in text.splitlines():
        m = _DUMP.match(line.strip())
        if m:
            offset = int(m.group(1), 16)
            data = bytes.fromhex(m.group(2))
            out[len(out):offset + len(data)] = b"\0" * max(0, offset + len(data) - len(out))
            out[offset:offset + len(data)] = data
    return bytes(out)
