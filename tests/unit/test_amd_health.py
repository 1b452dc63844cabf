"""AMD GPU health on the simulated MI300X node (tools/simnode.py's amd-smi stand-in, core/amd_health.py).

The stand-in answers with the shapes of the real captures (tests/data/real/amd-smi-*); each check fails naming
the GPU and the check, and an amd-smi that is missing, hangs, errors or prints invalid JSON makes the host
unhealthy with the reason.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_health, amd_smi, command
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_health, gpu_health_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verify import gather

PRESET = "mi300x-epyc-8gpu"
SICK_GPU = 3  # 0000:65:00.0, the GPU each fault is put on
REAL = Path(__file__).resolve().parents[1] / "data" / "real"


def tools(root, timeouts=None, seen=None):
    """verify.Tools as tuning_info builds them on a simulated node (only the node's own usr/bin), bounded."""
    run = command.runner(timeouts)

    def find(name, _package):
        path = os.path.join(root, "usr/bin", name)
        return path if os.access(path, os.X_OK) else None

    def record(argv):
        if seen is not None:
            seen.append([os.path.relpath(argv[0], root)] + argv[1:])
        return run(argv)
    return verify.Tools(find, record)


def rows_of(root, timeouts=None, seen=None, desired=None):
    facts = gather(Node(root))
    desired = desired or {"gpu_health": {}}
    facts["gpu_probe"] = verify.gpu_probe(Node(root), dict(verify.VERIFY_DEFAULTS), tools(root, timeouts, seen),
                                          desired, verify.gpu_vendors(facts))
    return facts, {r["name"]: r for r in gpu_health_verify.evaluate(facts, desired, None)}


def amd_rows(rows):
    """The rows of amd-smi's and the amdgpu log's checks (the config-space rows name the vendor too)."""
    return {n: r for n, r in rows.items() if n.startswith("amd_")}


def test_a_healthy_mi300x_node_is_judged_by_amd_smi_one_call_per_subcommand(build_node):
    root = build_node(PRESET, cpus=4, amd_smi=True)
    seen = []
    facts, rows = rows_of(root, seen=seen, desired={"gpu_health": {"gpu_count": 8}})
    assert seen == [["usr/bin/amd-smi"] + list(c.args) for c in amd_health.COMMANDS]  # never one per GPU
    assert [g["bdf"] for g in facts["pci"]["devices"]] == [
        "0000:%02x:00.0" % b for b in (0x05, 0x26, 0x46, 0x65, 0x85, 0xA5, 0xC5, 0xE5)]
    amd = amd_rows(rows)
    assert {n: r["state"] for n, r in amd.items()} == {
        "amd_smi": "applied", "amd_gpu_count": "applied", "amd_ecc": "applied", "amd_bad_pages": "applied",
        "amd_pcie_link": "applied", "amd_xgmi": "applied", "amd_kernel_log": "applied"}
    assert amd["amd_smi"]["reason"].startswith("amd-smi (tool 25.4.2+aca1101, rocm 6.4.1) answered list, static, "
                                               "metric, bad-pages, topology, xgmi -l for 8 GPU(s)")
    assert amd["amd_gpu_count"]["running"] == "8 listed by amd-smi, 8 on the PCI bus"
    assert amd["amd_xgmi"]["reason"] == "56 XGMI link(s) up (amd-smi xgmi -l)"
    # The config-space rows judge every vendor's GPUs; the NVIDIA-only rows say so and stay not applicable.
    assert rows["link_width"]["state"] == "applied" and rows["link_width"]["vendor"] == "amd"
    assert rows["gpu_count"]["state"] == "applied" and rows["gpu_count"]["running"] == "8 on the PCI bus"
    assert rows["driver_count"]["vendor"] == "nvidia" and rows["driver_count"]["state"] == "not_applicable"
    assert gpu_health.health_findings({"settings": list(rows.values())}) == []


@pytest.mark.parametrize(("fault", "row", "words"), [
    ("ecc_uncorrectable", "amd_ecc", "GPU 3 (0000:65:00.0): 2 uncorrectable ECC error(s) in UMC 2"),
    ("bad_pages", "amd_bad_pages", "GPU 3 (0000:65:00.0): 655 retired page(s), RAS threshold 655 reached"),
    ("x8", "amd_pcie_link", "GPU 3 (0000:65:00.0) link x8 of x16: trained below the maximum width"),
    ("xgmi_down", "amd_xgmi", "GPU 3 (0000:65:00.0): 1 XGMI link(s) down; GPU 4 (0000:85:00.0): 1 XGMI link(s) down"),
    ("gpu_reset", "amd_kernel_log", "0000:65:00.0: gpu_reset 1x, vram_lost 1x"),
    ("missing", "amd_gpu_count", "on the PCI bus but not listed by amd-smi: 0000:65:00.0"),
])
def test_each_gpu_fault_fails_the_health_gate_naming_the_gpu_and_the_check(build_node, fault, row, words):
    root = build_node(PRESET, cpus=4, amd_faults={fault: [3]})
    _facts, rows = rows_of(root)
    failing = {n: r for n, r in amd_rows(rows).items() if r["state"] == "drifted"}
    assert list(failing) == [row], failing
    assert words in failing[row]["reason"]
    findings = gpu_health.health_findings({"settings": list(rows.values())})
    expected = ["gpu_health.%s: %s" % (row, failing[row]["reason"])]
    if fault == "x8":  # config space shows the same narrow link, for every vendor's GPUs
        expected.insert(0, "gpu_health.link_width: %s" % rows["link_width"]["reason"])
        assert "0000:65:00.0 link x8 of x16" in rows["link_width"]["reason"]
    assert findings == expected


def test_amd_smi_in_opt_rocm_bin_is_found_when_not_on_path(build_node):
    root = build_node(PRESET, cpus=4, amd_smi_mode="rocm_dir")
    seen = []
    _facts, rows = rows_of(root, seen=seen)
    assert seen[0][0] == "opt/rocm/bin/amd-smi"
    assert rows["amd_smi"]["state"] == "applied"


@pytest.mark.parametrize(("mode", "words"), [
    ("absent", "amd-smi not found on the node's PATH nor in /opt/rocm/bin: install ROCm's amd-smi-lib"),
    ("error", "amd-smi list --json failed (rc 1): ERROR:root:Unable to initialize amdsmi: "
              "AMDSMI_STATUS_DRIVER_NOT_LOADED"),
    ("invalid_json", "amd-smi metric --json: amd-smi printed invalid JSON"),
])
def test_an_amd_smi_that_does_not_answer_makes_the_host_unhealthy(build_node, mode, words):
    root = build_node(PRESET, cpus=4, amd_smi_mode=mode)
    _facts, rows = rows_of(root)
    assert rows["amd_smi"]["state"] == "drifted"
    assert words in rows["amd_smi"]["reason"]
    assert "8 AMD GPU(s) on the PCI bus are not checked by it" in rows["amd_smi"]["reason"]
    assert any(f.startswith("gpu_health.amd_smi: ") for f in gpu_health.health_findings(
        {"settings": list(rows.values())}))


def test_a_hanging_amd_smi_costs_one_timeout_not_one_per_call(build_node):
    root = build_node(PRESET, cpus=4, amd_smi_mode="hang")
    seen = []
    started = time.monotonic()
    _facts, rows = rows_of(root, timeouts={"amd_smi": 1}, seen=seen)
    assert time.monotonic() - started < 15
    assert [s[1] for s in seen] == ["version", "list"]  # version answers; list hangs; nothing more is asked
    assert rows["amd_smi"]["state"] == "drifted"
    assert "amd-smi list --json: amd-smi did not answer within 1 s: a wedged GPU or amdgpu driver" \
        in rows["amd_smi"]["reason"]


def test_an_nvidia_node_gets_no_amd_row_and_asks_no_amd_smi(build_node):
    root = build_node(cpus=4, nvidia_smi=True)
    seen = []
    _facts, rows = rows_of(root, seen=seen)
    assert not amd_rows(rows)
    assert all(not s[0].endswith("amd-smi") for s in seen)
    assert {r["vendor"] for r in rows.values()} == {"nvidia"}


def test_the_stand_in_answers_in_the_shapes_of_the_real_captures(build_node):
    """Its static and metric records carry the fields the real captures have (MI210 static, RX 6600 metric), and
    its xgmi -l table and version line read as the real ones do."""
    root = build_node(PRESET, cpus=4, amd_smi=True)
    answers = json.loads(Path(root, "var/lib/simnode/amd-smi.json").read_text())["answers"]

    def capture(name):
        return (REAL / name).read_text().split("==> capture follows <==\n", 1)[1]
    real_static = amd_smi.read_static(capture("amd-smi-static-json-gpu-data-mi210-device-metrics-exporter.txt"))
    sim_static = amd_smi.read_static(answers["static"])
    read = [k for k, v in real_static["gpus"][0].items() if v not in (None, {}, [])]
    assert all(sim_static["gpus"][0][k] is not None for k in read if k != "missing"), read
    real_metric = amd_smi.read_metric(capture("amd-smi-metric-json-list-rx6600-luckylinux.txt"))
    assert set(real_metric["gpus"][0]) <= set(amd_smi.read_metric(answers["metric"])["gpus"][0])
    assert amd_smi.read_xgmi_link_status(capture("amd-smi-xgmi-link-status-text-rocm6.4-changelog.txt"))["gpus"][0][
        "links"] == ["U", "U", "U", "U", "D", "U", "D", "X"]
    assert len(amd_smi.read_xgmi_link_status(answers["xgmi_link_status"])["gpus"]) == 8
    assert amd_smi.read_version(answers["version"])["rocm_release"] == (6, 4, 1)


def test_the_guard_counts_amdgpu_faults_per_gpu_and_labels_every_gpu_series_with_its_vendor(build_node):
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import kernel_log
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import guard, guard_metrics

    root = build_node(PRESET, cpus=4, amd_faults={"gpu_reset": [SICK_GPU]})
    facts, rows = rows_of(root)
    data, _why = kernel_log.read_kmsg(Node(root))
    faults = guard.update_gpu_faults(data, facts["pci"]["gpu_vendors"])
    assert faults["counts"] == {"0000:65:00.0": {"gpu_reset": 1, "vram_lost": 1}}
    assert faults["serious"] == {b: (2 if b == "0000:65:00.0" else 0) for b in facts["pci"]["gpu_vendors"]}
    text = guard_metrics.render({
        "gpus": guard.gpu_links(facts), "gpu_faults": faults,
        "health_findings": guard.health_findings(list(rows.values()), facts["pci"]["gpu_vendors"])})
    assert 'gpunode_tuning_gpu_serious_fault_events_total{gpu="0000:65:00.0",vendor="amd"} 2\n' in text
    assert 'gpunode_tuning_gpu_link_width{gpu="0000:05:00.0",vendor="amd"} 16\n' in text
    assert ('gpunode_tuning_gpu_health_finding{gpu="0000:65:00.0",vendor="amd",check="amd_kernel_log",'
            'state="drifted"} 1\n') in text


def test_every_gpu_familys_rows_name_their_vendor(build_node):
    from ansible_collections.gpunode.tuning.plugins.module_utils import registry

    root = build_node(PRESET, cpus=4, amd_smi=True)
    facts = gather(Node(root))
    desired = {"gpu_health": {}, "gpu_locality": {}, "gpu_settings": {}, "gpu_p2p": {}}
    judged = set()
    for fam in registry.FAMILIES:
        if not fam.name.startswith("gpu_") or fam.evaluate is None:
            continue
        rows = fam.evaluate(facts, desired, None)
        judged.add(fam.name)
        gpu_rows = [r for r in rows if r["name"] not in ("irqbalance",) and not r["name"].startswith("nic.")]
        assert gpu_rows and all(r.get("vendor") for r in gpu_rows), \
            (fam.name, [r["id"] for r in gpu_rows if not r.get("vendor")])
    assert judged == {"gpu_health", "gpu_locality", "gpu_settings", "gpu_p2p"}


def test_amd_smi_is_asked_only_where_amd_gpus_are_on_the_bus(build_node):
    """An NVIDIA node that has amd-smi installed (ROCm tools on a mixed image) does not run it."""
    root = build_node(cpus=4, nvidia_smi=True)
    os.symlink(os.path.join(build_node(PRESET, cpus=4, amd_smi=True), "usr/bin/amd-smi"),
               os.path.join(root, "usr/bin/amd-smi"))
    seen = []
    facts = gather(Node(root))
    probe = verify.gpu_probe(Node(root), dict(verify.VERIFY_DEFAULTS), tools(root, seen=seen), {"gpu_health": {}},
                             verify.gpu_vendors(facts))
    assert verify.gpu_vendors(facts) == {"nvidia"}
    assert not [s for s in seen if s[0].endswith("amd-smi")] and "amd_list" not in probe


def test_an_amd_smi_that_answers_xgmi_l_with_its_own_error_document_falls_back_to_topology(build_node):
    """Issue 42: amd-smi without ``xgmi -l`` prints ``{"error": "Parameter '-l' is invalid. ...", "code": -2}``
    on stdout and exits 0 (amd-smi up to ROCm 7.1): a healthy node, its XGMI links judged from topology."""
    root = build_node(PRESET, cpus=4, amd_smi_mode="refuse_link_status")
    _facts, rows = rows_of(root)
    amd = amd_rows(rows)
    assert {n: r["state"] for n, r in amd.items() if r["state"] != "applied"} == {}
    assert amd["amd_smi"]["reason"].endswith(
        "answered list, static, metric, bad-pages, topology for 8 GPU(s); amd-smi xgmi -l --json is not known to this "
        "amd-smi (Parameter '-l' is invalid. Run '--help' for more info. (code -2)): XGMI links from topology")
    assert amd["amd_xgmi"]["reason"] == "56 XGMI link(s) up (amd-smi topology)"
    assert gpu_health.health_findings({"settings": list(rows.values())}) == []


def test_a_command_amd_smi_does_not_offer_on_the_system_is_an_unsupported_row_naming_the_release(build_node):
    """``bad-pages`` answered with ``{"error": "Command 'bad-pages' is not supported on the system. ...", "code": -7}``
    costs only the bad-pages check, as an older amd-smi does; the node is not failed for it."""
    root = build_node(PRESET, cpus=4, amd_smi_mode="refuse_bad_pages")
    _facts, rows = rows_of(root)
    pages = rows["amd_bad_pages"]
    assert (pages["state"], pages["running"]) == ("unsupported", None)
    assert pages["reason"] == (
        "amd-smi (tool 25.4.2+aca1101, rocm 6.4.1) refused `amd-smi bad-pages --json` (Command 'bad-pages' is not "
        "supported on the system. Run '--help' for more info. (code -7)): this release or system does not offer it")
    assert {n: r["state"] for n, r in amd_rows(rows).items() if n != "amd_bad_pages"} == dict.fromkeys(
        ("amd_smi", "amd_gpu_count", "amd_ecc", "amd_pcie_link", "amd_xgmi", "amd_kernel_log"), "applied")
    assert gpu_health.health_findings({"settings": list(rows.values())}) == []


def test_an_error_document_that_is_no_refusal_fails_the_host_with_amd_smis_words():
    """A library error printed as amd-smi's document (exit 0) is a failing call, named, never "no GPU list"."""
    doc = '{"error": "AMDSMI has returned error \'-1034\' - \'Driver not loaded\'", "code": -1034}\n'
    probe = {k: {"rc": 0, "stdout": doc, "stderr": ""} for k in amd_health.KEYS}
    probe["amd_version"] = {"rc": 0, "stdout": "AMDSMI Tool: 24.6.3 | ROCm version: 6.2.4", "stderr": ""}
    readings, problems, notes = amd_health.read_answers(probe)
    assert (readings, notes) == ({}, [])
    assert problems[0] == ("amd-smi list --json: amd-smi answered with its own error, not the GPUs: AMDSMI has "
                           "returned error '-1034' - 'Driver not loaded' (code -1034)")
