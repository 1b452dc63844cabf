# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The C-states family's verification half: its facts (the idle states and on how many CPUs each is disabled)
and the rows of its settings (cpuidle.py is the family; a run that only applies never imports this file).
"""

from __future__ import annotations

import os
import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.facts import int_or_none
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import setting
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    SYSFS_CPU,
    Node,
    format_cpulist,
    online_cpus,
    parse_cpulist,
    read_small,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.families.cpuidle import NAME

# The CPUs a state row's reason names as wrong: "...; not disabled on CPUs 0-5,8".
_ON_CPUS = re.compile(r"on CPUs ([0-9][0-9,-]*)")


# tuning_info's RETURN of tuning_facts.cpuidle (tools/generate.py writes it there).
FACTS_DOC = r"""
description: CPU idle states (C-states) of the online CPUs.
returned: always
type: dict
contains:
  supported:
    description: True when a cpuidle driver is active and has states.
    type: bool
    returned: always
    sample: true
  driver:
    description: The cpuidle driver (C(acpi_idle), C(intel_idle), C(haltpoll)); null when none.
    type: str
    returned: always
    sample: acpi_idle
  governor:
    description: The cpuidle governor; null when none.
    type: str
    returned: always
    sample: menu
  states:
    description:
      - Per state name (C(POLL), C(C1), C(C2), ...), as the first online CPU lists them.
      - Each value has C(index), C(latency) (exit latency, microseconds), C(residency) (microseconds),
        C(disabled_cpus) (on how many online CPUs the state is disabled), C(disabled_cpulist),
        C(enabled_cpus), C(missing_cpus) (online CPUs without the state), and with O(detail=true)
        C(per_cpu), a dict by CPU number (string) of C(disabled) (bool), C(usage) and C(time) (int).
    type: dict
    returned: always
    sample:
      C2: {index: 2, latency: 400, residency: 800, disabled_cpus: 128, disabled_cpulist: 0-127,
           enabled_cpus: 0, missing_cpus: 0}
"""


def _state_desired(states, names, max_latency):
    """State name -> "disabled"/"enabled" as cpu_cstate plans it (by name, else by latency bound)."""
    if names:
        return {n: "disabled" for n in names}
    out = {}
    for name, st in states.items():
        above = (st.get("latency") or 0) > max_latency and name != "POLL"
        out[name] = "disabled" if above else "enabled"
    return out


def read(node: Node, selector: Any = None, query: contract.FactsQuery | None = None) -> dict:
    """The family's facts (``facts["cpuidle"]``): driver and, per state name, latency and on how many CPUs it is
    disabled, aggregated (per CPU only with ``query.detail``).

    The state index -> name mapping is read from the first online CPU only (cpuidle drivers register one
    state table for all CPUs); per CPU only the ``disable`` attribute is read: one open per CPU and state.
    """
    query = query or contract.FactsQuery(cpus=tuple(online_cpus(node)))
    cpus, detail = list(query.cpus), query.detail
    base = node.path(SYSFS_CPU)
    driver = read_small(os.path.join(base, "cpuidle", "current_driver"))
    governor = read_small(os.path.join(base, "cpuidle", "current_governor"))
    driver = None if driver in (None, "", "none") else driver
    governor = None if governor in (None, "", "none") else governor
    states = {}
    result = {"supported": False, "driver": driver, "governor": governor, "states": states}
    if not cpus:
        return result
    first = os.path.join(base, "cpu%d" % cpus[0], "cpuidle")
    table = []
    for entry in node.listdir(SYSFS_CPU, "cpu%d" % cpus[0], "cpuidle"):
        if entry.startswith("state") and entry[5:].isdigit():
            d = os.path.join(first, entry)
            name = read_small(os.path.join(d, "name"))
            if name:
                table.append((int(entry[5:]), entry, name, int_or_none(read_small(os.path.join(d, "latency"))),
                              int_or_none(read_small(os.path.join(d, "residency")))))
    table.sort()
    for index, entry, name, latency, residency in table:
        disabled = []
        missing = 0
        per_cpu = {} if detail else None
        for cpu in cpus:
            d = "%s/cpu%d/cpuidle/%s/" % (base, cpu, entry)
            value = read_small(d + "disable")
            if value is None:
                missing += 1
            elif value != "0":
                disabled.append(cpu)
            if detail:
                per_cpu[str(cpu)] = {
                    "disabled": None if value is None else value != "0",
                    "usage": int_or_none(read_small(d + "usage")),
                    "time": int_or_none(read_small(d + "time")),
                }
        state = {
            "index": index,
            "latency": latency,
            "residency": residency,
            "disabled_cpus": len(disabled),
            "disabled_cpulist": format_cpulist(disabled),
            "enabled_cpus": len(cpus) - len(disabled) - missing,
            "missing_cpus": missing,
        }
        if detail:
            state["per_cpu"] = per_cpu
        states[name] = state
    result["supported"] = bool(driver and states)
    return result


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """One setting per idle state ``desired['cpuidle']`` names (by name, or every state for a bound)."""
    desired = desired.get(NAME) or {}
    idle = facts.get(NAME) or {}
    names = list(desired.get("disable") or [])
    bound = desired.get("max_latency_us")
    if not names and bound is None:
        return []
    label = ", ".join(names) if names else "exit latency above %s us" % bound
    if not idle.get("supported"):
        why = ("no cpuidle driver" if not idle.get("driver")
               else "cpuidle driver %s has no states" % idle.get("driver"))
        return [setting(NAME, "states", "disabled: %s" % label, None, "not_applicable",
                        "%s (virtual machine or idle=poll)" % why)]
    states = idle.get("states") or {}
    online = parse_cpulist(((facts.get("cpu") or {}).get("online")) or "")
    wanted_cpus = set(parse_cpulist(desired.get("cpus") or "")) or set(online)
    wanted_cpus &= set(online) or wanted_cpus
    plan = _state_desired(states, names, bound)
    out = []
    for name, want in plan.items():
        st = states.get(name)
        if st is None:
            out.append(setting(NAME, name, want, None, "not_applicable",
                               "driver %s has no state %s (states: %s)"
                               % (idle.get("driver"), name, ", ".join(states) or "none")))
            continue
        disabled = set(parse_cpulist(st.get("disabled_cpulist") or ""))
        wrong = sorted(wanted_cpus - disabled) if want == "disabled" else sorted(wanted_cpus & disabled)
        total = len(wanted_cpus)
        running = ("disabled on %d/%d CPUs" % (len(disabled & wanted_cpus), total)) if disabled & wanted_cpus \
            else "enabled on %d CPUs" % total
        persisted = ctx.boot_persisted(want)
        why = "latency %s us" % st.get("latency")
        if not wrong:
            out.append(setting(NAME, name, want, running, "applied", why, persisted))
        else:
            out.append(setting(NAME, name, want, running, "drifted",
                               "%s; not %s on CPUs %s" % (why, want, format_cpulist(wrong)), persisted))
    return out


def drifted_cpus(row: dict, online: int) -> int | None:
    """The guard's count of CPUs a state row is wrong on: those its reason names (0 when applied)."""
    if row["name"] == "states" or row["state"] not in ("drifted", "applied"):
        return None
    if row["state"] == "applied":
        return 0
    m = _ON_CPUS.search(row.get("reason") or "")
    return len(parse_cpulist(m.group(1))) if m else online
