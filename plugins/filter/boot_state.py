# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot re-apply's desired state: the role's desired state, reduced to the families with a boot step.

Which families re-apply at boot is the registry's (module_utils/families.py), so the role writes one
desired state per family and never lists them again. Documented in boot_state.yml next to this file.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.module_utils import boot


def boot_state(desired):
    """``{"version": N, KEY: WANT...}`` for each boot family whose desired value is set (not null or empty)."""
    if not isinstance(desired, Mapping):
        raise AnsibleFilterError("gpunode.tuning.boot_state: expects the desired state (a mapping of family to "
                                 "desired value), got %s" % type(desired).__name__)
    try:
        return boot.boot_state(dict(desired))
    except boot.BootError as exc:
        raise AnsibleFilterError("gpunode.tuning.boot_state: %s" % exc) from exc


class FilterModule:
    """gpunode.tuning boot filters."""

    def filters(self):
        return {"boot_state": boot_state}
