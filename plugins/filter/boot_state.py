# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot re-apply's inputs: its desired state (the role's, reduced to the families with a boot step)
and the code it carries (the collection's module_utils, ``boot_sources``).

Which families re-apply at boot is the registry's (module_utils/families.py), so the role writes one
desired state per family and never lists them again. Documented in boot_state.yml next to this file.
"""

from __future__ import annotations

import os
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


def boot_sources(module_utils_dir):
    """``{name: source}`` of every ``*.py`` in ``module_utils_dir``: the code the boot runner carries."""
    try:
        names = sorted(n for n in os.listdir(module_utils_dir) if n.endswith(".py"))
        out = {}
        for name in names:
            with open(os.path.join(module_utils_dir, name), encoding="utf-8") as fh:
                out[name[:-3]] = fh.read()
    except OSError as exc:
        raise AnsibleFilterError("gpunode.tuning.boot_sources: cannot read %s: %s" % (module_utils_dir, exc)) from exc
    if "boot" not in out:
        raise AnsibleFilterError("gpunode.tuning.boot_sources: %s has no boot.py: not the collection's module_utils"
                                 % module_utils_dir)
    return out


class FilterModule:
    """gpunode.tuning boot filters."""

    def filters(self):
        return {"boot_state": boot_state, "boot_sources": boot_sources}
