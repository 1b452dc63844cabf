# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_settings
short_description: Set NVIDIA GPU persistence mode, power limits and clocks, journaled for rollback
version_added: 1.0.0
description:
  - Sets persistence mode, the power limit, locked graphics clocks and application clocks of the GPUs that
    C(nvidia-smi) lists. Nothing is changed unless an option asks for it.
  - Persistence uses NVIDIA's daemon where it is installed. On the running system with the
    C(nvidia-persistenced) unit the unit is enabled and started; C(nvidia-smi -pm) is used only where the
    daemon is missing.
  - Every power limit is checked against the GPU's minimum and maximum, every clock against the GPU's
    C(clocks.max.graphics) or C(clocks.max.memory), before anything is written.
  - With O(journal), each original (persistence mode, power limit and clocks per GPU, the daemon's enabled and
    active state) is recorded before the first write, in family C(gpu_settings); O(restore=true) writes them back.
  - ECC mode is never changed (a reboot and fleet-wide consequences); the verification's C(gpu_health) reports it.
  - On a simulated node (O(root) other than V(/)) only the node's own C(<root>/usr/bin/nvidia-smi) runs, never
    the controller's.
  - On a node whose GPUs are AMD's (AMD GPUs on the PCI bus, no NVIDIA one) the power cap and the performance
    level go through C(amd-smi) (PATH, then C(/opt/rocm/bin)), bounded by C(command_timeouts.amd_smi), with
    C(amd-smi set -g I J ... --power-cap W), C(--perf-level LEVEL) or C(--perf-determinism MHZ), one call per
    wanted value for the GPUs that differ, read back from C(amd-smi static --json) and C(amd-smi metric --json),
    journaled per GPU and restored. O(persistence) and the clocks are NVIDIA's only.
author:
  - gpunode.tuning contributors (@gpunode)
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.command_timeouts
  - gpunode.tuning.node.attributes
options:
  persistence:
    description:
      - V(true) turns persistence mode on (the driver keeps GPU state while no client runs), V(false) off.
        Unset leaves it alone.
    type: bool
  power_limit:
    description:
      - Power limit in watts for every GPU, within each GPU's minimum and maximum. Unset leaves it alone.
    type: int
  power_limits:
    description:
      - Power limit in watts per GPU, keyed by PCI address (C(DDDD:BB:DD.F) or C(BB:DD.F)); overrides
        O(power_limit) for those GPUs.
    type: dict
  locked_clocks:
    description:
      - Lock the graphics clock of every GPU to this range in MHz, C({min, max}) with min <= max <=
        C(clocks.max.graphics) (C(nvidia-smi -lgc min,max)). Locked clocks give steady kernel latency (no
        boost ramp, no idle downclock); they cost power and thermal headroom and can hold the GPU at a clock it
        cannot sustain under power or thermal limits.
      - nvidia-smi shows no lock in its queries, so the journal records each lock (original C(unlocked), restored
        with C(nvidia-smi -rgc)); a GPU is taken as locked when the journal holds its lock and its graphics clock
        is inside the range. Without O(journal) the lock is sent on every run.
      - Unset leaves the clocks alone.
    type: dict
  application_clocks:
    description:
      - Application clocks of every GPU in MHz, C({memory, graphics}) (C(nvidia-smi -ac memory,graphics)), each
        at most the GPU's C(clocks.max.memory) or C(clocks.max.graphics). nvidia-smi accepts only the pairs the
        GPU supports (C(nvidia-smi -q -d SUPPORTED_CLOCKS)); the value is read back after the write.
      - The original pair is journaled and written back on restore (C(nvidia-smi -rac) where none was read).
        A GPU that reports no application clocks fails the run before any write. Unset leaves them alone.
    type: dict
  perf_level:
    description:
      - AMD GPUs only. The performance level of every AMD GPU (C(amd-smi set --perf-level)), one of V(auto), V(low),
        V(high), V(manual), V(stable_std), V(stable_peak), V(stable_min_mclk), V(stable_min_sclk),
        V(determinism). The original level is journaled and restored. Unset leaves it alone.
    type: str
  perf_determinism_mhz:
    description:
      - AMD GPUs only. Performance determinism with this GFX clock ceiling in MHz
        (C(amd-smi set --perf-determinism MHZ)); the level then reads V(determinism), which is what is verified
        (amd-smi reports no determinism ceiling). Restore puts the journaled level back. Unset leaves it alone.
    type: int
  journal:
    description:
      - Path of the journal on the node (below O(root)), for example C(/var/lib/gpunode-tuning/journal.json).
        Unset means no journal.
    type: str
  restore:
    description:
      - Ignore the other settings and write back every original the journal records for this family, then
        drop those entries. Needs O(journal). An original that cannot be written back stays in the journal.
    type: bool
    default: false
notes:
  - None of C(nvidia-smi -pm), C(-pl), C(-lgc) or C(-ac) survives a reboot or driver reload; the role's boot unit
    re-applies them.
  - In check mode nothing runs but the C(nvidia-smi) query; RV(changes) is what would change.
"""

EXAMPLES = r"""
- name: Persistence on, 450 W on every GPU
  gpunode.tuning.gpu_settings:
    persistence: true
    power_limit: 450
    journal: /var/lib/gpunode-tuning/journal.json

- name: Lock the graphics clock of every GPU at 1980 MHz for steady latency
  gpunode.tuning.gpu_settings:
    locked_clocks: {min: 1980, max: 1980}
    journal: /var/lib/gpunode-tuning/journal.json

- name: Put back what this collection changed
  gpunode.tuning.gpu_settings:
    restore: true
    journal: /var/lib/gpunode-tuning/journal.json
"""

RETURN = r"""
changes:
  description: What changed (in check mode, what would change), one entry per GPU and setting.
  returned: always
  type: list
  elements: dict
  sample: [{"gpu": "0000:41:00.0", "setting": "power_limit", "before": 600.0, "after": 450}]
gpus:
  description: Every GPU nvidia-smi lists, as read after the change.
  returned: always
  type: list
  elements: dict
  sample: [{"bdf": "0000:41:00.0", "persistence_mode": "Enabled", "power_limit": 450.0, "graphics_clock": 1980.0,
            "application_clocks": {"memory": 14001, "graphics": 2430}}]
"""

from ansible.module_utils.basic import AnsibleModule

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, calls  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_settings


def build_module():
    return AnsibleModule(argument_spec=gpu_settings.ARGUMENT_SPEC, supports_check_mode=True)


def main():
    calls.run_module(build_module(), gpu_settings.run)


if __name__ == "__main__":
    main()
