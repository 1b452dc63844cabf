# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``slurm`` drain backend: the cluster's own ``sinfo``, ``scontrol``, ``squeue`` and ``sdiag``.

With a claim (the action always gives one; issue 42) every drain reason ends with the run's claim mark
(reboot.claim_mark) and the node list is read with the time slurmctld stamped on each reason (``%H``, printed
in seconds since the epoch by ``SLURM_TIME_FORMAT=%s``), judged against slurmctld's own now (``sdiag``'s first
line): two controllers' clocks are never compared. ``scontrol update NodeName=N Reason=...`` without a State
renews the reason (and its time) of a drained node without draining it again.
"""

from __future__ import annotations

import re
import time

from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain import (
    COMMAND_TIMEOUT,
    Backend,
    ClaimLost,
    SequenceError,
)

SINFO_STAMPED = ["env", "SLURM_TIME_FORMAT=%s", "sinfo", "-N", "-h", "-o", "%N|%T|%H|%P|%E"]
# What a Slurm command prints when it did not reach slurmctld (restarting, failing over to its backup): the
# command had no effect, so it is asked again (``retry_for``). Exit status 124: ``timeout`` killed it.
UNREACHABLE = re.compile(r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted|"
                         r"Connection refused|Communication connection failure|Connection timed out", re.I)


class SlurmBackend(Backend):
    """Slurm through the cluster's own commands (``run`` decides where they run).

    ``claim`` (reboot.claim_of): this run's claim, or None (the reasons without a claim, as before issue 42).
    ``fleet_partitions``: the partitions that make the fleet (None: those of the run's nodes).
    """

    name = "slurm"

    def __init__(self, run, node_of: dict, timeout: float = COMMAND_TIMEOUT, claim: dict | None = None,  # noqa: PLR0913
                 fleet_partitions: list | None = None, retry_for: float = 0.0, pause=time.sleep):
        self.run, self.node_of, self.timeout = run, node_of, timeout
        self.claim, self.fleet_partitions = claim, fleet_partitions
        self._reasons: dict = {}
        self._renewed: dict = {}
        # ``retry_for``: how long a command that did not reach slurmctld is asked again (every ``pause``d second)
        # before it fails the sequence; ``retried``: those errors, so a caller never believes the first answer
        # after one (Slurm's state right after a restart is not yet settled).
        self.retry_for, self.pause = retry_for, pause
        self.retried: list = []

    def _call(self, argv: list) -> str:
        end = time.monotonic() + self.retry_for
        while True:
            rc, out, err = self.run(argv, self.timeout)
            if rc == 0:
                return out
            text = (err or out).strip()[-400:]
            if not (rc == 124 or UNREACHABLE.search(text)) or time.monotonic() >= end:
                waited = " (the controller did not answer for %d s)" % self.retry_for if self.retry_for and (
                    rc == 124 or UNREACHABLE.search(text)) else ""
                raise SequenceError("%s exited %s: %s%s" % (" ".join(argv), rc, text, waited))
            self.retried.append("%s: %s" % (" ".join(argv), text))
            self.pause(min(2.0, max(end - time.monotonic(), 0.01)))

    def nodes(self, names=None) -> dict:
        picked = ["-n", ",".join(names)] if names else []
        if self.claim is None:
            return reboot.parse_sinfo(self._call(["sinfo", "-N", "-h", "-o", "%N|%T|%E"] + picked))
        return reboot.parse_sinfo_stamped(self._call(SINFO_STAMPED + picked))

    def now(self) -> int | None:
        """slurmctld's clock (sdiag), None when it cannot be read (then every other run's claim holds)."""
        try:
            return reboot.parse_sdiag_time(self._call(["sdiag"]))
        except SequenceError:
            return None

    def _foreign(self, node: dict, now: int | None) -> str | None:
        """Why ``node`` is another live run's (its claim, within its lease by slurmctld's clock), or None."""
        if self.claim is None or not node.get("ours"):
            return None
        claim = reboot.parse_claim(node.get("reason"))
        if claim is None or reboot.same_claim(claim, self.claim):
            return None
        if reboot.claim_live(claim, node.get("reason_time"), now):
            return reboot.claim_text(claim, node.get("reason_time"), now)
        return None

    def states(self, hosts: list) -> dict:
        nodes = self.nodes()
        names = {h: self.node_of[h] for h in hosts}
        out = reboot.slurm_hosts(nodes, names)
        out["claimed"] = {}
        # UNKNOWN (slurmctld has not heard from the node since it started): asked again, never judged on one reading
        out["transient"] = [h for h, n in names.items() if (nodes.get(n) or {}).get("state") == "UNKNOWN"]
        if self.claim is None:
            return out
        now = self.now() if any(reboot.parse_claim(n.get("reason")) for n in nodes.values()) else None
        for host in list(out["ours"]):
            why = self._foreign(nodes[names[host]], now)
            if why:
                out["ours"].remove(host)
                out["claimed"][host] = why
        parts = set(self.fleet_partitions or [p for n in names.values() for p in (nodes.get(n) or {}).get(
            "partitions", [])])
        fleet = {n: node for n, node in nodes.items() if parts & set(node.get("partitions") or [])}
        run_nodes = set(names.values())
        out["fleet_size"] = len(set(fleet) | run_nodes)
        out["fleet"] = {n: "%s%s" % (node["state"].lower(), ": " + node["reason"] if node["reason"] else "")
                        for n, node in sorted(fleet.items()) if node["out_of_service"] and n not in run_nodes}
        return out

    def _node(self, host: str) -> dict:
        return self.nodes([self.node_of[host]]).get(self.node_of[host]) or {}

    def drain(self, host: str, reason: str) -> None:
        text = reboot.claimed_reason(reason, self.claim)
        self._call(["scontrol", "update", "NodeName=" + self.node_of[host], "State=DRAIN", "Reason=" + text])
        self._reasons[host], self._renewed[host] = text, time.monotonic()

    def jobs(self, host: str) -> list:
        """The node's running and completing jobs (squeue), not only its state."""
        out = self._call(["squeue", "-h", "-w", self.node_of[host], "-t", "RUNNING,COMPLETING", "-o", "%i"])
        return [line.strip() for line in out.splitlines() if line.strip()]

    def _check_claim(self, host: str, node: dict) -> None:
        """Raise ClaimLost when the node is no longer drained with this run's claim."""
        if self.claim is None:
            return
        if not node:
            raise ClaimLost("Slurm no longer lists node %s" % self.node_of[host])
        if "DRAIN" not in node["flags"]:
            raise ClaimLost("someone resumed %s (now %s) while gpunode.tuning drained it: our claim on it ended; "
                            "not rebooted, not drained again" % (self.node_of[host], node["state"].lower()))
        claim = reboot.parse_claim(node.get("reason"))
        if not reboot.same_claim(claim, self.claim):
            raise ClaimLost("%s's drain reason is no longer this run's (%r): our claim on it ended; not rebooted"
                            % (self.node_of[host], node.get("reason")), by_run=claim is not None)

    def drained(self, host: str) -> bool:
        """No job left: sinfo says drained (not draining), and squeue lists no running or completing job on it."""
        node = self._node(host)
        self._check_claim(host, node)
        if node.get("state") not in ("DRAINED", "DOWN"):
            return False
        return not self.jobs(host)

    def holds(self, host: str) -> str | None:
        """None when the node is drained with our claim and no job; why not (ClaimLost when the claim ended)."""
        node = self._node(host)
        self._check_claim(host, node)
        if node.get("state") not in ("DRAINED", "DOWN"):
            return "%s is %s, not drained" % (self.node_of[host], node.get("state", "unknown").lower())
        jobs = self.jobs(host)
        if jobs:
            return "Slurm still lists job(s) %s running or completing on %s" % (", ".join(jobs), self.node_of[host])
        return None

    def renew(self, host: str, force: bool = False) -> None:
        """Set the same reason again (slurmctld stamps it anew) while the node holds our claim."""
        text = self._reasons.get(host)
        if self.claim is None or not text:
            return
        if not force and time.monotonic() - self._renewed.get(host, 0) < self.claim["lease"] / 3.0:
            return
        node = self._node(host)
        if "DRAIN" in node.get("flags", ()) and reboot.same_claim(reboot.parse_claim(node.get("reason")), self.claim):
            self._call(["scontrol", "update", "NodeName=" + self.node_of[host], "Reason=" + text])
            self._renewed[host] = time.monotonic()

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
        if self.claim is not None:
            node = self._node(host)
            if node and "DRAIN" in node["flags"] and not reboot.same_claim(reboot.parse_claim(node.get("reason")),
                                                                           self.claim):
                raise ClaimLost("%s's drain reason is no longer this run's (%r): not resumed by this run"
                                % (self.node_of[host], node.get("reason")))
        try:
            self._call(["scontrol", "update", "NodeName=" + self.node_of[host], "State=RESUME"])
        except SequenceError:
            if not self.in_service(host):
                raise
        self._reasons.pop(host, None)

    def in_service(self, host: str) -> bool:
        node = self._node(host)
        return bool(node) and not node["out_of_service"]
