# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Moved to plugin_utils/drain/kubernetes.py (issue 41: the drain backends live in one package); this name stays
for the callers that import it."""

from __future__ import annotations

# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.kubernetes import (  # noqa: F401
    ANNOTATION,
    MISSING,
    KubernetesBackend,
    _status_text,
)
