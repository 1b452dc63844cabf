"""The layers of plugins/module_utils and their import rule (docs/dev/module-contract.md, "Layout").

module_utils holds three packages and the registry between them:

- ``core``: the libraries and the family contract; a core library imports core only.
- ``families``: one file per knob family (and its halves, ``<name>_verify.py``, ``_plan.py``, ``_restore.py``);
  a family imports core only, never another family (a family's own files may import each other).
- ``registry``: the list of families, the only file that imports them.
- ``flows``: what runs on the node (apply, persist, boot, verify, the guard), driven by the
  registry; a flow imports core, the registry and other flows, never a family.

Controller-only code lives in plugin_utils. This keeps a family removable by deleting its file and
its registry line, and keeps what the boot runner carries to the node free of cycles.
"""

import ast
import importlib
import os
import re

import pytest
import yaml

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import family

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "module_utils")
PKG = "ansible_collections.gpunode.tuning.plugins.module_utils"
LAYERS = ("core", "families", "flows")
# A family's halves beside families/<name>.py: verification (<name>_verify.py), what the controller, the
# persistent flow and the boot re-apply call (<name>_plan.py), the restore (<name>_restore.py):
# docs/dev/adding-a-family.md.
HALF_SUFFIXES = ("_verify", "_plan", "_restore")
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


def family_of(name):
    """The family a ``families.<name>`` module or one of its halves (``<name>_verify``, ``_plan``, ``_restore``)
    belongs to (docs/dev/adding-a-family.md)."""
    base = name.split(".", 1)[1] if "." in name else name
    for suffix in HALF_SUFFIXES:
        if base.endswith(suffix):
            return base[:-len(suffix)]
    return base


def violations(name, deps):
    """The imports of module ``name`` that its layer does not allow (a family importing another family too; a
    family's own files, ``<name>.py`` and its halves, may import each other)."""
    allowed = ALLOWED.get(layer(name))
    if allowed is None:
        return ["%s is in no layer (module_utils holds only %s and registry.py)" % (name, ", ".join(LAYERS))]
    return sorted(dep for dep in deps if layer(dep) not in allowed and not (
        layer(name) == layer(dep) == "families" and family_of(name) == family_of(dep)))


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
    assert violations("families.iommu", {"families.iommu_verify"}) == []
    assert violations("families.iommu_verify", {"families.iommu", "core.pci"}) == []
    assert violations("families.iommu_verify", {"families.pcie_acs"}) == ["families.pcie_acs"]
    assert violations("families.iommu_verify", {"families.pcie_acs_verify"}) == ["families.pcie_acs_verify"]
    assert violations("families.kmod_verify", {"families.kmod_plan", "families.kmod"}) == []
    assert violations("families.kmod_plan", {"families.tunables_plan"}) == ["families.tunables_plan"]
    assert violations("families.kmod_plan", {"families.tunables"}) == ["families.tunables"]
    assert violations("families.kmod_restore", {"families.kmod", "core.journal"}) == []
    assert violations("families.kmod_restore", {"families.tunables_restore"}) == ["families.tunables_restore"]
    assert violations("flows.boot", {"families.pcie_mrrs", "registry", "core.node"}) == ["families.pcie_mrrs"]
    assert violations("registry", {"families.iommu", "core.family"}) == []
    assert violations("stray_module", set()) != []


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


def private_uses(path):
    """``module.name`` of each private name (one leading underscore) that ``path`` takes from another module:
    ``from module import _name`` or ``module._name`` of an imported module (the ``_zipload`` bootstrap excepted)."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    modules, found = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                modules[alias.asname or alias.name] = "%s.%s" % (node.module, alias.name)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add("%s.%s" % (node.module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.add("%s.%s" % (modules[node.value.id], node.attr))
    return sorted(name for name in found if "_zipload" not in name and not name.startswith(("os.", "sys.")))


def python_files(*tops):
    repo = os.path.join(ROOT, "..", "..")
    for top in tops:
        for directory, _dirs, files in os.walk(os.path.join(repo, top)):
            yield from (os.path.join(directory, name) for name in sorted(files) if name.endswith(".py"))


def test_no_module_uses_a_private_name_of_another(tmp_path):
    found = {os.path.relpath(path, os.path.join(ROOT, "..", "..")): private_uses(path)
             for path in python_files("plugins", "tools")}
    assert {path: names for path, names in found.items() if names} == {}
    planted = tmp_path / "planted.py"
    planted.write_text("from %s.core.pci import _failure\nfrom %s.core import bootloader\nx = bootloader._RE\n"
                       "import sys\nsys._getframe()\n" % (PKG, PKG))
    assert private_uses(str(planted)) == ["%s.core.bootloader._RE" % PKG, "%s.core.pci._failure" % PKG]


def test_no_test_file_imports_another():
    # What tests share is in tests/support (and molecule/conftest.py's fixtures), never in a test file or conftest.
    found = {}
    for path in python_files("tests", "molecule"):
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            bad = [n for n in names if n.split(".")[-1].startswith("test_") or n.split(".")[-1] == "conftest"]
            if bad:
                found.setdefault(os.path.relpath(path, os.path.join(ROOT, "..", "..")), []).extend(bad)
    assert found == {}


def test_the_family_fields_are_all_documented():
    with open(os.path.join(ROOT, "..", "..", "docs", "dev", "adding-a-family.md"), encoding="utf-8") as handle:
        table = [line for line in handle if line.startswith("| `")]
    documented = {name for line in table for name in re.findall(r"`([a-z_]+)`", line.split("|")[1])}
    assert set(family.Family._fields) - documented == set()


def test_every_family_calls_its_name_NAME():
    for fam in registry.FAMILIES:
        module = importlib.import_module("%s.families.%s" % (PKG, fam.name))
        assert module.NAME == fam.name and not hasattr(module, "FAMILY"), fam.name


# -- No family named outside its own files, the registry and the generated parts (issue 29)
#
# A family's own files are families/<name>.py and its module plugins/modules/<module>.py. Anywhere
# else in plugins/ a family's name (its registry name, its report families, its settings' tags and
# desired-state keys) must not appear as an identifier (a name, an attribute, an argument, an import)
# or as a string literal equal to the name or starting with "<name>.". Docstrings and comments do not
# count, nor sysfs/procfs path components (arguments of a path-building call, strings with a "/"),
# nor kernel arguments ("iommu.passthrough=1", the "iommu." prefix). Generated files (a "GENERATED by
# tools/generate.py" header) and lines between BEGIN/END GENERATED markers are the registry's.
# In roles/ and playbooks/ YAML, no tag and no mapping key may be a family's name, sub-tag or deprecated
# tag, except keys in the variable files (defaults, argument specs, the presets) and generated blocks.

REPO = os.path.normpath(os.path.join(ROOT, "..", ".."))
PLUGINS = os.path.join(REPO, "plugins")
GENERATED_HEADER = "GENERATED by tools/generate.py"
# Calls whose string arguments are path components below the node root, not names.
PATH_CALLS = {"join", "path", "listdir", "read", "read_small", "exists", "isdir", "isfile", "lexists", "readlink"}
# YAML whose keys are the families' variables (their names without the gpunode_tuning_ prefix, by design).
VARIABLE_FILES = ("roles/tuning/defaults/main.yml", "roles/tuning/meta/argument_specs.yml",
                  "roles/tuning/vars/main.yml")


def owned_names(families=None):
    """``{name: owning family}``: each family's name, report families, sub-tags and desired-state keys."""
    out = {}
    for fam in families or registry.FAMILIES:
        for name in (fam.name, *fam.titles, *fam.tags, fam.boot_key, *(fam.validate or {})):
            if name:
                out[name] = fam.name
    return out


def yaml_names(families=None):
    """Every word that selects or keys a family in YAML: its owned names."""
    return owned_names(families)


def own_files(families=None):
    """``{path below the repository: family}`` of each family's own files."""
    out = {}
    for fam in families or registry.FAMILIES:
        out["plugins/module_utils/families/%s.py" % fam.name] = fam.name
        for suffix in HALF_SUFFIXES:
            out["plugins/module_utils/families/%s%s.py" % (fam.name, suffix)] = fam.name
        if fam.module:
            out["plugins/modules/%s.py" % fam.module] = fam.name
    return out


def generated_lines(text):
    """Line numbers (1-based) between BEGIN GENERATED and END GENERATED marker lines."""
    inside, out = False, set()
    for number, line in enumerate(text.splitlines(), 1):
        if "END GENERATED" in line:
            inside = False
        if inside:
            out.add(number)
        if "BEGIN GENERATED" in line:
            inside = True
    return out


def _docstrings(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _path_arguments(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func in PATH_CALLS:
                out |= {id(a) for a in node.args if isinstance(a, ast.Constant)}
    return out


def _identifiers(node):
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword):
        return [node.arg] if node.arg else []
    if isinstance(node, ast.alias):
        return [node.name.rsplit(".", 1)[-1], node.asname or ""]
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")
    if isinstance(node, ast.Import):
        return [part for alias in node.names for part in alias.name.split(".")]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    return []


def _named(value, name):
    """Whether a string literal names ``name``: equal to it, or ``name.`` something that is no kernel argument."""
    if value == name:
        return True
    if not value.startswith(name + ".") or "/" in value:
        return False
    rest = value[len(name) + 1:]
    return not (rest == "" or ("=" in rest and " " not in rest))  # iommu. / iommu.passthrough=1: kernel args


def python_violations(path, owner=None, names=None):
    """``[(line, kind, text, family)]``: where the source at ``path`` names a family other than ``owner``."""
    names = owned_names() if names is None else names
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if GENERATED_HEADER in text.split("\n\n", 1)[0]:
        return []
    tree = ast.parse(text, path)
    skip, paths, generated = _docstrings(tree), _path_arguments(tree), generated_lines(text)
    lower = {n.lower(): fam for n, fam in names.items()}
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if line in generated:
            continue
        for ident in _identifiers(node):
            fam = lower.get(ident.lower())
            if fam and fam != owner:
                out.append((line, "identifier", ident, fam))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip | paths:
            for name, fam in names.items():
                if fam != owner and _named(node.value, name):
                    out.append((line, "string", node.value, fam))
    return sorted(set(out))


def plugin_sources():
    for directory, _dirs, files in os.walk(PLUGINS):
        for name in sorted(files):
            if name.endswith(".py"):
                full = os.path.join(directory, name)
                yield os.path.relpath(full, REPO), full


def _yaml_hits(node, names, variables, generated, out, key=None):
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            word = k.value if isinstance(k, yaml.ScalarNode) else None
            if word in names and not variables and k.start_mark.line + 1 not in generated:
                out.append((k.start_mark.line + 1, "key", word, names[word]))
            _yaml_hits(v, names, variables, generated, out, key=word)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _yaml_hits(item, names, variables, generated, out, key=key if key == "tags" else None)
    elif isinstance(node, yaml.ScalarNode) and key == "tags":
        for word in str(node.value).replace(",", " ").split():
            if word in names and node.start_mark.line + 1 not in generated:
                out.append((node.start_mark.line + 1, "tag", word, names[word]))


def yaml_violations(path, rel=None, names=None):
    """``[(line, kind, word, family)]``: tags and mapping keys of a YAML file that name a family."""
    names = yaml_names() if names is None else names
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    out = []
    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        _yaml_hits(document, names, (rel or "") in VARIABLE_FILES, generated_lines(text), out)
    return sorted(set(out))


def role_yaml():
    for base in ("roles", "playbooks"):
        for directory, _dirs, files in os.walk(os.path.join(REPO, base)):
            for name in sorted(files):
                if name.endswith((".yml", ".yaml")):
                    full = os.path.join(directory, name)
                    yield os.path.relpath(full, REPO), full


SOURCES = sorted(plugin_sources())
YAML_FILES = sorted(role_yaml())


@pytest.mark.parametrize("rel,path", SOURCES, ids=[rel for rel, _path in SOURCES])
def test_no_family_is_named_outside_its_own_files(rel, path):
    if rel == "plugins/module_utils/registry.py":
        return
    bad = python_violations(path, own_files().get(rel))
    assert not bad, "%s names families (move it into the family's file or a Family field): %s" % (
        rel, "; ".join("line %d %s %r (%s)" % v for v in bad))


@pytest.mark.parametrize("rel,path", YAML_FILES, ids=[rel for rel, _p in YAML_FILES])
def test_no_family_is_a_tag_or_key_in_the_role_yaml(rel, path):
    bad = yaml_violations(path, rel)
    assert not bad, "%s names families as tags or keys (generate them from the registry): %s" % (
        rel, "; ".join("line %d %s %r (%s)" % v for v in bad))


def test_the_name_check_catches_a_planted_name(tmp_path):
    source = tmp_path / "flow.py"
    source.write_text(
        '"""The cpufreq driver and gpu_health.xid: a docstring names what it likes."""\n'
        "from %s.families import pcie_mrrs\n"
        "from %s.families.gpu_p2p import read\n"
        "import os\n"
        "cpufreq = 1  # a comment may say cpuidle\n"
        "def f(node, tunables=None):\n"
        "    '''tunables in a docstring'''\n"
        "    os.path.join(node, 'cpufreq', 'boost')\n"
        "    node.read('sys/devices/system/cpu/cpuidle/current_driver')\n"
        "    args = ['iommu.passthrough=1', 'iommu.', 'amd_pstate=active']\n"
        "    return node.kmod, {'gpu_health': 1, 'x': 'cpufreq.driver', 'y': 'iommu.mode must be %%s'}\n"
        "# BEGIN GENERATED x\n"
        "PER_CPU = {'cpuidle': None}\n"
        "# END GENERATED x\n" % (PKG, PKG))
    found = {(line, kind, text) for line, kind, text, _fam in python_violations(str(source))}
    assert found == {
        (2, "identifier", "pcie_mrrs"), (3, "identifier", "gpu_p2p"), (5, "identifier", "cpufreq"),
        (6, "identifier", "tunables"), (11, "identifier", "kmod"), (11, "string", "gpu_health"),
        (11, "string", "cpufreq.driver"), (11, "string", "iommu.mode must be %s")}
    # The family's own files may name it, not another family.
    assert {t for _l, _k, t, _f in python_violations(str(source), owner="cpufreq")} == {
        "pcie_mrrs", "gpu_p2p", "tunables", "kmod", "gpu_health", "iommu.mode must be %s"}
    generated = tmp_path / "table.py"
    generated.write_text("# GENERATED by tools/generate.py from module_utils/registry.py\nX = {'cpuidle': 1}\n")
    assert python_violations(str(generated)) == []


def test_the_yaml_check_catches_a_planted_tag_and_key(tmp_path):
    tasks = tmp_path / "tasks.yml"
    tasks.write_text(
        "- name: Persist\n"
        "  gpunode.tuning.tuning_flow:\n"
        "    flow: persistent\n"
        "    pcie_acs: true\n"
        "  tags: [kernel_cmdline, pcie_mrrs, reboot]\n"
        "- name: Other\n"
        "  ansible.builtin.debug:\n"
        "    msg: cpufreq thp\n"
        "  tags: cpuidle\n"
        "# BEGIN GENERATED tags\n"
        "- name: Generated\n"
        "  ansible.builtin.debug:\n"
        "    msg: x\n"
        "  tags: [thp]\n"
        "# END GENERATED tags\n")
    assert [(line, kind, word) for line, kind, word, _f in yaml_violations(str(tasks))] == [
        (4, "key", "pcie_acs"), (5, "tag", "kernel_cmdline"), (5, "tag", "pcie_mrrs"), (9, "tag", "cpuidle")]
    variables = tmp_path / "main.yml"
    variables.write_text("pcie_mrrs: 4096\nsysctl: {}\n")
    assert yaml_violations(str(variables), "roles/tuning/vars/main.yml") == []
    assert [w for _l, _k, w, _f in yaml_violations(str(variables), "roles/tuning/tasks/x.yml")] == [
        "pcie_mrrs", "sysctl"]


def test_the_names_and_files_come_from_the_registry():
    names, files = owned_names(), own_files()
    assert names["numa_balancing"] == names["thp"] == names["sysctl"] == "tunables"
    assert files["plugins/modules/setpci_mrrs.py"] == "pcie_mrrs" and "plugins/modules/tuning_info.py" not in files
    assert "mrrs" not in names  # a register name in Python (core/pci.py)
    assert len(set(files.values())) == len(registry.FAMILIES)


def test_one_unit_test_file_per_family_named_by_the_family():
    """tests/unit/test_<family>.py holds a family's tests, its module's among them; no second file per module."""
    unit = os.path.dirname(os.path.abspath(__file__))
    present = set(os.listdir(unit))
    missing = [fam.name for fam in registry.FAMILIES if "test_%s.py" % fam.name not in present]
    by_module = ["test_%s.py" % fam.module for fam in registry.FAMILIES
                 if fam.module and fam.module != fam.name and "test_%s.py" % fam.module in present]
    assert (missing, by_module) == ([], [])
