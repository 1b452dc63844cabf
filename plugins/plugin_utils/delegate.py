# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Commands on a delegate (issue 30): the Slurm backend's ``sinfo`` and ``scontrol`` on another inventory host.

``gpunode_tuning_drain_slurm_delegate`` names the host the Slurm commands run on instead of the host being
rebooted (a login node, the controller): so that a host that never comes back still gets its drain reason
updated, and so that nodes without the Slurm client can be drained. The delegate is reached through its own
connection, built from its inventory variables (``ansible_connection``, ``ansible_host``, ``ansible_port``,
``ansible_user``, ``ansible_shell_executable`` and the connection plugin's own ``ansible_*`` options), as
``delegate_to`` would; ``localhost`` outside the inventory is Ansible's implicit one, the controller through
the ``local`` connection. Each command runs under coreutils' ``timeout`` with the task's ``environment:``.
"""

from __future__ import annotations

import shlex
import sys

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_text

from ansible_collections.gpunode.tuning.plugins.plugin_utils import ansible_compat

VARIABLE = "gpunode_tuning_drain_slurm_delegate"
IMPLICIT_LOCALHOST = ("localhost", "127.0.0.1", "::1")
ALLOWED = ("an inventory host name, or localhost for the controller (unset, the default: the Slurm commands run on "
           "the host itself)")


def delegate_problems(value, inventory_hosts) -> list[str]:
    """The precheck's line for gpunode_tuning_drain_slurm_delegate, [] when it is unset or names a host Ansible knows
    (an inventory host, or the implicit localhost)."""
    if value is None:
        return []
    if not isinstance(value, str) or not value.strip() or any(not c.isprintable() or c.isspace() for c in value):
        return ["%s must be %s (got %r)" % (VARIABLE, ALLOWED, value)]
    if value in IMPLICIT_LOCALHOST or value in set(inventory_hosts or ()):
        return []
    return ['%s must be %s (got "%s": no such host in the inventory)' % (VARIABLE, ALLOWED, value)]


def _variables(templar, task_vars: dict, name: str) -> dict:
    """The delegate's connection variables (its ``ansible_*`` ones), templated; the implicit localhost's otherwise."""
    hostvars = task_vars.get("hostvars") or {}
    if name in hostvars:
        raw = hostvars[name]
        out = {key: templar.template(raw[key]) for key in list(raw.keys()) if key.startswith("ansible_")}
    else:
        out = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    out["inventory_hostname"] = name
    return out


class DelegateRunner:
    """``run(argv, timeout) -> (rc, stdout, stderr)`` on the delegate, through one connection of its own."""

    def __init__(self, action, name: str, task_vars: dict, environment: dict):
        self.name, self.environment = name, dict(environment)
        variables = _variables(action._templar, task_vars, name)
        transport = variables.get("ansible_connection") or C.DEFAULT_TRANSPORT
        context = action._play_context.copy()
        context.connection = transport
        context.remote_addr = variables.get("ansible_host") or name
        context.port = variables.get("ansible_port")
        context.remote_user = variables.get("ansible_user")
        context.executable = variables.get("ansible_shell_executable") or C.DEFAULT_EXECUTABLE
        self.context = context
        self.connection = action._shared_loader_obj.connection_loader.get(transport, context, None)
        if self.connection is None:
            raise AnsibleError("%s: the connection plugin %r of %s was not found" % (VARIABLE, transport, name))
        self.connection.set_options(var_options=variables)

    def __call__(self, argv: list, timeout: float) -> tuple:
        command = "timeout %d %s" % (max(int(timeout), 1), shlex.join(argv))
        command = ("%s %s" % (ansible_compat.shell_env_prefix(self.connection, self.environment), command)).strip()
        if self.connection.allow_executable and self.context.executable:
            command = "%s -c %s" % (self.context.executable, shlex.quote(command))
        try:
            rc, stdout, stderr = self.connection.exec_command(command, sudoable=False)
        except AnsibleError as exc:  # the delegate cannot be reached: the backend names the command that failed
            return 255, "", "on the delegate %s: %s" % (self.name, exc)
        return rc, to_text(stdout, errors="surrogate_or_replace"), to_text(stderr, errors="surrogate_or_replace")

    def close(self) -> None:
        try:
            self.connection.close()
        except AnsibleError:
            pass
