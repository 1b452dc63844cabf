# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A family called outside the flow modules (flows/module_calls.py): as its own module (``run_module``), and where
there is no module, the boot re-apply and the guard (``SystemLookup``, ``run_argv``)."""

from __future__ import annotations

import shutil
from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Call, FamilyError

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def module_call(module: Any) -> Call:
    """The Call of an AnsibleModule (duck-typed: this file imports nothing of Ansible)."""
    try:
        run = command.runner(module.params.get("command_timeouts"))
    except command.TimeoutsError as exc:
        raise FamilyError(str(exc), {"changed": False}) from None
    return Call(params=module.params, check_mode=module.check_mode, diff=module._diff, warn=module.warn,
                run_command=run, atomic_move=module.atomic_move, lookup=module)


def run_module(module: Any, run: Callable[[Call], dict]) -> None:
    """The one shape of a family's module: options in, one family call, its result or its error out."""
    try:
        result = run(module_call(module))
    except FamilyError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(**result)


class SystemLookup:
    """What ``Node.bin_path`` asks of a module, without one: a lookup on the system PATH (boot re-apply)."""

    @staticmethod
    def get_bin_path(name: str) -> str | None:
        return shutil.which(name, path=SYSTEM_PATH)


def run_argv(argv: list) -> tuple:
    """``(rc, stdout, stderr)`` of a command in the C locale on the system PATH (boot re-apply), bounded by
    the default timeout of its kind (``command.DEFAULT_TIMEOUTS``)."""
    return command.run(argv, command.DEFAULT_TIMEOUTS[command.kind_of(argv)], {"PATH": SYSTEM_PATH})
