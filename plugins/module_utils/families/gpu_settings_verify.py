# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpu_settings family's verification half: the rows of its settings from the GPU probe's answers.

nvidia-smi's (the health query and the GPU list) and, on a node whose GPUs are AMD's, amd-smi's
(core/amd_settings_rows.py). Imported when verification first calls it (``family.later`` in
families/gpu_settings.py), never by a run that only applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    amd_health,
    amd_settings_rows,
    command,
    family,
    nvidia_smi,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.families.gpu_settings import (
    NAME,
    VERIFY_ONLY,
    app_clocks,
    app_state,
    as_float,
    partition_mode,
    validate,
)


def persistence_mode_row(probe: dict, root: str = "/") -> dict | None:
    """``persistence_mode``: Enabled on every GPU the driver lists (``nvidia-smi --query-gpu``), judged whenever
    nvidia-smi is asked, whatever the desired state holds (verification's former GPU section). Off, the driver
    tears a GPU's state down when it idles. None when verification was told not to probe the GPUs."""
    state, why = nvidia_smi.probe_status(probe, root)
    if state == "disabled":
        return None
    if state != "present":
        return family.setting(NAME, "persistence_mode", "Enabled", None, "not_applicable", why)
    query = probe.get("query") or {}
    if query.get("rc", 0) != 0:
        return family.setting(NAME, "persistence_mode", "Enabled", None, "drifted", nvidia_smi.smi_failure(query))
    gpus = nvidia_smi.parse_gpu_query(query.get("stdout"))
    off = [str(g["index"]) for g in gpus if g["persistence_mode"].lower() != "enabled"]
    if not gpus:
        return family.setting(NAME, "persistence_mode", "Enabled", None, "not_applicable", "no GPU")
    if off:
        return family.setting(NAME, "persistence_mode", "Enabled", "Disabled on GPU %s" % ", ".join(off), "drifted",
                              "persistence mode off: the driver tears down GPU state when idle (run "
                              "nvidia-persistenced)")
    return family.setting(NAME, "persistence_mode", "Enabled", "Enabled", "applied", "")


def evaluate(facts: dict, desired: dict, ctx: Any = None) -> list:
    """For what the desired state sets, rows ``gpu_settings.persistence``, ``.power_limit``, ``.locked_clocks`` and
    ``.application_clocks`` from the health query; then ``.persistence_mode`` (always: ``persistence_mode_row``).

    On a node whose GPUs are AMD's (the module's choice, ``_amd_only``, made here from the facts' ``pci.gpu_vendors``)
    ``.power_limit``, ``.perf_level``, ``.perf_determinism_mhz``, ``.compute_partition`` and ``.memory_partition``
    come from amd-smi's answers (``amd_rows``, vendor ``amd``); elsewhere the AMD-only ones are not applicable."""
    probe = nvidia_smi.probe_answers(getattr(ctx, "gpu", None) or facts.get("gpu_probe"))
    mode_row = persistence_mode_row(probe, getattr(ctx, "root", "/"))
    want_params = (desired or {}).get(NAME) or {}
    vendors = set(((facts.get("pci") or {}).get("gpu_vendors") or {}).values())
    if want_params and vendors == {"amd"}:
        nvidia_rows = [r for r in _setting_rows(probe, desired) if r["name"] not in AMD_ROWS]
        return nvidia_rows + amd_rows(want_params, probe) + ([mode_row] if mode_row else [])
    return _setting_rows(probe, desired) + _amd_elsewhere(want_params, vendors) + ([mode_row] if mode_row else [])


def gpu_commands(desired: dict) -> tuple:
    """The health query (the settings' values) and the GPU list (persistence mode); amd-smi's calls where the
    desired state sets a GPU setting (asked only on a node with AMD GPUs; the same calls as gpu_health's, once)."""
    amd = amd_health.COMMANDS if (desired or {}).get(NAME) else ()
    return (nvidia_smi.HEALTH, nvidia_smi.QUERY) + amd


def _setting_rows(probe: dict, desired: dict) -> list:
    """The rows of the settings the desired state sets (none when it sets none)."""
    want_params = (desired or {}).get(NAME) or {}
    if not want_params:
        return []
    try:
        want = validate(want_params)
    except family.FamilyError as exc:
        raise family.EvaluationError(str(exc)) from None
    health = probe.get("health") or {}
    if probe.get("probe") != "present" or health.get("rc", 0) != 0 or health.get("timed_out"):
        state, why = "not_applicable", "nvidia-smi is not available (%s)" % (probe.get("probe") or "not probed")
        if probe.get("probe") == "present":
            state, why = "unsupported", "nvidia-smi did not answer the GPU query: %s" % command.failure(
                "nvidia-smi", command.Result(health.get("rc"), health.get("stdout") or "", health.get("stderr") or "",
                                             timed_out=bool(health.get("timed_out"))))
        return [family.setting(NAME, k, v, None, state, why)
                for k, v in (("persistence", want["persistence"]), ("power_limit", want["power"] or None),
                             ("locked_clocks", want["locked"]), ("application_clocks", want["app"]))
                if v is not None]
    gpus = nvidia_smi.parse_health(health.get("stdout"), health.get("fields"))
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
            limit = as_float(g.get("power.limit"))
            if watts is not None and (limit is None or abs(limit - watts) >= 0.5):
                off.append("%s %s W of %d W" % (g["bdf"], g.get("power.limit"), watts))
        rows.append(family.setting(NAME, "power_limit", want["power"], "; ".join(off) or "as wanted",
                                   "drifted" if off else "applied", "; ".join(off)))
    return rows + clock_rows(want, gpus)


def clock_rows(want: dict, gpus: list) -> list:
    """Locked clocks: each GPU's graphics clock inside the range (no query shows the lock itself; a clock
    outside means the lock is gone, e.g. after a driver reload, or the GPU is throttling). Application
    clocks: the query's pair."""
    rows = []
    if want["locked"]:
        lo, hi = want["locked"]["min"], want["locked"]["max"]
        clocks = {g["bdf"]: as_float(g.get("clocks.current.graphics")) for g in gpus}
        unknown = sorted(b for b, c in clocks.items() if c is None)
        off = ["%s %.0f MHz" % (b, c) for b, c in sorted(clocks.items()) if c is not None and not lo <= c <= hi]
        state, why = ("drifted", "graphics clock outside %d-%d MHz on %s (lock gone, or throttling: see clocks "
                      "event reasons)" % (lo, hi, ", ".join(off))) if off else ("applied", "")
        if unknown and not off:
            state, why = "not_applicable", "nvidia-smi reports no graphics clock for %s" % ", ".join(unknown)
        rows.append(family.setting(NAME, "locked_clocks", want["locked"], "; ".join(off) or "inside the range",
                                   state, why))
    if want["app"]:
        rows.append(_app_row(want["app"], gpus))
    return rows


def _app_row(app: dict, gpus: list) -> dict:
    """Application clocks: the query's pair; deprecated from R590 on (the answer says so): unsupported."""
    deprecated = [g["bdf"] for g in gpus if app_state(g) == "deprecated"]
    if deprecated:
        return family.setting(NAME, "application_clocks", app, nvidia_smi.DEPRECATED, "unsupported",
                              "the driver answers %s for %s: application clocks are deprecated from R590 on; lock the "
                              "graphics clock (locked_clocks) instead" % (nvidia_smi.DEPRECATED, ", ".join(deprecated)))
    off = ["%s %s" % (g["bdf"], app_clocks(g)) for g in gpus if app_clocks(g) != app]
    return family.setting(NAME, "application_clocks", app, "; ".join(off) or "as wanted",
                          "drifted" if off else "applied",
                          "application clocks (memory, graphics MHz) differ on %s" % ", ".join(off) if off else "")


# --- verification on AMD GPUs: desired against amd-smi's answers of the GPU probe (core/amd_settings_rows.py) ---

# The rows amd-smi answers on a node whose GPUs are AMD's (power_limit replaces nvidia-smi's there).
AMD_ROWS = ("power_limit", "perf_level", "perf_determinism_mhz") + VERIFY_ONLY
_AMD_ONLY_KEYS = ("perf_level", "perf_determinism_mhz") + VERIFY_ONLY


def _amd_elsewhere(want_params: dict, vendors: set) -> list:
    """The AMD-only settings on a node whose GPUs are not all AMD's: not applicable, saying why."""
    why = ("AMD Instinct GPUs only (amd-smi); this node's GPUs are %s" % " and ".join(sorted(vendors))
           if vendors else "no GPU on the PCI bus")
    if vendors and vendors != {"amd"} and "amd" in vendors:
        why = "the AMD settings are applied and verified on a node whose GPUs are all AMD's; this one has %s" \
            % " and ".join(sorted(vendors))
    return [family.setting(NAME, k, want_params[k], None, "not_applicable", why)
            for k in _AMD_ONLY_KEYS if want_params.get(k) is not None]


def amd_rows(want_params: dict, probe: dict) -> list:
    """The AMD rows of what the desired state sets: power cap, perf level, determinism, partitions (vendor amd).

    Each row names every GPU that differs (``GPU <index> (<address>)``), desired and actual; a partition that
    differs is drifted naming the ``amd-smi set`` call that would change it (this collection never does)."""
    try:
        want = validate(want_params)
    except family.FamilyError as exc:
        raise family.EvaluationError(str(exc)) from None
    partitions = {k: partition_mode(k, want_params.get(k)) for k in VERIFY_ONLY}
    level = None if want["determinism"] else want["perf_level"]
    asked = [(k, v) for k, v in (("power_limit", want["power"] or None), ("perf_level", level),
                                 ("perf_determinism_mhz", want["determinism"]),
                                 ("compute_partition", partitions["compute_partition"]),
                                 ("memory_partition", partitions["memory_partition"])) if v is not None]
    if not asked:
        return []
    need_metric = any(k in ("perf_level", "perf_determinism_mhz") for k, _v in asked)
    gpus, why = amd_settings_rows.amd_probe_gpus(probe, need_metric)
    if why or not gpus:
        why = why or "amd-smi static lists no GPU"
        return [_amd_row(k, v, None, "unsupported", "not verified: %s" % why) for k, v in asked]
    return amd_settings_rows.setting_rows(_amd_row, asked, gpus)


def _amd_row(name: str, desired: Any, running: Any, state: str, reason: str) -> dict:
    return family.setting(NAME, name, desired, running, state, reason, vendor="amd")
