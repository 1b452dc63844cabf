# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side filters of the verify entry point; the logic is in module_utils/flows/verification.py.

Each filter is documented in its own file next to this one (verify_fleet.yml, verify_error.yml,
verify_report_dir.yml), as ansible-doc expects for a file with several filters.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification
from ansible_collections.gpunode.tuning.plugins.plugin_utils import reports


def _call(name, func, *args, **kwargs):
    try:
        return func(*args, **kwargs)
    except verification.VerificationError as exc:
        raise AnsibleFilterError("gpunode.tuning.%s: %s" % (name, exc)) from exc


def verify_fleet(results, hosts=None, generated_at=None):
    """Hosts x knob families, failing hosts first."""
    return _call("verify_fleet", verification.fleet_summary, results, hosts, generated_at)


def verify_error(host, message, verified_at=None, gate="full"):
    """The result of a host whose verification could not run."""
    return verification.error_result(host, str(message), verified_at, gate)


def verify_report_dir(path):
    """The report directory as an absolute path (plugin_utils/reports.py ``absolute_dir``)."""
    try:
        return reports.absolute_dir(path)
    except ValueError as exc:
        raise AnsibleFilterError("gpunode.tuning.verify_report_dir: %s" % exc) from exc


class FilterModule:
    """gpunode.tuning verification filters."""

    def filters(self):
        return {
            "verify_fleet": verify_fleet,
            "verify_error": verify_error,
            "verify_report_dir": verify_report_dir,
        }
