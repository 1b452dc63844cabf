# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Optional kernel modules: validate, plan, load or unload with modprobe, classify failures.

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

import errno
import os
import re
from typing import Any, Callable, Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, persistence
from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.facts import FactsError, read_all
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family, normalize_value, setting
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import (
    JOURNAL_ARGUMENT_SPEC,
    Journal,
    open_node,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.kernel_log import parse_kmsg
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

PEERMEM_NAMES = ("nvidia_peermem", "nv_peer_mem")
PEERMEM_MESSAGE = (
    "%s did not load (Invalid argument): it needs the MOFED/ib_core peer-memory support used by "
    "GPUDirect RDMA. This is expected and harmless on a node without RDMA; GPU-to-GPU P2P does not use it."
)
_TRUE = ("1", "y", "yes", "true", "on")
_FALSE = ("0", "n", "no", "false", "off")
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
  by_name:
    description:
      - Each name of O(modules) -> C(loaded) (bool, C(/sys/module/NAME) exists), C(builtin) (bool, built
        into the kernel) and C(parameters) (dict, parameter name -> current value from
        C(/sys/module/NAME/parameters), null when unreadable).
    type: dict
    returned: always
    sample: {nvidia_peermem: {loaded: false, builtin: false, parameters: {}},
             nvidia: {loaded: true, builtin: false, parameters: {NVreg_EnableGpuFirmware: "1"}}}
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


def current_params(node: Node, name: str, wanted: dict) -> dict:
    """Current values of the parameters in ``wanted`` (None where sysfs does not show one)."""
    out = {}
    for pname in wanted:
        out[pname] = node.read("sys/module", sysfs_name(name), "parameters", pname, default="") or None
    return out


def same_param_value(requested: Any, current: str | None) -> bool:
    """Compare a requested and a sysfs parameter value; booleans show as Y/N in sysfs."""
    if current is None:
        return False
    a, b = requested.strip().lower(), current.strip().lower()
    if a == b:
        return True
    return (a in _TRUE and b in _TRUE) or (a in _FALSE and b in _FALSE)


def param_drift(node: Node, name: str, params: dict) -> dict:
    """Parameters whose loaded value differs from the requested one: ``{param: {requested, current}}``.

    ``current`` is None when /sys/module does not expose the parameter (it cannot be compared).
    """
    wanted = {k: param_string(v) for k, v in (params or {}).items()}
    current = current_params(node, name, wanted)
    return {k: {"requested": v, "current": current[k]} for k, v in sorted(wanted.items())
            if not same_param_value(v, current[k])}


# --- kernel log ---------------------------------------------------------------------------------


class KmsgCursor:
    """Kernel log records written after the cursor was opened.

    Opens ``<root>/dev/kmsg`` non-blocking and seeks to its end before the attempt, then reads
    only what came after. On a live node that is the kernel's record interface (one record per
    read, EAGAIN at the end); on a simulated node it is a plain file in the same format. When
    the log cannot be opened, ``available`` is False and the caller may fall back to dmesg.
    """

    def __init__(self, node):
        self.fd = None
        try:
            self.fd = os.open(node.path("dev/kmsg"), os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            self.close()

    @property
    def available(self) -> bool:
        return self.fd is not None

    def read_new(self, limit: int = 512) -> list[str]:
        """Messages appended since the cursor was opened (at most ``limit`` records)."""
        if self.fd is None:
            return []
        chunks = []
        while len(chunks) < limit:
            try:
                data = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten while we read: go on
                    continue
                break
            if not data:
                break
            chunks.append(data)
        records, _stats = parse_kmsg(b"".join(chunks))
        return [message for _level, _usec, _seq, message in records]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def relevant_log_lines(lines: list[str], name: str, limit: int = 20) -> list[str]:
    """Kernel log lines that concern a module load (its name, symbols, lockdown, signatures)."""
    keys = (name.lower(), sysfs_name(name).lower(), name.replace("_", "-").lower(),
            "unknown symbol", "disagrees about version", "lockdown", "signature", "key was rejected")
    hits = [line for line in lines if any(k in line.lower() for k in keys)]
    return hits[-limit:]


# --- classification ------------------------------------------------------------------------------


def classify_failure(name: str, output: str, log_lines: Iterable[str] = ()) -> tuple[str, str]:
    """Classify a failed modprobe from its output and the kernel log lines of the attempt.

    Returns ``(reason_class, message)``. The order matters: a symbol version mismatch makes
    modprobe say "Invalid argument" too, and an unknown symbol is reported by modprobe as
    "Unknown symbol in module, or unknown parameter".
    """
    out = (output or "").strip()
    log = "\n".join(log_lines or ())
    both = out + "\n" + log
    low = both.lower()
    short = sysfs_name(name)
    first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")

    m = re.search(r"disagrees about version of symbol (\S+)", both)
    if m:
        msg = "%s was built against other symbol versions (%s): rebuild it for the running kernel" % (name, m.group(1))
        if short in PEERMEM_NAMES:
            msg += " and the installed MOFED (ib_core)"
        return "symbol_mismatch", msg
    m = re.search(r"Unknown symbol (\S+)", both)
    if m and m.group(1) != "in":
        return "dependency_missing", "%s needs symbol %s that no loaded module provides (a dependency is missing)" % (
            name, m.group(1))
    if "unknown symbol in module" in low:
        return "dependency_missing", "%s: %s (a dependency or a parameter is unknown; see the kernel log)" % (
            name, first)
    for m in re.finditer(r"Module (\S+) not found", both):
        if sysfs_name(m.group(1)) != short:
            return "dependency_missing", "%s needs module %s, which is not installed" % (name, m.group(1))
    if "could not find module by name" in low and "'%s'" % name not in both:
        return "dependency_missing", "%s: %s" % (name, first)
    denied = ("operation not permitted", "key was rejected by service", "required key not available",
              "lockdown", "signature", "permission denied", "error running install command")
    if any(d in low for d in denied):
        return "denied", "%s may not be loaded here (%s)" % (
            name, first or next((ln for ln in log_lines if any(d in ln.lower() for d in denied)), ""))
    if "not found" in low or "no such file or directory" in low:
        return "not_found", "%s is not installed for the running kernel (%s)" % (name, first)
    if "invalid argument" in low:
        if short in PEERMEM_NAMES:
            return "invalid_argument", PEERMEM_MESSAGE % name
        return "invalid_argument", "%s refused to initialise (Invalid argument): %s" % (
            name, "; ".join(log_lines[-3:]) if log_lines else first)
    return "unknown", "%s did not load: %s" % (name, first or "modprobe gave no message")


def classify_unload_failure(name: str, output: str) -> tuple[str, str]:
    """Classify a failed ``modprobe -r``. Returns ``(reason_class, message)``."""
    out = (output or "").strip()
    low = out.lower()
    first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")
    if "is builtin" in low:
        return "builtin", "%s is built into the kernel and cannot be unloaded" % name
    if "in use" in low or "resource temporarily unavailable" in low:
        return "in_use", "%s is in use and was not unloaded (%s)" % (name, first)
    if "operation not permitted" in low:
        return "denied", "%s may not be unloaded here (%s)" % (name, first)
    return "unknown", "%s was not unloaded: %s" % (name, first or "modprobe gave no message")


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
            res["param_drift"] = param_drift(node, req["name"], req.get("params"))
            res["message"] = "already loaded"
            if res["param_drift"]:
                res["message"] = ("already loaded with other parameters (%s); not reloaded: unload it or "
                                  "reboot to apply them" % ", ".join(sorted(res["param_drift"])))
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
            res["param_drift"] = param_drift(node, req["name"], req.get("params")) if not builtin else {}
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
    """The family's facts (``facts["kmod"]``): loaded module names (/proc/modules) and, for each name of the
    ``modules`` option, its state and parameters."""
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
        by_name[name] = {"loaded": present, "builtin": builtin, "parameters": params}
    return {"loaded": sorted(loaded), "by_name": by_name}


def facts_options(desired: dict) -> dict:
    """The desired modules are the names read() reads."""
    return {"modules": [m["name"] for m in (desired.get(NAME) or {}).get("modules") or []]}


# --- verification and boot: the rows of this family's settings, and its re-apply at boot ---


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """One setting per module of ``desired['kmod']['modules']``: loaded (with its parameters) or, for absent, not."""
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
        params = {k: normalize_value(v) for k, v in (req.get("params") or {}).items()}
        want = ("loaded" + (" %s" % " ".join("%s=%s" % kv for kv in sorted(params.items())) if params else "")) \
            if present else "not loaded"
        running = "loaded" if loaded else "not loaded"
        persisted = ("loaded at boot" if key in ctx.modules_persisted else None) if present else None
        if not present:
            out.append(setting(NAME, name, want, running, "drifted" if loaded else "applied", "", persisted))
            continue
        if loaded:
            current = info.get("parameters") or {}
            drift = sorted(k for k, v in params.items() if normalize_value(current.get(k)) != v)
            if drift:
                out.append(setting(NAME, name, want, running + " " + " ".join(
                    "%s=%s" % (k, current.get(k)) for k in drift), "drifted",
                    "loaded with other parameters (%s): a reload applies them" % ", ".join(drift), persisted))
            else:
                out.append(setting(NAME, name, want, running, "applied", "", persisted))
            continue
        need = MODULE_NEEDS.get(key)
        if req.get("required"):
            out.append(setting(NAME, name, want, running, "drifted", "required module is not loaded", persisted))
        elif need and need[0] not in loaded_names:
            out.append(setting(NAME, name, want, running, "not_applicable",
                               "needs %s, which this node does not have (%s not loaded); loading fails with "
                               "'Invalid argument', which is harmless here" % (need[1], need[0]), persisted))
        else:
            out.append(setting(NAME, name, want, running, "not_applicable",
                               "optional module that did not load on this node (kmod_optional reports why)",
                               persisted))
    return out


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


def persist_modules(pc) -> dict:
    """modules-load.d (and modprobe.d for options) for each module that loads; no file for one that does not.

    kmod_optional loads them first (journaling, as at runtime) and says per module whether it can be
    persisted; a module that left the list or stopped loading loses its files.
    """
    want = pc.desired.get(NAME)
    if not want or not want.get("modules"):
        return {"changed": False, "skipped": True, "reason": "no kernel module to persist"}
    results = pc.run_family(NAME, {"modules": want["modules"]})["modules"]
    keep = set()
    for res in results:
        if not res.get("persist_ok"):
            continue
        name = kmod_name(res["name"])
        keep.add("%s/%s%s.conf" % (LOAD_DIR, persistence.FILE_PREFIX, name))
        pc.files.write("%s/%s%s.conf" % (LOAD_DIR, persistence.FILE_PREFIX, name), persistence.HEADER + name + "\n")
        if res.get("modprobe_options"):
            keep.add("%s/%s%s.conf" % (OPTIONS_DIR, persistence.FILE_PREFIX, name))
            pc.files.write("%s/%s%s.conf" % (OPTIONS_DIR, persistence.FILE_PREFIX, name),
                           persistence.HEADER + res["modprobe_options"] + "\n")
    for path in pc.files.ours(LOAD_DIR) + pc.files.ours(OPTIONS_DIR):
        if path not in keep:
            pc.files.remove(path)
    lines = [_persist_message(r, pc.call) for r in results]
    return {"modules": [dict(name=r["name"], persisted=bool(r.get("persist_ok")), message=line)
                        for r, line in zip(results, lines)], "summary": "; ".join(lines)}


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
    for path in pc.files.ours(LOAD_DIR) + pc.files.ours(OPTIONS_DIR):
        pc.files.remove(path)
    return {}


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
    from_role=from_role,
    runtime_options=runtime_options,
    restore_options=restore_options,
    argument_spec=ARGUMENT_SPEC,
    persist=PERSIST,
    summary=summary,
    items="modules",
    validate={NAME: desired_problems},
)
