"""The playbooks on simulated AMD Instinct MI300X nodes (issue 32): verify, the health gate, tuning and rollback.

tools/simnode's ``mi300x-epyc-8gpu`` (2 sockets, 8 MI300X on XGMI) with its amd-smi stand-in, answering in
the shapes of the real captures (tests/data/real/amd-smi-*). One verify run over a healthy node and one node
per GPU fault or misbehaving amd-smi; one node tuned runtime and persistent with ``inference-throughput`` and
rolled back. The hanging amd-smi is bounded by a small ``gpunode_tuning_command_timeouts.amd_smi``.
"""

from __future__ import annotations

import json
import os
import re

import simnode
from support.inventory import write_inventory
from support.playbooks import assert_ok, by_host, rollout, run_playbook
from support.trees import snapshot, tree_changes, tree_digest

PRESET = "mi300x-epyc-8gpu"
PRESET_VARS = ("-e", "gpunode_tuning_preset=inference-throughput")
SICK = 3  # the GPU index (bus order) of each fault: 0000:65:00.0
TIMEOUTS = json.dumps({"gpunode_tuning_command_timeouts": {"amd_smi": 2}})
# Node name -> (simnode.build keyword arguments, the failing gpu_health row, words its reason must hold).
NODES = {
    "healthy": ({"amd_smi": True}, None, None),
    # Healthy, with an amd-smi that answers xgmi -l with its own error document and exit 0 (issue 42).
    "oldsmi": ({"amd_smi_mode": "refuse_link_status"}, None, None),
    "ecc": ({"amd_faults": {"ecc_uncorrectable": [SICK]}}, "amd_ecc",
            "GPU 3 (0000:65:00.0): 2 uncorrectable ECC error(s) in UMC 2"),
    "badpages": ({"amd_faults": {"bad_pages": [SICK]}}, "amd_bad_pages",
                 "GPU 3 (0000:65:00.0): 655 retired page(s), RAS threshold 655 reached"),
    "x8": ({"amd_faults": {"x8": [SICK]}}, "amd_pcie_link", "GPU 3 (0000:65:00.0) link x8 of x16"),
    "xgmi": ({"amd_faults": {"xgmi_down": [SICK]}}, "amd_xgmi", "GPU 3 (0000:65:00.0): 1 XGMI link(s) down"),
    "nosmi": ({"amd_smi_mode": "absent"}, "amd_smi", "amd-smi not found on the node's PATH nor in /opt/rocm/bin"),
    "hang": ({"amd_smi_mode": "hang"}, "amd_smi", "amd-smi did not answer within 2 s: a wedged GPU or amdgpu driver"),
    "badjson": ({"amd_smi_mode": "invalid_json"}, "amd_smi", "amd-smi metric --json: amd-smi printed invalid JSON"),
}


def gpu_rows(report):
    return {s["name"]: s for s in report["settings"] if s["family"] == "gpu_health"}


def test_verify_reports_the_gpus_and_fails_each_sick_one_naming_gpu_and_check(tmp_path):
    roots = {name: str(tmp_path / "nodes" / name) for name in NODES}
    for name, (kwargs, _row, _words) in NODES.items():
        simnode.build(roots[name], PRESET, cpus=4, **kwargs)
    before = {name: tree_digest(root) for name, root in roots.items()}
    reports = tmp_path / "reports"
    inventory = write_inventory(str(tmp_path / "hosts.yml"), roots, report_dir=str(reports))
    proc = run_playbook("verify.yml", inventory, "-e", TIMEOUTS)
    assert proc.returncode != 0, proc.stdout[-3000:]
    load = {name: json.loads((reports / (name + ".json")).read_text()) for name in roots}

    healthy = gpu_rows(load["healthy"])
    assert {n: r["state"] for n, r in healthy.items() if n.startswith("amd_")} == dict.fromkeys(
        ("amd_smi", "amd_gpu_count", "amd_ecc", "amd_bad_pages", "amd_pcie_link", "amd_xgmi", "amd_kernel_log"),
        "applied")
    assert healthy["amd_gpu_count"]["running"] == "8 listed by amd-smi, 8 on the PCI bus"
    assert all(r["vendor"] == "amd" for n, r in healthy.items() if n.startswith("amd_"))
    assert not [s for s in load["healthy"]["settings"] if s["family"] == "gpu_health" and s["state"] == "drifted"]
    assert [d["bdf"] for d in load["healthy"]["node"].get("devices", [])] in ([], [
        "0000:%02x:00.0" % b for b in simnode.AMD_MI300X_BUSES])
    mrrs = [s["name"] for s in load["healthy"]["settings"] if s["family"] == "pcie_mrrs"]
    assert mrrs == ["0000:%02x:00.0" % b for b in simnode.AMD_MI300X_BUSES]  # the MI300X GPUs are selected

    for name, (_kwargs, row, words) in NODES.items():
        if row is None:
            continue
        rows = gpu_rows(load[name])
        assert rows[row]["state"] == "drifted", (name, rows[row])
        assert words in rows[row]["reason"], (name, rows[row]["reason"])
        assert load[name]["status"] == "fail", name
        assert re.search(r"gpu_health [^;]*\b%s\b" % row, " ".join(load[name]["failures"])), \
            (name, load[name]["failures"])
    for name in ("nosmi", "hang", "badjson"):  # unhealthy with the reason, never not applicable
        assert "8 AMD GPU(s) on the PCI bus are not checked by it" in gpu_rows(load[name])["amd_smi"]["reason"]
    assert "amd-smi did not answer within 2 s" in (reports / "hang.md").read_text()
    old = gpu_rows(load["oldsmi"])
    assert {n: r["state"] for n, r in old.items() if n.startswith("amd_")} == {
        n: r["state"] for n, r in healthy.items() if n.startswith("amd_")}
    assert old["amd_xgmi"]["reason"] == "56 XGMI link(s) up (amd-smi topology)"
    assert not [f for f in load["oldsmi"].get("failures") or [] if "gpu_health" in f], load["oldsmi"]["failures"]
    # P2P and locality of the AMD GPUs from the same amd-smi answers (core/amd_p2p.py).
    p2p = {s["name"]: s for s in load["healthy"]["settings"] if s["family"] == "gpu_p2p"}
    assert {n: (r["state"], r["vendor"]) for n, r in p2p.items()} == {
        "amd.pairs": ("applied", "amd"), "amd.xgmi_links": ("applied", "amd"),
        "amd.bar0": ("not_applicable", "amd")}  # every pair on XGMI: no peer access through BAR0 (issue 44)
    assert p2p["amd.pairs"]["running"] == "XGMI, 1 hop, weight 15 on all 28 pairs of 8 GPUs"
    sick = {s["name"]: s for s in load["xgmi"]["settings"] if s["family"] == "gpu_p2p" and s["state"] == "drifted"}
    assert set(sick) == {"amd.GPU3-GPU4", "amd.xgmi_links"}
    assert "GPU 3 (0000:65:00.0) and GPU 4 (0000:85:00.0)" in sick["amd.GPU3-GPU4"]["reason"]
    locality = {s["name"]: s for s in load["healthy"]["settings"] if s["family"] == "gpu_locality"}
    assert "GPU-to-GPU (amd-smi topology): XGMI, 1 hop, weight 15 to 7 GPUs" in locality["0000:65:00.0"]["reason"]
    assert "GPU-to-GPU links of the AMD GPUs" in (reports / "healthy.md").read_text()
    assert {name: tree_digest(root) for name, root in roots.items()} == before  # verify wrote nothing


def test_runtime_and_persistent_tuning_apply_and_roll_back_to_the_byte(tmp_path):
    root = str(tmp_path / "node")
    simnode.build(root, PRESET, cpus=8, amd_smi=True)
    inventory = write_inventory(str(tmp_path / "hosts.yml"), {"mi300x": root},
                                report_dir=str(tmp_path / "reports"))
    before = snapshot(root)

    runtime = run_playbook("tune.yml", inventory, "--tags", "runtime", *PRESET_VARS)
    assert_ok(runtime)
    assert '"pcie_mrrs": "8 set to 4096' in runtime.stdout, runtime.stdout[-3000:]
    assert "kernel.numa_balancing=0" in runtime.stdout
    with open(os.path.join(root, "proc/sys/kernel/numa_balancing"), encoding="utf-8") as fh:
        assert fh.read().strip() == "0"
    again = run_playbook("tune.yml", inventory, "--tags", "runtime", *PRESET_VARS)
    assert_ok(again)
    assert again.recap["mi300x"]["changed"] == 0, again.stdout[-4000:]

    persistent = run_playbook("tune.yml", inventory, "--tags", "persistent", *PRESET_VARS)
    assert_ok(persistent)
    assert os.path.isfile(os.path.join(root, "etc/sysctl.d/90-gpunode-tuning.conf"))

    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    left = tree_changes(before, snapshot(root))
    assert left == [], left


def test_a_mixed_fleet_rolls_out_with_one_inventory_and_the_sick_amd_host_is_not_tuned(tmp_path):
    roots = {name: str(tmp_path / "nodes" / name) for name in ("nvidia", "mi300x", "mi300x-ecc")}
    simnode.build(roots["nvidia"], "audited-epyc-8gpu", cpus=4, nvidia_smi=True)
    simnode.build(roots["mi300x"], PRESET, cpus=4, amd_smi=True)
    simnode.build(roots["mi300x-ecc"], PRESET, cpus=4, amd_faults={"ecc_uncorrectable": [SICK]})
    sick_before = tree_digest(roots["mi300x-ecc"])
    write_inventory(os.path.join(str(tmp_path), "hosts.yml"), roots, report_dir=os.path.join(str(tmp_path), "reports"))
    proc, summary, _reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_canary=0",
                                      "-e", "gpunode_tuning_rollout_batch=100%",
                                      "-e", "gpunode_tuning_rollout_max_fail_percentage=100", "-e", TIMEOUTS)
    assert proc.returncode != 0  # one host is unhealthy
    results = by_host(summary)
    assert {h: results[h]["status"] for h in roots} == {"nvidia": "done", "mi300x": "done",
                                                        "mi300x-ecc": "unhealthy"}, results
    assert any(f.startswith("gpu_health.amd_ecc: GPU 3 (0000:65:00.0): 2 uncorrectable ECC error(s)")
               for f in results["mi300x-ecc"]["findings"]), results["mi300x-ecc"]["findings"]
    assert tree_digest(roots["mi300x-ecc"]) == sick_before  # the sick host was not tuned
    fleet = (tmp_path / "reports" / "fleet-summary.md").read_text()
    assert "| nvidia |" in fleet and "| mi300x |" in fleet


def _amd_caps(root):
    with open(os.path.join(root, simnode.AMD_SMI_STATE), encoding="utf-8") as fh:
        static = json.loads(json.load(fh)["answers"]["static"])["gpu_data"]
    return {g["bus"]["bdf"]: g["limit"]["socket_power"]["value"] for g in static}


def test_the_amd_power_cap_applies_through_amd_smi_reruns_unchanged_and_rolls_back_to_the_byte(tmp_path):
    root = str(tmp_path / "node")
    simnode.build(root, PRESET, cpus=4, amd_smi=True)
    inventory = write_inventory(str(tmp_path / "hosts.yml"), {"mi300x": root},
                                report_dir=str(tmp_path / "reports"))
    before = snapshot(root)
    cap = ("-e", "gpunode_tuning_gpu_settings_power_limit=600")
    check = run_playbook("tune.yml", inventory, "--tags", "runtime", "--check", *cap)
    assert_ok(check)
    assert set(_amd_caps(root).values()) == {750}  # check mode wrote nothing
    runtime = run_playbook("tune.yml", inventory, "--tags", "runtime", *cap)
    assert_ok(runtime)
    assert set(_amd_caps(root).values()) == {600}, runtime.stdout[-3000:]
    again = run_playbook("tune.yml", inventory, "--tags", "runtime", *cap)
    assert_ok(again)
    assert again.recap["mi300x"]["changed"] == 0, again.stdout[-4000:]
    rollback = run_playbook("rollback.yml", inventory)
    assert_ok(rollback)
    left = tree_changes(before, snapshot(root))
    assert left == [], left


def test_the_post_reboot_gate_fails_an_mi300x_whose_boot_brings_a_gpu_fault_and_stops_later_reboots(tmp_path):
    """A persistent rollout with reboot_ok over three MI300X hosts that need a reboot (acpi-cpufreq to amd-pstate),
    budget 1: the canary is rebooted, passes its gate and returns; the next host's boot brings an uncorrectable
    ECC count on GPU 3 (simnode's boot faults): it fails its gate after the reboot naming the GPU and the check,
    stays drained with that reason, and the last host is not rebooted."""
    roots = {name: str(tmp_path / "nodes" / name) for name in ("m1", "m2", "m3")}
    for root in roots.values():
        simnode.build(root, PRESET, cpus=4, amd_smi=True)
    simnode.write_boot_faults(roots["m2"], {"ecc_uncorrectable": [SICK]})
    boot_ids = {h: open(os.path.join(r, "proc/sys/kernel/random/boot_id"), encoding="utf-8").read()
                for h, r in roots.items()}
    reports = tmp_path / "reports"
    write_inventory(os.path.join(str(tmp_path), "hosts.yml"), roots, report_dir=str(reports),
                    gpunode_tuning_reboot_ok=True, gpunode_tuning_drain="none",
                    gpunode_tuning_reboot_poll_interval=0.2, gpunode_tuning_reboot_wait_timeout=120)
    proc, summary, _reports = rollout(str(tmp_path), "-e", "gpunode_tuning_rollout_flow=persistent",
                                      "-e", "gpunode_tuning_rollout_canary=1",
                                      "-e", "gpunode_tuning_rollout_batch=100%",
                                      "-e", "gpunode_tuning_rollout_max_fail_percentage=100", *PRESET_VARS)
    assert proc.returncode != 0
    results = by_host(summary)

    def boot_id(host):
        with open(os.path.join(roots[host], "proc/sys/kernel/random/boot_id"), encoding="utf-8") as fh:
            return fh.read()

    healthy = results["m1"]
    assert healthy["status"] == "done" and healthy["verification"] == "pass", healthy
    assert healthy["reboot"]["rebooted"] and healthy["reboot"]["returned"], healthy["reboot"]
    assert boot_id("m1") != boot_ids["m1"]

    sick = results["m2"]
    assert boot_id("m2") != boot_ids["m2"]  # rebooted, and its boot brought the fault
    assert sick["status"] == "failed" and sick["reboot"]["stays_drained"] and sick["reboot"]["stage"] == "gate", sick
    words = "failed its gate after the reboot"
    assert words in sick["reboot"]["msg"] and re.search(r"gpu_health [^;]*\bamd_ecc\b", sick["reboot"]["msg"]), \
        sick["reboot"]["msg"]
    assert "gpu_health.amd_ecc: GPU 3 (0000:65:00.0): 2 uncorrectable ECC error(s)" in sick["reboot"]["msg"]
    assert "GPU 3 (0000:65:00.0): 2 uncorrectable ECC error(s)" in json.dumps(
        json.loads((reports / "m2.json").read_text())), "the host's report names the GPU"
    with open(reports / "reboots" / "m2.json", encoding="utf-8") as fh:
        record = json.load(fh)
    assert record["state"] == "failed" and record["stage"] == "gate" and "amd_ecc" in record["reason"], record
    assert summary["stopped"]["stays_drained"] == ["m2"]

    later = results["m3"]
    assert boot_id("m3") == boot_ids["m3"]  # not rebooted: the run's reboots stopped at m2
    assert later["status"] == "failed" and "not rebooted" in later["reboot"]["msg"], later
    assert "m2" in later["reboot"]["msg"]
