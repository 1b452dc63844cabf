"""The tuning_info module (was tuning_facts) on simulated nodes: values equal what simnode wrote, nothing written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest
import simnode
from simnode import modparams as simnode_modparams

from ansible_collections.gpunode.tuning.plugins.module_utils.core import facts as node_facts
from ansible_collections.gpunode.tuning.plugins.module_utils.core import kernel_log
from ansible_collections.gpunode.tuning.plugins.module_utils.core.cpu import vendor_from_cpuinfo
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node

# The node's own sections and one per family that reads facts, under the family's name (memory and sysctl are
# tunables', modules kmod's, nvidia gpu_health's since 0.4; iommu and gpu_p2p read their own).
SECTIONS = ["cpu", "cpufreq", "cpuidle", "gpu_health", "gpu_locality", "gpu_p2p", "iommu", "kernel", "kernel_log",
            "kmod", "os", "pci", "pcie_acs", "pcie_aspm", "platform", "tunables"]
CPU = "sys/devices/system/cpu"


def facts_of(run_module, root, **args):
    result, failed = run_module("tuning_info", dict(root=root, **args))
    assert not failed, result.get("msg")
    assert result["changed"] is False
    return result["tuning_facts"]


def fail_msg(run_module, root, **args):
    result, failed = run_module("tuning_info", dict(root=root, **args))
    assert failed, "expected a failure"
    return result["msg"]


def write(root, rel, text):
    with open(os.path.join(root, rel), "w") as fh:
        fh.write(text + "\n")


# -- Every preset: the facts are what simnode wrote


@pytest.mark.parametrize("preset", sorted(simnode.PRESETS))
def test_every_preset_reads_back_what_simnode_wrote(build_node, run_module, digest, preset):  # noqa: PLR0915 (one assert per fact)
    root = build_node(preset)
    spec = simnode.PRESETS[preset]
    before = digest(root)
    f = facts_of(run_module, root, sysctls=["kernel.numa_balancing", "vm.swappiness"],
                 modules=list(spec["modules"]) + ["nvidia_peermem"])
    assert digest(root) == before
    assert sorted(f) == SECTIONS

    assert f["os"]["id"] == spec.get("os_id", "debian")
    assert f["os"]["version_id"] == spec.get("os_version", "12")
    assert f["kernel"]["cmdline"] == spec["cmdline"]
    assert f["kernel"]["cmdline_args"] == spec["cmdline"].split()
    assert f["kernel"]["release"] == spec["kmsg"][0][1].split()[2]
    assert f["kernel"]["lockdown"] == re.search(r"\[(\w+)\]", spec["lockdown"]).group(1)

    # arm64 cpuinfo has no vendor_id: the vendor is cpu_freq's, the CPU implementer.
    assert f["cpu"]["vendor"] == (spec["cpu_vendor"] if spec.get("arch", "x86_64") == "x86_64"
                                  else "arm64 (CPU implementer 0x41)")
    assert f["cpu"]["model"] == spec["cpu_model"]
    assert f["cpu"]["family"] == spec["cpu_family"]
    assert f["cpu"]["sockets"] == spec["sockets"]
    assert f["cpu"]["online_count"] == spec["cpus"]
    assert f["cpu"]["online"] == "0-%d" % (spec["cpus"] - 1)
    assert f["cpu"]["numa_nodes"] == spec["sockets"]

    idle = f["cpuidle"]
    assert idle["driver"] == spec["idle_driver"]
    assert idle["supported"] is bool(spec["idle_states"])
    assert list(idle["states"]) == [s.name for s in spec["idle_states"]]
    for s in spec["idle_states"]:
        st = idle["states"][s.name]
        assert (st["latency"], st["residency"]) == (s.latency, s.residency)
        assert (st["disabled_cpus"], st["disabled_cpulist"], st["enabled_cpus"]) == (0, "", spec["cpus"])
        assert "per_cpu" not in st

    freq = f["cpufreq"]
    assert freq["driver"] == spec["freq_driver"]
    assert freq["supported"] is bool(spec["freq_driver"])
    assert freq["governor"]["value"] == (spec["governor"] or None)
    assert freq["governor"]["cpus_differing"] == 0
    assert freq["epp"]["value"] == spec["epp"]
    assert freq["boost"] == (None if spec["boost"] is None else spec["boost"] == "1")
    assert freq["amd_pstate"] == {"present": bool(spec["amd_pstate_status"]), "status": spec["amd_pstate_status"]}
    if spec["intel_pstate"]:
        assert freq["intel_pstate"] == {"present": True, "status": spec["intel_pstate"][0],
                                        "no_turbo": spec["intel_pstate"][1] == "1"}
    else:
        assert freq["intel_pstate"] == {"present": False, "status": None, "no_turbo": None}

    assert f["tunables"]["numa_balancing"] == int(spec["numa_balancing"])
    assert f["tunables"]["thp"]["enabled"] == re.search(r"\[(\S+)\]", spec["thp_enabled"]).group(1)
    assert f["tunables"]["thp"]["defrag"] == re.search(r"\[(\S+)\]", spec["thp_defrag"]).group(1)
    assert f["tunables"]["sysctl"] == {"kernel.numa_balancing": spec["numa_balancing"], "vm.swappiness": "60"}

    gpus = f["pci"]["devices"]
    assert f["pci"]["count"] == spec["gpus"] == len(gpus)
    for dev in gpus:
        assert dev["vendor"] == "0x%04x" % spec.get("gpu_vendor", 0x10DE)
        assert dev["device"] == "0x%04x" % spec["gpu_device"]
        assert dev["class"] == "0x%06x" % spec["gpu_class"]
        assert (dev["mps"], dev["mrrs"]) == (spec.get("gpu_mps", 256), spec.get("gpu_mrrs", 512))
        assert (dev["link_speed"], dev["link_width"]) == ("32.0 GT/s", 16)
        assert (dev["link_speed_capable"], dev["link_width_capable"]) == ("32.0 GT/s", 16)
        assert dev["pcie"] is True and dev["port_type"] == "endpoint" and dev["error"] is None
    assert f["pci"]["pcie_bus_perf"] is ("pci=pcie_bus_perf" in spec["cmdline"])

    mods = f["kmod"]
    assert mods["loaded"] == sorted(spec["modules"])
    for name, params in spec["modules"].items():
        exported = dict(simnode_modparams.EXPORTED.get(name, {}), **params)  # what the driver exports (issue 44)
        assert mods["by_name"][name] == {"loaded": True, "builtin": False, "parameters": exported, "options": None}
    assert mods["by_name"]["nvidia_peermem"] == {"loaded": False, "builtin": False, "parameters": {},
                                                 "options": None}

    assert f["gpu_health"]["persistenced"] == {"running": spec.get("persistenced", True),
                                               "pids": [2187] if spec.get("persistenced", True) else []}

    log = f["kernel_log"]
    assert log["available"] is True and log["malformed"] == 0
    assert log["records_total"] == len(spec["kmsg"])
    assert log["records_selected"] == sum(1 for record in spec["kmsg"] if record[0] <= 4)
    assert log["trouble"] == 0
    assert log["last_time"] == round(len(spec["kmsg"]) * 0.137, 6)
    uptime = os.path.join(root, "proc/uptime")
    if os.path.exists(uptime):
        with open(uptime) as fh:
            assert f["kernel"]["uptime"] == float(fh.read().split()[0])
    else:
        assert f["kernel"]["uptime"] is None


def test_uptime_and_since_from_last_time(build_node, run_module):
    root = build_node("audited-epyc-8gpu")
    write(root, "proc/uptime", "5321.40 10400.11")
    before = facts_of(run_module, root)
    assert before["kernel"]["uptime"] == 5321.4
    with open(os.path.join(root, "dev/kmsg"), "a") as fh:
        fh.write("3,8,5400000000,-;nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)\n")
    after = facts_of(run_module, root, kmsg_since=before["kernel_log"]["last_time"] + 0.000001)["kernel_log"]
    assert after["records_selected"] == 1 and after["counts"]["module_failure"] == 1
    assert after["records"]["module_failure"][0]["module"] == "nvidia_peermem"
    assert after["last_time"] == 5400.0


def test_audited_node_values(build_node, run_module):
    """The audited node of knobs.md, spelled out: 8 GPUs at MRRS 512 / MPS 256, acpi-cpufreq, C2 on."""
    f = facts_of(run_module, build_node("audited-epyc-8gpu"), modules=["nvidia", "pcie_aspm"])
    devs = f["pci"]["devices"]
    assert [d["bdf"] for d in devs] == ["0000:%02x:00.0" % b for b in sorted(simnode.GPU_BUSES)]
    assert {(d["mrrs"], d["mps"], d["mps_supported"]) for d in devs} == {(512, 256, 512)}
    assert sorted({d["numa_node"] for d in devs}) == [0, 1]
    assert f["cpuidle"]["states"]["C2"]["latency"] == 400
    assert f["cpufreq"]["driver"] == "acpi-cpufreq"
    assert f["cpufreq"]["governor"] == {"value": "schedutil", "cpus_differing": 0, "cpulists": {"schedutil": "0-127"}}
    assert f["cpufreq"]["available_governors"][-1] == "schedutil"
    assert f["tunables"]["numa_balancing"] == 1
    assert f["kmod"]["by_name"]["nvidia"]["parameters"] == {"NVreg_EnableGpuFirmware": "1"}
    assert f["kmod"]["by_name"]["pcie_aspm"] == {"loaded": True, "builtin": True, "parameters": {
        "policy": "[default] performance powersave powersupersave"}, "options": None}  # tools/simnode/aspm.py
    log = f["kernel_log"]
    assert log["counts"] == {"aer": 0, "xid": 0, "fallen_off_bus": 0, "lockdown": 0, "module_failure": 0,
                             "noise": 2, "other": 1}
    assert [(r["rule"], "address" in r) for r in log["records"]["noise"]] == [(0, False), (0, False)]
    assert log["records"]["other"][0]["message"].startswith("ACPI: _OSC")


def test_pci_facts_match_real_lspci(build_node, run_module):
    """Cross-check MPS/MRRS with the real lspci reading the same config space (DevCtl line)."""
    lspci = shutil.which("lspci")
    if not lspci:
        pytest.skip("lspci (pciutils) is not installed")
    root = build_node("locked-bus-perf")
    f = facts_of(run_module, root, pci_selector={"class_prefixes": ["01", "02", "03", "04", "06"]})
    out = subprocess.run([lspci, "-O", "sysfs.path=%s" % os.path.join(root, "sys/bus/pci"), "-D", "-vvv"],
                         capture_output=True, text=True, check=True, env=dict(os.environ, LC_ALL="C")).stdout
    from_lspci = {}
    bdf = None
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", line)
        if m:
            bdf = m.group(1)
        m = re.search(r"MaxPayload (\d+) bytes, MaxReadReq (\d+) bytes", line)
        if m:
            from_lspci[bdf] = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"LnkSta:\s+Speed ([\d.]+)GT/s.*Width x(\d+)", line)
        if m:
            from_lspci[bdf] += (float(m.group(1)), int(m.group(2)))
    ours = {d["bdf"]: (d["mps"], d["mrrs"], float(d["link_speed"].split()[0]), d["link_width"])
            for d in f["pci"]["devices"]}
    assert len(ours) >= 6
    assert ours == from_lspci
    assert ours["0000:41:00.0"][:2] == (256, 256)  # pci=pcie_bus_perf clamped MRRS to MPS
    assert f["pci"]["pcie_bus_perf"] is True


def test_check_mode_same_result_and_tree_untouched(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu")
    before = digest(root)
    args = dict(root=root, sysctls=["vm.swappiness"], modules=["nvidia"], detail=True,
                kmsg_levels=["err", "warn", "notice", "info"])
    normal, failed = run_module("tuning_info", args)
    checked, failed_check = run_module("tuning_info", args, check=True, diff=True)
    assert not failed and not failed_check
    assert normal == checked
    assert "diff" not in checked
    assert digest(root) == before


# -- Aggregation over CPUs


def test_cpuidle_disabled_counts_and_cpulists(build_node, run_module):
    root = build_node("xeon-4gpu-switch", cpus=16)
    for cpu in list(range(4, 8)) + [15]:
        write(root, "%s/cpu%d/cpuidle/state3/disable" % (CPU, cpu), "1")  # C6
    f = facts_of(run_module, root)
    c6 = f["cpuidle"]["states"]["C6"]
    assert (c6["index"], c6["latency"]) == (3, 170)
    assert (c6["disabled_cpus"], c6["disabled_cpulist"], c6["enabled_cpus"]) == (5, "4-7,15", 11)
    assert f["cpuidle"]["states"]["C1E"]["disabled_cpus"] == 0
    assert list(f["cpuidle"]["states"]) == ["POLL", "C1", "C1E", "C6"]


def test_cpufreq_differing_cpus(build_node, run_module):
    root = build_node("epyc-pstate-epp", cpus=8)
    for cpu in (2, 3):
        write(root, "%s/cpufreq/policy%d/scaling_governor" % (CPU, cpu), "performance")
        write(root, "%s/cpufreq/policy%d/energy_performance_preference" % (CPU, cpu), "performance")
    write(root, "%s/cpufreq/policy7/energy_performance_preference" % CPU, "power")
    f = facts_of(run_module, root)["cpufreq"]
    assert f["driver"] == "amd-pstate-epp"
    assert f["governor"] == {"value": "powersave", "cpus_differing": 2,
                             "cpulists": {"powersave": "0-1,4-7", "performance": "2-3"}}
    assert f["epp"] == {"value": "balance_performance", "cpus_differing": 3,
                        "cpulists": {"balance_performance": "0-1,4-6", "performance": "2-3", "power": "7"}}
    assert f["available_epp"] == simnode.EPP_CHOICES.split()
    assert f["amd_pstate"] == {"present": True, "status": "active"}


def test_aggregate_tie_goes_to_lowest_cpu_and_missing_values():
    assert node_facts.aggregate({0: "a", 1: "b", 2: "b", 3: "a"}) == {
        "value": "a", "cpus_differing": 2, "cpulists": {"a": "0,3", "b": "1-2"}}
    assert node_facts.aggregate({0: None, 1: "x", 2: None}) == {"value": None, "cpus_differing": 1,
                                                                "cpulists": {"x": "1"}}
    assert node_facts.aggregate({}) == {"value": None, "cpus_differing": 0, "cpulists": {}}


def test_detail_adds_per_cpu_entries_only_when_asked(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    write(root, "%s/cpu1/cpuidle/state2/disable" % CPU, "1")
    plain = facts_of(run_module, root)
    assert "per_cpu" not in plain["cpufreq"]
    assert all("per_cpu" not in s for s in plain["cpuidle"]["states"].values())
    f = facts_of(run_module, root, detail=True)
    c2 = f["cpuidle"]["states"]["C2"]["per_cpu"]
    assert sorted(c2) == ["0", "1", "2", "3"]
    assert c2["1"] == {"disabled": True, "usage": 1000 + 7 + 2 * 131, "time": 500000 + 991 + 2 * 7919}
    assert c2["0"]["disabled"] is False
    assert f["cpufreq"]["per_cpu"]["3"] == {"governor": "schedutil", "epp": None}


def test_offline_cpus_are_left_out(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=8)
    write(root, "%s/online" % CPU, "0-5")
    f = facts_of(run_module, root)
    assert (f["cpu"]["online_count"], f["cpu"]["online"]) == (6, "0-5")
    assert f["cpuidle"]["states"]["C2"]["enabled_cpus"] == 6
    assert f["cpufreq"]["cpus_with_policy"] == 6


def test_tiny_vm_has_nothing_to_tune(build_node, run_module):
    f = facts_of(run_module, build_node("tiny-vm"))
    assert f["cpuidle"] == {"supported": False, "driver": None, "governor": None, "states": {}}
    assert f["cpufreq"]["supported"] is False and f["cpufreq"]["driver"] is None
    assert f["cpufreq"]["governor"] == {"value": None, "cpus_differing": 0, "cpulists": {}}
    assert f["pci"]["devices"] == [] and f["pci"]["count"] == 0
    assert f["gpu_health"] == {"persistenced": {"running": False, "pids": []}, "driver_version": None, "aer": None}
    assert f["platform"]["nvidia_driver"] == {"version": None, "flavor": None, "source": None}


# -- PCI selection


def test_pci_selector_variants(build_node, run_module):
    root = build_node("audited-epyc-8gpu")
    nic = facts_of(run_module, root, pci_selector={"vendor": "15b3"})["pci"]
    assert [(d["bdf"], d["class"], d["mrrs"]) for d in nic["devices"]] == [("0000:c2:00.0", "0x020000", 512)]
    assert nic["selector"] == "vendor 0x15b3"
    audio = facts_of(run_module, root, pci_selector={"vendor": "0x10de", "class_prefixes": ["0403"]})["pci"]
    assert [d["bdf"] for d in audio["devices"]] == ["0000:41:00.1"]
    ports = facts_of(run_module, root, pci_selector={"bdfs": ["40:01.1", "0000:99:00.0"]})["pci"]
    assert [(d["bdf"], d["port_type"]) for d in ports["devices"]] == [("0000:40:01.1", "root_port")]
    assert ports["missing_bdfs"] == ["0000:99:00.0"]


def test_unprivileged_config_read_is_reported(build_node, run_module):
    root = build_node("audited-epyc-8gpu", gpus=1)
    cfg = os.path.join(root, "sys/bus/pci/devices/0000:41:00.0/config")
    with open(cfg, "rb") as fh:
        head = fh.read(64)
    with open(cfg, "wb") as fh:
        fh.write(head)  # what a non-root reader gets from sysfs
    dev = facts_of(run_module, root)["pci"]["devices"][0]
    assert (dev["bdf"], dev["pcie"], dev["mrrs"], dev["mps"]) == ("0000:41:00.0", False, None, None)
    assert "only 64 bytes of config space" in dev["error"] and "root" in dev["error"]


def test_unreadable_config_does_not_hide_other_devices(build_node, run_module):
    root = build_node("audited-epyc-8gpu", gpus=2)
    cfg = os.path.join(root, "sys/bus/pci/devices/0000:41:00.0/config")
    os.remove(cfg)
    os.mkdir(cfg)  # reading it fails like a device removed mid-scan
    devs = facts_of(run_module, root)["pci"]["devices"]
    assert [(d["bdf"], d["mrrs"]) for d in devs] == [("0000:41:00.0", None), ("0000:61:00.0", 512)]
    assert devs[0]["error"].startswith("cannot read %s" % cfg)


# -- sysctls, modules, persistenced


def test_sysctls_whitespace_and_missing(build_node, run_module):
    root = build_node("tiny-vm")
    os.makedirs(os.path.join(root, "proc/sys/net/ipv4/conf/eth0.100"))
    write(root, "proc/sys/net/ipv4/conf/eth0.100/rp_filter", "2")
    f = facts_of(run_module, root, sysctls=["net.ipv4.tcp_rmem", "net.core.nope", "net.ipv4.conf.eth0/100.rp_filter"])
    assert f["tunables"]["sysctl"] == {"net.ipv4.tcp_rmem": "4096 131072 6291456", "net.core.nope": None,
                                       "net.ipv4.conf.eth0/100.rp_filter": "2"}


def test_builtin_and_absent_modules(build_node, run_module):
    root = build_node("tiny-vm")
    f = facts_of(run_module, root, modules=["processor", "nvidia", "virtio-net"])["kmod"]
    assert f["by_name"]["processor"] == {"loaded": True, "builtin": True, "parameters": {}, "options": None}
    assert f["by_name"]["nvidia"] == {"loaded": False, "builtin": False, "parameters": {}, "options": None}
    assert f["by_name"]["virtio-net"]["loaded"] is True  # '-' and '_' are the same module
    assert f["loaded"] == ["virtio_net"]


def test_persistenced_found_by_truncated_comm(build_node, run_module):
    """The kernel truncates comm to 15 characters: a real node shows nvidia-persiste."""
    root = build_node("tiny-vm")
    os.makedirs(os.path.join(root, "proc/4242"))
    write(root, "proc/4242/comm", "nvidia-persiste")
    os.makedirs(os.path.join(root, "proc/4243"))
    write(root, "proc/4243/comm", "nvidia-persistenced-helper")
    f = facts_of(run_module, root)
    assert f["gpu_health"]["persistenced"] == {"running": True, "pids": [4242]}


# -- Kernel log through the module


def test_kernel_log_levels_since_and_ignore(build_node, run_module):
    root = build_node("audited-epyc-8gpu")
    with open(os.path.join(root, "dev/kmsg"), "a") as fh:
        fh.write("3,8,9000000,-;NVRM: Xid (PCI:0000:41:00): 79, pid=2231, GPU has fallen off the bus.\n")
        fh.write("4,9,9100000,-;vxlan: non-ECT from 192.168.1.1 with TOS=0x2\n")
        fh.write("garbage line\n")
    all_levels = facts_of(run_module, root, kmsg_levels=["debug", "info", "notice", "warn", "err"])["kernel_log"]
    assert all_levels["records_selected"] == 10 and all_levels["malformed"] == 1
    assert all_levels["levels"] == ["err", "warn", "notice", "info", "debug"]

    since = facts_of(run_module, root, kmsg_since=9.0)["kernel_log"]
    assert since["records_selected"] == 2
    assert since["counts"]["xid"] == 1 and since["counts"]["noise"] == 1
    assert since["xid_codes"] == {"79": 1} and since["trouble"] == 1

    scoped = facts_of(run_module, root, kmsg_ignore=[{"pattern": "^vxlan: non-ECT", "cidr": "10.224.0.0/16"}])
    log = scoped["kernel_log"]
    assert log["counts"]["noise"] == 2 and log["counts"]["other"] == 2
    assert [r["address"] for r in log["records"]["noise"]] == ["10.224.3.17", "10.224.7.201"]
    assert log["records"]["other"][1]["message"] == "vxlan: non-ECT from 192.168.1.1 with TOS=0x2"

    nothing_ignored = facts_of(run_module, root, kmsg_ignore=[])["kernel_log"]
    assert nothing_ignored["counts"]["noise"] == 0 and nothing_ignored["counts"]["other"] == 4


def test_kernel_log_unavailable_is_not_fatal(build_node, run_module):
    root = build_node("tiny-vm")
    os.remove(os.path.join(root, "dev/kmsg"))
    f = facts_of(run_module, root)
    assert f["kernel_log"]["available"] is False
    assert f["kernel_log"]["reason"].startswith("cannot read %s" % os.path.join(root, "dev/kmsg"))
    assert f["cpu"]["online_count"] == 2  # the other sections are still there


# -- Bad input fails before reading, with the allowed values in the message


@pytest.mark.parametrize("args, fragments", [
    (dict(kmsg_levels=["err", "warning"]), ["kmsg_levels", "emerg, alert, crit, err, warn, notice, info, debug"]),
    (dict(kmsg_since=-1.5), ["kmsg_since must be >= 0"]),
    (dict(kmsg_ignore=[{"pattern": "vxlan: ("}]), ["kmsg_ignore[0].pattern", "not a valid regular expression"]),
    (dict(kmsg_ignore=[{"pattern": "vxlan", "cidr": "10.224.0.0/40"}]), ["kmsg_ignore[0].cidr", "CIDR notation"]),
    (dict(kmsg_ignore=[{"pattern": "vxlan", "net": "10.0.0.0/8"}]), ["net", "cidr, pattern"]),
    (dict(kmsg_ignore=[{"cidr": "10.0.0.0/8"}]), ["pattern"]),
    (dict(pci_selector={"vendor": "10de", "klass": "03"}), ["klass", "bdfs, class_prefixes, device, vendor"]),
    (dict(pci_selector={"vendor": "nvidia"}), ["pci_selector", "vendor must be a 4-digit hex PCI id"]),
    (dict(pci_selector={"class_prefixes": ["3"]}), ["pci_selector", "2, 4 or 6 hex digits"]),
    (dict(pci_selector={"bdfs": ["41:00"]}), ["pci_selector", "DDDD:BB:DD.F"]),
    (dict(sysctls=["vm/swappiness"]), ["sysctls", "dotted names"]),
    (dict(sysctls=["../../etc.passwd"]), ["sysctls", "dotted names"]),
    (dict(sysctls=["kernel.//.//.osrelease"]), ["sysctls", "dotted names"]),
    (dict(modules=["nvidia peermem"]), ["modules", "letters, digits"]),
    (dict(detail="maybe"), ["detail"]),
])
def test_bad_input_fails_naming_allowed_values(build_node, run_module, args, fragments):
    msg = fail_msg(run_module, build_node("tiny-vm"), **args)
    for fragment in fragments:
        assert fragment in msg


def test_cidr_rule_without_netaddr_names_the_library(build_node, run_module, monkeypatch):
    monkeypatch.setattr(kernel_log, "HAS_NETADDR", False)
    msg = fail_msg(run_module, build_node("tiny-vm"), kmsg_ignore=[{"pattern": "vxlan", "cidr": "10.0.0.0/8"}])
    assert "netaddr" in msg
    # Rules without a cidr do not need it.
    assert facts_of(run_module, build_node("tiny-vm"), kmsg_ignore=[{"pattern": "vxlan"}])["kernel_log"]["available"]


# -- Cost: a 384-CPU, 16-GPU node with a 100000-record kernel log


def test_large_node_is_cheap(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=384, gpus=16, kmsg_records=100000)
    run_module("tuning_info", dict(root=root))  # warm the page cache and imports
    start = time.perf_counter()
    f = facts_of(run_module, root, sysctls=["vm.swappiness"], modules=["nvidia"])
    elapsed = time.perf_counter() - start
    assert f["pci"]["count"] == 16 and f["cpu"]["online_count"] == 384
    assert len(f["cpuidle"]["states"]) == 3 and "per_cpu" not in f["cpuidle"]["states"]["C2"]
    assert f["kernel_log"]["records_total"] == 100008
    assert f["kernel_log"]["counts"]["noise"] == 2002
    assert all(len(v) <= 5 for v in f["kernel_log"]["records"].values())
    # The target is 0.5 s; the bound leaves room for a loaded CI machine.
    assert elapsed < 2.0, "tuning_info took %.2f s" % elapsed


# -- arm64: no vendor_id, no physical id in /proc/cpuinfo


def test_arm64_vendor_is_cpu_freqs_and_sockets_come_from_the_topology(build_node, run_module):
    root = build_node("grace-arm64-4gpu", cpus=8)
    with open(os.path.join(root, "proc/cpuinfo")) as fh:
        cpuinfo = fh.read()
    assert "vendor_id" not in cpuinfo and "physical id" not in cpuinfo
    # A two-socket Grace: CPUs 4-7 on package 1, as the kernel's topology shows it.
    for cpu in range(4, 8):
        write(root, CPU + "/cpu%d/topology/physical_package_id" % cpu, "1")
    f = facts_of(run_module, root)
    assert f["cpu"]["vendor"] == vendor_from_cpuinfo(cpuinfo.splitlines()) == "arm64 (CPU implementer 0x41)"
    assert f["cpu"]["sockets"] == 2
    # Offline CPUs do not count; a package the kernel does not know (-1) is no socket.
    write(root, CPU + "/online", "0-3")
    assert facts_of(run_module, root)["cpu"]["sockets"] == 1
    for cpu in range(8):
        write(root, CPU + "/cpu%d/topology/physical_package_id" % cpu, "-1")
    assert facts_of(run_module, root)["cpu"]["sockets"] == 1


def test_sockets_fall_back_to_cpuinfo_without_topology(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=8)
    for cpu in range(8):
        os.unlink(os.path.join(root, CPU, "cpu%d/topology/physical_package_id" % cpu))
    assert facts_of(run_module, root)["cpu"]["sockets"] == simnode.PRESETS["audited-epyc-8gpu"]["sockets"] == 2


# -- desired: the verification in the same call (module_utils/flows/verify.py)

DESIRED = {
    "pcie_mrrs": {"mrrs": 4096},
    "cpuidle": {"disable": [], "max_latency_us": 100, "cpus": ""},
    "cpufreq": {"driver": "native", "amd_pstate_mode": "active", "governor": "performance"},
    "numa_balancing": 0,
    "sysctl": {"vm.swappiness": 10, "kernel.numa_balancing": 0},
    "kmod": {"modules": [{"name": "nvidia_peermem", "params": {}, "required": False}]},
    "kernel_cmdline": ["iommu=pt"],
}
DROPIN = "etc/default/grub.d/60-gpunode-tuning.cfg"
MANAGED = "# Managed by gpunode.tuning (kernel_cmdline module). Do not edit: changes are overwritten.\n"


def verify_of(run_module, root, desired=None, check=False, **verify):
    desired = DESIRED if desired is None else desired
    args = dict(root=root, sysctls=["vm.swappiness", "kernel.numa_balancing"], modules=["nvidia_peermem"],
                desired=desired, verify=dict(verify, host="node1"))
    result, failed = run_module("tuning_info", args, check=check)
    assert not failed, result.get("msg")
    assert result["changed"] is False
    return result


def states(result):
    return {s["id"]: s["state"] for s in result["verification"]["settings"]}


def test_desired_verifies_in_the_same_call_as_the_filter_did(build_node, run_module, digest):
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification

    root = build_node("audited-epyc-8gpu")
    write(root, DROPIN, MANAGED + 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active iommu=pt"')
    before = digest(root)
    result = verify_of(run_module, root)
    res = result["verification"]
    # What the role computed before from its slurps, find and the verify_host filter.
    dropin = open(os.path.join(root, DROPIN)).read()
    context = {"root": root, "boot_config": {"bootloader": "grub", "dropin_text": dropin}}
    expected = verification.evaluate_host(result["tuning_facts"], DESIRED, context, host="node1",
                                          kernel_log_since=verification.kmsg_since())
    assert res == expected
    s = states(result)
    assert s["cpufreq.driver"] == "pending_reboot" and s["kernel_cmdline.iommu=pt"] == "pending_reboot"
    assert s["pcie_mrrs.0000:41:00.0"] == "drifted" and s["gpu_health.driver_count"] == "not_applicable"
    assert res["pending"] == ["cpufreq.driver", "kernel_cmdline.iommu=pt"]
    assert res["status"] == "fail" and res["ok"] is False and res["gate"]["name"] == "full"
    assert res["junit"]["tests"] == len(res["settings"]) + 2  # + aer, fallen_off_bus (Xids: gpu_health)
    assert digest(root) == before
    # Check mode reads the same and writes nothing either.
    assert verify_of(run_module, root, check=True)["verification"] == res
    assert digest(root) == before


def test_the_driver_arguments_are_looked_for_also_for_acpi_cpufreq(build_node, run_module):
    # Before, the role looked for no argument when acpi-cpufreq was wanted and did not read the drop-in.
    root = build_node("epyc-pstate-epp")
    desired = {"cpufreq": {"driver": "acpi-cpufreq", "amd_pstate_mode": "active", "governor": "performance"}}
    write(root, DROPIN, MANAGED + 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=disable"')
    row = next(s for s in verify_of(run_module, root, desired)["verification"]["settings"] if s["name"] == "driver")
    assert "could not be read" not in row["reason"]
    assert row["state"] == "pending_reboot", row


def test_the_kernel_log_counts_from_the_journal_marker_of_this_boot(build_node, run_module):
    root = build_node("audited-epyc-8gpu")
    boot_id = open(os.path.join(root, "proc/sys/kernel/random/boot_id")).read().strip()
    journal = os.path.join(root, "var/lib/gpunode-tuning/journal.json")
    os.makedirs(os.path.dirname(journal), exist_ok=True)
    marker = {"boot_id": boot_id, "uptime": 123.5, "time": "2026-01-01T00:00:00Z", "family": "cpufreq"}
    with open(journal, "w") as fh:
        fh.write('{"version": 1, "families": {}, "last_applied": %s}' % json.dumps(marker))
    klog = verify_of(run_module, root, {"numa_balancing": 0})["verification"]["kernel_log"]
    assert (klog["since"], klog["since_source"]) == (123.5, "journal")
    # An earlier boot's marker counts from boot; an override wins over both.
    marker["boot_id"] = "another-boot"
    with open(journal, "w") as fh:
        fh.write('{"version": 1, "families": {}, "last_applied": %s}' % json.dumps(marker))
    assert verify_of(run_module, root, {"numa_balancing": 0})["verification"]["kernel_log"]["since_source"] == "boot"
    klog = verify_of(run_module, root, {"numa_balancing": 0}, kmsg_since=7.0)["verification"]["kernel_log"]
    assert (klog["since"], klog["since_source"]) == (7.0, "override")


def test_persisted_files_and_an_unreadable_input(build_node, run_module):
    root = build_node("audited-epyc-8gpu")
    os.makedirs(os.path.join(root, "etc/modules-load.d"), exist_ok=True)
    write(root, "etc/modules-load.d/gpunode-tuning-nvidia_peermem.conf", "nvidia_peermem")
    write(root, "etc/sysctl.d/90-gpunode-tuning.conf", "vm.swappiness = 10")
    wants = os.path.join(root, "etc/systemd/system/multi-user.target.wants")
    os.makedirs(wants, exist_ok=True)
    os.symlink("/etc/systemd/system/gpunode-tuning-boot.service", os.path.join(wants, "gpunode-tuning-boot.service"))
    res = verify_of(run_module, root)["verification"]
    rows = {s["id"]: s for s in res["settings"]}
    assert rows["kmod.nvidia_peermem"]["persisted"] == "loaded at boot"
    assert rows["sysctl.vm.swappiness"]["persisted"] == "10"
    assert res["node"]["boot_unit"] is True and rows["cpuidle.C2"]["persisted"] == "disabled"
    # A journal that cannot be read fails the call, naming it; a missing one is no error.
    os.makedirs(os.path.join(root, "var/lib/gpunode-tuning/journal.json"))
    result, failed = run_module("tuning_info", dict(root=root, desired=DESIRED))
    assert failed and "cannot read %s/var/lib/gpunode-tuning/journal.json" % root in result["msg"]
    assert "verification" not in result


class LiveNode(Node):
    """A simulated node that claims to be the running system, so that grubby and nvidia-smi are asked."""

    is_live = property(lambda self: True)


def test_grubby_and_nvidia_smi_on_a_live_node(build_node):
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify as verify_node

    root = build_node("xeon-4gpu-switch", cpus=4, gpus=2)
    write(root, "etc/os-release", 'ID="rocky"\nID_LIKE="rhel centos fedora"')
    calls = []

    def run(argv):
        calls.append(argv)
        if argv[0] == "/usr/sbin/grubby":
            return 0, 'index=0\nargs="ro intel_pstate=active"\n', ""
        if argv[1:] == ["--help-query-gpu"]:
            return 0, '"index"\n"pci.bus_id"\n"persistence_mode"\n', ""
        # exit 2 (not 9, which means the driver is down and stops the probe): the answer is kept.
        return (0, "0, 00000000:41:00.0, Enabled\n", "") if "--format=csv,noheader" in argv else (2, "", "no")

    tools = verify_node.Tools(lambda name, package: "/usr/sbin/" + name, run)
    node = LiveNode(root)
    opts = dict(verify_node.VERIFY_DEFAULTS)
    cmdline = verify_node.boot_configuration(node, {"cpufreq": {"driver": "native"}}, opts, tools)
    assert cmdline["bootloader"] == "grubby" and cmdline["grubby"]["rc"] == 0
    assert calls == [["/usr/sbin/grubby", "--info=DEFAULT"]]
    gpu = verify_node.gpu_probe(node, opts, tools, vendors={"nvidia"})  # an NVIDIA node: amd-smi is not asked
    assert gpu["probe"] == "present" and gpu["query"]["rc"] == 0 and gpu["p2p_read"]["rc"] == 2
    # The field list first, then the health query of the fields it names, then each GPU command once.
    assert calls[1][1:] == ["--help-query-gpu"] and calls[2][1].startswith("--query-gpu=index,pci.bus_id")
    # The commands the GPU families ask for (Family.gpu_commands), in the order of the former GPU section.
    expected = [["--query-gpu=index,pci.bus_id,persistence_mode", "--format=csv,noheader"], ["topo", "-m"],
                ["topo", "-p2p", "r"], ["topo", "-p2p", "w"], ["topo", "-p2p", "n"]]
    assert [c[1:] for c in calls[3:]] == expected
    assert [list(c.args) for c in verify_node.gpu_commands({}) if not c.fields and not c.vendor] == expected
    # Without grubby the configuration is unknown, with the reason; without nvidia-smi the GPUs are absent.
    none = verify_node.Tools(lambda name, package: None, run)
    config = verify_node.boot_configuration(node, {"kernel_cmdline": ["x=1"]}, opts, none)
    assert "grubby not found" in config["grubby"]["stderr"]
    assert verify_node.gpu_probe(node, opts, none, vendors={"nvidia"}) == {"probe": "absent"}
    assert verify_node.gpu_probe(node, dict(opts, gpu=False), tools) == {"probe": "disabled"}
