"""plugin_utils/delegate.py: the Slurm backend's commands on a delegate (gpunode_tuning_drain_slurm_delegate).

The runner is built as the action builds it: Ansible's own connection loader and a PlayContext, here with the
``local`` connection (the controller), so the command really runs through a connection plugin, with the
delegate's shell executable, the task's environment and a timeout. tests/integration/test_reboot_slurm.py runs
the whole sequence through a delegate against a real Slurm.
"""

from __future__ import annotations

import os
import stat
import sys

import pytest
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader

from ansible_collections.gpunode.tuning.plugins.plugin_utils import delegate


class Templar:
    @staticmethod
    def template(value):
        return value


class Loaders:
    connection_loader = connection_loader


class Action:
    """What DelegateRunner uses of an action: the templar, the play context and the plugin loaders."""

    def __init__(self):
        self._templar = Templar()
        self._play_context = PlayContext()
        self._shared_loader_obj = Loaders()


@pytest.mark.parametrize("value,allowed", [
    (None, True), ("localhost", True), ("login-1", True), ("login-9", False), ("", False), ("a b", False),
    (["login-1"], False), ("login-1\n", False),
])
def test_the_delegate_must_be_a_host_the_inventory_holds_or_localhost(value, allowed):
    problems = delegate.delegate_problems(value, ["n1", "login-1"])
    assert (problems == []) is allowed, problems
    if not allowed:
        assert "gpunode_tuning_drain_slurm_delegate must be an inventory host name, or localhost" in problems[0]
    if value == "login-9":
        assert 'got "login-9": no such host in the inventory' in problems[0]


def test_a_command_runs_on_the_delegate_with_its_shell_and_the_task_environment(tmp_path):
    """The delegate's own ansible_shell_executable runs the command (a wrapper that marks its output), with the
    task's environment (SLURM_CONF), and stdout, stderr and the exit status come back."""
    wrapper = tmp_path / "login-shell"
    wrapper.write_text("#!/bin/sh\necho via-login-shell\nexec /bin/sh \"$@\"\n", encoding="ascii")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    task_vars = {"hostvars": {"login-1": {"ansible_connection": "local", "ansible_shell_executable": str(wrapper),
                                          "ansible_python_interpreter": sys.executable, "other": "ignored"}}}
    run = delegate.DelegateRunner(Action(), "login-1", task_vars, {"SLURM_CONF": str(tmp_path / "slurm.conf")})
    try:
        rc, out, err = run(["sh", "-c", 'echo "conf=$SLURM_CONF"; echo oops >&2; exit 3'], 10)
    finally:
        run.close()
    assert rc == 3
    assert out.splitlines() == ["via-login-shell", "conf=%s" % (tmp_path / "slurm.conf")]
    assert err.strip() == "oops"


def test_the_implicit_localhost_is_the_controller_and_every_command_is_bounded():
    run = delegate.DelegateRunner(Action(), "localhost", {"hostvars": {}}, {})
    rc, out, _err = run(["hostname"], 10)
    assert rc == 0 and out.strip() == os.uname().nodename
    rc, _out, _err = run(["sleep", "30"], 1)
    assert rc == 124  # coreutils' timeout ended it
