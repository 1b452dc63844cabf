# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``command`` drain backend: the user's own commands (a load balancer, an inference router)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain import (
    COMMAND_TIMEOUT,
    Backend,
    ClaimLost,
    SequenceError,
)


class CommandBackend(Backend):
    """The user's commands, run on the controller with ``GPUNODE_HOST`` (and ``GPUNODE_REASON`` for the drain) in
    their environment, and, with a claim (reboot.claim_of; the action always gives one), ``GPUNODE_TUNING_CLAIM``
    (this run's ``{claim run=... ctl=... start=... lease=...}`` mark) in every command's.

    A drain is a claim (issue 42) where the check command says so: a last line ``claim: {claim ...} age=<s>``
    (reboot.parse_claim_line; the age since the user's scheduler stamped the drain or its renewal, never the
    controller's clock) is judged as Slurm's reason: another run's live claim is ``claimed``, an expired one or
    ours is ``ours`` (adopted); the drain command is called again with ``GPUNODE_TUNING_RENEW=1`` to renew (only
    for a host whose check printed our claim), and right before the reboot our claim must still hold. A check
    that prints no claim line leaves the drains ours by record, as before (reboot_sequence.foreign).

    ``commands["fleet"]`` (gpunode_tuning_drain_fleet_command, optional): prints the fleet's hosts out of service,
    one a line (``host`` or ``host<TAB>why``), for the ``fleet`` budget scope; without it the fleet is the run.
    What it has no command for (keeping a failed host drained, a boot mark, readiness after the boot) is the
    interface's: nothing to do, ready at once."""

    name = "command"

    def __init__(self, run: Callable[[list, float, dict], tuple], commands: dict, timeout: float = COMMAND_TIMEOUT,
                 claim: dict | None = None):
        self.run, self.commands, self.timeout, self.claim = run, commands, timeout, claim
        self._reasons: dict = {}
        self._renewed: dict = {}
        self._aware: set = set()  # hosts whose check printed a claim line: the claim is the check's word there

    def _env(self, host: str, reason: str = "", renew: bool = False) -> dict:
        env = {"GPUNODE_HOST": host, "GPUNODE_REASON": reason}
        if self.claim is not None:
            env["GPUNODE_TUNING_CLAIM"] = reboot.claim_mark(self.claim)
        if renew:
            env["GPUNODE_TUNING_RENEW"] = "1"
        return env

    def _call(self, which: str, host: str, reason: str = "", renew: bool = False) -> tuple:
        argv = reboot.command_argv(self.commands[which])
        rc, out, err = self.run(argv, self.timeout, self._env(host, reason, renew))
        if which == "check" and rc in (0, 1):
            return rc, out
        if rc != 0:
            raise SequenceError("%s command for %s (%s) exited %s: %s" % (
                which, host, " ".join(argv), rc, (err or out).strip()[-400:]))
        return rc, out

    def _check(self, host: str) -> tuple:
        """``(drained, claim, age)``: the check's exit (0: drained) and its claim line (None, None without one, or
        without a claim of this run to judge it by)."""
        rc, out = self._call("check", host)
        if self.claim is None:
            return rc == 0, None, None
        try:
            claim, age = reboot.parse_claim_line(out)
        except ValueError as exc:
            raise SequenceError("check command for %s: %s" % (host, exc)) from None
        if claim is not None:
            self._aware.add(host)
        return rc == 0, claim, age

    def _foreign(self, claim: dict | None, age: int | None) -> str | None:
        """Why the claim the check printed is another live run's, or None (ours, expired, or none)."""
        if claim is None or reboot.same_claim(claim, self.claim):
            return None
        stamped = None if age is None else 0
        if reboot.claim_live(claim, stamped, age):
            return "%s (the drain check command's claim line)" % reboot.claim_text(claim, stamped, age)
        return None

    def _check_claim(self, host: str, claim: dict | None, age: int | None) -> None:
        """Raise ClaimLost when the check says the host no longer holds this run's claim: another claim on it, or
        no claim line from a check that printed one before."""
        if self.claim is None or host not in self._aware or reboot.same_claim(claim, self.claim):
            return
        if claim is None:
            raise ClaimLost("the drain check command prints no claim for %s any more: our claim on it ended; not "
                            "rebooted, not drained again" % host)
        raise ClaimLost("the drain check command says %s holds run %s's claim on %s (age %s s), no longer this "
                        "run's: our claim on it ended; not rebooted" % (host, claim["run"], claim["ctl"], age),
                        by_run=True)

    def fleet(self) -> dict | None:
        """``{host: why}`` the fleet command lists out of service, or None without one."""
        if not self.commands.get("fleet"):
            return None
        argv = reboot.command_argv(self.commands["fleet"])
        rc, out, err = self.run(argv, self.timeout, self._env(""))
        if rc != 0:
            raise SequenceError("fleet command (%s) exited %s: %s" % (" ".join(argv), rc, (err or out).strip()[-400:]))
        listed = {}
        for line in out.splitlines():
            name, _tab, why = line.strip().partition("\t")
            if name.strip():
                listed[name.strip()] = why.strip() or "out of service (gpunode_tuning_drain_fleet_command)"
        return listed

    def states(self, hosts: list) -> dict:
        """A host whose check fails (exit 2 and up, a timeout, a claim line that is none: it cannot be judged)
        counts as out of service, ``unreachable``: nothing says it can take work. A drained host whose check
        prints a claim line is another live run's (``claimed``) or ours (our claim, or an expired one: adopted)."""
        out: dict = {"out_of_service": [], "ours": [], "claimed": {}, "unreachable": [], "why": {}}
        for host in hosts:
            try:
                drained, claim, age = self._check(host)
            except SequenceError as exc:
                out["out_of_service"].append(host)
                out["unreachable"].append(host)
                out["why"][host] = "unreachable: %s" % exc
                continue
            if drained:
                out["out_of_service"].append(host)
                out["why"][host] = "the drain check command says drained"
                why = self._foreign(claim, age)
                if why:
                    out["claimed"][host] = why
                elif claim is not None:
                    out["ours"].append(host)
        fleet = self.fleet()
        if fleet is not None:
            out["fleet"] = {h: why for h, why in fleet.items() if h not in hosts}
        return out

    def drain(self, host: str, reason: str) -> None:
        self._call("drain", host, reason)
        self._reasons[host], self._renewed[host] = reason, time.monotonic()

    def drained(self, host: str) -> bool:
        drained, claim, age = self._check(host)
        if drained:
            self._check_claim(host, claim, age)
        return drained

    def holds(self, host: str) -> str | None:
        """Right before the reboot: the check command still says drained (exit 1: someone put it back, and our
        claim on it ended) and, where it prints claims, with ours."""
        drained, claim, age = self._check(host)
        if not drained:
            raise ClaimLost("the drain check command says %s is back in service: our claim on it ended; not rebooted, "
                            "not drained again" % host)
        self._check_claim(host, claim, age)
        return None

    def renew(self, host: str, force: bool = False) -> None:
        """The drain command again, with ``GPUNODE_TUNING_RENEW=1`` (renew the stamp, do not drain again), at most
        every third of the lease unless ``force``; only while the check prints our claim on the drained host."""
        if self.claim is None or host not in self._reasons or host not in self._aware:
            return
        if not force and time.monotonic() - self._renewed.get(host, 0) < self.claim["lease"] / 3.0:
            return
        drained, claim, _age = self._check(host)
        if drained and reboot.same_claim(claim, self.claim):
            self._call("drain", host, self._reasons[host], renew=True)
            self._renewed[host] = time.monotonic()

    def undrain(self, host: str) -> None:
        """Never for a host whose check prints another run's claim (ClaimLost: left as it is)."""
        if self.claim is not None:
            drained, claim, _age = self._check(host)
            if drained and claim is not None and not reboot.same_claim(claim, self.claim):
                raise ClaimLost("the drain check command says %s holds run %s's claim on %s: not returned to service "
                                "by this run" % (host, claim["run"], claim["ctl"]), by_run=True)
        self._call("undrain", host)
        self._reasons.pop(host, None)

    def in_service(self, host: str) -> bool:
        return self._call("check", host)[0] == 1
