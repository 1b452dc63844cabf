# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the persistent flow installs for the guard, and what rollback removes (the ``guard`` concern).

``installed_files(options)`` returns the guard's config (the whole desired state and the
verification options, ``/etc/gpunode-tuning/guard.json``), its oneshot service and its timer, each
as ``{path, content, mode}``; ``removal_paths(options)`` every file the persistent flow or the
guard writes (the units, the timer's wants link, the config, the status file, the code cache, the
``.prom`` file), and ``removal_dirs`` the directory to remove once empty. The guard itself is
module_utils/flows/guard.py, run by the boot runner (``RUNNER guard --config ...``).

``CONCERN`` is the persistent flow's ``guard`` concern (tag ``guard``; persist.concerns() runs it
after the others, rollback before them). ``options`` (``options_of`` builds them from the role's
settings; every value is validated here before anything is written): ``python``, ``runner``
(gpunode_tuning_boot_python / _script), ``journal`` (the status file goes next to it),
``textfile_dir`` ("" = no metrics), ``interval`` (a systemd time span such as ``5min`` or ``90s``,
or seconds), ``reapply``, ``preset``, ``collection_version``, ``host``, ``desired`` (the role's
whole desired state), ``facts`` and ``verify`` (tuning_info's options).

Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import files as node_files
from ansible_collections.gpunode.tuning.plugins.module_utils.core import persistence
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import FamilyError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import Journal
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import ValidationError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate_boot import absolute_path
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families, boot, guard

SERVICE = "gpunode-tuning-guard.service"
TIMER = "gpunode-tuning-guard.timer"
UNIT_DIR = "/etc/systemd/system"
SERVICE_PATH = "%s/%s" % (UNIT_DIR, SERVICE)
TIMER_PATH = "%s/%s" % (UNIT_DIR, TIMER)
TIMER_WANTS_LINK = "%s/timers.target.wants/%s" % (UNIT_DIR, TIMER)
CONFIG_PATH = "/etc/gpunode-tuning/guard.json"
STATUS_NAME = "guard-status.json"
CODE_CACHE_NAME = "guard-code.cache"
CODE_CACHE_ENV = "GPUNODE_TUNING_CODE_CACHE"
# The journal's record of the .prom files the guard was installed to write (core/journal.py, "written").
JOURNAL_KIND = "guard_textfile"
# What tells an installed guard: any of these.
INSTALLED_MARKS = (TIMER_PATH, SERVICE_PATH, CONFIG_PATH)
# The unit's limit: every command has guard.command_timeout_seconds; a run normally takes < 1 s.
TIMEOUT_START_SEC = 300
FIRST_RUN_AFTER_BOOT = "1min"
_SPAN_UNITS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60,
               "h": 3600, "hr": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400}
_SPAN = re.compile(r"([0-9]+)\s*([a-z]*)")
INTERVAL_ALLOWED = ("a time span of whole seconds, minutes, hours or days as systemd writes it (30s, 5min, 1h, "
                    "1h 30min) or a number of seconds, at least 10 s")


def interval_seconds(value: Any) -> int:
    """``5min`` -> 300; ValidationError naming what is allowed for anything else (below 10 s too)."""
    text = str(value).strip().lower() if not isinstance(value, bool) else ""
    total, pos = 0, 0
    for m in _SPAN.finditer(text):
        if text[pos:m.start()].strip() or m.group(2) not in _SPAN_UNITS and m.group(2) != "":
            raise ValidationError("gpunode_tuning_guard_interval must be %s, got %r" % (INTERVAL_ALLOWED, value))
        total += int(m.group(1)) * _SPAN_UNITS.get(m.group(2), 1)
        pos = m.end()
    if not text or text[pos:].strip() or total < 10:
        raise ValidationError("gpunode_tuning_guard_interval must be %s, got %r" % (INTERVAL_ALLOWED, value))
    return total


def status_file(journal: str) -> str:
    """The status file: next to the journal (``/var/lib/gpunode-tuning/guard-status.json``)."""
    return os.path.join(os.path.dirname(absolute_path(journal)), STATUS_NAME)


def code_cache(journal: str) -> str:
    """The runner's compiled-code cache of the guard, next to the status file."""
    return os.path.join(os.path.dirname(absolute_path(journal)), CODE_CACHE_NAME)


def config_document(options: dict) -> dict:
    """The guard config (guard.validate_config checks it as the guard will); ValidationError on a bad value."""
    textfile_dir = options.get("textfile_dir") or ""
    doc = {
        "version": guard.VERSION,
        "desired": dict(options.get("desired") or {}),
        "facts": {k: v for k, v in (options.get("facts") or {}).items() if v is not None},
        "verify": {k: v for k, v in (options.get("verify") or {}).items() if v is not None},
        "guard": {"textfile_dir": absolute_path(textfile_dir) if textfile_dir else "",
                  "status_file": status_file(options["journal"]),
                  "reapply": options.get("reapply", False),
                  "interval_seconds": interval_seconds(options.get("interval", "5min")),
                  "command_timeout_seconds": guard.GUARD_DEFAULTS["command_timeout_seconds"],
                  "preset": options.get("preset"), "collection_version": options.get("collection_version"),
                  "host": options.get("host")},
    }
    try:
        guard.validate_config(doc, "gpunode_tuning_guard_*")
    except guard.GuardError as exc:
        raise ValidationError(str(exc)) from None
    return doc


def service_unit(options: dict) -> str:
    """The oneshot service: the runner's ``guard`` subcommand, niced and bounded."""
    python = absolute_path(options["python"])
    runner = absolute_path(options["runner"])
    return "\n".join([
        "# Managed by gpunode.tuning (role tuning); removed by playbooks/rollback.yml.",
        "# The guard: re-verify the tuning with the collection's own code (the boot runner's guard",
        "# subcommand, module_utils/flows/guard.py) and write the status and Prometheus metrics.",
        "[Unit]",
        "Description=gpunode.tuning guard: re-verify the tuning, write its status and metrics",
        "After=gpunode-tuning-boot.service systemd-sysctl.service",
        "ConditionPathExists=%s" % CONFIG_PATH,
        "",
        "[Service]",
        # oneshot: a timer that elapses while a run is still active does not start a second one.
        "Type=oneshot",
        "ExecStart=%s -I -B %s guard --config %s" % (python, runner, CONFIG_PATH),
        "Environment=%s=%s" % (CODE_CACHE_ENV, code_cache(options["journal"])),
        "Nice=19",
        "CPUSchedulingPolicy=batch",
        "IOSchedulingClass=best-effort",
        "IOSchedulingPriority=7",
        "TimeoutStartSec=%d" % TIMEOUT_START_SEC,
        "",
    ])


def timer_unit(options: dict) -> str:
    """The timer: a minute after boot, then every interval after the last run started."""
    seconds = interval_seconds(options.get("interval", "5min"))
    return "\n".join([
        "# Managed by gpunode.tuning (role tuning); removed by playbooks/rollback.yml.",
        "[Unit]",
        "Description=Run the gpunode.tuning guard every %d s" % seconds,
        "",
        "[Timer]",
        # Started later than that (the persistent flow on a running node), it runs the guard at once.
        "OnBootSec=%s" % FIRST_RUN_AFTER_BOOT,
        "OnUnitActiveSec=%ds" % seconds,
        "AccuracySec=%ds" % max(1, min(60, seconds // 10)),
        "Unit=%s" % SERVICE,
        "",
        "[Install]",
        "WantedBy=timers.target",
        "",
    ])


def installed_files(options: dict) -> list:
    """``[{path, content, mode}]`` the persistent flow writes (node paths), config first."""
    doc = config_document(options)
    return [
        {"path": CONFIG_PATH, "content": json.dumps(doc, indent=1, sort_keys=True) + "\n", "mode": "0644"},
        {"path": SERVICE_PATH, "content": service_unit(options), "mode": "0644"},
        {"path": TIMER_PATH, "content": timer_unit(options), "mode": "0644"},
    ]


def removal_paths(options: dict) -> list:
    """Every file of the guard (node paths): units, wants link, config, status, code cache, metrics."""
    paths = [TIMER_WANTS_LINK, TIMER_PATH, SERVICE_PATH, CONFIG_PATH, status_file(options["journal"]),
             code_cache(options["journal"])]
    if options.get("textfile_dir"):
        paths.append(os.path.join(absolute_path(options["textfile_dir"]), guard.TEXTFILE))
    return paths


def removal_dirs(options: dict) -> list:
    """Directories the guard may have created, removed when nothing else is left in them."""
    return [os.path.dirname(status_file(options["journal"]))]


def temp_patterns() -> list:
    """Names of the temporary files an interrupted write may leave (``core/files.py``'s ``replace_file``)."""
    return [".%s.*" % guard.TEXTFILE, ".%s.*" % STATUS_NAME, ".%s.*" % CODE_CACHE_NAME]


# --- the persistent flow's concern ---


def _journal(pc) -> str:
    """The journal's path: the role's setting, else the module's own option."""
    return pc.settings.get("journal") or pc.call.params.get("journal") or "/var/lib/gpunode-tuning/journal.json"


def options_of(pc) -> dict:
    """The options above from a ``persistence.PersistCall``: the role's settings and the inputs the action adds."""
    s = pc.settings
    inputs = s.get("guard_inputs") or {}
    return {"python": s["boot_python"], "runner": s["boot_script"], "journal": _journal(pc),
            "textfile_dir": s.get("guard_textfile_dir") or "", "interval": s.get("guard_interval", "5min"),
            "reapply": bool(s.get("guard_reapply")), "preset": s.get("preset"), "host": inputs.get("host"),
            "collection_version": inputs.get("collection_version"),
            "desired": all_families.node_desired(pc.desired, pc.node),
            "facts": inputs.get("facts"), "verify": inputs.get("verify")}


def _open_journal(pc) -> Journal:
    try:
        return Journal(pc.node, _journal(pc))
    except NodeError as exc:
        raise FamilyError("guard: %s" % exc) from None


def _installed(pc) -> bool:
    return any(os.path.lexists(pc.node.path(p)) for p in INSTALLED_MARKS)


def persist_guard(pc) -> dict:
    """The runner, the config, the service and the timer written, the timer enabled and started; with the guard
    off, an installed guard removed."""
    if not pc.settings.get("guard_enabled"):
        if _installed(pc):
            remove_guard(pc)
            return {"removed": True, "summary": "removed: gpunode_tuning_guard_enabled is false"}
        return {"changed": False, "skipped": True, "reason": "gpunode_tuning_guard_enabled is false"}
    opts = options_of(pc)
    try:
        files = installed_files(opts)
    except (ValidationError, KeyError) as exc:
        raise FamilyError("guard: %s; nothing was written" % exc) from None
    if "runner_text" not in pc.settings:
        raise FamilyError("guard: the boot runner was not transferred (a bug: please report it); nothing was written")
    python = absolute_path(opts["python"])
    if pc.node.is_live and not os.access(python, os.X_OK):
        raise FamilyError("gpunode_tuning_boot_python %s is not an executable file on the node; the guard runs with "
                          "it: install python3 (3.8 or later) or set gpunode_tuning_boot_python; nothing was written"
                          % python)
    guard_doc = json.loads(files[0]["content"])["guard"]
    metrics = _record_textfile(pc, guard_doc["textfile_dir"])
    changed = [pc.files.write(absolute_path(opts["runner"]), pc.settings["runner_text"], 0o755)]
    changed += [pc.files.write(f["path"], f["content"], int(f["mode"], 8)) for f in files]
    if persistence.systemd_running(pc.node):
        if any(changed):
            persistence.run_command(pc, ["systemctl", "daemon-reload"], "reloading systemd")
        # Started on a running node, the timer runs the guard at once (its OnBootSec is past).
        persistence.run_command(pc, ["systemctl", "enable", "--now", TIMER], "enabling and starting the guard timer")
    else:
        pc.files.link(TIMER_WANTS_LINK, TIMER_PATH)
    return {"interval_seconds": guard_doc["interval_seconds"], "reapply": guard_doc["reapply"],
            "textfile_dir": guard_doc["textfile_dir"], "status_file": guard_doc["status_file"], "metrics": metrics}


def _record_textfile(pc, textfile_dir: str) -> str:
    """The journal told where the guard writes its ``.prom`` (a ``.prom`` of an earlier directory removed); what the
    metrics are: ``on``, ``off`` (no directory set) or ``off until <dir> exists`` (said once, as a warning)."""
    prom = os.path.join(textfile_dir, guard.TEXTFILE) if textfile_dir else None
    journal = _open_journal(pc)
    for old in journal.written(JOURNAL_KIND):
        if old != prom:
            _remove_file(pc, old)
            journal.forget_written(JOURNAL_KIND, old)
    if prom:
        journal.record_written(JOURNAL_KIND, prom)
    journal.save(pc.call.check_mode)
    if not prom:
        return "off"
    if not os.path.lexists(pc.node.path(textfile_dir)):
        pc.call.warn("guard: " + guard.missing_textfile_dir(textfile_dir))
        return "off until %s exists" % textfile_dir
    return "on"


def _remove_file(pc, path: str) -> bool:
    try:
        return pc.files.remove(path)
    except FamilyError as exc:
        raise FamilyError("guard: %s" % exc) from None


def _temporaries(pc, directory: str) -> list:
    """Node paths of the temporary files an interrupted write left in ``directory``; FamilyError (path, errno)
    when it cannot be listed."""
    full = pc.node.path(directory)
    try:
        names = sorted(os.listdir(full)) if os.path.isdir(full) else []
    except OSError as exc:
        raise FamilyError("guard: cannot list %s: %s; nothing more was removed" % (directory, node_files.os_error(exc))
                          ) from None
    return ["%s/%s" % (directory.rstrip("/"), n) for n in names
            if any(fnmatch.fnmatchcase(n, pat) for pat in temp_patterns())]


def remove_guard(pc) -> dict:
    """The timer stopped and disabled, then every file of the guard removed (temporary ones included), the
    ``.prom`` wherever the journal says the guard wrote it too."""
    opts = {"journal": _journal(pc), "textfile_dir": pc.settings.get("guard_textfile_dir") or ""}
    try:
        paths, dirs = removal_paths(opts), removal_dirs(opts)
    except ValidationError as exc:
        raise FamilyError("guard: %s; nothing was removed" % exc) from None
    journal = _open_journal(pc)
    recorded = journal.written(JOURNAL_KIND)
    paths += [p for p in recorded if p not in paths]
    running = persistence.systemd_running(pc.node)
    if running and pc.files.read(TIMER_PATH) is not None:
        # Stopped before its files go, so that no run writes them again.
        persistence.run_command(pc, ["systemctl", "disable", "--now", TIMER], "stopping the guard timer")
        persistence.run_command(pc, ["systemctl", "stop", SERVICE], "stopping the guard service")
    removed = [p for p in paths if _remove_file(pc, p)]
    textfile_dirs = sorted({os.path.dirname(p) for p in paths if p.endswith("/" + guard.TEXTFILE)})
    for directory in textfile_dirs + dirs:
        removed += [p for p in _temporaries(pc, directory) if _remove_file(pc, p)]
    for path in recorded:
        journal.forget_written(JOURNAL_KIND, path)
    journal.save(pc.call.check_mode)
    if not any(os.path.lexists(pc.node.path(p)) for p in (boot.UNIT_PATH, boot.DESIRED_PATH)):
        # The runner is the boot unit's too; without a boot unit it is the guard's alone.
        removed += [p for p in (pc.settings.get("boot_script"),) if p and _remove_file(pc, p)]
    for directory in dirs + [os.path.dirname(CONFIG_PATH)]:
        full = pc.node.path(directory)
        if os.path.isdir(full) and not os.path.islink(full) and not os.listdir(full):
            _remove_file(pc, directory)
    if removed and running:
        persistence.run_command(pc, ["systemctl", "daemon-reload"], "reloading systemd")
    return {}


CONCERN = persistence.Concern("guard", ("guard",), persist_guard, remove_guard,
                              description="the guard's config, oneshot service and timer that re-verify the node "
                                          "and write a status file and Prometheus metrics (docs/guard.md)")
