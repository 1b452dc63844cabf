# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's one desired state, built in Python from its variables, and each flow's module options.

Input: the role's variables as the action plugin tuning_flow resolved them (typed on every
ansible-core: plugin_utils/role_variables.py) and validated against the argument spec. Each
family of the registry contributes its keys of the desired state (``Family.from_role``) and its
module's options (``runtime_options``, ``restore_options``); nothing here names a family.
Verification, the boot runner and the flows read the same desired state.

Plain Python, no Ansible import.
"""

from __future__ import annotations

from collections.abc import Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import persistence, validate, validate_boot
from ansible_collections.gpunode.tuning.plugins.module_utils.core.persistence import as_role_options
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import (
    describe_characters,
    forbidden_characters,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families, boot, guard, guard_files
from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot

PREFIX = "gpunode_tuning_"
# The GPUs the PCI families act on: the MRRS selector variables (their names predate ACS).
SELECTOR_VARIABLES = (("vendor", "gpunode_tuning_gpu_vendors"), ("device", "gpunode_tuning_gpu_device"),
                      ("class_prefixes", "gpunode_tuning_gpu_class_prefixes"), ("bdfs", "gpunode_tuning_gpu_bdfs"))


def gpu_selector(values: dict) -> dict:
    """The GPUs' PCI selector as every PCI family takes it (unset or empty: None, the module's default)."""
    return {key: values.get(name) or None for key, name in SELECTOR_VARIABLES}


def desired_state(values: dict) -> dict:
    """The desired state, one key per family (and per tunables setting), from the validated variables."""
    shared = {"selector": gpu_selector(values)}
    out: dict = {}
    for fam in registry.FAMILIES:
        if fam.from_role is not None:
            out.update(fam.from_role(values, shared))
    return out


def runtime_requests(desired: dict, values: dict, selected: Iterable) -> list:
    """``[{name, options}]`` of the selected families that have something to do at runtime."""
    out = []
    for fam in selected:
        if fam.runtime_options is None:
            continue
        options = fam.runtime_options(desired, values)
        if options is not None:
            out.append({"name": fam.name, "options": as_role_options(fam, options)})
    return out


def restore_requests(values: dict, selected: Iterable) -> list:
    """``[{name, options}]`` of the selected families that restore their journal on rollback."""
    return [{"name": fam.name, "options": fam.restore_options(values)}
            for fam in selected if fam.restore_options is not None]


def combination_problems(values: dict, entry_point: str = "main") -> list:
    """Errors of variables that are each valid but do not work together (or with the controller).

    Rollback does not judge what only the persistent flow writes (the guard's interval): a bad value
    there must not stop a node from being rolled back.
    """
    out = [line for fam in registry.FAMILIES if fam.role_problems is not None for line in fam.role_problems(values)]
    for name, check in (("gpunode_tuning_boot_unit_before", validate_boot.systemd_unit_names),
                        ("gpunode_tuning_boot_script", validate_boot.absolute_path),
                        ("gpunode_tuning_boot_python", validate_boot.absolute_path),
                        ("gpunode_tuning_udev_rule", validate_boot.absolute_path)):
        # What the boot unit and the udev rule are written with: they run as root at every boot and hot-add.
        if values.get(name) is not None:
            try:
                check(values[name])
            except validate.ValidationError as exc:
                out.append("value of %s: %s" % (name, exc))
    out += guard_problems(values, entry_point)
    if entry_point != "rollback":
        out += reboot.role_problems(values)
    report_dir = values.get("gpunode_tuning_report_dir")
    bad = forbidden_characters(report_dir) if isinstance(report_dir, str) else []
    if isinstance(report_dir, str) and (bad or not report_dir.strip()):
        out.append("value of gpunode_tuning_report_dir must be a directory path without control characters, got: "
                   "%r%s" % (report_dir, " (it contains %s)" % describe_characters(bad) if bad else ""))
    return out


def guard_problems(values: dict, entry_point: str = "main") -> list:
    """The guard's interval and textfile directory, judged as the persistent flow writes them (when it is on)."""
    if not values.get("gpunode_tuning_guard_enabled"):
        return []
    out = []
    if entry_point != "rollback" and values.get("gpunode_tuning_guard_interval") is not None:
        try:
            guard_files.interval_seconds(values["gpunode_tuning_guard_interval"])
        except validate.ValidationError as exc:
            out.append("value of %s" % exc)
    textfile_dir = values.get("gpunode_tuning_guard_textfile_dir")
    if textfile_dir:
        try:
            validate_boot.absolute_path(textfile_dir)
        except validate.ValidationError as exc:
            out.append("value of gpunode_tuning_guard_textfile_dir: %s (or \"\" for no metrics)" % exc)
    return out


def guard_inputs(values: dict, desired: dict, host: str, collection_version: str | None) -> dict:
    """What the guard's config holds besides the desired state: tuning_info's options, as verification runs it."""
    opts = verify_options(values, desired, host, None)
    return {"facts": {k: opts[k] for k in guard.FACTS_KEYS},
            "verify": {k: v for k, v in opts["verify"].items() if k not in ("gate", "verified_at")},
            "host": host, "collection_version": collection_version}


def persist_settings(values: dict) -> dict:
    """What the persistent concerns read of the role's variables: each without its prefix, and the GPU selector."""
    out = {name[len(PREFIX):]: value for name, value in values.items() if name.startswith(PREFIX)}
    out.update(gpu_selector(values))
    return out


def rollback_result(removed: dict, restored: dict) -> dict:
    """One result for rollback's two module runs: the persistent artifacts removed, then the journal restored."""
    families_out = dict(restored.get("families") or {})
    failed = dict(restored.get("failed_families") or {})
    families_out.update(removed.get("families") or {})
    failed.update(("persistent " + k, v) for k, v in (removed.get("failed_concerns") or {}).items())
    out = {"changed": bool(removed.get("changed") or restored.get("changed")), "families": families_out,
           "failed_families": failed, "summary": dict(restored.get("summary") or {}),
           "reboot_required": bool(removed.get("reboot_required"))}
    for part in (removed, restored):
        if part.get("failed") and not part.get("failed_concerns") and not part.get("failed_families"):
            out.update(failed=True, msg=part.get("msg"))
    if removed.get("diff") or restored.get("diff"):
        out["diff"] = list(removed.get("diff") or []) + list(restored.get("diff") or [])
    return out


def _variable_of(entry: str, key: str, known) -> str | None:
    """The role variable that sets ``key`` of the desired-state ``entry`` (by the role's naming), if any."""
    selector = dict(SELECTOR_VARIABLES)
    if key in selector:
        return selector[key]
    fam = next((f for f in registry.FAMILIES if entry in (f.name, f.boot_key) or entry in f.tags), None)
    stems = [entry] + ([*all_families.selecting_tags(fam), fam.name.split("_")[0]] if fam else [])
    candidates = ["%s%s_%s" % (PREFIX, stem, key) for stem in stems if key] + ["%s%s" % (PREFIX, s) for s in stems]
    candidates += ["%s%s_args" % (PREFIX, s) for s in stems]
    return next((c for c in candidates if c in known), None)


def desired_problems(desired: dict, known) -> list:
    """The precheck's lines for what the families' validators find in ``desired`` (judged without the node)."""
    out = []
    for entry, key, message in all_families.desired_problems(desired):
        name = _variable_of(entry, key, known)
        plain = key in dict(SELECTOR_VARIABLES) or name is None or name.endswith("_" + key)
        where = name if plain or not key else "%s (%s)" % (name, key)
        line = "value of %s: %s" % (where, message) if where else "%s.%s: %s" % (entry, key, message)
        if line not in out:  # the PCI selector is the MRRS and the ACS families' both
            out.append(line)
    return out


def _gpu_selector_options(values: dict) -> dict:
    return {k: v for k, v in gpu_selector(values).items() if v is not None}


def verify_options(values: dict, desired: dict, host: str, verified_at: str, gate: str = "full") -> dict:
    """tuning_info's options for verification: the node read and judged against the whole desired state."""
    verify = {"bootloader": values["gpunode_tuning_kernel_cmdline_bootloader"],
              "cmdline_dropin": values["gpunode_tuning_kernel_cmdline_dropin"],
              "sysctl_file": values["gpunode_tuning_sysctl_file"], "journal": values["gpunode_tuning_journal"],
              "boot_unit_link": boot.WANTS_LINK, "file_prefix": persistence.FILE_PREFIX,
              "gpu": bool(values["gpunode_tuning_verify_gpu_enabled"]),
              "fail_on_pending": bool(values["gpunode_tuning_verify_fail_on_pending"]),
              "fail_classes": values["gpunode_tuning_kmsg_fail_classes"], "gate": gate, "host": host,
              "verified_at": verified_at}
    if values.get("gpunode_tuning_kmsg_since") is not None:
        verify["kmsg_since"] = values["gpunode_tuning_kmsg_since"]
    return {"pci_selector": _gpu_selector_options(values), **all_families.facts_options(desired),
            "command_timeouts": values.get("gpunode_tuning_command_timeouts"),
            "kmsg_levels": values["gpunode_tuning_kmsg_levels"], "kmsg_ignore": values["gpunode_tuning_kmsg_ignore"],
            "root": values["gpunode_tuning_root"], "desired": desired, "verify": verify}


def health_options(values: dict, desired: dict, host: str) -> dict:
    """tuning_info's options for the rollout's health gate: the health families alone (``Family.health``), the
    whole boot's kernel log.

    An Xid 79 from before the last tuning is still a GPU off the bus; gpunode_tuning_kmsg_since, when set, wins.
    """
    since = values.get("gpunode_tuning_kmsg_since")
    return {"pci_selector": _gpu_selector_options(values), "kmsg_levels": values["gpunode_tuning_kmsg_levels"],
            "kmsg_ignore": values["gpunode_tuning_kmsg_ignore"], "root": values["gpunode_tuning_root"],
            "desired": {name: desired.get(name) for name in all_families.health_families()},
            "command_timeouts": values.get("gpunode_tuning_command_timeouts"),
            "verify": {"kmsg_since": 0 if since is None else since,
                       "gpu": bool(values["gpunode_tuning_verify_gpu_enabled"]), "host": host}}
