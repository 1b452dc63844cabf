# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kmod family's plan half: what the controller calls (the desired state from the role's variables, its
validation, the module's options) and what the persistent flow writes (modules-load.d and modprobe.d files).

Imported when one of them is first called (``family.later`` in families/kmod.py), never by a run that only applies
(docs/dev/adding-a-family.md).
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core import module_options, module_params, persistence
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import kmod_name
from ansible_collections.gpunode.tuning.plugins.module_utils.families.kmod import NAME, module_state, validate_requests


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["kmod"]``: ``{modules: [{name, params, state, required}]}``.

    The requests' rules are kmod_optional's own (``validate_requests``): names, parameters, state, a module
    given twice. Whether the module exists or loads on the node is the node's.
    """
    shape = contract.entry_problem(NAME, want, "modules")
    if shape or want is None:
        return shape
    modules = want.get("modules")
    if modules is None:
        return []
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        return [("modules", "modules must be a list of {name, params, state, required}, got %r" % (modules,))]
    reqs = [dict(name=m.get("name"), params=m.get("params") or {}, state=m.get("state") or "present",
                 required=m.get("required")) for m in modules]
    out = [("modules", msg) for msg in validate_requests(reqs)]
    out += [("modules", "%s: required must be true or false, got %r" % (r["name"], r["required"]))
            for r in reqs if r["required"] is not None and not isinstance(r["required"], bool)]
    return out


def from_role(v: dict, shared: dict) -> dict:
    return {NAME: {"modules": v["gpunode_tuning_kmod_modules"]} if v["gpunode_tuning_kmod_enabled"] else None}


def runtime_options(desired: dict, v: dict) -> dict | None:
    """kmod_optional's options: every listed module; None when there is none."""
    want = desired.get(NAME)
    return {"modules": want["modules"]} if want and want.get("modules") else None


def restore_options(v: dict) -> dict:
    return {"restore": True}


LOAD_DIR = "/etc/modules-load.d"
OPTIONS_DIR = "/etc/modprobe.d"


def options_file(name: str) -> str:
    """The modprobe.d file of ours for a module's options."""
    return "%s/%s%s.conf" % (OPTIONS_DIR, persistence.FILE_PREFIX, name)


def persist_modules(pc) -> dict:
    """modules-load.d (and modprobe.d for options) for each module that loads; no file for one that does not.

    kmod_optional loads them first (journaling, as at runtime) and says per module whether it can be
    persisted; a module that left the list or stopped loading loses its files. A loaded module whose parameters
    differ keeps running as it is: its options line waits for the next boot (``reboot_required``).
    """
    want = pc.desired.get(NAME)
    if not want or not want.get("modules"):
        return {"changed": False, "skipped": True, "reason": "no kernel module to persist"}
    results = pc.run_family(NAME, {"modules": want["modules"]})["modules"]
    boot_id = pc.node.read(module_params.BOOT_ID, default="")
    keep = set()
    for res in results:
        if not res.get("persist_ok"):
            continue
        name = kmod_name(res["name"])
        keep.add("%s/%s%s.conf" % (LOAD_DIR, persistence.FILE_PREFIX, name))
        pc.files.write("%s/%s%s.conf" % (LOAD_DIR, persistence.FILE_PREFIX, name), persistence.HEADER + name + "\n")
        if res.get("modprobe_options"):
            keep.add(options_file(name))
            pc.files.write(options_file(name), module_options.options_text(
                persistence.HEADER, res["modprobe_options"], boot_id, pc.files.read(options_file(name))))
    for path in pc.files.ours(LOAD_DIR) + pc.files.ours(OPTIONS_DIR):
        if path not in keep:
            pc.files.remove(path)
    lines = [_persist_message(r, pc.call) for r in results]
    pending = pending_params(pc, [r for r in results if r.get("persist_ok")])
    out = {"modules": [dict(name=r["name"], persisted=bool(r.get("persist_ok")), message=line)
                       for r, line in zip(results, lines)], "summary": "; ".join(lines)}
    if pending:
        out.update(reboot_required=True, pending_reboot=pending)
        out["summary"] += "; a reboot applies %s (a loaded module is never unloaded)" % ", ".join(
            "%s=%s" % kv for kv in sorted(pending.items()))
    return out


def pending_params(pc, loaded: list) -> dict:
    """``{module.param: "value (running X)"}`` of the parameters a reboot applies; one that another file or the command
    line sets after our line is no reason to reboot (fit before tuned): ``pc.unfit`` names it."""
    out = {}
    for res in loaded:
        later = module_options.overriding(pc.node, res["name"], options_file(res["name"])) if res["param_drift"] else {}
        for param, drift in sorted(res["param_drift"].items()):
            at_boot = later.get(param)
            if at_boot and module_params.compare(drift["requested"], module_params.kernel_form(
                    at_boot["value"], drift["current"])) != module_params.SAME:
                pc.unfit["%s.%s.%s" % (NAME, res["name"], param)] = module_options.override_reason(param, at_boot)
                continue
            out["%s.%s" % (res["name"], param)] = "%s (running %s)" % (drift["requested"], drift["current"])
    return out


def _persist_message(res: dict, call) -> str:
    name = res.get("name")
    if res.get("persist_ok"):
        return "%s loads at boot" % name
    if call.check_mode and res.get("reason_class") is None:
        return ("%s is not loaded now; check mode does not load it, so whether it would be persisted is decided by "
                "a real run (%s)" % (name, res.get("message") or ""))
    return "%s is not persisted: it does not load (%s: %s)" % (
        name, res.get("reason_class") or "unknown", res.get("message") or "")


def remove_modules(pc) -> dict:
    """Remove our files. A loaded module keeps the values our options line gave it until it is loaded again (the
    next boot; rollback never reboots): the summary names them."""
    running = []
    for path in pc.files.ours(OPTIONS_DIR):
        name = os.path.basename(path)[len(persistence.FILE_PREFIX):-len(".conf")]
        for param, value in sorted(module_options.parse_options(pc.files.read(path))["params"].items()):
            current = module_params.read_value(pc.node, name, param) if module_state(pc.node, name)[0] else None
            if module_params.compare(value, current) == module_params.SAME:
                running.append("%s %s=%s" % (name, param, current))
    for path in pc.files.ours(LOAD_DIR) + pc.files.ours(OPTIONS_DIR):
        pc.files.remove(path)
    if not running:
        return {}
    return {"still_running": running, "summary": "%s; still running until the module is loaded again (the next "
                                                 "boot): %s" % (_files_line(pc), ", ".join(running))}


def _files_line(pc) -> str:
    return ", ".join("%s %s" % kv for kv in pc.files.changes.items()) or "unchanged"
