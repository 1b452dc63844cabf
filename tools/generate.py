#!/usr/bin/env python
"""Write every part of the tree that is derived from the registry but must stay in YAML, a module's
DOCUMENTATION/RETURN, Markdown or a core table (module_utils/registry.py is the one list of families).

    .venv/bin/python tools/generate.py          # rewrite every generated part
    .venv/bin/python tools/generate.py --check  # exit 1, with a diff, when one is stale

The parts (``PARTS``), each a whole file or the lines between a ``BEGIN GENERATED <name>`` and an
``END GENERATED <name>`` marker line (the markers stay, in whatever comment syntax the file has):

- ``docs/variables.md``: the variable reference, from roles/tuning/meta/argument_specs.yml (varref.py);
- ``tuning_info.facts``: the RETURN documentation of each family's ``tuning_facts.<name>`` section, from
  its ``Family.facts_doc`` (the node-level sections os, kernel, cpu, pci, kernel_log stay hand-written);
- ``tuning_persist.concerns`` and ``tuning_persist.choices``: what each persistent concern writes and
  the choices of its ``concerns`` option, from flows/persist.concerns() (``Concern.description``);
- ``core/registry_tables.py``: what core libraries must know of every family without importing the
  registry (the journal's per-CPU keys, ``Family.per_cpu``);
- ``role.*_tags``: the tag lists of the role's flow tasks (``ROLE_TAG_LISTS``), from plugin_utils/tags.py.

tests/unit/test_generate.py fails when any part is stale, so a family added without running this fails
the unit stage. Run it with the repository's virtual environment (PyYAML, ansible-core).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tempfile
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUNING_INFO = os.path.join("plugins", "modules", "tuning_info.py")
TUNING_PERSIST = os.path.join("plugins", "modules", "tuning_persist.py")
REGISTRY_TABLES = os.path.join("plugins", "module_utils", "core", "registry_tables.py")
VARIABLES = os.path.join("docs", "variables.md")
WIDTH = 118


class GenerateError(Exception):
    """A part cannot be generated (its markers are missing); the message names the file and the part."""


def import_collection(repo: str = REPO) -> None:
    """Make ``ansible_collections.gpunode.tuning`` this tree (a checkout or a copy of it) for the imports below."""
    if "ansible_collections.gpunode.tuning" in sys.modules:
        return
    base = tempfile.mkdtemp(prefix="gpunode-generate-")
    os.makedirs(os.path.join(base, "ansible_collections", "gpunode"))
    os.symlink(os.path.abspath(repo), os.path.join(base, "ansible_collections", "gpunode", "tuning"))
    sys.path.insert(0, base)


# -- The parts


def variables_md(repo: str) -> str:
    """docs/variables.md (tools/varref.py renders it)."""
    tools = os.path.join(repo, "tools")
    if os.path.isdir(tools) and tools not in sys.path:
        sys.path.insert(0, tools)
    import varref  # tools/ is not a package: imported from the tree rendered

    return varref.render(repo)


def tuning_info_facts(repo: str) -> str:
    """The families' sections of tuning_info's RETURN ``tuning_facts.contains``, in registry order."""
    from ansible_collections.gpunode.tuning.plugins.module_utils import registry
    from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import resolve

    lines = []
    for fam in registry.FAMILIES:
        if fam.read is None:
            continue
        # A split family keeps it in its verification half (Family.facts_doc = later(..., "FACTS_DOC")).
        facts_doc = resolve(fam.facts_doc)
        if not facts_doc:
            raise GenerateError("family %s reads facts but has no facts_doc (the RETURN of tuning_facts.%s)"
                                % (fam.name, fam.name))
        lines.append("    %s:" % fam.name)
        lines += [("      " + line).rstrip() for line in textwrap.dedent(facts_doc).strip("\n").splitlines()]
    return "\n".join(lines) + "\n"


def _concerns():
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import persist

    return persist.concerns()


def tuning_persist_concerns(repo: str) -> str:
    """The description item of tuning_persist that says what each concern writes, in the order they run."""
    parts = ["V(%s) %s" % (c.name, c.description or "(undocumented)") for c in _concerns()]
    text = "The concerns, in the order they run: %s." % "; ".join(parts)
    # A folded scalar: a description may hold ": ", which a plain YAML scalar cannot.
    return "  - >-\n" + "\n".join(textwrap.wrap(text, WIDTH, initial_indent="    ", subsequent_indent="    ",
                                                break_on_hyphens=False)) + "\n"


def tuning_persist_choices(repo: str) -> str:
    """The choices of tuning_persist's ``concerns`` option."""
    return "    choices: [%s]\n" % ", ".join(c.name for c in _concerns())


def registry_tables(repo: str) -> str:
    """core/registry_tables.py: the registry's facts core needs, as constants."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families

    keys = ", ".join("%r: %s" % (name, "None" if value is None else repr(tuple(value)))
                     for name, value in all_families.per_cpu_keys().items())
    return '''# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# GENERATED by tools/generate.py from module_utils/registry.py: do not edit; `tools/generate.py --check` fails
# when it is stale.
"""What core libraries must know of every family, derived from the registry (core imports core only).

How it works and why: docs/dev/node-code.md, "core/registry_tables.py"."""

from __future__ import annotations

# Family -> the keys of its journal entries whose original is kept per CPU; None: every key.
PER_CPU_KEYS = {%s}
''' % keys.replace("'", '"')


def registry_imports(repo: str) -> str:
    """registry._every()'s import of every family (what puts them into a module's payload), from NAMES."""
    import textwrap  # noqa: PLC0415

    from ansible_collections.gpunode.tuning.plugins.module_utils import registry

    names = sorted(registry.NAMES)
    indent = " " * 8
    lines = [indent + "from ansible_collections.gpunode.tuning.plugins.module_utils.families import (\n"]
    lines += [indent + "    %s,\n" % name for name in names]
    lines.append(indent + ")\n")
    loop = textwrap.wrap("for module in (%s):" % ", ".join(names), width=120 - len(indent),
                         subsequent_indent=" " * len("for module in ("), break_on_hyphens=False)
    lines += [indent + line + "\n" for line in loop]
    lines.append(indent + "    _LOADED.setdefault(module.DEFINITION.name, module.DEFINITION)\n")
    return "".join(lines)


# The role's flow tasks whose tags are every tag of the flow's families and concerns (plugin_utils/tags.py):
# (part name, task file, flow of tags.flow_task_tags).
ROLE_TAG_LISTS = (
    ("role.runtime_tags", "runtime.yml", "runtime"),
    ("role.persistent_tags", "persistent.yml", "persistent"),
    ("role.reboot_tags", "persistent.yml", "reboot"),
    ("role.rollback_tags", "rollback.yml", "rollback"),
)


def _tag_list(flow: str):
    def render(repo: str) -> str:
        from ansible_collections.gpunode.tuning.plugins.plugin_utils import tags

        return "".join("    - %s\n" % tag for tag in tags.flow_task_tags(flow))
    return render


def role_task_tags(repo: str) -> list:
    """The role tasks' tag lists: ``[(name, path, render)]``, each the block between ``# BEGIN GENERATED <name>``
    and ``# END GENERATED <name>`` in roles/tuning/tasks/*.yml, from the registry's families and concerns."""
    return [(name, os.path.join("roles", "tuning", "tasks", task_file), _tag_list(flow))
            for name, task_file, flow in ROLE_TAG_LISTS]


# (name, path relative to the repository, render(repo) -> text, whole file or a marked block)
PARTS = (
    ("docs/variables.md", VARIABLES, variables_md, "file"),
    ("tuning_info.facts", TUNING_INFO, tuning_info_facts, "block"),
    ("tuning_persist.concerns", TUNING_PERSIST, tuning_persist_concerns, "block"),
    ("tuning_persist.choices", TUNING_PERSIST, tuning_persist_choices, "block"),
    ("core/registry_tables.py", REGISTRY_TABLES, registry_tables, "file"),
    ("registry.imports", os.path.join("plugins", "module_utils", "registry.py"), registry_imports, "block"),
)


def all_parts(repo: str = REPO) -> list:
    """Every part: ``PARTS`` and the hook's."""
    return list(PARTS) + [(name, path, render, "block") for name, path, render in role_task_tags(repo)]


# -- Writing and checking


def replace_block(text: str, name: str, body: str, where: str) -> str:
    """``text`` with the lines between its ``BEGIN GENERATED <name>`` and ``END GENERATED <name>`` lines replaced."""
    lines = text.splitlines(True)
    begin = [i for i, line in enumerate(lines) if line.rstrip().endswith("BEGIN GENERATED %s" % name)]
    end = [i for i, line in enumerate(lines) if line.rstrip().endswith("END GENERATED %s" % name)]
    if len(begin) != 1 or len(end) != 1 or end[0] < begin[0]:
        raise GenerateError("%s: expected one 'BEGIN GENERATED %s' line and one 'END GENERATED %s' line after it"
                            % (where, name, name))
    return "".join(lines[:begin[0] + 1]) + body + "".join(lines[end[0]:])


def rendered(repo: str = REPO) -> dict:
    """``{path: new text}`` of every file with a generated part (the parts of one file applied in order)."""
    out: dict = {}
    for name, path, render, kind in all_parts(repo):
        full = os.path.join(repo, path)
        if kind == "file":
            out[path] = render(repo)
            continue
        if path not in out:
            with open(full, encoding="utf-8") as handle:
                out[path] = handle.read()
        out[path] = replace_block(out[path], name, render(repo), path)
    return out


def stale(repo: str = REPO) -> dict:
    """``{path: unified diff}`` of every file whose generated parts are not what the registry gives."""
    out = {}
    for path, text in rendered(repo).items():
        full = os.path.join(repo, path)
        current = open(full, encoding="utf-8").read() if os.path.exists(full) else ""
        if current != text:
            out[path] = "".join(difflib.unified_diff(current.splitlines(True), text.splitlines(True), path,
                                                     path + " (generated)"))
    return out


def write(repo: str = REPO) -> list:
    """Rewrite the files whose generated parts are stale; the paths written."""
    written = []
    for path, text in rendered(repo).items():
        full = os.path.join(repo, path)
        current = open(full, encoding="utf-8").read() if os.path.exists(full) else None
        if current != text:
            with open(full, "w", encoding="utf-8") as handle:
                handle.write(text)
            written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 (with a diff) when a generated part is stale")
    parser.add_argument("--root", default=REPO, help="the tree to generate (default: this file's repository)")
    args = parser.parse_args(argv)
    import_collection(args.root)
    try:
        if args.check:
            diffs = stale(args.root)
            for diff in diffs.values():
                sys.stdout.write(diff)
            if diffs:
                sys.stderr.write("stale: %s; run .venv/bin/python tools/generate.py\n" % ", ".join(sorted(diffs)))
            return 1 if diffs else 0
        for path in write(args.root):
            sys.stdout.write("wrote %s\n" % path)
    except GenerateError as exc:
        sys.stderr.write("generate: %s\n" % exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
