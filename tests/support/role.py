# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's variables as a test needs them: a preset's values checked as the precheck checks them, and values
marked as Ansible marks the role's files and the inventory."""

from __future__ import annotations

import os

import yaml

from ansible_collections.gpunode.tuning.plugins.plugin_utils import ansible_compat, role_variables
from support.checkout import REPO


def preset_values(preset="inference-throughput", **overrides):
    """The role's variables as the precheck validates them: defaults, the preset's values, the overrides."""
    with open(os.path.join(REPO, "roles", "tuning", "defaults", "main.yml"), encoding="utf-8") as handle:
        defaults = yaml.safe_load(handle)
    with open(os.path.join(REPO, "roles", "tuning", "vars", "main.yml"), encoding="utf-8") as handle:
        presets = yaml.safe_load(handle)["__gpunode_tuning_presets"][preset]
    values = {}
    for name, value in defaults.items():
        if isinstance(value, str) and "__gpunode_tuning_preset_values." in value:
            key = value.split("__gpunode_tuning_preset_values.")[1].split()[0].rstrip("}")
            value = presets.get(key, "unmanaged" if key == "acs" else None)
        values[name] = value
    values.update(overrides)
    validated, errors, _warnings = role_variables.check(values, ["verify"])
    assert errors == []
    return validated


def trusted(value):
    """``value`` as the role's defaults and the inventory hold it: every string a template Ansible may render
    (marked trusted from 2.19; every string is one before)."""
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return ansible_compat.trust_as_template(value) if isinstance(value, str) else value
