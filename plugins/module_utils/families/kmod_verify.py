# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kmod family's verification half: its facts (``read``, ``FACTS_DOC``, the ``modules`` option) and the rows of
the modules and their parameters.

Imported when verification or tuning_info first calls it (``family.later`` in families/kmod.py), never by a run that
only applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core import module_options, module_params
from ansible_collections.gpunode.tuning.plugins.module_utils.core.facts import FactsError, read_all
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import setting
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, read_small
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import (
    KMOD_NAME_ALLOWED,
    KMOD_NAME_RE,
    sysfs_name,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.families.kmod import MODULE_NEEDS, NAME, param_string
from ansible_collections.gpunode.tuning.plugins.module_utils.families.kmod_plan import options_file

# tuning_info's RETURN of tuning_facts.kmod (tools/generate.py writes it there).
FACTS_DOC = r"""
description: Kernel modules.
returned: always
type: dict
contains:
  loaded:
    description: Names of the loaded (loadable) modules, from C(/proc/modules), sorted.
    type: list
    elements: str
    returned: always
    sample: [mlx5_core, nvidia, nvidia_modeset, nvidia_uvm, nvme]
  boot_id:
    description: The running boot's id (C(/proc/sys/kernel/random/boot_id)), null when unreadable.
    type: str
    returned: always
    sample: 5f0c7a1e-3b2d-4c8e-9a61-0d2b7e4f9c13
  by_name:
    description:
      - Each name of O(modules) -> C(loaded) (bool, C(/sys/module/NAME) exists), C(builtin) (bool, built
        into the kernel), C(parameters) (dict, parameter name -> current value from
        C(/sys/module/NAME/parameters), null when unreadable) and C(options) (the modprobe.d file of this
        collection for the module, with C(params), parameter name -> value, C(boot_id), the boot it was written
        in, and C(overridden), parameter name -> C(value) and C(source) of what a boot sets after it, another
        modprobe.d file or the kernel command line; null without such a file).
    type: dict
    returned: always
    sample: {nvidia_peermem: {loaded: false, builtin: false, parameters: {}, options: null},
             nvidia_uvm: {loaded: true, builtin: false, parameters: {uvm_disable_hmm: "N"},
                          options: {params: {uvm_disable_hmm: "1"}, boot_id: 5f0c7a1e-3b2d-4c8e}}}
"""


# --- facts: what tuning_info reads of this family (facts["kmod"]) ---


def facts_names(names: list[str] | None) -> list[str]:
    """tuning_info's ``modules``, unchanged after checking each is a module name; FactsError otherwise."""
    out = []
    for name in names or []:
        if not isinstance(name, str) or not KMOD_NAME_RE.fullmatch(name):
            raise FactsError("modules: %r is not a module name; allowed: %s" % (name, KMOD_NAME_ALLOWED))
        out.append(name)
    return out


def read(node: Node, selector: Any = None, query: contract.FactsQuery | None = None) -> dict:
    """The family's facts (``facts["kmod"]``): loaded module names (/proc/modules), the boot id and, for each name of
    the ``modules`` option, its state, parameters and the options file of ours (what it sets, which boot wrote it)."""
    names = ((query.options if query else None) or {}).get("modules") or []
    loaded = []
    for line in (read_all(node.path("proc/modules")) or "").splitlines():
        if line.strip():
            loaded.append(line.split(None, 1)[0])
    loaded_set = set(loaded)
    by_name = {}
    for name in names:
        key = sysfs_name(name)
        base = node.path("sys/module", key)
        present = os.path.isdir(base)
        builtin = present and key not in loaded_set and not os.path.exists(os.path.join(base, "initstate"))
        params = {}
        for p in node.listdir("sys/module", key, "parameters"):
            params[p] = read_small(os.path.join(base, "parameters", p))
        text = read_all(node.path(options_file(name))) if os.path.isfile(node.path(options_file(name))) else None
        options = module_options.parse_options(text) if text is not None else None
        if options is not None:
            options["overridden"] = module_options.overriding(node, name, options_file(name))
        by_name[name] = {"loaded": present, "builtin": builtin, "parameters": params, "options": options}
    return {"loaded": sorted(loaded), "boot_id": node.read(module_params.BOOT_ID, default="") or None,
            "by_name": by_name}


def facts_options(desired: dict) -> dict:
    """The desired modules are the names read() reads."""
    return {"modules": [m["name"] for m in (desired.get(NAME) or {}).get("modules") or []]}


# --- verification and boot: the rows of this family's settings, and its re-apply at boot ---


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """One setting per module of ``desired['kmod']['modules']`` (loaded or, for absent, not), and one per parameter
    of a loaded one (``kmod.<module>.<param>``: core/module_params.py's ``judge``)."""
    desired = desired.get(NAME) or {}
    mods = facts.get(NAME) or {}
    by_name = mods.get("by_name") or {}
    loaded_names = set(mods.get("loaded") or [])
    out = []
    for req in desired.get("modules") or []:
        name = req["name"]
        key = name.replace("-", "_")
        info = by_name.get(name) or by_name.get(key) or {}
        loaded = bool(info.get("loaded"))
        present = req.get("state", "present") != "absent"
        want = "loaded" if present else "not loaded"
        running = "loaded" if loaded else "not loaded"
        persisted = ("loaded at boot" if key in ctx.modules_persisted else None) if present else None
        if not present:
            out.append(setting(NAME, name, want, running, "drifted" if loaded else "applied", "", persisted))
        elif loaded:
            out.append(setting(NAME, name, want, running, "applied", "", persisted))
            out += param_rows(name, req.get("params") or {}, info, mods.get("boot_id"))
        elif req.get("required"):
            out.append(setting(NAME, name, want, running, "drifted", "required module is not loaded", persisted))
        elif MODULE_NEEDS.get(key) and MODULE_NEEDS[key][0] not in loaded_names:
            need = MODULE_NEEDS[key]
            out.append(setting(NAME, name, want, running, "not_applicable",
                               "needs %s, which this node does not have (%s not loaded); loading fails with "
                               "'Invalid argument', which is harmless here" % (need[1], need[0]), persisted))
        else:
            out.append(setting(NAME, name, want, running, "not_applicable",
                               "optional module that did not load on this node (kmod_optional reports why)",
                               persisted))
    return out


def param_rows(name: str, params: dict, info: dict, boot_id: str | None) -> list:
    """The rows of a loaded module's requested parameters: applied, pending_reboot (the options line of this boot
    waits for the next), drifted (no such line, or a boot since did not apply it), unsupported (not in sysfs)."""
    current = info.get("parameters") or {}
    options = info.get("options") or {}
    written = options.get("params") or {}
    out = []
    for param in sorted(params):
        requested = param_string(params[param])
        shown = current.get(param)
        state, why = module_options.judge(name, param, requested, shown, written.get(param),
                                          options.get("boot_id"), boot_id, (options.get("overridden") or {}).get(param))
        out.append(setting(NAME, "%s.%s" % (name, param), module_params.kernel_form(requested, shown), shown,
                           state, why, written.get(param)))
    return out


def runtime_row(row: dict, facts: dict, rows: list) -> bool:
    """Runtime tuning brings a module, never a parameter of a loaded one (only the next boot does)."""
    return "." not in row["name"]
