"""What a module run imports, and so compiles on the node (issue 41, docs/performance.md "The payload").

A run that applies (tuning_apply, as ``tune.yml --tags runtime`` calls it) must not import a family's
verification half (``families/<name>_verify.py``) nor the flows and core readers only verification uses; the
verification half must still be shipped (the family names it in an import statement Ansible's packer reads)
and load when verification calls it. Each run is a fresh interpreter, so ``sys.modules`` is the run's own.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import subprocess
import sys

import pytest
from ansible.executor.module_common import ModuleDepFinder
from support.checkout import REPO

PACKAGE = "ansible_collections.gpunode.tuning.plugins.module_utils"
FAMILIES_DIR = os.path.join(REPO, "plugins", "module_utils", "families")
# The runtime families of tune.yml --tags runtime with the default preset, with options that make each work.
RUNTIME = [
    {"name": "pcie_mrrs", "options": {"mrrs": 4096}},
    {"name": "pcie_acs", "options": {}},
    {"name": "cpuidle", "options": {"max_latency_us": 10}},
    {"name": "cpufreq", "options": {"driver": "native", "amd_pstate_mode": "active", "governor": "performance"}},
    {"name": "tunables", "options": {"sysctl": {"vm.swappiness": "1"}}},
    {"name": "kmod", "options": {"modules": [{"name": "nvidia_peermem"}]}},
    {"name": "pcie_aspm", "options": {"policy": "performance", "links": "off"}},
]
# What the runtime run may compile of the collection (its modules' source bytes, the module included): issue 41's
# target, 300 KB, for the seven runtime families with the default preset's options (cpufreq plans the switch to
# amd-pstate, as benchmarks/bench_payload.py's run does: docs/performance.md). This fails when the payload grows again.
COMPILED_BUDGET = 300_000
# Imported by no run that only applies: verification's flows and readers, the kernel log's summaries, what only
# the persistent flow, the boot unit and the guard write with (core.persistence, core.file_updates, core.validate_boot),
# the registry's questions about every family (flows.all_families), a family called outside the flow modules
# (core.calls), the lock's holder in words (core.lock_holder: only when the lock is taken), kmod's parameter
# comparison (core.module_params: only with parameters). core.platform stays: a planned switch to amd-pstate reads it.
VERIFY_ONLY = ("flows.verify", "flows.verification", "flows.all_families", "core.amdgpu_log", "core.facts",
               "core.kernel_log", "core.module_options", "core.module_params", "core.persistence",
               "core.file_updates", "core.validate_boot", "core.calls", "core.lock_holder")

SCRIPT = r"""
import json, sys
import simnode
from ansible.module_utils.testing import patch_module_args

root, out, families, then = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
simnode.build(root, "audited-epyc-8gpu", cpus=8, gpus=1)
from ansible_collections.gpunode.tuning.plugins.modules import tuning_apply
from ansible_collections.gpunode.tuning.plugins.module_utils import registry
args = {"root": root, "families": families, "journal": "/var/lib/gpunode-tuning/journal.json"}
result = None
with patch_module_args(args):
    try:
        tuning_apply.main()
    except SystemExit as exc:
        result = exc.code
applied = sorted(n for n in sys.modules if n.startswith("ansible_collections."))
compiled = sum(len((m.__loader__.get_source(n) or "").encode()) for n, m in list(sys.modules.items())
               if n.startswith("ansible_collections.gpunode.tuning.") and getattr(m, "__loader__", None))
if then:  # verification calls the family's evaluate (through the registry), as flows/verification does
    registry.by_name(then).evaluate({}, {}, None)
after = sorted(n for n in sys.modules if n.startswith("ansible_collections."))
with open(out, "w") as fh:
    json.dump({"exit": result, "applied": applied, "after": after, "compiled": compiled}, fh)
"""


def run_apply(tmp_path, families, then=""):
    """``(imports after tuning_apply ran, imports after ``then``'s evaluate too, source bytes of the collection's
    modules imported by the run)`` in a fresh interpreter."""
    out = tmp_path / "modules.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "node"), str(out), json.dumps(families), then],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])  # the module's result (exit_json)
    assert not result.get("failed") and result["families"], result
    with open(out, encoding="utf-8") as handle:
        data = json.load(handle)
    strip = len(PACKAGE) + 1
    return ([n[strip:] for n in data["applied"] if n.startswith(PACKAGE + ".")],
            [n[strip:] for n in data["after"] if n.startswith(PACKAGE + ".")], data["compiled"])


def verification_halves():
    """The families' halves no run that applies calls: ``<name>_verify.py``, ``_plan.py`` and ``_restore.py``."""
    return sorted("families." + os.path.basename(p)[:-3] for suffix in ("_verify", "_plan", "_restore")
                  for p in glob.glob(os.path.join(FAMILIES_DIR, "*%s.py" % suffix)))


def test_an_apply_run_compiles_no_verification_code(tmp_path):
    halves = verification_halves()
    assert {"families.pcie_mrrs_verify", "families.kmod_verify", "families.kmod_plan",
            "families.kmod_restore"} <= set(halves)  # the splits are there to be checked
    applied, after, compiled = run_apply(tmp_path, RUNTIME, then="pcie_mrrs")
    assert {"families." + f["name"] for f in RUNTIME} <= set(applied)  # the run did import what it ran
    assert sorted(set(applied) & set(halves + list(VERIFY_ONLY))) == []
    # The half is loaded when verification first calls it, and only then.
    assert set(after) - set(applied) == {"families.pcie_mrrs_verify"}
    assert "core.platform" in applied  # the planned switch to amd-pstate checks the platform
    assert 100_000 < compiled <= COMPILED_BUDGET, compiled


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(FAMILIES_DIR, "*_verify.py"))
                                        + glob.glob(os.path.join(FAMILIES_DIR, "*_plan.py"))
                                        + glob.glob(os.path.join(FAMILIES_DIR, "*_restore.py"))),
                         ids=os.path.basename)
def test_the_verification_half_is_shipped(path):
    """Ansible's packer ships a module the files named in import statements (anywhere in a file): the family's
    file must name its halves in one, never only through importlib."""
    half = os.path.basename(path)[:-3]
    family = half.rsplit("_", 1)[0]
    with open(os.path.join(FAMILIES_DIR, family + ".py"), encoding="utf-8") as handle:
        source = handle.read()
    finder = ModuleDepFinder("%s.families.%s" % (PACKAGE, family), ast.parse(source))
    assert ("ansible_collections", "gpunode", "tuning", "plugins", "module_utils", "families", half) in {
        tuple(name) for name in finder.submodules}


def test_later_imports_on_the_first_call_only():
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import family

    loads = []

    class Half:
        FACTS_DOC = "doc"

        @staticmethod
        def evaluate(facts, desired, ctx):
            return [facts, desired, ctx]

    def load():
        loads.append(1)
        return Half

    evaluate, doc = family.later(load, "evaluate"), family.later(load, "FACTS_DOC")
    assert loads == []  # naming the field imports nothing
    assert evaluate(1, 2, 3) == [1, 2, 3] and evaluate(4, 5, 6) == [4, 5, 6]
    assert loads == [1]  # once, then kept
    assert family.resolve(doc) == "doc" and family.resolve("plain") == "plain" and family.resolve(None) is None
    with pytest.raises(AttributeError):
        family.later(load, "no_such")()
