# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the flow modules (tuning_apply, tuning_persist) call a family as its own module would.

How it works and why: docs/dev/node-code.md, "flows/module_calls.py".
"""

from __future__ import annotations

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Call, FamilyError


class CallMaker:
    """``(family, options, check_mode=None) -> Call`` for a module; ``base`` is the module's own Call."""

    def __init__(self, module):
        self.module = module
        try:  # every command bounded (command_timeouts, or the defaults): run_command has no timeout
            self.run = command.runner(module.params.get("command_timeouts"))
        except command.TimeoutsError as exc:
            module.fail_json(msg=str(exc))
        self.base = self.call({}, module.check_mode, "")

    def call(self, params, check_mode, name):
        module = self.module
        prefix = "%s: " % name if name else ""
        return Call(params=params, check_mode=check_mode, diff=module._diff,
                    warn=lambda msg: module.warn(prefix + msg),
                    run_command=self.run,
                    atomic_move=module.atomic_move, lookup=module)

    def __call__(self, fam, options, check_mode=None):
        spec = fam.argument_spec or {}
        options = dict(options)
        for key in ("root", "journal", "command_timeouts"):
            if key in spec and key not in options and key in self.module.params:
                options[key] = self.module.params[key]
        result = ArgumentSpecValidator(spec).validate(options)
        if result.error_messages:
            raise FamilyError("options of %s: %s" % (fam.name, "; ".join(result.error_messages)))
        return self.call(result.validated_parameters, self.module.check_mode if check_mode is None else check_mode,
                         fam.name)


def call_maker(module) -> CallMaker:
    """The CallMaker of ``module``."""
    return CallMaker(module)
