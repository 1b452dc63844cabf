# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard's files for the role: what the persistent flow writes and what rollback removes.

Thin wrappers over module_utils/guard_files.py (pure functions, also what a module on the node can
call); documented in guard_files.yml and guard_removal.yml next to this file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.module_utils import guard_files as files
from ansible_collections.gpunode.tuning.plugins.module_utils.validate import ValidationError

COLLECTION_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def collection_version(directory: str = COLLECTION_DIR) -> str | None:
    """The collection's version: MANIFEST.json of an installed collection, else galaxy.yml of a checkout."""
    try:
        with open(os.path.join(directory, "MANIFEST.json"), encoding="utf-8") as fh:
            return json.load(fh)["collection_info"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        with open(os.path.join(directory, "galaxy.yml"), encoding="utf-8") as fh:
            return str(yaml.safe_load(fh)["version"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def _options(options, name):
    if not isinstance(options, Mapping):
        raise AnsibleFilterError("gpunode.tuning.%s: expects the guard options (a mapping), got %s"
                                 % (name, type(options).__name__))
    out = dict(options)
    if out.get("collection_version") is None:
        out["collection_version"] = collection_version()
    return out


def guard_files(options):
    """``[{path, content, mode}]``: the guard's config, service and timer (node paths)."""
    try:
        return files.installed_files(_options(options, "guard_files"))
    except (ValidationError, KeyError) as exc:
        raise AnsibleFilterError("gpunode.tuning.guard_files: %s; nothing was written" % exc) from exc


def guard_removal(options):
    """``{paths, dirs, temp_patterns}``: every file of the guard, the directories to remove when empty."""
    try:
        opts = _options(options, "guard_removal")
        return {"paths": files.removal_paths(opts), "dirs": files.removal_dirs(opts),
                "temp_patterns": files.temp_patterns()}
    except (ValidationError, KeyError) as exc:
        raise AnsibleFilterError("gpunode.tuning.guard_removal: %s" % exc) from exc


class FilterModule:
    """gpunode.tuning guard filters."""

    def filters(self):
        return {"guard_files": guard_files, "guard_removal": guard_removal}
