# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""BENCHMARK ONLY: a module that carries and loads tuning_apply's code, then changes nothing.

benchmarks/noop/noop_payload.yml calls it where tune.yml --tags runtime runs tuning_apply. Its payload is
tuning_apply's (the same imports: Ansible's packer ships every family the registry names), and it imports the
families it is given as tuning_apply would before running them, so its run costs what carrying and compiling
the collection's code costs, without the families' work and without the role's variables, precheck and
reports on the controller (bench_fleet.py, "P2 payload").
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: noop_payload
short_description: Benchmark stand-in that loads tuning_apply's code and does nothing
description: Takes tuning_apply's options, imports the named families, reports changed=false.
author: gpunode.tuning maintainers
"""

from ansible.module_utils.basic import AnsibleModule

# As tuning_apply: core._zipload first (module_utils compiled once per run), then the flow and the registry.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload  # noqa: F401

# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import apply, module_calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.registry import by_name


def main():
    module = AnsibleModule(argument_spec=apply.ARGUMENT_SPEC, supports_check_mode=True)
    for request in module.params["families"]:
        by_name(request["name"])
    module.exit_json(changed=False)


if __name__ == "__main__":
    main()
