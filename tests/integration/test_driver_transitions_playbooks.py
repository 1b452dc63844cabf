"""cpufreq driver transitions end to end: tune.yml (its verification), a simulated reboot, verify.yml.

One inventory covers four transitions (so two playbook runs cover them all): amd-pstate-epp ->
acpi-cpufreq (the issue's case: amd_pstate=disable was written yet verification said drifted),
acpi-cpufreq -> amd-pstate guided, intel_pstate -> acpi-cpufreq, acpi-cpufreq -> intel_pstate
(native). The nodes boot through GRUB: the role does not run grubby on a simulated root, so the
grubby variants are covered at the Python level (tests/unit/test_driver_transitions.py).
"""

from __future__ import annotations

import json
import os

import simnode
from support.inventory import write_inventory
from support.nodes import read_file, set_cpufreq_driver, write_file
from support.playbooks import run_playbook

from ansible_collections.gpunode.tuning.plugins.module_utils.families import kernel_cmdline

CPUS = 4
DROPIN = kernel_cmdline.DEFAULT_DROPIN.lstrip("/")

# host -> (preset, driver to start from or None for the preset's, role variables, driver and mode after the reboot)
HOSTS = {
    "amd_epp_to_acpi": ("epyc-pstate-epp", None, {"gpunode_tuning_cpufreq_driver": "acpi-cpufreq"},
                        ("acpi-cpufreq", None), "amd_pstate=disable"),
    "amd_acpi_to_guided": ("audited-epyc-8gpu", None, {"gpunode_tuning_cpufreq_driver": "amd-pstate",
                                                       "gpunode_tuning_cpufreq_amd_pstate_mode": "guided"},
                           ("amd-pstate", "guided"), "amd_pstate=guided"),
    "intel_pstate_to_acpi": ("xeon-4gpu-switch", None, {"gpunode_tuning_cpufreq_driver": "acpi-cpufreq"},
                             ("acpi-cpufreq", None), "intel_pstate=disable"),
    "intel_acpi_to_native": ("xeon-4gpu-switch", "acpi-cpufreq", {"gpunode_tuning_cpufreq_driver": "native"},
                             ("intel_pstate", "active"), "intel_pstate=active"),
}


def make_nodes(tmp_path):
    roots = {}
    for name, (preset, driver, _vars, _after, _arg) in HOSTS.items():
        root = str(tmp_path / name)
        simnode.build(root, preset, cpus=CPUS, gpus=1)
        if driver:
            set_cpufreq_driver(root, tmp_path, driver, None)
        # A GRUB node (the xeon preset is a RHEL one).
        write_file(root, "etc/os-release", 'ID=debian\nVERSION_ID="12"\n')
        if not os.path.exists(os.path.join(root, "etc/default/grub")):
            write_file(root, "etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
            os.makedirs(os.path.join(root, "etc/default/grub.d"), exist_ok=True)
        roots[name] = root
    return roots


def driver_rows(reports):
    rows = {}
    for name in HOSTS:
        result = json.loads((reports / ("%s.json" % name)).read_text())
        rows[name] = {s["id"]: s for s in result["settings"]}["cpufreq.driver"]
    return rows


def test_driver_transitions_pending_then_applied_after_a_reboot(tmp_path):
    roots = make_nodes(tmp_path)
    reports = tmp_path / "reports"
    inv = write_inventory(tmp_path / "inventory.yml", roots, reports, host_vars={n: HOSTS[n][2] for n in roots})
    proc = run_playbook("tune.yml", inv)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for name, root in roots.items():
        assert HOSTS[name][4] in kernel_cmdline.parse_dropin(read_file(root, DROPIN))[1], name

    rows = driver_rows(reports)  # tune.yml ends with a verification (runtime gate) that writes the reports
    for name, row in rows.items():
        assert (row["state"], row["persisted"]) == ("pending_reboot", HOSTS[name][4]), (name, row, proc.stdout[-3000:])

    for name, root in roots.items():  # the reboot: the drop-in's arguments run, the kernel loads the new driver
        args = kernel_cmdline.parse_dropin(read_file(root, DROPIN))[1]
        cmdline = kernel_cmdline.add_arguments(read_file(root, "proc/cmdline").split(), args)
        write_file(root, "proc/cmdline", " ".join(cmdline))
        set_cpufreq_driver(root, tmp_path, *HOSTS[name][3])
    proc = run_playbook("verify.yml", inv)
    rows = driver_rows(reports)
    for name, row in rows.items():
        assert row["state"] == "applied", (name, row, proc.stdout[-3000:])
