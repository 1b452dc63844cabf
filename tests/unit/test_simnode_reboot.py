"""The simulated reboot (tools/simnode reboot): what a boot brings to a simulated node, from what the tuning left.

The kernel arguments of the GRUB drop-in on /proc/cmdline and what they switch (cpufreq driver, IOMMU type,
ACS redirect), a new boot id, fresh uptime, an empty kernel log, the journaled runtime values back to their
originals with the journal kept, the sysctl and modules-load drop-ins applied, the boot unit run as the unit
would; a node that never comes back. The whole chain after the real playbooks: tests/integration/
test_simulated_reboot_playbooks.py.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
import simnode

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DROPIN = simnode.GRUB_DROPIN.lstrip("/")
CPU = "sys/devices/system/cpu"
RUNNER = "usr/local/lib/gpunode-tuning/apply-boot-tuning.sh"
UNIT = ("[Unit]\nDescription=Re-apply gpunode.tuning runtime settings\n\n[Service]\nType=oneshot\n"
        "ExecStart=/usr/bin/python3 -I -B /%s --desired /etc/gpunode-tuning/desired.json\n\n"
        "[Install]\nWantedBy=multi-user.target\n" % RUNNER)
# A stand-in runner: records how it was started, and fails when the desired state says so.
FAKE_RUNNER = '''import json, os, sys
args = sys.argv[1:]
root = args[args.index("--root") + 1]
with open(os.path.join(root, "runner-ran.json"), "w") as fh:
    json.dump({"argv": args, "cwd": os.getcwd(), "isolated": sys.flags.isolated,
               "no_bytecode": sys.flags.dont_write_bytecode}, fh)
print("gpunode-tuning-boot: cpuidle: re-applied")
with open(os.path.join(root, args[args.index("--desired") + 1].lstrip("/"))) as fh:
    sys.exit(json.load(fh).get("exit", 0))
'''


def write(root, rel, text, mode=0o644):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(path, mode)


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read()


def cmdline(root):
    return read(root, "proc/cmdline").strip()


def dropin(root, *args):
    """The drop-in as the kernel_cmdline family renders it (a value with ';' in GRUB single quotes)."""
    words = " ".join("%s='%s'" % tuple(a.split("=", 1)) if ";" in a else a for a in args)
    write(root, DROPIN, "# Managed by gpunode.tuning (kernel_cmdline module). Do not edit: changes are overwritten.\n"
                        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT %s"\n' % words)


def acs_control(root, bdf):
    with open(os.path.join(root, "sys/bus/pci/devices", bdf, "config"), "rb") as fh:
        return struct.unpack_from("<H", fh.read(), 0x14E)[0]


# --- the command line and what it brings ---------------------------------------------------------------------


def test_the_dropin_arguments_reach_the_command_line_with_a_new_boot_and_an_empty_kernel_log(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=2)
    own = cmdline(root)
    boot_id = read(root, "proc/sys/kernel/random/boot_id").strip()
    dropin(root, "iommu=pt", "pci=disable_acs_redir=0000:40:01.1;0000:60:01.1")
    report = simnode.reboot(root)
    assert report["returned"] and report["problems"] == []
    assert cmdline(root) == own + " iommu=pt pci=disable_acs_redir=0000:40:01.1;0000:60:01.1"
    assert report["added"] == ["iommu=pt", "pci=disable_acs_redir=0000:40:01.1;0000:60:01.1"]
    assert report["previous_boot_id"] == boot_id != report["boot_id"]
    assert read(root, "proc/sys/kernel/random/boot_id").strip() == report["boot_id"]
    assert read(root, "dev/kmsg") == "" and float(read(root, "proc/uptime").split()[0]) < 60
    assert report["boot_unit"] == {"ran": False, "why": "no enabled gpunode-tuning-boot.service"}


def test_the_next_boot_takes_the_dropin_as_it_is_then_and_without_it_the_node_s_own_line(build_node):
    root = build_node("epyc-pstate-epp", cpus=2, gpus=0)
    own = cmdline(root)  # ... ro quiet amd_pstate=active
    dropin(root, "amd_pstate=guided", "iommu=pt")
    simnode.reboot(root)
    assert cmdline(root) == own.replace("amd_pstate=active", "amd_pstate=guided") + " iommu=pt"
    dropin(root, "iommu=pt")
    report = simnode.reboot(root)
    assert cmdline(root) == own + " iommu=pt" and report["dropped"] == ["amd_pstate=guided"]
    os.unlink(os.path.join(root, DROPIN))  # rolled back
    simnode.reboot(root)
    assert cmdline(root) == own
    assert json.loads(read(root, simnode.BOOT_RECORD))["boots"] == 3


@pytest.mark.parametrize("preset, args, driver, mode", [
    ("audited-epyc-8gpu", ["amd_pstate=active"], "amd-pstate-epp", "active"),
    ("audited-epyc-8gpu", ["amd_pstate=guided"], "amd-pstate", "guided"),
    ("audited-epyc-8gpu", ["amd_pstate=passive"], "amd-pstate", "passive"),
    ("epyc-pstate-epp", ["amd_pstate=disable"], "acpi-cpufreq", None),
    ("xeon-4gpu-switch", ["intel_pstate=disable"], "acpi-cpufreq", None),
    ("audited-epyc-8gpu", ["intel_pstate=disable"], "acpi-cpufreq", None),  # an Intel argument on AMD: no change
    ("audited-epyc-8gpu", ["iommu=pt"], "acpi-cpufreq", None),
])
def test_the_cpufreq_driver_is_the_one_the_new_command_line_asks_for(build_node, preset, args, driver, mode):
    root = build_node(preset, cpus=2, gpus=0)
    if preset == "xeon-4gpu-switch":  # a RHEL preset: give it GRUB, as the playbook test does
        write(root, "etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    dropin(root, *args)
    report = simnode.reboot(root)
    assert simnode.running_cpufreq(root) == (driver, mode) and report["cpufreq"]["after"] == [driver, mode]
    epp = os.path.exists(os.path.join(root, CPU, "cpufreq/policy1/energy_performance_preference"))
    assert epp == (driver in ("amd-pstate-epp", "intel_pstate"))
    assert os.path.islink(os.path.join(root, CPU, "cpu1/cpufreq"))
    assert os.path.isdir(os.path.join(root, CPU, "intel_pstate")) == (driver in ("intel_pstate", "intel_cpufreq"))


def test_a_cpu_without_a_pstate_driver_or_cpufreq_keeps_what_it_has(build_node):
    grace = build_node("grace-arm64-4gpu", cpus=2, gpus=0)
    write(grace, "etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    dropin(grace, "amd_pstate=active", "iommu.passthrough=1")
    assert simnode.reboot(grace)["cpufreq"] == {"before": ["cppc_cpufreq", None], "after": ["cppc_cpufreq", None]}
    vm = build_node("tiny-vm")
    dropin(vm, "amd_pstate=active")
    report = simnode.reboot(vm)
    assert report["cpufreq"] is None and report["iommu"] is None and report["problems"] == []


def test_iommu_passthrough_makes_the_groups_identity_and_the_node_s_own_type_comes_back(build_node):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=2, iommu="DMA-FQ")
    dropin(root, "iommu=pt")
    assert simnode.reboot(root)["iommu"] == "identity"
    groups = os.listdir(os.path.join(root, "sys/kernel/iommu_groups"))
    assert {read(root, "sys/kernel/iommu_groups/%s/type" % g).strip() for g in groups} == {"identity"}
    os.unlink(os.path.join(root, DROPIN))
    assert simnode.reboot(root)["iommu"] == "DMA-FQ"


def test_disable_acs_redir_clears_the_three_redirect_bits_of_the_named_bridges_only(build_node):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=2)
    bridges = sorted(b for b in os.listdir(os.path.join(root, "sys/bus/pci/devices")) if b.endswith(":01.1"))
    assert [acs_control(root, b) for b in bridges] == [0x001D, 0x001D]
    dropin(root, "pci=disable_acs_redir=40:01.1")  # the kernel's domain-less form
    report = simnode.reboot(root)
    assert report["acs_cleared"] == ["0000:40:01.1"]
    assert acs_control(root, "0000:40:01.1") == 0x001D & ~0x002C and acs_control(root, "0000:60:01.1") == 0x001D


# --- what a reboot resets, and what the boot applies ----------------------------------------------------------


def test_journaled_runtime_values_return_to_their_originals_and_the_journal_stays(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=0)
    state2 = os.path.join(CPU, "cpu0/cpuidle/state2/disable")
    result, failed = run_module("cpu_cstate", {"root": root, "max_latency_us": 2,
                                               "journal": "/var/lib/gpunode-tuning/journal.json"})
    assert not failed and read(root, state2).strip() == "1", result
    journal = read(root, simnode.JOURNAL.lstrip("/"))
    report = simnode.reboot(root)
    assert report["reset"] == {"families": ["cpuidle"], "failed": {}}
    assert read(root, state2).strip() == "0"
    assert read(root, simnode.JOURNAL.lstrip("/")) == journal
    assert sorted(os.listdir(os.path.join(root, "var/lib/gpunode-tuning"))) == ["journal.json"]


def test_a_node_without_a_journal_resets_nothing(build_node):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0)
    assert simnode.reboot(root)["reset"] == {"families": [], "failed": {}}


def test_sysctl_dropins_apply_in_boot_order_and_a_missing_key_is_named(build_node):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0)
    write(root, "etc/sysctl.d/90-gpunode-tuning.conf",
          "# ours\nvm.swappiness=10\nnet.core.somaxconn = 4096\nvm.nosuchkey=1\n-vm.optional_missing = 2\n")
    simnode.write_sysctl_file(root)  # the cloud image's cloud-optimization.conf sorts after ours: it wins at boot
    report = simnode.reboot(root)
    assert read(root, "proc/sys/vm/swappiness").strip() == "60"
    assert report["sysctl"]["applied"]["net.core.somaxconn"] == "4096"
    assert report["sysctl"]["missing"] == ["vm.nosuchkey"]
    assert report["problems"] == ["sysctl vm.nosuchkey: the node has no such key"]


def test_modules_load_dropins_load_through_the_node_s_modprobe_with_their_options(build_node):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0)
    write(root, "etc/modules-load.d/gpunode-tuning-tcp_bbr.conf", "tcp_bbr\n")
    write(root, "etc/modprobe.d/gpunode-tuning-tcp_bbr.conf", "options tcp_bbr answer=42\n")
    write(root, "etc/modules-load.d/gpunode-tuning-nvidia_peermem.conf",
          "# a module that fails as without MOFED\nnvidia_peermem\n")
    report = simnode.reboot(root)
    assert report["modules"]["loaded"] == ["tcp_bbr"]
    assert read(root, "sys/module/tcp_bbr/parameters/answer").strip() == "42"
    assert report["modules"]["failed"] == {
        "nvidia_peermem": "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument"}
    assert report["problems"] == ["module nvidia_peermem did not load at boot: modprobe: ERROR: could not insert "
                                  "'nvidia_peermem': Invalid argument"]


def boot_unit(root, enabled=True, exit_status=0):
    write(root, simnode.BOOT_UNIT, UNIT)
    write(root, RUNNER, FAKE_RUNNER, 0o755)
    write(root, "etc/gpunode-tuning/desired.json", json.dumps({"version": 1, "exit": exit_status}))
    if enabled:
        os.symlink("/" + simnode.BOOT_UNIT, os.path.join(root, simnode.BOOT_UNIT_WANTS))


def test_the_boot_unit_runs_its_runner_as_the_unit_would_with_the_root(build_node):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0)
    boot_unit(root)
    report = simnode.reboot(root)
    assert report["boot_unit"] == {"ran": True, "rc": 0, "output": ["gpunode-tuning-boot: cpuidle: re-applied"]}
    ran = json.loads(read(root, "runner-ran.json"))
    assert ran == {"argv": ["--desired", "/etc/gpunode-tuning/desired.json", "--root", os.path.realpath(root)],
                   "cwd": "/", "isolated": 1, "no_bytecode": 1}


def test_a_disabled_boot_unit_does_not_run_and_a_failing_one_is_a_problem(build_node):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0)
    boot_unit(root, enabled=False)
    assert not simnode.reboot(root)["boot_unit"]["ran"] and not os.path.exists(os.path.join(root, "runner-ran.json"))
    other = build_node("audited-epyc-8gpu", cpus=2, gpus=0)
    boot_unit(other, exit_status=1)
    report = simnode.reboot(other)
    assert report["boot_unit"]["rc"] == 1
    assert report["problems"] == ["the boot unit's re-apply exited 1: gpunode-tuning-boot: cpuidle: re-applied"]


# --- a node that never comes back, and the command line --------------------------------------------------------


def test_a_node_that_never_returns_keeps_its_boot_and_changes_nothing(build_node, digest):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0)
    dropin(root, "iommu=pt")
    write(root, simnode.REBOOT_NEVER_RETURNS, "")
    before = digest(root)
    report = simnode.reboot(root)
    assert report["returned"] is False and report["boot_id"] == report["previous_boot_id"]
    assert report["problems"] == ["%s: the node never comes back (%s)" % (os.path.realpath(root),
                                                                          simnode.REBOOT_NEVER_RETURNS)]
    assert digest(root) == before


def cli(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", "simnode"), *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_reboot_subcommand_prints_the_report_and_says_by_its_status_how_it_went(build_node, tmp_path):
    root = build_node("audited-epyc-8gpu", cpus=2, gpus=0)
    dropin(root, "amd_pstate=active")
    proc = cli("reboot", root)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cpufreq"]["after"] == ["amd-pstate-epp", "active"]
    write(root, "etc/modules-load.d/x.conf", "nvidia_peermem\n")
    assert cli("reboot", root).returncode == 1
    write(root, simnode.REBOOT_NEVER_RETURNS, "")
    assert cli("reboot", root).returncode == 3
    proc = cli("reboot", str(tmp_path))
    assert proc.returncode == 2 and "is not a simulated node" in proc.stderr


def _amd_answers(root):
    with open(os.path.join(root, simnode.AMD_SMI_STATE), encoding="utf-8") as fh:
        return json.load(fh)["answers"]


def test_gpu_faults_placed_before_a_boot_take_effect_at_it_and_the_file_is_consumed(tmp_path):
    root = str(tmp_path / "mi300x")
    simnode.build(root, "mi300x-epyc-8gpu", cpus=2, amd_smi=True)
    listed = [g["bdf"] for g in json.loads(_amd_answers(root)["list"])["gpu_data"]]
    assert len(listed) == 8
    simnode.write_boot_faults(root, {"ecc_uncorrectable": [1], "missing": [5]})
    before = _amd_answers(root)
    assert json.loads(before["metric"])["gpu_data"][1]["ecc"]["total_uncorrectable_count"] == 0
    report = simnode.reboot(root)
    assert report["returned"] and report["gpu_faults"] == {"applied": {"ecc_uncorrectable": [listed[1]],
                                                                       "missing": [listed[5]]}}
    assert not os.path.exists(os.path.join(root, simnode.BOOT_FAULTS))
    after = _amd_answers(root)
    shown = [g["bdf"] for g in json.loads(after["list"])["gpu_data"]]
    assert shown == listed[:5] + listed[6:]
    for key in ("static", "metric", "bad_pages"):
        records = json.loads(after[key])["gpu_data"]
        assert [r["gpu"] for r in records] == list(range(7)), key
    assert [r["bus"]["bdf"] for r in json.loads(after["static"])["gpu_data"]] == shown
    metric = json.loads(after["metric"])["gpu_data"]
    assert metric[1]["ecc"]["total_uncorrectable_count"] == 2
    assert metric[1]["ecc_blocks"]["UMC"]["uncorrectable_count"] == 2
    assert sum(m["ecc"]["total_uncorrectable_count"] for m in metric) == 2
    topology = json.loads(after["topology"])
    assert [e["bdf"] for e in topology] == shown and all(len(e["links"]) == 7 for e in topology)
    rows = [line.split() for line in after["xgmi_link_status"].splitlines() if line.startswith("GPU")]
    assert [r[1] for r in rows] == shown and all(len(r) == 2 + 6 + 1 and r[-1] == "X" for r in rows)
    # The faults stay for the boots after; nothing more is applied.
    assert simnode.reboot(root)["gpu_faults"] == {}
    assert _amd_answers(root)["list"] == after["list"]


def test_a_boot_fault_of_an_unknown_kind_or_gpu_is_refused(tmp_path):
    root = str(tmp_path / "mi300x")
    simnode.build(root, "mi300x-epyc-8gpu", cpus=2, amd_smi=True)
    with pytest.raises(ValueError, match="unknown boot fault.*available: ecc_uncorrectable, missing"):
        simnode.write_boot_faults(root, {"xid": [0]})
    simnode.write_boot_faults(root, {"missing": [8]})
    boot_id = open(os.path.join(root, "proc/sys/kernel/random/boot_id"), encoding="utf-8").read()
    with pytest.raises(ValueError, match="GPU index 8 is not one of 0..7"):
        simnode.reboot(root)
    assert open(os.path.join(root, "proc/sys/kernel/random/boot_id"), encoding="utf-8").read() == boot_id
