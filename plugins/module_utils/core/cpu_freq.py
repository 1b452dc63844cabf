# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU frequency scaling on the node: reading it and planning a change (the cpu_freq module's family uses it).

How it works and why: docs/dev/node-code.md, "core/cpu_freq.py"."""

from __future__ import annotations

from typing import Any, NamedTuple

from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu import ARM64_VENDOR, driver_family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    SYSFS_CPU,
    Node,
    format_cpulist,
    parse_cpulist,
)

# CPU vendor a pstate driver family needs.
PSTATE_VENDOR = {"amd-pstate": "AuthenticAMD", "intel_pstate": "GenuineIntel"}
CPUFREQ_DIR = SYSFS_CPU + "/cpufreq"
BOOST = CPUFREQ_DIR + "/boost"
AMD_PSTATE_STATUS = SYSFS_CPU + "/amd_pstate/status"
INTEL_PSTATE_STATUS = SYSFS_CPU + "/intel_pstate/status"
INTEL_NO_TURBO = SYSFS_CPU + "/intel_pstate/no_turbo"

AMD_PSTATE_MODES = ["active", "passive", "guided"]
INTEL_PSTATE_MODES = ["active", "passive"]
DRIVER_FAMILIES = ["native", "amd-pstate", "acpi-cpufreq", "intel_pstate"]
# driver=native: the vendor's own pstate driver. CPUs of other vendors keep their running driver.
NATIVE_DRIVERS = {"AuthenticAMD": "amd-pstate", "GenuineIntel": "intel_pstate"}
# The runtime mode setting of each pstate driver family.
MODE_SETTINGS = {"amd_pstate_mode": "amd-pstate", "intel_pstate_status": "intel_pstate"}
# Drivers that refuse an EPP other than "performance" (EBUSY) while the governor is performance.
EPP_LOCKED_UNDER_PERFORMANCE = ("amd-pstate-epp", "intel_pstate")
# The policy file of each per-policy setting.
POLICY_FILES = {"governor": "scaling_governor", "epp": "energy_performance_preference"}
# Governors of the setpolicy drivers (active modes): known before the mode switch.
SETPOLICY_GOVERNORS = ["performance", "powersave"]

# The kernel's cpufreq governors (Documentation/admin-guide/pm/cpufreq.rst, "Generic Scaling Governors").
# Which of them a node offers is its scaling_available_governors (checked on the node).
GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")
# EPP names of amd-pstate-epp and intel_pstate (Documentation/admin-guide/pm/amd-pstate.rst, intel_pstate.rst);
# intel_pstate with HWP also takes a raw EPP 0-255. Which ones a node offers is its
# energy_performance_available_preferences (checked on the node).
EPP_NAMES = ("default", "performance", "balance_performance", "balance_power", "power")
EPP_RAW_MAX = 255
# The desired-value options (what a preset may set for every node: preset_options).
DESIRED_OPTIONS = ("governor", "epp", "boost", "driver", "amd_pstate_mode", "intel_pstate_status")


class PlanError(ValueError):
    """A request that cannot be carried out on this node; the message says what is allowed."""


def epp_allowed(epp: Any) -> bool:
    """Whether ``epp`` is an EPP name or a raw value 0-255 (node-free: which ones a node offers is its own)."""
    if isinstance(epp, bool):
        return False
    if isinstance(epp, int):
        return 0 <= epp <= EPP_RAW_MAX
    return isinstance(epp, str) and (epp in EPP_NAMES or (epp.isascii() and epp.isdigit()
                                                          and int(epp) <= EPP_RAW_MAX))


# -- Pure planning


def driver_for_mode(family: str, mode: str) -> str:
    """The scaling driver name a pstate driver registers in ``mode``."""
    if family == "amd-pstate":
        return "amd-pstate-epp" if mode == "active" else "amd-pstate"
    return "intel_pstate" if mode == "active" else "intel_cpufreq"


def resolve_driver(wanted: str | None, cpu_vendor: str | None) -> str | None:
    """Resolve ``native`` to the CPU vendor's own pstate driver; other values pass through."""
    if wanted != "native":
        return wanted
    return NATIVE_DRIVERS.get(cpu_vendor)


def keep_driver_reason(cpu_vendor: str | None, running_driver: str | None) -> str:
    """Why ``driver=native`` leaves the running driver alone on this CPU (the not-applicable reason)."""
    return ("driver=native means the CPU vendor's own pstate driver (amd-pstate on AMD, intel_pstate on Intel); "
            "this CPU (%s) has none, so the running driver %s is kept"
            % (cpu_vendor or "no vendor_id in /proc/cpuinfo", running_driver or "none"))


def applicability(desired: dict, cpu_vendor: str | None, running: dict) -> tuple[str | None, dict]:
    """Decide which requested cpufreq settings apply to the driver this node is meant to run."""
    wanted = resolve_driver(desired.get("driver"), cpu_vendor)
    reasons = {}
    running_driver = running.get("driver")
    if desired.get("driver") == "native" and wanted is None:
        reasons["driver"] = keep_driver_reason(cpu_vendor, running_driver)
    target = wanted or driver_family(running_driver)
    pending = wanted is not None and wanted != driver_family(running_driver)
    if wanted:
        where = "the desired driver is %s" % wanted
    else:
        where = "this node keeps its running driver %s" % running_driver
    for key, family in MODE_SETTINGS.items():
        if desired.get(key) is not None and target != family:
            reasons[key] = "%s applies to the %s driver only; %s" % (key, family, where)
    if desired.get("epp") is not None:
        why = _epp_not_applicable(desired, target, pending, running)
        if why:
            reasons["epp"] = why
    if desired.get("boost") is not None and not running.get("boost"):
        reasons["boost"] = "driver %s has no boost control (neither /%s nor /%s exists)" % (
            running_driver, BOOST, INTEL_NO_TURBO)
    return wanted, reasons


def _epp_not_applicable(desired, target, pending, running):
    """Why an EPP does not apply to ``target`` (the driver the node is meant to run), or None."""
    mode_key = {family: key for key, family in MODE_SETTINGS.items()}.get(target)
    mode = desired.get(mode_key) if mode_key else None
    if target == "amd-pstate" and mode is not None and mode != "active":
        return ("amd_pstate_mode=%s runs the amd-pstate driver, which has no energy performance preference "
                "(only active mode, amd-pstate-epp, has one)" % mode)
    if pending:
        # After the reboot into a pstate driver the EPP applies; acpi-cpufreq never has one.
        return None if mode_key else "the desired driver %s has no energy performance preference" % target
    if running.get("epp"):
        return None
    current = running.get("amd_status") if target == "amd-pstate" else running.get("intel_status")
    if mode == "active" and current not in (None, "active"):
        return None  # the mode switch to active brings the EPP
    return ("driver %s has no energy performance preference (EPP needs amd-pstate-epp, i.e. amd_pstate active "
            "mode, or intel_pstate with HWP)" % running.get("driver"))


def selecting_args(family: str, amd_pstate_mode: str | None = None) -> list[str]:
    """The kernel arguments that make the kernel load a pstate driver family at boot."""
    if family == "amd-pstate":
        return ["amd_pstate=%s" % (amd_pstate_mode or "active")]
    if family == "intel_pstate":
        return ["intel_pstate=active"]
    return []


def disabling_args(family: str) -> list[str]:
    """The kernel arguments that keep a pstate driver family from loading (acpi-cpufreq takes over)."""
    if family == "amd-pstate":
        return ["amd_pstate=disable"]
    if family == "intel_pstate":
        return ["intel_pstate=disable"]
    return []


class DriverArgs(NamedTuple):
    """The answer of ``driver_kernel_args``: what one node needs, and what any node may have got."""

    needed: list[str]
    """Arguments that make this node boot into the desired driver; empty when it already runs that family."""
    removable: list[str]
    """Every argument the persistent flow may configure for this desired driver, on a node of either
    vendor running any driver (the rollback removes exactly these)."""


def driver_kernel_args(wanted: str | None, amd_pstate_mode: str | None = None, cpu_vendor: str | None = None,
                       running_driver: str | None = None) -> DriverArgs:
    """The one mapping of a desired cpufreq driver to kernel arguments."""
    family = driver_family(wanted)
    if family == "native":
        removable = selecting_args("amd-pstate", amd_pstate_mode) + selecting_args("intel_pstate")
    elif family == "acpi-cpufreq":
        removable = disabling_args("amd-pstate") + disabling_args("intel_pstate")
    else:
        removable = selecting_args(family, amd_pstate_mode)
    target = resolve_driver(family, cpu_vendor) if family == "native" else family
    if not target or driver_family(running_driver) == target:
        return DriverArgs([], removable)
    _check_vendor(target, cpu_vendor, running_driver)
    if target == "acpi-cpufreq":
        return DriverArgs(disabling_args(driver_family(running_driver)), removable)
    return DriverArgs(selecting_args(target, amd_pstate_mode), removable)


def _check_vendor(family, cpu_vendor, running_driver):
    """Raise PlanError when a CPU of ``cpu_vendor`` cannot run the driver ``family``."""
    if cpu_vendor and cpu_vendor.startswith(ARM64_VENDOR):
        raise PlanError("driver=%s exists on x86 CPUs only; this node's CPU is %s, running %s: use driver=native "
                        "to keep the running driver" % (family, cpu_vendor, running_driver))
    if family == "amd-pstate" and cpu_vendor and cpu_vendor != "AuthenticAMD":
        raise PlanError("driver=amd-pstate needs an AMD CPU; this node's CPU vendor is %s "
                        "(possible drivers: intel_pstate, acpi-cpufreq)" % cpu_vendor)
    if family == "intel_pstate" and cpu_vendor and cpu_vendor != "GenuineIntel":
        raise PlanError("driver=intel_pstate needs an Intel CPU; this node's CPU vendor is %s "
                        "(possible drivers: amd-pstate, acpi-cpufreq)" % cpu_vendor)


def driver_change(current_driver: str | None, wanted_family: str | None, cpu_vendor: str | None,
                  amd_pstate_mode: str | None = None) -> tuple[bool, list[str]]:
    """Plan a driver change, which only a reboot can make: ``(reboot_required, kernel_args)``."""
    needed = driver_kernel_args(wanted_family, amd_pstate_mode, cpu_vendor, current_driver).needed
    return bool(needed), needed


def order_governor_epp(driver: str | None, current_governor: str | None, governor: str | None = None,
                       epp: str | None = None) -> list[tuple[str, str]]:
    """Return the writes that take one policy to ``governor``/``epp``, in an order the driver accepts."""
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


def group_by_value(values: dict) -> dict:
    """Aggregate ``{cpu: value}`` into ``{value: cpulist}``."""
    groups = {}
    for cpu, value in values.items():
        if value is not None:
            groups.setdefault(str(value), []).append(cpu)
    return {value: format_cpulist(cpus) for value, cpus in sorted(groups.items())}


# -- Reading the node


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

    def path(self, attr: str) -> str:
        return "%s/%s/%s" % (CPUFREQ_DIR, self.name, attr)


def read_policies(node: Node) -> list[Policy]:
    """Read every cpufreq policy with at least one online CPU, ordered by first CPU."""
    policies = []
    for name in node.listdir(CPUFREQ_DIR):
        if not name.startswith("policy") or not name[6:].isdigit():
            continue
        base = CPUFREQ_DIR + "/" + name
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


def per_cpu(policies: list[Policy], attr: str) -> dict:
    """``{cpu: value}`` of a policy attribute (``governor``, ``epp``)."""
    return {cpu: getattr(p, attr) for p in policies for cpu in p.cpus}


class NodeFreq:
    """The node-wide frequency state: policies plus the node-wide files."""

    def __init__(self, node):
        self.node = node
        self.refresh()

    def refresh(self, policies: bool = True) -> None:
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

    def view(self) -> dict:
        """The running state as ``applicability`` takes it."""
        return dict(driver=self.driver, amd_status=self.amd_status, intel_status=self.intel_status,
                    epp=any(p.epp is not None for p in self.policies), boost=self.boost_file is not None)


def boost_value(boost_file: str, boost: bool) -> str:
    """The string that makes ``boost_file`` mean ``boost`` (no_turbo is inverted)."""
    if boost_file == INTEL_NO_TURBO:
        return "0" if boost else "1"
    return "1" if boost else "0"


# -- Validation (before any write)


def validate(params: dict, freq: NodeFreq, vendor: str | None, node: Node | None = None) -> dict:
    """Check every desired value against the node; return the plan or raise PlanError."""
    plan = dict(reboot_required=False, kernel_args=[], mode=None, skip={}, deferred=False,
                driver_after=freq.driver, warnings=[])
    wanted, plan["skip"] = applicability(params, vendor, freq.view())
    # What does not apply to this node's driver at all (the rest of skip applies after a reboot).
    plan["not_applicable"] = dict(plan["skip"])
    plan["driver_wanted"] = wanted
    amd_mode = None if "amd_pstate_mode" in plan["skip"] else params["amd_pstate_mode"]
    plan["reboot_required"], plan["kernel_args"] = driver_change(freq.driver, wanted, vendor, amd_mode)
    plan["unsupported"] = {}
    if plan["reboot_required"] and wanted == "amd-pstate" and node is not None:
        amd_mode = _fit_amd_pstate(plan, node, amd_mode)
    _plan_mode(plan, freq, "amd_pstate_mode", amd_mode)
    if "intel_pstate_status" not in plan["skip"]:
        _plan_mode(plan, freq, "intel_pstate_status", params["intel_pstate_status"])
    if params["governor"] is not None:
        _check_governor(plan, freq, params["governor"])
    if params["epp"] is not None and "epp" not in plan["skip"]:
        _check_epp(plan, freq, params["governor"], params["epp"])
    return plan


def _fit_amd_pstate(plan, node, amd_mode):
    """Fit before tuned: a node that cannot boot into amd-pstate (kernel, option, CPPC), or loads it by itself,
    gets no argument and no reboot; the driver (and its mode and EPP) are unsupported with the cause."""
    # Imported here: only a planned switch to amd-pstate reads the platform (a runtime run rarely does).
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import platform as fit

    feasible = fit.amd_pstate_feasibility(fit.read(node), amd_mode, node.read("proc/cmdline", default="").split())
    if feasible["ok"] and not feasible["default"]:
        return amd_mode
    plan["reboot_required"], plan["kernel_args"] = False, []
    for key in ("driver", "amd_pstate_mode", "epp"):
        plan["skip"][key] = plan["unsupported"][key] = feasible["reason"]
    plan["warnings"].append("cpufreq driver amd-pstate is unsupported on this node, no kernel argument is "
                            "written and no reboot is needed for it: %s" % feasible["reason"])
    return None


def _plan_mode(plan, freq, key, mode):
    """Plan a pstate mode switch (the desired driver is that pstate driver: ``applicability``)."""
    if mode is None:
        return
    amd = key == "amd_pstate_mode"
    path, family = (AMD_PSTATE_STATUS, "amd-pstate") if amd else (INTEL_PSTATE_STATUS, "intel_pstate")
    present, current = (freq.has_amd_status, freq.amd_status) if amd else (freq.has_intel_status, freq.intel_status)
    if present:
        if current != mode:
            plan["mode"] = (path, key, mode)
            plan["driver_after"] = driver_for_mode(family, mode)
    elif plan["reboot_required"]:
        plan["skip"][key] = "%s is not running (driver %s): %s=%s applies after the reboot into it (%s)" % (
            family, freq.driver, key, mode, " ".join(plan["kernel_args"]))
    else:
        raise PlanError("%s=%s needs %s, which this node does not have (cpufreq driver %s, a kernel without a "
                        "runtime mode switch); set the mode on the kernel command line instead"
                        % (key, mode, "/" + path, freq.driver))


def _check_governor(plan, freq, governor):
    switching = plan["mode"] is not None
    driver_after = plan["driver_after"]
    if switching and driver_after in ("amd-pstate-epp", "intel_pstate"):
        allowed = SETPOLICY_GOVERNORS
    elif switching:
        plan["deferred"] = True  # known only once the driver has re-registered
        plan["warnings"].append("governor %s is checked against the governors of %s after the mode switch"
                                % (governor, driver_after))
        return
    else:
        allowed = _common(p.governors for p in freq.policies)
    if governor not in allowed:
        raise PlanError("governor %s is not available with driver %s; available governors: %s"
                        % (governor, driver_after, ", ".join(allowed) or "none"))


def _check_epp(plan, freq, governor, epp):
    """The EPP against the policies (``applicability`` has ruled out drivers without EPP)."""
    switching = plan["mode"] is not None
    has_epp = all(p.epp is not None for p in freq.policies)
    if not has_epp and not switching:
        if plan["reboot_required"]:
            plan["skip"]["epp"] = ("driver %s has no energy performance preference; it applies after the reboot "
                                   "into %s (%s)" % (freq.driver, plan["driver_wanted"], " ".join(plan["kernel_args"])))
            return
        missing = [cpu for p in freq.policies if p.epp is None for cpu in p.cpus]
        raise PlanError("epp=%s: CPUs %s have no energy_performance_preference while the others have one"
                        % (epp, format_cpulist(missing)))
    if has_epp:
        allowed = _common(p.epps for p in freq.policies)
        if epp not in allowed:
            raise PlanError("epp %s is not available with driver %s; available preferences: %s"
                            % (epp, freq.driver, ", ".join(allowed) or "none"))
    errors = {}
    for p in freq.policies:
        try:
            order_governor_epp(plan["driver_after"] if switching else p.driver, p.governor, governor, epp)
        except PlanError as exc:
            errors.setdefault(str(exc), []).extend(p.cpus)
    if errors:
        msg, cpus = next(iter(errors.items()))
        raise PlanError("%s (CPUs %s)" % (msg, format_cpulist(cpus)))


def _common(lists):
    """Values present in every list, in the order of the first."""
    lists = [list(x or []) for x in lists]
    if not lists:
        return []
    rest = [set(x) for x in lists[1:]]
    return [v for v in lists[0] if all(v in r for r in rest)]
