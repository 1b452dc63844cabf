# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side view of the cpufreq driver -> kernel argument mapping of module_utils/cpufreq.py.

The rollback entry point uses it to remove exactly what the persistent entry point may have
configured for a cpufreq driver (cpu_freq plans those arguments with the same mapping).
Documented in cpufreq_driver_args.yml next to this file.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.module_utils import cpufreq


def cpufreq_driver_args(driver, amd_pstate_mode=None):
    """Every kernel argument the persistent flow may configure for the desired ``driver`` (``removable``)."""
    if driver in (None, ""):
        return []
    if driver not in cpufreq.DRIVER_FAMILIES:  # the choices of cpu_freq's driver option
        raise AnsibleFilterError("gpunode.tuning.cpufreq_driver_args: driver must be one of: %s (got %r)"
                                 % (", ".join(cpufreq.DRIVER_FAMILIES), driver))
    return cpufreq.driver_kernel_args(driver, amd_pstate_mode).removable


class FilterModule:
    """gpunode.tuning cpufreq filters."""

    def filters(self):
        return {"cpufreq_driver_args": cpufreq_driver_args}
