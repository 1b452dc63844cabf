"""module_utils loaded from a zip, as a module run loads it from its AnsiballZ payload: each file compiled once.

Python's zipimport compiles a module twice (once to name its file in ``find_spec``, once in ``exec_module``);
``plugins/module_utils/core/_zipload.py``, every module's first import, installs a finder that names the file
without compiling (issue 31).
The zip here is laid out as Ansible lays out a payload: the collection's module_utils below
``ansible_collections/gpunode/tuning/plugins/module_utils``, the packages down to module_utils empty. It is
imported in a fresh interpreter of every Python this machine has from the collection's floor (3.8) up, and
the compiles are counted with cProfile: any file compiled twice fails the test.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import subprocess
import sys
import zipfile

import pytest
from support.checkout import REPO

PACKAGE = "ansible_collections.gpunode.tuning.plugins.module_utils"
MODULE_UTILS = os.path.join(REPO, "plugins", "module_utils")
# The packages Ansible ships as empty synthetic ones (module_common: "down through module_utils").
SYNTHETIC = ("ansible_collections", "ansible_collections/gpunode", "ansible_collections/gpunode/tuning",
             "ansible_collections/gpunode/tuning/plugins", "ansible_collections/gpunode/tuning/plugins/module_utils")
# What a tuning_apply or tuning_rollout run imports, less the one module that needs ansible-core
# (flows.module_calls: ArgumentSpecValidator), which the other Pythons here do not have.
IMPORTS = ("registry", "flows.apply", "flows.verify", "flows.persist", "flows.boot", "core.kernel_log")

SCRIPT = r"""
import cProfile, importlib, json, pstats, sys
archive, package, imports = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
sys.path.insert(0, archive)
prof = cProfile.Profile()
prof.enable()
importlib.import_module(package + ".core._zipload")  # installs the finder, as every module's first import
registry = importlib.import_module(package + ".registry")
registry.FAMILIES  # every family (registry._every)
for name in imports:
    importlib.import_module(package + "." + name)
prof.disable()
# compile() as zipimport calls it (typing's forward references call it too).
compiles = sum(calls[0] for key, stat in pstats.Stats(prof).stats.items()
               if key[2] == "<built-in method builtins.compile>"
               for caller, calls in stat[4].items() if caller[2] == "_compile_source")
loaded = {name: [type(mod.__spec__.loader).__name__, getattr(mod, "__file__", None)]
          for name, mod in sys.modules.items() if name.split(".")[0] == "ansible_collections"}
finders = [getattr(f, "__qualname__", type(f).__name__) for f in sys.meta_path]
print(json.dumps({"compiles": compiles, "loaded": loaded, "finders": finders}))
"""


def interpreters():
    """This Python and pyenv's 3.8 to 3.13 where this machine has them (one of each minor)."""
    found = {"%d.%d" % sys.version_info[:2]: sys.executable}
    for minor in range(8, 14):
        for path in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.%d.*/bin/python3.%d" % (minor, minor)))):
            found.setdefault("3.%d" % minor, path)
    return sorted(found.items(), key=lambda item: tuple(int(p) for p in item[0].split(".")))


def payload(path):
    """A zip of module_utils laid out as an AnsiballZ payload; returns ``{module name: path in the zip}``."""
    members = {}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in SYNTHETIC:
            archive.writestr(package + "/__init__.py", "")
        for dirpath, _dirs, files in os.walk(MODULE_UTILS):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), MODULE_UTILS)
                arcname = SYNTHETIC[-1] + "/" + rel.replace(os.sep, "/")
                archive.write(os.path.join(dirpath, name), arcname)
                module = arcname[:-len(".py")].replace("/", ".")
                members[module[:-len(".__init__")] if module.endswith(".__init__") else module] = arcname
    return members


@pytest.mark.parametrize("minor,python", interpreters(), ids=[m for m, _p in interpreters()])
def test_each_file_of_module_utils_is_compiled_once_from_a_zip(tmp_path, minor, python):
    archive = str(tmp_path / "payload.zip")
    members = payload(archive)
    proc = subprocess.run([python, "-I", "-c", SCRIPT, archive, PACKAGE, ",".join(IMPORTS)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    loaded = got["loaded"]
    assert "_ZipFinder" in got["finders"], got["finders"]
    ours = {name: info for name, info in loaded.items() if name.startswith(PACKAGE + ".")}
    assert len(ours) > 30, sorted(ours)  # every family, the flows, core
    # Every file below module_utils but core's __init__ and _zipload (which installs the finder) was found by the
    # finder, under the file name zipimport gives it: the archive's path joined with the member's.
    by_finder = {name for name, (loader, _file) in ours.items() if loader == "_ZipImporter"}
    assert by_finder == set(ours) - {PACKAGE + ".core", PACKAGE + ".core._zipload"}, sorted(set(ours) - by_finder)
    for name, (_loader, filename) in ours.items():
        assert filename == os.path.join(archive, members[name]), (name, filename)
    # Compiled once each; what zipimport itself loaded (the five synthetic packages, core, _zipload) twice each.
    assert got["compiles"] == len(by_finder) + 2 * (len(SYNTHETIC) + 2), (minor, got["compiles"], len(by_finder))


def test_nothing_changes_outside_a_zip():
    """Loaded from a directory (the controller, these tests), _zipload installs no finder."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload  # noqa: F401

    assert not [f for f in sys.meta_path if getattr(f, "__qualname__", "") == "_ZipFinder"]


def module_files():
    """The modules that run on the node (the others document action plugins and import nothing of module_utils)."""
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "plugins", "modules", "*.py"))):
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)
                   and (node.module or "").startswith(PACKAGE)]
        if imports:
            out.append((os.path.basename(path), imports))
    return out


@pytest.mark.parametrize("name,imports", module_files(), ids=[name for name, _i in module_files()])
def test_every_module_imports_zipload_before_the_rest_of_module_utils(name, imports):
    first = imports[0]
    assert first.module == PACKAGE + ".core" and first.names[0].name == "_zipload", (
        "%s: the first import of module_utils must be `from %s.core import _zipload, ...`" % (name, PACKAGE))
