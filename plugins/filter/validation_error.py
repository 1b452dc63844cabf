# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side use of module_utils/validate.py for role variables that reach a file directly.

Where no module of the collection sees a value before the role writes it (the boot unit's
Before= list and ExecStart path are rendered by a template), the role asserts that this filter
finds nothing wrong first: the validators the modules use, and a message that names the
variable. Documented in validation_error.yml next to this file.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.module_utils import validate

KINDS = {
    "systemd_unit_names": validate.systemd_unit_names,
    "absolute_path": validate.absolute_path,
}


def validation_error(value, kind, variable):
    """The message naming ``variable`` and what is allowed when validator ``kind`` refuses ``value``, else ""."""
    if kind not in KINDS:
        raise AnsibleFilterError("gpunode.tuning.validation_error: kind must be one of: %s (got %r)"
                                 % (", ".join(sorted(KINDS)), kind))
    try:
        KINDS[kind](value)
    except validate.ValidationError as exc:
        return "%s: %s" % (variable, exc)
    return ""


class FilterModule:
    """gpunode.tuning validation filter."""

    def filters(self):
        return {"validation_error": validation_error}
