"""The action plugin gpunode.tuning.verify_reports and module_utils/core/files.py: writing the reports.

The action runs here in-process with a real Templar and the role's templates: what it writes, when
it reports changed, that check mode writes nothing, that a rename replaces a report (never a write
into the file a reader may hold), and that bad input fails before the first write.
"""

from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from ansible_collections.gpunode.tuning.plugins.action.verify_reports import ActionModule
from ansible_collections.gpunode.tuning.plugins.module_utils.core import file_updates as report_files
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification

HOST = "node-a"
SUFFIXES = (".json", ".junit.xml", ".md")


def run_action(args, check_mode=False, host=HOST):
    task = SimpleNamespace(args=dict(args), check_mode=check_mode, async_val=0, action="gpunode.tuning.verify_reports")
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    loader = DataLoader()
    action = ActionModule(task, connection, None, loader, Templar(loader=loader), None)
    action._load_name = "gpunode.tuning.verify_reports"  # the plugin loader's, which this bypasses
    return action.run(task_vars={"inventory_hostname": host, "gpunode_tuning_verify_fail_on_pending": False})


def result_of(message="tuning_info: boom"):
    return verification.error_result(HOST, message, "2026-01-01T00:00:00Z", "full")


def host_files(directory):
    return [os.path.join(str(directory), HOST + suffix) for suffix in SUFFIXES]


def test_writes_the_three_host_reports_into_a_new_directory(tmp_path):
    directory = tmp_path / "deep" / "reports"
    res = run_action({"dir": str(directory), "result": result_of()})
    assert res["changed"] is True
    assert res["files"] == {path: "created" for path in host_files(directory)}
    assert sorted(os.listdir(directory)) == sorted(HOST + s for s in SUFFIXES)  # no temporary file left
    for path in host_files(directory):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert json.loads((directory / (HOST + ".json")).read_text()) == result_of()
    assert (directory / (HOST + ".md")).read_text().startswith("# Verification of node-a: ERROR\n")
    assert 'errors="1"' in (directory / (HOST + ".junit.xml")).read_text()


def test_a_rerun_with_the_same_result_changes_nothing(tmp_path):
    run_action({"dir": str(tmp_path), "result": result_of()})
    before = {p: os.stat(p) for p in host_files(tmp_path)}
    res = run_action({"dir": str(tmp_path), "result": result_of()})
    assert res["changed"] is False and set(res["files"].values()) == {"unchanged"}
    for path, st in before.items():  # not rewritten: same inode, same modification time
        assert (os.stat(path).st_ino, os.stat(path).st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


def test_a_new_result_replaces_the_reports_by_rename(tmp_path):
    run_action({"dir": str(tmp_path), "result": result_of("first")})
    md = tmp_path / (HOST + ".md")
    held = tmp_path / "reader-holds-this"
    os.link(md, held)  # a reader's view of the old report
    res = run_action({"dir": str(tmp_path), "result": result_of("second")})
    assert res["changed"] is True and set(res["files"].values()) == {"updated"}
    assert "second" in md.read_text() and "first" not in md.read_text()
    assert "first" in held.read_text()  # the old file was replaced, not written into


def test_check_mode_writes_nothing_and_says_what_would_change(tmp_path):
    fresh = tmp_path / "fresh"
    res = run_action({"dir": str(fresh), "result": result_of()}, check_mode=True)
    assert res["changed"] is True and set(res["files"].values()) == {"created"}
    assert not fresh.exists()
    run_action({"dir": str(tmp_path), "result": result_of("first")})
    old = {p: open(p, "rb").read() for p in host_files(tmp_path)}
    res = run_action({"dir": str(tmp_path), "result": result_of("second")}, check_mode=True)
    assert res["changed"] is True and set(res["files"].values()) == {"updated"}
    assert {p: open(p, "rb").read() for p in host_files(tmp_path)} == old


def test_a_report_with_another_mode_gets_0644_back(tmp_path):
    run_action({"dir": str(tmp_path), "result": result_of()})
    json_path = host_files(tmp_path)[0]
    os.chmod(json_path, 0o600)
    res = run_action({"dir": str(tmp_path), "result": result_of()})
    assert res["changed"] is True and res["files"][json_path] == "mode"
    assert stat.S_IMODE(os.stat(json_path).st_mode) == 0o644


def test_the_fleet_summary(tmp_path):
    fleet = verification.fleet_summary({HOST: result_of(), "node-b": None}, [HOST, "node-b"], "2026-01-01T00:00:00Z")
    res = run_action({"dir": str(tmp_path), "fleet": fleet})
    summary = tmp_path / "fleet-summary.md"
    assert res["files"] == {str(summary): "created"}
    text = summary.read_text()
    assert text.startswith("# Fleet verification summary\n\nGenerated 2026-01-01T00:00:00Z. 2 host(s): 0 pass, 2 fail.")
    assert run_action({"dir": str(tmp_path), "fleet": fleet})["changed"] is False


@pytest.mark.parametrize("args, host, message", [
    ({"dir": "reports", "result": {}}, HOST, "dir must be an absolute directory path"),
    ({"dir": "/tmp/x"}, HOST, "one of the following is required: result, fleet"),
    ({"dir": "/tmp/x", "result": {}, "mode": "0600"}, HOST, "Unsupported parameters"),
    ({"dir": "/tmp/x", "result": {}}, "../escape", "cannot name a report file"),
])
def test_bad_input_is_refused(args, host, message):
    with pytest.raises(AnsibleActionFail, match=message):
        run_action(args, host=host)


def test_a_template_error_writes_nothing(tmp_path):
    run_action({"dir": str(tmp_path), "result": result_of()})
    old = {p: open(p, "rb").read() for p in host_files(tmp_path)}
    broken = {k: v for k, v in result_of().items() if k != "junit"}  # the JUnit report cannot render
    with pytest.raises(AnsibleActionFail, match="cannot render verify_junit.xml.j2"):
        run_action({"dir": str(tmp_path), "result": broken})
    assert {p: open(p, "rb").read() for p in host_files(tmp_path)} == old


def test_report_files_refuse_what_is_not_a_file_or_directory(tmp_path):
    (tmp_path / "a-dir.md").mkdir()
    with pytest.raises(report_files.ReportError, match="a-dir.md exists and is not a regular file"):
        report_files.write_file(str(tmp_path / "a-dir.md"), b"x")
    (tmp_path / "plain").write_text("")
    with pytest.raises(report_files.ReportError, match="plain exists and is not a directory"):
        report_files.ensure_dir(str(tmp_path / "plain"))


def test_the_documentation_stub_matches_the_argument_spec():
    # ansible-test's action-plugin-docs wants plugins/modules/verify_reports.py: its options must be the action's.
    from ansible_collections.gpunode.tuning.plugins.action.verify_reports import ARGUMENT_SPEC
    from ansible_collections.gpunode.tuning.plugins.modules import verify_reports as stub

    options = yaml.safe_load(stub.DOCUMENTATION)["options"]
    assert {k: (v["type"], v.get("required", False)) for k, v in options.items()} == {
        k: (v["type"], v.get("required", False)) for k, v in ARGUMENT_SPEC.items()}
    assert set(yaml.safe_load(stub.RETURN)) == {"dir", "files"}


def test_a_familys_export_is_written_beside_the_host_reports(tmp_path):
    """Family.export documents (gpu_locality's topology.json) become <host>.<name>, as sorted, indented JSON."""
    document = {"schema": "gpunode.tuning/topology", "gpus": {"b": 1, "a": 2}}
    result = dict(result_of(), exports={"topology.json": document})
    res = run_action({"dir": str(tmp_path), "result": result})
    path = tmp_path / (HOST + ".topology.json")
    assert res["files"][str(path)] == "created"
    assert path.read_text() == ('{\n  "gpus": {\n    "a": 2,\n    "b": 1\n  },\n'
                                '  "schema": "gpunode.tuning/topology"\n}\n')
    assert json.loads((tmp_path / (HOST + ".json")).read_text())["exports"] == result["exports"]
    again = run_action({"dir": str(tmp_path), "result": result})
    assert again["changed"] is False


@pytest.mark.parametrize("name", ["../escape.json", "topology.yml", ".hidden.json", "a/b.json"])
def test_an_export_name_that_is_no_plain_json_file_name_fails_before_any_write(tmp_path, name):
    with pytest.raises(AnsibleActionFail, match="is not a file name ending in .json"):
        run_action({"dir": str(tmp_path / "r"), "result": dict(result_of(), exports={name: {}})})
    assert not (tmp_path / "r").exists()
