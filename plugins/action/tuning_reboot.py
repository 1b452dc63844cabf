# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action gpunode.tuning.tuning_reboot: the fleet reboot's sequence, one phase per task (docs/rebooting.md).

- ``survey`` (run once, before any host is tuned): which hosts of the play are out of service and not by this
  collection (they are skipped), and which were drained by it in an earlier, interrupted run (adopted).
- ``reboot`` (per host that needs a reboot, all hosts of a batch at once): wait for a slot in
  gpunode_tuning_reboot_max_unavailable (polling the backend for every host of the run), drain, wait until
  drained, reboot (the simulated one on a simulated root), wait for a new boot id, the boot unit and the GPUs.
  Then the gate (the role's verification, full gate) and, unless ``hold``, the return to service; a host that
  fails stays drained with the reason, and the run's later reboots stop. The result carries the gate's
  ``verification``, which the rollout uses for the host instead of verifying it again.
- ``return`` (the rollout with its measure gate: ``hold`` kept the gated host drained while the benchmark ran
  after the reboot): back to service when the measure gate kept the tuning; a host it rolled back stays
  drained (it needs a reboot to restore the command line), and the run's later reboots stop.

The decisions are plugin_utils/reboot.py and plugin_utils/reboot_sequence.py; this file runs the commands
(Slurm's on the host's connection, the command backend's on the controller), each under a timeout.
Documented in plugins/modules/tuning_reboot.py.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shlex
import socket
import subprocess
import time

from ansible.plugins.action import ActionBase

from ansible_collections.gpunode.tuning.plugins.plugin_utils import (
    ansible_compat,
    delegate,
    flow_task,
    reboot,
    role_variables,
)
from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot_sequence as seq
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.command import CommandBackend
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.kubernetes import KubernetesBackend
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.none import NoneBackend
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.slurm import SlurmBackend

ARGUMENT_SPEC = {
    "phase": {"type": "str", "required": True, "choices": ["survey", "reboot", "return"]},
    "pending": {"type": "list", "elements": "str", "default": []},
    "reboot": {"type": "bool", "default": True},
    "survey": {"type": "dict"},
    "hold": {"type": "bool", "default": False},
    "hold_for": {"type": "float", "default": 0.0},
    "kept": {"type": "bool", "default": False},
    "why": {"type": "str", "default": ""},
    # {host: why} of the hosts the rollout found unreachable (its first step per host ignores unreachable, so such
    # a host stays in the play): they count as out of service for the budget.
    "unreachable": {"type": "dict", "default": {}},
}
SIMULATED_REBOOT = "var/lib/simnode/reboot"
BOOT_ID = "proc/sys/kernel/random/boot_id"
BOOT_UNIT = "gpunode-tuning-boot.service"
# How long the boot unit and the GPUs may take after the host answers again (bounded by the reboot timeout).
BOOT_SETTLE = 600
# How long a Slurm command that did not reach slurmctld is asked again before it fails the sequence: Slurm's
# own SlurmctldTimeout default (how long a backup controller waits before it takes over).
SLURM_RETRY = 120
# What the claim's lease adds to the measure gate's runs (hold_for): the reading and tasks around them.
HOLD_SLACK = 600
VARS = ("gpunode_tuning_reboot_ok", "gpunode_tuning_drain", "gpunode_tuning_reboot_max_unavailable",
        "gpunode_tuning_reboot_timeout", "gpunode_tuning_reboot_wait_timeout", "gpunode_tuning_drain_timeout",
        "gpunode_tuning_reboot_poll_interval", "gpunode_tuning_drain_command", "gpunode_tuning_drain_check_command",
        "gpunode_tuning_undrain_command", "gpunode_tuning_root", "gpunode_tuning_drain_slurm_delegate",
        "gpunode_tuning_reboot_claim_lease", "gpunode_tuning_reboot_budget_scope",
        "gpunode_tuning_drain_slurm_fleet_partitions", "gpunode_tuning_drain_kubernetes_fleet_selector",
        "gpunode_tuning_drain_fleet_command")


def run_pid() -> int:
    """The ansible-playbook process this worker belongs to: the one that started it (multiprocessing keeps its pid),
    not the current parent, which after the run was killed is whoever adopted the orphan (a worker that was
    starting when the run was killed must not take its adopter for the run, and go on draining and rebooting)."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid else os.getppid()


def run_id() -> str:
    """This ansible-playbook run: the pid of the process whose workers run the tasks, and its start time."""
    ppid = run_pid()
    try:
        with open("/proc/%d/stat" % ppid, encoding="utf-8") as fh:
            started = fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "0"
    return "%d-%s" % (ppid, started)


def run_started() -> float:
    """When this ansible-playbook run started (the controller's clock; shown in the claim, never compared)."""
    try:
        with open("/proc/%d/stat" % run_pid(), encoding="utf-8") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="utf-8") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return boot + ticks / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError, StopIteration):
        return time.time()


def _pause(seconds):
    """A backend's pause before it asks again: stops (RunEnded) once the run that started it is gone."""
    seq.check_run()
    time.sleep(seconds)


class ActionModule(ActionBase):
    """One phase of the reboot sequence for this host (or, for the survey, for every host of the play)."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        self._vars = role_variables.typed_values({name: self._templar.template(task_vars.get(name)) for name in VARS})
        self._host = task_vars["inventory_hostname"]
        self._hosts = list(task_vars.get("ansible_play_hosts_all") or [self._host])
        # The budget counts every host of the run: those the survey set aside (out of service) are not the play's.
        surveyed = (args.get("survey") or {}).get("hosts") or []
        self._hosts += [h for h in surveyed if h not in self._hosts]
        settings, errors = seq.settings_of(self._vars, len(self._hosts))
        errors += delegate.delegate_problems(self._vars["gpunode_tuning_drain_slurm_delegate"],
                                             (task_vars.get("groups") or {}).get("all"))
        if errors:
            return {"failed": True, "changed": False, "msg": "; ".join(errors)}
        self._hold = args["hold"] and not self._task.check_mode
        if self._hold:  # no renewal while the measure gate runs: the claim outlasts its runs
            settings["claim_lease"] = max(settings["claim_lease"], args["hold_for"] + HOLD_SLACK)
        self._settings = settings
        report_dir = self._templar.template(task_vars.get("gpunode_tuning_report_dir", "reports/"))
        self._records = seq.Records(os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(report_dir))),
                                    run_id())
        self._claim = reboot.claim_of(self._records.run_id, socket.gethostname().split(".")[0], run_started(),
                                      settings["claim_lease"])
        self._touched, self._drain_started = 0.0, None
        self._delegate = None
        seq.guard_run(run_pid())
        try:
            self._backend = self._make_backend(settings["drain"], task_vars)
            if args["phase"] == "survey":
                result = seq.survey(self._backend, self._hosts, self._records, settings)
                return dict(result, changed=False, msg=self._survey_msg(result))
            if args["phase"] == "return":
                return self._return(args)
            return self._reboot(args, task_vars)
        except seq.SequenceError as exc:
            return {"failed": True, "changed": False, "msg": "%s: %s" % (self._host, exc)}
        finally:
            if self._delegate is not None:
                self._delegate.close()

    # --- backends --------------------------------------------------------------------------------------------

    def _make_backend(self, name, task_vars):
        if name == "slurm":
            hostvars = task_vars.get("hostvars") or {}
            node_of = {}
            for host in self._hosts:
                given = hostvars[host].get("gpunode_tuning_drain_slurm_node") if host in hostvars else None
                node_of[host] = reboot.slurm_node_name(host, self._templar.template(given))
            return SlurmBackend(self._slurm_runner(task_vars), node_of, claim=self._claim,
                                fleet_partitions=self._vars["gpunode_tuning_drain_slurm_fleet_partitions"],
                                retry_for=SLURM_RETRY, pause=_pause)
        if name == "command":
            commands = {"drain": self._vars["gpunode_tuning_drain_command"],
                        "check": self._vars["gpunode_tuning_drain_check_command"],
                        "undrain": self._vars["gpunode_tuning_undrain_command"],
                        "fleet": self._vars["gpunode_tuning_drain_fleet_command"]}
            return CommandBackend(self._run_on_controller, commands, claim=self._claim)
        if name == "kubernetes":
            hostvars = task_vars.get("hostvars") or {}
            given = {h: (hostvars.get(h) or {}).get("gpunode_tuning_drain_kubernetes_node") for h in self._hosts}
            node_of = {h: self._templar.template(v) or h for h, v in given.items()}
            kubeconfig = self._templar.template(task_vars.get("gpunode_tuning_drain_kubeconfig"))
            context = self._templar.template(task_vars.get("gpunode_tuning_drain_kubernetes_context"))
            return KubernetesBackend(node_of, kubeconfig, context, error=seq.SequenceError, claim=self._claim,
                                     fleet_selector=self._vars["gpunode_tuning_drain_kubernetes_fleet_selector"])
        return NoneBackend()

    def _slurm_runner(self, task_vars):
        """Where sinfo and scontrol run: the host itself, or gpunode_tuning_drain_slurm_delegate (same environment)."""
        name = self._vars["gpunode_tuning_drain_slurm_delegate"]
        if not name or name == self._host:
            return self._run_on_host
        environment = {}
        self._compute_environment_string(raw_environment_out=environment)
        self._delegate = delegate.DelegateRunner(self, name, task_vars, environment)
        return self._delegate

    def _run_on_host(self, argv, timeout):
        """``(rc, stdout, stderr)`` of ``argv`` on the host, with the task's environment, killed after ``timeout``."""
        command = "timeout %d %s" % (max(int(timeout), 1), shlex.join(argv))
        env = self._compute_environment_string()
        result = self._low_level_execute_command(("%s %s" % (env, command)).strip(), sudoable=False)
        return result.get("rc"), result.get("stdout", ""), result.get("stderr", "")

    @staticmethod
    def _run_on_controller(argv, timeout, env):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                                  env=dict(os.environ, **env), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return 124, "", "did not finish within %s s" % timeout
        except OSError as exc:
            return 127, "", str(exc)
        return proc.returncode, proc.stdout, proc.stderr

    @staticmethod
    def _survey_msg(result):
        if not result["out_of_service"]:
            return "no host out of service before the run%s" % (
                "; adopted (drained by gpunode.tuning before): " + ", ".join(result["ours"]) if result["ours"] else "")
        return "out of service before the run, not by gpunode.tuning (skipped): %s" % "; ".join(
            "%s (%s)" % kv for kv in result["out_of_service"].items())

    # --- the reboot ------------------------------------------------------------------------------------------

    def _reboot(self, args, task_vars):
        host, backend = self._host, self._backend
        survey = args["survey"] or {}
        reason = reboot.drain_reason(args["pending"])
        adopted = host in (survey.get("ours") or [])
        out = {"changed": False, "host": host, "backend": backend.name, "reason": reason, "rebooted": False}
        if host in (survey.get("out_of_service") or {}):
            return dict(out, failed=True, out_of_service=True, msg="%s is out of service, not by gpunode.tuning (%s): "
                        "not drained, not rebooted, not resumed" % (host, survey["out_of_service"][host]))
        if self._task.check_mode:
            verb = "reboot without a drain" if backend.name == "none" else "drain (%s) and reboot" % backend.name
            if not args["reboot"]:
                verb = "verify and return to service (drained by gpunode.tuning before this run)"
            return dict(out, changed=True, would=verb, msg="would %s %s: %s" % (verb, host, reason))
        if not args["reboot"]:
            if host in (survey.get("claimed") or {}) and not self._claim_ended(host):
                return dict(out, failed=True, msg="%s: %s; waited %d s for it (gpunode_tuning_reboot_wait_timeout): "
                            "left as it is" % (host, survey["claimed"][host], self._settings["wait_timeout"]))
            if host in (survey.get("claimed") or {}) and host not in backend.states([host])["ours"]:
                return dict(out, msg="%s: the run that claimed it returned it; nothing left to do" % host)
            backend.drain(host, reason)  # adopted: this run's claim replaces the one that ran out
            return self._gate_and_return(dict(out, adopted=True), task_vars)
        return self._slot_and_drain(out, args, reason, adopted, task_vars)

    def _slot_and_drain(self, out, args, reason, adopted, task_vars):
        """Take a slot, drain, and hand over to the reboot; back to the slot's wait when another run's claim met
        this drain (the same node, or the last slot, at the same moment)."""
        host, backend, records, survey = self._host, self._backend, self._records, args["survey"] or {}
        began = time.monotonic()
        while True:
            settings = dict(self._settings, wait_timeout=max(self._settings["wait_timeout"] - int(
                time.monotonic() - began), 1), seen_claimed=host in (survey.get("claimed") or {})
                or "contested" in out)
            slot = seq.take_slot(backend, records, host, self._hosts, settings, adopted,
                                 want=self._wanting(task_vars),
                                 unreachable=lambda: self._unreachable(task_vars, args["unreachable"]))
            out["waited"] = round(time.monotonic() - began, 1)
            if not slot["taken"]:
                return dict(out, failed=True, out_of_service=bool(slot.get("skip")),
                            msg="%s was not rebooted (its tuning is applied, the reboot is pending): %s"
                            % (host, slot["why"]))
            booted = self._already_booted(args["pending"]) if not adopted else None
            if booted:
                # Another run rebooted it while this one waited (its claim held the node): no second reboot.
                records.write(host, "done", reason=booted)
                return self._gate_only(dict(out, already_booted=True), booted, task_vars)
            self._drain_started = time.monotonic()
            backend.drain(host, reason)
            out["changed"] = True
            contest = self._contested(adopted)
            if not contest:
                try:
                    return self._drain_and_reboot(out, reason, task_vars)
                except seq.ClaimLost:  # another run drained it at the same moment and holds it: waited for
                    contest = "claimed"
            out["contested"] = contest
            if contest != "claimed":
                backend.undrain(host)  # still ours: back in service at once, and the slot asked for again
            records.write(host, "waiting", reason=contest)
            seq.check_run()
            time.sleep(random.uniform(0.5, 2.0) * self._settings["poll"])  # noqa: S311 - a jitter, not a secret

    def _contested(self, adopted):
        """Right after the drain, read again (another run may have decided at the same moment, on its own
        controller): why this drain must step back, or None. Another live run's claim on the host replaced ours:
        "claimed" (waited for). More out of service than the budget allows (two runs took the last slot at once):
        every such run steps back and asks again after a random pause; one that drained before the others
        never meets this."""
        if adopted:
            return None
        host = self._host
        with self._records.lock():
            polled = self._backend.states(self._hosts)
            if host in seq.claims(self._backend, polled, self._records, self._hosts, self._settings["claim_lease"]):
                return "claimed"
            budget, fleet_out = seq.fleet_budget(polled, self._settings)
            down = set(polled["out_of_service"]) | {host}
            if len(down) + len(fleet_out) > budget:
                return "stepped back: %d out of service with this drain (%s), over the budget of %d" % (
                    len(down) + len(fleet_out), ", ".join(sorted(down) + sorted(fleet_out)), budget)
        return None

    def _claim_ended(self, host):
        """Wait (within gpunode_tuning_reboot_wait_timeout) until no other live run claims the host."""
        def ended():
            with self._records.lock():
                polled = self._backend.states([host])
                return host not in seq.claims(self._backend, polled, self._records, [host],
                                              self._settings["claim_lease"])
        return seq.wait_until(ended, self._settings["wait_timeout"], self._settings["poll"], errors=[])

    def _already_booted(self, pending):
        """Why the host needs no reboot any more (the running kernel's command line holds every pending argument:
        another run rebooted it), or None. Read right before the drain."""
        if not pending:
            return None
        root = self._vars.get("gpunode_tuning_root") or "/"
        rc, stdout, _err = self._run_on_host(["cat", os.path.join(root, "proc/cmdline")], 20)
        running = set(stdout.split()) if rc == 0 else set()
        if running and all(arg in running for arg in pending):
            return "already booted with %s (rebooted while this run waited for it): not rebooted again" % " ".join(
                pending)
        return None

    def _gate_only(self, out, why, task_vars):
        ok, failures, verification = self._gate(task_vars)
        out.update(gate={"ok": ok, "failures": failures, "status": verification.get("status")},
                   verification=verification)
        if not ok:
            return dict(out, failed=True, msg="%s: %s; its gate failed: %s" % (self._host, why, "; ".join(failures)))
        return dict(out, msg="%s: %s; passed its gate" % (self._host, why))

    def _unreachable(self, task_vars, found):
        """``{host: why}``: the hosts of the run Ansible cannot reach now. Those it took out of the play
        (unreachable; an action cannot tell them from a host that failed out of the play, so those count too),
        and ``found``: those the rollout's first step found unreachable (kept in the play by ignore_unreachable)."""
        in_play = set(task_vars.get("ansible_play_hosts") or self._hosts)
        out = {}
        for host in task_vars.get("ansible_play_hosts_all") or []:
            if host not in in_play:
                out[host] = "no longer in the play (Ansible found it unreachable, or it failed)"
        for host, why in (found or {}).items():
            if host != self._host and host in self._hosts:
                out[host] = "unreachable: %s" % " ".join(str(why or "no answer").split())[:200]
        return out

    def _wanting(self, task_vars):
        """The hosts of this batch whose persistent flow left a reboot to do (and no failure): the slot's queue."""
        hostvars = task_vars.get("hostvars") or {}
        out = []
        for host in task_vars.get("ansible_play_batch") or [self._host]:
            if host not in hostvars:
                continue
            vars_of = hostvars[host]
            fact = ansible_compat.exported_fact
            required = self._templar.template(fact(vars_of, "gpunode_tuning_reboot_required", False))
            failures = self._templar.template(fact(vars_of, "__gpunode_tuning_failures") or [])
            if required is True and not failures:
                out.append(host)
        return out

    def _renew(self):
        """Renew this run's claim on the host: the backend's mark and (for the backends without one) its record."""
        self._backend.renew(self._host)
        if time.monotonic() - self._touched >= self._settings["claim_lease"] / 3.0:
            record = self._records.read(self._host) or {}
            if record.get("run") == self._records.run_id and record.get("state") in seq.IN_FLIGHT:
                self._records.write(self._host, record["state"])
            self._touched = time.monotonic()

    def _released(self, out, exc):
        """Our claim on the host ended (an operator resumed it, another run took it): left as it is, never
        drained again, not rebooted; the run goes on."""
        self._records.write(self._host, "released", reason=str(exc))
        return dict(out, failed=True, released=True, msg="%s: %s" % (self._host, exc))

    def _fail_drained(self, out, why, stage):
        """The host stays drained, its reason saying why, and the run's later reboots stop."""
        text = " ".join(("%s %s" % (reboot.OUR_REASON_PREFIX, why)).split())[:reboot.MAX_REASON]
        try:
            self._backend.keep_drained(self._host, text)
        except seq.SequenceError as exc:
            why += " (and its drain reason could not be updated: %s)" % exc
        self._records.write(self._host, "failed", reason=why, stage=stage)
        self._records.halt(self._host, why)
        return dict(out, failed=True, stays_drained=True, stage=stage, msg="%s stays drained: %s" % (self._host, why))

    def _drain_and_reboot(self, out, reason, task_vars):
        try:
            return self._after_drain(out, reason, task_vars)
        except seq.ClaimLost as exc:
            record = self._records.read(self._host) or {}
            if exc.by_run and record.get("state") in ("draining", "drained"):
                raise  # not rebooted yet: the other run's claim is waited for (_reboot)
            return self._released(out, exc)
        except seq.RunEnded:
            raise
        except seq.SequenceError as exc:  # the scheduler failed after the drain: the host stays out of service
            return self._fail_drained(out, "a scheduler command failed after the drain: %s" % exc, "scheduler")

    def _drained_check(self, errors):
        """backend.drained, never believed on the first answer after the backend failed to answer."""
        state = {"errors": 0}

        def check():
            ok = self._backend.drained(self._host)
            seen = len(errors) + len(getattr(self._backend, "retried", ()))
            if ok and seen > state["errors"]:
                state["errors"] = seen
                return False  # ask again: the scheduler has just come back
            return ok

        return check

    def _after_drain(self, out, reason, task_vars):
        host, backend, records, settings = self._host, self._backend, self._records, self._settings
        started = self._drain_started or time.monotonic()  # drain_s: from the drain itself
        errors = []
        if not seq.wait_until(self._drained_check(errors), settings["drain_timeout"], settings["poll"],
                              errors=errors, renew=self._renew):
            blocked = getattr(backend, "blocked", {}).get(host)  # the kubernetes backend: a PodDisruptionBudget
            blocked = "; " + blocked if blocked else ""
            failed = "; the scheduler did not answer: %s" % errors[-1][:200] if errors else ""
            return self._fail_drained(out, "the drain did not finish within %d s (gpunode_tuning_drain_timeout): work "
                                      "is still running on it%s%s" % (settings["drain_timeout"], blocked, failed),
                                      "drain")
        out["drain_s"] = round(time.monotonic() - started, 1)
        records.write(host, "drained", reason=reason)
        halted = records.halted()
        if halted:
            backend.undrain(host)
            records.write(host, "returned", reason="not rebooted: " + halted)
            return dict(out, failed=True, msg="%s was drained, then returned to service without its reboot (still "
                        "pending): the run's reboots stopped (%s)" % (host, halted))
        out["boot_mark"] = backend.boot_mark(host)
        # Right before the reboot: the node read again, rebooted only if our claim still holds, it is drained and
        # no work is left on it.
        backend.renew(host, force=True)
        held = backend.holds(host)
        if held:
            raise seq.ClaimLost("not rebooted: %s" % held)
        records.write(host, "rebooting", reason=reason)
        started = time.monotonic()
        back, detail = self._reboot_host(task_vars)
        out["reboot_s"] = round(time.monotonic() - started, 1)
        if not back:
            return self._fail_drained(out, detail, "reboot")
        records.write(host, "back", reason=reason, boot_id=detail)
        return self._gate_and_return(dict(out, rebooted=True, boot_id=detail), task_vars)

    def _read_boot_id(self, root):
        rc, stdout, _err = self._run_on_host(["cat", os.path.join(root, BOOT_ID)], 20)
        return stdout.strip() if rc == 0 else None

    def _reboot_host(self, task_vars):
        """``(True, new boot id)`` or ``(False, why)``."""
        root = self._vars.get("gpunode_tuning_root") or "/"
        timeout = self._settings["reboot_timeout"]
        if root == "/":
            return self._reboot_live(task_vars)
        script = os.path.join(root, SIMULATED_REBOOT)
        before = self._read_boot_id(root)
        rc, _out, err = self._run_on_host(["test", "-x", script], 20)
        if rc != 0:
            return False, "the simulated root %s has no %s (tools/simnode build writes it): not rebooted" % (
                root, SIMULATED_REBOOT)
        rc, _out, err = self._run_on_host([script], min(timeout, 600))
        if rc not in (0, 1, 3):
            return False, "the simulated reboot exited %s: %s" % (rc, err.strip()[-300:])
        new = {}

        def changed():
            new["id"] = self._read_boot_id(root)
            return bool(new["id"]) and new["id"] != before

        if seq.wait_until(changed, timeout, self._settings["poll"], errors=[], renew=self._renew):
            return True, new["id"]
        return False, "did not come back within %d s of its reboot (gpunode_tuning_reboot_timeout): the boot id is " \
                      "still %s" % (timeout, before)

    def _reboot_live(self, task_vars):
        task = self._task.copy()
        task.args = {"reboot_timeout": self._settings["reboot_timeout"],
                     "msg": "gpunode.tuning reboots to apply the kernel command line"}
        action = self._shared_loader_obj.action_loader.get(
            "ansible.builtin.reboot", task=task, connection=self._connection, play_context=self._play_context,
            loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        result = action.run(task_vars=task_vars)
        if result.get("failed") or result.get("unreachable"):
            return False, "did not come back within %d s of its reboot: %s" % (
                self._settings["reboot_timeout"], result.get("msg", "no answer"))
        settle = min(BOOT_SETTLE, self._settings["reboot_timeout"])

        def settled():
            rc, stdout, _err = self._run_on_host(["systemctl", "show", "-p", "ActiveState", "--value", BOOT_UNIT], 20)
            if rc == 0 and stdout.strip() == "activating":
                return False
            rc, _out, _err = self._run_on_host(["sh", "-c", "! command -v nvidia-smi >/dev/null || nvidia-smi -L"], 60)
            return rc == 0

        if not seq.wait_until(settled, settle, self._settings["poll"]):
            return False, "came back, but the boot unit or the GPUs (nvidia-smi -L) did not settle within %d s" % settle
        return True, self._read_boot_id("/") or "unknown"

    # --- the gate and the return ----------------------------------------------------------------------------

    def _gate(self, task_vars):
        """``(ok, failures, verification)``: the role's verification with the full gate, as its flows run it."""
        return flow_task.gate(self, task_vars, "full")

    def _gate_and_return(self, out, task_vars):
        """Verify the host with the full gate, then return it to service; or keep it drained and halt the run.
        With ``hold`` a host that passed stays drained ("gated") for the rollout's measure gate (phase return)."""
        host, records = self._host, self._records
        self._backend.renew(host, force=True)  # the gate is a step without renewals: a full lease ahead of it
        ok, failures, verification = self._gate(task_vars)
        self._backend.renew(host, force=True)
        out["gate"] = {"ok": ok, "failures": failures, "status": verification.get("status")}
        out["verification"] = verification
        if not ok:
            # Each drifted row with its reason: the GPU checks name the GPU there (which GPU is missing, has the ECC
            # errors, ...), whatever family the row belongs to.
            rows = ["%s.%s: %s" % (row.get("family"), row.get("name"), " ".join(str(row.get("reason") or "").split()))
                    for row in verification.get("settings") or [] if row.get("state") == "drifted"]
            return self._fail_drained(out, "failed its gate after the reboot: %s" % (
                "; ".join(failures + rows)[:400]), "gate")
        mark = out.pop("boot_mark", None)
        if self._hold:
            kept = {k: out[k] for k in ("rebooted", "waited", "drain_s", "reboot_s", "boot_id", "adopted") if k in out}
            records.write(host, "gated", reason=out["reason"], boot_mark=mark, sequence=kept)
            return dict(out, changed=True, held=True, msg="%s: %s, passed its gate; held out of service for the "
                        "measure gate" % (host, self._verb(out)))
        return self._return_to_service(out, mark)

    def _verb(self, out):
        if not out.get("rebooted"):
            return "adopted"
        return "rebooted without a drain" if self._backend.name == "none" else "drained, rebooted"

    def _return_to_service(self, out, mark, after=""):
        host, backend, records, settings = self._host, self._backend, self._records, self._settings
        limit = min(settings["reboot_timeout"], BOOT_SETTLE)
        if not seq.wait_until(lambda: backend.ready(host, mark), limit, settings["poll"], errors=[], renew=self._renew):
            return self._fail_drained(out, "the scheduler did not see it register again (slurmd) within %d s"
                                      % limit, "return")
        backend.undrain(host)
        if not seq.wait_until(lambda: backend.in_service(host), limit, settings["poll"]):
            return self._fail_drained(out, "resumed, but not in service within %d s" % limit, "return")
        records.write(host, "done", reason="")
        return dict(out, changed=True, returned=True, msg="%s: %s, passed its gate%s and is back in service" % (
            host, self._verb(out), after))

    def _return(self, args):
        """After the rollout's measure gate ran on a host the sequence held: back to service when the gate kept
        the tuning; otherwise it stays drained (the rollback removed the boot configuration, but the running
        kernel still has the command line of the tuning: a reboot restores it), and the run's reboots stop."""
        host, records = self._host, self._records
        record = records.read(host) or {}
        if record.get("state") != "gated" or record.get("run") != records.run_id:
            return {"failed": True, "changed": False, "host": host, "msg": "%s: the reboot sequence holds no gated "
                    "host %s in this run (its record says %s)" % (host, host, record.get("state", "nothing"))}
        out = dict(record.get("sequence") or {}, changed=False, host=host, backend=self._backend.name,
                   reason=record.get("reason", ""), held=True)
        if self._task.check_mode:
            return dict(out, would="return to service", msg="would return %s to service" % host)
        if not args["kept"]:
            why = " ".join((args["why"] or "the measure gate did not keep the tuning").split())
            return self._fail_drained(out, "the measure gate did not keep its tuning after the reboot; it needs a "
                                      "reboot to restore the kernel command line (%s)" % why, "measure")
        return self._return_to_service(out, record.get("boot_mark"), " and the measure gate")
