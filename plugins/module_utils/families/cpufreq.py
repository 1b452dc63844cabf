# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU frequency scaling: driver mode, governor, energy performance preference (EPP), boost.

How it works and why: docs/dev/node-code.md, "families/cpufreq.py"."""

from __future__ import annotations

from typing import Any, Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu import cpu_vendor  # noqa: F401 (re-exported)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu_freq import (
    AMD_PSTATE_MODES,
    CPUFREQ_DIR,
    DESIRED_OPTIONS,
    DRIVER_FAMILIES,
    EPP_NAMES,
    EPP_RAW_MAX,
    GOVERNORS,
    INTEL_PSTATE_MODES,
    POLICY_FILES,
    NodeFreq,
    PlanError,
    boost_value,
    epp_allowed,
    group_by_value,
    order_governor_epp,
    per_cpu,
    validate,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import (
    JOURNAL_ARGUMENT_SPEC,
    open_node,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    NodeError,
    format_cpulist,
)

NAME = "cpufreq"
# The cpufreq driver is a module udev's coldplug loads, possibly after the boot unit started.
UDEV_SETTLE_TIMEOUT = 30

ARGUMENT_SPEC = dict(
    governor=dict(type="str"),
    epp=dict(type="str"),
    boost=dict(type="bool"),
    amd_pstate_mode=dict(type="str", choices=AMD_PSTATE_MODES),
    intel_pstate_status=dict(type="str", choices=INTEL_PSTATE_MODES),
    driver=dict(type="str", choices=DRIVER_FAMILIES),
    required=dict(type="bool", default=False),
)
ARGUMENT_SPEC.update(contract.preset_options_spec(DESIRED_OPTIONS))
ARGUMENT_SPEC.update(JOURNAL_ARGUMENT_SPEC)
ARGUMENT_SPEC.update(NODE_ARGUMENT_SPEC)


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["cpufreq"]`` (and cpu_freq's options): names and types only."""
    shape = contract.entry_problem(NAME, want, ", ".join(DESIRED_OPTIONS))
    if shape or want is None:
        return shape
    out = []
    governor, epp, boost = want.get("governor"), want.get("epp"), want.get("boost")
    if governor is not None and governor not in GOVERNORS:
        out.append(("governor", "governor %r is not a cpufreq governor: allowed are %s"
                    % (governor, ", ".join(GOVERNORS))))
    if epp is not None and not epp_allowed(epp):
        out.append(("epp", "epp %r is not an energy performance preference: allowed are %s, or a raw value 0-%d "
                    "(intel_pstate with HWP)" % (epp, ", ".join(EPP_NAMES), EPP_RAW_MAX)))
    if boost is not None and not isinstance(boost, bool):
        out.append(("boost", "boost must be true, false or null, got %r" % (boost,)))
    for key, choices in (("driver", DRIVER_FAMILIES), ("amd_pstate_mode", AMD_PSTATE_MODES),
                         ("intel_pstate_status", INTEL_PSTATE_MODES)):
        if want.get(key) is not None and want[key] not in choices:
            out.append((key, "%s must be one of %s, got %r" % (key, ", ".join(choices), want[key])))
    return out


def _count(values, value):
    return sum(1 for v in values.values() if v == value)


# -- Applying


def write_value(node, path, value):
    """Write a sysfs attribute (with a newline, as ``echo`` does) and read it back."""
    node.write(value + "\n", path)
    got = node.read(path)
    if got != value:
        raise NodeError("%s: wrote %s, read back %s" % (path, value, got))


class Outcome:
    """Per-setting results and failures (messages and the CPUs they concern), for the return value."""

    def __init__(self):
        self.settings = {}
        self.failed = {}
        self.failed_cpus = {}

    def fail(self, key: str, message: str, cpus: Iterable[int] = ()) -> None:
        self.failed.setdefault(key, []).append(message)
        self.failed_cpus.setdefault(key, set()).update(cpus)

    def message(self) -> str:
        """``governor on CPUs 2,5: <cause>; <cause>`` per failed setting, at most three causes each."""
        parts = []
        for key, msgs in sorted(self.failed.items()):
            cpus = self.failed_cpus.get(key)
            where = " on CPUs %s" % format_cpulist(sorted(cpus)) if cpus else ""
            more = " (and %d more)" % (len(msgs) - 3) if len(msgs) > 3 else ""
            parts.append("%s%s: %s%s" % (key, where, "; ".join(msgs[:3]), more))
        return "; ".join(parts)


def policy_writes(freq, governor, epp, targets=None):
    """Writes for every policy, ordered: all governors first, then all EPPs."""
    phases = {"governor": [], "epp": []}
    errors = {}
    for p in freq.policies:
        g, e = targets.get(p.name, (None, None)) if targets is not None else (governor, epp)
        if g is None and e is None:
            continue
        if e is not None and p.epp is None:
            errors.setdefault("epp: %s has no energy_performance_preference" % p.driver, []).extend(p.cpus)
            e = None
        if g is not None and g not in p.governors:
            errors.setdefault("governor %s is not available with driver %s (available: %s)"
                              % (g, p.driver, ", ".join(p.governors)), []).extend(p.cpus)
            g = None
        if e is not None and p.epps is not None and e not in p.epps:
            errors.setdefault("epp %s is not available (available: %s)" % (e, ", ".join(p.epps)), []).extend(p.cpus)
            e = None
        try:
            steps = order_governor_epp(p.driver, p.governor, g, e)
        except PlanError as exc:
            errors.setdefault(str(exc), []).extend(p.cpus)
            steps = order_governor_epp(p.driver, p.governor, g, None)
        for setting, value in steps:
            if setting == "epp" and value == p.epp:
                continue
            phases[setting].append((p, value))
    return phases, errors


def _journal_originals(journal, freq, plan, phases, boost):
    """Record the originals of everything this run is about to change (never overwriting)."""
    if plan["mode"] is not None:
        key = plan["mode"][1]
        journal.record(NAME, key, freq.amd_status if key == "amd_pstate_mode" else freq.intel_status)
        touched = freq.policies
        gov_touched = freq.policies
    else:
        gov_touched = [p for p, _v in phases["governor"]]
        names = {p.name for p in gov_touched} | {p.name for p, _v in phases["epp"]}
        touched = [p for p in freq.policies if p.name in names]
    if gov_touched:
        journal.record_per_cpu(NAME, "governor", per_cpu(gov_touched, "governor"))
    epps = {cpu: v for cpu, v in per_cpu(touched, "epp").items() if v is not None}
    if epps:
        journal.record_per_cpu(NAME, "epp", epps)
    if boost is not None and freq.boost is not None and freq.boost != boost:
        journal.record(NAME, "boost", freq.boost)


def write_policies(node, phases, outcome):
    """Write every governor, then every EPP; each is read back. A failing policy does not stop the others."""
    for setting in ("governor", "epp"):
        for p, value in phases[setting]:
            try:
                write_value(node, p.path(POLICY_FILES[setting]), value)
            except NodeError as exc:
                outcome.fail(setting, "CPUs %s: %s" % (format_cpulist(p.cpus), exc), p.cpus)


def note_errors(outcome, errors):
    for msg, cpus in errors.items():
        outcome.fail("epp" if msg.startswith("epp") else "governor", "%s (CPUs %s)" % (msg, format_cpulist(cpus)),
                     cpus)


class CpufreqError(contract.FamilyError):
    """The cpu_freq call fails; ``result`` is what the module returns with the message."""


# One cpu_freq call: its options and how it runs (the family contract's Call).
Call = contract.Call


def check_params(params: dict) -> None:
    """Raise CpufreqError on a call that asks for nothing, or for an empty governor or EPP."""
    if not params["restore"] and all(params[k] is None for k in ("governor", "epp", "boost", "amd_pstate_mode",
                                                                 "intel_pstate_status", "driver")):
        raise CpufreqError("nothing to do: give at least one of governor, epp, boost, amd_pstate_mode, "
                           "intel_pstate_status, driver, or restore=true")
    for key in ("governor", "epp"):
        if params[key] is not None and not params[key].strip():
            raise CpufreqError("%s must not be empty" % key)
    problems = desired_problems({k: params[k] for k in DESIRED_OPTIONS})
    if problems:
        raise CpufreqError("invalid input, nothing was written: %s" % contract.problems_text(problems))


def run(call: contract.Call) -> dict:
    """The cpu_freq module: validate, plan, journal, write in a valid order, read back; returns the result."""
    params = call.params
    check_params(params)
    node, journal = open_node(params)
    freq = NodeFreq(node)
    result = dict(changed=False, supported=bool(freq.policies), driver=freq.driver, reboot_required=False,
                  kernel_args=[], settings={})
    if not freq.policies:
        why = "this node has no cpufreq policies (%s is empty or missing; typical of VMs)" % ("/" + CPUFREQ_DIR)
        if params["required"]:
            raise CpufreqError("CPU frequency scaling cannot be controlled: " + why, result)
        result["reason"] = why
        if not params["restore"]:
            contract.warn_not_applicable(call, {k: why for k in DESIRED_OPTIONS if params[k] is not None})
        return result

    if params["restore"]:
        from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpufreq_restore

        outcome, changed = cpufreq_restore.restore(call, node, journal, freq)
        result["driver"] = freq.driver
        return _finish(call, result, outcome, changed, restore=True)

    try:
        plan = validate(params, freq, cpu_vendor(node), node)
    except PlanError as exc:
        raise CpufreqError(str(exc), result) from None
    for warning in plan["warnings"] + _cmdline_warnings(node, plan, freq):
        call.warn(warning)
    contract.warn_not_applicable(call, plan["not_applicable"])
    result["reboot_required"], result["kernel_args"] = plan["reboot_required"], plan["kernel_args"]
    if plan["unsupported"]:
        result["unsupported"] = plan["unsupported"]
    before = _state(freq)
    outcome = Outcome()
    after, changed = run_writes(call, node, journal, freq, plan, outcome)
    result["driver"] = after["driver"]
    _report(outcome, params, plan, before, after, freq)
    return _finish(call, result, outcome, changed)


def _cmdline_warnings(node, plan, freq):
    """amd-pstate wanted, its argument already on the command line, yet not running: say why that happens."""
    if not (plan["reboot_required"] and plan["driver_wanted"] == "amd-pstate"):
        return []
    already = [a for a in node.read("proc/cmdline", default="").split() if a.startswith("amd_pstate=")]
    if not already:
        return []
    return ["the kernel command line already has %s, yet the driver is %s: CPPC may be off in the BIOS (dmesg: "
            "_CPC object is not present) or the kernel lacks amd-pstate" % (already[0], freq.driver)]


def _state(freq):
    """What the report compares: driver, per-CPU governor and EPP, boost, the pstate modes."""
    return dict(driver=freq.driver, governor=per_cpu(freq.policies, "governor"), epp=per_cpu(freq.policies, "epp"),
                boost=freq.boost, amd=freq.amd_status, intel=freq.intel_status)


def run_writes(call, node, journal, freq, plan, outcome):
    """Journal the originals, then write (check mode: predict); returns ``(after, changed)``."""
    params = call.params
    governor = params["governor"]
    epp = None if "epp" in plan["skip"] else params["epp"]
    boost = None if "boost" in plan["skip"] else params["boost"]
    switching = plan["mode"] is not None
    phases, errors = ({"governor": [], "epp": []}, {}) if switching else policy_writes(freq, governor, epp)
    note_errors(outcome, errors)  # empty after validate(); kept for mixed-policy nodes
    boost_changes = boost is not None and freq.boost != boost
    changed = switching or bool(phases["governor"] or phases["epp"]) or boost_changes
    if call.check_mode:
        return _check_run(node, freq, plan, phases, outcome, governor, epp, boost if boost_changes else None), changed
    if journal is not None and changed:
        _journal_originals(journal, freq, plan, phases, boost)
        journal.mark_applied(NAME)
        journal.save()
    if switching:
        phases = _switch_mode(node, freq, plan, outcome, governor, epp)
    write_policies(node, phases, outcome)
    if boost_changes:
        try:
            write_value(node, freq.boost_file, boost_value(freq.boost_file, boost))
        except NodeError as exc:
            outcome.fail("boost", str(exc))
    freq.refresh(policies=bool(switching or phases["governor"] or phases["epp"]))
    return _state(freq), changed


def _switch_mode(node, freq, plan, outcome, governor, epp):
    """Write the pstate mode; the driver re-registers, so governor and EPP are planned on what it offers then."""
    path, key, value = plan["mode"]
    try:
        write_value(node, path, value)
    except NodeError as exc:
        outcome.fail(key, str(exc))
    freq.refresh()
    if governor is None and epp is None:
        return {"governor": [], "epp": []}
    phases, errors = policy_writes(freq, governor, epp)
    note_errors(outcome, errors)
    return phases


def _check_run(node, freq, plan, phases, outcome, governor, epp, boost):
    """Check mode: the state after the writes a real run could make; the others fail as they would then."""
    if plan["mode"] is not None and write_refused(node, outcome, plan["mode"][1], plan["mode"][0]):
        plan = dict(plan, mode=None, driver_after=freq.driver)
        phases, errors = policy_writes(freq, governor, epp)
        note_errors(outcome, errors)
    if plan["mode"] is None:
        phases = writable_phases(node, phases, outcome)
    if boost is not None and write_refused(node, outcome, "boost", freq.boost_file):
        boost = None
    return _predicted_state(freq, plan, phases, governor, epp, freq.boost if boost is None else boost)


def write_refused(node, outcome, key, path, cpus=(), where=""):
    """Check mode: True, failing ``key`` as a real run would, when ``path`` cannot be written."""
    problem = node.write_problem(path)
    if problem is None:
        return False
    outcome.fail(key, "%s%s %s" % (where, node.path(path), problem), cpus)
    return True


def writable_phases(node, phases, outcome):
    """Check mode: the policy writes a real run could make; a refused one fails its setting on its CPUs."""
    kept = {"governor": [], "epp": []}
    for setting, writes in phases.items():
        for p, value in writes:
            where = "CPUs %s: " % format_cpulist(p.cpus)
            if not write_refused(node, outcome, setting, p.path(POLICY_FILES[setting]), p.cpus, where):
                kept[setting].append((p, value))
    return kept


def _predicted_state(freq, plan, phases, governor, epp, boost):
    """Check mode: the state after the planned writes (after the mode switch, as planned for the new driver)."""
    mode = plan["mode"]
    predicted = _predict(freq, governor, epp) if mode is not None else predict_writes(freq, phases)
    return dict(driver=plan["driver_after"],
                governor=predicted.get("governor", per_cpu(freq.policies, "governor")),
                epp=predicted.get("epp", per_cpu(freq.policies, "epp")), boost=boost,
                amd=mode[2] if mode and mode[1] == "amd_pstate_mode" else freq.amd_status,
                intel=mode[2] if mode and mode[1] == "intel_pstate_status" else freq.intel_status)


def _report(outcome, params, plan, before, after, freq):
    """One entry per requested setting; a setting that does not apply says why (``skipped``, ``reason``)."""
    settings, skip = outcome.settings, plan["skip"]
    for key, side in (("amd_pstate_mode", "amd"), ("intel_pstate_status", "intel")):
        if params[key] is not None:
            settings[key] = node_setting(params[key], before[side], after[side], skip.get(key))
    if params["governor"] is not None:
        settings["governor"] = cpu_setting(params["governor"], before["governor"], after["governor"])
    if params["epp"] is not None:
        settings["epp"] = cpu_setting(params["epp"], before["epp"], after["epp"], skip.get("epp"))
    if params["boost"] is not None:
        settings["boost"] = node_setting(params["boost"], before["boost"], after["boost"], skip.get("boost"))
        settings["boost"]["file"] = "/" + freq.boost_file if freq.boost_file else None
    if params["driver"] is not None:
        reason = skip.get("driver")
        if plan["reboot_required"]:
            how = " ".join(plan["kernel_args"]) or "remove the pstate driver's kernel arguments"
            reason = "the driver changes only at boot: %s" % how
        settings["driver"] = dict(desired=plan["driver_wanted"] or params["driver"], before=before["driver"],
                                  after=after["driver"], changed=False, cpus_changed=0,
                                  skipped=reason is not None, reason=reason)


def _predict(freq, governor, epp):
    """Check mode with a pending mode switch: the settings as planned for the new driver."""
    out = {}
    if governor is not None:
        out["governor"] = {cpu: governor for p in freq.policies for cpu in p.cpus}
    if epp is not None:
        out["epp"] = {cpu: epp for p in freq.policies for cpu in p.cpus}
    return out


def predict_writes(freq, phases):
    """Check mode: per-CPU values after the planned writes."""
    gov = per_cpu(freq.policies, "governor")
    epp = per_cpu(freq.policies, "epp")
    for p, value in phases["governor"]:
        for cpu in p.cpus:
            gov[cpu] = value
    for p, value in phases["epp"]:
        for cpu in p.cpus:
            epp[cpu] = value
    return {"governor": gov, "epp": epp}


def cpu_setting(desired, before, after, skipped_reason=None):
    changed_cpus = sum(1 for cpu, v in after.items() if before.get(cpu) != v)
    at_desired = _count(after, desired) if not isinstance(desired, dict) else None
    return dict(desired=desired, before=group_by_value(before), after=group_by_value(after),
                cpus=len(after), cpus_desired=at_desired, cpus_changed=changed_cpus,
                changed=changed_cpus > 0, skipped=skipped_reason is not None, reason=skipped_reason)


def node_setting(desired, before, after, skipped_reason):
    return dict(desired=desired, before=before, after=after, changed=before != after,
                cpus_changed=0, skipped=skipped_reason is not None, reason=skipped_reason)


def _diff_value(value):
    if isinstance(value, dict):
        return ", ".join("%s on %s" % (v, cpus) for v, cpus in value.items()) or "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "-" if value is None else str(value)


def _diff(settings):
    """Diff text per setting, e.g. ``governor: schedutil on 0-127``."""
    before, after = [], []
    for key, s in sorted(settings.items()):
        for side, out in (("before", before), ("after", after)):
            text = _diff_value(s[side])
            out.append("%s: %s\n" % (key, text))
    return dict(before="".join(before), after="".join(after))


def _finish(call, result, outcome, changed, restore=False):
    """The result, or CpufreqError naming what did not take."""
    result["changed"] = changed
    result["settings"] = outcome.settings
    if call.diff:
        result["diff"] = _diff({k: v for k, v in outcome.settings.items() if k != "driver"})
    if outcome.failed:
        result["failed_settings"] = sorted(outcome.failed)
        if call.check_mode:
            what = ("check mode: a real run would fail. cpufreq originals could not be restored (they would stay "
                    "in the journal; the others would be restored): " if restore else
                    "check mode: a real run would fail. cpufreq settings would not take (the others would be "
                    "applied): ")
        else:
            what = ("cpufreq originals could not be restored (they stay in the journal; the others were restored): "
                    if restore else "cpufreq settings did not take (the others were applied): ")
        raise CpufreqError(what + outcome.message(), result)
    return result


def summary(result: dict) -> str:
    if not result.get("supported", True):
        return "not applicable: %s" % result.get("reason")
    line = "driver %s, %s" % (result.get("driver"), "changed" if result.get("changed") else "unchanged")
    if result.get("reboot_required"):
        line += ("; switching the driver needs %s and a reboot (--tags persistent)"
                 % " ".join(result.get("kernel_args") or []))
    return line


def _plan_half():
    """The plan half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpufreq_plan
    return cpufreq_plan


def _verification():
    """The verification half, imported on first use (family.later)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import cpufreq_verify
    return cpufreq_verify


DEFINITION = Family(
    name=NAME,
    titles={NAME: "cpufreq"},
    module="cpu_freq",
    read=contract.later(_verification, "read"),
    facts_doc=contract.later(_verification, "FACTS_DOC"),
    run=run,
    evaluate=contract.later(_verification, "evaluate"),
    reads_boot_config=contract.later(_verification, "reads_boot_config"),
    runtime=contract.later(_verification, "runtime"),
    boot=contract.later(_plan_half, "boot"),
    from_role=contract.later(_plan_half, "from_role"),
    runtime_options=contract.later(_plan_half, "runtime_options"),
    restore_options=contract.later(_plan_half, "restore_options"),
    argument_spec=ARGUMENT_SPEC,
    kernel_args=contract.later(_plan_half, "kernel_args"),
    per_cpu=("governor", "epp"),
    drifted_cpus=contract.later(_verification, "drifted_cpus"),
    summary=summary,
    items="settings",
    validate={NAME: desired_problems},
)
