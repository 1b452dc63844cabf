"""The registry imports a family on first use: a module run pays only for the families it runs (issue 31).

Each check that counts imports runs in a fresh interpreter: this test process has imported every family
long before (the other tests, the conftest).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest
from ansible.executor.module_common import ModuleDepFinder
from support.checkout import REPO

from ansible_collections.gpunode.tuning.plugins.module_utils import registry

PKG = "ansible_collections.gpunode.tuning.plugins.module_utils"


def fresh(code: str) -> dict:
    """What ``code`` (run in a new interpreter) prints as JSON."""
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, ".collections"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True)
    return json.loads(out.stdout)


FAMILIES_IMPORTED = "sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith(%r))" % (PKG + ".families.")


def test_names_are_the_families_in_registry_order():
    assert registry.NAMES == tuple(fam.name for fam in registry.FAMILIES)
    families_dir = os.path.join(REPO, "plugins", "module_utils", "families")
    # A family's halves (<name>_verify.py, _plan.py, _restore.py: docs/dev/adding-a-family.md) are no families.
    files = [f[:-3] for f in os.listdir(families_dir) if f.endswith(".py") and f != "__init__.py"]
    halves = [f for f in files if f.endswith(("_verify", "_plan", "_restore"))]
    assert sorted(registry.NAMES) == sorted(set(files) - set(halves))
    assert {f.rsplit("_", 1)[0] for f in halves} <= set(registry.NAMES)


def test_the_apply_module_imports_no_family_until_one_is_asked_for():
    got = fresh(
        "import json, sys\n"
        "import ansible_collections.gpunode.tuning.plugins.modules.tuning_apply\n"
        "from ansible_collections.gpunode.tuning.plugins.module_utils import registry\n"
        "from ansible_collections.gpunode.tuning.plugins.module_utils.flows import apply\n"
        "before = %s\n"
        "refused = apply.not_runnable(['tunables', 'cpuidle', 'gpu_health', 'no_such'])\n"
        "print(json.dumps({'before': before, 'after': %s, 'refused': refused, 'loaded': registry.loaded()}))\n"
        % (FAMILIES_IMPORTED, FAMILIES_IMPORTED))
    assert got["before"] == []
    # gpu_health has no runtime module; no_such is no family: both refused, only the asked-for imported
    assert got["refused"] == ["gpu_health", "no_such"]
    assert got["after"] == ["cpuidle", "gpu_health", "tunables"]
    assert got["loaded"] == ["cpuidle", "tunables", "gpu_health"]  # registry order


def test_every_family_is_imported_when_all_are_needed():
    got = fresh(
        "import json, sys\n"
        "from ansible_collections.gpunode.tuning.plugins.module_utils import registry\n"
        "names = [f.name for f in registry.FAMILIES]\n"
        "print(json.dumps({'names': names, 'imported': %s}))\n" % FAMILIES_IMPORTED)
    assert got["names"] == list(registry.NAMES)
    assert got["imported"] == sorted(registry.NAMES)


def test_a_module_payload_still_carries_every_family():
    """Ansible packs a module with the module_utils its import statements name: the lazy imports must not
    hide a family from it (a runtime run imports a family by name, inside the payload)."""
    path = os.path.join(REPO, "plugins", "module_utils", "registry.py")
    with open(path, encoding="utf-8") as handle:
        found = ModuleDepFinder(PKG + ".registry", ast.parse(handle.read(), path)).submodules
    shipped = {parts[-1] for parts in found if ".".join(parts[:-1]) == PKG + ".families"}
    assert shipped == set(registry.NAMES)


def test_an_unknown_name_is_refused_naming_the_known_ones():
    with pytest.raises(KeyError, match="no knob family 'nope'; known: pcie_mrrs, pcie_acs, iommu"):
        registry.by_name("nope")
    with pytest.raises(AttributeError, match="FAMILIE"):
        assert registry.FAMILIE is None  # a misspelt name is no family list
