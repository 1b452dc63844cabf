# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU health findings for verification: a read-only family (``gpu_health``), evaluate only.

What is judged, and how severely, is in its verification half, gpu_health_verify.py (read, evaluate, report):
this file is what the runs that do not verify need of it (its desired state and the rollout gate's findings).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    family,  # noqa: E402
    )
from ansible_collections.gpunode.tuning.plugins.module_utils.core import fitness as fit

NAME = "gpu_health"
AER_RATE = "aer_correctable_per_hour"  # correctable AER errors per hour above which a device fails (core/aer.py)


# -- nvidia-smi health fields (a node with nvidia-smi)


# -- The family


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["gpu_health"]``: ``{gpu_count: int >= 1 or None, dcgm_diag: bool}``."""
    if want is None:
        return []
    if not isinstance(want, dict):
        return [("", "gpu_health must be a mapping with the keys gpu_count, dcgm_diag, got %r" % (want,))]
    unknown = sorted(set(want) - {"gpu_count", "dcgm_diag", "floors", AER_RATE}, key=str)
    out = [("", "gpu_health: unknown key(s) %s; allowed: gpu_count, dcgm_diag, floors, %s"
            % (", ".join(map(str, unknown)), AER_RATE))] if unknown else []
    rate = want.get(AER_RATE)
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1e308):
        out.append((AER_RATE, "gpu_health.%s must be a number >= 0 (correctable AER errors per hour) or null, "
                              "got %r" % (AER_RATE, rate)))
    out += [("floors" + ("." + k if k else ""), m) for k, m in fit.floors_problems(want.get("floors"))]
    count = want.get("gpu_count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        out.append(("gpu_count", "gpu_health.gpu_count must be an integer >= 1 or null, got %r" % (count,)))
    if not isinstance(want.get("dcgm_diag", False), bool):
        out.append(("dcgm_diag", "gpu_health.dcgm_diag must be true or false, got %r" % (want["dcgm_diag"],)))
    return out


def validate(want: Any) -> dict:
    """``desired["gpu_health"]``: ``{gpu_count: int >= 1 or None, dcgm_diag: bool}``."""
    problems = desired_problems(want)
    if problems:
        raise family.EvaluationError(family.problems_text(problems))
    want = want or {}
    return {"gpu_count": want.get("gpu_count"), "dcgm_diag": bool(want.get("dcgm_diag")),
            "floors": want.get("floors") or {}, AER_RATE: want.get(AER_RATE)}


# Read-only: no module, nothing to re-apply at boot.
def from_role(v: dict, shared: dict) -> dict:
    count = v.get("gpunode_tuning_gpu_health_count")
    rate = v.get("gpunode_tuning_gpu_health_aer_correctable_per_hour")
    return {NAME: {"gpu_count": None if count is None else int(count),
                   "dcgm_diag": bool(v.get("gpunode_tuning_gpu_health_dcgm_diag", False)),
                   "floors": v.get("gpunode_tuning_floors") or {},
                   AER_RATE: None if rate is None else float(rate)}}


def _verification():
    """The verification half (families/gpu_health_verify.py), imported when verification first calls it."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_health_verify
    return gpu_health_verify


DEFINITION = family.Family(
    name=NAME,
    titles={NAME: "GPU health"},
    read=family.later(_verification, "read"),
    facts_doc=family.later(_verification, "FACTS_DOC"),
    evaluate=family.later(_verification, "evaluate"),
    gpu_commands=family.later(_verification, "gpu_commands"),
    health=True,
    from_role=from_role,
    validate={NAME: desired_problems},
    report=family.later(_verification, "report"),
)


def health_findings(result: dict) -> list:
    """What makes a host unhealthy for a rollout gate: ``"<row id>: <reason>"`` of each gpu_health row
    that fails (drifted) or needs a GPU reset or reboot first (pending_reboot), from a verification result."""
    if not isinstance(result, dict):
        raise family.EvaluationError("health_findings: expected a verification result (dict), got %s"
                                     % type(result).__name__)
    return ["%s: %s" % (s["id"], s.get("reason") or s["state"]) for s in result.get("settings") or []
            if s.get("family") == NAME and s.get("state") in ("drifted", "pending_reboot")]
