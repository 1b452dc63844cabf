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

RECORD_DIR = "reboots"
HALT = "halt.json"
# A record's states. In flight: the host is out of service because of this collection. "gated": rebooted and
# through its gate, held drained until the rollout's measure gate has run (then "done", or "failed").
IN_FLIGHT = ("draining", "drained", "rebooting", "back", "gated", "failed")
COMMAND_TIMEOUT = 30
_HOST_FILE = re.compile(r"[^A-Za-z0-9._-]")


class SequenceError(Exception):
    """A backend command failed: the message names the command and what it said."""


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


# --- backends ---------------------------------------------------------------------------------------------------

Runner = Callable[[list, float], tuple]


class NoneBackend:
    """No drain: hosts reboot with their work on them; out of service is what the records say."""

    name = "none"

    def states(self, hosts: list) -> dict:
        return {"out_of_service": [], "ours": [], "why": {}}

    def drain(self, host: str, reason: str) -> None:
        return None

    def drained(self, host: str) -> bool:
        return True

    def keep_drained(self, host: str, reason: str) -> None:
        return None

    def boot_mark(self, host: str) -> str | None:
        return None

    def ready(self, host: str, mark: str | None = None) -> bool:
        return True

    def undrain(self, host: str) -> None:
        return None

    def in_service(self, host: str) -> bool:
        return True


class SlurmBackend:
    """Slurm through the cluster's own ``scontrol`` and ``sinfo`` (``run`` decides where they run)."""

    name = "slurm"

    def __init__(self, run: Runner, node_of: dict, timeout: float = COMMAND_TIMEOUT):
        self.run, self.node_of, self.timeout = run, node_of, timeout

    def _call(self, argv: list) -> str:
        rc, out, err = self.run(argv, self.timeout)
        if rc != 0:
            raise SequenceError("%s exited %s: %s" % (" ".join(argv), rc, (err or out).strip()[-400:]))
        return out

    def nodes(self, names=None) -> dict:
        argv = ["sinfo", "-N", "-h", "-o", "%N|%T|%E"] + (["-n", ",".join(names)] if names else [])
        return reboot.parse_sinfo(self._call(argv))

    def states(self, hosts: list) -> dict:
        return reboot.slurm_hosts(self.nodes(), {h: self.node_of[h] for h in hosts})

    def _node(self, host: str) -> dict:
        return self.nodes([self.node_of[host]]).get(self.node_of[host]) or {}

    def drain(self, host: str, reason: str) -> None:
        self._call(["scontrol", "update", "NodeName=" + self.node_of[host], "State=DRAIN", "Reason=" + reason])

    def drained(self, host: str) -> bool:
        """No job left: sinfo says drained (not draining)."""
        return self._node(host).get("state") in ("DRAINED", "DOWN")

    def keep_drained(self, host: str, reason: str) -> None:
        self.drain(host, reason)

    def boot_mark(self, host: str) -> str | None:
        """When the node's slurmd registered (scontrol's SlurmdStartTime): a reboot changes it."""
        out = self._call(["scontrol", "show", "node", "-o", self.node_of[host]])
        return (reboot.parse_scontrol_nodes(out).get(self.node_of[host]) or {}).get("slurmd_start_time")

    def ready(self, host: str, mark: str | None = None) -> bool:
        """slurmd registered again: a new SlurmdStartTime than ``mark`` (before the reboot), and it answers."""
        out = self._call(["scontrol", "show", "node", "-o", self.node_of[host]])
        node = reboot.parse_scontrol_nodes(out).get(self.node_of[host])
        if not node or "NOT_RESPONDING" in node["flags"]:
            return False
        return mark is None or node.get("slurmd_start_time") not in (mark, None)

    def undrain(self, host: str) -> None:
        """RESUME the node. Slurm refuses to resume a node that is not drained ("Invalid node state
        specified"): when someone resumed ours in between (an adopted node, an operator), it is back in
        service, which is what this wanted, and that is no failure; any other refusal is."""
        try:
            self._call(["scontrol", "update", "NodeName=" + self.node_of[host], "State=RESUME"])
        except SequenceError:
            if not self.in_service(host):
                raise

    def in_service(self, host: str) -> bool:
        node = self._node(host)
        return bool(node) and not node["out_of_service"]


class CommandBackend(NoneBackend):
    """The user's own commands (a load balancer, an inference router), run on the controller with
    ``GPUNODE_HOST`` (and ``GPUNODE_REASON`` for the drain) in their environment. Drains are ours by record.

    What it has no command for (keeping a failed host drained, a boot mark, readiness after the boot) is
    NoneBackend's: nothing to do, ready at once."""

    name = "command"

    def __init__(self, run: Callable[[list, float, dict], tuple], commands: dict, timeout: float = COMMAND_TIMEOUT):
        self.run, self.commands, self.timeout = run, commands, timeout

    def _call(self, which: str, host: str, reason: str = "") -> int:
        argv = reboot.command_argv(self.commands[which])
        rc, out, err = self.run(argv, self.timeout, {"GPUNODE_HOST": host, "GPUNODE_REASON": reason})
        if which == "check" and rc in (0, 1):
            return rc
        if rc != 0:
            raise SequenceError("%s command for %s (%s) exited %s: %s" % (
                which, host, " ".join(argv), rc, (err or out).strip()[-400:]))
        return rc

    def states(self, hosts: list) -> dict:
        """A host whose check fails (exit 2 and up, a timeout: it cannot be reached) counts as out of service,
        ``unreachable``: nothing says it can take work."""
        out: dict = {"out_of_service": [], "ours": [], "unreachable": [], "why": {}}
        for host in hosts:
            try:
                drained = self._call("check", host) == 0
            except SequenceError as exc:
                out["out_of_service"].append(host)
                out["unreachable"].append(host)
                out["why"][host] = "unreachable: %s" % exc
                continue
            if drained:
                out["out_of_service"].append(host)
                out["why"][host] = "the drain check command says drained"
        return out

    def drain(self, host: str, reason: str) -> None:
        self._call("drain", host, reason)

    def drained(self, host: str) -> bool:
        return self._call("check", host) == 0

    def undrain(self, host: str) -> None:
        self._call("undrain", host)

    def in_service(self, host: str) -> bool:
        return self._call("check", host) == 1


# --- the survey and the slot -------------------------------------------------------------------------------------


def survey(backend, hosts: list, records: Records) -> dict:
    """Before the run: which hosts are out of service and not by this collection (skipped), and which are
    ours (a Slurm reason of ours, or a record left in flight by an earlier run: adopted)."""
    polled = backend.states(hosts)
    recorded = in_flight(records.all(hosts))
    ours = sorted(set(polled["ours"]) | (set(recorded) & set(polled["out_of_service"]))
                  | (set(recorded) if backend.name == "none" else set()), key=hosts.index)
    others = {h: polled["why"].get(h, "out of service") for h in hosts
              if h in polled["out_of_service"] and h not in ours}
    return {"out_of_service": others, "ours": ours, "backend": backend.name, "hosts": list(hosts)}


FINISHED = ("done", "failed", "not_rebooted", "returned")


def unreachable_note(unreachable: dict) -> str:
    """The hosts counted out of service because they cannot be reached, for the records and the summary."""
    if not unreachable:
        return ""
    return "; counted out of service as unreachable: " + "; ".join(
        "%s (%s)" % (h, " ".join(str(why).split())[:160]) for h, why in sorted(unreachable.items()))


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
    while True:
        check_run()
        with records.lock():
            halted = records.halted()
            polled = backend.states(hosts)
            gone = {h: why for h, why in (unreachable() if unreachable else {}).items() if h in hosts and h != host}
            gone.update({h: polled["why"].get(h, "unreachable") for h in polled.get("unreachable", ()) if h != host})
            mine = set(in_flight(records.all(hosts), records.run_id))
            ours = set(polled["ours"]) | mine | ({host} if adopted else set())
            down = set(polled["out_of_service"]) | set(gone) | mine | ({host} if adopted else set())
            run_records = {h: r for h, r in records.all(hosts).items() if r.get("run") == records.run_id}
            waiting = {h for h, r in run_records.items() if r.get("state") == "waiting"}
            finished = {h for h, r in run_records.items() if r.get("state") in FINISHED and h != host}
            wanted = (waiting | set(want or ()) | {host}) - finished
            plan = reboot.reboot_plan(hosts, down, ours, wanted, settings["max_unavailable"],
                                      halted=None if host in ours else halted)
            if host in plan["start"] or host in plan["continue"]:
                records.write(host, "draining", waited=round(clock() - start, 1), slot_at=time.time(),
                              counted_out=sorted(down | {host}), unreachable=gone)
                return {"taken": True, "waited": round(clock() - start, 1), "why": waited_why}
            why = plan["why"].get(host, "waiting for a slot")
            if host in plan["wait"] and not halted:
                why += unreachable_note(gone)
            if host in plan["skip"]:
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
            records.write(host, "waiting", reason=why, unreachable=gone)
            waited_why = why
        sleep(settings["poll"])


def wait_until(check: Callable[[], bool], timeout: float, poll: float, sleep=time.sleep, clock=time.monotonic) -> bool:
    """Whether ``check()`` turned true within ``timeout`` seconds (asked every ``poll`` seconds)."""
    end = clock() + timeout
    while True:
        check_run()
        if check():
            return True
        if clock() >= end:
            return False
        sleep(min(poll, max(end - clock(), 0.01)))


def settings_of(values: dict, hosts: int) -> tuple[dict, list]:
    """The run's reboot settings from the role variables (prefixed names): reboot.reboot_settings plus the poll."""
    raw = {"reboot_ok": values.get("gpunode_tuning_reboot_ok"), "drain": values.get("gpunode_tuning_drain"),
           "max_unavailable": values.get("gpunode_tuning_reboot_max_unavailable")}
    raw.update({key: values.get(name) for key, name in reboot.TIMEOUT_VARIABLES.items()})
    got, errors = reboot.reboot_settings(raw, hosts)
    poll: Any = values.get("gpunode_tuning_reboot_poll_interval")
    got["poll"] = float(poll) if isinstance(poll, (int, float)) and not isinstance(poll, bool) else 5.0
    return got, errors
