# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every use of an ansible-core interface that differs between the supported versions (2.16 to 2.21).

The rest of the collection calls these small functions and never probes ansible-core itself:
tests/unit/test_ansible_compat.py fails when a version-dependent name appears in any other plugin
(or in benchmarks/callback_plugins), and it runs on every version of the matrix
(scripts/matrix.py). What differs:

- **Templating** (2.19 reworked it, "data tagging"): from 2.19 a template's result keeps its type
  (``null`` stays ``None``, ``4096`` an int) and only text marked as trusted is rendered as a
  template; before 2.19 a whole-value template comes back as text and every string is a template
  unless it is an ``AnsibleUnsafe``. Jinja environment options are passed per ``template`` call from
  2.19, to ``copy_with_new_env`` before it (2.19 deprecates that, and ``do_template``, for 2.23).
- **Callback results**: 2.19 hands callbacks a ``CallbackTaskResult`` with public ``host``, ``task``
  and ``result``; before, only ``_host``, ``_task`` and ``_result`` (2.19 keeps those until 2.23).
- **Facts as variables**: the values this collection's actions export (a result's ``ansible_facts``) are
  facts; every version keeps them in the host's ``ansible_facts``, and also as top-level variables only
  while ``inject_facts_as_vars`` is on (off in many ansible.cfg files; 2.21 deprecates its default, 2.24
  ends it). They are read from ``ansible_facts`` (``exported_fact``, and ``ansible_facts['NAME']`` in YAML).
- **Private interfaces without a public replacement on any supported version** (the same on all of
  them today, kept here so that a change is fixed in one place): the connection's shell plugin
  (``_shell.tmpdir``, ``_shell.join_path``) and the errors of an ``ArgumentSpecValidator`` result
  (``result.errors.errors``).

Controller side only (action, filter and callback plugins). Probes are by feature, not by version
number: a feature present is used whatever release brought it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

try:  # ansible-core 2.19+: the data-tagging template engine
    from ansible.template import is_trusted_as_template as _is_trusted
    from ansible.template import trust_as_template as _trust

    DATA_TAGGING = True
    _AnsibleUnsafe = ()
except ImportError:  # 2.16 to 2.18
    from ansible.utils.unsafe_proxy import AnsibleUnsafe as _AnsibleUnsafe

    DATA_TAGGING = False
    _is_trusted = _trust = None


def exported_fact(host_vars: Mapping, name: str, default: Any = None) -> Any:
    """The fact ``name`` an action of this collection exported for a host, from the host's ``ansible_facts``
    (``host_vars``: the task's variables or ``hostvars[host]``): there whether or not facts are injected as
    variables. ``default`` when the host has none."""
    facts = host_vars.get("ansible_facts")
    if isinstance(facts, Mapping) and name in facts:
        return facts[name]
    return default


def templating_keeps_types() -> bool:
    """Whether ``Templar.template`` returns a whole-value template's result with its type (2.19+).

    Before 2.19 ``"{{ x }}"`` with ``x: null`` comes back as ``""`` and ``4096`` as ``"4096"``.
    """
    return DATA_TAGGING


def trust_as_template(text: str) -> str:
    """``text`` (read from one of the collection's own files) marked as a template Ansible may render.

    From 2.19 text from a file is rendered only once trusted; before, every string is a template.
    """
    return _trust(text) if DATA_TAGGING else text


def is_unsafe(value: Any) -> bool:
    """Whether Ansible would refuse to render ``value`` as a template (unsafe, or not trusted: 2.19+)."""
    if DATA_TAGGING:
        return isinstance(value, str) and not _is_trusted(value)
    return isinstance(value, _AnsibleUnsafe)


def render_template(templar, text: str, variables: Mapping, searchpath: Sequence[str], options: Mapping) -> Any:
    """``text`` rendered as ``ansible.builtin.template`` renders a file: its trailing newline kept, no escaping.

    ``options``: Jinja environment options (``trim_blocks``, ``newline_sequence``, ...); ``searchpath``
    for ``include`` and ``import``. From 2.19 they are passed per call; before, a new environment
    carries them (2.19 deprecates that form for 2.23).
    """
    if DATA_TAGGING:
        copy = templar.copy_with_new_env(searchpath=list(searchpath), available_variables=variables)
        return copy.template(text, escape_backslashes=False, overrides=dict(options))
    from ansible.template import AnsibleEnvironment  # noqa: PLC0415  (2.16 to 2.18 only: gone from 2.19's API)

    copy = templar.copy_with_new_env(environment_class=AnsibleEnvironment, searchpath=list(searchpath),
                                     available_variables=variables, **options)
    return copy.do_template(text, preserve_trailing_newlines=True, escape_backslashes=False)


def with_variables(templar, variables: Mapping):
    """A copy of ``templar`` that templates with ``variables`` (the same call on 2.16 to 2.21)."""
    return templar.copy_with_new_env(available_variables=variables)


def validation_errors(result) -> list:
    """The error objects (``ArgumentTypeError``, ``ElementError``, ...) of an ``ArgumentSpecValidator`` result.

    ``result.error_messages`` is the public, text-only view; which error class each came from is only
    in ``result.errors.errors`` (the same attribute on 2.16 to 2.21).
    """
    return list(result.errors.errors)


def remote_tmpdir(connection) -> str | None:
    """The task's remote temporary directory when one was made already, else None (shell plugin, private)."""
    return connection._shell.tmpdir


def shell_env_prefix(connection, environment: Mapping) -> str:
    """The connection's shell's ``VAR=value ...`` prefix for ``environment`` (the Slurm delegate's commands)."""
    return connection._shell.env_prefix(**environment)


def remote_join(connection, *parts: str) -> str:
    """A path on the managed node, joined as the connection's shell plugin joins it (private interface)."""
    return connection._shell.join_path(*parts)


def task_result_parts(result) -> tuple[Any, Any, Mapping]:
    """``(host, task, result dict)`` of the task result a callback plugin receives.

    2.19+ hands a ``CallbackTaskResult`` with public ``host``, ``task`` and ``result``; 2.16 to 2.18 a
    ``TaskResult`` with ``_host``, ``_task`` and ``_result`` only (2.19 keeps those until 2.23).
    """
    if hasattr(result, "result") and hasattr(result, "task") and hasattr(result, "host"):
        return result.host, result.task, result.result
    return result._host, result._task, result._result
