"""A real Slurm cluster for the tests: Debian's slurmctld, slurmd and munged on loopback, started here.

No systemd, no root-owned system paths: one MUNGE daemon with its own key and socket, one slurmctld and one
slurmd per node, all on 127.0.0.1 with private ports and every file (configuration, key, sockets, pid files,
logs, state, spool) below the cluster's own directory. Every command is bounded by a timeout, and every daemon
is stopped by its pid file when the cluster stops (``with`` block or ``stop()``), also when a test failed::

    with SlurmCluster(nodes=6) as cluster:
        job = cluster.submit("n2", 8)                    # sbatch -w n2 --wrap "sleep 8"
        cluster.drain("n2", "gpunode.tuning: reboot")    # scontrol update ... State=DRAIN Reason=...
        cluster.wait_state("n2", "draining")
        with cluster.monitor() as seen:                  # sinfo polled in a thread
            cluster.reboot_node("n2")                    # slurmd stopped, started in a new boot
        assert seen.max_out_of_service <= 1

The daemons inherit ``GPUNODE_SLURM_CLUSTER=<directory>`` (and each slurmd ``GPUNODE_SLURM_NODE``): ``stop()``
also ends what they started and left running (slurmstepd and job processes), found by that mark, by their
ids. docs/dev/testing.md ("Slurm") says what runs, where, and how long it takes.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable

from support.background import Background

# The daemons and tools, from Debian's slurmctld, slurmd, slurm-client and munge (scripts/apt.sh).
DAEMONS = ("munged", "slurmctld", "slurmd")
TOOLS = ("munge", "unmunge", "sinfo", "scontrol", "sbatch", "squeue", "scancel")
MARK = "GPUNODE_SLURM_CLUSTER"
NODE_MARK = "GPUNODE_SLURM_NODE"
COMMAND_TIMEOUT = 20.0
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
PARTITION = "gpunodes"
# sinfo's %T words (after the flag suffixes are cut off) that take a node out of service, and the
# suffixes that do (sinfo(1), NODE STATE CODES: * not responding, $ maintenance reservation, @ pending
# reboot, ^ reboot issued): the test's own reading, independent of the code under test.
OUT_OF_SERVICE_WORDS = ("drain", "down", "fail", "maint", "reboot")
OUT_OF_SERVICE_SUFFIXES = "*$@^"
STATE_SUFFIXES = "*~#!%$@^-"
# The longest socket path AF_UNIX takes (sun_path is 108 bytes with its NUL); slurmd's step sockets
# live in its spool directory as <spool>/<node>_<job>.<step>.
MAX_SOCKET_PATH = 100


class SlurmError(RuntimeError):
    """A daemon did not start or stop, a command failed or timed out, or a wait ran out; the message says which."""


def missing_tools() -> list[str]:
    """The daemons and client tools this harness needs that are not on the PATH (empty: it can run)."""
    return [name for name in DAEMONS + TOOLS + ("mungekey",) if shutil.which(name) is None]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now (all bound at once, then released)."""
    sockets = []
    try:
        while len(sockets) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def base_state(state: str) -> str:
    """sinfo's %T state without its flag suffixes (``idle*`` -> ``idle``, ``down~`` -> ``down``)."""
    return state.rstrip(STATE_SUFFIXES)


def out_of_service(state: str) -> bool:
    """Whether sinfo's %T ``state`` takes the node out of service (drain, down, fail, maint, reboot, or a suffix
    ``*``, ``$``, ``@``, ``^``)."""
    if state[-1:] and state[-1] in OUT_OF_SERVICE_SUFFIXES:
        return True
    return any(word in base_state(state).lower() for word in OUT_OF_SERVICE_WORDS)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (a child of ours that exited) is not running.
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _environ_of(pid: int) -> dict:
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return "(no %s)" % path


class Sample:
    """One sinfo poll: when (monotonic seconds), each node's ``(state, reason)``, and the nodes out of service."""

    def __init__(self, when: float, nodes: dict):
        self.when = when
        self.nodes = nodes
        self.out = sorted(n for n, (state, _reason) in nodes.items() if out_of_service(state))

    def __repr__(self) -> str:
        return "Sample(%.2f, out=%s)" % (self.when, self.out)


class Monitor(Background):
    """Polls ``sinfo -N`` in a thread (``interval`` seconds) while its ``with`` block runs.

    ``max_out_of_service`` is the most nodes (of ``only``, default all) out of service in one poll,
    ``peak`` that poll; ``samples`` every poll; ``errors`` the polls that failed (a failed poll is
    never counted as "nothing out of service": a test should assert ``not errors``).
    """

    def __init__(self, cluster: SlurmCluster, interval: float = 0.2, only: Iterable[str] | None = None):
        super().__init__("slurm-monitor")
        self.cluster = cluster
        self.interval = interval
        self.only = set(only) if only is not None else None
        self.samples: list[Sample] = []
        self.errors: list[str] = []

    def _poll(self) -> None:
        try:
            nodes = self.cluster.sinfo()
        except SlurmError as exc:
            self.errors.append(str(exc))
            return
        if self.only is not None:
            nodes = {n: v for n, v in nodes.items() if n in self.only}
        self.samples.append(Sample(time.monotonic(), nodes))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poll()
            self._stop.wait(self.interval)

    join_timeout = COMMAND_TIMEOUT + 5

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._poll()  # the state at the end of the block counts too

    @property
    def peak(self) -> Sample | None:
        return max(self.samples, key=lambda s: len(s.out), default=None)

    @property
    def max_out_of_service(self) -> int:
        return len(self.peak.out) if self.samples else 0

    def ever_out(self) -> set:
        """Every node seen out of service in at least one poll."""
        return {n for s in self.samples for n in s.out}


class SlurmCluster:
    """A Slurm cluster of ``nodes`` (a count, named n1..nN, or the names) on this machine.

    ``directory``: where everything lives (default a new short directory under the system's temporary
    directory, removed by ``stop()``; a given one is kept). ``cpus``: CPUs each node claims (two: a
    one-CPU job leaves it ``mixed``). ``return_to_service``: slurm.conf's ReturnToService (1, the
    production default of many sites: a node that comes back after an unexpected reboot stays DOWN
    with "Node unexpectedly rebooted" until ``scontrol update State=RESUME``; 2 returns it by itself).
    ``slurmd_timeout``: seconds without an answer before slurmctld marks a node DOWN (the ``*``
    suffix shows earlier, at its next failed ping). ``extra_conf``: more slurm.conf lines (an Epilog,
    a RebootProgram), before the node lines.
    """

    def __init__(self, nodes: int | Iterable[str] = 6, directory: str | None = None, cpus: int = 2,
                 return_to_service: int = 1, slurmd_timeout: int = 10, command_timeout: float = COMMAND_TIMEOUT,
                 extra_conf: Iterable[str] = ()):
        self.nodes = ["n%d" % i for i in range(1, nodes + 1)] if isinstance(nodes, int) else list(nodes)
        if not self.nodes:
            raise ValueError("a cluster needs at least one node")
        self.cpus = cpus
        self.return_to_service = return_to_service
        self.slurmd_timeout = slurmd_timeout
        self.command_timeout = command_timeout
        self.extra_conf = list(extra_conf)
        self._own_directory = directory is None
        self.directory = os.path.abspath(directory or tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
        self.user = getpass.getuser()
        self.ports: dict = {}
        self.started_at: float | None = None
        self.timings: dict = {}
        self._running = False
        self._children: dict = {}

    # --- paths and environment -------------------------------------------------------------------

    def path(self, *parts: str) -> str:
        return os.path.join(self.directory, *parts)

    @property
    def conf(self) -> str:
        """slurm.conf of this cluster (SLURM_CONF of every command run through ``env``)."""
        return self.path("etc", "slurm.conf")

    @property
    def munge_socket(self) -> str:
        return self.path("munge", "munge.socket")

    def pid_file(self, daemon: str, node: str | None = None) -> str:
        return self.path("run", "%s-%s.pid" % (daemon, node) if node else "%s.pid" % daemon)

    def log_file(self, daemon: str, node: str | None = None) -> str:
        return self.path("log", "%s-%s.log" % (daemon, node) if node else "%s.log" % daemon)

    @property
    def env(self) -> dict:
        """The environment for Slurm's client commands (and for Ansible when it runs them): SLURM_CONF set."""
        env = dict(os.environ, SLURM_CONF=self.conf, LC_ALL="C")
        env[MARK] = self.directory
        env.pop(NODE_MARK, None)
        return env

    # --- commands ----------------------------------------------------------------------------------

    def run(self, argv: list[str], timeout: float | None = None, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` with the cluster's environment, bounded by ``timeout`` (default the cluster's)."""
        limit = self.command_timeout if timeout is None else timeout
        try:
            proc = subprocess.run(argv, env=env or self.env, capture_output=True, text=True, timeout=limit,
                                  check=False, stdin=subprocess.DEVNULL, cwd=self.directory)
        except subprocess.TimeoutExpired as exc:
            raise SlurmError("%s did not finish within %s s" % (" ".join(argv), limit)) from exc
        if check and proc.returncode != 0:
            raise SlurmError("%s exited %d: %s %s" % (" ".join(argv), proc.returncode, proc.stdout.strip(),
                                                      proc.stderr.strip()))
        return proc

    def sinfo(self) -> dict:
        """``{node: (state, reason)}`` from ``sinfo -N -h -o "%N|%T|%E"`` (reason ``none`` when there is none)."""
        out = {}
        for line in self.run(["sinfo", "-N", "-h", "-o", "%N|%T|%E"]).stdout.splitlines():
            name, state, reason = (line.split("|", 2) + ["", ""])[:3]
            out[name] = (state, reason)
        return out

    def state(self, node: str) -> str:
        return self.sinfo()[node][0]

    def show_node(self, node: str) -> dict:
        """``scontrol show node -o NODE`` as ``{key: value}`` (Reason's value runs to the end of the line)."""
        line = self.run(["scontrol", "show", "node", "-o", node]).stdout.strip()
        head, sep, reason = line.partition(" Reason=")
        out = dict(word.split("=", 1) for word in head.split() if "=" in word)
        if sep:
            out["Reason"] = reason
        return out

    def submit(self, node: str, seconds: float, cpus: int = 1) -> str:
        """``sbatch -w NODE --wrap "sleep SECONDS"``; returns the job id."""
        proc = self.run(["sbatch", "--parsable", "-w", node, "-p", PARTITION, "-c", str(cpus), "-J", "sleep-%s" % node,
                         "-D", self.path("jobs"), "-o", self.path("jobs", "slurm-%j.out"),
                         "--wrap", "sleep %s" % seconds])
        return proc.stdout.strip().split(";")[0]

    def jobs(self) -> dict:
        """``{job id: (state, nodes)}`` of the jobs squeue still lists."""
        proc = self.run(["squeue", "-h", "-o", "%i|%T|%N"])
        return {j: (s, n) for j, s, n in (line.split("|", 2) for line in proc.stdout.splitlines() if line)}

    def update(self, node: str, *settings: str) -> None:
        """``scontrol update NodeName=NODE SETTING...`` (``State=DRAIN``, ``Reason=...``)."""
        self.run(["scontrol", "update", "NodeName=%s" % node, *settings])

    def drain(self, node: str, reason: str) -> None:
        self.update(node, "State=DRAIN", "Reason=%s" % reason)

    def resume(self, node: str) -> None:
        self.update(node, "State=RESUME")

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.2) -> float:
        """Poll ``predicate`` until it is true; seconds it took; SlurmError naming ``what`` after ``timeout``."""
        start = time.monotonic()
        while True:
            if predicate():
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise SlurmError("waited %s s for %s; nodes now: %s" % (timeout, what, self._sinfo_or_error()))
            time.sleep(interval)

    def wait_state(self, node: str, states: str | Iterable[str], timeout: float = 30.0) -> str:
        """Wait until sinfo shows ``node`` in one of ``states`` (exact %T words, e.g. ``idle``, ``drained``)."""
        wanted = {states} if isinstance(states, str) else set(states)
        seen = {}

        def reached():
            seen["state"] = self.state(node)
            return seen["state"] in wanted

        self.wait_for("%s to be %s" % (node, " or ".join(sorted(wanted))), reached, timeout)
        return seen["state"]

    def _sinfo_or_error(self) -> str:
        try:
            return str(self.sinfo())
        except SlurmError as exc:
            return "(sinfo failed: %s)" % exc

    def monitor(self, interval: float = 0.2, only: Iterable[str] | None = None) -> Monitor:
        """A Monitor of this cluster (use it as ``with cluster.monitor() as seen:``)."""
        return Monitor(self, interval, only)

    # --- configuration -----------------------------------------------------------------------------

    def slurm_conf(self) -> str:
        """slurm.conf: loopback only (NoInAddrAny), private ports, this cluster's directories, short timeouts."""
        host = socket.gethostname().split(".")[0]
        lines = [
            "# gpunode.tuning tests (tests/support/slurm.py): a cluster on 127.0.0.1 below %s" % self.directory,
            "ClusterName=gpunodetest",
            "SlurmctldHost=%s(127.0.0.1)" % host,
            "SlurmctldPort=%d" % self.ports["slurmctld"],
            "SlurmUser=%s" % self.user,
            "SlurmdUser=%s" % self.user,
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s" % self.munge_socket,
            "CommunicationParameters=NoInAddrAny",
            "StateSaveLocation=%s" % self.path("state"),
            "SlurmdSpoolDir=%s" % self.path("spool", "%n"),
            "SlurmctldPidFile=%s" % self.pid_file("slurmctld"),
            "SlurmdPidFile=%s" % self.path("run", "slurmd-%n.pid"),
            "SlurmctldLogFile=%s" % self.log_file("slurmctld"),
            "SlurmdLogFile=%s" % self.path("log", "slurmd-%n.log"),
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # The nodes claim what the test says, whatever this machine has.
            "SlurmdParameters=config_overrides",
            "ReturnToService=%d" % self.return_to_service,
            # Short timeouts: a stopped slurmd is noticed, and a finished job leaves, in seconds.
            "SlurmdTimeout=%d" % self.slurmd_timeout,
            "SlurmctldTimeout=10",
            "MessageTimeout=5",
            "TCPTimeout=2",
            "KillWait=2",
            "MinJobAge=5",
            "InactiveLimit=0",
            "Waittime=0",
            "CompleteWait=0",
            "BatchStartTimeout=10",
            "ResumeTimeout=60",
            "HealthCheckInterval=0",
            *self.extra_conf,
        ]
        lines += ["NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=%d RealMemory=1000 State=UNKNOWN"
                  % (node, self.ports[node], self.cpus) for node in self.nodes]
        lines.append("PartitionName=%s Nodes=ALL Default=YES MaxTime=INFINITE State=UP" % PARTITION)
        return "\n".join(lines) + "\n"

    def _write_files(self) -> None:
        for sub in ("etc", "munge", "run", "log", "state", "jobs", *("spool/%s" % n for n in self.nodes)):
            os.makedirs(self.path(sub), mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)
        too_long = [p for p in (self.munge_socket, self.path("spool", max(self.nodes, key=len), "x_123456.4294967292"))
                    if len(p) > MAX_SOCKET_PATH]
        if too_long:
            raise SlurmError("socket path %s is longer than %d bytes: give the cluster a shorter directory "
                             "(the default is one under /tmp)" % (too_long[0], MAX_SOCKET_PATH))
        self.ports = dict(zip(["slurmctld", *self.nodes], free_ports(len(self.nodes) + 1), strict=True))
        with open(self.conf, "w", encoding="utf-8") as fh:
            fh.write(self.slurm_conf())
        key = self.path("munge", "munge.key")
        if not os.path.exists(key):
            self.run(["mungekey", "--create", "--keyfile", key], env=dict(os.environ, LC_ALL="C"))
        os.chmod(key, 0o600)

    # --- daemons -----------------------------------------------------------------------------------

    def _daemon_env(self, node: str | None = None) -> dict:
        env = self.env
        if node is not None:
            env[NODE_MARK] = node
        return env

    def _start_daemon(self, name: str, argv: list[str], pid_file: str, node: str | None = None) -> None:
        """Start a daemon in the foreground as a child of this process (so that it is reaped when it ends, whatever
        this machine's PID 1 does) and wait for the pid file it writes."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pid_file)
        label = "%s %s" % (name, node) if node else name
        with open(self.log_file(name, node) + ".out", "ab") as out:
            proc = subprocess.Popen(argv, env=self._daemon_env(node), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=self.directory, start_new_session=True)
        self._children[proc.pid] = proc

        def written():
            if proc.poll() is not None:
                raise SlurmError("%s exited %s at start: %s %s" % (label, proc.returncode,
                                                                   _tail(self.log_file(name, node) + ".out"),
                                                                   _tail(self.log_file(name, node))))
            return self._pid(pid_file) == proc.pid

        try:
            self.wait_for("%s to write %s" % (label, pid_file), written, timeout=START_TIMEOUT, interval=0.05)
        except SlurmError:
            self._end(proc.pid, label)
            raise

    def _pid(self, pid_file: str) -> int | None:
        """The running process of ``pid_file`` when it is one of this cluster's (its mark), else None."""
        try:
            with open(pid_file, encoding="ascii") as fh:
                pid = int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if not _pid_alive(pid) or _environ_of(pid).get(MARK) != self.directory:
            return None
        return pid

    def _start_munged(self) -> None:
        argv = ["munged", "--foreground", "--force", "--socket", self.munge_socket,
                "--key-file", self.path("munge", "munge.key"), "--pid-file", self.pid_file("munged"),
                "--log-file", self.log_file("munged"), "--seed-file", self.path("munge", "munged.seed"),
                "--num-threads", "4"]
        self._start_daemon("munged", argv, self.pid_file("munged"))
        cred = self.run(["munge", "-n", "-S", self.munge_socket]).stdout
        proc = subprocess.run(["unmunge", "-S", self.munge_socket], input=cred, capture_output=True, text=True,
                              timeout=self.command_timeout, check=False)
        if proc.returncode != 0:
            raise SlurmError("munged answers but its credential does not decode: %s" % proc.stderr.strip())

    def start_node(self, node: str, new_boot: bool = False) -> None:
        """Start ``node``'s slurmd. ``new_boot``: as if the node had just booted, so that slurmctld handles a reboot.

        The slurmd runs in a new time namespace whose boot clock starts near zero (``unshare --time --boottime``;
        its uptime then grows as a booted node's does). Where time namespaces are refused it runs with ``-b``,
        Slurm's own switch for tests, which reports an uptime of 0 at every registration: each later
        registration looks like one more reboot (after a RESUME too), so tests should not rely on it.
        """
        argv = ["slurmd", "-D", "-N", node, "-f", self.conf]
        if new_boot and self.time_namespaces():
            uptime = float(self._read("/proc/uptime").split()[0])
            argv = ["unshare", "--time", "--boottime", "%d" % -int(uptime), *argv]
        elif new_boot:
            argv.append("-b")
        self._start_daemon("slurmd", argv, self.pid_file("slurmd", node), node)

    @staticmethod
    def _read(path: str) -> str:
        with open(path, encoding="ascii") as fh:
            return fh.read()

    _time_namespaces: bool | None = None

    def time_namespaces(self) -> bool:
        """Whether this machine lets the harness start a process with its own boot clock (a time namespace)."""
        if SlurmCluster._time_namespaces is None:
            try:
                proc = subprocess.run(["unshare", "--time", "--boottime", "-1", "true"], capture_output=True,
                                      timeout=self.command_timeout, check=False)
                SlurmCluster._time_namespaces = proc.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                SlurmCluster._time_namespaces = False
        return SlurmCluster._time_namespaces

    def stop_node(self, node: str, kill_jobs: bool = True) -> None:
        """Stop ``node``'s slurmd by its pid file; ``kill_jobs``: also end its job steps, as a power-off would."""
        self._stop_pid_file(self.pid_file("slurmd", node), "slurmd %s" % node)
        if kill_jobs:
            self._kill_marked(lambda env: env.get(NODE_MARK) == node or env.get("SLURMD_NODENAME") == node)

    def reboot_node(self, node: str, down_seconds: float = 2.0, new_boot: bool = True, timeout: float = 20.0) -> None:
        """A reboot of ``node`` as Slurm sees it: slurmd and its jobs gone for ``down_seconds``, then a slurmd that
        reports a fresh boot registers; returns once slurmctld shows the new BootTime (SlurmError after ``timeout``).

        Slurm then sets the node DOWN, "Node unexpectedly rebooted" (unless ReturnToService is 2); a drained node
        stays drained, DOWN+DRAIN, with its reason. Slurm notices the reboot only when the boot time is a later
        second than the node's last answer: a reboot is never quicker than that.
        """
        before = self.show_node(node).get("BootTime")
        self.stop_node(node)
        time.sleep(down_seconds)
        self.start_node(node, new_boot=new_boot)
        if new_boot:
            self.wait_for("slurmctld to see %s's new boot (BootTime was %s)" % (node, before),
                          lambda: self.show_node(node).get("BootTime") not in (before, None), timeout)

    def stop_controller(self) -> None:
        """Stop slurmctld (it saves its state, as a controller restart does); ``start_controller`` brings it back."""
        self._stop_pid_file(self.pid_file("slurmctld"), "slurmctld")

    def start_controller(self) -> None:
        self._start_daemon("slurmctld", ["slurmctld", "-D", "-f", self.conf], self.pid_file("slurmctld"))
        self.wait_for("slurmctld to answer", lambda: "UP" in self.run(["scontrol", "ping"], check=False).stdout,
                      timeout=START_TIMEOUT)

    def start(self) -> SlurmCluster:
        """Start munged, slurmctld and every slurmd; return once every node is idle."""
        missing = missing_tools()
        if missing:
            raise SlurmError("missing %s: install Debian's slurmctld slurmd slurm-client munge (scripts/setup.sh "
                             "--tests)" % ", ".join(missing))
        begin = time.monotonic()
        self._running = True
        try:
            self._write_files()
            self._start_munged()
            self.start_controller()
            for node in self.nodes:
                self.start_node(node)
            self.wait_for("every node idle", lambda: all(s == "idle" for s, _r in self.sinfo().values())
                          and len(self.sinfo()) == len(self.nodes), timeout=START_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        self.timings["start_s"] = round(time.monotonic() - begin, 2)
        self.started_at = time.time()
        return self

    def _stop_pid_file(self, pid_file: str, label: str) -> None:
        pid = self._pid(pid_file)
        if pid is None:
            return
        self._end(pid, label)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pid_file)

    def _end(self, pid: int, label: str) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT; SlurmError when the process outlives both."""
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if self._gone(pid, wait):
                return
        raise SlurmError("%s (pid %d) did not stop" % (label, pid))

    def _gone(self, pid: int, wait: float) -> bool:
        """Whether ``pid`` ended within ``wait`` seconds (a child of ours is reaped)."""
        child = self._children.get(pid)
        if child is not None:
            try:
                child.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                return False
            del self._children[pid]
            return True
        deadline = time.monotonic() + wait
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not _pid_alive(pid)

    def _kill_marked(self, which: Callable[[dict], bool] = lambda env: True) -> list[int]:
        """End the processes this cluster started (its mark in their environment) that ``which`` selects."""
        ended = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            env = _environ_of(int(entry))
            if env.get(MARK) == self.directory and which(env) and _pid_alive(int(entry)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)
                ended.append(int(entry))
        return ended

    def stop(self) -> None:
        """Stop every daemon by its pid file (slurmds, slurmctld, munged), then end anything left of the
        cluster's (job steps); remove the directory when the cluster made it. Safe to call twice."""
        if not self._running:
            return
        begin = time.monotonic()
        problems = []
        if self._pid(self.pid_file("slurmctld")) is not None:
            with contextlib.suppress(SlurmError):
                self.run(["scancel", "--full", "-u", self.user], check=False, timeout=5)
        for daemon, node in [("slurmd", n) for n in self.nodes] + [("slurmctld", None), ("munged", None)]:
            try:
                self._stop_pid_file(self.pid_file(daemon, node), "%s %s" % (daemon, node or ""))
            except SlurmError as exc:
                problems.append(str(exc))
        self._kill_marked()
        for pid, child in list(self._children.items()):  # a daemon whose pid file went missing
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            child.wait(timeout=5)
            del self._children[pid]
        self._running = False
        self.timings["stop_s"] = round(time.monotonic() - begin, 2)
        if self._own_directory and not problems:
            shutil.rmtree(self.directory, ignore_errors=True)
        if problems:
            raise SlurmError("; ".join(problems))

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
