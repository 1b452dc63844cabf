"""tools/generate.py: every part derived from the registry is current, and a stale one is caught."""

from __future__ import annotations

import os
import shutil

import generate  # tools/ (conftest puts it on sys.path)
import pytest
import yaml

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, journal, registry_tables
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families, persist
from ansible_collections.gpunode.tuning.plugins.modules import tuning_info, tuning_persist


def test_every_generated_part_is_current():
    diffs = generate.stale()
    assert not diffs, "stale (run: .venv/bin/python tools/generate.py):\n%s" % "".join(diffs.values())


def test_the_parts_are_the_registrys():
    returned = yaml.safe_load(tuning_info.RETURN)["tuning_facts"]["contains"]
    core = ["os", "kernel", "cpu", "pci", "kernel_log", "platform"]
    assert list(returned) == core + [f.name for f in registry.FAMILIES if f.read is not None]
    for fam in registry.FAMILIES:
        if fam.read is not None:
            assert returned[fam.name] == yaml.safe_load(family.resolve(fam.facts_doc)), fam.name
    doc = yaml.safe_load(tuning_persist.DOCUMENTATION)
    names = [c.name for c in persist.concerns()]
    assert doc["options"]["concerns"]["choices"] == names == tuning_persist.ARGUMENT_SPEC["concerns"]["choices"]
    described = next(d for d in doc["description"] if d.startswith("The concerns, in the order they run"))
    for concern in persist.concerns():
        assert "V(%s) %s" % (concern.name, concern.description) in described
    assert registry_tables.PER_CPU_KEYS == all_families.per_cpu_keys() == journal.PER_CPU_KEYS


def copy_parts(tmp_path):
    """The files of the generated parts (and what they are rendered from) in a tree of their own."""
    for path in ("roles/tuning/meta/argument_specs.yml", "roles/tuning/defaults/main.yml",
                 "roles/tuning/vars/main.yml") + tuple(path for _n, path, _r, _k in generate.all_parts()):
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
        shutil.copy(os.path.join(generate.REPO, path), tmp_path / path)
    return str(tmp_path)


@pytest.mark.parametrize("path,old,new", [
    (generate.TUNING_PERSIST, "    choices: [sysctl, ", "    choices: [cmdline, sysctl, "),
    (generate.TUNING_INFO, "    cpuidle:\n      description:", "    cstate:\n      description:"),
    (generate.REGISTRY_TABLES, '"cpuidle": None', '"cpuidle": ("C2",)'),
    (generate.VARIABLES, "### `gpunode_tuning_cpuidle_cpus`", "### `gpunode_tuning_cstate_cpus`"),
])
def test_a_stale_part_is_caught_and_rewritten(tmp_path, path, old, new):
    root = copy_parts(tmp_path)
    assert generate.stale(root) == {}
    full = os.path.join(root, path)
    text = open(full, encoding="utf-8").read()
    assert old in text
    with open(full, "w", encoding="utf-8") as handle:
        handle.write(text.replace(old, new, 1))
    diffs = generate.stale(root)
    assert list(diffs) == [path]
    assert [line for line in diffs[path].splitlines() if line.startswith("-") and new.splitlines()[0] in line]
    assert generate.main(["--check", "--root", root]) == 1
    assert generate.write(root) == [path]
    assert open(full, encoding="utf-8").read() == text and generate.stale(root) == {}


def test_missing_markers_are_an_error_naming_the_part(tmp_path):
    root = copy_parts(tmp_path)
    full = os.path.join(root, generate.TUNING_PERSIST)
    text = open(full, encoding="utf-8").read().replace("END GENERATED tuning_persist.choices", "END")
    with open(full, "w", encoding="utf-8") as handle:
        handle.write(text)
    with pytest.raises(generate.GenerateError, match="tuning_persist.choices"):
        generate.stale(root)
    assert generate.main(["--check", "--root", root]) == 2


def test_the_role_task_tag_lists_are_parts_of_the_generator():
    names = [p[0] for p in generate.all_parts()]
    assert names[:len(generate.PARTS)] == [p[0] for p in generate.PARTS]
    assert names[len(generate.PARTS):] == ["role.runtime_tags", "role.persistent_tags", "role.reboot_tags",
                                           "role.rollback_tags"]
