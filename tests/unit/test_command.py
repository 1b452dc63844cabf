"""module_utils/core/command.py: every external command bounded, its process group killed, the hang named."""

from __future__ import annotations

import os
import sys
import time

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import calls, command


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("#!%s\n%s\n" % (sys.executable, body))
    path.chmod(0o755)
    return str(path)


def test_a_command_that_answers_returns_its_output_in_the_c_locale(tmp_path):
    prog = script(tmp_path, "nvidia-smi", "import os, sys; print(os.environ['LC_ALL']); sys.exit(3)")
    result = command.run([prog, "--query-gpu=index"], 5)
    assert tuple(result) == (3, "C\n", "") and not result.timed_out and not command.timed_out(result)


def test_a_hanging_command_and_its_children_are_killed_at_the_timeout_and_named(tmp_path):
    pidfile = tmp_path / "child.pid"
    prog = script(tmp_path, "nvidia-smi", "import subprocess, sys, time\n"
                  "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                  "open(%r, 'w').write(str(child.pid))\nprint('started', flush=True)\ntime.sleep(600)" % str(pidfile))
    result = command.run([prog], 1)
    assert result.timed_out and result.rc == command.TIMEOUT_RC and result[1] == "started\n"
    assert result[2] == "nvidia-smi did not answer within 1 s: a wedged GPU or driver; it was killed"
    assert command.failure("nvidia-smi --query-gpu", result) == result[2]
    child = int(pidfile.read_text())
    for _attempt in range(50):  # the whole process group went, the grandchild too
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the hanging command's child %d is still alive" % child)


def test_a_command_that_ignores_sigterm_is_killed(tmp_path):
    prog = script(tmp_path, "setpci", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                  "print('x', flush=True)\ntime.sleep(600)")
    result = command.run([prog, "-s", "0000:41:00.0", "CAP_EXP+08.w"], 0.5)
    assert result.timed_out
    assert "setpci did not answer within 0.5 s: a device whose config space does not answer" in result[2]


def test_a_missing_program_is_rc_127_naming_it():
    result = command.run(["/nonexistent/nvidia-smi"], 5)
    assert result.rc == 127 and "cannot run /nonexistent/nvidia-smi" in result[2]


def test_timeouts_per_kind_and_what_is_allowed():
    assert command.validate(None) == command.DEFAULT_TIMEOUTS
    limits = command.validate({"nvidia_smi": 2, "dcgmi": "900"})
    assert limits["nvidia_smi"] == 2 and limits["dcgmi"] == 900.0 and limits["modprobe"] == 120
    assert command.kind_of(["/usr/bin/nvidia-smi", "-q"]) == "nvidia_smi"
    assert command.kind_of(["/usr/sbin/update-grub"]) == "bootloader" and command.kind_of(["true"]) == "other"
    with pytest.raises(command.TimeoutsError, match="unknown kind.s. nvidia; allowed: amd_smi, benchmark, bootloader"):
        command.validate({"nvidia": 3})
    for bad in (0, -1, True, "soon", [3]):
        with pytest.raises(command.TimeoutsError, match="must be a number of seconds > 0"):
            command.validate({"nvidia_smi": bad})
    with pytest.raises(command.TimeoutsError, match="must be a mapping of amd_smi, benchmark"):
        command.validate([30])


def test_the_runner_applies_each_kinds_limit(tmp_path):
    smi = script(tmp_path, "nvidia-smi", "import time; time.sleep(600)")
    other = script(tmp_path, "sleeper", "import time; time.sleep(1); print('done')")
    run = command.runner({"nvidia_smi": 0.5, "other": 20})
    assert run([smi]).timed_out
    assert tuple(run([other])) == (0, "done\n", "")


def test_the_boot_runners_commands_are_bounded_too(tmp_path, monkeypatch):
    monkeypatch.setitem(command.DEFAULT_TIMEOUTS, "nvidia_smi", 0.5)
    smi = script(tmp_path, "nvidia-smi", "import time; time.sleep(600)")
    assert calls.run_argv([smi]).timed_out


def test_a_module_with_bad_timeouts_fails_before_running_anything(run_module, build_node):
    root = build_node("tiny-vm")
    result, failed = run_module("kmod_optional", {"name": "msr", "root": root, "command_timeouts": {"modprobe": -1}})
    assert failed and "command_timeouts.modprobe must be a number of seconds > 0, got -1" in result["msg"]
