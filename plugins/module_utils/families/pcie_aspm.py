# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCIe link power management (ASPM) on the GPU paths: the ``pcie_aspm`` family (issue 44): the kernel's ASPM
policy and the per-link ASPM attributes, and the run (plan half: pcie_aspm_plan.py; verification: pcie_aspm_verify.py).

How it works and why: docs/dev/node-code.md, "families/pcie_aspm.py".
"""

from __future__ import annotations

import errno
import os
import struct
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core import kernel_release as fit
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import JOURNAL_ARGUMENT_SPEC, open_node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    SYSFS_PCI_DEVICES,
    Node,
    NodeError,
    bracket_choices,
    cmdline_args,
    read_small,
    selected_bracket,
)

NAME = "pcie_aspm"
POLICY_FILE = "sys/module/pcie_aspm/parameters/policy"
POLICIES = ("default", "performance", "powersave", "powersupersave")
LINKS = ("off", "keep")
PERSIST = ("boot_unit", "kernel_arg")
# The per-link ASPM attributes, L1 before its substates ("off" writes them in reverse); clkpm is read only.
ATTRS = ("l0s_aspm", "l1_aspm", "l1_1_aspm", "l1_2_aspm", "l1_1_pcipm", "l1_2_pcipm")
LINK_ATTRS_SINCE = (5, 5)
# Link Control and Link Capabilities in the PCIe capability (pci_regs.h PCI_EXP_LNKCTL, PCI_EXP_LNKCAP).
PCI_EXP_LNKCTL = 0x10
LNKCTL_ASPM_MASK = 0x0003  # PCI_EXP_LNKCTL_ASPMC: bit 0 L0s, bit 1 L1
LNKCAP_ASPM_SHIFT = 10  # PCI_EXP_LNKCAP_ASPMS: bits 11:10
ABI_DOC = "https://www.kernel.org/doc/Documentation/ABI/testing/sysfs-bus-pci"
KEY_POLICY = "policy"

ARGUMENT_SPEC = dict(
    policy=dict(type="str", choices=list(POLICIES)),
    links=dict(type="str", default="keep", choices=list(LINKS)),
    vendor=dict(type="list", elements="str"),
    device=dict(type="str"),
    class_prefixes=dict(type="list", elements="str"),
    bdfs=dict(type="list", elements="str"),
    allow_empty=dict(type="bool", default=False),
    **JOURNAL_ARGUMENT_SPEC,
    **NODE_ARGUMENT_SPEC,
)


# Decoding


def parse_policy(text: str | None) -> dict:
    """The policy file: ``{"current": "default", "choices": [...]}`` (current None without brackets)."""
    return {"current": selected_bracket(text), "choices": bracket_choices(text)}


def policy_text(current: str, choices: tuple = POLICIES) -> str:
    """The policy file as the kernel shows it after ``current`` was written (each name followed by a space)."""
    return "".join(("[%s] " if c == current else "%s ") % c for c in choices)


def aspm_text(bits: int | None) -> str | None:
    """The ASPM Control field as lspci prints it: ``Disabled``, ``L0s Enabled``, ``L1 Enabled``, ``L0s L1 Enabled``."""
    if bits is None:
        return None
    names = [n for n, bit in (("L0s", 1), ("L1", 2)) if bits & bit]
    return "%s Enabled" % " ".join(names) if names else "Disabled"


def decode_link(cfg: bytes) -> dict | None:
    """``{lnkctl_aspm, aspm, aspm_support_bits, aspm_support, lnkctl_offset}`` of a config space; None without PCIe."""
    decoded = pci.decode_pcie(cfg)
    if decoded is None:
        return None
    cap = decoded["cap_offset"]
    lnkctl = struct.unpack_from("<H", cfg, cap + PCI_EXP_LNKCTL)[0]
    support = (struct.unpack_from("<I", cfg, cap + pci.PCI_EXP_LNKCAP)[0] >> LNKCAP_ASPM_SHIFT) & 0x3
    return {"port_type": decoded["port_type"], "lnkctl_offset": cap + PCI_EXP_LNKCTL,
            "lnkctl_aspm": lnkctl & LNKCTL_ASPM_MASK, "aspm": aspm_text(lnkctl & LNKCTL_ASPM_MASK),
            "aspm_support_bits": support, "aspm_support": " ".join(n for n, b in (("L0s", 1), ("L1", 2))
                                                                   if support & b) or "none"}


# Reading the node


def _read_device(path: str) -> dict:
    try:
        with open(os.path.join(path, "config"), "rb") as fh:
            cfg = fh.read()
    except OSError as exc:
        return {"error": "cannot read %s/config: %s" % (path, exc.strerror or exc)}
    dead = pci.not_responding(cfg)
    if dead:
        return {"error": dead}
    link = decode_link(cfg)
    return link if link else {"error": "no PCI Express capability readable in %s/config" % path}


def _read_attrs(path: str) -> dict:
    """``{attribute: 0/1}`` of a function's ``link/`` directory (only those the kernel shows)."""
    out = {}
    for name in ATTRS + ("clkpm",):
        text = read_small(os.path.join(path, "link", name))
        if text is not None and text.strip() in ("0", "1"):
            out[name] = int(text.strip())
    return out


def scan(node: Node, selector: pci.DeviceSelector | None = None, query: object = None) -> dict:
    """The policy, the kernel's control of ASPM, each GPU path's functions and links (pcie_aspm_verify.read)."""
    selector = selector or pci.DeviceSelector()
    text = read_small(node.path(POLICY_FILE))
    parsed = parse_policy(text)
    release = (read_small(node.path("proc/sys/kernel/osrelease")) or "").strip() or None
    out = {"policy": parsed["current"], "policies": parsed["choices"], "policy_present": text is not None,
           "kernel_args": [a for a in cmdline_args(node) if a.startswith("pcie_aspm")], "kernel": release,
           "gpus": [], "devices": {}, "links": {}}
    for dev in pci.listed(node, query):
        if not selector.matches(dev):
            continue
        chain = pci.bridge_chain(node, dev["bdf"]) + [(dev["bdf"], pci.device_dir(node, dev["bdf"]))]
        out["gpus"].append({"bdf": dev["bdf"], "path": [b for b, _p in chain]})
        for i, (bdf, path) in enumerate(chain):
            if bdf not in out["devices"]:
                out["devices"][bdf] = dict(_read_device(path), bdf=bdf)
            up = chain[i - 1][0] if i else None
            if up is not None and out["devices"][up].get("port_type") != "upstream_port":
                link = out["links"].setdefault(bdf, {"up": up, "down": bdf, "gpus": [], "attrs": _read_attrs(path)})
                link["gpus"].append(dev["bdf"])
    out["control"], out["control_reason"] = control(out)
    return out


def _version(release: str | None) -> tuple:
    return tuple(fit.parse_release(release) or ())


def _enabled(facts: dict, link: dict) -> list:
    """The ends of a link whose Link Control has an ASPM state enabled."""
    return [b for b in (link["up"], link["down"]) if (facts["devices"].get(b) or {}).get("lnkctl_aspm")]


def control(facts: dict) -> tuple:
    """``(control, reason)``: ``os`` when the kernel controls ASPM, else ``off``, ``firmware`` or ``no_policy``."""
    if "pcie_aspm=off" in facts.get("kernel_args", []):
        return "off", ("pcie_aspm=off is on the kernel command line: the kernel leaves ASPM as the firmware set it, "
                       "refuses policy writes (EPERM) and shows no link attributes; remove it to let the kernel "
                       "manage ASPM")
    if not facts.get("policy_present"):
        return "no_policy", ("the kernel has no ASPM policy (/%s is missing: built without CONFIG_PCIEASPM), so ASPM "
                             "stays as the firmware set it; set it in the firmware (BIOS) setup" % POLICY_FILE)
    version = _version(facts.get("kernel"))
    links = list((facts.get("links") or {}).values())
    on = sorted({b for lk in links for b in _enabled(facts, lk)})
    if version >= LINK_ATTRS_SINCE and on and not any(lk["attrs"] for lk in links):
        return "firmware", (
            "the firmware keeps ASPM control: ASPM is enabled on %s, yet Linux %s shows no link attribute "
            "(link/l1_aspm, %s) on any GPU link, which it does only when ASPM control was not granted to it (the ACPI "
            "FADT 'ASPM unsupported' flag, or _OSC not granting PCIe control; dmesg shows 'FADT indicates ASPM is "
            "unsupported' or the _OSC lines); it then refuses policy writes (EPERM). Enable OS (native) ASPM control "
            "in the firmware setup, or disable ASPM there" % (", ".join(on), fit.release_text(version), ABI_DOC))
    return "os", ""


def links_reason(facts: dict) -> str:
    """Why the links cannot be managed although the kernel controls ASPM: a kernel before 5.5 ('' otherwise)."""
    version = _version(facts.get("kernel"))
    if version and version < LINK_ATTRS_SINCE:
        return ("Linux %s has no per-link ASPM attributes (link/l1_aspm and its siblings came with 5.5, %s): "
                "only the policy can be set; policy performance disables ASPM on every link" % (
                    fit.release_text(version), ABI_DOC))
    return ""


# The run: validate, plan, journal, write, read back (or restore)


def params_problems(want: dict) -> list:
    out = []
    if want.get("policy") is not None and want["policy"] not in POLICIES:
        out.append(("policy", "policy must be one of %s (or null: leave it), got %r"
                    % (", ".join(POLICIES), want["policy"])))
    if (want.get("links") or "keep") not in LINKS:
        out.append(("links", "links must be one of %s, got %r" % (", ".join(LINKS), want.get("links"))))
    return out


def device_selector(params: dict) -> pci.DeviceSelector:
    problems = params_problems(params) + pci.selector_problems(params)
    if problems:
        raise family.FamilyError("invalid input, nothing was written: %s" % family.problems_text(problems),
                                 {"changed": False})
    return pci.DeviceSelector(vendor=params.get("vendor"), device=params.get("device"),
                              class_prefixes=params.get("class_prefixes"), bdfs=params.get("bdfs"))


def plan_item(name: str, path: str, before: Any, after: Any) -> dict:
    return {"name": name, "path": "/" + path, "before": before, "after": after, "changed": before != after,
            "skipped": False, "failed": False, "reason": ""}


def attr_path(bdf: str, attr: str) -> str:
    return "%s/%s/link/%s" % (SYSFS_PCI_DEVICES, bdf, attr)


def plan(facts: dict, policy: str | None, links: str) -> tuple:
    """``(items, reasons)``: what a run writes, and why a part is left alone (``{"policy"|"links": why}``)."""
    reasons = {}
    if facts["control"] != "os":
        return [], {k: facts["control_reason"] for k, on in (("policy", policy), ("links", links == "off")) if on}
    items = []
    if policy is not None:
        if policy not in facts["policies"]:
            reasons["policy"] = "this kernel offers the policies %s, not %s" % (
                ", ".join(facts["policies"]) or "none", policy)
        else:
            items.append(plan_item(KEY_POLICY, POLICY_FILE, facts["policy"], policy))
    if links == "off":
        with_attrs = [lk for lk in facts["links"].values() if lk["attrs"]]
        if not with_attrs and links_reason(facts):
            reasons["links"] = links_reason(facts)
        for link in sorted(with_attrs, key=lambda lk: lk["down"]):
            for attr in reversed(ATTRS):
                if attr in link["attrs"]:
                    items.append(plan_item("%s/%s" % (link["down"], attr), attr_path(link["down"], attr),
                                           link["attrs"][attr], 0))
    return items, reasons


def _refusal(exc: NodeError, what: str) -> str:
    """The cause of a refused write, EPERM named as the kernel's refusal of ASPM control."""
    cause = exc.__cause__ or exc.__context__
    if getattr(cause, "errno", None) == errno.EPERM:
        return ("the kernel refused the write to %s (EPERM): it does not control ASPM on this node (pcie_aspm=off, "
                "or the firmware keeps ASPM control through the ACPI FADT or _OSC); nothing more was written" % what)
    return str(exc)


def _write(node: Node, item: dict, value: Any) -> Any:
    """Write one item and read it back (a simulated policy file is written as the kernel shows it)."""
    if item["name"] == KEY_POLICY:
        choices = tuple(parse_policy(read_small(node.path(POLICY_FILE)))["choices"]) or POLICIES
        node.write(value if node.is_live else policy_text(value, choices), POLICY_FILE)
        return parse_policy(read_small(node.path(POLICY_FILE)))["current"]
    node.write(str(value), item["path"])
    text = (read_small(node.path(item["path"])) or "").strip()
    return int(text) if text in ("0", "1") else text


def _apply(node: Node, items: list, journal: Any, restore: bool, reasons: dict, fresh: set) -> None:
    """Write each item that changes and read it back; an EPERM refusal stops every later write."""
    refused = None
    for item in items:
        if not item["changed"]:
            continue
        if refused:
            item.update(changed=False, skipped=True, reason="not written: %s" % refused)
        else:
            try:
                got = _write(node, item, item["after"])
            except NodeError as exc:
                refused = _refusal(exc, item["path"])
                if refused.startswith("the kernel refused"):
                    item.update(changed=False, skipped=True, reason=refused)
                    reasons[KEY_POLICY if item["name"] == KEY_POLICY else "links"] = refused
                else:
                    item.update(changed=False, failed=True, reason=refused)
                    refused = None
            else:
                if got != item["after"]:
                    item.update(failed=True, reason="wrote %s but it reads back %r" % (item["after"], got))
                elif journal is not None and restore:
                    journal.drop(NAME, item["name"])
        if journal is not None and item["name"] in fresh and not item["changed"]:
            journal.drop(NAME, item["name"])
    if not node.is_live and any(i["changed"] for i in items):
        simulate_link_control(node)


def simulate_link_control(node: Node) -> None:
    """A simulated node: set Link Control's ASPM field of each GPU link's ends as the kernel would."""
    facts = scan(node)
    off = facts["policy"] == "performance"
    for link in facts["links"].values():
        if not link["attrs"]:
            continue
        bits = 0 if off else (link["attrs"].get("l0s_aspm", 0) | link["attrs"].get("l1_aspm", 0) << 1)
        for bdf in (link["up"], link["down"]):
            dev = facts["devices"].get(bdf) or {}
            if dev.get("lnkctl_offset") is None:
                continue
            with open(node.path(SYSFS_PCI_DEVICES, bdf, "config"), "r+b") as fh:
                fh.seek(dev["lnkctl_offset"])
                value = struct.unpack("<H", fh.read(2))[0]
                fh.seek(dev["lnkctl_offset"])
                fh.write(struct.pack("<H", (value & ~LNKCTL_ASPM_MASK) | (bits & dev["aspm_support_bits"])))


def execute(call: family.Call, node: Node, journal: Any, selector: pci.DeviceSelector | None) -> dict:
    """Plan (or the journal's originals), journal, write and read back; the result. FamilyError when an item failed."""
    params, restore = call.params, bool(call.params.get("restore"))
    reasons, facts = {}, None
    if restore:
        from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_aspm_restore

        items = pcie_aspm_restore.restore_items(node, journal)
    else:
        facts = scan(node, selector)
        if not facts["gpus"] and not params.get("allow_empty") and params.get("links") == "off":
            raise family.FamilyError("no PCI device matches the selection (%s); set allow_empty: true to accept a "
                                     "node without such devices" % selector.describe(), {"changed": False})
        items, reasons = plan(facts, params.get("policy"), params.get("links") or "keep")
    fresh = set()
    if journal is not None and not restore and not call.check_mode:
        fresh = {i["name"] for i in items if i["changed"] and journal.record(NAME, i["name"], i["before"])}
        journal.save()
    if not call.check_mode:
        _apply(node, items, journal, restore, reasons, fresh)
        if journal is not None:
            if not restore and any(i["changed"] for i in items):
                journal.mark_applied(NAME)
            journal.save()
    result = {"changed": any(i["changed"] for i in items), "items": items, "unsupported": reasons,
              "control": facts["control"] if facts else None, "failed_items": [i["name"] for i in items
                                                                               if i["failed"]]}
    if call.diff:
        result["diff"] = {"before": {i["name"]: i["before"] for i in items},
                          "after": {i["name"]: i["after"] for i in items}}
    for key, why in sorted(reasons.items()):
        call.warn("pcie_aspm %s is unsupported on this node, nothing written for it: %s" % (key, why))
    if result["failed_items"]:
        raise family.FamilyError("pcie_aspm: %s" % "; ".join("%s: %s" % (i["name"], i["reason"])
                                                             for i in items if i["failed"]), result)
    return result


def run(call: family.Call) -> dict:
    """The family's run (the runtime and rollback flows): options in, the items' results out."""
    selector = device_selector(call.params)
    node, journal = open_node(call.params)
    if not call.params.get("restore") and call.params.get("policy") is None \
            and (call.params.get("links") or "keep") == "keep":
        return {"changed": False, "items": [], "unsupported": {}, "control": None, "failed_items": [],
                "msg": "policy null and links keep: ASPM is left as it is"}
    try:
        return execute(call, node, journal, selector)
    except NodeError as exc:
        raise family.FamilyError(str(exc), {"changed": False}) from None


def summary(result: dict) -> str:
    if result.get("msg"):
        return result["msg"]
    items = result.get("items") or []
    changed = [i["name"] for i in items if i.get("changed")]
    line = "%d written (%s), %d already set" % (len(changed), ", ".join(changed) or "none", len(items) - len(changed))
    for key, why in sorted((result.get("unsupported") or {}).items()):
        line += "; %s unsupported: %s" % (key, why)
    return line


def _plan_half():
    """The plan half (families/pcie_aspm_plan.py), imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_aspm_plan
    return pcie_aspm_plan


def _verification():
    """The verification half (families/pcie_aspm_verify.py), imported when verification first calls it."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_aspm_verify
    return pcie_aspm_verify


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "PCIe ASPM"},
    read=family.later(_verification, "read"),
    facts_doc=family.later(_verification, "FACTS_DOC"),
    run=run,
    evaluate=family.later(_verification, "evaluate"),
    reads_boot_config=family.later(_verification, "reads_boot_config"),
    boot=family.later(_plan_half, "boot"),
    from_role=family.later(_plan_half, "from_role"),
    role_problems=family.later(_plan_half, "role_problems"),
    runtime_options=family.later(_plan_half, "runtime_options"),
    restore_options=lambda v: {"restore": True},
    argument_spec=ARGUMENT_SPEC,
    kernel_args=family.later(_plan_half, "kernel_args"),
    summary=summary,
    items="items",
    validate={NAME: family.later(_plan_half, "desired_problems")},
)
