"""One knob family that fails stops none of the others, in the role's three flows.

Each flow runs every family in its own block; a family that fails is recorded and the host fails
once, at the end, with one summary naming each failed family and its module's message:

* runtime tuning under kernel lockdown (preset locked-bus-perf): MRRS is refused, C-states,
  cpufreq, NUMA balancing, THP and sysctls are applied all the same, in check mode too;
* persistent tuning whose sysctl drop-in cannot be written: the kernel command line, the boot
  unit and the udev rule are written all the same;
* a rollback after one GPU vanished (its config space is gone): every other family is restored,
  and a later rollback, once the GPU is back, restores it too.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil

from support.inventory import write_inventory
from support.nodes import JOURNAL, build_node, cstate_disabled, read_mrrs
from support.playbooks import assert_ok, failure_summary, run_playbook
from support.trees import snapshot, tree_changes

GPUS = ["0000:41:00.0", "0000:61:00.0"]
# The runtime families by their one name (the registry's, the report's, the failure summary's).
FAMILIES = ("pcie_mrrs", "pcie_acs", "cpuidle", "cpufreq", "tunables", "kmod")


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read().strip()


def governors(root):
    return {read(root, os.path.join(p, "scaling_governor"))
            for p in glob.glob(os.path.join(root, "sys/devices/system/cpu/cpufreq/policy*"))}


def tunables(root):
    """The values the default preset sets at runtime besides MRRS, C-states and cpufreq."""
    return {rel: read(root, rel) for rel in (
        "proc/sys/kernel/numa_balancing",
        "proc/sys/vm/swappiness",
        "proc/sys/net/core/somaxconn",
        "sys/kernel/mm/transparent_hugepage/enabled",
        "sys/kernel/mm/transparent_hugepage/defrag",
    )}


TUNED = {
    "proc/sys/kernel/numa_balancing": "0",
    "proc/sys/vm/swappiness": "10",
    "proc/sys/net/core/somaxconn": "65535",
    "sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never",
    "sys/kernel/mm/transparent_hugepage/defrag": "always defer [defer+madvise] madvise never",
}


def failed_families(summary):
    """Which of the runtime families a summary names (each as ``NAME: message``)."""
    return {name for name in FAMILIES if re.search(r"(^|[ :|]) ?%s: " % name, summary)}


def test_lockdown_refuses_mrrs_and_acs_and_every_other_runtime_family_is_applied(tmp_path):
    root = build_node(tmp_path / "node", "locked-bus-perf", cpus=8)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-lock": root})
    originals = tunables(root)
    before = snapshot(root)

    # Check mode predicts the same failure and writes nothing.
    check = run_playbook("tune.yml", inventory, "--tags", "runtime", "--check")
    assert check.returncode != 0
    assert failed_families(failure_summary(check, "sim-lock")) == {"pcie_mrrs", "pcie_acs"}
    assert check.recap["sim-lock"]["changed"] > 0, "check mode should predict the other families"
    assert tree_changes(before, snapshot(root)) == []

    first = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert first.returncode != 0
    # One task ran every family; the host fails once, at the end of the flow.
    assert first.recap["sim-lock"]["failed"] == 1
    summary = failure_summary(first, "sim-lock")
    assert summary.startswith("Tuning failed for these knob families"), summary
    assert failed_families(summary) == {"pcie_mrrs", "pcie_acs"}, summary
    assert "lockdown" in summary
    assert '"pcie_mrrs": "failed: kernel lockdown' in first.stdout  # the per-family report
    assert '"pcie_acs": "failed: kernel lockdown' in first.stdout  # ACS redirect is config space too
    # Nothing reached config space; everything else is applied.
    assert [read_mrrs(root, bdf) for bdf in GPUS] == [256, 256]
    assert cstate_disabled(root, "C2") == set(range(8))
    assert governors(root) == {"performance"}
    assert tunables(root) == TUNED != originals
    assert os.path.isfile(os.path.join(root, JOURNAL))

    # The failing family changes nothing on a rerun, nor does the summary.
    second = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert second.returncode != 0
    assert second.recap["sim-lock"]["changed"] == 0, second.stdout[-4000:]
    assert failed_families(failure_summary(second, "sim-lock")) == {"pcie_mrrs", "pcie_acs"}


def test_persistent_concern_that_fails_does_not_stop_the_others(tmp_path):
    root = build_node(tmp_path / "node", cpus=4, gpus=2)
    # The sysctl drop-in cannot be written: its directory is a file.
    shutil.rmtree(os.path.join(root, "etc/sysctl.d"))
    with open(os.path.join(root, "etc/sysctl.d"), "w", encoding="utf-8") as fh:
        fh.write("not a directory\n")
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-p": root})

    proc = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert proc.returncode != 0
    summary = failure_summary(proc, "sim-p")
    assert "persistent sysctl: " in summary, summary
    for other in ("persistent kmod", "persistent cmdline", "persistent boot_unit", "persistent udev", "reboot"):
        assert other + ": " not in summary, summary
    # The concerns after the sysctl drop-in were all written.
    for rel in (
        "etc/default/grub.d/60-gpunode-tuning.cfg",
        "etc/systemd/system/gpunode-tuning-boot.service",
        "etc/systemd/system/multi-user.target.wants/gpunode-tuning-boot.service",
        "usr/local/lib/gpunode-tuning/apply-boot-tuning.sh",
        "etc/udev/rules.d/70-gpunode-tuning.rules",
    ):
        assert os.path.lexists(os.path.join(root, rel)), rel
    assert "amd_pstate=active" in read(root, "etc/default/grub.d/60-gpunode-tuning.cfg")


def test_rollback_goes_on_past_a_vanished_gpu(tmp_path):
    root = build_node(tmp_path / "node", cpus=8, gpus=2)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-rb": root})
    originals = tunables(root)
    original_governors = governors(root)
    assert_ok(run_playbook("tune.yml", inventory, "--tags", "runtime"))
    assert cstate_disabled(root, "C2") == set(range(8)) and tunables(root) == TUNED

    # One GPU's config space vanishes (hot-removed, or reset while the rollback runs).
    config = os.path.join(root, "sys/bus/pci/devices", GPUS[1], "config")
    with open(config, "rb") as fh:
        saved = fh.read()
    os.remove(config)

    rollback = run_playbook("rollback.yml", inventory)
    assert rollback.returncode != 0
    assert rollback.recap["sim-rb"]["failed"] == 1
    summary = failure_summary(rollback, "sim-rb")
    assert summary.startswith("Rollback could not undo these families"), summary
    assert failed_families(summary) == {"pcie_mrrs"}, summary
    assert GPUS[1] in summary
    assert '"pcie_mrrs": "failed: ' in rollback.stdout  # the restore report
    # Every other family is back at its original.
    assert cstate_disabled(root, "C2") == set()
    assert governors(root) == original_governors == {"schedutil"}
    assert tunables(root) == originals
    # What was not restored stays journaled; the restored families are gone from the journal.
    with open(os.path.join(root, JOURNAL), encoding="utf-8") as fh:
        families = json.load(fh)["families"]
    assert not any(families.get(name) for name in ("cpuidle", "cpufreq", "tunables")), families

    # The GPU is back: the next rollback restores what the first could not, and succeeds.
    with open(config, "wb") as fh:
        fh.write(saved)
    again = run_playbook("rollback.yml", inventory)
    assert_ok(again)
    assert [read_mrrs(root, bdf) for bdf in GPUS] == [512, 512]
    assert not os.path.exists(os.path.join(root, JOURNAL))
