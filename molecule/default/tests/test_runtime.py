# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Scenario ``default``: tune.yml --tags runtime on the simulated audited-epyc-8gpu node."""

from __future__ import annotations

import re

from support.molecule import CPUS, GPU_BDFS, PRISTINE

SYSCTLS = {
    "kernel/numa_balancing": "0",
    "vm/swappiness": "10",
    "net/core/rmem_max": "134217728",
    "net/core/wmem_max": "134217728",
    "net/core/somaxconn": "65535",
}
# Everything a runtime run may write below the root (and the GPUs' root ports: gpu_bridge_configs);
# any other change is a bug.
EXPECTED_CHANGES = [
    r"sys/devices/pci[0-9a-f:]+/[0-9a-f:.]+/(%s)/config" % "|".join(re.escape(b) for b in GPU_BDFS),
    r"sys/devices/system/cpu/cpu\d+/cpuidle/state2/disable",
    r"sys/devices/system/cpu/cpufreq/policy\d+/scaling_governor",
    r"proc/sys/(%s)" % "|".join(SYSCTLS),
    r"sys/kernel/mm/transparent_hugepage/(enabled|defrag)",
    # the preset's PCIe ASPM policy (the simulated GPU links have ASPM off already: no link attribute is written)
    r"sys/module/pcie_aspm/parameters/policy",
    # nvidia_peermem's failed load logs an error, as the kernel would.
    r"dev/kmsg",
    r"var/lib/gpunode-tuning",
]


def test_gpus_read_mrrs_4096_through_lspci(node):
    mrrs = node.lspci_mrrs()
    assert {bdf: mrrs[bdf] for bdf in GPU_BDFS} == {bdf: 4096 for bdf in GPU_BDFS}


def test_other_devices_keep_their_mrrs(node):
    before = node.lspci_mrrs(PRISTINE)
    after = node.lspci_mrrs()
    others = sorted(set(before) - set(GPU_BDFS))
    # Bridges, the NIC, the NVMe drive and the GPUs' HDMI-audio functions.
    assert len(others) > 10
    assert {bdf: after[bdf] for bdf in others} == {bdf: before[bdf] for bdf in others}


def gpu_bridge_configs(paths):
    """Config files of the bridges directly above the GPUs (their root ports), from GPU config paths."""
    return {p.rsplit("/", 2)[0] + "/config" for p in paths
            if p.startswith("sys/devices/pci") and p.split("/")[-2] in GPU_BDFS}


def test_only_gpu_and_gpu_root_port_config_space_was_written(node):
    pci = sorted(p for p in node.changed_paths() if p.startswith("sys/devices/pci"))
    gpus = [p for p in pci if p.split("/")[-2] in GPU_BDFS]
    assert [p.split("/")[-2] for p in gpus] == GPU_BDFS
    # ACS redirect is cleared on the root ports above the GPUs (the preset's disable_redirect), and
    # on no other bridge: the NIC's and the NVMe drive's root ports keep theirs.
    bridges = gpu_bridge_configs(gpus)
    assert bridges and sorted(set(pci) - set(gpus)) == sorted(bridges)


def test_c2_disabled_on_every_cpu_and_c1_kept(node):
    names = node.read_glob("sys/devices/system/cpu/cpu[0-9]*/cpuidle/state*/name")
    disabled = node.read_glob("sys/devices/system/cpu/cpu[0-9]*/cpuidle/state*/disable")
    by_name = {}
    for path, name in names.items():
        flag = disabled[path.rsplit("/", 1)[0] + "/disable"].strip()
        by_name.setdefault(name.strip(), []).append(flag)
    assert by_name["C2"] == ["1"] * CPUS
    assert by_name["C1"] == ["0"] * CPUS
    assert by_name["POLL"] == ["0"] * CPUS


def test_governor_is_performance_on_every_policy(node):
    governors = node.read_glob("sys/devices/system/cpu/cpufreq/policy*/scaling_governor")
    assert len(governors) == CPUS
    assert {g.strip() for g in governors.values()} == {"performance"}


def test_sysctls_and_numa_balancing(node):
    assert {key: node.read("proc/sys/" + key).strip() for key in SYSCTLS} == SYSCTLS


def test_transparent_hugepages(node):
    assert "[madvise]" in node.read("sys/kernel/mm/transparent_hugepage/enabled")
    assert "[defer+madvise]" in node.read("sys/kernel/mm/transparent_hugepage/defrag")


def test_aspm_policy_is_performance(node):
    assert "[performance]" in node.read("sys/module/pcie_aspm/parameters/policy")


def test_nvidia_peermem_not_loaded_and_logged(node):
    assert not node.exists("sys/module/nvidia_peermem")
    kmsg = node.read("dev/kmsg")
    pristine = node.host.file(PRISTINE + "/dev/kmsg").content_string
    assert kmsg.startswith(pristine)
    assert "ib_register_peer_memory_client failed" in kmsg[len(pristine):]


def test_journal_holds_the_originals(node):
    families = node.journal()["families"]
    assert {bdf: e["original"] for bdf, e in families["pcie_mrrs"].items()} == {b: 512 for b in GPU_BDFS}
    assert families["cpuidle"]["C2"]["original"] == {"0": "0-%d" % (CPUS - 1)}
    assert families["cpufreq"]["governor"]["original"] == {"schedutil": "0-%d" % (CPUS - 1)}
    tunables = {key: e["original"] for key, e in families["tunables"].items()}
    assert tunables["kernel.numa_balancing"] == "1"
    assert tunables["vm.swappiness"] == "60"
    assert tunables["transparent_hugepage.enabled"] == "always"


def test_nothing_else_written_and_nothing_persistent(node):
    changed = node.changed_paths()
    bridges = gpu_bridge_configs(changed)
    unexpected = sorted(p for p in changed
                        if p not in bridges and not any(re.fullmatch(rx, p) for rx in EXPECTED_CHANGES))
    assert unexpected == []
