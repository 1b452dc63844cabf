# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PCIe ASPM family's verification half: its facts and the rows of its settings (pcie_aspm.py is the family;
a run that only applies never imports this file: docs/dev/adding-a-family.md, "The verification half").

Rows: ``pcie_aspm.policy`` (the kernel's policy against the wanted one) and, with links ``off`` or policy
``performance``, one row per selected GPU (``pcie_aspm.<bdf>``) judged from the ASPM Control field (bits 1:0)
of Link Control of every function on its path, both ends of every link. Where the kernel does not control
ASPM (``control`` is not ``os``) the rows are ``unsupported`` with ``fit`` (fit before tuned), except a path
the firmware left with ASPM off, which is ``applied``.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_aspm import (
    KEY_POLICY,
    NAME,
    links_reason,
    scan,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.families.pcie_aspm_plan import kernel_arg

ASPM_DISABLED = "ASPM Disabled"
FACTS_DOC = r"""
description:
  - PCIe ASPM of the selected GPUs' paths (the C(pcie_aspm) family's read) and the kernel's ASPM policy.
returned: always
type: dict
contains:
  policy:
    description: The current policy of C(/sys/module/pcie_aspm/parameters/policy); null when the file is absent.
    type: str
    returned: always
    sample: default
  policies:
    description: The policies this kernel offers.
    type: list
    elements: str
    returned: always
    sample: [default, performance, powersave, powersupersave]
  kernel_args:
    description: The running kernel's C(pcie_aspm) arguments (C(pcie_aspm=off), C(pcie_aspm.policy=)).
    type: list
    elements: str
    returned: always
    sample: [pcie_aspm.policy=performance]
  kernel:
    description: The running kernel's release (per-link attributes exist from 5.5 on).
    type: str
    returned: always
    sample: 6.8.0-45-generic
  control:
    description:
      - Whether the kernel controls ASPM (V(os)), or why not (V(off) C(pcie_aspm=off), V(firmware) the firmware
        keeps control, V(no_policy) no policy file), with C(control_reason).
    type: str
    returned: always
    sample: os
  control_reason:
    description: Why the kernel does not control ASPM; empty when it does.
    type: str
    returned: always
    sample: ""
  gpus:
    description: Per selected GPU its C(bdf) and C(path), the functions from its root port down to it.
    type: list
    elements: dict
    returned: always
    sample: [{bdf: "0000:41:00.0", path: ["0000:40:01.1", "0000:41:00.0"]}]
  devices:
    description:
      - Per function on a GPU path, C(port_type), C(aspm_support) (Link Capabilities, V(L0s L1)), C(aspm) (Link
        Control's ASPM Control field as lspci shows it, V(L1 Enabled), V(Disabled)), C(lnkctl_aspm) (bits 1:0)
        and C(error) when its config space cannot be read.
    type: dict
    returned: always
  links:
    description:
      - Per link (keyed by its downstream function) C(up), C(down), C(gpus) and C(attrs), the link attributes
        the kernel shows (V(1) enabled, V(0) disabled; none before 5.5 or without ASPM control).
    type: dict
    returned: always
"""


def read(node: Node, selector: pci.DeviceSelector | None = None, query: object = None) -> dict:
    """The family's facts (``facts["pcie_aspm"]``): the policy, the kernel's control of ASPM, and each GPU path's
    functions (Link Control's ASPM field) and links (their attributes)."""
    return scan(node, selector, query)


def reads_boot_config(desired: dict) -> bool:
    want = desired.get(NAME) or {}
    return want.get("persist") == "kernel_arg" and bool(want.get("policy"))


def _persisted(want: dict, ctx: Any, value: Any) -> Any:
    if want.get("persist") == "kernel_arg":
        arg = kernel_arg(want["policy"]) if want.get("policy") else None
        return arg if arg and ctx.arg(arg)["configured"] else None
    return ctx.boot_persisted(value)


def _unfit(name: str, desired: Any, running: Any, why: str) -> dict:
    return dict(family.setting(NAME, name, desired, running, "unsupported", why), fit=True)


def _policy_row(mine: dict, want: dict, ctx: Any) -> dict:
    policy, running = want["policy"], mine.get("policy")
    persisted = _persisted(want, ctx, policy)
    if running == policy:
        return family.setting(NAME, KEY_POLICY, policy, running, "applied", "", persisted)
    if policy not in (mine.get("policies") or []):
        return _unfit(KEY_POLICY, policy, running, "this kernel offers the policies %s" % (
            ", ".join(mine.get("policies") or []) or "none"))
    arg = kernel_arg(policy)
    if want.get("persist") == "kernel_arg" and ctx.arg(arg)["configured"] and not ctx.arg(arg)["running"]:
        return family.setting(NAME, KEY_POLICY, policy, running, "pending_reboot",
                              "%s is configured for the next boot, not running" % arg, persisted)
    return family.setting(NAME, KEY_POLICY, policy, running, "drifted",
                          "the policy is %s, not %s (tune --tags runtime sets it)" % (running, policy), persisted)


def _path_row(mine: dict, gpu: dict, want: dict, ctx: Any) -> dict:
    """One GPU path: every function's Link Control ASPM field must be off."""
    devices = [mine["devices"].get(b) or {"bdf": b, "error": "not read"} for b in gpu["path"]]
    errors = ["%s: %s" % (d["bdf"], d["error"]) for d in devices if d.get("error")]
    on = ["%s %s" % (d["bdf"], d["aspm"]) for d in devices if not d.get("error") and d.get("lnkctl_aspm")]
    running = "; ".join(on) if on else ASPM_DISABLED
    persisted = ctx.boot_persisted(ASPM_DISABLED) if want.get("links") == "off" else \
        _persisted(want, ctx, ASPM_DISABLED)
    if errors:
        return family.setting(NAME, gpu["bdf"], ASPM_DISABLED, running, "unsupported", "; ".join(errors))
    if not on:
        return family.setting(NAME, gpu["bdf"], ASPM_DISABLED, running, "applied", "", persisted)
    if want.get("links") == "off" and links_reason(mine) and mine.get("policy") != "performance":
        return _unfit(gpu["bdf"], ASPM_DISABLED, running, links_reason(mine))
    why = "ASPM is enabled on %s of the path of GPU %s (Link Control)" % (", ".join(on), gpu["bdf"])
    if want.get("links") != "off":
        why += "; policy %s is %s" % (want.get("policy"), mine.get("policy"))
    return family.setting(NAME, gpu["bdf"], ASPM_DISABLED, running, "drifted",
                          why + " (tune --tags runtime clears it)", persisted)


def _uncontrolled_path_row(mine: dict, gpu: dict) -> dict:
    """A GPU path where the kernel does not control ASPM: applied when the firmware left it off, else unsupported."""
    devices = [mine["devices"].get(b) or {} for b in gpu["path"]]
    on = ["%s %s" % (d["bdf"], d["aspm"]) for d in devices if d.get("lnkctl_aspm")]
    if on:
        return _unfit(gpu["bdf"], ASPM_DISABLED, "; ".join(on), mine.get("control_reason"))
    return family.setting(NAME, gpu["bdf"], ASPM_DISABLED, ASPM_DISABLED, "applied",
                          "off as the firmware set it (the kernel does not control ASPM here)")


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """The policy row and, with links off or policy performance, one row per GPU path (Link Control ASPM off)."""
    want = desired.get(NAME) or {}
    if not want or (want.get("policy") is None and want.get("links") != "off"):
        return []
    mine = facts.get(NAME)
    if not isinstance(mine, dict):
        return [family.setting(NAME, "links", ASPM_DISABLED, None, "unsupported",
                               "the facts have no %s section (ASPM was not read)" % NAME)]
    rows = []
    if mine.get("control") != "os":
        if want.get("policy"):
            rows.append(_unfit(KEY_POLICY, want["policy"], mine.get("policy"), mine.get("control_reason")))
        if want.get("links") == "off" or want.get("policy") == "performance":
            rows += [_uncontrolled_path_row(mine, gpu) for gpu in mine.get("gpus") or []]
        return rows
    if want.get("policy"):
        rows.append(_policy_row(mine, want, ctx))
    if want.get("links") == "off" or want.get("policy") == "performance":
        if not mine.get("gpus"):
            rows.append(family.setting(NAME, "links", ASPM_DISABLED, None, "not_applicable", "no GPU is selected"))
        rows += [_path_row(mine, gpu, want, ctx) for gpu in mine["gpus"]]
    return rows
