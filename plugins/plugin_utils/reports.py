# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verification reports rendered and written on the controller, without a module run.

Shared by the action gpunode.tuning.verify_reports (the role's verify_report.yml) and the rollout's one
task per host (action gpunode.tuning.tuning_flow, flow ``rollout``): the role's report templates are
rendered with the host's variables (what ``ansible.builtin.template`` would render, byte for byte) and
the files are written by module_utils/core/file_updates.py (created directory, temporary file and rename,
changed only when the content or mode changes, nothing written in check mode).
"""

from __future__ import annotations

import json
import os
import re

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_native

from ansible_collections.gpunode.tuning.plugins.module_utils.core import file_updates as report_files
from ansible_collections.gpunode.tuning.plugins.plugin_utils import ansible_compat

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "roles", "tuning", "templates")
HOST_REPORTS = ((".json", "verify_host.json.j2"), (".junit.xml", "verify_junit.xml.j2"), (".md", "verify_host.md.j2"))
FLEET_REPORT = ("fleet-summary.md", "verify_fleet.md.j2")
# A family's export, written beside the host's reports as <host>.<name> (module_utils/core/family.py: Family.export).
EXPORT_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*\.json$")
# ansible.builtin.template's defaults: the reports must stay byte-identical to what it wrote.
JINJA_OPTIONS = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}
PREFIX = "gpunode.tuning.verify_reports"


def write(templar, task_vars, directory, result=None, fleet=None, check_mode=False):
    """Render every report first (a template error leaves the old reports whole), then write them.

    ``result``: the host's verification result (``<inventory_hostname>.json``, ``.junit.xml``, ``.md`` and one
    ``<inventory_hostname>.<name>`` per document of its ``exports``); ``fleet``: the fleet summary
    (``fleet-summary.md``). Returns ``{"changed", "dir", "files"}``; raises AnsibleActionFail naming the problem.
    """
    directory = report_dir(directory)
    reports = []
    if result is not None:
        host = file_name(task_vars.get("inventory_hostname"))
        reports += [(host + suffix, src, {"__result": result}) for suffix, src in HOST_REPORTS]
    if fleet is not None:
        reports.append(FLEET_REPORT + ({"__fleet": fleet},))
    rendered = [(os.path.join(directory, name), _render(templar, src, task_vars, extra))
                for name, src, extra in reports]
    if result is not None:
        rendered += [(os.path.join(directory, "%s.%s" % (host, name)), data) for name, data in _exports(result)]
    try:
        created = report_files.ensure_dir(directory, check_mode)
        files = {path: report_files.write_file(path, data, check_mode) or "unchanged" for path, data in rendered}
    except report_files.ReportError as exc:
        raise AnsibleActionFail("%s: %s" % (PREFIX, exc)) from exc
    changed = created or any(state != "unchanged" for state in files.values())
    return {"changed": changed, "dir": directory, "files": files}


def _render(templar, src, task_vars, extra):
    path = os.path.join(TEMPLATES, src)
    try:
        with open(path, encoding="utf-8") as handle:
            text = ansible_compat.trust_as_template(handle.read())
        variables = dict(task_vars)
        variables.update(extra)
        rendered = ansible_compat.render_template(templar, text, variables, [TEMPLATES], JINJA_OPTIONS)
        return to_bytes(rendered, encoding="utf-8", errors="surrogate_or_strict")
    except Exception as exc:  # any template or I/O error: name the template, as the template action does
        raise AnsibleActionFail("%s: cannot render %s: %s" % (PREFIX, src, to_native(exc))) from exc


def _exports(result):
    """``[(file name suffix, JSON bytes)]`` of a result's exports; a name that could leave the directory fails."""
    out = []
    for name, document in sorted((result.get("exports") or {}).items()):
        if not isinstance(name, str) or not EXPORT_NAME.match(name):
            raise AnsibleActionFail("%s: export name %r is not a file name ending in .json "
                                    "(letters, digits, '.', '_', '-')" % (PREFIX, name))
        out.append((name, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")))
    return out


def absolute_dir(path):
    """gpunode_tuning_report_dir as an absolute path: a relative one is below the controller's working directory.

    Where the user ran ansible-playbook, not the playbook's directory (Ansible resolves relative paths of a
    playbook against its own directory; a user reading ``reports/`` expects it where they are).
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError("gpunode_tuning_report_dir must be a directory path, got: %r" % (path,))
    return os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(path)))


def report_dir(path):
    if not path or not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        raise AnsibleActionFail("%s: dir must be an absolute directory path (resolve gpunode_tuning_report_dir "
                                "with gpunode.tuning.verify_report_dir), got: %r" % (PREFIX, path))
    return os.path.normpath(path)


def file_name(host):
    # The host's name becomes a file name in the report directory: it must not lead out of it.
    if not isinstance(host, str) or host in ("", ".", "..") or "/" in host or "\0" in host:
        raise AnsibleActionFail("%s: the inventory host name %r cannot name a report file (no '/', not '.' or '..')"
                                % (PREFIX, host))
    return host
