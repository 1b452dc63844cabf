"""Pure verification logic (module_utils/flows/verification.py) on fixture data and simulated nodes."""

from __future__ import annotations

import base64
import json

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, nvidia_smi
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification as v
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify

DESIRED = {
    "pcie_mrrs": {"mrrs": 4096},
    "cpuidle": {"disable": [], "max_latency_us": 100, "cpus": ""},
    "cpufreq": {"driver": "amd-pstate", "amd_pstate_mode": "active", "governor": "performance", "epp": None,
                "boost": None},
    "numa_balancing": 0,
    "thp": {"enabled": "madvise", "defrag": "defer+madvise"},
    "sysctl": {"vm.swappiness": 10, "kernel.numa_balancing": 0},
    "kmod": {"modules": [{"name": "nvidia_peermem", "params": {}, "required": False}]},
    "kernel_cmdline": [],
}
BOOT_ID = "5f0c7a1e-3b2d-4c8e-9a61-0d2b7e4f9c13"
P2P = (" \tGPU0\tGPU1\tGPU2\t\n GPU0\tX\tOK\tCNS\t\n GPU1\tOK\tX\tOK\t\n GPU2\tCNS\tOK\tX\t\n\n"
       "Legend:\n\n  X    = Self\n  OK   = Status Ok\n  CNS  = Chipset not supported\n")
TOPO = ("\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNODE\tSYS\t0-31\t0\t\tN/A\nGPU1\tNODE\t X \tSYS\t0-31\t0\t\tN/A\n"
        "GPU2\tSYS\tSYS\t X \t32-63\t1\t\tN/A\n\nLegend:\n\n  X    = Self\n")
QUERY = "0, 00000000:41:00.0, Enabled\n1, 00000000:61:00.0, Disabled\n2, 00000000:81:00.0, Enabled\n"


def gather(root, **kw):
    kw.setdefault("sysctls", ["vm.swappiness", "kernel.numa_balancing"])
    kw.setdefault("modules", ["nvidia_peermem"])
    return verify.gather(Node(root), **kw)


def by_id(result):
    return {s["id"]: s for s in result["settings"]}


def slurp(text):
    return {"content": base64.b64encode(text.encode()).decode(), "encoding": "base64"}


# --- kernel-log start ---------------------------------------------------------------------------


def test_kmsg_since_uses_the_journal_marker_of_this_boot():
    journal = {"version": 1, "families": {}, "last_applied": {"family": "cpufreq", "time": "T", "uptime": 5000.5,
                                                              "boot_id": BOOT_ID}}
    got = v.kmsg_since(json.dumps(journal), BOOT_ID + "\n")
    assert (got["since"], got["source"]) == (5000.5, "journal")
    assert v.kmsg_since(slurp(json.dumps(journal)), BOOT_ID)["since"] == 5000.5


def test_kmsg_since_counts_from_boot_after_a_reboot_or_without_marker():
    journal = {"version": 1, "families": {}, "last_applied": {"uptime": 5000.5, "boot_id": "other"}}
    got = v.kmsg_since(journal, BOOT_ID)
    assert (got["since"], got["source"]) == (0.0, "boot") and "earlier boot" in got["detail"]
    assert v.kmsg_since(None, BOOT_ID)["source"] == "boot"
    assert v.kmsg_since("", "")["since"] == 0.0
    assert v.kmsg_since({"version": 1, "families": {}}, BOOT_ID)["source"] == "boot"


def test_kmsg_since_override_wins_and_is_validated():
    assert v.kmsg_since(None, None, 12)["source"] == "override"
    with pytest.raises(v.VerificationError, match=">= 0"):
        v.kmsg_since(None, None, -1)
    with pytest.raises(v.VerificationError, match="number of seconds"):
        v.kmsg_since(None, None, "soon")
    with pytest.raises(v.VerificationError, match="not JSON"):
        v.kmsg_since("{", BOOT_ID)


# --- parsers -------------------------------------------------------------------------------------


def test_parse_sysctl_conf():
    text = ("# managed\n; comment\nvm.swappiness = 10\nnet/core/somaxconn=65535\n"
            "-net.ipv4.tcp_rmem = 4096\t131072  6291456\n")
    assert v.parse_sysctl_conf(text) == {"vm.swappiness": "10", "net.core.somaxconn": "65535",
                                         "net.ipv4.tcp_rmem": "4096 131072 6291456"}


def test_parse_p2p_lists_every_ordered_pair_and_the_bad_ones():
    got = nvidia_smi.parse_p2p(P2P)
    assert got["gpus"] == ["GPU0", "GPU1", "GPU2"]
    assert len(got["pairs"]) == 6
    assert [(p["a"], p["b"], p["meaning"]) for p in got["not_ok"]] == [
        ("GPU0", "GPU2", "chipset not supported"), ("GPU2", "GPU0", "chipset not supported")]
    assert nvidia_smi.parse_p2p("") == {"gpus": [], "pairs": [], "not_ok": []}


def test_parse_topology_ignores_affinity_columns():
    got = nvidia_smi.parse_topology(TOPO)
    assert got["links"] == [{"a": "GPU0", "b": "GPU1", "link": "NODE"}, {"a": "GPU0", "b": "GPU2", "link": "SYS"},
                            {"a": "GPU1", "b": "GPU2", "link": "SYS"}]


def test_parse_gpu_query_normalizes_the_domain():
    assert nvidia_smi.parse_gpu_query(QUERY)[0] == {"index": 0, "bdf": "0000:41:00.0", "persistence_mode": "Enabled"}


def test_configured_arguments_from_the_dropin_or_grubby():
    dropin = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active iommu=pt"\n'
    assert v.configured_arguments({"bootloader": "grub", "dropin_slurp": slurp(dropin)}) == (
        ["amd_pstate=active", "iommu=pt"], None)
    missing = {"failed": False, "msg": "File not found: /x"}
    assert v.configured_arguments({"bootloader": "grub", "dropin_slurp": missing}) == ([], None)
    grubby = {"rc": 0, "stdout": 'index=0\nkernel="/boot/vmlinuz"\nargs="ro quiet intel_pstate=active"\n'}
    assert v.configured_arguments({"bootloader": "grubby", "grubby": grubby})[0] == ["ro", "quiet",
                                                                                     "intel_pstate=active"]
    args, why = v.configured_arguments({"bootloader": "grubby", "grubby": {"skipped": True}})
    assert args is None and "simulated" in why


# --- states on simulated nodes --------------------------------------------------------------------


def test_untuned_audited_node_drifts(build_node):
    root = build_node("audited-epyc-8gpu")
    res = v.evaluate_host(gather(root), DESIRED, {"root": root})
    s = by_id(res)
    assert s["pcie_mrrs.0000:41:00.0"]["state"] == "drifted"
    assert s["cpuidle.C2"]["state"] == "drifted" and s["cpuidle.C1"]["state"] == "applied"
    assert s["cpufreq.driver"]["state"] == "drifted"
    assert "amd_pstate=active is not configured" in s["cpufreq.driver"]["reason"]
    assert s["numa_balancing.kernel.numa_balancing"]["state"] == "drifted"
    assert "sysctl.kernel.numa_balancing" not in s  # belongs to the numa_balancing family
    assert s["kmod.nvidia_peermem"]["state"] == "not_applicable"
    assert res["status"] == "fail" and not res["ok"]


def test_pending_reboot_when_the_argument_is_configured(build_node):
    root = build_node("audited-epyc-8gpu")
    dropin = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active"\n'
    ctx = {"root": root, "boot_config": {"bootloader": "grub", "dropin_slurp": slurp(dropin)}}
    desired = dict(DESIRED, cpufreq={"driver": "amd-pstate", "amd_pstate_mode": "active", "epp": "performance"})
    s = by_id(v.evaluate_host(gather(root), desired, ctx))
    assert s["cpufreq.driver"]["state"] == "pending_reboot"
    assert s["cpufreq.driver"]["persisted"] == "amd_pstate=active"
    # acpi-cpufreq has no EPP: it comes with the driver switch.
    assert s["cpufreq.epp"]["state"] == "pending_reboot"


def test_pending_only_fails_when_asked(build_node):
    root = build_node("audited-epyc-8gpu")
    desired = {"kernel_cmdline": ["iommu=pt"]}
    dropin = slurp('GRUB_CMDLINE_LINUX_DEFAULT="iommu=pt"\n')
    ctx = {"root": root, "boot_config": {"bootloader": "grub", "dropin_slurp": dropin}}
    facts = gather(root)
    assert v.evaluate_host(facts, desired, ctx)["ok"]
    res = v.evaluate_host(facts, desired, ctx, fail_on_pending=True)
    assert not res["ok"] and "pending a reboot" in res["failures"][0]


def test_driver_on_the_command_line_but_not_running_is_drifted(build_node):
    root = build_node("audited-epyc-8gpu")
    facts = gather(root)
    facts["kernel"]["cmdline_args"].append("amd_pstate=active")
    s = by_id(v.evaluate_host(facts, {"cpufreq": {"driver": "amd-pstate", "amd_pstate_mode": "active"}},
                              {"root": root}))
    assert s["cpufreq.driver"]["state"] == "drifted" and "CPPC" in s["cpufreq.driver"]["reason"]


def test_applied_on_a_pstate_node(build_node):
    root = build_node("epyc-pstate-epp")
    desired = {"cpufreq": {"driver": "amd-pstate", "amd_pstate_mode": "active", "governor": "powersave",
                           "epp": "balance_performance", "boost": True}}
    res = v.evaluate_host(gather(root), desired, {"root": root})
    assert {s["state"] for s in res["settings"] if s["family"] == "cpufreq"} == {"applied"}


def test_unsupported_governor_and_wrong_vendor(build_node):
    root = build_node("xeon-4gpu-switch")
    desired = {"cpufreq": {"driver": "amd-pstate", "amd_pstate_mode": "active", "governor": "schedutil"},
               "cpuidle": {"disable": ["C2"]}}
    s = by_id(v.evaluate_host(gather(root), desired, {"root": root}))
    assert s["cpufreq.driver"]["state"] == "not_applicable" and "AMD" in s["cpufreq.driver"]["reason"]
    assert s["cpufreq.governor"]["state"] == "unsupported"
    assert s["cpuidle.C2"]["state"] == "not_applicable" and "C6" in s["cpuidle.C2"]["reason"]


def test_tiny_vm_is_not_applicable(build_node):
    root = build_node("tiny-vm")
    res = v.evaluate_host(gather(root), DESIRED, {"root": root})
    # gpu_health and gpu_settings: the rows of the former GPU section (driver_count, persistence_mode).
    for name in ("pcie_mrrs", "cpuidle", "cpufreq", "kmod", "gpu_health", "gpu_settings"):
        assert {s["state"] for s in res["settings"] if s["family"] == name} == {"not_applicable"}, name


def test_lockdown_and_bus_perf_explain_the_mrrs_drift(build_node):
    root = build_node("locked-bus-perf")
    s = by_id(v.evaluate_host(gather(root), {"pcie_mrrs": {"mrrs": 4096}}, {"root": root}))
    reason = s["pcie_mrrs.0000:41:00.0"]["reason"]
    assert "pcie_bus_perf" in reason and "lockdown (integrity)" in reason


def test_sysctl_persisted_from_the_dropin(build_node):
    root = build_node("tiny-vm")
    ctx = {"root": root, "sysctl_persisted": "vm.swappiness = 10\n"}
    s = by_id(v.evaluate_host(gather(root), {"sysctl": {"vm.swappiness": 10, "vm.nonexistent": 1}}, ctx))
    assert (s["sysctl.vm.swappiness"]["state"], s["sysctl.vm.swappiness"]["persisted"]) == ("drifted", "10")
    assert s["sysctl.vm.nonexistent"]["state"] == "not_applicable"


def test_kmod_states(build_node):
    root = build_node("audited-epyc-8gpu")
    mods = [{"name": "nvidia", "params": {"NVreg_EnableGpuFirmware": 0}},
            {"name": "nvme", "params": {}},
            {"name": "msr", "required": True},
            {"name": "nouveau", "state": "absent"}]
    facts = gather(root, modules=["nvidia", "nvme", "msr", "nouveau"])
    s = by_id(v.evaluate_host(facts, {"kmod": {"modules": mods}}, {"root": root, "modules_persisted": ["nvme"]}))
    # The module row says loaded; each parameter has its own row (no options line of ours: drifted).
    param = s["kmod.nvidia.NVreg_EnableGpuFirmware"]
    assert s["kmod.nvidia"]["state"] == "applied" and param["state"] == "drifted"
    assert (param["desired"], param["running"], param["persisted"]) == ("0", "1", None)
    assert "persistent flow writes the options line" in param["reason"]
    assert (s["kmod.nvme"]["state"], s["kmod.nvme"]["persisted"]) == ("applied", "loaded at boot")
    assert s["kmod.msr"]["state"] == "drifted"
    assert s["kmod.nouveau"]["state"] == "applied"


def test_boot_unit_marks_runtime_families_persisted(build_node):
    root = build_node("audited-epyc-8gpu")
    s = by_id(v.evaluate_host(gather(root), DESIRED, {"root": root, "boot_unit": True}))
    assert s["pcie_mrrs.0000:41:00.0"]["persisted"] == 4096
    assert s["cpuidle.C2"]["persisted"] == "disabled"


# --- kernel log ---------------------------------------------------------------------------------


def test_kernel_log_failing_classes_are_configurable():
    kl = {"available": True, "counts": {"aer": 1, "module_failure": 2, "noise": 5}, "records": {}}
    section = v.kernel_log_section(kl, {"source": "journal", "detail": "since X"})
    assert section["failing"] == {"aer": 1} and section["new_errors"] == 1 and section["warnings"] == 2
    assert v.kernel_log_section(kl, {}, ["module_failure"])["failing"] == {"module_failure": 2}


# --- the GPU rows and sections (gpu_health, gpu_settings, gpu_p2p; the GPU section before 0.4) ---------


def test_gpu_rows_not_applicable_without_nvidia_smi(build_node):
    root = build_node("audited-epyc-8gpu")
    facts = gather(root)
    res = v.evaluate_host(facts, {}, {"root": root}, gpu={"probe": "simulated"})
    s = by_id(res)
    assert s["gpu_health.driver_count"]["state"] == "not_applicable" == s["gpu_settings.persistence_mode"]["state"]
    sections = {x["family"]: x["markdown"] for x in res["sections"]}
    assert sections == {"gpu_health": "Not applicable: simulated node root (%s): nvidia-smi is not run." % root}
    res = v.evaluate_host(facts, {}, {"root": "/"}, gpu={"probe": "absent"})
    assert "not installed" in by_id(res)["gpu_health.driver_count"]["reason"]
    assert "not installed" in res["sections"][0]["markdown"]
    res = v.evaluate_host(facts, {}, {"root": "/"}, gpu={"probe": "disabled"})
    assert not [x for x in res["settings"] if x["family"].startswith("gpu")]
    assert [x["markdown"] for x in res["sections"]] == ["Disabled: gpunode_tuning_verify_gpu_enabled is false."]


def test_gpu_rows_and_sections_with_nvidia_smi_output(build_node):
    root = build_node("audited-epyc-8gpu", gpus=3)
    results = [{"item": {"key": "query"}, "rc": 0, "stdout": QUERY},
               {"item": {"key": "topology"}, "rc": 0, "stdout": TOPO},
               {"item": {"key": "p2p_read"}, "rc": 0, "stdout": P2P},
               {"item": {"key": "p2p_write"}, "rc": 0, "stdout": P2P}]
    res = v.evaluate_host(gather(root), {}, {"root": "/"}, gpu={"probe": "present", "results": results})
    s = by_id(res)
    assert s["gpu_health.driver_count"]["state"] == "applied"
    assert (s["gpu_health.driver_count"]["desired"], s["gpu_health.driver_count"]["running"]) == (3, 3)
    assert s["gpu_settings.persistence_mode"]["state"] == "drifted"
    assert "GPU 1" in s["gpu_settings.persistence_mode"]["running"]
    sections = {x["family"]: x for x in res["sections"]}
    health = sections["gpu_health"]
    assert health["title"] == "GPU health"
    assert health["markdown"].startswith("3 GPU(s) visible to the driver (3 on the PCI bus).")
    assert "| 1 | 0000:61:00.0 | Disabled |" in health["markdown"]
    p2p = sections["gpu_p2p"]["markdown"]
    assert "```\n%s\n```" % TOPO.rstrip() in p2p
    assert len(nvidia_smi.parse_p2p(P2P)["not_ok"]) == 2
    assert "P2P read: 4 of 6 GPU pairs OK; not OK: GPU0->GPU2 CNS (chipset not supported), GPU2->GPU0 CNS" in p2p
    assert "P2P write: 4 of 6 GPU pairs OK" in p2p
    assert "gpu" not in res and "gpu" not in v.FAMILY_TITLES  # no GPU section, no "gpu" fleet column


def test_gpu_missing_from_the_driver_is_drifted(build_node):
    root = build_node("audited-epyc-8gpu", gpus=4)
    probe = {"probe": "present", "query": {"rc": 0, "stdout": QUERY}}
    res = v.evaluate_host(gather(root), {}, {"root": "/"}, gpu=probe)
    count = by_id(res)["gpu_health.driver_count"]
    assert count["state"] == "drifted" and "3 of 4" in count["reason"]
    assert v.health_findings(res) == ["gpu_health.driver_count: " + count["reason"]]
    failing = {"probe": "present", "query": {"rc": 9, "stderr": "NVIDIA-SMI has failed"}}
    res = v.evaluate_host(gather(root), {}, {"root": "/"}, gpu=failing)
    for row in ("gpu_health.driver_count", "gpu_settings.persistence_mode"):
        assert by_id(res)[row]["state"] == "drifted" and "rc 9" in by_id(res)[row]["reason"]
    assert res["sections"][0]["markdown"].startswith("Error: nvidia-smi failed (rc 9)")


# --- fleet --------------------------------------------------------------------------------------


def test_fleet_summary_orders_failing_hosts_and_lists_missing(build_node):
    root = build_node("audited-epyc-8gpu")
    facts = gather(root)
    bad = v.evaluate_host(facts, DESIRED, {"root": root}, host="bad")
    good = v.evaluate_host(facts, {"sysctl": {"vm.swappiness": 60}}, {"root": root}, host="good")
    err = v.error_result("err", "boom")
    fleet = v.fleet_summary({"good": good, "bad": bad, "err": err, "gone": None}, ["good", "bad", "err", "gone"])
    assert [r["host"] for r in fleet["failing"]] == ["err", "gone", "bad"]
    assert (fleet["hosts"], fleet["passed"], fleet["failed"]) == (4, 1, 3)
    assert fleet["cells"]["bad"]["pcie_mrrs"] == "8 drifted"
    assert fleet["cells"]["good"]["sysctl"] == "1 ok"
    assert fleet["cells"]["bad"]["kmod"] == "n/a"


def test_setting_rejects_unknown_states():
    with pytest.raises(v.VerificationError, match="applied"):
        family.setting("sysctl", "x", 1, 1, "fine")


def test_native_driver_means_the_vendors_pstate_driver(build_node):
    """driver=native: applied on the Xeon running intel_pstate, drifted on the acpi-cpufreq EPYC."""
    xeon = build_node("xeon-4gpu-switch")
    desired = {"cpufreq": {"driver": "native", "amd_pstate_mode": "active"}}
    s = by_id(v.evaluate_host(gather(xeon), desired, {"root": xeon}))
    assert s["cpufreq.driver"]["state"] == "applied"
    assert s["cpufreq.driver"]["desired"].startswith("intel_pstate")

    epyc = build_node("audited-epyc-8gpu")
    s = by_id(v.evaluate_host(gather(epyc), desired, {"root": epyc}))
    assert s["cpufreq.driver"]["state"] == "drifted"
    assert s["cpufreq.driver"]["desired"] == "amd-pstate (active)"


# --- the runtime gate (the runtime rollout) ---------------------------------------------------------

REBOOT_ONLY = {"cpufreq": {"driver": "amd-pstate", "amd_pstate_mode": "active", "epp": "performance"},
               "kernel_cmdline": ["iommu=pt"]}


def test_runtime_gate_passes_what_only_a_reboot_brings(build_node):
    # The audited node runs acpi-cpufreq: the driver switch, the EPP that only amd-pstate offers
    # and a kernel argument need the persistent flow and a reboot.
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    full = v.evaluate_host(gather(root), REBOOT_ONLY, {"root": root})
    runtime = v.evaluate_host(gather(root), REBOOT_ONLY, {"root": root}, gate="runtime")
    for res in (full, runtime):
        s = by_id(res)
        assert res["status"] == "fail"
        assert res["failures"] == ["3 drifted: cpufreq driver, epp; kernel_cmdline iommu=pt"]
        assert [s[k]["runtime"] for k in ("cpufreq.driver", "cpufreq.epp", "kernel_cmdline.iommu=pt")] == [False] * 3
        assert res["needs_reboot"] == [
            "cpufreq driver: amd-pstate (active) wanted, acpi-cpufreq runs (needs the persistent flow and a reboot)",
            "cpufreq epp: performance wanted, not in effect (needs the persistent flow and a reboot)",
            "kernel_cmdline iommu=pt: iommu=pt wanted, not in effect (needs the persistent flow and a reboot)"]
    assert full["gate"] == {"name": "full", "status": "fail", "ok": False, "failures": full["failures"]}
    assert runtime["gate"] == {"name": "runtime", "status": "pass", "ok": True, "failures": []}


def test_runtime_gate_fails_what_runtime_tuning_should_have_applied(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    desired = dict(REBOOT_ONLY, cpufreq=dict(REBOOT_ONLY["cpufreq"], governor="performance"), numa_balancing=0)
    res = v.evaluate_host(gather(root), desired, {"root": root}, gate="runtime")
    # acpi-cpufreq offers the performance governor: runtime tuning sets it.
    assert by_id(res)["cpufreq.governor"]["runtime"] is True
    assert res["gate"]["failures"] == ["2 drifted: cpufreq governor; numa_balancing kernel.numa_balancing"]
    # A mode switch within the running pstate driver is runtime work too.
    epp = build_node("epyc-pstate-epp", cpus=4, gpus=1)
    res = v.evaluate_host(gather(epp), {"cpufreq": {"driver": "amd-pstate", "amd_pstate_mode": "passive"}},
                          {"root": epp}, gate="runtime")
    assert by_id(res)["cpufreq.driver"]["runtime"] is True and res["needs_reboot"] == []
    assert res["gate"]["failures"] == ["1 drifted: cpufreq driver"]


def test_runtime_gate_lists_a_configured_driver_as_pending_and_keeps_kernel_errors(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    dropin = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active"\n'
    ctx = {"root": root, "boot_config": {"bootloader": "grub", "dropin_slurp": slurp(dropin)}}
    facts = gather(root)
    facts["kernel_log"] = {"available": True, "counts": {"aer": 2}}
    res = v.evaluate_host(facts, {"cpufreq": {"driver": "amd-pstate", "amd_pstate_mode": "active"}}, ctx,
                          fail_on_pending=True, gate="runtime")
    assert res["needs_reboot"] == ["cpufreq driver: amd-pstate (active) wanted, acpi-cpufreq runs "
                                   "(configured, a reboot applies it)"]
    assert len(res["failures"]) == 2 and "pending a reboot" in res["failures"][1]
    # Waiting for a reboot is not the runtime flow's to fail; new kernel errors are.
    assert res["gate"]["failures"] == [res["failures"][0]] and res["failures"][0].startswith("kernel log: 2 aer")
    with pytest.raises(v.VerificationError, match="gate must be one of: full, runtime"):
        v.evaluate_host(facts, {}, gate="canary")
    assert v.error_result("h", "boom", gate="runtime")["gate"] == {
        "name": "runtime", "status": "error", "ok": False, "failures": ["verification could not run: boom"]}


# --- JUnit classification (rendered as is by verify_junit.xml.j2) ----------------------------------


def test_junit_classification_is_computed_in_python(build_node):
    root = build_node("audited-epyc-8gpu")
    dropin = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active"\n'
    ctx = {"root": root, "boot_config": {"bootloader": "grub", "dropin_slurp": slurp(dropin)}}
    res = v.evaluate_host(gather(root), DESIRED, ctx, host="n1")
    cases = {c["name"]: c for c in res["junit"]["cases"]}
    assert cases["cpufreq.driver"]["kind"] == "pass" and cases["cpufreq.driver"]["type"] == "pending_reboot"
    assert cases["pcie_mrrs.0000:41:00.0"]["kind"] == "failure"
    assert cases["pcie_mrrs.0000:41:00.0"]["classname"] == "n1.pcie_mrrs"
    assert cases["pcie_mrrs.0000:41:00.0"]["detail"].startswith("desired: 4096\nrunning: 512\npersisted: null")
    assert cases["kmod.nvidia_peermem"]["kind"] == "skipped"
    assert cases["kernel_log.aer"] == {"classname": "n1.kernel_log", "name": "kernel_log.aer", "kind": "pass",
                                       "type": "kernel_log", "detail": "",
                                       "message": "0 new aer record(s) %s" % res["kernel_log"]["since_detail"]}
    # Xids are gpu_health's to judge (the role's default fail classes: aer, fallen_off_bus).
    assert "kernel_log.xid" not in cases
    kinds = [c["kind"] for c in res["junit"]["cases"]]
    assert res["junit"]["tests"] == len(res["settings"]) + 2
    assert (res["junit"]["failures"], res["junit"]["skipped"], res["junit"]["errors"]) == (
        kinds.count("failure"), kinds.count("skipped"), 0)
    assert res["pending"] == ["cpufreq.driver"]
    # With fail_on_pending the pending setting is a failure too.
    strict = v.evaluate_host(gather(root), DESIRED, ctx, host="n1", fail_on_pending=True)
    assert {c["name"]: c["kind"] for c in strict["junit"]["cases"]}["cpufreq.driver"] == "failure"
    # An unverifiable host: one erroring case.
    err = v.error_result("n2", "boom")
    assert err["junit"]["cases"] == [{"classname": "n2.verification", "name": "verification", "kind": "error",
                                      "type": "error", "message": "verification could not run: boom",
                                      "detail": "verification could not run: boom"}]
    assert (err["junit"]["tests"], err["junit"]["errors"], err["pending"]) == (1, 1, [])


def test_junit_kernel_log_unavailable_is_skipped():
    facts = {"kernel": {}, "kernel_log": {"available": False, "reason": "no /dev/kmsg"}}
    res = v.evaluate_host(facts, {}, {"root": "/x"}, gpu={"probe": "disabled"}, host="h")
    assert [(c["name"], c["kind"], c["message"]) for c in res["junit"]["cases"]] == [
        ("kernel_log.%s" % c, "skipped", "kernel log unavailable: no /dev/kmsg") for c in v.DEFAULT_FAIL_CLASSES]


def test_configured_arguments_from_text_read_on_the_node():
    text = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=disable"\n'
    assert v.configured_arguments({"bootloader": "grub", "dropin_text": text}) == (["amd_pstate=disable"], None)
    assert v.configured_arguments({"bootloader": "grub", "dropin_text": None}) == ([], None)
    args, why = v.configured_arguments({"bootloader": "grub", "dropin_text": None, "dropin_error": "EACCES"})
    assert args is None and "could not be read: EACCES" in why


def test_the_pci_functions_are_listed_once_for_the_node_and_every_family(build_node, monkeypatch):
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import pci

    root = build_node("audited-epyc-8gpu", cpus=4)
    real, calls = pci.list_devices, []
    monkeypatch.setattr(pci, "list_devices", lambda node: calls.append(node.root) or real(node))
    facts = gather(root)
    assert calls == [root]
    assert facts["pci"]["count"] == 8 and len(facts["pcie_acs"]["gpus"]) == 8 and len(facts["iommu"]["gpus"]) == 8
    assert len(facts["gpu_p2p"]["redirect"]) == 8
