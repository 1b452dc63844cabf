"""module_utils/flows/boot.py, the boot re-apply runner, run as the boot unit runs it.

Each test installs the runner the way the persistent flow does (boot.runner_text, which carries
every module_utils file (boot.carried_sources), at the default ``gpunode_tuning_boot_script``, the
desired state at boot.DESIRED_PATH)
into a simulated node and runs it as a subprocess (``python -I -B RUNNER --desired ...``). The
reference is a second node of the same preset tuned by the modules themselves: the runner must
leave every file the runtime tuning writes exactly as the modules left it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot as boot_code

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(REPO, "roles", "tuning")
with open(os.path.join(ROLE, "defaults", "main.yml"), encoding="utf-8") as _fh:
    RUNNER = yaml.safe_load(_fh)["gpunode_tuning_boot_script"]
DESIRED = boot_code.DESIRED_PATH
PRESETS = ("audited-epyc-8gpu", "xeon-4gpu-switch", "grace-arm64-4gpu", "tiny-vm")
# inference-latency, the preset with every family at work (EPP and boost where the node has them).
STATE = {
    "version": 1,
    "pcie_mrrs": {"mrrs": 4096, "vendor": "10de", "device": None, "class_prefixes": ["0300", "0302"],
                  "bdfs": None, "allow_empty": True},
    "cpuidle": {"disable": [], "max_latency_us": 2, "cpus": None},
    "cpufreq": {"governor": "performance", "epp": "performance", "boost": True, "driver": "native",
                "amd_pstate_mode": "active", "intel_pstate_status": None},
    "thp": {"enabled": "madvise", "defrag": "defer+madvise"},
}


def install(root, state=None):
    """What the persistent flow puts on the node for the boot unit, below ``root``."""
    state = STATE if state is None else state
    loader = boot_code.runner_text(boot_code.carried_sources(os.path.join(REPO, "plugins", "module_utils")))
    runner = os.path.join(root, RUNNER.lstrip("/"))
    os.makedirs(os.path.dirname(runner), exist_ok=True)
    with open(runner, "w", encoding="utf-8") as fh:
        fh.write(loader)
    desired = os.path.join(root, DESIRED.lstrip("/"))
    os.makedirs(os.path.dirname(desired), exist_ok=True)
    with open(desired, "w", encoding="utf-8") as fh:
        json.dump(state, fh)
    return runner


def boot(root, *extra):
    """Run the installed runner as the unit does (isolated mode: nothing of the test's sys.path)."""
    runner = os.path.join(root, RUNNER.lstrip("/"))
    return subprocess.run([sys.executable, "-I", "-B", runner, "--desired", DESIRED, "--root", root, *extra],
                          capture_output=True, text=True, check=False, cwd="/")


def tune_with_modules(run_module, root):
    """The runtime tuning of STATE, by the modules (as runtime_*.yml call them)."""
    common = {"root": root, "journal": "/var/lib/gpunode-tuning/journal.json"}
    mrrs = dict(STATE["pcie_mrrs"], **common)
    mrrs = {k: v for k, v in mrrs.items() if v is not None}
    result, failed = run_module("setpci_mrrs", mrrs)
    assert not failed, result
    result, failed = run_module("cpu_cstate", dict(common, max_latency_us=2))
    assert not failed, result
    freq = {k: v for k, v in STATE["cpufreq"].items() if v is not None}
    result, failed = run_module("cpu_freq", dict(common, **freq))
    assert not failed, result
    result, failed = run_module("kernel_tunables", dict(common, transparent_hugepage=STATE["thp"]))
    assert not failed, result


def tuned_files(root):
    """Every file the runtime tuning of these families writes: whole PCI config spaces, idle
    state ``disable`` files, cpufreq policy and boost files, THP files."""
    devices = os.path.join(root, "sys/bus/pci/devices")
    out = {}
    for bdf in sorted(os.listdir(devices)):  # links to the devices' directories
        with open(os.path.join(devices, bdf, "config"), "rb") as fh:
            out["sys/bus/pci/devices/%s/config" % bdf] = fh.read()
    groups = [
        ("sys/devices/system/cpu", lambda rel: rel.endswith("/disable") or "/cpufreq/" in rel
         or rel.endswith(("intel_pstate/no_turbo", "amd_pstate/status", "intel_pstate/status"))),
        ("sys/kernel/mm/transparent_hugepage", lambda rel: True),
    ]
    for base, keep in groups:
        for dirpath, _dirs, names in os.walk(os.path.join(root, base)):
            for name in names:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                if keep(rel) and not os.path.islink(full):
                    with open(full, "rb") as fh:
                        out[rel] = fh.read()
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_boot_brings_every_family_back_to_the_runtime_tuning(build_node, run_module, preset):
    """After a reboot (a node at its original values) the runner leaves it as the modules did."""
    reference = build_node(preset)
    original = tuned_files(reference)
    tune_with_modules(run_module, reference)
    tuned = tuned_files(reference)
    assert tuned != original

    node = build_node(preset)
    install(node)
    assert tuned_files(node) == original
    proc = boot(node)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = tuned_files(node)
    # Whole files: a config space differs only where the modules wrote it (MRRS, mask 0x7000).
    assert sorted(k for k in after if after[k] != tuned[k]) == []
    lines = proc.stdout.splitlines()
    for family in ("pcie_mrrs", "cpuidle", "cpufreq", "thp"):
        assert sum(1 for ln in lines if ln.startswith("gpunode-tuning-boot: %s: " % family)) == 1, proc.stdout

    again = boot(node)
    assert again.returncode == 0, again.stdout
    assert tuned_files(node) == after
    assert "(changed)" not in again.stdout, again.stdout
    assert "set on 0 device(s)" in again.stdout or "no PCI Express device matches" in again.stdout


def test_mrrs_writes_only_the_mrrs_bits(build_node):
    """Every other Device Control bit (MPS, bit 15) and every other config byte stay as they were."""
    node = build_node("audited-epyc-8gpu", cpus=2, gpus=2)
    install(node)
    before = tuned_files(node)
    assert boot(node).returncode == 0
    after = tuned_files(node)
    changed = sorted(k for k in after if after[k] != before[k] and k.endswith("/config"))
    assert [k.split("/")[4] for k in changed] == ["0000:41:00.0", "0000:61:00.0"]
    for rel in changed:
        diff = [i for i, (a, b) in enumerate(zip(before[rel], after[rel], strict=True)) if a != b]
        assert len(diff) == 1
        i = diff[0]
        assert before[rel][i] & ~0x70 == after[rel][i] & ~0x70  # high byte of Device Control: bits 14:12
        assert (after[rel][i] & 0x70) >> 4 == 5  # 4096


def test_a_failing_family_does_not_stop_the_others(build_node):
    """An idle state that cannot be written fails cpuidle (exit 1, named), the rest is applied."""
    node = build_node("audited-epyc-8gpu", cpus=2, gpus=1)
    install(node)
    disable = os.path.join(node, "sys/devices/system/cpu/cpu1/cpuidle/state2/disable")
    os.remove(disable)
    os.mkdir(disable)  # a directory: the write fails whatever the user
    proc = boot(node)
    assert proc.returncode == 1, proc.stdout
    assert "gpunode-tuning-boot: cpuidle: FAILED: " in proc.stdout and "C2 on CPUs 1" in proc.stdout
    with open(os.path.join(node, "sys/devices/system/cpu/cpu0/cpuidle/state2/disable")) as fh:
        assert fh.read().strip() == "1"
    with open(os.path.join(node, "sys/devices/system/cpu/cpufreq/policy0/scaling_governor")) as fh:
        assert fh.read().strip() == "performance"
    with open(os.path.join(node, "sys/kernel/mm/transparent_hugepage/enabled")) as fh:
        assert "[madvise]" in fh.read()
    assert "gpunode-tuning-boot: pcie_mrrs: MRRS 4096 set on 1 device(s)" in proc.stdout


def test_bad_values_fail_their_family_with_the_modules_message(build_node):
    """The runner validates as the modules do: a bad selector fails MRRS before any write."""
    node = build_node("audited-epyc-8gpu", cpus=2, gpus=1)
    state = json.loads(json.dumps(STATE))
    state["pcie_mrrs"]["vendor"] = "10de'; reboot"
    state["cpuidle"] = {"disable": ["C2\n"], "max_latency_us": None, "cpus": None}
    install(node, state)
    before = tuned_files(node)
    proc = boot(node)
    assert proc.returncode == 1
    assert "pcie_mrrs: FAILED: vendor must be a 4-digit hex PCI id" in proc.stdout
    assert "cpuidle: FAILED: " in proc.stdout
    after = tuned_files(node)
    assert [k for k in after if after[k] != before[k] and ("/config" in k or "/disable" in k)] == []
    assert b"[madvise]" in after["sys/kernel/mm/transparent_hugepage/enabled"]


def test_udev_form_sets_one_selected_device_only(build_node):
    """``--only pcie_mrrs --bdf`` (the udev rule): that device if the selector takes it, nothing else."""
    node = build_node("audited-epyc-8gpu", cpus=2, gpus=2)
    install(node)
    before = tuned_files(node)
    proc = boot(node, "--only", "pcie_mrrs", "--bdf", "0000:61:00.0")
    assert proc.returncode == 0, proc.stdout
    after = tuned_files(node)
    assert sorted(k for k in after if after[k] != before[k]) == ["sys/bus/pci/devices/0000:61:00.0/config"]
    assert [ln.split(":")[1].strip() for ln in proc.stdout.splitlines()] == ["pcie_mrrs"]
    nic = next(b for b in os.listdir(os.path.join(node, "sys/bus/pci/devices"))
               if b not in ("0000:41:00.0", "0000:61:00.0")
               and open(os.path.join(node, "sys/bus/pci/devices", b, "vendor")).read().strip() != "0x10de")
    proc = boot(node, "--only", "pcie_mrrs", "--bdf", nic)
    assert proc.returncode == 0 and "no PCI Express device matches" in proc.stdout, proc.stdout
    assert tuned_files(node) == after


def test_udev_form_needs_hotplug_families_and_known_names(build_node):
    """``--bdf`` needs families that re-apply on hot-plug, ``--only`` a family's name (no name from before 1.0.0)."""
    node = build_node("audited-epyc-8gpu", cpus=2, gpus=2)
    install(node)
    after = tuned_files(node)
    for argv, error in ((["--only", "cpuidle", "--bdf", "0000:61:00.0"], "--bdf needs --only with families that "
                         "re-apply on hot-plug (pcie_mrrs)"), (["--bdf", "0000:61:00.0"], "--bdf needs --only"),
                        (["--only", "nosuch"], "no family 'nosuch'"), (["--only", "mrrs"], "no family 'mrrs'"),
                        (["--only-mrrs", "--bdf", "0000:61:00.0"], "unrecognized arguments: --only-mrrs")):
        proc = boot(node, *argv)
        assert proc.returncode == 2 and error in proc.stderr, (argv, proc.stderr)
    assert tuned_files(node) == after


def test_only_runs_just_the_families_named(build_node):
    node = build_node("audited-epyc-8gpu", cpus=2, gpus=2)
    install(node)
    proc = boot(node, "--only", "cpuidle", "--only", "tunables")
    assert proc.returncode == 0, proc.stdout
    assert [ln.split(":")[1].strip() for ln in proc.stdout.splitlines()] == ["cpuidle", "thp"]


def test_an_unreadable_desired_state_is_exit_2_naming_it(build_node):
    node = build_node("tiny-vm")
    install(node)
    with open(os.path.join(node, DESIRED.lstrip("/")), "w", encoding="utf-8") as fh:
        fh.write('{"version": 1, "pcie_mrr": {}}')
    proc = boot(node)
    assert proc.returncode == 2
    assert ("has unknown families pcie_mrr; known are pcie_mrrs, pcie_acs, pcie_aspm, cpuidle, cpufreq, thp, "
            "gpu_settings") in proc.stdout


def test_udev_form_leaves_a_device_outside_the_selected_bdfs_alone(build_node):
    node = build_node("audited-epyc-8gpu", cpus=2, gpus=2)
    install(node, dict(STATE, pcie_mrrs=dict(STATE["pcie_mrrs"], bdfs=["41:00.0"])))
    before = tuned_files(node)
    proc = boot(node, "--only", "pcie_mrrs", "--bdf", "0000:61:00.0")
    assert proc.returncode == 0, proc.stdout
    assert "0000:61:00.0 is not one of the selected bdfs (41:00.0): nothing to do" in proc.stdout
    assert tuned_files(node) == before
