# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Our modprobe.d options lines and what a boot makes of them: write and parse one, what overrides it, and the
state of a parameter that waits for a boot (verification's ``judge``).

Apart from core/module_params.py (reading and comparing, what a run that loads a module needs), so that such a
run does not compile it: the persistent flow and verification import it. How it works and why:
docs/dev/node-code.md, "core/module_params.py".
"""

from __future__ import annotations

import re

from ansible_collections.gpunode.tuning.plugins.module_utils.core.module_params import (
    SAME,
    UNSUPPORTED,
    compare,
    kernel_form,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import sysfs_name

# The comment of a modprobe.d file of ours that names the boot its options line was written in.
STAMP_RE = re.compile(r"^# boot_id (\S+)")


# --- the options file of ours: which boot wrote it --------------------------------------------------------


def stamp_line(boot_id: str) -> str:
    """The comment that names the boot an options line was written in."""
    return "# boot_id %s (the boot this options line was written in: a module loaded then takes it at the " \
           "next boot)\n" % (boot_id or "unknown")


def options_text(header: str, line: str, boot_id: str, existing: str | None) -> str:
    """The whole options file: ``existing`` unchanged when it holds the same line and a stamp (an unchanged line
    keeps the boot it was written in, and the file its bytes), else a new file stamped with ``boot_id``."""
    if existing is not None:
        parsed = parse_options(existing)
        lines = [x.strip() for x in existing.splitlines() if x.strip() and not x.lstrip().startswith("#")]
        if parsed["boot_id"] and lines == [line]:
            return existing
    return header + stamp_line(boot_id) + line + "\n"


def parse_options(text: str | None) -> dict:
    """``{params: {name: value}, boot_id}`` of an options file (every ``options`` line; the stamp or None)."""
    params: dict = {}
    boot_id = None
    for raw in (text or "").splitlines():
        m = STAMP_RE.match(raw.strip())
        if m and boot_id is None:
            boot_id = None if m.group(1) == "unknown" else m.group(1)
            continue
        words = raw.split()
        if len(words) > 2 and words[0] == "options":
            for word in words[2:]:
                key, sep, value = word.partition("=")
                params[key] = value if sep else "1"
    return {"params": params, "boot_id": boot_id}


# --- what a boot gives a module: every options line, in modprobe's order, then the command line -------------

MODPROBE_DIRS = ("etc/modprobe.d", "run/modprobe.d", "usr/local/lib/modprobe.d", "usr/lib/modprobe.d",
                 "lib/modprobe.d")


CMDLINE = "the kernel command line"


def overriding(node: Node, module: str, own: str) -> dict:
    """``{param: {value, source}}``: what a boot sets after our options file ``own`` (its node path), so that it
    wins over our line. modprobe reads the .conf files of MODPROBE_DIRS by name (an earlier directory hides the
    same name in a later one) and passes every ``options`` line in that order, then the command line's
    ``module.param=``; the kernel takes the last value of a parameter."""
    files: dict = {}
    for directory in MODPROBE_DIRS:
        for name in node.listdir(directory):
            if name.endswith(".conf") and name not in files:
                files[name] = "/%s/%s" % (directory, name)
    mine, out = own.rsplit("/", 1)[-1], {}
    for name in sorted(n for n in files if n > mine):
        text = node.read(files[name].lstrip("/"), default="")
        for words in (line.split() for line in text.splitlines()):
            if len(words) > 2 and words[0] == "options" and sysfs_name(words[1]) == sysfs_name(module):
                for word in words[2:]:
                    key, sep, value = word.partition("=")
                    out[key] = {"value": value if sep else "1", "source": files[name]}
    for word in node.read("proc/cmdline", default="").split():
        key, sep, value = word.partition("=")
        name, dot, param = key.partition(".")
        if sep and dot and sysfs_name(name) == sysfs_name(module):
            out[param] = {"value": value, "source": CMDLINE}
    return out


def override_reason(param: str, at_boot: dict) -> str:
    """Why a boot would not apply our line: what sets the parameter after it."""
    return "%s sets %s=%s after this collection's options line, so a boot does not apply it: remove it there" % (
        at_boot["source"], param, at_boot["value"])


def judge(module: str, param: str, requested: str, current: str | None, persisted: str | None,
          written_in: str | None, boot_id: str | None, at_boot: dict | None = None) -> tuple[str, str]:
    """``(state, reason)`` of one parameter of a loaded module."""
    verdict = compare(requested, current)
    if verdict == UNSUPPORTED:
        return "unsupported", ("%s does not export %s in /sys/module/%s/parameters (no file, or not readable): "
                               "its value cannot be verified, and it is never a reason to reboot"
                               % (module, param, sysfs_name(module)))
    if verdict == SAME:
        return "applied", ""
    if persisted is None or compare(requested, kernel_form(persisted, current)) != SAME:
        return "drifted", ("%s runs with %s=%s; the persistent flow writes the options line and a reboot applies "
                           "it (a loaded module is never unloaded)" % (module, param, current))
    if at_boot and compare(requested, kernel_form(at_boot["value"], current)) != SAME:
        return "drifted", override_reason(param, at_boot)
    if not boot_id or not written_in or written_in == boot_id:
        return "pending_reboot", ("options line written in this boot; the loaded module takes %s=%s at the next "
                                  "boot (it is never unloaded)" % (param, requested))
    return "drifted", ("%s=%s still after a reboot since the options line was written: the module may load "
                       "from the initramfs (rebuild it: update-initramfs -u, dracut -f), or another modprobe.d "
                       "file or %s.%s= on the kernel command line sets it" % (param, current, sysfs_name(module),
                                                                              param))
