"""dcgmi diag and nvbandwidth as other people posted them (tests/data/real/dcgmi-*, nvbandwidth-*).

DCGM 3.x prints one result per test (``Pass - All``, ``Fail - All``), DCGM 4.x a result and a line per
GPU; warnings wrap over continuation rows. nvbandwidth before v0.2 printed 0.00 on the diagonal (not a
pair), later versions N/A, and v0.8 turned the matrix arrow around.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_health_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_p2p as p2p


def verdict(real, name, rc):
    return gpu_health_verify.dcgm_row({"rc": rc, "stdout": real(name).text, "stderr": ""})


@pytest.mark.parametrize("name, version, tests", [
    ("dcgmi-diag-3.3.3-pass-8xa100-awsome-distributed-training.txt", "3.3.3",
     ["Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks", "Persistence Mode",
      "Environment Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom", "PCIe", "GPU Memory"]),
    ("dcgmi-diag-4.4.2-pass-dcgm-124.txt", "4.4.2", ["software", "memory", "pcie"]),
])
def test_passing_diagnostics_pass(real, name, version, tests):
    diag = gpu_health_verify.parse_dcgm_diag(real(name).text)
    assert diag["version"] == version and [t["name"] for t in diag["tests"]] == tests
    assert all(t["result"].startswith("Pass") for t in diag["tests"])
    row = verdict(real, name, 0)
    assert row["state"] == "applied" and row["reason"].startswith("dcgmi diag -r 1 passed (DCGM %s)" % version)


def test_dcgm_3_fails_gpu_memory_on_all_gpus_with_its_warning(real):
    name = "dcgmi-diag-3.3.8-fail-8xh100-nccl-tests-264.txt"
    diag = gpu_health_verify.parse_dcgm_diag(real(name).text)
    memory = next(t for t in diag["tests"] if t["name"] == "GPU Memory")
    assert memory["result"] == "Fail - All" and memory["section"] == "Hardware" and len(memory["notes"]) == 8
    assert memory["notes"][0].startswith("GPU 0 Error using CUDA API cuInit")
    assert "Unable to initialize CUDA library: 'system not yet initialized'" in memory["notes"][0]
    persistence = next(t for t in diag["tests"] if t["name"] == "Persistence Mode")
    assert persistence["result"] == "Pass"
    assert persistence["notes"][0].startswith("Persistence mode for GPU 0 is disabled")
    row = verdict(real, name, 226)
    assert row["state"] == "drifted" and "GPU Memory: Fail - All: GPU 0 Error using CUDA API cuInit" in row["reason"]
    assert "PCIe" not in row["reason"].split(": ")[1]  # skipped tests are not failures


@pytest.mark.parametrize("name, gpus", [("dcgmi-diag-4.2.3-fail-pcie-4gpu-dcgm-253.txt", 4),
                                        ("dcgmi-diag-4.4.1-fail-pcie-8xb200-dcgm-253.txt", 8)])
def test_dcgm_4_fails_the_pcie_test_while_each_gpu_line_passes(real, name, gpus):
    diag = gpu_health_verify.parse_dcgm_diag(real(name).text)
    pcie = next(t for t in diag["tests"] if t["name"] == "pcie")
    assert pcie["result"] == "Fail" and pcie["gpus"] == dict.fromkeys(range(gpus), "Pass")
    assert "couldn't be parsed" in " ".join(pcie["notes"])
    memory = next(t for t in diag["tests"] if t["name"] == "memory")
    assert memory["result"] == "Pass" and len(memory["gpus"]) == gpus and memory["notes"] == []
    row = verdict(real, name, 226)
    assert row["state"] == "drifted" and "pcie: Fail: There was an internal error during the test" in row["reason"]


def test_a_diagnostic_that_could_not_run_prints_no_table_and_fails(real):
    row = verdict(real, "dcgmi-diag-4.4.1-error-no-plugins-dcgm-254.txt", 226)
    assert row["state"] == "drifted"
    assert "Error: Unable to complete diagnostic for entities 0,1,2,3. Return: (-30)" in row["reason"]


def test_a_dcgmi_that_hangs_is_named_as_a_hang():
    said = "dcgmi did not answer within 600 s: a wedged GPU, or nv-hostengine not answering; it was killed"
    row = gpu_health_verify.dcgm_row({"rc": 124, "stdout": "", "stderr": said, "timed_out": True})
    assert row["state"] == "drifted" and row["reason"].startswith("dcgmi did not answer within 600 s")


def test_nvbandwidth_v0_8_na_diagonal_and_its_arrow(real):
    text = real("nvbandwidth-v0.8-a6000-issue-50.txt").text
    values = p2p.parse_nvbandwidth(text)
    assert len(values) == 30 and (0, 0) not in values  # 6 GPUs: 6 x 5 pairs, N/A on the diagonal
    assert values[(0, 3)] == 21.95 and values[(3, 0)] == 21.82 and min(values.values()) == 21.80
    assert p2p.nvbandwidth_arrow(text) == "->"
    rows = p2p.bandwidth_rows({"rc": 0, "stdout": text, "stderr": ""}, 22.0, {})
    slow = {r["name"] for r in rows}
    assert rows[0]["state"] == "drifted" and "bandwidth.GPU0-GPU3" in slow and "bandwidth.GPU3-GPU0" in slow
    assert "GPU0 -> GPU3 at 21.95 GB/s" in next(r["reason"] for r in rows if r["name"] == "bandwidth.GPU0-GPU3")


def test_nvbandwidth_v0_1_zero_diagonal_is_not_a_pair(real):
    text = real("nvbandwidth-v0.1-readme-diag-0.00.txt").text
    values = p2p.parse_nvbandwidth(text)
    assert len(values) == 56 and all(r != c for r, c in values) and min(values.values()) == 274.89
    assert p2p.nvbandwidth_arrow(text) == "<-"
    rows = p2p.bandwidth_rows({"rc": 0, "stdout": text, "stderr": ""}, 100.0, {})
    assert [(r["name"], r["state"]) for r in rows] == [("bandwidth", "applied")]  # before the fix: GPUn-GPUn 0.00


def test_a_waived_test_says_the_gpus_cannot_reach_each_other(real):
    text = real("nvbandwidth-v0.2-waived-2080ti-issue-13.txt").text
    assert p2p.nvbandwidth_waived(text) == "device_to_device_memcpy_write_ce"
    row = p2p.bandwidth_rows({"rc": 0, "stdout": text, "stderr": ""}, 10.0, {})[0]
    assert row["state"] == "drifted" and "waived device_to_device_memcpy_write_ce" in row["reason"]
    assert "no peer-to-peer access" in row["reason"]


# The verdict reads every row by its result, whatever dcgmi's exit status (core/dcgm.py, issue 33).

def test_an_error_row_fails_the_verdict_although_dcgmi_exits_0(real):
    row = verdict(real, "dcgmi-diag-error-row-remap-pending-cut-ml-engineering.txt", 0)
    assert row["state"] == "drifted" and row["running"] == "fail"
    assert "Deployment: Error: GPU 3 has uncorrectable memory errors and row remappings are pending" in row["reason"]


def test_the_3x_fail_gpu_row_after_the_test_fails_the_verdict_naming_the_gpu(real):
    row = verdict(real, "dcgmi-diag-3.3.9-fail-gpu1-targeted-power-sagemaker-health-check.txt", 0)
    assert row["state"] == "drifted" and "Targeted Power: Fail (GPU1): GPU 1 Max power of 224.1" in row["reason"]


def test_a_table_cut_before_its_border_keeps_its_last_row_and_fails(real):
    row = verdict(real, "dcgmi-diag-3.3.9-cut-after-fail-row-derived.txt", 0)
    assert row["state"] == "drifted" and "Targeted Power: Fail (GPU1)" in row["reason"]
    assert "the table ends without its closing border after line 27" in row["reason"]


def test_a_row_not_understood_is_a_finding_never_a_pass(real):
    text = real("dcgmi-diag-4.4.2-pass-dcgm-124.txt").text.replace(
        "| pcie                      | Pass", "| pcie                      | Meh ")
    assert text != real("dcgmi-diag-4.4.2-pass-dcgm-124.txt").text
    row = gpu_health_verify.dcgm_row({"rc": 0, "stdout": text, "stderr": ""})
    assert row["state"] == "drifted" and "test 'pcie' has the result 'Meh'" in row["reason"]


def test_an_all_pass_table_with_a_non_zero_exit_fails_naming_it(real):
    row = verdict(real, "dcgmi-diag-4.4.2-pass-dcgm-124.txt", 226)
    assert row["state"] == "drifted" and "every test passed but dcgmi exited 226" in row["reason"]
