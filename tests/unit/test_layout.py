"""The layers of plugins/module_utils and their import rule (docs/module-contract.md, "Layout").

module_utils holds three packages and the registry between them:

- ``core``: the libraries and the family contract; a core library imports core only.
- ``families``: one file per knob family; a family imports core only, never another family.
- ``registry``: the list of families, the only file that imports them.
- ``flows``: what runs on the node (apply, persist, boot, verify, the guard), driven by the
  registry; a flow imports core, the registry and other flows, never a family.

Controller-only code lives in plugin_utils. This keeps a family removable by deleting its file and
its registry line, and keeps what the boot runner carries to the node free of cycles.
"""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "module_utils")
PKG = "ansible_collections.gpunode.tuning.plugins.module_utils"
LAYERS = ("core", "families", "flows")
# What each layer may import (by the first component of a module_utils name).
ALLOWED = {"core": {"core"}, "families": {"core"}, "registry": {"core", "families"},
           "flows": {"core", "flows", "registry"}}


def module_names():
    for directory, _dirs, files in os.walk(ROOT):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                yield os.path.relpath(path, ROOT)[:-3].replace(os.sep, "."), path


def imported(path):
    """The module_utils modules a source file imports (``core.node``, ``registry``), and any relative import."""
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
            if rest in ("",) + LAYERS:
                prefix = rest + "." if rest else ""
                found |= {prefix + alias.name for alias in node.names}
            else:
                found.add(rest)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PKG + "."):
                    found.add(alias.name[len(PKG) + 1:])
    return found, relative


def layer(name):
    return name.split(".", 1)[0]


def violations(name, deps):
    """The imports of module ``name`` that its layer does not allow (a family importing another family too)."""
    allowed = ALLOWED.get(layer(name))
    if allowed is None:
        return ["%s is in no layer (module_utils holds only %s and registry.py)" % (name, ", ".join(LAYERS))]
    return sorted(dep for dep in deps if layer(dep) not in allowed)


MODULES = sorted(module_names())


def test_layout_has_the_layers():
    names = [name for name, _path in MODULES]
    assert "registry" in names
    for pkg, least in (("core", 10), ("families", 10), ("flows", 6)):
        assert sum(layer(n) == pkg and not n.endswith("__init__") for n in names) >= least, pkg
        with open(os.path.join(ROOT, pkg, "__init__.py")) as handle:
            assert handle.read() == "", "%s/__init__.py must be empty (ansible-test 2.16 refuses code there)" % pkg
    assert set(names) - {"registry"} <= {n for n in names if layer(n) in LAYERS}


@pytest.mark.parametrize("name,path", MODULES, ids=[name for name, _path in MODULES])
def test_import_rule(name, path):
    deps, relative = imported(path)
    assert not relative, "%s: relative imports on lines %s (Ansible ships module_utils by absolute name)" % (
        name, relative)
    bad = violations(name, deps)
    assert not bad, "%s imports %s: %s may import only %s" % (
        name, ", ".join(bad), layer(name), ", ".join(sorted(ALLOWED.get(layer(name), ()))))


def test_rule_catches_each_layer_crossing():
    assert violations("core.pci", {"core.validate", "families.pcie_mrrs"}) == ["families.pcie_mrrs"]
    assert violations("core.pci", {"flows.persist"}) == ["flows.persist"]
    assert violations("core.facts", {"registry"}) == ["registry"]
    assert violations("families.iommu", {"families.pcie_acs", "core.kernel_args"}) == ["families.pcie_acs"]
    assert violations("families.iommu", {"flows.verification"}) == ["flows.verification"]
    assert violations("flows.boot", {"families.pcie_mrrs", "registry", "core.node"}) == ["families.pcie_mrrs"]
    assert violations("registry", {"families.iommu", "core.family"}) == []
    assert violations("role_state", set()) != []


def test_imports_are_read_in_every_spelling(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "from %s.families import pcie_mrrs\n"
        "from %s.families.iommu import IOMMU\n"
        "from %s.core import pci\n"
        "from %s import registry\n"
        "import %s.core.kernel_args\n"
        "from . import cpu\n" % (PKG, PKG, PKG, PKG, PKG))
    deps, relative = imported(str(source))
    assert deps == {"families.pcie_mrrs", "families.iommu", "core.pci", "registry", "core.kernel_args"}
    assert relative == [6]
