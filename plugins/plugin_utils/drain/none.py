# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``none`` drain backend: hosts reboot with their work on them; out of service is what the records say."""

from __future__ import annotations

from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain import Backend


class NoneBackend(Backend):
    """No drain (the interface's own answers)."""

    name = "none"
