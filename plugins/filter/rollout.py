# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet rollout's decisions for playbooks/rollout.yml, from plugin_utils/rollout.py (one filter each).

Documented in the rollout_*.yml files next to this file.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.plugin_utils import rollout
from ansible_collections.gpunode.tuning.plugins.plugin_utils.role_variables import plain


def _mapping(name, value):
    if not isinstance(value, Mapping):
        raise AnsibleFilterError("gpunode.tuning.%s: expects a mapping, got %s" % (name, type(value).__name__))
    return plain(value)


def rollout_settings(raw):
    """``{settings, errors}`` of the rollout's variables (their names without ``gpunode_tuning_rollout_``)."""
    got, errors = rollout.settings(_mapping("rollout_settings", raw))
    return {"settings": got, "errors": errors}


def rollout_serial(raw):
    return rollout.serial(_mapping("rollout_serial", raw))


def rollout_host_result(state):
    return rollout.host_result(_mapping("rollout_host_result", state))


def rollout_gate(results, batch, canary, max_fail_percentage):
    """The batch gate; ``{}`` (not null: before ansible-core 2.19 a template's null is "") when it passes."""
    return rollout.batch_gate(plain(list(results)), int(batch), bool(canary), float(max_fail_percentage)) or {}


def rollout_summary(results, hosts, stopped, config, generated_at):
    summ = rollout.summary(plain(list(hosts)), plain(list(results)), plain(stopped) or None, plain(config),
                           str(generated_at))
    summ["lines"] = rollout.summary_lines(summ)
    return summ


def rollout_benchmark_runs(runs, host, phase, bench, settings, limit=None):
    """The measure gate's runs of one side read in the benchmark's format; after tuning, the verdict."""
    return rollout.benchmark_runs(plain(list(runs)), str(host), str(phase), plain(bench) or {},
                                  _mapping("rollout_benchmark_runs", settings), limit)


class FilterModule:
    """gpunode.tuning rollout filters."""

    def filters(self):
        return {"rollout_settings": rollout_settings, "rollout_serial": rollout_serial,
                "rollout_host_result": rollout_host_result, "rollout_gate": rollout_gate,
                "rollout_summary": rollout_summary, "rollout_benchmark_runs": rollout_benchmark_runs}
