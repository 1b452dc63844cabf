"""Sick GPUs and drivers on simulated nodes (tools/simnode's stand-ins learn the real quirks).

An R470-era nvidia-smi (no clocks_event_reasons, no remapped_rows, refusing unknown fields on stdout
with exit 2), one that exits 9 ("couldn't communicate with the NVIDIA driver"), one that never answers,
one whose answer is a column short, a GPU whose config space reads all 0xff, an ANSI-underlined topo.
"""

from __future__ import annotations

import os
import subprocess

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import (
    gpu_health,
    gpu_health_verify,
    gpu_settings_verify,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_p2p as p2p
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verify import gather


def tools(root, timeouts=None, seen=None):
    """verify.Tools as tuning_info builds them on a simulated node, bounded, recording each command."""
    run = command.runner(timeouts)

    def find(name, _package):
        path = os.path.join(root, "usr/bin", name)
        return path if os.access(path, os.X_OK) else None

    def record(argv):
        if seen is not None:
            seen.append(argv[1:])
        return run(argv)
    return verify.Tools(find, record)


def probe_and_rows(root, desired=None, timeouts=None, seen=None):
    facts = gather(Node(root))
    desired = desired or {"gpu_health": {}}
    probe = verify.gpu_probe(Node(root), dict(verify.VERIFY_DEFAULTS), tools(root, timeouts, seen), desired)
    facts["gpu_probe"] = probe
    return facts, probe, {r["name"]: r for r in gpu_health_verify.evaluate(facts, desired, None)}


def test_an_r470_driver_costs_exactly_its_missing_fields(build_node):
    root = build_node(cpus=2, smi_driver="r470")
    smi = os.path.join(root, "usr/bin/nvidia-smi")
    refused = subprocess.run([smi, "--query-gpu=index,clocks_event_reasons.active", "--format=csv"],
                             capture_output=True, text=True, check=False)
    assert (refused.returncode, refused.stdout.strip(), refused.stderr) == (
        2, 'Field "clocks_event_reasons.active" is not a valid field to query.', "")
    facts, probe, rows = probe_and_rows(root)
    assert probe["health"]["missing"] == ["remapped_rows.pending", "remapped_rows.failure"]
    unsupported = sorted(n for n, r in rows.items() if r["state"] == "unsupported")
    assert unsupported == ["remapped_rows.failure", "remapped_rows.pending"]
    assert "driver (470.256.02) does not know the nvidia-smi field remapped_rows.pending" in \
        rows["remapped_rows.pending"]["reason"]
    for name in ("link_width", "ecc_mode", "ecc_uncorrected", "clocks_event", "xid", "gpu_count", "driver_version"):
        assert rows[name]["state"] == "applied", name
    assert rows["clocks_event"]["reason"] == "reported: GPU idle on all 8 GPUs"  # read by its old name
    settings = gpu_settings_verify.evaluate(facts, {}, None)
    assert {s["name"]: s["state"] for s in settings}["persistence_mode"] == "applied"
    assert rows["driver_count"]["state"] == "applied"


def test_an_exit_9_nvidia_smi_is_asked_once_and_the_host_is_unhealthy(build_node, run_module):
    root = build_node(cpus=2, smi_mode="exit9")
    seen = []
    facts, probe, rows = probe_and_rows(root, seen=seen)
    assert seen == [["--help-query-gpu"]]  # the driver is down: nothing more is asked
    assert probe["query"]["not_run"].startswith("nvidia-smi failed (rc 9): NVIDIA-SMI has failed")
    assert rows["nvidia_smi"]["state"] == "drifted" and "couldn't communicate" in rows["nvidia_smi"]["reason"]
    assert gpu_health.health_findings({"settings": list(rows.values())})[0].startswith("gpu_health.nvidia_smi: ")
    # The GPU list failed with the same nvidia-smi: not a second finding, named as that failure.
    assert rows["driver_count"]["state"] == "unsupported" and "see nvidia_smi" in rows["driver_count"]["reason"]
    assert len(gpu_health.health_findings({"settings": list(rows.values())})) == 1
    result, failed = run_module("gpu_settings", {"persistence": True, "root": root})
    assert failed and "GPU settings not read: nvidia-smi --query-gpu failed (rc 9): NVIDIA-SMI has failed" \
        in result["msg"]


def test_a_never_answering_nvidia_smi_costs_one_timeout_and_is_named(build_node, run_module):
    root = build_node(cpus=2, smi_mode="hang")
    seen = []
    _facts, probe, rows = probe_and_rows(root, timeouts={"nvidia_smi": 1}, seen=seen)
    assert seen == [["--help-query-gpu"]] and probe["health"]["timed_out"]
    assert rows["nvidia_smi"]["state"] == "drifted"
    assert rows["nvidia_smi"]["reason"] == "nvidia-smi did not answer within 1 s: a wedged GPU or driver; it was killed"
    assert p2p.evaluate({}, {"gpu_p2p": {}}, type("Ctx", (), {"gpu": probe})())[0]["state"] == "unsupported"
    result, failed = run_module("gpu_settings", {"power_limit": 450, "root": root,
                                                 "command_timeouts": {"nvidia_smi": 1}})
    assert failed and result["msg"] == (
        "GPU settings not read: nvidia-smi did not answer within 1 s: a wedged GPU or driver; it was killed")


def test_an_answer_a_column_short_is_unhealthy_and_gpu_settings_refuses_it(build_node, run_module):
    root = build_node(cpus=2, smi_mode="garbled")
    _facts, _probe, rows = probe_and_rows(root)
    assert rows["nvidia_smi"]["state"] == "drifted"
    assert "8 line(s) that do not match the query of 19 field(s)" in rows["nvidia_smi"]["reason"]
    result, failed = run_module("gpu_settings", {"persistence": True, "root": root})
    assert failed and "do not match the query of 11 field(s)" in result["msg"]


def test_a_gpu_reading_all_ff_fails_gpu_health_and_the_others_are_tuned(build_node, run_module):
    root = build_node(cpus=2, gpu_faults={"dead": [2]})
    dead = "0000:81:00.0"
    config = os.path.join(root, "sys/bus/pci/devices", dead, "config")
    with open(config, "rb") as fh:
        before = fh.read()
    assert set(before) == {0xFF}  # what lspci shows as rev ff (tests/data/real/lspci-rev-ff-*)
    _facts, _probe, rows = probe_and_rows(root)
    assert rows["responding"]["state"] == "drifted"
    assert rows["responding"]["reason"].startswith(dead + " not responding: config space reads 0xff")
    assert "on the bus but not listed by the driver (nvidia-smi): " + dead in rows["gpu_count"]["reason"]
    assert rows["link_width"]["state"] == "applied"
    assert rows["link_width"]["reason"] == "7 GPU link(s) at their capable width"
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    devices = {d["bdf"]: d for d in result["devices"]}
    assert failed and result["failed_devices"] == [dead]
    assert devices[dead]["reason"].startswith("not responding: config space reads 0xff")
    assert sorted(b for b, d in devices.items() if d["mrrs_after"] == 4096) == sorted(set(devices) - {dead})
    result, failed = run_module("pcie_acs", {"root": root})
    assert not failed and result["failed_bridges"] == []
    with open(config, "rb") as fh:
        assert fh.read() == before  # never written


def test_an_ansi_underlined_topology_still_names_each_broken_pair(build_node):
    root = build_node(cpus=2, smi_ansi=True)
    smi = os.path.join(root, "usr/bin/nvidia-smi")
    out = subprocess.run([smi, "topo", "-p2p", "r"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(" \t\x1b[4mGPU0\t")
    facts, probe, _rows = probe_and_rows(root, {"gpu_p2p": {}})
    rows = [r for r in p2p.evaluate(facts, {"gpu_p2p": {}}, type("Ctx", (), {"gpu": probe})())
            if not r["name"].startswith("bar")]  # the BAR1 row: test_pci_bar.py
    assert len(rows) == 28 and {r["state"] for r in rows} == {"drifted"}  # 8 GPUs behind redirecting ports
    assert "ACS redirect is on above GPU0 (0000:01:00.0) (bridge 0000:00:01.1)" in rows[0]["reason"]


def test_gpu_settings_refuses_an_nvidia_smi_that_lists_no_gpu_while_gpus_are_on_the_bus(build_node, run_module):
    # Before: ok, changed=false, no GPU read, nothing set. An nvidia-smi that answers nothing with rc 0.
    root = build_node(cpus=2)
    smi = os.path.join(root, "usr/bin/nvidia-smi")
    os.makedirs(os.path.dirname(smi), exist_ok=True)
    with open(smi, "w") as fh:
        fh.write("#!/bin/sh\nexit 0\n")
    os.chmod(smi, 0o755)
    result, failed = run_module("gpu_settings", {"persistence": True, "root": root})
    assert failed and "nvidia-smi lists no GPU while 8 NVIDIA GPU(s) are on the PCI bus" in result["msg"]
