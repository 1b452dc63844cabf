# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel module parameters: read them as the kernel shows them, and compare (core/module_options.py: our
options lines, and the judgement of one that waits for a boot).

How it works and why: docs/dev/node-code.md, "core/module_params.py"."""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import sysfs_name

BOOT_ID = "proc/sys/kernel/random/boot_id"
TRUE_WORDS = ("1", "y", "yes", "true", "on")
FALSE_WORDS = ("0", "n", "no", "false", "off")
BOOL_SHOWN = ("Y", "N")
SAME, DIFFERS, UNSUPPORTED = "same", "differs", "unsupported"


def read_value(node: Node, module: str, param: str) -> str | None:
    """The parameter's value as the kernel shows it; None when the module does not export it (no file, or
    the file cannot be read: a write-only parameter)."""
    try:
        text = node.read("sys/module", sysfs_name(module), "parameters", param)
    except NodeError:
        return None
    return text


def _int(text: str) -> int | None:
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def kernel_form(requested: str, current: str | None) -> str:
    """``requested`` as the kernel would show it, given how it shows the current value: ``Y``/``N`` for a
    bool parameter (``1``, ``true``, ``on`` ... as ``Y``), the text otherwise."""
    text = str(requested).strip()
    if current in BOOL_SHOWN:
        if text.lower() in TRUE_WORDS:
            return "Y"
        if text.lower() in FALSE_WORDS:
            return "N"
    return text


def compare(requested: Any, current: str | None) -> str:
    """``same``, ``differs`` or ``unsupported`` (not readable in sysfs) for a requested and a shown value."""
    if current is None:
        return UNSUPPORTED
    want, shown = kernel_form(str(requested), current), current.strip()
    if want == shown:
        return SAME
    a, b = want.split(","), shown.split(",")
    if len(a) == len(b) and all(_int(x) is not None and _int(x) == _int(y) for x, y in zip(a, b)):
        return SAME
    lw, ls = want.lower(), shown.lower()
    if (lw in TRUE_WORDS and ls in TRUE_WORDS) or (lw in FALSE_WORDS and ls in FALSE_WORDS):
        return SAME
    return DIFFERS


def states(node: Node, module: str, params: dict) -> dict:
    """``{param: {requested, current, state}}`` for each requested parameter (``params``: rendered values)."""
    out = {}
    for name in sorted(params):
        current = read_value(node, module, name)
        out[name] = {"requested": params[name], "current": current, "state": compare(params[name], current)}
    return out
