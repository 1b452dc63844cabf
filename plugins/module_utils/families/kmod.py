# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Optional kernel modules: validate, plan, load or unload with modprobe, classify failures (core/modprobe_log.py).

How it works and why: docs/dev/node-code.md, "families/kmod.py"."""

from __future__ import annotations

import os
from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command
from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import (
    JOURNAL_ARGUMENT_SPEC,
    Journal,
    open_node,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.modprobe_log import (  # noqa: F401 (re-exported)
    KmsgCursor,
    classify_failure,
    classify_unload_failure,
    relevant_log_lines,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    Node,
    NodeError,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import (  # noqa: F401 (sysfs_name: re-exported)
    ValidationError,
    kmod_name,
    kmod_param,
    kmod_param_value,
    sysfs_name,
)

NAME = "kmod"
# Optional modules that need another subsystem: without it they cannot load (knobs.md).
MODULE_NEEDS = {"nvidia_peermem": ("ib_core", "the RDMA stack (MOFED/ib_core)"),
                "nv_peer_mem": ("ib_core", "the RDMA stack (MOFED/ib_core)")}
NOT_LOADED = "not_loaded"
STATES = ("present", "absent")

# run(argv) -> (rc, stdout, stderr): the module's run_command in the C locale.
Runner = Callable[[list], tuple]


def param_string(value: Any) -> str:
    """Render a parameter value as modprobe takes it (booleans as 1/0)."""
    return kmod_param_value(value)


def validate_request(req: dict) -> list[str]:
    """Return a list of error messages for one request ``{name, params, state, required}``."""
    errors = []
    name = req.get("name")
    try:
        kmod_name(name)
    except ValidationError as exc:
        errors.append(str(exc))
        name = "?"
    if req.get("state") not in STATES:
        errors.append("%s: state %r is invalid: allowed are %s" % (name, req.get("state"), ", ".join(STATES)))
    params = req.get("params") or {}
    if not isinstance(params, dict):
        errors.append("%s: params must be a dict of parameter name to value" % name)
        return errors
    if params and req.get("state") == "absent":
        errors.append("%s: params are only allowed with state=present" % name)
    for pname, pvalue in params.items():
        try:
            kmod_param(name, pname, pvalue)
        except ValidationError as exc:
            errors.append(str(exc))
    return errors


def validate_requests(reqs: list[dict]) -> list[str]:
    """Validate every request and reject a module named twice. Returns a list of messages."""
    errors = []
    seen = set()
    for req in reqs:
        errors.extend(validate_request(req))
        key = sysfs_name(str(req.get("name")))
        if key in seen:
            errors.append("module %s is given more than once" % req.get("name"))
        seen.add(key)
    return errors


# --- state of the node --------------------------------------------------------------------------


def module_state(node: Node, name: str) -> tuple[bool, bool]:
    """Return ``(loaded, builtin)`` for a module name as seen in /sys/module."""
    base = "sys/module/%s" % sysfs_name(name)
    if not node.isdir(base):
        return False, False
    return True, not node.exists(base, "initstate")


def is_builtin_listed(node: Node, name: str) -> bool:
    """True when modules.builtin of the running kernel lists ``name`` (built-ins without sysfs dir)."""
    release = node.read("proc/sys/kernel/osrelease", default="")
    if not release:
        return False
    text = node.read("lib/modules", release, "modules.builtin", default="")
    wanted = sysfs_name(name)
    for line in text.splitlines():
        base = os.path.basename(line.strip())
        if base.endswith(".ko"):
            base = base[:-3]
        if sysfs_name(base) == wanted:
            return True
    return False


def param_drift(node: Node, name: str, params: dict) -> tuple[dict, list]:
    """``(drift, unsupported)``: the parameters whose loaded value differs, ``{param: {requested, current}}``, and
    those the module does not show in /sys/module (they cannot be compared, and are never a reason to reboot).
    core/module_params.py is imported only when there are parameters to compare."""
    if not params:
        return {}, []
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import module_params

    wanted = {k: param_string(v) for k, v in params.items()}
    found = module_params.states(node, name, wanted)
    drift = {k: {"requested": v["requested"], "current": v["current"]} for k, v in found.items()
             if v["state"] == module_params.DIFFERS}
    return drift, sorted(k for k, v in found.items() if v["state"] == module_params.UNSUPPORTED)


# --- plan and apply --------------------------------------------------------------------------------


def new_result(req: dict) -> dict:
    return {
        "name": req["name"],
        "state": req["state"],
        "required": bool(req.get("required")),
        "loaded": False,
        "already_loaded": False,
        "builtin": False,
        "changed": False,
        "reason_class": None,
        "message": "",
        "param_drift": {},
        "param_unsupported": [],
        "persist_ok": False,
        "modprobe_options": modprobe_options(req),
        "log": [],
    }


def plan(node: Node, req: dict) -> tuple[dict, str | None]:
    """Predict one request without running anything: a result with ``action`` load/unload/None."""
    res = new_result(req)
    loaded, builtin = module_state(node, req["name"])
    res["loaded"] = loaded
    res["already_loaded"] = loaded
    res["builtin"] = builtin
    action = None
    if req["state"] == "present":
        if loaded:
            res["param_drift"], res["param_unsupported"] = param_drift(node, req["name"], req.get("params"))
            res["message"] = "already loaded"
            if res["param_drift"]:
                res["message"] = ("already loaded with other parameters (%s); not reloaded: the options line in "
                                  "modprobe.d (persistent flow) applies them at the next boot, or unload it"
                                  % ", ".join(sorted(res["param_drift"])))
        else:
            action = "load"
            res["message"] = "would load"
    else:
        if loaded and builtin:
            res["reason_class"] = "builtin"
            res["message"] = "%s is built into the kernel and cannot be unloaded" % req["name"]
        elif loaded:
            action = "unload"
            res["message"] = "would unload"
        else:
            res["message"] = "not loaded"
    res["persist_ok"] = res["loaded"]
    return res, action


def param_words(req: dict) -> list[str]:
    """``NAME=VALUE`` for each parameter of a validated request, sorted by name."""
    params = req.get("params") or {}
    return [kmod_param(req["name"], k, params[k]) for k in sorted(params)]


def modprobe_args(modprobe: str, req: dict, action: str) -> list[str]:
    """The modprobe argument list for a load or unload (never a shell string)."""
    if action == "unload":
        return [modprobe, "-r", "--", req["name"]]
    return [modprobe, "--", req["name"]] + param_words(req)


def modprobe_options(req: dict) -> str | None:
    """The /etc/modprobe.d line that sets a request's parameters at boot, or None without parameters."""
    words = param_words(req) if req["state"] == "present" else []
    return "options %s %s" % (req["name"], " ".join(words)) if words else None


def load(node: Node, req: dict, res: dict, run: Runner, modprobe: str,
         dmesg: list[str] | None = None) -> dict:
    """Load a module. ``run(args) -> (rc, out, err)``; ``dmesg`` is a dmesg argument list or None."""
    cursor = KmsgCursor(node)
    try:
        rc, out, err = run(modprobe_args(modprobe, req, "load"))
        loaded, builtin = module_state(node, req["name"])
        if rc == 0 and not loaded and is_builtin_listed(node, req["name"]):
            loaded, builtin = True, True
        if rc == 0 and loaded:
            res.update(loaded=True, builtin=builtin, changed=not builtin, message="loaded",
                       persist_ok=True)
            if builtin:
                res["already_loaded"] = True
                res["message"] = "built into the kernel"
            if not builtin:
                res["param_drift"], res["param_unsupported"] = param_drift(node, req["name"], req.get("params"))
            if res["param_drift"]:
                res["message"] = "loaded; parameters not shown as requested: %s" % ", ".join(sorted(res["param_drift"]))
            return res
        lines = cursor.read_new() if cursor.available else []
        if not cursor.available and dmesg:
            drc, dout, _derr = run(dmesg)
            if drc == 0:
                lines = dout.splitlines()[-200:]
        lines = relevant_log_lines(lines, req["name"])
        output = "\n".join(x for x in (err, out) if x)
        if rc == 0:
            cls, msg = "unknown", "modprobe succeeded but /sys/module/%s did not appear" % sysfs_name(req["name"])
        else:
            cls, msg = classify_failure(req["name"], output, lines)
        res.update(loaded=False, changed=False, reason_class=cls, message=msg, persist_ok=False, log=lines)
        return res
    finally:
        cursor.close()


def unload(node: Node, req: dict, res: dict, run: Runner, modprobe: str) -> dict:
    """Unload a module with ``modprobe -r`` and read back that /sys/module/NAME is gone."""
    rc, out, err = run(modprobe_args(modprobe, req, "unload"))
    loaded, _builtin = module_state(node, req["name"])
    if rc == 0 and not loaded:
        res.update(loaded=False, changed=True, message="unloaded", persist_ok=False)
        return res
    cls, msg = classify_unload_failure(req["name"], "\n".join(x for x in (err, out) if x))
    res.update(loaded=loaded, changed=False, reason_class=cls, message=msg, persist_ok=loaded)
    return res


def apply_requests(node: Node, reqs: list[dict], run: Runner, find_modprobe: Callable[[], str],
                   journal: Journal | None = None, check_mode: bool = False,
                   dmesg: list[str] | None = None) -> list[dict]:
    """Plan and apply every request; return the list of per-module results."""
    planned = [(req,) + plan(node, req) for req in reqs]
    if check_mode or not any(action for _req, _res, action in planned):
        return [res for _req, res, _action in planned]
    modprobe = _modprobe_for(planned, find_modprobe)
    if modprobe is None:
        return [res for _req, res, _action in planned]
    if journal is not None:
        for req, _res, action in planned:
            if action == "load":
                journal.record(NAME, sysfs_name(req["name"]), NOT_LOADED)
        journal.save()
    results = []
    for req, res, action in planned:
        if action == "load":
            load(node, req, res, run, modprobe, dmesg=dmesg)
            if journal is not None and not res["changed"]:
                journal.drop(NAME, sysfs_name(req["name"]))
        elif action == "unload":
            unload(node, req, res, run, modprobe)
            if journal is not None and res["changed"] and journal.has(NAME, sysfs_name(req["name"])):
                # We unloaded a module we had loaded ourselves: nothing is left to roll back.
                journal.drop(NAME, sysfs_name(req["name"]))
        results.append(res)
    if journal is not None:
        journal.save()
    return results


def _modprobe_for(planned: list, find_modprobe: Callable[[], str]) -> str | None:
    """``find_modprobe()``, or None on a node without one: then each planned load or unload says why, as a
    failed load does (an optional module is a warning, a required one fails the family), and nothing ran."""
    try:
        return find_modprobe()
    except (contract.FamilyError, NodeError) as exc:
        for _req, res, action in planned:
            if action:
                res.update(changed=False, reason_class="no_modprobe", message=str(exc), persist_ok=res["loaded"])
        return None


def requests_from(params: dict) -> list:
    """The list of requests ``{name, params, state, required}`` from the module options."""
    if params["name"] is not None:
        return [dict(name=params["name"], params=params["params"] or {}, state=params["state"],
                     required=params["required"])]
    return [dict(name=m["name"], params=m.get("params") or {},
                 state=m.get("state") or params["state"],
                 required=params["required"] if m.get("required") is None else m["required"])
            for m in params["modules"] or []]


def run(call: contract.Call) -> dict:
    """The kmod_optional module: validate every request, then load or unload (or restore); returns the result."""
    params = call.params
    reqs = [] if params["restore"] else requests_from(params)
    if not params["restore"] and not reqs:
        raise contract.FamilyError("one of name or modules is required (or restore=true with journal)")
    errors = validate_requests(reqs)
    if errors:
        raise contract.FamilyError("invalid input, nothing was run: " + "; ".join(errors))
    node, journal = open_node(params)

    def find_modprobe():
        return _find_modprobe(node, call.lookup)

    try:
        if params["restore"]:
            from ansible_collections.gpunode.tuning.plugins.module_utils.families import kmod_restore

            results = kmod_restore.restore(node, journal, call.run_command, find_modprobe, check_mode=call.check_mode)
        else:
            results = apply_requests(node, reqs, call.run_command, find_modprobe, journal=journal,
                                     check_mode=call.check_mode, dmesg=_dmesg(node, call.lookup))
    except NodeError as exc:
        raise contract.FamilyError(str(exc)) from None
    return _finish(call, results)


def _find_modprobe(node: Node, lookup) -> str:
    """modprobe of the node; on a simulated root only the node's own, never the controller's."""
    if node.is_live:
        return node.bin_path(lookup, "modprobe", "kmod")
    for rel in ("usr/sbin/modprobe", "sbin/modprobe"):
        if os.access(node.path(rel), os.X_OK):
            return node.path(rel)
    raise contract.FamilyError("the simulated node %s has no usr/sbin/modprobe; the controller's modprobe is never "
                               "run against a simulated root" % node.root)


def _dmesg(node, lookup):
    """dmesg's argv on a live node, else None: optional, without it a failed load lacks the kernel's words."""
    if not node.is_live:
        return None
    try:
        return [node.bin_path(lookup, "dmesg", "util-linux")]
    except NodeError:
        return None


def _finish(call, results):
    """The result: warnings for optional failures, FamilyError naming the required ones."""
    params = call.params
    changed = any(r["changed"] for r in results)
    if call.check_mode:
        changed = any(r["message"] in ("would load", "would unload") for r in results)
    out = dict(changed=changed, modules=results)
    if params["name"] is not None and not params["restore"]:
        out.update({k: v for k, v in results[0].items() if k != "changed"})
    if call.diff:
        out["diff"] = _diff(results, call.check_mode)
    for r in results:
        if r["reason_class"] and not r["required"]:
            call.warn("%s: %s (%s; not required)" % (r["name"], r["message"], r["reason_class"]))
    failed = [r for r in results if r["reason_class"] and r["required"]]
    if failed:
        what = ("these modules were not unloaded and stay in the journal for the next rollback: "
                if params["restore"] else "required modules did not reach their state: ")
        raise contract.FamilyError(what + "; ".join("%s (%s): %s" % (r["name"], r["reason_class"], r["message"])
                                                    for r in failed), out)
    return out


def _diff(results, check_mode):
    def shown(r, after):
        loaded = r["loaded"] if after else r["already_loaded"]
        if check_mode and after and r["message"] in ("would load", "would unload"):
            loaded = r["message"] == "would load"
        return "loaded" if loaded else "not loaded"
    return dict(before={r["name"]: shown(r, False) for r in results},
                after={r["name"]: shown(r, True) for r in results})


# The options of its module (kmod_optional): the flow module completes each family's options with it too.
ARGUMENT_SPEC = dict(
    name=dict(type="str"),
    params=dict(type="dict"),
    state=dict(type="str", choices=list(STATES), default="present"),
    required=dict(type="bool", default=False),
    modules=dict(type="list", elements="dict", options=dict(
        name=dict(type="str", required=True),
        params=dict(type="dict"),
        state=dict(type="str", choices=list(STATES)),
        required=dict(type="bool"),
    )),
    **JOURNAL_ARGUMENT_SPEC,
    **NODE_ARGUMENT_SPEC,
    **command.ARGUMENT_SPEC,
)


def summary(result: dict) -> str:
    return "; ".join("%s: %s" % (m.get("name"), m.get("message")) for m in result.get("modules") or [])


def _plan_half():
    """The plan half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import kmod_plan
    return kmod_plan


def _verification():
    """The verification half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import kmod_verify
    return kmod_verify


PERSIST = contract.Concern(NAME, (NAME,), contract.later(_plan_half, "persist_modules"),
                           contract.later(_plan_half, "remove_modules"),
                           description="modules-load.d and modprobe.d files for the optional modules that load")


DEFINITION = Family(
    name=NAME,
    titles={NAME: "modules"},
    module="kmod_optional",
    read=contract.later(_verification, "read"),
    read_options={"modules": contract.later(_verification, "facts_names")},
    facts_options=contract.later(_verification, "facts_options"),
    facts_doc=contract.later(_verification, "FACTS_DOC"),
    run=run,
    evaluate=contract.later(_verification, "evaluate"),
    runtime=contract.later(_verification, "runtime_row"),
    from_role=contract.later(_plan_half, "from_role"),
    runtime_options=contract.later(_plan_half, "runtime_options"),
    restore_options=contract.later(_plan_half, "restore_options"),
    argument_spec=ARGUMENT_SPEC,
    persist=PERSIST,
    persist_reboots=True,
    summary=summary,
    items="modules",
    validate={NAME: contract.later(_plan_half, "desired_problems")},
)
