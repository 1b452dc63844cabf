# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side use of module_utils/validate.py for role variables that reach a file directly.

Where no module of the collection sees a value before the role writes it (the boot script, the
boot unit and the udev rule are rendered by templates), the role asserts that
``validation_error`` finds nothing wrong first: the validators the modules use, and a message
that names the variable. The templates then render what ``validated`` returns, the value as the
validator normalized it (a PCI address as sysfs names it, a cpulist as its CPU numbers), so a
template never needs its own parsing. Documented in validation_error.yml and validated.yml.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.module_utils import validate

KINDS = {
    "systemd_unit_names": validate.systemd_unit_names,
    "absolute_path": validate.absolute_path,
    "cstate_names": validate.cstate_names,
    "cpulist": validate.cpulist,
    "pci_addresses": validate.pci_addresses,
    "pci_id": validate.pci_id,
    "pci_class_prefixes": validate.pci_class_prefixes,
    "sysfs_word": validate.sysfs_word,
}


def _check(value, kind, variable, optional):
    """(normalized value, "") or (None, message naming ``variable``); None or "" passes when ``optional``."""
    if kind not in KINDS:
        raise AnsibleFilterError("gpunode.tuning: kind must be one of: %s (got %r)" % (", ".join(sorted(KINDS)), kind))
    if optional and (value is None or value == ""):
        return value, ""
    try:
        return KINDS[kind](value), ""
    except validate.ValidationError as exc:
        return None, "%s: %s" % (variable, exc)


def validation_error(value, kind, variable, optional=False):
    """The message naming ``variable`` and what is allowed when validator ``kind`` refuses ``value``, else ""."""
    return _check(value, kind, variable, optional)[1]


def validated(value, kind, variable, optional=False):
    """``value`` as validator ``kind`` normalizes it; a refused value fails the template naming ``variable``."""
    out, problem = _check(value, kind, variable, optional)
    if problem:
        raise AnsibleFilterError(problem)
    return out


class FilterModule:
    """gpunode.tuning validation filters."""

    def filters(self):
        return {"validation_error": validation_error, "validated": validated}
