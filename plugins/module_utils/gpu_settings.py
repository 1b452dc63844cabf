# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU settings through nvidia-smi: persistence mode and power limit per GPU (family ``gpu_settings``).

Off unless asked: ``persistence`` (true/false) and ``power_limit`` (watts for every GPU) or
``power_limits`` ({PCI address: watts}). Persistence prefers NVIDIA's daemon: on a live node that
has the ``nvidia-persistenced`` unit, it is enabled and started; ``nvidia-smi -pm`` is used only
where the daemon is missing. Every original (per-GPU mode and limit, the daemon's enabled/active
state) is journaled before the first write; ``restore`` writes them back. Neither the power limit
nor ``-pm`` survives a reboot, so ``boot`` re-applies them. ECC mode is never changed (it needs a
reboot and has fleet-wide consequences): gpu_health only reports it. Clocks are not offered yet.

Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils import family, gpu_health
from ansible_collections.gpunode.tuning.plugins.module_utils.journal import open_node
from ansible_collections.gpunode.tuning.plugins.module_utils.node import Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.pcie import normalize_bdf

NAME = "gpu_settings"
FIELDS = ("index", "pci.bus_id", "persistence_mode", "power.limit", "power.min_limit", "power.max_limit")
QUERY = ["--query-gpu=" + ",".join(FIELDS), "--format=csv,noheader,nounits"]
DAEMON = "nvidia-persistenced.service"


def validate(params: dict) -> dict:
    """The wanted state ``{persistence, power: {bdf or "*": watts}}``; FamilyError names what is allowed."""
    persistence = params.get("persistence")
    if persistence is not None and not isinstance(persistence, bool):
        raise family.FamilyError("persistence must be true, false or null, got %r" % (persistence,))
    power = {}
    if params.get("power_limit") is not None:
        power["*"] = _watts("power_limit", params["power_limit"])
    for bdf, watts in (params.get("power_limits") or {}).items():
        try:
            power[normalize_bdf(bdf)] = _watts("power_limits[%s]" % bdf, watts)
        except ValueError as exc:
            raise family.FamilyError("power_limits: %s" % exc) from None
    return {"persistence": persistence, "power": power}


def _watts(name: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():  # a templated value arrives as text
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise family.FamilyError("%s must be a whole number of watts > 0, got %r" % (name, value))
    return value


def read_gpus(run, smi: str) -> list:
    """Every GPU nvidia-smi lists: ``{bdf, index, persistence_mode, limit, min, max}``."""
    rc, out, err = run([smi, *QUERY])
    if rc != 0:
        raise family.FamilyError("nvidia-smi --query-gpu failed (rc %s): %s" % (rc, (err or out).strip()[:300]))
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS) or not parts[0].isdigit():
            continue
        gpus.append({"bdf": gpu_health.normalize_bus_id(parts[1]), "index": parts[0], "persistence_mode": parts[2],
                     "limit": _float(parts[3]), "min": _float(parts[4]), "max": _float(parts[5])})
    return gpus


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def plan(gpus: list, want: dict) -> list:
    """``[(bdf, key, original, wanted)]`` for what differs; FamilyError before any write for a bad limit."""
    listed = {g["bdf"] for g in gpus}
    unknown = sorted(b for b in want["power"] if b != "*" and b not in listed)
    if unknown:
        raise family.FamilyError("power_limits: nvidia-smi lists no GPU at %s; it lists: %s"
                                 % (", ".join(unknown), ", ".join(sorted(listed)) or "none"))
    steps = []
    for g in gpus:
        if want["persistence"] is not None:
            mode = "Enabled" if want["persistence"] else "Disabled"
            if g["persistence_mode"] != mode:
                steps.append((g["bdf"], "persistence", g["persistence_mode"], mode))
        watts = want["power"].get(g["bdf"], want["power"].get("*"))
        if watts is None:
            continue
        if g["min"] is not None and g["max"] is not None and not g["min"] <= watts <= g["max"]:
            raise family.FamilyError("power limit %d W for %s is outside its range %.0f-%.0f W; nothing was changed"
                                     % (watts, g["bdf"], g["min"], g["max"]))
        if g["limit"] is None or abs(g["limit"] - watts) >= 0.5:
            steps.append((g["bdf"], "power_limit", g["limit"], watts))
    return steps


def _argv(smi: str, gpu: dict, key: str, value: Any) -> list:
    if key == "persistence":
        return [smi, "-i", gpu["index"], "-pm", "1" if value == "Enabled" else "0"]
    return [smi, "-i", gpu["index"], "-pl", "%g" % float(value)]


def find_smi(node: Node, lookup: Any) -> str:
    """nvidia-smi of the node; on a simulated root only the node's own stand-in (never the controller's)."""
    return node.bin_path(lookup, "nvidia-smi", "nvidia-utils", host=node.is_live)


def daemon_state(node: Node, call: family.Call) -> dict | None:
    """``{systemctl, enabled, active}`` of the nvidia-persistenced unit on a live node that has it, else None."""
    if not node.is_live:
        return None
    try:
        systemctl = node.bin_path(call.lookup, "systemctl", "systemd")
    except NodeError:
        return None
    rc, out, _err = call.run_command([systemctl, "list-unit-files", DAEMON, "--no-legend"])
    if rc != 0 or DAEMON not in out:
        return None
    return {"systemctl": systemctl,
            "enabled": call.run_command([systemctl, "is-enabled", "--quiet", DAEMON])[0] == 0,
            "active": call.run_command([systemctl, "is-active", "--quiet", DAEMON])[0] == 0}


def daemon_plan(want: dict, steps: list, daemon: dict | None) -> tuple:
    """``(steps, daemon step)``: with the daemon, persistence is its job (no ``-pm``); start/enable it if needed."""
    if not want["persistence"] or daemon is None:
        return steps, None
    steps = [s for s in steps if s[1] != "persistence"]
    if daemon["enabled"] and daemon["active"]:
        return steps, None
    return steps, ("daemon", {"enabled": daemon["enabled"], "active": daemon["active"]}, "enabled and started")


def restore_plan(journal, gpus: list) -> tuple:
    """``(steps, already, gone)`` from the journal: what to write back, keys already at the original, GPUs gone."""
    by_bdf = {g["bdf"]: g for g in gpus}
    steps, already, gone = [], [], []
    for key, original in sorted(journal.entries(NAME).items()):
        kind, _sep, bdf = key.partition(":")
        if kind == "daemon":
            continue
        gpu = by_bdf.get(bdf)
        if gpu is None:
            gone.append(key)
            continue
        current = gpu["persistence_mode"] if kind == "persistence" else gpu["limit"]
        differs = current != original if kind == "persistence" else (
            original is not None and (current is None or abs(current - original) >= 0.5))
        (steps if differs else already).append((bdf, kind, current, original) if differs else key)
    return steps, already, gone


def _daemon_argv(daemon: dict, original: dict, restore: bool) -> list:
    """systemctl calls: enable --now, or on restore back to the journaled enabled/active state."""
    s = daemon["systemctl"]
    if not restore:
        return [[s, "enable", "--now", DAEMON]]
    out = [] if original.get("active") else [[s, "stop", DAEMON]]
    return out + ([] if original.get("enabled") else [[s, "disable", DAEMON]])


def execute(call: family.Call, smi: str, gpus: list, steps: list) -> list:
    """Run each step's nvidia-smi call: ``[(step, error)]`` of those that failed (the others still run)."""
    by_bdf = {g["bdf"]: g for g in gpus}
    failed = []
    for step in steps:
        bdf, key, _before, after = step
        rc, out, err = call.run_command(_argv(smi, by_bdf[bdf], key, after))
        if rc != 0:
            why = (err or out).strip()[:200]
            failed.append((step, "%s %s -> %s: nvidia-smi rc %s: %s" % (bdf, key, after, rc, why)))
    return failed


def run_daemon(call: family.Call, daemon: dict, original: dict, restore: bool) -> list:
    """The systemctl calls for the daemon; their errors."""
    errors = []
    for argv in _daemon_argv(daemon, original, restore):
        rc, out, err = call.run_command(argv)
        if rc != 0:
            errors.append("%s: rc %s: %s" % (" ".join(argv[1:]), rc, (err or out).strip()[:200]))
    return errors


def _result(steps: list, daemon_step: tuple | None, gpus: list) -> dict:
    changes = [{"gpu": bdf, "setting": key, "before": before, "after": after} for bdf, key, before, after in steps]
    if daemon_step is not None:
        changes.append({"gpu": None, "setting": "nvidia-persistenced", "before": daemon_step[1],
                        "after": daemon_step[2]})
    return {"changed": bool(changes), "changes": changes,
            "gpus": [{"bdf": g["bdf"], "persistence_mode": g["persistence_mode"], "power_limit": g["limit"]}
                     for g in gpus]}


def run(call: family.Call) -> dict:
    """The gpu_settings module: validate, read the GPUs, plan, journal, apply (or restore), read back."""
    params = call.params
    restore = bool(params.get("restore"))
    want = None if restore else validate(params)
    node, journal = open_node(params)
    if restore and not journal.entries(NAME):
        # Nothing of ours to put back: a rollback must pass on a node without nvidia-smi.
        return _result([], None, [])
    try:
        smi = find_smi(node, call.lookup)
        gpus = read_gpus(call.run_command, smi)
        daemon = daemon_state(node, call)
    except NodeError as exc:
        raise family.FamilyError(str(exc)) from None
    if restore:
        return _restore(call, journal, smi, gpus, daemon)
    steps, daemon_step = daemon_plan(want, plan(gpus, want), daemon)
    result = _result(steps, daemon_step, gpus)
    if call.diff:
        names = [" ".join(filter(None, (c["gpu"], c["setting"]))) for c in result["changes"]]
        result["diff"] = {"before": {n: c["before"] for n, c in zip(names, result["changes"])},
                          "after": {n: c["after"] for n, c in zip(names, result["changes"])}}
    if call.check_mode or not result["changed"]:
        return result
    if journal is not None:  # originals first: a failure half-way can still be rolled back
        for bdf, key, before, _after in steps:
            journal.record(NAME, "%s:%s" % (key, bdf), before)
        if daemon_step:
            journal.record(NAME, "daemon", daemon_step[1])
        journal.save()
    errors = [e for _step, e in execute(call, smi, gpus, steps)]
    if daemon_step:
        errors += run_daemon(call, daemon, daemon_step[1], False)
    if journal is not None:
        journal.mark_applied(NAME)
        journal.save()
    result["gpus"] = _result([], None, read_gpus(call.run_command, smi))["gpus"]
    if errors:
        raise family.FamilyError("GPU settings not applied: " + "; ".join(errors), result)
    return result


def _restore(call: family.Call, journal, smi: str, gpus: list, daemon: dict | None) -> dict:
    """Write the journaled originals back; what could not be restored stays in the journal."""
    steps, already, gone = restore_plan(journal, gpus)
    original = journal.entries(NAME).get("daemon")
    daemon_calls = bool(original and daemon and _daemon_argv(daemon, original, True))
    result = _result(steps, ("daemon", "enabled and started", original) if daemon_calls else None, gpus)
    for key in gone:
        call.warn("gpu_settings: %s: nvidia-smi no longer lists that GPU; it stays in the journal" % key)
    if call.check_mode:
        return result
    failed = execute(call, smi, gpus, steps)
    errors = [e for _s, e in failed]
    keep = {"%s:%s" % (s[1], s[0]) for s, _e in failed}
    for bdf, key, _before, _after in steps:
        if "%s:%s" % (key, bdf) not in keep:
            journal.drop(NAME, "%s:%s" % (key, bdf))
    for key in already:
        journal.drop(NAME, key)
    if original is not None:
        daemon_errors = run_daemon(call, daemon, original, True) if daemon_calls else []
        errors += daemon_errors
        if not daemon_errors:
            journal.drop(NAME, "daemon")
    journal.save()
    result["gpus"] = _result([], None, read_gpus(call.run_command, smi))["gpus"]
    if errors:
        raise family.FamilyError("GPU settings not restored (they stay in the journal): " + "; ".join(errors), result)
    return result


# --- verification and boot ---


def evaluate(facts: dict, desired: dict, ctx: Any = None) -> list:
    """Rows ``gpu_settings.persistence`` and ``gpu_settings.power_limit`` from gpu_health's nvidia-smi query."""
    want_params = (desired or {}).get(NAME) or {}
    if not want_params:
        return []
    try:
        want = validate(want_params)
    except family.FamilyError as exc:
        raise family.EvaluationError(str(exc)) from None
    probe = getattr(ctx, "gpu", None) or facts.get("gpu_probe") or {}
    health = probe.get("health") or {}
    if probe.get("probe") != "present" or health.get("rc", 0) != 0:
        why = "nvidia-smi did not answer (%s)" % (probe.get("probe") or "not probed")
        return [family.setting(NAME, k, v, None, "not_applicable", why)
                for k, v in (("persistence", want["persistence"]), ("power_limit", want["power"] or None))
                if v is not None]
    gpus = gpu_health.parse_health(health.get("stdout"))
    rows = []
    if want["persistence"] is not None:
        mode = "Enabled" if want["persistence"] else "Disabled"
        off = ["%s %s" % (g["bdf"], g["persistence_mode"]) for g in gpus if g["persistence_mode"] != mode]
        rows.append(family.setting(NAME, "persistence", mode, "; ".join(off) or mode, "drifted" if off else "applied",
                                   "persistence mode differs on %s" % ", ".join(off) if off else ""))
    if want["power"]:
        off = []
        for g in gpus:
            watts = want["power"].get(g["bdf"], want["power"].get("*"))
            limit = _float(g["power.limit"])
            if watts is not None and (limit is None or abs(limit - watts) >= 0.5):
                off.append("%s %s W of %d W" % (g["bdf"], g["power.limit"], watts))
        rows.append(family.setting(NAME, "power_limit", want["power"], "; ".join(off) or "as wanted",
                                   "drifted" if off else "applied", "; ".join(off)))
    return rows


def boot(node: Node, want: dict) -> tuple:
    """Re-apply at boot (neither -pm nor -pl survives a reboot), without a journal."""
    params = dict(want or {}, root=node.root, journal=None, restore=False)
    call = family.Call(params=params, run_command=family.run_argv, lookup=family.SystemLookup())
    try:
        result = run(call)
    except family.FamilyError as exc:
        return False, str(exc)
    done = ["%s %s %s" % (c["gpu"] or "", c["setting"], c["after"]) for c in result["changes"]]
    return True, ("set: " + "; ".join(done)) if done else "GPU settings already in place"


DEFINITION = family.Family(name=NAME, titles={NAME: "GPU settings"}, module="gpu_settings", run=run,
                           evaluate=evaluate, boot=boot)
