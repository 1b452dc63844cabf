# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every external command the collection runs on a node, bounded: a timeout per kind, the process group killed.

How it works and why: docs/dev/node-code.md, "core/command.py".
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from typing import Any, Callable

# Seconds per kind of command (the role's gpunode_tuning_command_timeouts, the modules' command_timeouts).
DEFAULT_TIMEOUTS = {
    "nvidia_smi": 30,
    "amd_smi": 30,
    "dcgmi": 600,
    "nvbandwidth": 600,
    "rocm_bandwidth": 600,
    "nccl_tests": 600,
    "pciutils": 30,
    "modprobe": 120,
    "systemctl": 120,
    "bootloader": 300,
    "udevadm": 60,
    "benchmark": 1800,
    "other": 120,
}
# The kind of a command, by the name of its program.
KINDS = {
    "nvidia-smi": "nvidia_smi", "amd-smi": "amd_smi", "dcgmi": "dcgmi", "nvbandwidth": "nvbandwidth",
    "TransferBench": "rocm_bandwidth", "rocm-bandwidth-test": "rocm_bandwidth", "rocm_bandwidth_test": "rocm_bandwidth",
    "all_reduce_perf": "nccl_tests", "all_reduce_perf_mpi": "nccl_tests",
    "setpci": "pciutils", "lspci": "pciutils", "modprobe": "modprobe", "systemctl": "systemctl",
    "update-grub": "bootloader", "grub-mkconfig": "bootloader", "grub2-mkconfig": "bootloader",
    "grubby": "bootloader", "udevadm": "udevadm",
}
# What a command that does not answer usually means, by kind.
HANGS = {
    "nvidia_smi": "a wedged GPU or driver",
    "amd_smi": "a wedged GPU or amdgpu driver",
    "dcgmi": "a wedged GPU, or nv-hostengine not answering",
    "nvbandwidth": "a wedged GPU, or a peer-to-peer copy that never completes",
    "rocm_bandwidth": "a wedged GPU, or a peer-to-peer copy that never completes",
    "nccl_tests": "a wedged GPU, or a collective that never completes (a peer transport that hangs)",
    "pciutils": "a device whose config space does not answer",
    "modprobe": "a module initialisation that hangs (driver or firmware)",
    "systemctl": "systemd does not answer, or the unit's job does not finish",
    "bootloader": "the boot configuration tool hangs",
    "udevadm": "udev does not settle",
    "benchmark": "the benchmark does not finish",
    "other": "the command hangs",
}
# The option of every module that runs commands (doc fragment gpunode.tuning.node.command_timeouts).
ARGUMENT_SPEC = dict(command_timeouts=dict(type="dict"))
TIMEOUT_RC = 124  # what coreutils' timeout(1) exits with
ALLOWED = "a mapping of %s to a number of seconds > 0" % ", ".join(sorted(DEFAULT_TIMEOUTS))
_GRACE = 2.0  # seconds between SIGTERM and SIGKILL, and for the output after SIGKILL


class Result(tuple):
    """``(rc, stdout, stderr)`` of a command; ``timed_out`` when it was killed at its timeout."""

    def __new__(cls, rc: int, stdout: str, stderr: str, timed_out: bool = False):
        self = super().__new__(cls, (rc, stdout, stderr))
        self.timed_out = timed_out
        return self

    @property
    def rc(self) -> int:
        return self[0]


class TimeoutsError(ValueError):
    """The timeouts given are not what ``validate`` allows; the message names what is."""


def validate(timeouts: Any) -> dict:
    """The timeouts per kind: ``DEFAULT_TIMEOUTS`` with ``timeouts`` (a partial mapping) over them."""
    if timeouts is None:
        return dict(DEFAULT_TIMEOUTS)
    if not isinstance(timeouts, dict):
        raise TimeoutsError("command_timeouts must be %s, got %r" % (ALLOWED, timeouts))
    unknown = sorted(str(k) for k in timeouts if k not in DEFAULT_TIMEOUTS)
    if unknown:
        raise TimeoutsError("command_timeouts: unknown kind(s) %s; allowed: %s"
                            % (", ".join(unknown), ", ".join(sorted(DEFAULT_TIMEOUTS))))
    out = dict(DEFAULT_TIMEOUTS)
    for kind, value in timeouts.items():
        if value is None:
            continue
        if isinstance(value, str):  # a templated value arrives as text
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 10 ** 6:
            raise TimeoutsError("command_timeouts.%s must be a number of seconds > 0, got %r" % (kind, value))
        out[kind] = value
    return out


def kind_of(argv: list) -> str:
    """The kind of a command line (``nvidia_smi`` for ``/usr/bin/nvidia-smi ...``), ``other`` when unknown."""
    return KINDS.get(os.path.basename(str(argv[0])) if argv else "", "other")


def hang_message(name: str, timeout: float, kind: str) -> str:
    """``nvidia-smi did not answer within 30 s: a wedged GPU or driver``."""
    return "%s did not answer within %g s: %s; it was killed" % (name, timeout, HANGS.get(kind, HANGS["other"]))


def _kill(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except OSError:  # the group is gone already
        pass


def _collect(proc: subprocess.Popen) -> tuple:
    """What a killed command printed, waiting at most ``_GRACE``: a process stuck in the kernel may never exit."""
    try:
        return proc.communicate(timeout=_GRACE)
    except subprocess.TimeoutExpired:
        return b"", b""


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")


def run(argv: list, timeout: float, env_update: dict | None = None) -> Result:
    """Run ``argv`` (no shell) in the C locale and its own process group, killed after ``timeout`` seconds."""
    env = dict(os.environ, LC_ALL="C")
    env.update(env_update or {})
    try:
        # The collection's one bounded runner: AnsibleModule.run_command has no timeout (2.16-2.21), and
        # ansible-test 2.21's pylint flags subprocess in module_utils.
        # pylint: disable-next=ansible-bad-function
        proc = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        rc = 127 if exc.errno == errno.ENOENT else 126
        return Result(rc, "", "cannot run %s: %s" % (argv[0] if argv else "(nothing)", exc.strerror or exc))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc, signal.SIGTERM)
        deadline = time.monotonic() + _GRACE
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            _kill(proc, signal.SIGKILL)
        out, err = _collect(proc)
        message = hang_message(os.path.basename(str(argv[0])), timeout, kind_of(argv))
        return Result(TIMEOUT_RC, _decode(out), (_decode(err).rstrip() + "\n" + message).strip(), timed_out=True)
    return Result(proc.returncode, _decode(out), _decode(err))


def runner(timeouts: Any = None, env_update: dict | None = None) -> Callable[[list], Result]:
    """``run(argv, env=None) -> Result`` with the timeout of each command's kind (``validate``'s mapping); ``env``:
    variables set for that command only."""
    limits = validate(timeouts)

    def _run(argv: list, env: dict | None = None) -> Result:
        return run(argv, limits[kind_of(argv)], dict(env_update or {}, **(env or {})))

    return _run


def timed_out(result: Any) -> bool:
    """Whether a ``(rc, stdout, stderr)`` result is a command killed at its timeout."""
    return bool(getattr(result, "timed_out", False))


def failure(what: str, result: Any, limit: int = 300) -> str:
    """What went wrong with a command, for a message: its hang, or ``what failed (rc N): output``."""
    rc, stdout, stderr = result[0], result[1], result[2]
    if timed_out(result):
        return (stderr or "").strip().splitlines()[-1]
    text = " ".join(((stderr or "").strip() or (stdout or "").strip()).split())
    return "%s failed (rc %s): %s" % (what, rc, text[:limit] or "no message")
