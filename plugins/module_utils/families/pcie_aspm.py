# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCIe link power management (ASPM) on the GPU paths: the ``pcie_aspm`` family (issue 44).

Two settings. The kernel's ASPM policy, ``/sys/module/pcie_aspm/parameters/policy`` (it reads
``default [performance] powersave powersupersave``, the bracketed one current; ``performance``
disables ASPM on every link the kernel controls; kernel-parameters.txt, ``pcie_aspm.policy=`` on the
command line). And ASPM off on each GPU's link and the links of the switches above it, through the
per-link attributes of Documentation/ABI/testing/sysfs-bus-pci (Linux 5.5 and later): ``link/l0s_aspm``,
``l1_aspm``, ``l1_1_aspm``, ``l1_2_aspm``, ``l1_1_pcipm``, ``l1_2_pcipm`` (``clkpm`` is clock power
management, not ASPM: read, never written). The kernel shows them on the link's downstream
component (the GPU, a switch's upstream port) and only for the states the link supports.

Verification reads the ASPM Control field (bits 1:0) of Link Control (PCIe capability + 0x10) of
every function on each GPU's path from config space, both ends of every link.

Fit before tuned: with ``pcie_aspm=off`` on the command line, or the firmware keeping ASPM control (the
ACPI FADT "ASPM unsupported" flag, or ``_OSC`` not granting PCIe control), the kernel refuses policy
writes (EPERM) and hides the link attributes; without CONFIG_PCIEASPM there is no policy file. Then the
family is ``unsupported`` with the cause and writes nothing. A kernel before 5.5 has no link
attributes: the policy is managed, the links are reported as unsupported there.

Plain Python 3.8+, no Ansible import (the boot runner loads it on the node).
"""

from __future__ import annotations

import errno
import os
import struct
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core import platform as fit
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
# The per-link ASPM attributes, in the order that enables them (L1 before its substates); "off" writes them
# in the reverse order. clkpm is read only.
ATTRS = ("l0s_aspm", "l1_aspm", "l1_1_aspm", "l1_2_aspm", "l1_1_pcipm", "l1_2_pcipm")
LINK_ATTRS_SINCE = (5, 5)
# Link Control and Link Capabilities in the PCIe capability (pci_regs.h PCI_EXP_LNKCTL, PCI_EXP_LNKCAP).
PCI_EXP_LNKCTL = 0x10
LNKCTL_ASPM_MASK = 0x0003  # PCI_EXP_LNKCTL_ASPMC: bit 0 L0s, bit 1 L1
LNKCAP_ASPM_SHIFT = 10  # PCI_EXP_LNKCAP_ASPMS: bits 11:10
ASPM_DISABLED = "ASPM Disabled"
KERNEL_PARAMS_DOC = "https://docs.kernel.org/admin-guide/kernel-parameters.html"
ABI_DOC = "https://www.kernel.org/doc/Documentation/ABI/testing/sysfs-bus-pci"
_KEY_POLICY = "policy"
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


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Reading the node
# ---------------------------------------------------------------------------------------------


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


def read(node: Node, selector: pci.DeviceSelector | None = None, query: object = None) -> dict:
    """The family's facts (``facts["pcie_aspm"]``): the policy, the kernel's control of ASPM, and each GPU path's
    functions (Link Control's ASPM field) and links (their attributes)."""
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
    """``(control, reason)``: ``os`` when the kernel controls ASPM, else ``off``, ``firmware`` or ``no_policy``.

    ``firmware`` is inferred, without writing, from Linux 5.5+ showing no link attribute on any GPU link while a
    GPU link has ASPM enabled: the kernel shows the attributes of every state a link can take unless it does
    not control ASPM, and where it controls ASPM but finds a state unusable (exit latency) it also disables it.
    A policy write the kernel refuses (EPERM) says the same at runtime.
    """
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


# ---------------------------------------------------------------------------------------------
# The run: validate, plan, journal, write, read back (or restore the journal's originals)
# ---------------------------------------------------------------------------------------------


def _params_problems(want: dict) -> list:
    out = []
    if want.get("policy") is not None and want["policy"] not in POLICIES:
        out.append(("policy", "policy must be one of %s (or null: leave it), got %r"
                    % (", ".join(POLICIES), want["policy"])))
    if (want.get("links") or "keep") not in LINKS:
        out.append(("links", "links must be one of %s, got %r" % (", ".join(LINKS), want.get("links"))))
    return out


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["pcie_aspm"]``: ``{policy, links, persist}`` and the PCI selector keys."""
    shape = family.entry_problem(NAME, want, "policy, links, persist and the PCI selector keys")
    if shape or want is None:
        return shape
    out = _params_problems(want)
    if want.get("persist") is not None and want["persist"] not in PERSIST:
        out.append(("persist", "persist must be one of %s, got %r" % (", ".join(PERSIST), want["persist"])))
    return out + pci.selector_problems(want)


def _selector(params: dict) -> pci.DeviceSelector:
    problems = _params_problems(params) + pci.selector_problems(params)
    if problems:
        raise family.FamilyError("invalid input, nothing was written: %s" % family.problems_text(problems),
                                 {"changed": False})
    return pci.DeviceSelector(vendor=params.get("vendor"), device=params.get("device"),
                              class_prefixes=params.get("class_prefixes"), bdfs=params.get("bdfs"))


def _item(name: str, path: str, before: Any, after: Any) -> dict:
    return {"name": name, "path": "/" + path, "before": before, "after": after, "changed": before != after,
            "skipped": False, "failed": False, "reason": ""}


def _attr_path(bdf: str, attr: str) -> str:
    return "%s/%s/link/%s" % (SYSFS_PCI_DEVICES, bdf, attr)


def plan(facts: dict, policy: str | None, links: str) -> tuple:
    """``(items, reasons)``: what a run writes (policy first, then each link's attributes to 0), and why a part is
    left alone (``{"policy"|"links": why}``). Nothing is planned where the kernel does not control ASPM."""
    reasons = {}
    if facts["control"] != "os":
        return [], {k: facts["control_reason"] for k, on in (("policy", policy), ("links", links == "off")) if on}
    items = []
    if policy is not None:
        if policy not in facts["policies"]:
            reasons["policy"] = "this kernel offers the policies %s, not %s" % (
                ", ".join(facts["policies"]) or "none", policy)
        else:
            items.append(_item(_KEY_POLICY, POLICY_FILE, facts["policy"], policy))
    if links == "off":
        with_attrs = [lk for lk in facts["links"].values() if lk["attrs"]]
        if not with_attrs and links_reason(facts):
            reasons["links"] = links_reason(facts)
        for link in sorted(with_attrs, key=lambda lk: lk["down"]):
            for attr in reversed(ATTRS):
                if attr in link["attrs"]:
                    items.append(_item("%s/%s" % (link["down"], attr), _attr_path(link["down"], attr),
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
    if item["name"] == _KEY_POLICY:
        choices = tuple(parse_policy(read_small(node.path(POLICY_FILE)))["choices"]) or POLICIES
        node.write(value if node.is_live else policy_text(value, choices), POLICY_FILE)
        return parse_policy(read_small(node.path(POLICY_FILE)))["current"]
    node.write(str(value), item["path"])
    text = (read_small(node.path(item["path"])) or "").strip()
    return int(text) if text in ("0", "1") else text


def _apply(node: Node, items: list, journal: Any, restore: bool, reasons: dict, fresh: set) -> None:
    """Write each item that changes and read it back. A policy write the kernel refuses (EPERM: it does not
    control ASPM) makes the family unsupported (``reasons``) and stops every later write; a journal entry of an
    item that was not written is dropped."""
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
                    reasons[_KEY_POLICY if item["name"] == _KEY_POLICY else "links"] = refused
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
    """A simulated node has no kernel behind its files: set each GPU link's Link Control ASPM field (both ends) the
    way the kernel would after the writes (policy performance: off; else the link attributes' L0s and L1)."""
    facts = read(node)
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


def _restore_items(node: Node, journal: Any) -> list:
    """The journaled originals as items: the policy first (what a link attribute reads depends on it: under
    ``performance`` an enabled state reads 0), then the links, L1 before its substates."""
    originals = journal.entries(NAME) if journal is not None else {}
    items = []
    if _KEY_POLICY in originals:
        items.append(_item(_KEY_POLICY, POLICY_FILE, parse_policy(read_small(node.path(POLICY_FILE)))["current"],
                           originals[_KEY_POLICY]))
    order = {a: i for i, a in enumerate(ATTRS)}
    for key in sorted((k for k in originals if k != _KEY_POLICY), key=lambda k: (k.split("/")[0],
                                                                                 order.get(k.split("/")[-1], 9))):
        bdf, _sep, attr = key.partition("/")
        path = _attr_path(bdf, attr)
        text = read_small(node.path(path))
        if text is None or attr not in ATTRS:
            item = _item(key, path, None, originals[key])
            item.update(changed=False, skipped=True, reason="recorded in the journal but not on the node; kept")
            items.append(item)
            continue
        items.append(_item(key, path, int(text.strip()) if text.strip() in ("0", "1") else text.strip(),
                           originals[key]))
    return items


def execute(call: family.Call, node: Node, journal: Any, selector: pci.DeviceSelector | None) -> dict:
    """Plan (or the journal's originals), journal, write and read back; the result. FamilyError when an item failed."""
    params, restore = call.params, bool(call.params.get("restore"))
    reasons, facts = {}, None
    if restore:
        items = _restore_items(node, journal)
    else:
        facts = read(node, selector)
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
    selector = _selector(call.params)
    node, journal = open_node(call.params)
    if not call.params.get("restore") and call.params.get("policy") is None \
            and (call.params.get("links") or "keep") == "keep":
        return {"changed": False, "items": [], "unsupported": {}, "control": None, "failed_items": [],
                "msg": "policy null and links keep: ASPM is left as it is"}
    try:
        return execute(call, node, journal, selector)
    except NodeError as exc:
        raise family.FamilyError(str(exc), {"changed": False}) from None


# ---------------------------------------------------------------------------------------------
# Boot re-apply, persistence, verification
# ---------------------------------------------------------------------------------------------


def boot(node: Node, want: dict) -> tuple:
    """Re-apply ``desired["pcie_aspm"]`` at boot (link attributes and the policy start from the kernel's defaults)."""
    params = dict(want, restore=False, journal=None, allow_empty=True)
    params.pop("persist", None)
    call = family.Call(params=params)
    try:
        result = execute(call, node, None, _selector(params))
    except (family.FamilyError, NodeError) as exc:
        return False, str(exc)
    if result["unsupported"]:
        return True, "; ".join("%s unsupported: %s" % kv for kv in sorted(result["unsupported"].items()))
    done = [i["name"] for i in result["items"] if i["changed"]]
    return True, "set %s" % ", ".join(done) if done else "already set"


def kernel_arg(policy: str) -> str:
    return "pcie_aspm.policy=%s" % policy


def kernel_args(pc, remove: bool = False) -> list:
    """``pcie_aspm.policy=<policy>`` when the policy persists by kernel argument (gpunode_tuning_pcie_aspm_persist:
    kernel_arg); none on a node whose kernel does not control ASPM (fit before tuned: no argument, no reboot); with
    ``remove``, every policy's argument."""
    if remove:
        return [kernel_arg(p) for p in POLICIES]
    want = pc.desired.get(NAME) or {}
    if want.get("persist") != "kernel_arg" or not want.get("policy"):
        return []
    facts = read(pc.node)
    if facts["control"] != "os":
        if pc.unfit is not None:
            pc.unfit["%s.policy" % NAME] = facts["control_reason"]
        return []
    return [kernel_arg(want["policy"])]


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
        return family.setting(NAME, _KEY_POLICY, policy, running, "applied", "", persisted)
    if policy not in (mine.get("policies") or []):
        return _unfit(_KEY_POLICY, policy, running, "this kernel offers the policies %s" % (
            ", ".join(mine.get("policies") or []) or "none"))
    arg = kernel_arg(policy)
    if want.get("persist") == "kernel_arg" and ctx.arg(arg)["configured"] and not ctx.arg(arg)["running"]:
        return family.setting(NAME, _KEY_POLICY, policy, running, "pending_reboot",
                              "%s is configured for the next boot, not running" % arg, persisted)
    return family.setting(NAME, _KEY_POLICY, policy, running, "drifted",
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
            rows.append(_unfit(_KEY_POLICY, want["policy"], mine.get("policy"), mine.get("control_reason")))
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


def from_role(v: dict, shared: dict) -> dict:
    policy, links = v.get("gpunode_tuning_pcie_aspm_policy"), v.get("gpunode_tuning_pcie_aspm_links") or "keep"
    if policy is None and links == "keep":
        return {NAME: None}
    return {NAME: dict(policy=policy, links=links, persist=v.get("gpunode_tuning_pcie_aspm_persist") or "boot_unit",
                       allow_empty=True, **shared["selector"])}


def runtime_options(desired: dict, v: dict) -> dict | None:
    want = desired.get(NAME)
    if not want:
        return None
    return {k: x for k, x in want.items() if x is not None and k != "persist"}


def role_problems(values: dict) -> list:
    """The policy persisted by kernel argument needs the command-line family on."""
    if (values.get("gpunode_tuning_pcie_aspm_policy") and values.get("gpunode_tuning_pcie_aspm_persist") == "kernel_arg"
            and values.get("gpunode_tuning_kernel_cmdline_enabled") is False):
        return ["gpunode_tuning_pcie_aspm_persist: kernel_arg needs gpunode_tuning_kernel_cmdline_enabled: true (the "
                "command-line family writes pcie_aspm.policy=); set it, or gpunode_tuning_pcie_aspm_persist: boot_unit"]
    return []


def summary(result: dict) -> str:
    if result.get("msg"):
        return result["msg"]
    items = result.get("items") or []
    changed = [i["name"] for i in items if i.get("changed")]
    line = "%d written (%s), %d already set" % (len(changed), ", ".join(changed) or "none", len(items) - len(changed))
    for key, why in sorted((result.get("unsupported") or {}).items()):
        line += "; %s unsupported: %s" % (key, why)
    return line


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "PCIe ASPM"},
    read=read,
    facts_doc=FACTS_DOC,
    run=run,
    evaluate=evaluate,
    reads_boot_config=reads_boot_config,
    boot=boot,
    from_role=from_role,
    role_problems=role_problems,
    runtime_options=runtime_options,
    restore_options=lambda v: {"restore": True},
    argument_spec=ARGUMENT_SPEC,
    kernel_args=kernel_args,
    summary=summary,
    items="items",
    validate={NAME: desired_problems},
)
