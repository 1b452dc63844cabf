# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cpufreq family's verification half: its facts (``read``, ``FACTS_DOC``) and the rows of its settings.

Imported when verification or tuning_info first calls it (``family.later`` in families/cpufreq.py), never by a
run that only applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core import platform as fit
from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu import ARM64_VENDOR, driver_family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu_freq import (
    PSTATE_VENDOR,
    applicability,
    driver_kernel_args,
    resolve_driver,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.facts import aggregate
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import setting as setting_row
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    SYSFS_CPU,
    Node,
    online_cpus,
    parse_cpulist,
    read_small,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.families.cpufreq import NAME

# tuning_info's RETURN of tuning_facts.cpufreq (tools/generate.py writes it there).
FACTS_DOC = r"""
description:
  - CPU frequency scaling. Per-CPU settings are aggregated as a dict with C(value) (the most common value
    over the online CPUs, null when the attribute is absent), C(cpus_differing) (how many online CPUs
    have another value) and C(cpulists) (each value present -> the cpulist that has it).
returned: always
type: dict
contains:
  supported:
    description: True when a cpufreq driver serves the CPUs.
    type: bool
    returned: always
    sample: true
  driver:
    description: The cpufreq driver (C(acpi-cpufreq), C(amd-pstate), C(amd-pstate-epp), C(intel_pstate), ...).
    type: str
    returned: always
    sample: acpi-cpufreq
  cpus_with_policy:
    description: Number of online CPUs that have a cpufreq policy.
    type: int
    returned: always
    sample: 128
  governor:
    description: The scaling governor, aggregated.
    type: dict
    returned: always
    sample: {value: performance, cpus_differing: 0, cpulists: {performance: 0-127}}
    contains:
      value:
        description: The most common governor.
        type: str
        returned: always
        sample: performance
      cpus_differing:
        description: Number of online CPUs with another governor (or none).
        type: int
        returned: always
        sample: 0
      cpulists:
        description: Governor -> cpulist of the CPUs that use it.
        type: dict
        returned: always
        sample: {performance: 0-127}
  epp:
    description: The energy performance preference, aggregated like RV(tuning_facts.cpufreq.governor).
    type: dict
    returned: always
    sample: {value: performance, cpus_differing: 0, cpulists: {performance: 0-127}}
    contains:
      value:
        description: The most common EPP; null when the driver has no EPP.
        type: str
        returned: always
        sample: performance
      cpus_differing:
        description: Number of online CPUs with another EPP.
        type: int
        returned: always
        sample: 0
      cpulists:
        description: EPP -> cpulist.
        type: dict
        returned: always
        sample: {performance: 0-127}
  boost:
    description: C(/sys/devices/system/cpu/cpufreq/boost); null when absent (see C(intel_pstate.no_turbo)).
    type: bool
    returned: always
    sample: true
  available_governors:
    description: Governors the driver offers.
    type: list
    elements: str
    returned: always
    sample: [performance, powersave]
  available_epp:
    description: EPP values the driver offers; empty without EPP.
    type: list
    elements: str
    returned: always
    sample: [default, performance, balance_performance, balance_power, power]
  amd_pstate:
    description: The amd-pstate driver's status file (it exists only when amd-pstate registered).
    type: dict
    returned: always
    contains:
      present:
        description: True when C(amd_pstate/status) exists.
        type: bool
        returned: always
        sample: true
      status:
        description: V(active), V(passive), V(guided) or V(disable); null when absent.
        type: str
        returned: always
        sample: active
  intel_pstate:
    description: The intel_pstate driver's state.
    type: dict
    returned: always
    contains:
      present:
        description: True when C(intel_pstate/status) exists.
        type: bool
        returned: always
        sample: false
      status:
        description: V(active), V(passive) or V(off); null when absent.
        type: str
        returned: always
        sample: active
      no_turbo:
        description: C(intel_pstate/no_turbo) as a bool; null when absent.
        type: bool
        returned: always
        sample: false
  per_cpu:
    description: Per CPU number (string), its C(governor) and C(epp).
    type: dict
    returned: when O(detail=true)
    sample: {"0": {governor: performance, epp: performance}}
"""


# --- verification: the rows of this family's settings ---


def _pstate_mode(family, cf):
    if family == "amd-pstate":
        return (cf.get("amd_pstate") or {}).get("status")
    if family == "intel_pstate":
        return (cf.get("intel_pstate") or {}).get("status")
    return None


def _cpufreq_running(cf):
    """The running cpufreq state of the facts, as ``applicability`` takes it."""
    amd, intel = cf.get("amd_pstate") or {}, cf.get("intel_pstate") or {}
    return dict(driver=cf.get("driver"), amd_status=amd.get("status"), intel_status=intel.get("status"),
                epp=(cf.get("epp") or {}).get("value") is not None or bool(cf.get("available_epp")),
                boost=cf.get("boost") is not None or intel.get("no_turbo") is not None)


def read(node: Node, selector: Any = None, query: contract.FactsQuery | None = None) -> dict:
    """The family's facts (``facts["cpufreq"]``): driver, governor, EPP, boost (aggregated over the online CPUs),
    amd_pstate and intel_pstate state; per CPU only with ``query.detail``."""
    query = query or contract.FactsQuery(cpus=tuple(online_cpus(node)))
    cpus, detail = list(query.cpus), query.detail
    base = node.path(SYSFS_CPU)
    governors = {}
    epps = {}
    driver = None
    available_governors = available_epp = None
    for cpu in cpus:
        d = "%s/cpu%d/cpufreq/" % (base, cpu)
        governors[cpu] = read_small(d + "scaling_governor")
        epps[cpu] = read_small(d + "energy_performance_preference")
        if driver is None and governors[cpu] is not None:
            # One cpufreq driver serves the whole system: read it (and the choices) once.
            driver = read_small(d + "scaling_driver")
            available_governors = (read_small(d + "scaling_available_governors") or "").split()
            available_epp = (read_small(d + "energy_performance_available_preferences") or "").split()
    boost = read_small(os.path.join(base, "cpufreq", "boost"))
    amd_status = read_small(os.path.join(base, "amd_pstate", "status"))
    intel_status = read_small(os.path.join(base, "intel_pstate", "status"))
    no_turbo = read_small(os.path.join(base, "intel_pstate", "no_turbo"))
    result = {
        "supported": driver is not None,
        "driver": driver,
        "cpus_with_policy": sum(1 for v in governors.values() if v is not None),
        "governor": aggregate(governors),
        "epp": aggregate(epps),
        "boost": None if boost is None else boost.strip() == "1",
        "available_governors": available_governors or [],
        "available_epp": available_epp or [],
        "amd_pstate": {"present": amd_status is not None, "status": amd_status},
        "intel_pstate": {"present": intel_status is not None, "status": intel_status,
                         "no_turbo": None if no_turbo is None else no_turbo == "1"},
    }
    if detail:
        result["per_cpu"] = {str(cpu): {"governor": governors[cpu], "epp": epps[cpu]} for cpu in cpus}
    return result


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """Driver (and pstate mode), governor, EPP and boost of ``desired['cpufreq']``.

    Which settings apply is decided as cpu_freq decides it (``applicability``): driver=native
    on a CPU without a vendor pstate driver keeps the running driver, and a knob for another driver
    (amd_pstate_mode with acpi-cpufreq wanted, EPP or boost without the files) is not_applicable
    with the module's reason.
    """
    desired = desired.get(NAME) or {}
    cf = facts.get(NAME) or {}
    vendor = (facts.get("cpu") or {}).get("vendor")
    wanted = [(k, desired.get(k)) for k in ("governor", "epp", "boost") if desired.get(k) is not None]
    if not desired.get("driver") and not wanted:
        return []
    if not cf.get("supported"):
        why = "no cpufreq driver: the CPUs have no frequency scaling (virtual machine, or disabled in the BIOS)"
        family = resolve_driver(desired.get("driver"), vendor) or desired.get("driver")
        out = [setting_row(NAME, "driver", family, None, "not_applicable", why)] if family else []
        return out + [setting_row(NAME, k, v, None, "not_applicable", why) for k, v in wanted]
    family, reasons = applicability(desired, vendor, _cpufreq_running(cf))
    out = []
    driver_state = None
    if "driver" in reasons:
        driver_state = "not_applicable"
        out.append(setting_row(NAME, "driver", desired["driver"], cf.get("driver"), driver_state, reasons["driver"]))
    elif family:
        mode_key = {"amd-pstate": "amd_pstate_mode", "intel_pstate": "intel_pstate_status"}.get(family)
        mode = desired.get(mode_key) if mode_key and mode_key not in reasons else None
        out.append(_cpufreq_driver(cf, family, mode, vendor, ctx, facts))
        driver_state = out[-1]["state"]
    for key, want in wanted:
        if key in reasons:
            running = cf.get("boost") if key == "boost" else (cf.get(key) or {}).get("value")
            out.append(setting_row(NAME, key, want, running, "not_applicable", reasons[key],
                                   ctx.boot_persisted(want)))
        else:
            out.append(_cpufreq_setting(cf, key, want, driver_state, family, ctx))
    return out


def _cpufreq_driver(cf, family, mode, vendor, ctx, facts=None):
    """The driver row: the wanted family (and pstate mode) against the running driver and the boot configuration."""
    running_driver = cf.get("driver")
    want_text = "%s (%s)" % (family, mode) if mode else family
    running_mode = _pstate_mode(family, cf)
    running_text = "%s (%s)" % (running_driver, running_mode) if running_mode else running_driver
    row = (want_text, running_text)
    need_vendor = PSTATE_VENDOR.get(family)
    if vendor and vendor.startswith(ARM64_VENDOR) and driver_family(running_driver) != family:
        return setting_row(NAME, "driver", *row, "not_applicable",
                           "%s exists on x86 CPUs only; this node's CPU is %s" % (family, vendor))
    if need_vendor and vendor and vendor != need_vendor:
        return setting_row(NAME, "driver", *row, "not_applicable",
                           "%s needs a %s CPU; this node has %s" % (family, need_vendor, vendor))
    if driver_family(running_driver) == family:
        # What the next boot keeps: this driver's arguments that are configured.
        args = driver_kernel_args(family, mode, vendor, running_driver).removable
        persisted = " ".join(a for a in args if ctx.arg(a)["configured"]) or None
        if not mode or not running_mode or running_mode == mode:
            return setting_row(NAME, "driver", *row, "applied", "", persisted)
        return setting_row(NAME, "driver", *row, "drifted",
                           "%s runs in %s mode; the mode can be switched at runtime (tune --tags runtime)"
                           % (family, running_mode), persisted)
    unfit = _unfit_row(row, family, mode, vendor, running_driver, ctx, facts or {})
    return unfit or _driver_switch_row(row, family, mode, vendor, running_driver, ctx)


def _unfit_row(row, family, mode, vendor, running_driver, ctx, facts):
    """The driver row of a node that cannot boot into amd-pstate, or loads it by itself (``platform``): unsupported
    with the cause; drifted when the argument is on the running command line (a reboot that did not bring it)."""
    if family != "amd-pstate":
        return None
    cmdline = (facts.get("kernel") or {}).get("cmdline_args") or []
    feasible = fit.amd_pstate_feasibility(facts.get("platform"), mode, cmdline)
    if feasible["ok"] and not feasible["default"]:
        return None
    args = driver_kernel_args(family, mode, vendor, running_driver).needed
    if args and all(ctx.arg(a)["running"] for a in args):
        out = setting_row(NAME, "driver", *row, "drifted", "%s is on the running command line but %s serves the "
                          "CPUs: %s" % (" ".join(args), running_driver, feasible["reason"]), None)
    else:
        out = setting_row(NAME, "driver", *row, "unsupported", feasible["reason"], None)
    return dict(out, fit=True)


def _driver_switch_row(row, family, mode, vendor, running_driver, ctx):
    """The driver row when another driver family runs: pending_reboot when the switch's arguments are configured."""
    args = driver_kernel_args(family, mode, vendor, running_driver).needed
    views = [ctx.arg(a) for a in args]
    persisted = " ".join(args) if args and all(v["configured"] for v in views) else None
    text = " ".join(args)
    if args and persisted and not all(v["running"] for v in views):
        return setting_row(NAME, "driver", *row, "pending_reboot",
                           "%s is configured for the next boot; %s runs until the reboot" % (text, running_driver),
                           persisted)
    if args and all(v["running"] for v in views):
        why = "%s is on the running command line but %s serves the CPUs: %s" % (
            text, running_driver, _switch_failed_hint(family))
        return setting_row(NAME, "driver", *row, "drifted", why, persisted)
    why = ("%s runs and %s is not configured for the next boot (tune --tags persistent adds it; a "
           "reboot switches the driver)" % (running_driver, text)) if args else \
        "%s runs; switching to %s needs its pstate driver disabled on the kernel command line" % (
            running_driver, family)
    if ctx.cmdline_error:
        why += "; the boot configuration could not be read: %s" % ctx.cmdline_error
    return setting_row(NAME, "driver", *row, "drifted", why, persisted)


def _switch_failed_hint(family):
    """Why a driver argument on the running command line did not bring the driver."""
    if family == "acpi-cpufreq":
        return "the kernel has no acpi-cpufreq, or the platform offers no ACPI P-states (_PSS)"
    return ("CPPC is off in the BIOS or the kernel lacks the driver (look for '_CPC object is not present')"
            if family == "amd-pstate" else "the kernel lacks the driver or the CPU has no HWP/P-state support")


def _cpufreq_setting(cf, key, want, driver_state, family, ctx):
    persisted = ctx.boot_persisted(want)
    if key == "boost":
        running = cf.get("boost")
        no_turbo = (cf.get("intel_pstate") or {}).get("no_turbo")
        if running is None and no_turbo is not None:
            running = not no_turbo
        if running is None:
            why = "driver %s has no boost control (cpufreq/boost, intel_pstate/no_turbo)" % cf.get("driver")
            return setting_row(NAME, key, want, None, "unsupported", why, persisted)
        state = "applied" if bool(running) == bool(want) else "drifted"
        return setting_row(NAME, key, want, running, state, "", persisted)
    agg = cf.get(key) or {}
    running = agg.get("value")
    values = agg.get("cpulists") or {}
    shown = running if len(values) <= 1 else ", ".join("%s on %s" % (v, c) for v, c in values.items())
    available = cf.get("available_governors" if key == "governor" else "available_epp") or []
    after_reboot = "the driver switch pending a reboot brings %s" % key
    if running is None or (available and want not in available):
        if driver_state == "pending_reboot":
            return setting_row(NAME, key, want, shown, "pending_reboot", after_reboot, persisted)
        if driver_state == "drifted":
            why = "%s does not offer %s=%s; it needs the %s driver" % (cf.get("driver"), key, want, family)
            return setting_row(NAME, key, want, shown, "drifted", why, persisted)
        what = "offers no EPP" if key == "epp" and running is None else \
            "does not offer %s (available: %s)" % (want, ", ".join(available) or "none")
        return setting_row(NAME, key, want, shown, "unsupported", "driver %s %s" % (cf.get("driver"), what),
                           persisted)
    if running == want and not agg.get("cpus_differing"):
        return setting_row(NAME, key, want, shown, "applied", "", persisted)
    return setting_row(NAME, key, want, shown, "drifted",
                       "%d CPUs differ" % agg.get("cpus_differing") if agg.get("cpus_differing") else "", persisted)


def _driver_switch(row: dict, cf: dict) -> bool:
    """Whether a driver row wants another driver family than the running one."""
    wanted = str(row.get("desired") or "").split(" ", maxsplit=1)[0]  # "amd-pstate (active)" -> amd-pstate
    return bool(wanted) and wanted != driver_family(cf.get("driver"))


def _offered(cf: dict, key: str, want: Any) -> bool:
    """Whether the running cpufreq driver offers ``key`` = ``want`` (governor or EPP)."""
    available = cf.get("available_governors" if key == "governor" else "available_epp") or []
    return (cf.get(key) or {}).get("value") is not None and (not available or want in available)


def runtime(row: dict, facts: dict, rows: list) -> bool:
    """Whether runtime tuning can bring a row: not a switch to another driver (only the persistent flow's
    kernel argument and a reboot do), nor a governor or EPP value that only the wanted driver offers.
    A mode switch within the running pstate driver is runtime work."""
    cf = facts.get(NAME) or {}
    if row["name"] == "driver":
        return not _driver_switch(row, cf)
    if row["name"] in ("governor", "epp") and any(r["name"] == "driver" and _driver_switch(r, cf) for r in rows):
        return _offered(cf, row["name"], row["desired"])
    return True


def drifted_cpus(row: dict, online: int) -> int | None:
    """The guard's count of CPUs a governor or EPP row is wrong on (0 when applied).

    Mixed values read "performance on 0-5,8, schedutil on 6-7": the CPUs of the other values.
    """
    if row["name"] not in ("governor", "epp") or row["state"] not in ("drifted", "applied"):
        return None
    if row["state"] == "applied":
        return 0
    pairs = [part.split(" on ", 1) for part in str(row.get("running") or "").split(", ") if " on " in part]
    if not pairs:
        return online
    return sum(len(parse_cpulist(cpus)) for value, cpus in pairs if value != str(row.get("desired")))


def reads_boot_config(desired: dict) -> bool:
    """A driver is judged against the kernel argument configured for the next boot (pending_reboot)."""
    return bool((desired.get(NAME) or {}).get("driver"))
