# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: the action plugin plugins/action/verify_reports.py does the work on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: verify_reports
short_description: Write verification reports on the controller without a module run
version_added: 1.0.0
description:
  - Renders the tuning role's report templates with the host's variables and writes the files in
    O(dir) on the controller. Nothing runs on the node and no module is started; it is an action
    plugin, used by the role's C(verify) entry point (C(roles/tuning/tasks/verify_report.yml)).
  - With O(result), writes C(<inventory_hostname>.json), C(<inventory_hostname>.junit.xml) and
    C(<inventory_hostname>.md); with O(fleet), C(fleet-summary.md). The content is what
    M(ansible.builtin.template) renders from the same templates.
  - Creates O(dir) (mode C(0755)) when missing. Each file (mode C(0644)) is written to a temporary
    file in O(dir) and renamed over the report, so a reader never sees half a report; a report
    whose content and mode are unchanged is left alone and does not count as changed.
  - Every template is rendered before the first file is written, so a rendering error leaves the
    earlier reports as they were.
author:
  - gpunode.tuning contributors (@gpunode)
options:
  dir:
    description:
      - Absolute report directory, usually C(gpunode_tuning_report_dir) resolved with the
        P(gpunode.tuning.verify_report_dir#filter) filter. A relative path is refused.
    type: str
    required: true
  result:
    description:
      - The host's verification result (the C(verification) key that M(gpunode.tuning.tuning_info)
        returns, or the P(gpunode.tuning.verify_error#filter) filter's result).
      - At least one of O(result) and O(fleet) is required.
    type: dict
  fleet:
    description:
      - The fleet summary made by the P(gpunode.tuning.verify_fleet#filter) filter.
    type: dict
attributes:
  check_mode:
    support: full
    description:
      - Nothing is written in check mode, not the directory and not a temporary file; RV(files) says what would change.
  diff_mode:
    support: none
    description: Reports are not diffed; RV(files) names the files that change.
  platform:
    platforms: posix
    support: full
    description: Runs on the controller only.
seealso:
  - module: gpunode.tuning.tuning_info
"""

EXAMPLES = r"""
- name: Write the host's reports (JSON, JUnit XML, Markdown)
  gpunode.tuning.verify_reports:
    dir: "{{ gpunode_tuning_report_dir | gpunode.tuning.verify_report_dir }}"
    result: "{{ gpunode_tuning_verification }}"
  delegate_to: localhost
"""

RETURN = r"""
dir:
  description: The report directory.
  returned: always
  type: str
  sample: /srv/ansible/reports
files:
  description:
    - "Each file written or checked, with what happened to it (or would, in check mode): V(created),
      V(updated), V(mode) (only the mode was restored to C(0644)) or V(unchanged)."
  returned: always
  type: dict
  sample: {"/srv/ansible/reports/gpu-01.json": "updated", "/srv/ansible/reports/gpu-01.md": "unchanged"}
"""
