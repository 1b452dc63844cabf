"""Every cpufreq driver transition the persistent flow can plan, through a simulated reboot.

For each transition (amd-pstate <-> acpi-cpufreq, intel_pstate <-> acpi-cpufreq, in active and
passive/guided modes, on AMD and Intel, with GRUB and with grubby): cpu_freq plans the kernel
arguments as the persistent flow does (check mode), kernel_cmdline configures them, and
verification must report the driver ``pending_reboot``; after a simulated reboot (the arguments
on /proc/cmdline, the new driver in sysfs) it must report ``applied``, cpu_freq plans nothing
more, and the rollback filter removes what was configured.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import pytest
from support.nodes import read_file, set_cpufreq_driver, write_file

from ansible_collections.gpunode.tuning.plugins.module_utils.core import cpu_freq
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import kernel_cmdline
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification as v
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify

CPUS = 4
DROPIN = kernel_cmdline.DEFAULT_DROPIN.lstrip("/")

# A stateful grubby stand-in: the default entry's arguments in <root>/grubby.args.
GRUBBY = '''#!%s
import sys
state = %r
args = open(state).read().split()
op = sys.argv[-1]
if op == "--info=DEFAULT":
    print('args="%%s"' %% " ".join(args))
    sys.exit(0)
flag, _, value = op.partition("=")
for a in value.split():
    args = [x for x in args if x.split("=", 1)[0] != a.split("=", 1)[0]] if flag == "--args" or "=" not in a \\
        else [x for x in args if x != a]
    if flag == "--args":
        args.append(a)
open(state, "w").write(" ".join(args))
'''

# (start preset, start driver, start mode, desired driver options, driver and mode after the reboot)
TRANSITIONS = {
    "amd:acpi->amd-pstate-active": ("audited-epyc-8gpu", None, None,
                                    {"driver": "amd-pstate", "amd_pstate_mode": "active"},
                                    ("amd-pstate-epp", "active")),
    "amd:acpi->amd-pstate-passive": ("audited-epyc-8gpu", None, None,
                                     {"driver": "amd-pstate", "amd_pstate_mode": "passive"}, ("amd-pstate", "passive")),
    "amd:acpi->amd-pstate-guided": ("audited-epyc-8gpu", None, None,
                                    {"driver": "amd-pstate", "amd_pstate_mode": "guided"}, ("amd-pstate", "guided")),
    "amd:acpi->native": ("audited-epyc-8gpu", None, None, {"driver": "native"}, ("amd-pstate-epp", "active")),
    "amd:amd-pstate-epp->acpi": ("epyc-pstate-epp", None, None, {"driver": "acpi-cpufreq"}, ("acpi-cpufreq", None)),
    "amd:amd-pstate-passive->acpi": ("epyc-pstate-epp", "amd-pstate", "passive", {"driver": "acpi-cpufreq"},
                                     ("acpi-cpufreq", None)),
    "amd:amd-pstate-guided->acpi": ("epyc-pstate-epp", "amd-pstate", "guided", {"driver": "acpi-cpufreq"},
                                    ("acpi-cpufreq", None)),
    "intel:acpi->intel_pstate-active": ("xeon-4gpu-switch", "acpi-cpufreq", None,
                                        {"driver": "intel_pstate", "intel_pstate_status": "active"},
                                        ("intel_pstate", "active")),
    "intel:acpi->intel_pstate-passive": ("xeon-4gpu-switch", "acpi-cpufreq", None,
                                         {"driver": "intel_pstate", "intel_pstate_status": "passive"},
                                         ("intel_cpufreq", "passive")),
    "intel:acpi->native": ("xeon-4gpu-switch", "acpi-cpufreq", None, {"driver": "native"}, ("intel_pstate", "active")),
    "intel:intel_pstate->acpi": ("xeon-4gpu-switch", None, None, {"driver": "acpi-cpufreq"}, ("acpi-cpufreq", None)),
    "intel:intel_cpufreq-passive->acpi": ("xeon-4gpu-switch", "intel_cpufreq", "passive", {"driver": "acpi-cpufreq"},
                                          ("acpi-cpufreq", None)),
}


def make_node(build_node, tmp_path, preset, driver, mode, loader):
    """The start node: ``preset`` (or its CPU vendor with another driver), booting through ``loader``."""
    root = build_node(preset, cpus=CPUS, gpus=0)
    if driver:
        set_cpufreq_driver(root, tmp_path, driver, mode)
    if loader == "grub":
        write_file(root, "etc/os-release", 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n')
        write_file(root, "etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
        os.makedirs(os.path.join(root, "etc/default/grub.d"), exist_ok=True)
    else:
        write_file(root, "etc/os-release", 'ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.5"\n')
        for rel in ("etc/default/grub", DROPIN):
            if os.path.exists(os.path.join(root, rel)):
                os.unlink(os.path.join(root, rel))
        write_file(root, "grubby.args", read_file(root, "proc/cmdline"))
        write_file(root, "usr/sbin/grubby", GRUBBY % (sys.executable, os.path.join(root, "grubby.args")))
        os.chmod(os.path.join(root, "usr/sbin/grubby"), 0o755)
    return root


def boot_config(root, loader):
    """The ``cmdline`` context verification gets from the role (the drop-in slurp, or grubby's answer)."""
    if loader == "grub":
        text = read_file(root, DROPIN)
        if text is None:
            return {"bootloader": "grub", "dropin_slurp": {"failed": True, "msg": "file not found: " + DROPIN}}
        return {"bootloader": "grub", "dropin_slurp": {"content": base64.b64encode(text.encode()).decode()}}
    res = subprocess.run([os.path.join(root, "usr/sbin/grubby"), "--info=DEFAULT"], capture_output=True, text=True,
                         check=False)
    return {"bootloader": "grubby", "grubby": {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}}


def driver_row(root, loader, desired):
    facts = verify.gather(Node(root), sysctls=[], modules=[])
    result = v.evaluate_host(facts, {"cpufreq": desired}, {"root": root, "boot_config": boot_config(root, loader)})
    return {s["id"]: s for s in result["settings"]}["cpufreq.driver"]


def plan(run_module, root, desired):
    """cpu_freq's plan as the persistent flow asks for it (check mode)."""
    result, failed = run_module("cpu_freq", dict(desired, root=root), check=True)
    assert not failed, result
    return result


@pytest.mark.parametrize("loader", ["grub", "grubby"])
@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_transition_is_pending_then_applied_after_the_reboot(build_node, tmp_path, run_module, name, loader):
    preset, driver, mode, desired, (new_driver, new_mode) = TRANSITIONS[name]
    root = make_node(build_node, tmp_path, preset, driver, mode, loader)

    planned = plan(run_module, root, desired)
    assert planned["reboot_required"] is True and planned["kernel_args"], planned
    args = planned["kernel_args"]
    result, failed = run_module("kernel_cmdline", {"arguments": args, "root": root})
    assert not failed and result["changed"] and result["bootloader"] == loader, result

    row = driver_row(root, loader, desired)
    assert row["state"] == "pending_reboot", (row["reason"], row)
    assert row["persisted"] == " ".join(args) and " ".join(args) in row["reason"]

    # The reboot: the configured arguments reach /proc/cmdline, the kernel loads the new driver.
    running = kernel_cmdline.add_arguments(read_file(root, "proc/cmdline").split(), args)
    write_file(root, "proc/cmdline", " ".join(running))
    set_cpufreq_driver(root, tmp_path, new_driver, new_mode)

    row = driver_row(root, loader, desired)
    assert row["state"] == "applied", row
    assert plan(run_module, root, desired)["reboot_required"] is False
    # The rollback removes every argument the flow configured.
    assert set(args) <= set(cpu_freq.driver_kernel_args(desired["driver"], desired.get("amd_pstate_mode")).removable)


def test_acpi_cpufreq_on_an_amd_pstate_epp_node_is_pending_not_drifted(build_node, tmp_path, run_module):
    # The case: amd_pstate=disable in the GRUB drop-in is the configured switch to acpi-cpufreq.
    root = make_node(build_node, tmp_path, "epyc-pstate-epp", None, None, "grub")
    run_module("kernel_cmdline", {"arguments": ["amd_pstate=disable"], "root": root})
    row = driver_row(root, "grub", {"driver": "acpi-cpufreq"})
    assert row["state"] == "pending_reboot", (row["reason"], row)
    assert "could not be read" not in row["reason"]


def test_acpi_cpufreq_not_configured_is_drifted_and_names_the_argument(build_node, tmp_path):
    root = make_node(build_node, tmp_path, "xeon-4gpu-switch", None, None, "grubby")
    row = driver_row(root, "grubby", {"driver": "acpi-cpufreq"})
    assert row["state"] == "drifted" and "intel_pstate=disable is not configured" in row["reason"], row


# Mode switches inside one pstate driver family need no kernel argument: cpu_freq writes the
# status file at runtime (and the boot unit re-applies it), so the persistent flow plans nothing.
MODE_SWITCHES = {
    "amd:active->passive": ("epyc-pstate-epp", None, None, {"driver": "amd-pstate", "amd_pstate_mode": "passive"}),
    "amd:active->guided": ("epyc-pstate-epp", None, None, {"driver": "amd-pstate", "amd_pstate_mode": "guided"}),
    "amd:passive->active": ("epyc-pstate-epp", "amd-pstate", "passive",
                            {"driver": "amd-pstate", "amd_pstate_mode": "active"}),
    "intel:active->passive": ("xeon-4gpu-switch", None, None,
                              {"driver": "intel_pstate", "intel_pstate_status": "passive"}),
    "intel:passive->active": ("xeon-4gpu-switch", "intel_cpufreq", "passive",
                              {"driver": "intel_pstate", "intel_pstate_status": "active"}),
}


@pytest.mark.parametrize("name", sorted(MODE_SWITCHES))
def test_mode_switch_needs_no_kernel_argument(build_node, tmp_path, run_module, name):
    preset, driver, mode, desired = MODE_SWITCHES[name]
    root = make_node(build_node, tmp_path, preset, driver, mode, "grub")
    planned = plan(run_module, root, desired)
    assert planned["reboot_required"] is False and planned["kernel_args"] == [], planned
    row = driver_row(root, "grub", desired)
    assert row["state"] == "drifted" and "switched at runtime" in row["reason"], row
