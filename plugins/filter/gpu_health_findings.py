# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side view of verification's health verdict: the findings that make a host unhealthy.

For a rollout's health gate (a canary with a sick GPU is not tuned): the failing rows of the health
families (``Family.health``), module_utils/flows/verification.py's ``health_findings``. Documented in
gpu_health_findings.yml next to this file.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification


def gpu_health_findings(result):
    """``"<row id>: <reason>"`` per failing or reset-pending row of a health family in a verification result."""
    try:
        return verification.health_findings(result)
    except family.EvaluationError as exc:
        raise AnsibleFilterError("gpunode.tuning.gpu_health_findings: %s" % exc) from None


class FilterModule:
    """gpunode.tuning GPU health filters."""

    def filters(self):
        return {"gpu_health_findings": gpu_health_findings}
