"""The simulated reboot (tools/simnode reboot) after the real persistent flow, and after a rollback.

tune.yml (runtime and persistent) leaves kernel arguments in the GRUB drop-in, drop-ins and the boot unit;
verification says the driver switch and the IOMMU mode are pending_reboot. After ``simnode.reboot`` (the
journaled values reset, the new command line with its driver and IOMMU type, the drop-ins, then the boot
unit's re-apply run as the unit would) verify.yml finds every setting applied, nothing pending, with the
journal untouched. After rollback.yml, the next reboot brings the node's own command line and driver back.
"""

from __future__ import annotations

import json
import os

import simnode
from support.playbooks import run_playbook

JOURNAL = "var/lib/gpunode-tuning/journal.json"
DROPIN = simnode.GRUB_DROPIN.lstrip("/")
# host -> (preset, build options, role variables, the driver and mode after the reboot, its argument)
HOSTS = {
    "acpi_to_epp": ("audited-epyc-8gpu", {"iommu": "DMA-FQ"},
                    {"gpunode_tuning_cpufreq_driver": "amd-pstate", "gpunode_tuning_cpufreq_amd_pstate_mode": "active",
                     "gpunode_tuning_iommu_mode": "passthrough"},
                    ["amd-pstate-epp", "active"], "amd_pstate=active"),
    "epp_to_acpi": ("epyc-pstate-epp", {}, {"gpunode_tuning_cpufreq_driver": "acpi-cpufreq"},
                    ["acpi-cpufreq", None], "amd_pstate=disable"),
}
PENDING = ("pending_reboot", "drifted")


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return fh.read()


def inventory(tmp_path, roots, reports):
    lines = ["all:", "  children:", "    gpunodes:", "      vars:", "        ansible_connection: local",
             '        ansible_python_interpreter: "{{ ansible_playbook_python }}"',
             "        gpunode_tuning_report_dir: %s" % reports, "      hosts:"]
    for name, root in roots.items():
        lines += ["        %s:" % name, "          gpunode_tuning_root: %s" % root]
        lines += ["          %s: %s" % (k, json.dumps(v)) for k, v in HOSTS[name][2].items()]
    path = tmp_path / "inventory.yml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def states(reports, name):
    result = json.loads((reports / ("%s.json" % name)).read_text())
    return {s["id"]: (s["state"], s["reason"]) for s in result["settings"]}


def test_a_simulated_reboot_applies_what_the_persistent_flow_left_and_verification_finds_nothing_pending(tmp_path):
    roots, original = {}, {}
    for name, (preset, options, _vars, _after, _arg) in HOSTS.items():
        roots[name] = str(tmp_path / name)
        simnode.build(roots[name], preset, cpus=4, gpus=1, **options)
        original[name] = (read(roots[name], "proc/cmdline"), simnode.running_cpufreq(roots[name]))
    reports = tmp_path / "reports"
    inv = inventory(tmp_path, roots, reports)
    proc = run_playbook("tune.yml", inv)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for name, root in roots.items():
        assert states(reports, name)["cpufreq.driver"][0] == "pending_reboot", name
        assert os.path.lexists(os.path.join(root, simnode.BOOT_UNIT_WANTS)), name  # an absolute link on the node

    journals = {name: read(root, JOURNAL) for name, root in roots.items()}
    for name, root in roots.items():
        report = simnode.reboot(root)
        assert report["returned"] and report["problems"] == [], (name, report)
        assert HOSTS[name][4] in report["added"] and report["cpufreq"]["after"] == HOSTS[name][3], report
        assert report["boot_unit"]["ran"] and report["boot_unit"]["rc"] == 0, report["boot_unit"]
        assert any(line.startswith("gpunode-tuning-boot: cpuidle: ") for line in report["boot_unit"]["output"])
        assert report["reset"]["families"] and report["reset"]["failed"] == {}, report["reset"]
        assert read(root, JOURNAL) == journals[name]  # a reboot resets values, not the record of their originals
    assert read(roots["acpi_to_epp"], "sys/kernel/iommu_groups/0/type").strip() == "identity"

    proc = run_playbook("verify.yml", inv)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for name in roots:
        got = states(reports, name)
        assert got["cpufreq.driver"] == ("applied", ""), (name, got["cpufreq.driver"])
        assert not {k: v for k, v in got.items() if v[0] in PENDING}, (name, got)
    assert states(reports, "acpi_to_epp")["iommu.mode"][0] == "applied"

    # Rollback after a driver switch: the journal's governor and EPP are the old driver's, which the running one
    # refuses (schedutil on amd-pstate-epp, EPP on acpi-cpufreq), so cpufreq's restore fails and keeps them; the
    # rest is rolled back, the drop-in included. The reboot brings the node's own command line and driver back,
    # and a second rollback restores cpufreq too: nothing of ours is left.
    proc = run_playbook("rollback.yml", inv)
    assert proc.returncode != 0 and "cpufreq originals could not be restored" in proc.stdout, proc.stdout[-3000:]
    for name, root in roots.items():
        assert not os.path.exists(os.path.join(root, DROPIN))
        report = simnode.reboot(root)
        assert report["returned"] and report["problems"] == [] and not report["boot_unit"]["ran"], report
        assert (read(root, "proc/cmdline"), simnode.running_cpufreq(root)) == original[name], name
    proc = run_playbook("rollback.yml", inv)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert not any(os.path.exists(os.path.join(root, JOURNAL)) for root in roots.values())
