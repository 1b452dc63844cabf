"""The import rule of plugins/module_utils (docs/module-contract.md, "Layout").

A knob family (module_utils/families/<name>.py) imports the core libraries
only, never another family; a core library never imports a family, except the
registry, which is where the families are listed.  This keeps a family
removable by deleting its file and its registry line, and keeps the boot
runner's carried sources free of cycles.
"""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "module_utils")
PKG = "ansible_collections.gpunode.tuning.plugins.module_utils"


def module_names():
    for directory, _dirs, files in os.walk(ROOT):
        for name in sorted(files):
            if name.endswith(".py") and name != "__init__.py":
                path = os.path.join(directory, name)
                yield os.path.relpath(path, ROOT)[:-3].replace(os.sep, "."), path


def imported(path):
    """The module_utils modules a source file imports, and any relative import."""
    found, relative = set(), []
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                relative.append(node.lineno)
                continue
            if not (node.module or "").startswith(PKG):
                continue
            rest = node.module[len(PKG):].lstrip(".")
            if rest in ("", "families"):
                prefix = "families." if rest else ""
                found |= {prefix + alias.name for alias in node.names}
            else:
                found.add(rest)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PKG + "."):
                    found.add(alias.name[len(PKG) + 1:])
    return found, relative


def violations(name, deps):
    families = sorted(dep for dep in deps if dep.startswith("families."))
    if name.startswith("families."):
        return [dep for dep in families if dep != name]
    if name == "registry":
        return []
    return families


MODULES = sorted(module_names())


def test_layout_has_families_and_core():
    names = [name for name, _path in MODULES]
    assert "registry" in names
    assert sum(name.startswith("families.") for name in names) >= 10
    assert sum(not name.startswith("families.") for name in names) >= 10


@pytest.mark.parametrize("name,path", MODULES, ids=[name for name, _path in MODULES])
def test_import_rule(name, path):
    deps, relative = imported(path)
    assert not relative, "%s: relative imports on lines %s (Ansible ships module_utils by absolute name)" % (
        name, relative)
    bad = violations(name, deps)
    assert not bad, "%s imports %s: a family imports core libraries only, and only the registry imports families" % (
        name, ", ".join(bad))


def test_rule_catches_a_core_library_importing_a_family():
    assert violations("pci", {"validate", "families.pcie_mrrs"}) == ["families.pcie_mrrs"]
    assert violations("families.iommu", {"families.pcie_acs", "kernel_args"}) == ["families.pcie_acs"]
    assert violations("registry", {"families.iommu"}) == []
    assert violations("families.iommu", {"families.iommu", "pci"}) == []


def test_imports_are_read_in_every_spelling(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "from %s.families import pcie_mrrs\n"
        "from %s.families.iommu import IOMMU\n"
        "from %s import pci\n"
        "import %s.kernel_args\n"
        "from . import cpu\n" % (PKG, PKG, PKG, PKG))
    deps, relative = imported(str(source))
    assert deps == {"families.pcie_mrrs", "families.iommu", "pci", "kernel_args"}
    assert relative == [5]
