# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cpuidle family's plan half: what the controller calls (the desired state from the role's variables, its
validation, the module's options) and what the persistent flow asks of it.

Imported when one of them is first called (``family.later`` in families/cpuidle.py), never by a run that only
applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.module_utils.families.cpuidle import NAME


def from_role(v: dict, shared: dict) -> dict:
    """States to disable by name, else by the exit-latency bound, on the selected CPUs."""
    if not v["gpunode_tuning_cpuidle_enabled"]:
        return {NAME: None}
    names = v["gpunode_tuning_cpuidle_disable"] or []
    latency = v["gpunode_tuning_cpuidle_max_latency_us"]
    return {NAME: {"disable": names, "max_latency_us": None if names or latency is None else int(latency),
                   "cpus": v["gpunode_tuning_cpuidle_cpus"] or None}}


def runtime_options(desired: dict, v: dict) -> dict | None:
    """cpu_cstate's options: by name when states are listed, otherwise by latency; None when neither."""
    want = desired.get(NAME)
    if not want or not (want["disable"] or want["max_latency_us"] is not None):
        return None
    out = {"disable": want["disable"]} if want["disable"] else {"max_latency_us": want["max_latency_us"]}
    if want["cpus"]:
        out["cpus"] = want["cpus"]
    return out


def restore_options(v: dict) -> dict:
    return {"restore": True}
