# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cpufreq family's restore half: write the journaled originals back (cpu_freq with restore=true).

Imported by ``run`` only when it restores, so that a run that applies does not compile it
(docs/dev/adding-a-family.md, "The restore half").
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu_freq import (
    AMD_PSTATE_STATUS,
    BOOST,
    INTEL_NO_TURBO,
    INTEL_PSTATE_STATUS,
    MODE_SETTINGS,
    boost_value,
    group_by_value,
    per_cpu,
    read_policies,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import Journal
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import NodeError, format_cpulist
from ansible_collections.gpunode.tuning.plugins.module_utils.families.cpufreq import (
    NAME,
    Outcome,
    cpu_setting,
    node_setting,
    note_errors,
    policy_writes,
    predict_writes,
    writable_phases,
    write_policies,
    write_refused,
    write_value,
)


def restore(call, node, journal, freq):
    """Write back the journaled originals: driver mode first, then governor, EPP, boost."""
    entries = journal.entries(NAME)
    outcome = Outcome()
    check = call.check_mode
    changed = False
    for key in MODE_SETTINGS:
        if key in entries:
            changed |= restore_mode(node, freq, key, entries[key], outcome, check)
    changed |= restore_policies(node, freq, entries, outcome, check)
    if "boost" in entries:
        changed |= restore_boost(node, freq, bool(entries["boost"]), outcome, check)
    if not check:
        keep_failed(journal, entries, outcome)
        if changed:
            journal.mark_applied(NAME)
        journal.save()
    return outcome, changed


def restore_mode(node, freq, key, original, outcome, check):
    amd = key == "amd_pstate_mode"
    path = AMD_PSTATE_STATUS if amd else INTEL_PSTATE_STATUS
    current = after = freq.amd_status if amd else freq.intel_status
    if original == current:
        outcome.settings[key] = node_setting(original, current, after, None)
        return False
    if not node.exists(path):
        outcome.fail(key, "/%s is gone; cannot restore %s" % (path, original))
    elif check:
        after = current if write_refused(node, outcome, key, path) else original
    else:
        try:
            write_value(node, path, original)
        except NodeError as exc:
            outcome.fail(key, str(exc))
        freq.refresh()
        after = freq.amd_status if amd else freq.intel_status
    outcome.settings[key] = node_setting(original, current, after, None)
    return True


def restore_policies(node, freq, entries, outcome, check):
    """Governor and EPP of every journaled CPU, per policy, in the order the driver accepts."""
    originals = {key: Journal.per_cpu(entries[key]) for key in ("governor", "epp") if key in entries}
    if not originals:
        return False
    targets = {}
    gov, epp = originals.get("governor", {}), originals.get("epp", {})
    for p in freq.policies:
        g = next((gov[c] for c in p.cpus if c in gov), None)
        e = next((epp[c] for c in p.cpus if c in epp), None)
        if g is not None or e is not None:
            targets[p.name] = (g, e)
    covered = {cpu for p in freq.policies for cpu in p.cpus}
    for key, values in originals.items():
        gone = sorted(set(values) - covered)
        if gone:
            outcome.fail(key, "CPUs %s have no cpufreq policy (offline, or the driver went away)"
                         % format_cpulist(gone), gone)
    before = {key: per_cpu(freq.policies, key) for key in originals}
    phases, errors = policy_writes(freq, None, None, targets)
    note_errors(outcome, errors)
    changed = bool(phases["governor"] or phases["epp"])
    if changed and check:
        predicted = predict_writes(freq, writable_phases(node, phases, outcome))
    else:
        if changed:
            write_policies(node, phases, outcome)
            freq.policies = read_policies(node)
        predicted = {key: per_cpu(freq.policies, key) for key in ("governor", "epp")}
    for key, values in originals.items():
        outcome.settings[key] = cpu_setting(group_by_value(values), before[key], predicted[key])
    return changed


def restore_boost(node, freq, original, outcome, check):
    before = after = freq.boost
    changed = False
    if freq.boost_file is None:
        outcome.fail("boost", "neither /%s nor /%s exists; cannot restore boost" % (BOOST, INTEL_NO_TURBO))
    elif before != original:
        changed = True
        if check:
            after = before if write_refused(node, outcome, "boost", freq.boost_file) else original
        else:
            try:
                write_value(node, freq.boost_file, boost_value(freq.boost_file, original))
            except NodeError as exc:
                outcome.fail("boost", str(exc))
            freq.refresh(policies=False)
            after = freq.boost
    outcome.settings["boost"] = node_setting(original, before, after, None)
    return changed


def keep_failed(journal, entries, outcome):
    """Drop the restored entries; keep exactly the failed ones (for governor and EPP, the failed CPUs)."""
    for key, original in entries.items():
        if key not in outcome.settings and key not in outcome.failed:
            continue  # not a setting this version restores: left for whoever wrote it
        if key not in outcome.failed:
            journal.drop(NAME, key)
        elif key in ("governor", "epp") and outcome.failed_cpus.get(key):
            kept = {cpu: v for cpu, v in Journal.per_cpu(original).items() if cpu in outcome.failed_cpus[key]}
            journal.drop(NAME, key)
            journal.record_per_cpu(NAME, key, kept)
