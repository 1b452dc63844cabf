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

import json
import os
import re

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.action import ActionBase

from ansible_collections.gpunode.tuning.plugins.module_utils.core import files as report_files
from ansible_collections.gpunode.tuning.plugins.plugin_utils import ansible_compat

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "roles", "tuning", "templates")
HOST_REPORTS = ((".json", "verify_host.json.j2"), (".junit.xml", "verify_junit.xml.j2"), (".md", "verify_host.md.j2"))
FLEET_REPORT = ("fleet-summary.md", "verify_fleet.md.j2")
# A family's export, written beside the host's reports as <host>.<name> (module_utils/core/family.py: Family.export).
EXPORT_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*\.json$")
# ansible.builtin.template's defaults: the reports must stay byte-identical to what it wrote.
JINJA_OPTIONS = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}
ARGUMENT_SPEC = {
    "dir": {"type": "str", "required": True},
    "result": {"type": "dict"},
    "fleet": {"type": "dict"},
}


class ActionModule(ActionBase):
    """Render and write verification reports on the controller."""

    TRANSFERS_FILES = False
    _requires_connection = False  # no persistent connection to start for this: nothing here touches the node

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC, required_one_of=[["result", "fleet"]])[1]
        directory = _report_dir(args["dir"])
        reports = []
        if args["result"] is not None:
            host = _file_name(task_vars.get("inventory_hostname"))
            reports += [(host + suffix, src, {"__result": args["result"]}) for suffix, src in HOST_REPORTS]
        if args["fleet"] is not None:
            reports.append(FLEET_REPORT + ({"__fleet": args["fleet"]},))
        # Render everything before the first write: a template error leaves the old reports whole.
        rendered = [(os.path.join(directory, name), self._render(src, task_vars, extra))
                    for name, src, extra in reports]
        if args["result"] is not None:
            rendered += [(os.path.join(directory, "%s.%s" % (host, name)), data)
                         for name, data in _exports(args["result"])]
        return self._write(directory, rendered, bool(self._task.check_mode))

    def _render(self, src, task_vars, extra):
        path = os.path.join(TEMPLATES, src)
        try:
            with open(path, encoding="utf-8") as handle:
                text = ansible_compat.trust_as_template(handle.read())
            variables = dict(task_vars)
            variables.update(extra)
            rendered = ansible_compat.render_template(self._templar, text, variables, [TEMPLATES], JINJA_OPTIONS)
            return to_bytes(rendered, encoding="utf-8", errors="surrogate_or_strict")
        except Exception as exc:  # any template or I/O error: name the template, as the template action does
            raise AnsibleActionFail("gpunode.tuning.verify_reports: cannot render %s: %s"
                                    % (src, to_native(exc))) from exc

    @staticmethod
    def _write(directory, rendered, check_mode):
        try:
            created = report_files.ensure_dir(directory, check_mode)
            files = {path: report_files.write_file(path, data, check_mode) or "unchanged" for path, data in rendered}
        except report_files.ReportError as exc:
            raise AnsibleActionFail("gpunode.tuning.verify_reports: %s" % exc) from exc
        changed = created or any(state != "unchanged" for state in files.values())
        return {"changed": changed, "dir": directory, "files": files}


def _exports(result):
    """``[(file name suffix, JSON bytes)]`` of a result's exports; a name that could leave the directory fails."""
    out = []
    for name, document in sorted((result.get("exports") or {}).items()):
        if not isinstance(name, str) or not EXPORT_NAME.match(name):
            raise AnsibleActionFail("gpunode.tuning.verify_reports: export name %r is not a file name ending in .json "
                                    "(letters, digits, '.', '_', '-')" % (name,))
        out.append((name, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")))
    return out


def _report_dir(path):
    if not path or not os.path.isabs(path) or "\0" in path:
        raise AnsibleActionFail("gpunode.tuning.verify_reports: dir must be an absolute directory path "
                                "(resolve gpunode_tuning_report_dir with gpunode.tuning.verify_report_dir), got: %r"
                                % (path,))
    return os.path.normpath(path)


def _file_name(host):
    # The host's name becomes a file name in the report directory: it must not lead out of it.
    if not isinstance(host, str) or host in ("", ".", "..") or "/" in host or "\0" in host:
        raise AnsibleActionFail("gpunode.tuning.verify_reports: the inventory host name %r cannot name a report "
                                "file (no '/', not '.' or '..')" % (host,))
    return host
