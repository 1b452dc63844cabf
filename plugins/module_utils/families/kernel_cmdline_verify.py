# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel command-line family's verification half: the rows of its arguments (kernel_cmdline.py is the
family; a run that does not verify never imports this file).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import setting
from ansible_collections.gpunode.tuning.plugins.module_utils.families.kernel_cmdline import (
    GPU_VENDOR_KEY,
    NAME,
    gpu_vendor_arguments,
)


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """One setting per argument of ``desired['kernel_cmdline']``: running, configured for the next boot, or neither."""
    out = []
    vendors = set(((facts.get("pci") or {}).get("gpu_vendors") or {}).values())
    arguments = list(desired.get(NAME) or [])
    arguments += [a for a in gpu_vendor_arguments(desired.get(GPU_VENDOR_KEY), vendors) if a not in arguments]
    for arg in arguments:
        view = ctx.arg(arg)
        configured = view["configured"]
        running = view["running"]
        persisted = arg if configured else None
        if running:
            why = "" if configured or configured is None else "not configured for the next boot: a reboot drops it"
            out.append(setting(NAME, arg, arg, arg, "applied", why, persisted))
        elif configured:
            out.append(setting(NAME, arg, arg, None, "pending_reboot",
                               "configured for the next boot; not on /proc/cmdline yet", persisted))
        elif configured is None:
            out.append(setting(NAME, arg, arg, None, "drifted",
                               "not on /proc/cmdline; the boot configuration is unknown (%s)" % ctx.cmdline_error,
                               persisted))
        else:
            out.append(setting(NAME, arg, arg, None, "drifted",
                               "neither on /proc/cmdline nor configured for the next boot", persisted))
    return out
