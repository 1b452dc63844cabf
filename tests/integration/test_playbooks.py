"""playbooks/tune.yml and playbooks/rollback.yml end to end on simulated nodes.

Each test runs ansible-playbook as a subprocess against freshly built simulated nodes
(tools/simnode) through ``gpunode_tuning_root`` and the local connection, and compares
snapshots of the node trees. Nodes are shared per module where a test only reads them; every
playbook run costs ~5-20 s on a 2-core machine, so the suite keeps to a handful of runs.

The simulated kernel log (``dev/kmsg``) is left out of byte-identity checks: the node's
simulated modprobe appends nvidia_peermem's load failure to it, as a real kernel would, and a
kernel log cannot be rolled back.
"""

from __future__ import annotations

import glob
import json
import os
import re
import stat

import pytest
import yaml
from support.checkout import REPO
from support.inventory import REPORT_DIR, write_inventory
from support.nodes import (
    BOOT_DESIRED,
    BOOT_RUNNER,
    JOURNAL,
    PERSISTENT_FILES,
    assert_host_untouched,
    build_node,
    cstate_disabled,
    read_mrrs,
)
from support.playbooks import assert_ok, run_playbook
from support.runner import run_boot_runner
from support.trees import snapshot, tree_changes

ROLE = os.path.join(REPO, "roles", "tuning")


# -- Static checks (no playbook run)


def test_argument_spec_defaults_match():
    """Every public default is in the spec with the same default; preset-derived ones say so."""
    with open(os.path.join(ROLE, "defaults", "main.yml")) as fh:
        defaults = yaml.safe_load(fh)
    with open(os.path.join(ROLE, "meta", "argument_specs.yml")) as fh:
        specs = yaml.safe_load(fh)["argument_specs"]
    options = {}
    for entry in specs.values():
        # The step entry points' private inputs (role_variables.PRIVATE_INTERFACE) have no role default.
        options.update((k, v) for k, v in (entry.get("options") or {}).items() if not k.startswith("__"))
    assert set(defaults) == set(options), "defaults/main.yml and meta/argument_specs.yml list different variables"
    for name, value in defaults.items():
        spec = options[name]
        if isinstance(value, str) and "__gpunode_tuning_preset_values" in value:
            assert "default" not in spec, name
            assert any("preset" in line for line in spec["description"]), name
        else:
            assert spec.get("default") == value, name
    for entry in ("main", "runtime", "persistent", "rollback", "verify", "precheck", "rollout_host"):
        assert entry in specs, "entry point %s has no argument spec" % entry


def test_presets_have_the_same_knobs():
    with open(os.path.join(ROLE, "vars", "main.yml")) as fh:
        presets = yaml.safe_load(fh)["__gpunode_tuning_presets"]
    assert {"inference-throughput", "inference-latency"} <= set(presets)
    keys = {name: set(values) for name, values in presets.items()}
    assert len({frozenset(k) for k in keys.values()}) == 1, keys
    with open(os.path.join(ROLE, "meta", "argument_specs.yml")) as fh:
        choices = yaml.safe_load(fh)["argument_specs"]["main"]["options"]["gpunode_tuning_preset"]["choices"]
    assert set(choices) == set(presets)


# -- Playbook runs


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory):
    """A fresh audited node that tests only run check mode or failing validation against."""
    base = tmp_path_factory.mktemp("shared")
    root = build_node(base / "node")
    inventory = write_inventory(base / "hosts.yml", {"sim-shared": root})
    return root, inventory


def test_check_mode_writes_nothing(shared_node):
    root, inventory = shared_node
    before = snapshot(root)
    with open(os.path.join(root, "dev/kmsg"), "rb") as fh:
        kmsg = fh.read()
    proc = run_playbook("tune.yml", inventory, "--check", "--diff")
    assert_ok(proc)
    assert proc.recap["sim-shared"]["changed"] > 0, "check mode should predict changes on an untuned node"
    assert tree_changes(before, snapshot(root)) == []
    with open(os.path.join(root, "dev/kmsg"), "rb") as fh:
        assert fh.read() == kmsg, "check mode ran the node's modprobe"
    assert_host_untouched()


def test_bad_values_fail_validation_before_any_change(shared_node):
    root, inventory = shared_node
    before = snapshot(root)
    proc = run_playbook(
        "tune.yml",
        inventory,
        "-e",
        "gpunode_tuning_pcie_mrrs=300",
        "-e",
        "gpunode_tuning_preset=foo",
        "-e",
        "gpunode_tuning_cpufreq_governor=42",
    )
    assert proc.returncode != 0
    out = proc.stdout
    assert "Check the role variables before anything changes" in out
    assert "value of gpunode_tuning_pcie_mrrs must be one of: 128, 256, 512, 1024, 2048, 4096, got: 300" in out
    assert "value of gpunode_tuning_preset must be one of: inference-throughput, inference-latency, got: foo" in out
    assert re.search(
        r"value of gpunode_tuning_cpufreq_governor must be one of: performance, powersave, "
        r"schedutil, ondemand, conservative, userspace.*got: 42",
        out,
    )
    assert proc.recap["sim-shared"]["ok"] == 0 and proc.recap["sim-shared"]["changed"] == 0
    assert tree_changes(before, snapshot(root)) == []


def test_runtime_is_idempotent_and_rollback_restores_the_tree(tmp_path):
    root = build_node(tmp_path / "node")
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-rt": root})
    before = snapshot(root)

    first = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(first)
    # One task for every runtime family; its report says what each changed.
    assert first.recap["sim-rt"]["changed"] == 1
    for line in ('"pcie_mrrs": "8 set to 4096', '"cpuidle": "disabled C2', '"cpufreq": "driver acpi-cpufreq, changed',
                 'kernel.numa_balancing=0'):
        assert line in first.stdout, first.stdout[-3000:]
    assert read_mrrs(root, "0000:41:00.0") == 4096
    assert cstate_disabled(root, "C2") == set(range(128))
    assert os.path.isfile(os.path.join(root, JOURNAL))
    assert stat.S_IMODE(os.stat(os.path.join(root, JOURNAL)).st_mode) == 0o600
    changed = set(tree_changes(before, snapshot(root)))
    assert not changed & PERSISTENT_FILES, "runtime tuning wrote persistent files"

    second = run_playbook("tune.yml", inventory, "--tags", "runtime")
    assert_ok(second)
    assert second.recap["sim-rt"]["changed"] == 0, second.stdout[-4000:]

    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    assert tree_changes(before, snapshot(root)) == []
    assert '"C2"' in rollback.stdout and "0000:41:00.0" in rollback.stdout  # reported as restored
    assert_host_untouched()


def test_persistent_then_rollback_removes_every_file(tmp_path):
    root = build_node(tmp_path / "node")
    # A root spelled with "..": tasks that compare paths must not depend on its spelling.
    (tmp_path / "elsewhere").mkdir()
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-p": str(tmp_path / "elsewhere" / ".." / "node")})
    before = snapshot(root)

    full = run_playbook("tune.yml", inventory)  # untagged: runtime, persistent, verify placeholder
    assert_ok(full)
    added = set(snapshot(root)) - set(before)
    assert PERSISTENT_FILES <= added, sorted(PERSISTENT_FILES - added)
    # nvidia_peermem does not load on this node: not persisted, and the run says why.
    assert not any(p.startswith(("etc/modules-load.d/", "etc/modprobe.d/")) for p in added)
    assert "nvidia_peermem is not persisted: it does not load (invalid_argument" in full.stdout
    assert "amd_pstate=active" in (tmp_path / "node/etc/default/grub.d/60-gpunode-tuning.cfg").read_text()
    assert "A reboot applies the pending kernel arguments (amd_pstate=active)" in full.stdout

    sysctl = (tmp_path / "node/etc/sysctl.d/90-gpunode-tuning.conf").read_text()
    for line in ("vm.swappiness=10", "kernel.numa_balancing=0", "net.core.somaxconn=65535"):
        assert line in sysctl.splitlines()
    unit = (tmp_path / "node/etc/systemd/system/gpunode-tuning-boot.service").read_text()
    assert "Before=nvidia-persistenced.service" in unit
    assert "ExecStart=/usr/bin/python3 -I -B /%s --desired %s" % (BOOT_RUNNER, BOOT_DESIRED) in unit.splitlines()
    assert (
        os.readlink(os.path.join(root, "etc/systemd/system/multi-user.target.wants/gpunode-tuning-boot.service"))
        == "/etc/systemd/system/gpunode-tuning-boot.service"
    )
    # The runner carries the collection's own code, every module_utils file as it is, and nothing
    # else is installed for it; it runs with the desired state of the run.
    runner = (tmp_path / "node" / BOOT_RUNNER).read_text()
    for name in sorted(os.listdir(os.path.join(REPO, "plugins/module_utils"))):
        if name.endswith(".py"):
            with open(os.path.join(REPO, "plugins/module_utils", name), encoding="utf-8") as fh:
                assert "    %s: %s,\n" % (json.dumps(name[:-3]), json.dumps(fh.read())) in runner, name
    assert not os.path.exists(os.path.join(root, "usr/local/lib/gpunode-tuning/module_utils"))
    with open(os.path.join(root, BOOT_DESIRED.lstrip("/")), encoding="utf-8") as fh:
        desired = json.load(fh)
    assert desired["pcie_mrrs"]["mrrs"] == 4096 and desired["cpuidle"]["max_latency_us"] == 100
    assert desired["thp"] == {"enabled": "madvise", "defrag": "defer+madvise"}

    # The untagged run ended with verification: the boot unit counts as what persists MRRS.
    with open(os.path.join(REPORT_DIR, "sim-p.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    assert report["node"]["boot_unit"] is True
    mrrs = [s for s in report["settings"] if s["family"] == "pcie_mrrs"]
    assert mrrs and all(s["persisted"] == 4096 and s["state"] == "applied" for s in mrrs), mrrs

    again = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert_ok(again)
    assert again.recap["sim-p"]["changed"] == 0, again.stdout[-4000:]

    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    left = tree_changes(before, snapshot(root))
    assert left == [], left
    assert_host_untouched()


def test_rollback_removes_the_intel_pstate_argument_persistent_added(tmp_path):
    """An Intel node on acpi-cpufreq (driver native wants intel_pstate) booted through GRUB."""
    root = build_node(tmp_path / "node", "xeon-4gpu-switch")
    for policy in glob.glob(os.path.join(root, "sys/devices/system/cpu/cpufreq/policy*")):
        with open(os.path.join(policy, "scaling_driver"), "w", encoding="utf-8") as fh:
            fh.write("acpi-cpufreq\n")
    # /etc/default/grub and its grub.d directory, as Debian's grub packages install them.
    os.makedirs(os.path.join(root, "etc/default/grub.d"), exist_ok=True)
    with open(os.path.join(root, "etc/default/grub"), "w", encoding="utf-8") as fh:
        fh.write('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-intel": root},
                                gpunode_tuning_kernel_cmdline_bootloader="grub")
    before = snapshot(root)

    tuned = run_playbook("tune.yml", inventory, "--tags", "runtime,persistent")
    assert_ok(tuned)
    dropin = os.path.join(root, "etc/default/grub.d/60-gpunode-tuning.cfg")
    with open(dropin, encoding="utf-8") as fh:
        assert '"$GRUB_CMDLINE_LINUX_DEFAULT intel_pstate=active"' in fh.read()

    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    assert not os.path.exists(dropin)
    left = tree_changes(before, snapshot(root))
    assert left == [], left


def test_boot_script_applies_tuning_to_a_fresh_node(tmp_path):
    """The installed runner (the collection's Python) tunes an untouched node as the unit would at boot."""
    tuned = build_node(tmp_path / "tuned")
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-boot": tuned})
    proc = run_playbook("tune.yml", inventory, "--tags", "boot_unit", "-e", "gpunode_tuning_preset=inference-latency")
    assert_ok(proc)

    fresh = build_node(tmp_path / "fresh", cpus=8, gpus=2)
    run = run_boot_runner(tuned, fresh)
    assert run.returncode == 0, run.stdout + run.stderr
    info_gpus = ["0000:41:00.0", "0000:61:00.0"]
    assert [read_mrrs(fresh, bdf) for bdf in info_gpus] == [4096, 4096]
    assert cstate_disabled(fresh, "C2") == set(range(8))
    assert cstate_disabled(fresh, "C1") == set()
    with open(os.path.join(fresh, "sys/devices/system/cpu/cpufreq/policy0/scaling_governor")) as fh:
        assert fh.read().strip() == "performance"
    with open(os.path.join(fresh, "sys/kernel/mm/transparent_hugepage/enabled")) as fh:
        assert "[madvise]" in fh.read()
    # One line per family for journald.
    families = [ln.split(":")[1].strip() for ln in run.stdout.splitlines()]
    assert families == ["pcie_mrrs", "pcie_acs", "pcie_aspm", "cpuidle", "cpufreq", "thp", "gpu_locality"]
    with open(os.path.join(fresh, "sys/module/pcie_aspm/parameters/policy")) as fh:
        assert "[performance]" in fh.read()  # the presets' ASPM policy, re-applied by the boot unit
    # The udev form touches one device only.
    fresh2 = build_node(tmp_path / "fresh2", cpus=2, gpus=2)
    run = run_boot_runner(tuned, fresh2, "--only", "pcie_mrrs", "--bdf", "0000:61:00.0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert [read_mrrs(fresh2, bdf) for bdf in info_gpus] == [512, 4096]
    assert cstate_disabled(fresh2, "C2") == set()
