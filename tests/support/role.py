# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's variables as a test needs them: a preset's values checked as the precheck checks them."""

from __future__ import annotations

import os

import yaml

from ansible_collections.gpunode.tuning.plugins.plugin_utils import role_variables
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
