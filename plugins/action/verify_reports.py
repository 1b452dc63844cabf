# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action gpunode.tuning.verify_reports: write a host's verification reports, or the fleet summary.

Runs on the controller only and starts no module: it renders the role's report templates with the
host's variables (what ``ansible.builtin.template`` would render, byte for byte) and writes the
files itself (module_utils/core/files.py: created directory, temporary file and rename, changed
only when the content or mode changes, nothing written in check mode). The role's three
``template`` tasks per host (each a ``stat`` and a ``copy`` module run on the controller) and the
``file`` task before them become one task that costs no Python start and no connection.

Options (the role's verify_report.yml is the caller):

- ``dir`` (str, required): absolute report directory, created when missing.
- ``result`` (dict): the host's verification result: writes ``<inventory_hostname>.json``,
  ``.junit.xml`` and ``.md``, and ``<inventory_hostname>.<name>`` for each document of the result's
  ``exports`` (``{name: document}``, the knob families' exports, e.g. ``topology.json``) as JSON.
- ``fleet`` (dict): the fleet summary (filter gpunode.tuning.verify_fleet): writes
  ``fleet-summary.md``.

Returns ``changed``, ``dir`` and ``files`` (each path: created, updated, mode or unchanged).
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpunode.tuning.plugins.plugin_utils import reports

ARGUMENT_SPEC = {
    "dir": {"type": "str", "required": True},
    "result": {"type": "dict"},
    "fleet": {"type": "dict"},
}


class ActionModule(ActionBase):
    """Render and write verification reports on the controller (plugin_utils/reports.py)."""

    TRANSFERS_FILES = False
    _requires_connection = False  # no persistent connection to start for this: nothing here touches the node

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC, required_one_of=[["result", "fleet"]])[1]
        return reports.write(self._templar, task_vars, args["dir"], args["result"], args["fleet"],
                             bool(self._task.check_mode))
