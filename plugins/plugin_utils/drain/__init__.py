# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain backends of the reboot sequence (issue 41: one package, one file each, behind one interface).

``none.py``, ``slurm.py``, ``kubernetes.py`` and ``command.py`` each hold one backend; ``Backend`` below is the
interface every one of them answers (and the ``none`` behaviour: nothing to do, ready at once). The sequence
(plugin_utils/reboot_sequence.py) and the action (plugins/action/tuning_reboot.py) call only these methods.

A drain is a **claim** (issue 42): the mark a run leaves on a node names the run (its id, the controller, a
start time) and a lease the live run renews (``renew``). ``states`` tells a node claimed by another live run
(``claimed``: out of service, waited for, never touched) from one whose claim ran out (``ours``: adopted).
"""

from __future__ import annotations

COMMAND_TIMEOUT = 30


class SequenceError(Exception):
    """A backend command failed: the message names the command and what it said."""


class ClaimLost(SequenceError):
    """Our claim on the node ended while the sequence held it (an operator resumed the node, another run took
    it): the sequence leaves the node as it is, never drains it again and never reboots it. ``by_run``: the
    node now carries another run's claim (drained at the same moment by two runs): waited for, as any claim."""

    def __init__(self, message: str, by_run: bool = False):
        super().__init__(message)
        self.by_run = by_run


class Backend:
    """The interface (and the ``none`` backend's answers). ``host`` is always an inventory name of the run."""

    name = "none"

    def states(self, hosts: list) -> dict:
        """``{"out_of_service": [hosts], "ours": [hosts], "claimed": {host: why}, "why": {host: why}}`` and, for
        the fleet scope, ``"fleet": {name: why}`` (nodes of the fleet out of service that are not hosts of the
        run) and ``"fleet_size"`` (the fleet's nodes); a backend without a fleet leaves both out."""
        return {"out_of_service": [], "ours": [], "claimed": {}, "why": {}}

    def drain(self, host: str, reason: str) -> None:
        """Take the host out of service with ``reason`` (and this run's claim, where the backend keeps one)."""

    def drained(self, host: str) -> bool:
        """No work left on the host (raises ClaimLost when our claim on it ended)."""
        return True

    def holds(self, host: str) -> str | None:
        """Right before the reboot: None when our claim still holds and the host is drained with no work on it,
        else why not."""
        return None

    def renew(self, host: str, force: bool = False) -> None:
        """Renew this run's claim on the host (at most every third of the lease, unless ``force``)."""

    def keep_drained(self, host: str, reason: str) -> None:
        """The host stays out of service with ``reason`` (a failure after the drain)."""

    def boot_mark(self, host: str) -> str | None:
        return None

    def ready(self, host: str, mark: str | None = None) -> bool:
        return True

    def undrain(self, host: str) -> None:
        """Return the host to service (only what this run drained)."""

    def in_service(self, host: str) -> bool:
        return True
