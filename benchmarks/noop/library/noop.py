# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""BENCHMARK ONLY: a module that accepts no options and changes nothing.

benchmarks/noop/noop_distinct.yml calls it under five names (the symbolic links next to this
file), one per knob family, so that Ansible builds five module payloads per run as it does
for the collection's five runtime modules. Ansible keys its payload cache by module name.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: noop
short_description: Benchmark stand-in that does nothing
description: Accepts no options, reports changed=false.
author: gpunode.tuning maintainers
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.exit_json(changed=False)


if __name__ == "__main__":
    main()
