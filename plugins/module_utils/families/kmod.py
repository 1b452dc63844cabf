# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Optional kernel modules: validate, plan, load or unload with modprobe, classify failures (core/modprobe_log.py).

A loaded module is never unloaded to change its parameters: they go to modprobe.d and wait for the next boot,
which verification checks per parameter (core/module_params.py).

A module that does not load is reported with a reason class rather than failing the task
(unless the caller marks it required). The class comes from modprobe's own output and the
kernel log records written during the attempt:

``not_found``, ``invalid_argument``, ``dependency_missing``, ``symbol_mismatch``, ``denied``,
``in_use`` (unload only), ``builtin`` (unload of a built-in module), ``invalid_name`` (a journal
entry that is not a module name: never passed to modprobe), ``no_modprobe`` (the node has no modprobe:
nothing was run), ``unknown``.

Loaded state is ``/sys/module/NAME`` (a built-in module with parameters has the directory but
no ``initstate``). Everything here reads below a ``Node`` root; modprobe is whatever binary the
caller found for that node.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, module_params, persistence
from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.facts import FactsError, read_all
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family, setting
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import (
    JOURNAL_ARGUMENT_SPEC,
    Journal,
    open_node,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.modprobe_log import (  # noqa: F401 (re-exported)
    PEERMEM_MESSAGE,
    PEERMEM_NAMES,
    KmsgCursor,
    classify_failure,
    classify_unload_failure,
    relevant_log_lines,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    Node,
    NodeError,
    read_small,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import (  # noqa: F401 (sysfs_name: re-exported)
    KMOD_NAME_ALLOWED,
    KMOD_NAME_RE,
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

# tuning_info's RETURN of tuning_facts.kmod (tools/generate.py writes it there).
FACTS_DOC = r"""
description: Kernel modules.
returned: always
type: dict
contains:
  loaded:
    description: Names of the loaded (loadable) modules, from C(/proc/modules), sorted.
    type: list
    elements: str
    returned: always
    sample: [mlx5_core, nvidia, nvidia_modeset, nvidia_uvm, nvme]
  boot_id:
    description: The running boot's id (C(/proc/sys/kernel/random/boot_id)), null when unreadable.
    type: str
    returned: always
    sample: 5f0c7a1e-3b2d-4c8e-9a61-0d2b7e4f9c13
  by_name:
    description:
      - Each name of O(modules) -> C(loaded) (bool, C(/sys/module/NAME) exists), C(builtin) (bool, built
        into the kernel), C(parameters) (dict, parameter name -> current value from
        C(/sys/module/NAME/parameters), null when unreadable) and C(options) (the modprobe.d file of this
        collection for the module, with C(params), parameter name -> value, C(boot_id), the boot it was written
        in, and C(overridden), parameter name -> C(value) and C(source) of what a boot sets after it, another
        modprobe.d file or the kernel command line; null without such a file).
    type: dict
    returned: always
    sample: {nvidia_peermem: {loaded: false, builtin: false, parameters: {}, options: null},
             nvidia_uvm: {loaded: true, builtin: false, parameters: {uvm_disable_hmm: "N"},
                          options: {params: {uvm_disable_hmm: "1"}, boot_id: 5f0c7a1e-3b2d-4c8e}}}
"""


def param_string(value: Any) -> str:
    """Render a parameter value as modprobe takes it (booleans as 1/0)."""
    return kmod_param_value(value)


def validate_request(req: dict) -> list[str]:
    """Return a list of error messages for one request ``{name, params, state, required}``.

    Names and parameters follow validate.py: nothing modprobe could read as an option, nothing
    that splits its argument list or a modprobe.d line.
    """
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


def same_param_value(requested: Any, current: str | None) -> bool:
    """Whether a requested and a sysfs parameter value agree (core/module_params.py: bools show as Y/N)."""
    return module_params.compare(requested, current) == module_params.SAME


def param_drift(node: Node, name: str, params: dict) -> tuple[dict, list]:
    """``(drift, unsupported)``: the parameters whose loaded value differs, ``{param: {requested, current}}``, and
    those the module does not show in /sys/module (they cannot be compared, and are never a reason to reboot)."""
    wanted = {k: param_string(v) for k, v in (params or {}).items()}
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
    """The modprobe argument list for a load or unload (never a shell string).

    Names are validated never to start with '-'; the ``--`` also stops GNU getopt (kmod's
    modprobe permutes its arguments) from reading anything after it as an option.
    """
    if action == "unload":
        return [modprobe, "-r", "--", req["name"]]
    return [modprobe, "--", req["name"]] + param_words(req)


def modprobe_options(req: dict) -> str | None:
    """The /etc/modprobe.d line that sets a request's parameters at boot, or None without parameters."""
    words = param_words(req) if req["state"] == "present" else []
    return "options %s %s" % (req["name"], " ".join(words)) if words else None


def load(node: Node, req: dict, res: dict, run: Runner, modprobe: str,
         dmesg: list[str] | None = None) -> dict:
    """Load a module. ``run(args) -> (rc, out, err)``; ``dmesg`` is a dmesg argument list or None.

    Updates and returns ``res``; the kernel log is read only when the load failed.
    """
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
    """Plan and apply every request; return the list of per-module results.

    ``find_modprobe()`` returns the modprobe path; it is called only when something must run.
    A module this call loads is recorded in the journal (saved before the first modprobe) so
    that a restore can unload it; a load that fails is dropped from the journal again.
    """
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


def plan_restore(node: Node, req: dict) -> tuple[dict, str | None]:
    """Plan the unload of a journaled module; a name that fails validation is never passed on.

    Such an entry was not written by this collection: it is reported (``invalid_name``) and
    stays in the journal, and the other modules are still unloaded.
    """
    try:
        kmod_name(req["name"])
    except ValidationError as exc:
        res = new_result(dict(req, name=str(req["name"])))
        res.update(reason_class="invalid_name", message="journal entry not restored: %s" % exc)
        return res, None
    return plan(node, req)


def restore(node: Node, journal: Journal, run: Runner, find_modprobe: Callable[[], str],
            check_mode: bool = False) -> list[dict]:
    """Unload the modules the journal records as loaded by this collection.

    Returns the per-module results (state ``absent``); restored entries leave the journal.
    """
    entries = journal.entries(NAME)
    planned = []
    for name in sorted(entries):
        req = {"name": name, "state": "absent", "params": {}, "required": True}
        planned.append((req,) + plan_restore(node, req))
    if not check_mode and any(action for _req, _res, action in planned):
        modprobe = find_modprobe()
    results = []
    for req, res, action in planned:
        if check_mode:
            results.append(res)
            continue
        if action == "unload":
            unload(node, req, res, run, modprobe)
            if res["changed"]:
                journal.drop(NAME, req["name"])
        elif res["reason_class"] is None:
            journal.drop(NAME, req["name"])  # already gone: nothing to undo
        results.append(res)
    journal.save(check_mode=check_mode)
    return results


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
    """The kmod_optional module: validate every request, then load or unload (or restore); returns the result.

    An optional module that does not reach its state is a warning; FamilyError names the required
    ones (and, with restore, the modules that stay in the journal), with the full result.
    """
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
            results = restore(node, journal, call.run_command, find_modprobe, check_mode=call.check_mode)
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

# --- facts: what tuning_info reads of this family (facts["kmod"]) ---


def facts_names(names: list[str] | None) -> list[str]:
    """tuning_info's ``modules``, unchanged after checking each is a module name; FactsError otherwise."""
    out = []
    for name in names or []:
        if not isinstance(name, str) or not KMOD_NAME_RE.fullmatch(name):
            raise FactsError("modules: %r is not a module name; allowed: %s" % (name, KMOD_NAME_ALLOWED))
        out.append(name)
    return out


def read(node: Node, selector: Any = None, query: contract.FactsQuery | None = None) -> dict:
    """The family's facts (``facts["kmod"]``): loaded module names (/proc/modules), the boot id and, for each name of
    the ``modules`` option, its state, parameters and the options file of ours (what it sets, which boot wrote it)."""
    names = ((query.options if query else None) or {}).get("modules") or []
    loaded = []
    for line in (read_all(node.path("proc/modules")) or "").splitlines():
        if line.strip():
            loaded.append(line.split(None, 1)[0])
    loaded_set = set(loaded)
    by_name = {}
    for name in names:
        key = sysfs_name(name)
        base = node.path("sys/module", key)
        present = os.path.isdir(base)
        builtin = present and key not in loaded_set and not os.path.exists(os.path.join(base, "initstate"))
        params = {}
        for p in node.listdir("sys/module", key, "parameters"):
            params[p] = read_small(os.path.join(base, "parameters", p))
        text = read_all(node.path(options_file(name))) if os.path.isfile(node.path(options_file(name))) else None
        options = module_params.parse_options(text) if text is not None else None
        if options is not None:
            options["overridden"] = module_params.overriding(node, name, options_file(name))
        by_name[name] = {"loaded": present, "builtin": builtin, "parameters": params, "options": options}
    return {"loaded": sorted(loaded), "boot_id": node.read(module_params.BOOT_ID, default="") or None,
            "by_name": by_name}


def facts_options(desired: dict) -> dict:
    """The desired modules are the names read() reads."""
    return {"modules": [m["name"] for m in (desired.get(NAME) or {}).get("modules") or []]}


# --- verification and boot: the rows of this family's settings, and its re-apply at boot ---


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """One setting per module of ``desired['kmod']['modules']`` (loaded or, for absent, not), and one per parameter
    of a loaded one (``kmod.<module>.<param>``: core/module_params.py's ``judge``)."""
    desired = desired.get(NAME) or {}
    mods = facts.get(NAME) or {}
    by_name = mods.get("by_name") or {}
    loaded_names = set(mods.get("loaded") or [])
    out = []
    for req in desired.get("modules") or []:
        name = req["name"]
        key = name.replace("-", "_")
        info = by_name.get(name) or by_name.get(key) or {}
        loaded = bool(info.get("loaded"))
        present = req.get("state", "present") != "absent"
        want = "loaded" if present else "not loaded"
        running = "loaded" if loaded else "not loaded"
        persisted = ("loaded at boot" if key in ctx.modules_persisted else None) if present else None
        if not present:
            out.append(setting(NAME, name, want, running, "drifted" if loaded else "applied", "", persisted))
        elif loaded:
            out.append(setting(NAME, name, want, running, "applied", "", persisted))
            out += param_rows(name, req.get("params") or {}, info, mods.get("boot_id"))
        elif req.get("required"):
            out.append(setting(NAME, name, want, running, "drifted", "required module is not loaded", persisted))
        elif MODULE_NEEDS.get(key) and MODULE_NEEDS[key][0] not in loaded_names:
            need = MODULE_NEEDS[key]
            out.append(setting(NAME, name, want, running, "not_applicable",
                               "needs %s, which this node does not have (%s not loaded); loading fails with "
                               "'Invalid argument', which is harmless here" % (need[1], need[0]), persisted))
        else:
            out.append(setting(NAME, name, want, running, "not_applicable",
                               "optional module that did not load on this node (kmod_optional reports why)",
                               persisted))
    return out


def param_rows(name: str, params: dict, info: dict, boot_id: str | None) -> list:
    """The rows of a loaded module's requested parameters: applied, pending_reboot (the options line of this boot
    waits for the next), drifted (no such line, or a boot since did not apply it), unsupported (not in sysfs)."""
    current = info.get("parameters") or {}
    options = info.get("options") or {}
    written = options.get("params") or {}
    out = []
    for param in sorted(params):
        requested = param_string(params[param])
        shown = current.get(param)
        state, why = module_params.judge(name, param, requested, shown, written.get(param),
                                         options.get("boot_id"), boot_id, (options.get("overridden") or {}).get(param))
        out.append(setting(NAME, "%s.%s" % (name, param), module_params.kernel_form(requested, shown), shown,
                           state, why, written.get(param)))
    return out


def runtime_row(row: dict, facts: dict, rows: list) -> bool:
    """Runtime tuning brings a module, never a parameter of a loaded one (only the next boot does)."""
    return "." not in row["name"]


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
            pc.files.write(options_file(name), module_params.options_text(
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
        later = module_params.overriding(pc.node, res["name"], options_file(res["name"])) if res["param_drift"] else {}
        for param, drift in sorted(res["param_drift"].items()):
            at_boot = later.get(param)
            if at_boot and module_params.compare(drift["requested"], module_params.kernel_form(
                    at_boot["value"], drift["current"])) != module_params.SAME:
                pc.unfit["%s.%s.%s" % (NAME, res["name"], param)] = module_params.override_reason(param, at_boot)
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
        for param, value in sorted(module_params.parse_options(pc.files.read(path))["params"].items()):
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


PERSIST = persistence.Concern(NAME, (NAME,), persist_modules, remove_modules,
                              description="modules-load.d and modprobe.d files for the optional modules that load")


def summary(result: dict) -> str:
    return "; ".join("%s: %s" % (m.get("name"), m.get("message")) for m in result.get("modules") or [])


DEFINITION = Family(
    name=NAME,
    titles={NAME: "modules"},
    module="kmod_optional",
    read=read,
    read_options={"modules": facts_names},
    facts_options=facts_options,
    facts_doc=FACTS_DOC,
    run=run,
    evaluate=evaluate,
    runtime=runtime_row,
    from_role=from_role,
    runtime_options=runtime_options,
    restore_options=restore_options,
    argument_spec=ARGUMENT_SPEC,
    persist=PERSIST,
    persist_reboots=True,
    summary=summary,
    items="modules",
    validate={NAME: desired_problems},
)
