# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side view of module_utils/families/gpu_health.py's verdict: the findings that make a host unhealthy.

For a rollout's health gate (a canary with a sick GPU is not tuned). Documented in
gpu_health_findings.yml next to this file.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_health


def gpu_health_findings(result):
    """``"<row id>: <reason>"`` per failing or reset-pending gpu_health row of a verification result."""
    try:
        return gpu_health.health_findings(result)
    except family.EvaluationError as exc:
        raise AnsibleFilterError("gpunode.tuning.gpu_health_findings: %s" % exc) from None


class FilterModule:
    """gpunode.tuning GPU health filters."""

    def filters(self):
        return {"gpu_health_findings": gpu_health_findings}
