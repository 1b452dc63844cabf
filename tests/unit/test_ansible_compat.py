"""plugins/plugin_utils/ansible_compat.py on the ansible-core under test, and that nothing else probes ansible-core.

The unit stage runs this file on the shared .venv's ansible-core; the version matrix
(scripts/matrix.py, MATRIX_UNIT) runs it again in every version's own environment, with that
environment's Python, so each function is exercised in-process on 2.16 to 2.21. It uses no
fixture of tests/unit/conftest.py (the matrix runs it with ``--noconftest``) and finds the
collection on the ``pythonpath`` the runner sets (``.collections``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.errors import ArgumentTypeError
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.shell.sh import ShellModule
from ansible.release import __version__ as CORE_VERSION
from ansible.template import Templar
from support.role import trusted

from ansible_collections.gpunode.tuning.plugins.plugin_utils import ansible_compat, role_variables

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORE = tuple(int(part) for part in CORE_VERSION.split(".")[:2])
COMPAT = os.path.join("plugins", "plugin_utils", "ansible_compat.py")
# Names and attributes whose meaning or presence differs between the supported ansible-core versions
# (what ansible_compat wraps). Outside that module they may appear in comments and docstrings only.
VERSION_DEPENDENT = re.compile(
    r"(?<!ansible_compat\.)\b(?:trust_as_template|is_trusted_as_template|AnsibleUnsafe|unsafe_proxy|AnsibleEnvironment|do_template"
    r"|evaluate_expression|environment_class|copy_with_new_env)\b"
    r"|\._shell\b|\.errors\.errors\b|\bresult\._(?:result|task|host)\b|\bansible\.release\b|\b__version__\b")
# Where controller-side code that imports ansible lives: every plugin, and the benchmarks' callbacks.
SCANNED = ("plugins", os.path.join("benchmarks", "callback_plugins"))


def templar(**variables):
    return Templar(loader=DataLoader(), variables=variables)


def unsafe(text):
    """``text`` as Ansible holds a value it must never render (a fact, a registered result)."""
    if ansible_compat.DATA_TAGGING:
        return str(text)  # from 2.19 a string is untrusted unless marked
    from ansible.utils.unsafe_proxy import wrap_var  # noqa: PLC0415  (2.16 to 2.18)

    return wrap_var(text)


def test_the_probe_matches_the_release():
    # Data tagging (typed templates, trust) came with 2.19; a probe that disagrees picks the wrong path.
    assert ansible_compat.DATA_TAGGING is (CORE >= (2, 19))
    assert ansible_compat.templating_keeps_types() is (CORE >= (2, 19))


@pytest.mark.parametrize(("raw", "expected"), [
    ("{{ none_value }}", None),
    ("{{ mrrs }}", 4096),
    ("{{ ratio }}", 0.5),
    ("{{ flag }}", False),
    ("{{ text }}", "4096"),
    ("{{ items }}", [1, None, "a"]),
    ({"gain": "{{ ratio }}", "stopped": "{{ none_value }}", "n": 3}, {"gain": 0.5, "stopped": None, "n": 3}),
    (["{{ mrrs }}", "{{ none_value }}", "plain"], [4096, None, "plain"]),
    ("prefix-{{ mrrs }}", "prefix-4096"),
    ("{{ preset.preset_values.cpufreq_epp }}", None),
], ids=["null", "int", "float", "bool", "numeric-text", "list", "dict-leaves", "list-leaves", "mixed", "preset"])
def test_role_variables_keep_their_types(raw, expected):
    # What the role's defaults do: "{{ __gpunode_tuning_preset_values.cpufreq_epp }}" must reach the flows as
    # None (leave alone), 4096 as an int, on every version (role_variables.typed picks the path by the probe).
    variables = {"none_value": None, "mrrs": 4096, "ratio": 0.5, "flag": False, "text": "4096",
                 "items": [1, None, "a"], "preset": {"preset_values": {"cpufreq_epp": None}}}
    got = role_variables.typed(templar(**variables), trusted(raw))
    assert got == expected and type(got) is type(expected)


def test_an_unsafe_value_is_never_rendered():
    value = unsafe("{{ lookup('env', 'HOME') }}")
    assert ansible_compat.is_unsafe(value)
    assert not ansible_compat.is_unsafe(ansible_compat.trust_as_template("{{ x }}"))
    assert not ansible_compat.is_unsafe(4096)
    assert role_variables.typed(templar(), value) == "{{ lookup('env', 'HOME') }}"


def test_trust_as_template_keeps_the_text():
    text = ansible_compat.trust_as_template("{{ x }}\n")
    assert text == "{{ x }}\n" and isinstance(text, str)


def test_render_template_renders_as_the_template_action_does(tmp_path):
    # verify_reports renders the role's templates itself: trim_blocks, the trailing newline kept,
    # backslashes as written, includes from the search path, the task's variables.
    (tmp_path / "row.j2").write_text("| {{ item }} |\n")  # an included template loses its last newline (Jinja)
    text = ansible_compat.trust_as_template(
        "# {{ host }}\n{% for item in items %}\n{% include 'row.j2' %}\n\n{% endfor %}\npath C:\\dir \\n\n")
    options = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}
    out = ansible_compat.render_template(templar(), text, {"host": "node-a", "items": ["a", 2]}, [str(tmp_path)],
                                         options)
    assert out == "# node-a\n| a |\n| 2 |\npath C:\\dir \\n\n"


def test_render_template_names_an_undefined_variable():
    text = ansible_compat.trust_as_template("{{ missing_variable }}\n")
    with pytest.raises(Exception, match="missing_variable"):
        ansible_compat.render_template(templar(), text, {}, [REPO], {"trim_blocks": True})


def test_validation_errors_keep_their_classes():
    result = ArgumentSpecValidator({"n": {"type": "int"}, "s": {"type": "str", "choices": ["a"]}}).validate(
        {"n": "many", "s": "b"})
    errors = ansible_compat.validation_errors(result)
    assert len(errors) == len(result.error_messages) == 2
    assert [type(e) for e in errors].count(ArgumentTypeError) == 1
    assert {e.msg for e in errors} == set(result.error_messages)


def test_bad_role_variables_are_named_on_this_core():
    # role_variables' one-line messages are built from the validator's error objects above.
    _validated, errors, _warnings = role_variables.check(
        {"gpunode_tuning_root": "/", "gpunode_tuning_pcie_mrrs": "huge"}, ["runtime"])
    assert len(errors) == 1 and errors[0].startswith("value of gpunode_tuning_pcie_mrrs must be "), errors
    assert errors[0].endswith('got: "huge"'), errors


def test_remote_tmpdir_and_join_use_the_shell_plugin():
    connection = SimpleNamespace(_shell=ShellModule())
    assert ansible_compat.remote_tmpdir(connection) is None  # none made yet: the action makes one
    connection._shell.tmpdir = "/var/tmp/ansible-tmp-1"
    assert ansible_compat.remote_tmpdir(connection) == "/var/tmp/ansible-tmp-1"
    assert ansible_compat.remote_join(connection, "/var/tmp/ansible-tmp-1", "runner.py") == \
        "/var/tmp/ansible-tmp-1/runner.py"


def test_shell_env_prefix_quotes_each_value_as_the_shell_plugin_does():
    connection = SimpleNamespace(_shell=ShellModule())
    prefix = ansible_compat.shell_env_prefix(connection, {"SLURM_CONF": "/etc/slurm dir/slurm.conf"})
    assert prefix == "SLURM_CONF='/etc/slurm dir/slurm.conf'"
    assert ansible_compat.shell_env_prefix(connection, {}) == ""


def test_task_result_parts_reads_either_shape():
    host, task, result = object(), SimpleNamespace(action="ping"), {"changed": False}
    public = SimpleNamespace(host=host, task=task, result=result, _host=None, _task=None, _result=None)
    assert ansible_compat.task_result_parts(public) == (host, task, result)  # 2.19+: CallbackTaskResult
    private = SimpleNamespace(_host=host, _task=task, _result=result)
    assert ansible_compat.task_result_parts(private) == (host, task, result)  # 2.16 to 2.18: TaskResult


def test_the_benchmarks_callback_reads_this_cores_task_results(tmp_path):
    # The real result object of this core, through benchmarks/callback_plugins/module_runs.py.
    out = tmp_path / "runs.json"
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_PLUGINS=os.path.join(REPO, "benchmarks", "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="module_runs", ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               BENCH_MODULE_RUNS_OUT=str(out), ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    env.pop("ANSIBLE_CONFIG", None)
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    proc = subprocess.run([ansible, "localhost", "-c", "local", "-m", "ansible.builtin.ping",
                           "-e", "ansible_python_interpreter=%s" % sys.executable], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "DEPRECATION" not in proc.stderr, proc.stderr[-2000:]
    assert json.loads(out.read_text())["controller_plays"] == 1


def version_dependent_lines():
    """``[(path, line number, line)]`` of code outside ansible_compat.py that names a version-dependent interface."""
    found = []
    for top in SCANNED:
        for directory, _dirs, files in os.walk(os.path.join(REPO, top)):
            for name in sorted(files):
                path = os.path.relpath(os.path.join(directory, name), REPO)
                if not name.endswith(".py") or path == COMPAT:
                    continue
                with open(os.path.join(REPO, path), encoding="utf-8") as handle:
                    source = handle.read()
                if VERSION_DEPENDENT.search(source):  # only then tell code from comments (tokenizing is slow)
                    found += [(path, number, line.strip()) for number, line in enumerate(code_lines(source), 1)
                              if VERSION_DEPENDENT.search(line)]
    return found


def code_lines(source):
    """The lines of ``source`` with comments and docstrings blanked (line numbers kept)."""
    import io  # noqa: PLC0415
    import tokenize  # noqa: PLC0415

    lines = source.splitlines()
    out = [list(line) for line in lines]
    previous = None
    statement_start = (None, tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        is_docstring = token.type == tokenize.STRING and previous in statement_start
        if token.type == tokenize.COMMENT or is_docstring:
            (row, col), (end_row, end_col) = token.start, token.end
            for r in range(row, end_row + 1):
                start = col if r == row else 0
                stop = end_col if r == end_row else len(out[r - 1])
                out[r - 1][start:stop] = " " * (stop - start)
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = token.type
    return ["".join(chars) for chars in out]


def test_version_dependent_code_lives_only_in_ansible_compat():
    assert version_dependent_lines() == []


def test_the_scan_finds_what_it_looks_for():
    code = "x = self._connection._shell.tmpdir\n# result._result in a comment\ny = result.errors.errors\n"
    assert [bool(VERSION_DEPENDENT.search(line)) for line in code_lines(code)] == [True, False, True]
