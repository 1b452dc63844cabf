# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU frequency scaling: driver mode, governor, energy performance preference (EPP), boost.

Per-policy files live in ``/sys/devices/system/cpu/cpufreq/policyN`` (``cpuN/cpufreq`` links
there); one policy may cover several CPUs (``affected_cpus``), so writes go once per policy.
Node-wide files: ``cpufreq/boost``, ``amd_pstate/status``, ``intel_pstate/{status,no_turbo}``.

Pure planning: ``driver_family``, ``driver_for_mode``, ``driver_change`` (and the argument
mapping it shares with the rollback, ``driver_kernel_args``), ``order_governor_epp``,
``group_by_value``. ``run`` is the module's whole flow.
"""

from __future__ import annotations

import itertools

from ansible_collections.gpunode.tuning.plugins.module_utils.journal import (
    JOURNAL_ARGUMENT_SPEC,
    Journal,
    open_journal,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.node import (
    NODE_ARGUMENT_SPEC,
    SYSFS_CPU,
    Node,
    NodeError,
    format_cpulist,
    parse_cpulist,
)

FAMILY = "cpufreq"
CPUFREQ = SYSFS_CPU + "/cpufreq"
BOOST = CPUFREQ + "/boost"
AMD_PSTATE_STATUS = SYSFS_CPU + "/amd_pstate/status"
INTEL_PSTATE_STATUS = SYSFS_CPU + "/intel_pstate/status"
INTEL_NO_TURBO = SYSFS_CPU + "/intel_pstate/no_turbo"

AMD_PSTATE_MODES = ["active", "passive", "guided"]
INTEL_PSTATE_MODES = ["active", "passive"]
DRIVER_FAMILIES = ["native", "amd-pstate", "acpi-cpufreq", "intel_pstate"]
# Drivers that refuse an EPP other than "performance" (EBUSY) while the governor is performance.
EPP_LOCKED_UNDER_PERFORMANCE = ("amd-pstate-epp", "intel_pstate")
# Governors of the setpolicy drivers (active modes): known before the mode switch.
SETPOLICY_GOVERNORS = ["performance", "powersave"]

ARGUMENT_SPEC = dict(
    governor=dict(type="str"),
    epp=dict(type="str"),
    boost=dict(type="bool"),
    amd_pstate_mode=dict(type="str", choices=AMD_PSTATE_MODES),
    intel_pstate_status=dict(type="str", choices=INTEL_PSTATE_MODES),
    driver=dict(type="str", choices=DRIVER_FAMILIES),
    required=dict(type="bool", default=False),
)
ARGUMENT_SPEC.update(JOURNAL_ARGUMENT_SPEC)
ARGUMENT_SPEC.update(NODE_ARGUMENT_SPEC)


class PlanError(ValueError):
    """A request that cannot be carried out on this node; the message says what is allowed."""


# ---------------------------------------------------------------------------------------------
# Pure planning
# ---------------------------------------------------------------------------------------------


def driver_family(driver):
    """Map a scaling driver name to its family: amd-pstate, intel_pstate, acpi-cpufreq, or itself."""
    if driver in ("amd-pstate", "amd-pstate-epp"):
        return "amd-pstate"
    if driver in ("intel_pstate", "intel_cpufreq"):
        return "intel_pstate"
    return driver


def driver_for_mode(family, mode):
    """The scaling driver name a pstate driver registers in ``mode``."""
    if family == "amd-pstate":
        return "amd-pstate-epp" if mode == "active" else "amd-pstate"
    return "intel_pstate" if mode == "active" else "intel_cpufreq"


def resolve_driver(wanted, cpu_vendor):
    """Resolve ``native`` to the CPU vendor's own pstate driver; other values pass through.

    ``native`` lets one desired state serve a mixed fleet: amd-pstate on AMD, intel_pstate on
    Intel. Raises PlanError for a CPU of another vendor.
    """
    if wanted != "native":
        return wanted
    if cpu_vendor == "AuthenticAMD":
        return "amd-pstate"
    if cpu_vendor == "GenuineIntel":
        return "intel_pstate"
    raise PlanError("driver=native means amd-pstate on AMD and intel_pstate on Intel CPUs; this node's CPU "
                    "vendor is %s: choose one of amd-pstate, intel_pstate, acpi-cpufreq" % (cpu_vendor or "unknown"))


def selecting_args(family, amd_pstate_mode=None):
    """The kernel arguments that make the kernel load a pstate driver family at boot."""
    if family == "amd-pstate":
        return ["amd_pstate=%s" % (amd_pstate_mode or "active")]
    if family == "intel_pstate":
        return ["intel_pstate=active"]
    return []


def disabling_args(family):
    """The kernel arguments that keep a pstate driver family from loading (acpi-cpufreq takes over)."""
    if family == "amd-pstate":
        return ["amd_pstate=disable"]
    if family == "intel_pstate":
        return ["intel_pstate=disable"]
    return []


def driver_kernel_args(wanted, amd_pstate_mode=None):
    """Every kernel argument ``driver_change`` can plan for the desired ``wanted`` driver, on any node.

    What the persistent flow may have configured for this desired state, whatever the CPU
    vendor and the driver the node ran then; the rollback removes exactly these (an
    administrator's argument with another value is left alone). ``native`` stands for both
    vendors' drivers, ``acpi-cpufreq`` for switching either pstate driver off.
    """
    family = driver_family(wanted)
    if family == "native":
        return selecting_args("amd-pstate", amd_pstate_mode) + selecting_args("intel_pstate")
    if family == "acpi-cpufreq":
        return disabling_args("amd-pstate") + disabling_args("intel_pstate")
    return selecting_args(family, amd_pstate_mode)


def driver_change(current_driver, wanted_family, cpu_vendor, amd_pstate_mode=None):
    """Plan a driver change, which only a reboot can make.

    Returns ``(reboot_required, kernel_args)``. Raises PlanError when the CPU cannot run the
    wanted driver (amd-pstate on Intel, intel_pstate on AMD).
    """
    if not wanted_family or driver_family(current_driver) == wanted_family:
        return False, []
    if wanted_family == "amd-pstate":
        if cpu_vendor and cpu_vendor != "AuthenticAMD":
            raise PlanError("driver=amd-pstate needs an AMD CPU; this node's CPU vendor is %s "
                            "(possible drivers: intel_pstate, acpi-cpufreq)" % cpu_vendor)
    elif wanted_family == "intel_pstate":
        if cpu_vendor and cpu_vendor != "GenuineIntel":
            raise PlanError("driver=intel_pstate needs an Intel CPU; this node's CPU vendor is %s "
                            "(possible drivers: amd-pstate, acpi-cpufreq)" % cpu_vendor)
    else:
        # acpi-cpufreq: switch the running pstate driver off.
        return True, disabling_args(driver_family(current_driver))
    return True, selecting_args(wanted_family, amd_pstate_mode)


def order_governor_epp(driver, current_governor, governor=None, epp=None):
    """Return the writes that take one policy to ``governor``/``epp``, in an order the driver accepts.

    The result is a list of ``(setting, value)`` with setting ``governor`` or ``epp``; settings
    already at their value are left out. amd-pstate-epp and intel_pstate refuse an EPP other
    than ``performance`` while the governor is ``performance`` (EBUSY), so:

    * final governor performance with a non-performance EPP is impossible: PlanError;
    * the governor is written first, then the EPP: leaving ``performance`` first unlocks the EPP,
      and entering ``performance`` is accepted whatever the EPP is.
    """
    final_governor = governor or current_governor
    if epp is not None and epp != "performance" and final_governor == "performance" \
            and driver in EPP_LOCKED_UNDER_PERFORMANCE:
        how = ("governor=performance was asked" if governor else "the governor is performance")
        raise PlanError("epp=%s cannot be set while the governor is performance: %s refuses it (EBUSY) and %s; "
                        "use governor=powersave with this EPP, or epp=performance"
                        % (epp, driver, how))
    steps = []
    if governor is not None and governor != current_governor:
        steps.append(("governor", governor))
    if epp is not None:
        steps.append(("epp", epp))
    return steps


def group_by_value(values):
    """Aggregate ``{cpu: value}`` into ``{value: cpulist}``."""
    groups = {}
    for cpu, value in values.items():
        if value is not None:
            groups.setdefault(str(value), []).append(cpu)
    return {value: format_cpulist(cpus) for value, cpus in sorted(groups.items())}


def _count(values, value):
    return sum(1 for v in values.values() if v == value)


# ---------------------------------------------------------------------------------------------
# Reading the node
# ---------------------------------------------------------------------------------------------


class Policy:
    """One cpufreq policy: the CPUs it covers and its current settings."""

    __slots__ = ("name", "cpus", "driver", "governor", "governors", "epp", "epps")

    def __init__(self, name, cpus, driver, governor, governors, epp, epps):
        self.name = name
        self.cpus = cpus
        self.driver = driver
        self.governor = governor
        self.governors = governors
        self.epp = epp
        self.epps = epps

    def path(self, attr):
        return "%s/%s/%s" % (CPUFREQ, self.name, attr)


def read_policies(node):
    """Read every cpufreq policy with at least one online CPU, ordered by first CPU."""
    policies = []
    for name in node.listdir(CPUFREQ):
        if not name.startswith("policy") or not name[6:].isdigit():
            continue
        base = CPUFREQ + "/" + name
        affected = node.read(base, "affected_cpus", default=None)
        try:
            cpus = parse_cpulist(affected.replace(" ", ",")) if affected is not None else [int(name[6:])]
        except ValueError:
            cpus = [int(name[6:])]
        if not cpus:
            continue
        epp = node.read(base, "energy_performance_preference", default="") or None
        epps = node.read(base, "energy_performance_available_preferences", default="").split() if epp else None
        policies.append(Policy(
            name, cpus,
            node.read(base, "scaling_driver", default=""),
            node.read(base, "scaling_governor", default=""),
            node.read(base, "scaling_available_governors", default="").split(),
            epp, epps))
    policies.sort(key=lambda p: p.cpus[0])
    return policies


def per_cpu(policies, attr):
    """``{cpu: value}`` of a policy attribute (``governor``, ``epp``)."""
    return {cpu: getattr(p, attr) for p in policies for cpu in p.cpus}


def cpu_vendor(node):
    """The ``vendor_id`` of /proc/cpuinfo (first CPU), or None."""
    try:
        with open(node.path("proc/cpuinfo"), encoding="utf-8", errors="replace") as fh:
            for line in itertools.islice(fh, 16):
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


class NodeFreq:
    """The node-wide frequency state: policies plus the node-wide files."""

    def __init__(self, node):
        self.node = node
        self.refresh()

    def refresh(self, policies=True):
        """Read the node again; ``policies=False`` re-reads only the node-wide files."""
        node = self.node
        if policies:
            self.policies = read_policies(node)
        drivers = sorted({p.driver for p in self.policies if p.driver})
        self.driver = ",".join(drivers) or None
        self.has_amd_status = node.exists(AMD_PSTATE_STATUS)
        self.amd_status = node.read(AMD_PSTATE_STATUS, default="") if self.has_amd_status else None
        self.has_intel_status = node.exists(INTEL_PSTATE_STATUS)
        self.intel_status = node.read(INTEL_PSTATE_STATUS, default="") if self.has_intel_status else None
        self.boost_file = None
        if driver_family(self.driver) == "intel_pstate" and node.exists(INTEL_NO_TURBO):
            self.boost_file = INTEL_NO_TURBO
        elif node.exists(BOOST):
            self.boost_file = BOOST
        elif node.exists(INTEL_NO_TURBO):
            self.boost_file = INTEL_NO_TURBO
        self.boost = None
        if self.boost_file:
            raw = node.read(self.boost_file, default="")
            if raw in ("0", "1"):
                self.boost = (raw == "1") != (self.boost_file == INTEL_NO_TURBO)


def boost_value(boost_file, boost):
    """The string that makes ``boost_file`` mean ``boost`` (no_turbo is inverted)."""
    if boost_file == INTEL_NO_TURBO:
        return "0" if boost else "1"
    return "1" if boost else "0"


# ---------------------------------------------------------------------------------------------
# Validation (before any write)
# ---------------------------------------------------------------------------------------------


def validate(params, freq, vendor):
    """Check every desired value against the node; return the plan or raise PlanError.

    The plan is a dict: ``reboot_required``, ``kernel_args``, ``mode`` (``(file, key, value)`` or
    None), ``skip`` (``{setting: reason}``), ``deferred`` (governor validated after a mode switch),
    ``driver_after`` (predicted scaling driver).
    """
    plan = dict(reboot_required=False, kernel_args=[], mode=None, skip={}, deferred=False,
                driver_after=freq.driver, warnings=[])
    wanted = resolve_driver(params["driver"], vendor)
    mode = params["amd_pstate_mode"]
    if params["driver"] == "native" and wanted != "amd-pstate" and mode is not None:
        # A fleet-wide desired state names an amd-pstate mode; it has no meaning on Intel nodes.
        plan["skip"]["amd_pstate_mode"] = "driver=native resolves to %s on this %s CPU" % (wanted, vendor)
        mode = None
    reboot, kargs = driver_change(freq.driver, wanted, vendor, mode)
    plan["reboot_required"], plan["kernel_args"] = reboot, kargs
    pending_amd = reboot and wanted == "amd-pstate"

    if mode is not None:
        if freq.has_amd_status:
            if freq.amd_status != mode:
                plan["mode"] = (AMD_PSTATE_STATUS, "amd_pstate_mode", mode)
                plan["driver_after"] = driver_for_mode("amd-pstate", mode)
        elif pending_amd:
            plan["skip"]["amd_pstate_mode"] = "amd-pstate is not running (driver %s): the mode is set at boot by %s" % (
                freq.driver, " ".join(kargs))
        else:
            raise PlanError("amd_pstate_mode=%s needs %s, which this node does not have (cpufreq driver %s, "
                            "amd-pstate not registered); set driver=amd-pstate to get the kernel argument for a "
                            "reboot" % (mode, "/" + AMD_PSTATE_STATUS, freq.driver))
    istatus = params["intel_pstate_status"]
    if istatus is not None:
        if not freq.has_intel_status:
            raise PlanError("intel_pstate_status=%s needs %s, which this node does not have (cpufreq driver %s)"
                            % (istatus, "/" + INTEL_PSTATE_STATUS, freq.driver))
        if plan["mode"] is not None:
            raise PlanError("amd_pstate_mode and intel_pstate_status cannot both change the driver mode")
        if freq.intel_status != istatus:
            plan["mode"] = (INTEL_PSTATE_STATUS, "intel_pstate_status", istatus)
            plan["driver_after"] = driver_for_mode("intel_pstate", istatus)

    governor, epp = params["governor"], params["epp"]
    switching = plan["mode"] is not None
    driver_after = plan["driver_after"]

    if governor is not None:
        if switching and driver_after in ("amd-pstate-epp", "intel_pstate"):
            allowed = SETPOLICY_GOVERNORS
        elif switching:
            allowed = None  # known only once the driver has re-registered
        else:
            allowed = _common(p.governors for p in freq.policies)
        if allowed is None:
            plan["deferred"] = True
            plan["warnings"].append("governor %s is checked against the governors of %s after the mode switch"
                                    % (governor, driver_after))
        elif governor not in allowed:
            raise PlanError("governor %s is not available with driver %s; available governors: %s"
                            % (governor, driver_after, ", ".join(allowed) or "none"))

    if epp is not None:
        if switching and driver_after == "amd-pstate":
            raise PlanError("epp needs amd_pstate active mode (driver amd-pstate-epp); amd_pstate_mode=%s "
                            "(driver amd-pstate) has no energy performance preference" % plan["mode"][2])
        has_epp = all(p.epp is not None for p in freq.policies)
        if not has_epp and not switching:
            if pending_amd:
                plan["skip"]["epp"] = ("driver %s has no energy performance preference; it applies after the reboot "
                                       "into amd-pstate (%s)" % (freq.driver, " ".join(kargs)))
            else:
                raise PlanError("epp=%s: driver %s has no energy_performance_preference; EPP needs amd-pstate-epp "
                                "(amd_pstate active mode) or intel_pstate with HWP" % (epp, freq.driver))
        elif has_epp:
            allowed = _common(p.epps for p in freq.policies)
            if epp not in allowed:
                raise PlanError("epp %s is not available with driver %s; available preferences: %s"
                                % (epp, freq.driver, ", ".join(allowed) or "none"))
        if "epp" not in plan["skip"]:
            errors = {}
            for p in freq.policies:
                try:
                    order_governor_epp(driver_after if switching else p.driver, p.governor, governor, epp)
                except PlanError as exc:
                    errors.setdefault(str(exc), []).extend(p.cpus)
            if errors:
                msg, cpus = next(iter(errors.items()))
                raise PlanError("%s (CPUs %s)" % (msg, format_cpulist(cpus)))

    if params["boost"] is not None and freq.boost_file is None:
        raise PlanError("boost cannot be controlled on this node: neither %s nor %s exists (driver %s)"
                        % ("/" + BOOST, "/" + INTEL_NO_TURBO, freq.driver))
    return plan


def _common(lists):
    """Values present in every list, in the order of the first."""
    lists = [list(x or []) for x in lists]
    if not lists:
        return []
    rest = [set(x) for x in lists[1:]]
    return [v for v in lists[0] if all(v in r for r in rest)]


# ---------------------------------------------------------------------------------------------
# Applying
# ---------------------------------------------------------------------------------------------


def _write(node, path, value):
    """Write a sysfs attribute (with a newline, as ``echo`` does) and read it back."""
    node.write(value + "\n", path)
    got = node.read(path)
    if got != value:
        raise NodeError("%s: wrote %s, read back %s" % (path, value, got))


class Outcome:
    """Per-setting results and failures, aggregated for the module's return value."""

    def __init__(self):
        self.settings = {}
        self.failed = {}

    def fail(self, key, message):
        self.failed.setdefault(key, []).append(message)


def _policy_writes(freq, governor, epp, targets=None):
    """Writes for every policy, ordered: all governors first, then all EPPs.

    ``targets`` (restore) maps a policy name to its own ``(governor, epp)``.
    """
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
    """Record the originals of everything this run is about to change (never overwriting).

    A governor change or a mode switch also moves the EPP (the performance governor forces it,
    a mode switch resets both), so the EPP of those policies is recorded as well.
    """
    if plan["mode"] is not None:
        key = plan["mode"][1]
        journal.record(FAMILY, key, freq.amd_status if key == "amd_pstate_mode" else freq.intel_status)
        touched = freq.policies
        gov_touched = freq.policies
    else:
        gov_touched = [p for p, _v in phases["governor"]]
        names = {p.name for p in gov_touched} | {p.name for p, _v in phases["epp"]}
        touched = [p for p in freq.policies if p.name in names]
    if gov_touched:
        journal.record_per_cpu(FAMILY, "governor", per_cpu(gov_touched, "governor"))
    epps = {cpu: v for cpu, v in per_cpu(touched, "epp").items() if v is not None}
    if epps:
        journal.record_per_cpu(FAMILY, "epp", epps)
    if boost is not None and freq.boost is not None and freq.boost != boost:
        journal.record(FAMILY, "boost", freq.boost)


def _write_policies(node, phases, outcome):
    """Write every governor, then every EPP; each is read back."""
    for setting in ("governor", "epp"):
        attr = "scaling_governor" if setting == "governor" else "energy_performance_preference"
        for p, value in phases[setting]:
            try:
                _write(node, p.path(attr), value)
            except NodeError as exc:
                outcome.fail(setting, str(exc))


def _note_errors(outcome, errors):
    for msg, cpus in errors.items():
        outcome.fail("epp" if msg.startswith("epp") else "governor", "%s (CPUs %s)" % (msg, format_cpulist(cpus)))


def run(module):
    """The cpu_freq module: validate, plan, journal, write in a valid order, read back, report."""
    params = module.params
    node = Node.open(params["root"], module)
    journal = open_journal(module, node)
    restore = params["restore"]
    if not restore and all(params[k] is None for k in ("governor", "epp", "boost", "amd_pstate_mode",
                                                       "intel_pstate_status", "driver")):
        module.fail_json(msg="nothing to do: give at least one of governor, epp, boost, amd_pstate_mode, "
                             "intel_pstate_status, driver, or restore=true")
    for key in ("governor", "epp"):
        if params[key] is not None and not params[key].strip():
            module.fail_json(msg="%s must not be empty" % key)

    freq = NodeFreq(node)
    result = dict(changed=False, supported=bool(freq.policies), driver=freq.driver, reboot_required=False,
                  kernel_args=[], settings={})
    if not freq.policies:
        why = "this node has no cpufreq policies (%s is empty or missing; typical of VMs)" % ("/" + CPUFREQ)
        if params["required"]:
            module.fail_json(msg="CPU frequency scaling cannot be controlled: " + why, **result)
        result["reason"] = why
        module.exit_json(**result)

    if restore:
        outcome, changed = _restore(module, node, journal, freq)
        result["driver"] = freq.driver
        _finish(module, result, outcome, changed)

    try:
        plan = validate(params, freq, cpu_vendor(node))
    except PlanError as exc:
        module.fail_json(msg=str(exc), **result)
    for warning in plan["warnings"]:
        module.warn(warning)
    result["reboot_required"], result["kernel_args"] = plan["reboot_required"], plan["kernel_args"]
    cmdline = node.read("proc/cmdline", default="").split()
    plan["driver_wanted"] = resolve_driver(params["driver"], cpu_vendor(node)) if params["driver"] else None
    if plan["reboot_required"] and plan["driver_wanted"] == "amd-pstate":
        already = [a for a in cmdline if a.startswith("amd_pstate=")]
        if already:
            module.warn("the kernel command line already has %s, yet the driver is %s: CPPC may be off in the "
                        "BIOS (dmesg: _CPC object is not present) or the kernel lacks amd-pstate"
                        % (already[0], freq.driver))

    check = module.check_mode
    governor, boost = params["governor"], params["boost"]
    epp = None if "epp" in plan["skip"] else params["epp"]
    before = dict(driver=freq.driver, governor=per_cpu(freq.policies, "governor"),
                  epp=per_cpu(freq.policies, "epp"), boost=freq.boost, amd=freq.amd_status,
                  intel=freq.intel_status)
    outcome = Outcome()
    switching = plan["mode"] is not None
    phases, errors = ({"governor": [], "epp": []}, {}) if switching else _policy_writes(freq, governor, epp)
    _note_errors(outcome, errors)  # empty after validate(); kept for mixed-policy nodes
    boost_changes = boost is not None and freq.boost != boost
    changed = switching or bool(phases["governor"] or phases["epp"]) or boost_changes

    if check:
        if switching:
            predicted = _predict(freq, governor, epp)
        else:
            predicted = _predict_writes(freq, phases)
        after = dict(driver=plan["driver_after"], governor=predicted.get("governor", before["governor"]),
                     epp=predicted.get("epp", before["epp"]), boost=boost if boost_changes else freq.boost,
                     amd=plan["mode"][2] if switching and plan["mode"][1] == "amd_pstate_mode" else freq.amd_status,
                     intel=plan["mode"][2] if switching and plan["mode"][1] != "amd_pstate_mode"
                     else freq.intel_status)
    else:
        if journal is not None and changed:
            _journal_originals(journal, freq, plan, phases, boost)
            journal.mark_applied(FAMILY)
            journal.save()
        if switching:
            # The driver re-registers in the new mode: re-read before planning governor and EPP.
            path, key, value = plan["mode"][0], plan["mode"][1], plan["mode"][2]
            try:
                _write(node, path, value)
            except NodeError as exc:
                outcome.fail(key, str(exc))
            freq.refresh()
            if governor is not None or epp is not None:
                phases, errors = _policy_writes(freq, governor, epp)
                _note_errors(outcome, errors)
        _write_policies(node, phases, outcome)
        if boost_changes:
            try:
                _write(node, freq.boost_file, boost_value(freq.boost_file, boost))
            except NodeError as exc:
                outcome.fail("boost", str(exc))
        freq.refresh(policies=bool(switching or phases["governor"] or phases["epp"]))
        after = dict(driver=freq.driver, governor=per_cpu(freq.policies, "governor"),
                     epp=per_cpu(freq.policies, "epp"), boost=freq.boost, amd=freq.amd_status,
                     intel=freq.intel_status)

    result["driver"] = after["driver"]
    settings = outcome.settings
    if params["amd_pstate_mode"] is not None:
        settings["amd_pstate_mode"] = _node_setting(params["amd_pstate_mode"], before["amd"], after["amd"],
                                                    plan["skip"].get("amd_pstate_mode"))
    if params["intel_pstate_status"] is not None:
        settings["intel_pstate_status"] = _node_setting(params["intel_pstate_status"], before["intel"],
                                                        after["intel"], None)
    if governor is not None:
        settings["governor"] = _cpu_setting(governor, before["governor"], after["governor"])
    if params["epp"] is not None:
        settings["epp"] = _cpu_setting(params["epp"], before["epp"], after["epp"], plan["skip"].get("epp"))
    if boost is not None:
        settings["boost"] = _node_setting(boost, before["boost"], after["boost"], None)
        settings["boost"]["file"] = "/" + freq.boost_file
    if params["driver"] is not None:
        reason = None
        if plan["reboot_required"]:
            how = " ".join(plan["kernel_args"]) or "remove the pstate driver's kernel arguments"
            reason = "the driver changes only at boot: %s" % how
        settings["driver"] = dict(desired=plan["driver_wanted"], before=before["driver"], after=after["driver"],
                                  changed=False, cpus_changed=0, skipped=plan["reboot_required"], reason=reason)
    _finish(module, result, outcome, changed)


def _predict(freq, governor, epp):
    """Check mode with a pending mode switch: the settings as planned for the new driver."""
    out = {}
    if governor is not None:
        out["governor"] = {cpu: governor for p in freq.policies for cpu in p.cpus}
    if epp is not None:
        out["epp"] = {cpu: epp for p in freq.policies for cpu in p.cpus}
    return out


def _predict_writes(freq, phases):
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


def _cpu_setting(desired, before, after, skipped_reason=None):
    changed_cpus = sum(1 for cpu, v in after.items() if before.get(cpu) != v)
    at_desired = _count(after, desired) if not isinstance(desired, dict) else None
    return dict(desired=desired, before=group_by_value(before), after=group_by_value(after),
                cpus=len(after), cpus_desired=at_desired, cpus_changed=changed_cpus,
                changed=changed_cpus > 0, skipped=skipped_reason is not None, reason=skipped_reason)


def _node_setting(desired, before, after, skipped_reason):
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


def _finish(module, result, outcome, changed):
    result["changed"] = changed
    result["settings"] = outcome.settings
    if module._diff:
        result["diff"] = _diff({k: v for k, v in outcome.settings.items() if k != "driver"})
    if outcome.failed:
        result["failed_settings"] = sorted(outcome.failed)
        module.fail_json(msg="cpufreq settings did not take: " + "; ".join(
            "%s: %s" % (k, "; ".join(v[:3])) for k, v in sorted(outcome.failed.items())), **result)
    module.exit_json(**result)


# ---------------------------------------------------------------------------------------------
# Restore
# ---------------------------------------------------------------------------------------------


def _restore(module, node, journal, freq):
    """Write back the journaled originals: driver mode first, then governor, EPP, boost.

    Returns ``(outcome, changed)``. Restored entries are dropped from the journal; failed ones stay.
    """
    entries = journal.entries(FAMILY)
    outcome = Outcome()
    check = module.check_mode
    changed = False
    done = []
    for key, path in (("amd_pstate_mode", AMD_PSTATE_STATUS), ("intel_pstate_status", INTEL_PSTATE_STATUS)):
        if key not in entries:
            continue
        original = entries[key]
        current = freq.amd_status if key == "amd_pstate_mode" else freq.intel_status
        after = current
        done.append(key)
        if original != current:
            changed = True
            if not node.exists(path):
                outcome.fail(key, "/%s is gone; cannot restore %s" % (path, original))
            elif check:
                after = original
            else:
                try:
                    _write(node, path, original)
                except NodeError as exc:
                    outcome.fail(key, str(exc))
                freq.refresh()
                after = freq.amd_status if key == "amd_pstate_mode" else freq.intel_status
        outcome.settings[key] = _node_setting(original, current, after, None)

    gov_orig = Journal.per_cpu(entries["governor"]) if "governor" in entries else {}
    epp_orig = Journal.per_cpu(entries["epp"]) if "epp" in entries else {}
    targets = {}
    for p in freq.policies:
        g = next((gov_orig[c] for c in p.cpus if c in gov_orig), None)
        e = next((epp_orig[c] for c in p.cpus if c in epp_orig), None)
        if g is not None or e is not None:
            targets[p.name] = (g, e)
    before_gov, before_epp = per_cpu(freq.policies, "governor"), per_cpu(freq.policies, "epp")
    phases, errors = _policy_writes(freq, None, None, targets)
    _note_errors(outcome, errors)
    if phases["governor"] or phases["epp"]:
        changed = True
        if check:
            predicted = _predict_writes(freq, phases)
        else:
            _write_policies(node, phases, outcome)
            freq.policies = read_policies(node)
    if not check or not (phases["governor"] or phases["epp"]):
        predicted = {"governor": per_cpu(freq.policies, "governor"), "epp": per_cpu(freq.policies, "epp")}
    for key, originals, before in (("governor", gov_orig, before_gov), ("epp", epp_orig, before_epp)):
        if originals:
            outcome.settings[key] = _cpu_setting(group_by_value(originals), before, predicted[key])
            done.append(key)

    if "boost" in entries:
        original = bool(entries["boost"])
        before = after = freq.boost
        done.append("boost")
        if freq.boost_file is None:
            outcome.fail("boost", "neither /%s nor /%s exists; cannot restore boost" % (BOOST, INTEL_NO_TURBO))
        elif before != original:
            changed = True
            if check:
                after = original
            else:
                try:
                    _write(node, freq.boost_file, boost_value(freq.boost_file, original))
                except NodeError as exc:
                    outcome.fail("boost", str(exc))
                freq.refresh(policies=False)
                after = freq.boost
        outcome.settings["boost"] = _node_setting(original, before, after, None)

    if not check:
        for key in done:
            if key not in outcome.failed:
                journal.drop(FAMILY, key)
        if changed:
            journal.mark_applied(FAMILY)
        journal.save()
    return outcome, changed
