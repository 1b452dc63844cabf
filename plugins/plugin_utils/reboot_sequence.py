# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet reboot's sequence on the controller (issue 30): drain backends, records, the budget's slot.

The action ``tuning_reboot`` runs once per host, in parallel for the hosts of a batch (Ansible's forks); the
hosts share the budget through the records below the report directory (``reboots/``: one JSON file per host,
``halt.json`` once a host stopped the run's reboots) under one lock. A host takes a slot only with the lock
held, after polling the backend for every host of the run (out of service for any reason) and reading the
records of the hosts this run is draining or rebooting (so a drain not yet visible in the scheduler still
counts). The decision itself is ``reboot.reboot_plan``.

Backends run their commands through a callable ``run(argv, timeout) -> (rc, stdout, stderr)`` (the action
hands in the host's connection for Slurm, the controller for the command backend), so this file is tested
with a fake one. Every command is bounded by ``timeout``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain import ClaimLost, SequenceError

Runner = Callable[[list, float], tuple]

RECORD_DIR = "reboots"
HALT = "halt.json"
# A record's states. In flight: the host is out of service because of this collection. "gated": rebooted and
# through its gate, held drained until the rollout's measure gate has run (then "done", or "failed").
IN_FLIGHT = ("draining", "drained", "rebooting", "back", "gated", "failed")
_HOST_FILE = re.compile(r"[^A-Za-z0-9._-]")


class RunEnded(SequenceError):
    """The ansible-playbook run that started this sequence is gone: the sequence stops where it is."""


# The pid of the ansible-playbook process this worker belongs to (guard_run), or None: no check.
_RUN = {"parent": None}


def guard_run(parent: int | None) -> None:
    """Stop this process's waits once ``parent`` (the ansible-playbook run) is gone.

    Ansible's workers run in a session of their own (WorkerProcess._detach calls setsid), so a run killed with
    its process group leaves the worker of each host running its task: without this, it would go on taking
    slots, draining, rebooting and resuming hosts next to the next run. An orphan's parent changes (it is
    re-parented), so each wait asks, and raises RunEnded: the host is left as it is, for the next run to adopt.
    """
    _RUN["parent"] = parent


def check_run() -> None:
    """Raise RunEnded when the run guard_run named is no longer this process's parent."""
    parent = _RUN["parent"]
    if parent is not None and os.getppid() != parent:
        raise RunEnded("the ansible-playbook run %s that started this sequence ended: stopped here, the host is "
                       "left as it is for the next run to adopt" % parent)


# --- records ---------------------------------------------------------------------------------------------------


class Records:
    """The run's records below ``<report dir>/reboots``: each host's state, the halt, one lock for all."""

    def __init__(self, report_dir: str, run_id: str):
        self.dir = os.path.join(report_dir, RECORD_DIR)
        self.run_id = run_id

    def _path(self, host: str) -> str:
        return os.path.join(self.dir, _HOST_FILE.sub("_", host) + ".json")

    @contextlib.contextmanager
    def lock(self):
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, ".lock"), "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def read(self, host: str) -> dict | None:
        try:
            with open(self._path(host), encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def write(self, host: str, state: str, **fields) -> dict:
        """Replace the host's record (atomically) and return it."""
        record = dict(self.read(host) or {}, host=host, run=self.run_id, state=state, updated=time.time())
        record.update(fields)
        os.makedirs(self.dir, exist_ok=True)
        tmp = self._path(host) + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1, sort_keys=True)
        os.replace(tmp, self._path(host))
        return record

    def all(self, hosts) -> dict:
        return {h: r for h in hosts for r in [self.read(h)] if r}

    def halted(self) -> str | None:
        """Why this run's reboots stopped, or None."""
        try:
            with open(os.path.join(self.dir, HALT), encoding="utf-8") as fh:
                halt = json.load(fh)
        except (OSError, ValueError):
            return None
        return halt.get("reason") if isinstance(halt, dict) and halt.get("run") == self.run_id else None

    def halt(self, host: str, reason: str) -> None:
        """Stop every later reboot of this run (the first reason stays)."""
        if self.halted():
            return
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, HALT), "w", encoding="utf-8") as fh:
            json.dump({"run": self.run_id, "host": host, "reason": "%s: %s" % (host, reason), "at": time.time()}, fh)


def in_flight(records: dict, run_id: str | None = None) -> list:
    """Hosts whose record says this collection has them out of service (of ``run_id`` only, when given)."""
    return [h for h, r in records.items() if r.get("state") in IN_FLIGHT and (run_id is None or r.get("run") == run_id)]


# --- the survey and the slot -------------------------------------------------------------------------------------


def foreign(records: dict, run_id: str, lease: float, now: float | None = None) -> dict:
    """``{host: why}``: hosts another run of this report directory holds in flight, its record written within the
    lease (the records are this controller's: one clock). The none backend is claimed by these records alone;
    kubernetes by its annotation's claim and these records too; command by its check's claim line, where it prints
    one, and these records too."""
    now = time.time() if now is None else now
    return {h: "claimed by the live run %s (its record in this report directory, %s, written %d s ago; lease %d s)"
            % (r.get("run"), r.get("state"), now - float(r.get("updated") or 0), lease)
            for h, r in records.items() if r.get("state") in IN_FLIGHT and r.get("run") != run_id
            and now - float(r.get("updated") or 0) <= lease}


def claims(backend, polled: dict, records: Records, hosts: list, lease: float) -> dict:
    """``{host: why}``: the hosts another live run holds (its claim on the node; for a backend without its own,
    its record)."""
    out = dict(polled.get("claimed") or {})
    if backend.name != "slurm":
        out.update({h: why for h, why in foreign(records.all(hosts), records.run_id, lease).items() if h not in out})
    return out


def _poll_settled(backend, hosts: list, wait: float, poll: float, sleep, clock) -> dict:
    """The backend's states, asked again (within ``wait``) while a host is in a transient state (Slurm's UNKNOWN
    right after a controller restart, a Kubernetes node briefly Unknown): never judged on one reading."""
    end = clock() + wait
    while True:
        polled = backend.states(hosts)
        if not polled.get("transient") or clock() >= end:
            return polled
        check_run()
        sleep(poll)


def survey(backend, hosts: list, records: Records, settings: dict | None = None, sleep=time.sleep,
           clock=time.monotonic) -> dict:
    """Before the run: which hosts are out of service and not by this collection (skipped), which another live
    run claims (``claimed``: tuned, then waited for), and which are ours (a reason of ours whose claim ran out,
    or a record left in flight by an earlier run: adopted)."""
    settings = settings or {}
    polled = _poll_settled(backend, hosts, min(float(settings.get("wait_timeout", 60)), 120.0),
                           float(settings.get("poll", 1.0)), sleep, clock)
    lease = float(settings.get("claim_lease", reboot.DEFAULTS["claim_lease"]))
    claimed = claims(backend, polled, records, hosts, lease)
    recorded = set(in_flight(records.all(hosts))) - set(claimed)
    ours = sorted((set(polled["ours"]) | (recorded & set(polled["out_of_service"]))
                   | (recorded if backend.name == "none" else set())) - set(claimed), key=hosts.index)
    others = {h: polled["why"].get(h, "out of service") for h in hosts
              if h in polled["out_of_service"] and h not in ours and h not in claimed}
    return {"out_of_service": others, "ours": ours, "claimed": claimed, "backend": backend.name,
            "hosts": list(hosts)}


def fleet_budget(polled: dict, settings: dict) -> tuple:
    """``(max_unavailable, {node: why} out of service outside the run)`` for the budget's scope: with ``fleet``, a
    share is of the fleet's nodes and every node of the fleet out of service holds a slot."""
    if settings.get("budget_scope", "run") != "fleet" or "fleet" not in polled:
        return settings["max_unavailable"], {}
    count = settings["max_unavailable"]
    size = polled.get("fleet_size")
    if size and settings.get("max_unavailable_given") is not None:
        count = reboot.max_unavailable_count(settings["max_unavailable_given"], size)[0] or count
    return count, dict(polled["fleet"])


FINISHED = ("done", "failed", "not_rebooted", "returned", "released")


def unreachable_note(unreachable: dict) -> str:
    """The hosts counted out of service because they cannot be reached, for the records and the summary."""
    if not unreachable:
        return ""
    return "; counted out of service as unreachable: " + "; ".join(
        "%s (%s)" % (h, " ".join(str(why).split())[:160]) for h, why in sorted(unreachable.items()))


def _poll_within(backend, records: Records, host: str, hosts: list, over: bool):
    """The backend's states, or (within the wait: ``over`` false) why it did not answer, to ask again."""
    try:
        return backend.states(hosts)
    except RunEnded:
        raise
    except SequenceError as exc:
        if over:
            raise
        why = "the backend did not answer: %s" % exc
        records.write(host, "waiting", reason=why)
        return why


def take_slot(backend, records: Records, host: str, hosts: list, settings: dict, adopted: bool,  # noqa: PLR0913
              sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
              want: list | None = None, unreachable: Callable[[], dict] | None = None) -> dict:
    """Wait for a free slot and take it: ``{"taken": bool, "why", "waited"}``.

    ``want``: the hosts of the batch that need a reboot (earlier ones in ``hosts`` get the free slots first,
    whether or not their own task has started yet). ``unreachable``: asked at every decision, ``{host: why}``
    for the hosts of the run that cannot be reached now (Ansible found them unreachable); they count as out of
    service, as do the hosts whose backend poll cannot reach them. Not taken: out of service by someone else
    (``skip``), the run halted, or the wait timed out (which halts the run's later reboots).
    """
    start = clock()
    waited_why = ""
    lease = float(settings.get("claim_lease", reboot.DEFAULTS["claim_lease"]))
    seen_claimed = bool(settings.get("seen_claimed"))
    while True:
        check_run()
        with records.lock():
            halted = records.halted()
            polled = _poll_within(backend, records, host, hosts, clock() - start >= settings["wait_timeout"])
            if isinstance(polled, str):
                waited_why = polled
                sleep(settings["poll"])
                continue
            claimed = claims(backend, polled, records, hosts, lease)
            budget, fleet_out = fleet_budget(polled, settings)
            gone = {h: why for h, why in (unreachable() if unreachable else {}).items() if h in hosts and h != host}
            gone.update({h: polled["why"].get(h, "unreachable") for h in polled.get("unreachable", ()) if h != host})
            mine = set(in_flight(records.all(hosts), records.run_id))
            ours = (set(polled["ours"]) | mine | ({host} if adopted else set())) - set(claimed)
            down = set(polled["out_of_service"]) | set(gone) | mine | set(claimed) | ({host} if adopted else set())
            run_records = {h: r for h, r in records.all(hosts).items() if r.get("run") == records.run_id}
            waiting = {h for h, r in run_records.items() if r.get("state") == "waiting"}
            finished = {h for h, r in run_records.items() if r.get("state") in FINISHED and h != host}
            wanted = (waiting | set(want or ()) | {host}) - finished
            plan = reboot.reboot_plan(hosts, down, ours, wanted, budget, halted=None if host in ours else halted,
                                      claimed=claimed, fleet_out=fleet_out)
            if host in plan["start"] or host in plan["continue"]:
                records.write(host, "draining", waited=round(clock() - start, 1), slot_at=time.time(),
                              counted_out=sorted(down | {host}), unreachable=gone)
                return {"taken": True, "waited": round(clock() - start, 1), "why": waited_why}
            why = plan["why"].get(host, "waiting for a slot")
            if host in plan["wait"] and not halted:
                why += unreachable_note(gone)
            seen_claimed = seen_claimed or host in claimed
            if host in plan["skip"] and (seen_claimed or host in polled.get("transient", ())):
                # another run held it a moment ago: what it shows now (down after that run's reboot, not yet
                # responding) is that run's doing, waited for like its claim; a transient state (UNKNOWN right
                # after a controller restart) is asked again within the wait
                why = "waiting: out of service for now (%s)" % polled["why"].get(host, "")
            elif host in plan["skip"]:
                return {"taken": False, "skip": True, "why": polled["why"].get(host, why), "waited": 0}
            if halted and host not in ours:
                records.write(host, "not_rebooted", reason=why)
                return {"taken": False, "why": why, "waited": round(clock() - start, 1)}
            if clock() - start >= settings["wait_timeout"]:
                why = "waited %d s for a slot (gpunode_tuning_reboot_wait_timeout) and got none: %s" % (
                    settings["wait_timeout"], why)
                records.write(host, "not_rebooted", reason=why)
                records.halt(host, why)
                return {"taken": False, "why": why, "waited": round(clock() - start, 1), "timed_out": True}
            if host not in claimed or backend.name == "slurm":  # never over another live run's record
                records.write(host, "waiting", reason=why, unreachable=gone)
            waited_why = why
        sleep(settings["poll"])


def wait_until(check: Callable[[], bool], timeout: float, poll: float, sleep=time.sleep, clock=time.monotonic,  # noqa: PLR0913
               errors: list | None = None, renew: Callable[[], None] | None = None) -> bool:
    """Whether ``check()`` turned true within ``timeout`` seconds (asked every ``poll`` seconds).

    ``errors``: a backend error (SequenceError, not ClaimLost or RunEnded) is appended there and asked again
    within the wait instead of ending it. ``renew``: called at every poll (the run's claim)."""
    end = clock() + timeout
    while True:
        check_run()
        try:
            if renew is not None:
                renew()
            ok = check()
        except (ClaimLost, RunEnded):
            raise
        except SequenceError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            ok = False
        if ok:
            return True
        if clock() >= end:
            return False
        sleep(min(poll, max(end - clock(), 0.01)))


def settings_of(values: dict, hosts: int) -> tuple[dict, list]:
    """The run's reboot settings from the role variables (prefixed names): reboot.reboot_settings plus the poll."""
    raw = {"reboot_ok": values.get("gpunode_tuning_reboot_ok"), "drain": values.get("gpunode_tuning_drain"),
           "max_unavailable": values.get("gpunode_tuning_reboot_max_unavailable"),
           "budget_scope": values.get("gpunode_tuning_reboot_budget_scope")}
    raw.update({key: values.get(name) for key, name in reboot.TIMEOUT_VARIABLES.items()})
    got, errors = reboot.reboot_settings(raw, hosts)
    poll: Any = values.get("gpunode_tuning_reboot_poll_interval")
    got["poll"] = float(poll) if isinstance(poll, (int, float)) and not isinstance(poll, bool) else 5.0
    return got, errors
