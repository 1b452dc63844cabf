"""gpu_health: the read-only GPU health family (link, count, nvidia-smi fields, Xid, DCGM) and simnode's GPU faults."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import simnode

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, family, nvidia_smi
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_health, gpu_health_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verify import gather


def _tools(root, timeouts=None):
    """verify.Tools as tuning_info builds them for a simulated node: only commands the node ships, bounded."""
    def find(name, _package):
        path = os.path.join(root, "usr/bin", name)
        return path if os.access(path, os.X_OK) else None

    return verify.Tools(find, command.runner(timeouts))


def _evaluate(root, desired=None):
    """gather + gpu_probe (the node-local nvidia-smi) + evaluate: {row name: row}."""
    facts = gather(Node(root))
    desired = desired or {"gpu_health": {}}
    facts["gpu_probe"] = verify.gpu_probe(Node(root), dict(verify.VERIFY_DEFAULTS), _tools(root), desired)
    return {r["name"]: r for r in gpu_health_verify.evaluate(facts, desired, None)}


def test_x8_link_and_xid79_fail_naming_the_gpu(build_node):
    root = build_node(cpus=4, gpu_faults={"x8": [0], "xid79": [0]})
    rows = _evaluate(root)
    width = rows["link_width"]
    assert width["state"] == "drifted"
    assert "0000:41:00.0 link x8 of x16" in width["reason"]
    xid = rows["xid"]
    assert xid["state"] == "drifted"
    assert "Xid 79 GPU has fallen off the bus (1x on 0000:41:00.0)" in xid["reason"]


def test_healthy_node_has_no_finding(build_node):
    root = build_node(cpus=4, nvidia_smi=True)
    rows = _evaluate(root, {"gpu_health": {"gpu_count": 8}})
    assert {n: r["state"] for n, r in rows.items()} == dict.fromkeys(
        ["link_width", "link_speed", "responding", "gpu_count", "ecc_mode", "ecc_uncorrected", "memory_remap",
         "power_limit", "clocks_event", "driver_version", "xid", "aer_fatal", "aer_nonfatal", "aer_correctable",
         "driver_count", "driver_fitness"], "applied")
    assert rows["driver_count"]["reason"] == "8 GPUs visible to the driver"  # verification's former gpu.count
    assert rows["gpu_count"]["running"] == "8 on the PCI bus, 8 listed by nvidia-smi"
    assert rows["driver_version"]["running"] == "580.65.06"
    assert rows["clocks_event"]["reason"] == "reported: GPU idle on all 8 GPUs"


def test_simulated_node_without_nvidia_smi_judges_link_and_xid_only(build_node):
    root = build_node(cpus=4)
    rows = _evaluate(root)
    assert sorted(rows) == ["aer_correctable", "aer_fatal", "aer_nonfatal", "driver_count", "link_speed",
                            "link_width", "responding", "xid"]
    assert rows["link_width"]["state"] == "applied"
    assert rows["driver_count"]["state"] == "not_applicable" and "nvidia-smi is not run" in rows["driver_count"][
        "reason"]


def test_expected_count_and_gpu_the_driver_does_not_list(build_node):
    root = build_node(cpus=4, gpu_faults={"driver_missing": [7]})
    count = _evaluate(root, {"gpu_health": {"gpu_count": 9}})["gpu_count"]
    assert count["state"] == "drifted"
    assert "8 of 9 expected GPUs on the PCI bus" in count["reason"]
    assert "not listed by the driver (nvidia-smi): 0000:21:00.0" in count["reason"]


def test_row_remap_pending_is_pending_reboot(build_node):
    root = build_node(cpus=4, gpu_faults={"row_remap_pending": [1]})
    remap = _evaluate(root)["memory_remap"]
    assert remap["state"] == "pending_reboot"
    assert "0000:61:00.0 row remap pending" in remap["reason"]


def _smi_table(root, **changes):
    """Edit the nvidia-smi stand-in's table: changes = {"gN": {field: value}} (N: nvidia-smi's index, bus order)."""
    path = os.path.join(root, simnode.SMI_STATE)
    with open(path) as fh:
        table = json.load(fh)
    for index, fields in changes.items():
        table["gpus"][int(index[1:])].update(fields)
    with open(path, "w") as fh:
        json.dump(table, fh)


def test_nvidia_smi_fields_and_their_severities(build_node):
    root = build_node(cpus=4, nvidia_smi=True)
    _smi_table(root, g0={"ecc.mode.pending": "Disabled", "ecc.errors.uncorrected.aggregate.total": "2"},
               g1={"ecc.errors.uncorrected.volatile.total": "3", "remapped_rows.failure": "Yes"},
               g2={"power.limit": "450.00", "clocks_event_reasons.active": "0x0000000000000048"},
               g3={"driver_version": "575.51.03"})
    rows = _evaluate(root)
    assert rows["ecc_mode"]["state"] == "pending_reboot" and "0000:01:00.0 ECC Enabled, Disabled pending" in \
        rows["ecc_mode"]["reason"]
    assert rows["ecc_uncorrected"]["state"] == "drifted"
    assert "0000:21:00.0 3 uncorrectable ECC error(s) since the driver loaded" in rows["ecc_uncorrected"]["reason"]
    assert "0000:01:00.0 2 uncorrectable ECC error(s) in its lifetime" in rows["ecc_uncorrected"]["reason"]
    assert rows["memory_remap"]["state"] == "drifted" and "0000:21:00.0 row remapping failed" in \
        rows["memory_remap"]["reason"]
    assert rows["power_limit"]["state"] == "applied"
    assert "0000:41:00.0 450.00 W of default 600.00 W" in rows["power_limit"]["reason"]
    assert rows["clocks_event"]["state"] == "drifted"
    assert "0000:41:00.0 HW slowdown, HW thermal slowdown" in rows["clocks_event"]["reason"]
    assert rows["driver_version"]["state"] == "drifted" and "kernel module 580.65.06" in \
        rows["driver_version"]["reason"]


def test_aggregate_ecc_only_is_reported():
    gpus = nvidia_smi.parse_health("0, 00000000:41:00.0, Enabled, Enabled, Enabled, 0, 5, No, No, No, 600.00, "
                                   "600.00, 600.00, 0x0000000000000000, 0, 570.124.06")
    assert gpus[0]["bdf"] == "0000:41:00.0"
    unc = gpu_health_verify.ecc_rows(gpus)[1]
    assert unc["state"] == "applied" and unc["reason"].startswith("reported: 0000:41:00.0 5 uncorrectable")


def _facts_with_link(speed, cap="32.0 GT/s", width=16):
    return {"pci": {"devices": [{"bdf": "0000:41:00.0", "vendor": "0x10de", "class": "0x030200", "pcie": True,
                                 "link_speed": speed, "link_speed_capable": cap, "link_width": width,
                                 "link_width_capable": 16}]},
            "kernel_log": {"available": True, "xid_codes": {}}}


def test_link_speed_below_capability_is_informational_unless_busy():
    idle = {r["name"]: r for r in gpu_health_verify.link_rows(_facts_with_link("16.0 GT/s"), {"0000:41:00.0": 0})}
    assert idle["link_speed"]["state"] == "applied"
    assert idle["link_speed"]["reason"].startswith("informational: 0000:41:00.0 link 16.0 GT/s of 32.0 GT/s")
    assert "idle GPUs lower their link speed" in idle["link_speed"]["reason"]
    busy = {r["name"]: r for r in gpu_health_verify.link_rows(_facts_with_link("16.0 GT/s"), {"0000:41:00.0": 95})}
    assert busy["link_speed"]["state"] == "drifted" and "95% busy" in busy["link_speed"]["reason"]


def test_other_xids_are_reported_serious_ones_fail():
    facts = _facts_with_link("32.0 GT/s")
    facts["kernel_log"] = {"available": True, "xid_codes": {"13": 2},
                           "records": {"xid": [{"device": "0000:41:00", "code": 13}]}}
    row = gpu_health_verify.xid_row(facts)
    assert row["state"] == "applied" and row["reason"] == "reported: Xid 13 (2x on 0000:41:00.0)"
    facts["kernel_log"]["xid_codes"]["94"] = 1
    assert gpu_health_verify.xid_row(facts)["state"] == "drifted"
    facts["kernel_log"] = {"available": False, "reason": "permission denied"}
    assert gpu_health_verify.xid_row(facts)["state"] == "unsupported"


def test_dcgm_diag_when_asked(build_node, real, tmp_path):
    root = build_node(cpus=4, nvidia_smi=True)
    # No dcgmi on the node: unsupported, with what to install.
    rows = _evaluate(root, {"gpu_health": {"dcgm_diag": True}})
    assert rows["dcgm_diag"]["state"] == "unsupported" and "datacenter-gpu-manager" in rows["dcgm_diag"]["reason"]
    # A dcgmi that prints what DCGM 4.2.3 printed on a node whose pcie test failed, and exits as dcgmi does.
    answer = tmp_path / "diag.txt"
    answer.write_text(real("dcgmi-diag-4.2.3-fail-pcie-4gpu-dcgm-253.txt").text)
    dcgmi = os.path.join(root, "usr/bin/dcgmi")
    with open(dcgmi, "w") as fh:
        fh.write("#!/bin/sh\ncat '%s'\nexit 226\n" % answer)
    os.chmod(dcgmi, 0o755)
    row = _evaluate(root, {"gpu_health": {"dcgm_diag": True}})["dcgm_diag"]
    assert row["state"] == "drifted"
    assert "(DCGM 4.2.3) (rc 226): pcie: Fail: There was an internal error" in row["reason"]
    assert "dcgm_diag" not in _evaluate(root)


def test_nvidia_smi_failing_query_is_unsupported_not_a_crash():
    facts = _facts_with_link("32.0 GT/s")
    stderr = 'Field "clocks_event_reasons.active" is not a valid field to query.'
    facts["gpu_probe"] = {"probe": "present", "health": {"rc": 2, "stdout": "", "stderr": stderr}}
    rows = {r["name"]: r for r in gpu_health_verify.evaluate(facts, {"gpu_health": {}}, None)}
    assert rows["nvidia_smi"]["state"] == "unsupported" and "not a valid" in rows["nvidia_smi"]["reason"]
    assert rows["link_width"]["state"] == "applied"


@pytest.mark.parametrize("want, error", [
    ({"gpu_count": 0}, "gpu_count must be an integer >= 1"),
    ({"gpu_count": True}, "gpu_count must be an integer >= 1"),
    ({"dcgm_diag": "yes"}, "dcgm_diag must be true or false"),
    ({"gpus": 8}, "unknown key(s) gpus; allowed: gpu_count, dcgm_diag"),
])
def test_bad_desired_state_is_refused(want, error):
    with pytest.raises(family.EvaluationError, match=error.replace("(", r"\(").replace(")", r"\)")):
        gpu_health_verify.evaluate(_facts_with_link("32.0 GT/s"), {"gpu_health": want}, None)


def test_simnode_stand_in_writes_its_own_state(build_node):
    root = build_node(cpus=4, nvidia_smi=True)
    smi = os.path.join(root, "usr/bin/nvidia-smi")
    out = subprocess.run([smi, "-i", "2", "-pl", "450"], capture_output=True, text=True, check=True).stdout
    assert "was set to 450.00 W from 600.00 W" in out
    subprocess.run([smi, "-pm", "0"], capture_output=True, text=True, check=True)
    query = subprocess.run([smi, "--query-gpu=index,power.limit,persistence_mode", "--format=csv,noheader"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert query[2] == "2, 450.00 W, Disabled" and query[0] == "0, 600.00 W, Disabled"
    bad = subprocess.run([smi, "-pl", "9999"], capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "between 150.00 W and 600.00 W" in bad.stderr


def test_simnode_refuses_unknown_faults_before_writing(tmp_path):
    with pytest.raises(ValueError, match="unknown GPU fault"):
        simnode.build(str(tmp_path / "n"), "audited-epyc-8gpu", gpu_faults={"melted": [0]})
    with pytest.raises(ValueError, match=r"GPU index 8 is not one of 0\.\.7"):
        simnode.build(str(tmp_path / "n"), "audited-epyc-8gpu", gpu_faults={"x8": [8]})
    assert not (tmp_path / "n").exists()


def test_health_findings_for_a_rollout_gate():
    rows = [family.setting("gpu_health", "link_width", "x16", "x8", "drifted", "0000:41:00.0 link x8 of x16"),
            family.setting("gpu_health", "memory_remap", "none", "pending", "pending_reboot", "0000:61:00.0 row remap"),
            family.setting("gpu_health", "xid", "none", "none", "applied"),
            family.setting("cpufreq", "governor", "performance", "schedutil", "drifted", "not ours")]
    assert gpu_health.health_findings({"settings": rows}) == [
        "gpu_health.link_width: 0000:41:00.0 link x8 of x16", "gpu_health.memory_remap: 0000:61:00.0 row remap"]
    assert gpu_health.health_findings({"settings": rows[2:]}) == []
    with pytest.raises(family.EvaluationError, match="expected a verification result"):
        gpu_health.health_findings(None)


def test_gpus_without_ecc_are_not_applicable():
    gpus = nvidia_smi.parse_health("0, 00000000:41:00.0, Enabled, [N/A], [N/A], [N/A], [N/A], [N/A], No, No, "
                                   "450.00, 450.00, 450.00, 0x0000000000000000, 0, 570.124.06")
    assert [r["state"] for r in gpu_health_verify.ecc_rows(gpus)] == ["not_applicable", "not_applicable"]
