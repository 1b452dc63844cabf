# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``command`` drain backend: the user's own commands (a load balancer, an inference router)."""

from __future__ import annotations

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
    their environment. Drains are ours by record (the command backend has no reason of its own to hold a claim).

    ``commands["fleet"]`` (gpunode_tuning_drain_fleet_command, optional): prints the fleet's hosts out of service,
    one a line (``host`` or ``host<TAB>why``), for the ``fleet`` budget scope; without it the fleet is the run.
    What it has no command for (keeping a failed host drained, a boot mark, readiness after the boot) is the
    interface's: nothing to do, ready at once."""

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

    def fleet(self) -> dict | None:
        """``{host: why}`` the fleet command lists out of service, or None without one."""
        if not self.commands.get("fleet"):
            return None
        argv = reboot.command_argv(self.commands["fleet"])
        rc, out, err = self.run(argv, self.timeout, {"GPUNODE_HOST": "", "GPUNODE_REASON": ""})
        if rc != 0:
            raise SequenceError("fleet command (%s) exited %s: %s" % (" ".join(argv), rc, (err or out).strip()[-400:]))
        listed = {}
        for line in out.splitlines():
            name, _tab, why = line.strip().partition("\t")
            if name.strip():
                listed[name.strip()] = why.strip() or "out of service (gpunode_tuning_drain_fleet_command)"
        return listed

    def states(self, hosts: list) -> dict:
        """A host whose check fails (exit 2 and up, a timeout: it cannot be reached) counts as out of service,
        ``unreachable``: nothing says it can take work."""
        out: dict = {"out_of_service": [], "ours": [], "claimed": {}, "unreachable": [], "why": {}}
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
        fleet = self.fleet()
        if fleet is not None:
            out["fleet"] = {h: why for h, why in fleet.items() if h not in hosts}
        return out

    def drain(self, host: str, reason: str) -> None:
        self._call("drain", host, reason)

    def drained(self, host: str) -> bool:
        return self._call("check", host) == 0

    def holds(self, host: str) -> str | None:
        """Right before the reboot: the check command still says drained (exit 1: someone put it back, and our
        claim on it ended)."""
        if self._call("check", host) == 1:
            raise ClaimLost("the drain check command says %s is back in service: our claim on it ended; not rebooted, "
                            "not drained again" % host)
        return None

    def undrain(self, host: str) -> None:
        self._call("undrain", host)

    def in_service(self, host: str) -> bool:
        return self._call("check", host) == 1
