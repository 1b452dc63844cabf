# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cpuidle family's restore half: plan writing the journaled originals back (cpu_cstate with restore=true).

Imported by ``run`` only when it restores, so that a run that applies does not compile it
(docs/dev/adding-a-family.md, "The restore half").
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import Journal
from ansible_collections.gpunode.tuning.plugins.module_utils.families.cpuidle import (
    DISABLED,
    ENABLED,
    NAME,
    read_states,
)


def restore_plan(node, journal, states_by_cpu):
    """Plan writing back the journaled originals."""
    entries = journal.entries(NAME)
    per_cpu = {name: Journal.per_cpu(original) for name, original in entries.items()}
    cpus = sorted({cpu for values in per_cpu.values() for cpu in values})
    missing = [c for c in cpus if c not in states_by_cpu]
    states = dict((c, states_by_cpu[c]) for c in cpus if c in states_by_cpu)
    if missing:
        states.update(read_states(node, missing))
    plan = {}
    lost = {}
    for name, values in per_cpu.items():
        for cpu, value in values.items():
            if name in states.get(cpu, {}):
                plan[(cpu, name)] = DISABLED if value == "1" else ENABLED
            else:
                lost.setdefault(name, {})[cpu] = "cpu%d has no idle state %s any more (offline?)" % (cpu, name)
    return plan, states, lost
