# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU settings through nvidia-smi: persistence, power limit and clocks per GPU (family ``gpu_settings``).

Off unless asked: ``persistence`` (true/false) and ``power_limit`` (watts for every GPU) or
``power_limits`` ({PCI address: watts}). Persistence prefers NVIDIA's daemon: on a live node that
has the ``nvidia-persistenced`` unit, it is enabled and started; ``nvidia-smi -pm`` is used only
where the daemon is missing. Every original (per-GPU mode and limit, the daemon's enabled/active
state) is journaled before the first write; ``restore`` writes them back. Neither the power limit
nor ``-pm`` survives a reboot, so ``boot`` re-applies them. ECC mode is never changed (it needs a
reboot and has fleet-wide consequences): gpu_health only reports it.

Clocks, for every GPU: ``locked_clocks`` ({min, max} MHz of the graphics clock, ``-lgc``) and
``application_clocks`` ({memory, graphics} MHz, ``-ac``), each checked against the GPU's
``clocks.max.*`` before any write. nvidia-smi has no query field for a clock lock, so the journal
is the record of a lock: the original is "unlocked" (restore: ``-rgc``), and a GPU counts as
already locked when the journal holds its lock and its graphics clock is inside the range. Neither
survives a reboot or driver reload, so ``boot`` re-applies them (the lock always).

On a node whose GPUs are AMD's, core/amd_settings.py applies power cap, performance level and determinism
through amd-smi. The verification half (the rows of the settings) is families/gpu_settings_verify.py.
Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    amd_settings,
    calls,
    command,
    family,
    nvidia_smi,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import JOURNAL_ARGUMENT_SPEC, open_node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import NODE_ARGUMENT_SPEC, Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import (
    AMD_VENDOR,
    NVIDIA_VENDOR,
    DeviceSelector,
    normalize_bdf,
    select_devices,
)

NAME = "gpu_settings"
FIELDS = ("index", "pci.bus_id", "persistence_mode", "power.limit", "power.min_limit", "power.max_limit",
          "clocks.current.graphics", "clocks.applications.graphics", "clocks.applications.memory",
          "clocks.max.graphics", "clocks.max.memory")
DAEMON = "nvidia-persistenced.service"


KEYS = ("persistence", "power_limit", "power_limits", "locked_clocks", "application_clocks", "perf_level",
        "perf_determinism_mhz")
# Verified only, never changed (changing them stops every process on the GPU; a memory partition needs a driver
# reload): the desired state may name them, the module never gets them (amd_settings.AMD_PARTITIONS: the modes).
VERIFY_ONLY = ("compute_partition", "memory_partition")


class _Refused(ValueError):
    """One refused value inside ``desired_problems`` (its message names the value and what is allowed)."""


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["gpu_settings"]`` (and the module's options): shape, types, ranges.

    ``{persistence, power_limit, power_limits: {PCI address: W}, locked_clocks: {min, max},
    application_clocks: {memory, graphics}}``. What needs the GPU (a limit inside its min-max, a clock
    below its maximum, a listed address) is checked against nvidia-smi's answer (``plan``, ``clock_plan``).
    """
    shape = family.entry_problem(NAME, want, ", ".join(KEYS + VERIFY_ONLY))
    if shape or want is None:
        return shape
    out = []
    for key, check in (("persistence", _persistence), ("power_limit", _power_limit), ("power_limits", _power_limits),
                       ("locked_clocks", _locked), ("application_clocks", _app), ("perf_level", _perf_level),
                       ("perf_determinism_mhz", _determinism), ("compute_partition", _compute_partition),
                       ("memory_partition", _memory_partition)):
        if want.get(key) is None:
            continue
        try:
            check(want[key])
        except _Refused as exc:
            out.append((key, str(exc)))
    level = want.get("perf_level")
    if level is not None and want.get("perf_determinism_mhz") is not None and not out \
            and _perf_level(level) != "determinism":
        out.append(("perf_level", "perf_level %r and perf_determinism_mhz %r contradict each other: determinism "
                                  "sets the level to determinism; allowed: perf_level determinism or unset with "
                                  "perf_determinism_mhz" % (level, want["perf_determinism_mhz"])))
    return out


def validate(params: dict) -> dict:
    """The wanted state ``{persistence, power: {bdf or "*": watts}, locked, app}``; FamilyError names every
    refused value and what is allowed (``desired_problems``)."""
    problems = desired_problems({k: params.get(k) for k in KEYS})
    if problems:
        raise family.FamilyError(family.problems_text(problems))
    power = {}
    if params.get("power_limit") is not None:
        power["*"] = _power_limit(params["power_limit"])
    power.update(_power_limits(params.get("power_limits") or {}))
    return {"persistence": params.get("persistence"), "power": power,
            "locked": _locked(params.get("locked_clocks")), "app": _app(params.get("application_clocks")),
            "perf_level": _perf_level(params.get("perf_level")),
            "determinism": _determinism(params.get("perf_determinism_mhz"))}


def _perf_level(value: Any) -> str | None:
    """An amd-smi performance level, lower case; None when unset."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if text not in amd_settings.AMD_PERF_LEVELS:
        raise _Refused("perf_level must be one of %s, got %r" % (", ".join(amd_settings.AMD_PERF_LEVELS), value))
    return text


def partition_mode(key: str, value: Any) -> str | None:
    """A compute or memory partition mode as amd-smi prints it (upper case); None when unset."""
    if value is None:
        return None
    text = str(value).strip().upper()
    if text not in amd_settings.AMD_PARTITIONS[key]:
        raise _Refused("%s must be one of %s (AMD SMI's %s modes), got %r"
                       % (key, ", ".join(amd_settings.AMD_PARTITIONS[key]), key.split("_")[0], value))
    return text


def _compute_partition(value: Any) -> str | None:
    return partition_mode("compute_partition", value)


def _memory_partition(value: Any) -> str | None:
    return partition_mode("memory_partition", value)


def _determinism(value: Any) -> int | None:
    """The GFX clock ceiling of amd-smi's performance determinism, whole MHz > 0; None when unset."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _Refused("perf_determinism_mhz must be a whole number of MHz > 0, got %r" % (value,))
    return value


def _persistence(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Refused("persistence must be true, false or null, got %r" % (value,))
    return value


def _power_limit(value: Any) -> int:
    return _watts("power_limit", value)


def _power_limits(value: Any) -> dict:
    """``{bdf: watts}`` of a power_limits map; every refused address or limit named."""
    if not isinstance(value, dict):
        raise _Refused("power_limits must be a map {PCI address: watts}, got %r" % (value,))
    out, errors = {}, []
    for bdf, watts in value.items():
        try:
            out[normalize_bdf(bdf)] = _watts("power_limits[%s]" % bdf, watts)
        except ValueError as exc:
            errors.append(str(exc))
    if errors:
        raise _Refused("; ".join(errors))
    return out


def _locked(value: Any) -> dict | None:
    locked = _clock_pair("locked_clocks", value, ("min", "max"))
    if locked and locked["min"] > locked["max"]:
        raise _Refused("min %d MHz is above max %d MHz; allowed: min <= max" % (locked["min"], locked["max"]))
    return locked


def _app(value: Any) -> dict | None:
    return _clock_pair("application_clocks", value, ("memory", "graphics"))


def _clock_pair(name: str, value: Any, keys: tuple) -> dict | None:
    """``{key: MHz}`` with exactly ``keys``, whole numbers > 0; None when unset."""
    if value is None:
        return None
    allowed = "a map {%s} of whole MHz > 0" % ", ".join("%s: MHz" % k for k in keys)
    if not isinstance(value, dict) or sorted(value, key=str) != sorted(keys):
        raise _Refused("%s must be %s, got %r" % (name, allowed, value))
    out = {}
    for key in keys:
        mhz = value[key]
        if isinstance(mhz, str) and mhz.strip().isdigit():  # a templated value arrives as text
            mhz = int(mhz)
        if isinstance(mhz, bool) or not isinstance(mhz, int) or mhz <= 0:
            raise _Refused("%s.%s must be a whole number of MHz > 0 (%s), got %r" % (name, key, allowed, mhz))
        out[key] = mhz
    return out


def _watts(name: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():  # a templated value arrives as text
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _Refused("%s must be a whole number of watts > 0, got %r" % (name, value))
    return value


def read_gpus(run, smi: str, gpus_on_bus: int = 0) -> list:
    """Every GPU nvidia-smi lists: ``{bdf, index, persistence_mode, limit, min, max, clock, app, max_gr, max_mem}``.

    The query is negotiated (``nvidia_smi.query``): a field the driver refuses reads as unknown (None). Raises
    FamilyError naming what nvidia-smi did when it hangs, fails, or answers something that does not match the
    query, and when it lists no GPU while ``gpus_on_bus`` NVIDIA GPUs are on the PCI bus.
    """
    answer = nvidia_smi.query(run, smi, FIELDS)
    result = command.Result(answer["rc"], answer["stdout"], answer["stderr"], timed_out=answer["timed_out"])
    if answer["rc"] != 0 or answer["timed_out"]:
        raise family.FamilyError("GPU settings not read: %s" % command.failure("nvidia-smi --query-gpu", result))
    rows, unparsed = nvidia_smi.parse_csv(answer["stdout"], answer["fields"])
    if unparsed:
        raise family.FamilyError("GPU settings not read: %s" % nvidia_smi.mismatch(unparsed, answer["fields"]))
    if not rows and gpus_on_bus:
        raise family.FamilyError("GPU settings not read: nvidia-smi lists no GPU while %d NVIDIA GPU(s) are on the "
                                 "PCI bus (output: %r)" % (gpus_on_bus, (answer["stdout"] or "").strip()[:200]))
    gpus = []
    for row in rows:
        lost = nvidia_smi.lost_fields(row)
        if lost:
            raise family.FamilyError("GPU settings not read: nvidia-smi answers %s for %s of %s"
                                     % (row[lost[0]], ", ".join(lost), row["bdf"]))
        gpus.append({"bdf": row["bdf"], "index": row["index"],
                     "persistence_mode": row.get("persistence_mode"), "limit": as_float(row.get("power.limit")),
                     "min": as_float(row.get("power.min_limit")), "max": as_float(row.get("power.max_limit")),
                     "clock": as_float(row.get("clocks.current.graphics")), "app": app_clocks(row),
                     "app_state": app_state(row), "max_gr": as_float(row.get("clocks.max.graphics")),
                     "max_mem": as_float(row.get("clocks.max.memory"))})
    return gpus


def app_state(row: dict) -> str | None:
    """Why a GPU has no application clocks: ``deprecated`` (R590 on), ``not supported`` ([N/A]), None when it has."""
    values = (row.get("clocks.applications.memory"), row.get("clocks.applications.graphics"))
    if nvidia_smi.DEPRECATED in values:
        return "deprecated"
    return None if app_clocks(row) is not None else "not supported"


def app_clocks(row: dict) -> dict | None:
    """``{memory, graphics}`` MHz of a query row; None where the GPU reports none ([N/A])."""
    mem, gr = as_float(row.get("clocks.applications.memory", "")), as_float(row.get("clocks.applications.graphics", ""))
    return None if mem is None or gr is None else {"memory": int(mem), "graphics": int(gr)}


def as_float(text: str | None) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
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


def clock_plan(gpus: list, want: dict, locked_by_us: set) -> list:
    """Clock steps ``[(bdf, key, original, wanted)]``; FamilyError before any write for a clock out of range."""
    steps = []
    locked, app = want.get("locked"), want.get("app")
    for g in gpus:
        if locked:
            _in_range(g, "locked_clocks", (("max", locked["max"], g["max_gr"], "clocks.max.graphics"),))
            inside = g["clock"] is not None and locked["min"] <= g["clock"] <= locked["max"]
            if not (inside and g["bdf"] in locked_by_us):  # no query shows a lock: the journal is its record
                steps.append((g["bdf"], "locked_clocks", "unlocked", dict(locked)))
        if app:
            if g["app"] is None and g.get("app_state") == "deprecated":
                raise family.FamilyError("application_clocks: %s answers [Requested functionality has been "
                                         "deprecated]: application clocks are deprecated from driver R590 on (lock "
                                         "the clocks with locked_clocks instead); nothing was changed" % g["bdf"])
            if g["app"] is None:
                raise family.FamilyError("application_clocks: %s reports no application clocks ([N/A]); it does not "
                                         "support them; nothing was changed" % g["bdf"])
            _in_range(g, "application_clocks", (("memory", app["memory"], g["max_mem"], "clocks.max.memory"),
                                                ("graphics", app["graphics"], g["max_gr"], "clocks.max.graphics")))
            if g["app"] != app:
                steps.append((g["bdf"], "application_clocks", g["app"], dict(app)))
    return steps


def _in_range(gpu: dict, name: str, checks: tuple) -> None:
    for key, mhz, top, field in checks:
        if top is not None and mhz > top:
            raise family.FamilyError("%s.%s %d MHz for %s is above its %s %.0f MHz; allowed: 1-%.0f MHz; nothing "
                                     "was changed" % (name, key, mhz, gpu["bdf"], field, top, top))


def _argv(smi: str, gpu: dict, key: str, value: Any) -> list:
    gpu_id = [smi, "-i", gpu["index"]]
    if key == "persistence":
        return gpu_id + ["-pm", "1" if value == "Enabled" else "0"]
    if key == "locked_clocks":
        return gpu_id + (["-rgc"] if value == "unlocked" else ["-lgc", "%d,%d" % (value["min"], value["max"])])
    if key == "application_clocks":
        return gpu_id + (["-rac"] if value == "default" else ["-ac", "%d,%d" % (value["memory"], value["graphics"])])
    return gpu_id + ["-pl", "%g" % float(value)]


def readback_errors(gpus: list, steps: list) -> list:
    """Application clocks nvidia-smi accepted but does not report (it takes only supported pairs)."""
    by_bdf = {g["bdf"]: g for g in gpus}
    return ["%s application_clocks: nvidia-smi reports %s after setting %s" % (bdf, by_bdf[bdf]["app"], after)
            for bdf, key, _before, after in steps
            if key == "application_clocks" and isinstance(after, dict) and by_bdf.get(bdf, {}).get("app") != after]


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
        if kind == "application_clocks":
            original = _from_journal(original)
        current, differs = _restore_differs(kind, gpu, original)
        (steps if differs else already).append((bdf, kind, current, original) if differs else key)
    return steps, already, gone


def _to_journal(value: Any) -> Any:
    """Application clocks as "memory,graphics" text: the journal reads an object original as per-CPU values."""
    return "%d,%d" % (value["memory"], value["graphics"]) if isinstance(value, dict) else value


def _from_journal(original: Any) -> Any:
    """The journaled "memory,graphics" as ``{memory, graphics}``; "default" (``-rac``) when it is not that."""
    parts = str(original).split(",")
    if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
        return {"memory": int(parts[0]), "graphics": int(parts[1])}
    return "default"


def _restore_differs(kind: str, gpu: dict, original: Any) -> tuple:
    """``(current, whether the original must be written back)`` for one journaled setting."""
    if kind == "persistence":
        return gpu["persistence_mode"], gpu["persistence_mode"] != original
    if kind == "locked_clocks":
        return "locked", True  # no query shows the lock: -rgc is always sent (harmless when unlocked)
    if kind == "application_clocks":
        return gpu["app"], original == "default" or gpu["app"] != original
    current = gpu["limit"]
    return current, original is not None and (current is None or abs(current - original) >= 0.5)


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
            "gpus": [{"bdf": g["bdf"], "persistence_mode": g["persistence_mode"], "power_limit": g["limit"],
                      "graphics_clock": g["clock"], "application_clocks": g["app"]} for g in gpus]}


def run(call: family.Call) -> dict:
    """The gpu_settings module: validate, read the GPUs, plan, journal, apply (or restore), read back."""
    params = call.params
    restore = bool(params.get("restore"))
    want = None if restore else validate(params)
    node, journal = open_node(params)
    early = _without_nvidia_smi(call, node, journal, want, restore)
    if early is not None:
        return early
    try:
        smi = find_smi(node, call.lookup)
        gpus = read_gpus(call.run_command, smi, len(select_devices(node, DeviceSelector.nvidia_gpus())))
        daemon = daemon_state(node, call)
    except NodeError as exc:
        raise family.FamilyError(str(exc)) from None
    if restore:
        return _restore(call, journal, smi, gpus, daemon)
    locked_by_us = {k.partition(":")[2] for k in (journal.entries(NAME) if journal else {}) if k.startswith("locked_")}
    steps, daemon_step = daemon_plan(want, plan(gpus, want) + clock_plan(gpus, want, locked_by_us), daemon)
    result = _result(steps, daemon_step, gpus)
    if call.diff:
        names = [" ".join(filter(None, (c["gpu"], c["setting"]))) for c in result["changes"]]
        result["diff"] = {"before": {n: c["before"] for n, c in zip(names, result["changes"])},
                          "after": {n: c["after"] for n, c in zip(names, result["changes"])}}
    if call.check_mode or not result["changed"]:
        return result
    if journal is not None:  # originals first: a failure half-way can still be rolled back
        for bdf, key, before, _after in steps:
            journal.record(NAME, "%s:%s" % (key, bdf), _to_journal(before))
        if daemon_step:
            journal.record(NAME, "daemon", daemon_step[1])
        journal.save()
    failed = execute(call, smi, gpus, steps)
    errors = [e for _step, e in failed]
    if daemon_step:
        errors += run_daemon(call, daemon, daemon_step[1], False)
    if journal is not None:
        journal.mark_applied(NAME)
        journal.save()
    after = read_gpus(call.run_command, smi)
    result["gpus"] = _result([], None, after)["gpus"]
    errors += readback_errors(after, [s for s in steps if s not in [f for f, _e in failed]])
    if errors:
        raise family.FamilyError("GPU settings not applied: " + "; ".join(errors), result)
    return result


def _without_nvidia_smi(call: family.Call, node: Node, journal, want: dict | None, restore: bool) -> dict | None:
    """The result of a run that needs no nvidia-smi: nothing journaled to restore, or a node whose GPUs are AMD's."""
    if restore and not journal.entries(NAME):
        # Nothing of ours to put back: a rollback must pass on a node without nvidia-smi.
        return _result([], None, [])
    if _amd_only(node):
        return amd_settings.run_amd(call, node, journal, want, restore, NAME)
    return None


def _amd_only(node: Node) -> bool:
    """A node whose GPUs are AMD's (AMD GPUs on the bus, no NVIDIA one): amd-smi does the settings."""
    try:
        gpus = select_devices(node, DeviceSelector.gpus())
    except NodeError:
        return False
    amd = DeviceSelector(vendor=AMD_VENDOR)
    nvidia = DeviceSelector(vendor=NVIDIA_VENDOR)
    return any(amd.matches(d) for d in gpus) and not any(nvidia.matches(d) for d in gpus)


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


# --- boot, and the role's hooks ---


def boot(node: Node, want: dict) -> tuple:
    """Re-apply at boot (neither -pm nor -pl survives a reboot), without a journal."""
    want = module_options(want)
    if want is None:
        return True, "nothing to re-apply (the partitions are verified only)"
    params = dict(want, root=node.root, journal=None, restore=False)
    call = family.Call(params=params, run_command=calls.run_argv, lookup=calls.SystemLookup())
    try:
        result = run(call)
    except family.FamilyError as exc:
        return False, str(exc)
    done = ["%s %s %s" % (c["gpu"] or "", c["setting"], c["after"]) for c in result["changes"]]
    return True, ("set: " + "; ".join(done)) if done else "GPU settings already in place"


# The options of its module (gpu_settings): the flow module completes each family's options with it too.
ARGUMENT_SPEC = dict(
    persistence=dict(type="bool"),
    power_limit=dict(type="int"),
    power_limits=dict(type="dict"),
    locked_clocks=dict(type="dict"),
    application_clocks=dict(type="dict"),
    perf_level=dict(type="str"),
    perf_determinism_mhz=dict(type="int"),
    **JOURNAL_ARGUMENT_SPEC,
    **NODE_ARGUMENT_SPEC,
    **command.ARGUMENT_SPEC,
)

ROLE_SETTINGS = ("persistence", "power_limit", "power_limits", "locked_clocks", "application_clocks", "perf_level",
                 "perf_determinism_mhz") + VERIFY_ONLY


def from_role(v: dict, shared: dict) -> dict:
    """The GPU settings the variables ask for (unset ones left out); None when none is asked."""
    want = {k: v["gpunode_tuning_%s_%s" % (NAME, k)] for k in ROLE_SETTINGS}
    want = {k: x for k, x in want.items() if x is not None and x != {}}
    return {NAME: want or None}


def module_options(want: dict | None) -> dict | None:
    """The settings the module takes: the verified-only partitions left out; None when nothing is left."""
    out = {k: x for k, x in (want or {}).items() if k not in VERIFY_ONLY}
    return out or None


def runtime_options(desired: dict, v: dict) -> dict | None:
    return module_options(desired.get(NAME))


def restore_options(v: dict) -> dict:
    return {"restore": True}


def _verification():
    """The verification half (families/gpu_settings_verify.py), imported when verification first calls it."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_settings_verify
    return gpu_settings_verify


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "GPU settings"},
    module="gpu_settings",
    run=run,
    # nvidia-smi's settings and P2P status
    evaluate=family.with_vendor(family.later(_verification, "evaluate"), "nvidia"),
    gpu_commands=family.later(_verification, "gpu_commands"),
    boot=boot,
    from_role=from_role,
    runtime_options=runtime_options,
    restore_options=restore_options,
    argument_spec=ARGUMENT_SPEC,
    validate={NAME: desired_problems},
)
