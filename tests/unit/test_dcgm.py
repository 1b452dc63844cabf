"""core/dcgm.py on every dcgmi diag capture of tests/data/real (row by row), and its edge cases.

Each capture's expectation lists every test the table holds, in order, with the status a person
reading the table gives it, and what fails; a capture without an expectation fails the suite.
"""

from __future__ import annotations

import os

import pytest
from support.captures import REAL_CAPTURES

from ansible_collections.gpunode.tuning.plugins.module_utils.core import dcgm

DEPLOYMENT_3X = ["Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks", "Persistence Mode",
                 "Environment Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom"]


def passing(names, section="Deployment", result="Pass"):
    return [(n, section, result, "pass") for n in names]


# name -> (version, complete, [(test, section, result on its row, status)], [failure texts], [finding starts])
EXPECTED = {
    "dcgmi-diag-2.4.6-fail-pcie-nvlink-cut-dcgm-49.txt": (
        None, False, [("PCIe", "Integration", "Fail - All", "fail")],
        ["PCIe: Fail - All: GPU 0GPU 0's NvLink link 0 is currently down Run a field diagnostic on the GPU., "
         "GPU 0GPU 0's NvLink link 1 is currently down"],
        ["the table ends without its closing border after line 11"]),
    "dcgmi-diag-2.x-pass-r4-gcm.txt": (
        None, True,
        passing(["Blacklist"] + DEPLOYMENT_3X[1:])
        + [("PCIe", "Integration", "Pass - All", "pass")]
        + passing(["GPU Memory", "Diagnostic", "Pulse Test"], "Hardware", "Pass - All")
        + passing(["SM Stress", "Targeted Stress", "Targeted Power", "Memory Bandwidth", "Memtest"], "Stress",
                  "Pass - All"),
        [], []),
    "dcgmi-diag-3.3.1-fail-gpu0-hardware-fragment-go-dcgm-52.txt": (
        None, False,
        [("GPU Memory", "Hardware", "Pass - GPU: 1", "fail"), ("Diagnostic", "Hardware", "Fail - All", "fail"),
         ("Targeted Stress", "Stress", "Fail - All", "fail")],
        ["GPU Memory: Fail (GPU0): GPU 0 Error using CUDA API cuCtxCreate Check DCGM and system logs for errors. "
         "Reset GPU. Restart DCGM. Rerun diagnostics. Unable to create CUDA context",
         "Diagnostic: Fail - All: GPU 0 API call cuMemGetInfo failed: 'context is destroyed'",
         "Targeted Stress: Fail - All"],
        ["line 1 not understood: '|                           | bidirectional bandwidth: 22.63 GB/s",
         "the table ends without its closing border after line 18 '| Warning'"]),
    "dcgmi-diag-3.3.3-pass-8xa100-awsome-distributed-training.txt": (
        "3.3.3", True,
        passing(DEPLOYMENT_3X) + [("PCIe", "Integration", "Pass - All", "pass"),
                                  ("GPU Memory", "Hardware", "Pass - All", "pass")],
        [], []),
    "dcgmi-diag-3.3.8-fail-8xh100-nccl-tests-264.txt": (
        "3.3.8", True,
        passing(DEPLOYMENT_3X) + [("PCIe", "Integration", "Skip - All", "skip"),
                                  ("GPU Memory", "Hardware", "Fail - All", "fail"),
                                  ("Memory Bandwidth", "Stress", "Skip - All", "skip"),
                                  ("EUD Test", "Stress", "Skip - All", "skip")],
        ["GPU Memory: Fail - All: GPU 0 Error using CUDA API cuInit"], []),
    "dcgmi-diag-3.3.9-cut-after-fail-row-derived.txt": (
        "3.3.9", False,
        passing(DEPLOYMENT_3X) + [("PCIe", "Integration", "Pass - All", "pass")]
        + passing(["GPU Memory", "Diagnostic"], "Hardware", "Pass - All")
        + [("Targeted Stress", "Stress", "Pass - All", "pass"),
           ("Targeted Power", "Stress", "Pass - GPUs: 0, 2, 3", "fail")],
        ["Targeted Power: Fail (GPU1)"],
        ["the table ends without its closing border after line 27"]),
    "dcgmi-diag-3.3.9-fail-gpu1-targeted-power-sagemaker-health-check.txt": (
        "3.3.9", True,
        passing(DEPLOYMENT_3X) + [("PCIe", "Integration", "Pass - All", "pass")]
        + passing(["GPU Memory", "Diagnostic"], "Hardware", "Pass - All")
        + [("Targeted Stress", "Stress", "Pass - All", "pass"),
           ("Targeted Power", "Stress", "Pass - GPUs: 0, 2, 3", "fail"),
           ("Memory Bandwidth", "Stress", "Pass - All", "pass"), ("EUD Test", "Stress", "Skip - All", "skip")],
        ["Targeted Power: Fail (GPU1): GPU 1 Max power of 224.1 did not reach desired power minimum "
         "target_power_min_ratio of 224.2 for GPU 1 Verify that the clock speeds and GPU utilization are high."],
        []),
    "dcgmi-diag-3.3.9-pass-r3-sagemaker-health-check.txt": (
        "3.3.9", True,
        passing(DEPLOYMENT_3X) + [("PCIe", "Integration", "Pass - All", "pass")]
        + passing(["GPU Memory", "Diagnostic"], "Hardware", "Pass - All")
        + passing(["Targeted Stress", "Targeted Power", "Memory Bandwidth"], "Stress", "Pass - All")
        + [("EUD Test", "Stress", "Skip - All", "skip")],
        [], []),
    "dcgmi-diag-4.2.3-fail-pcie-4gpu-dcgm-253.txt": (
        "4.2.3", False,
        [("software", "Deployment", "Pass", "pass"), ("memory", "Hardware", "Pass", "pass"),
         ("pcie", "Integration", "Fail", "fail")],
        ["pcie: Fail: There was an internal error during the test: 'A child process (152) exited with non-zero "
         "status 1'"],
        ["the table ends without its closing border after line 49"]),
    "dcgmi-diag-4.4.1-error-no-plugins-dcgm-254.txt": (
        None, False, [],
        ["dcgmi: Error: Unable to complete diagnostic for entities 0,1,2,3. Return: (-30)",
         "dcgmi: Error: Cannot load plugins."],
        []),
    "dcgmi-diag-4.4.1-fail-pcie-8xb200-dcgm-253.txt": (
        "4.4.1", True,
        [("software", "Deployment", "Pass", "pass"), ("memory", "Hardware", "Pass", "pass"),
         ("pcie", "Integration", "Fail", "fail")],
        ["pcie: Fail: There was an internal error during the test: 'Output of child process (11167) couldn't be "
         "parsed"],
        []),
    "dcgmi-diag-4.4.2-pass-dcgm-124.txt": (
        "4.4.2", True,
        [("software", "Deployment", "Pass", "pass"), ("memory", "Hardware", "Pass", "pass"),
         ("pcie", "Integration", "Pass", "pass")],
        [], []),
    "dcgmi-diag-error-row-remap-pending-cut-ml-engineering.txt": (
        None, False, [("Deployment", "Deployment", "Error", "error")],
        ["Deployment: Error: GPU 3 has uncorrectable memory errors and row remappings are pending"],
        ["the table ends without its closing border after line 6"]),
    "dcgmi-diag-r2-fail-gpu0-thermal-fragment-ml-engineering.txt": (
        None, False, [("GPU Memory", None, "Pass - GPUs: 1, 2, 3, 4, 5, 6, 7", "fail")],
        ["GPU Memory: Fail (GPU0): GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into the "
         "test for GPU 0 Verify that the cooling on this machine is functional, including external, thermal "
         "material interface, fans, and any other components."],
        ["the table ends without its closing border after line 8 '|                           | ts.'"]),
}

CAPTURES = sorted(n for n in os.listdir(REAL_CAPTURES) if n.startswith("dcgmi-diag-"))


def test_every_dcgmi_capture_has_an_expectation():
    assert CAPTURES == sorted(EXPECTED)


@pytest.mark.parametrize("name", CAPTURES)
def test_each_capture_is_read_row_by_row(real, name):
    version, complete, tests, failures, findings = EXPECTED[name]
    diag = dcgm.parse_diag(real(name).text)
    assert diag["version"] == version and diag["complete"] is complete
    assert [(t["name"], t["section"], t["result"], t["status"]) for t in diag["tests"]] == tests
    said = [dcgm.describe(f) for f in diag["failures"]]
    assert len(said) == len(failures) and all(s.startswith(f) for s, f in zip(said, failures, strict=True)), said
    assert len(diag["findings"]) == len(findings)
    assert all(s.startswith(f) for s, f in zip(diag["findings"], findings, strict=True)), diag["findings"]
    assert dcgm.passed(diag) is (not failures and not findings)
    assert diag["warnings"] == []  # none of the captures has a Warn result


@pytest.mark.parametrize("name, gpus", [
    ("dcgmi-diag-3.3.9-fail-gpu1-targeted-power-sagemaker-health-check.txt",
     {0: "Pass", 2: "Pass", 3: "Pass", 1: "Fail"}),
    ("dcgmi-diag-r2-fail-gpu0-thermal-fragment-ml-engineering.txt", {**dict.fromkeys(range(1, 8), "Pass"), 0: "Fail"}),
    ("dcgmi-diag-3.3.1-fail-gpu0-hardware-fragment-go-dcgm-52.txt", {1: "Pass", 0: "Fail"}),
])
def test_the_3x_per_gpu_rows_name_the_failing_gpu(real, name, gpus):
    """``Pass - GPUs: 0, 2, 3`` on the test's row, ``Fail - GPU: 1`` on the next: the GPU fails, the test fails."""
    diag = dcgm.parse_diag(real(name).text)
    test = next(t for t in diag["tests"] if t["gpus"])
    assert test["gpus"] == gpus
    failing = next(f for f in diag["failures"] if f["test"] == test["name"])
    assert failing["gpus"] == [g for g, r in gpus.items() if r == "Fail"] and failing["result"] == "Fail"


def test_the_error_row_fails_whatever_the_exit_status(real):
    """An Error row before any test of its section stands for the section; exit 0 or not, it fails."""
    diag = dcgm.parse_diag(real("dcgmi-diag-error-row-remap-pending-cut-ml-engineering.txt").text)
    [test] = diag["tests"]
    assert test["messages"] == [{"kind": "Error",
                                 "text": "GPU 3 has uncorrectable memory errors and row remappings are pending"}]
    assert diag["failures"][0]["status"] == "error" and not dcgm.passed(diag)


def test_notes_and_metadata_join_back_as_before(real):
    diag = dcgm.parse_diag(real("dcgmi-diag-3.3.8-fail-8xh100-nccl-tests-264.txt").text)
    persistence = next(t for t in diag["tests"] if t["name"] == "Persistence Mode")
    assert persistence["status"] == "pass" and persistence["messages"][0]["kind"] == "Info"
    assert persistence["notes"][0].startswith('Persistence mode for GPU 0 is disabled. Enable persistence mode by '
                                              'running "nvidia-smi -i <gpuId> -pm 1 " as root.')
    memory = next(t for t in diag["tests"] if t["name"] == "GPU Memory")
    assert len(memory["notes"]) == 8 and "Unable to initialize CUDA library: 'system not yet initialized'" \
        in memory["notes"][0]
    assert diag["metadata"] == {"DCGM Version": "3.3.8", "Driver Version Detected": "560.35.03",
                                "GPU Device IDs Detected": "2330,2330,2330,2330,2330,2330,2330,2330"}


def test_a_test_named_diagnostic_is_a_test_not_the_header(real):
    diag = dcgm.parse_diag(real("dcgmi-diag-3.3.9-pass-r3-sagemaker-health-check.txt").text)
    assert [t["section"] for t in diag["tests"] if t["name"] == "Diagnostic"] == ["Hardware"]


def test_the_4x_per_gpu_rows_after_the_warnings_are_gpu_results(real):
    diag = dcgm.parse_diag(real("dcgmi-diag-4.4.1-fail-pcie-8xb200-dcgm-253.txt").text)
    pcie = diag["tests"][-1]
    assert pcie["gpus"] == dict.fromkeys(range(8), "Pass") and len(pcie["notes"]) == 1
    assert pcie["notes"][0].endswith("Reset GPU. Restart DCGM. Rerun diagnostics.")


# -- Edge cases (stand-ins built from the real layout)

HEAD = ("+---------------------------+------------------------------------------------+\n"
        "| Diagnostic                | Result                                         |\n"
        "+===========================+================================================+\n")
FOOT = "+---------------------------+------------------------------------------------+\n"
SECTION = "+-----  Hardware  ----------+------------------------------------------------+\n"


def row(name, value):
    return "| %-25s | %-46s |\n" % (name, value)


def table(*rows, foot=True):
    return HEAD + SECTION + "".join(row(*r) for r in rows) + (FOOT if foot else "")


@pytest.mark.parametrize("rows, status, gpus", [
    ([("memory", "Pass"), ("", "GPU0: Pass"), ("", "GPU 1: Fail")], "fail", {0: "Pass", 1: "Fail"}),
    ([("memory", "Pass"), ("", "GPU0: Error")], "error", {0: "Error"}),
    ([("memory", "Error")], "error", {}),
    ([("memory", "Warn"), ("", "GPU0: Warn")], "warn", {0: "Warn"}),
    ([("GPU Memory", "Warn - All")], "warn", {}),
    ([("GPU Memory", "Pass - GPUs: 0, 1"), ("", "Skip - GPU: 2")], "pass", {0: "Pass", 1: "Pass", 2: "Skip"}),
    ([("GPU Memory", "Skip - All")], "skip", {}),
    ([("GPU Memory", "Pass - All"), ("Error", "GPU 1 has pending row remaps")], "error", {}),
])
def test_each_result_word_gives_its_status(rows, status, gpus):
    diag = dcgm.parse_diag(table(*rows))
    [test] = diag["tests"]
    assert (test["status"], test["gpus"]) == (status, gpus) and diag["findings"] == []
    assert bool(diag["failures"]) is (status in ("fail", "error"))
    assert bool(diag["warnings"]) is (status == "warn")
    assert dcgm.passed(diag) is (status in ("pass", "skip", "warn"))  # a warning is reported, not a failure


def test_a_warning_is_reported_naming_its_gpus():
    diag = dcgm.parse_diag(table(("memory", "Warn"), ("Warning", "GPU 1 is hot"), ("", "GPU0: Pass"),
                                 ("", "GPU1: Warn")))
    assert [dcgm.describe(w) for w in diag["warnings"]] == ["memory: Warn (GPU1): GPU 1 is hot"]


@pytest.mark.parametrize("rows, finding", [
    ([("GPU Memory", "Passed")], "not understood: test 'GPU Memory' has the result 'Passed'"),
    ([("GPU Memory", "Pass (HBM3 stress pattern clean)")], "has the result 'Pass (HBM3 stress pattern clean)'"),
    ([("GPU Memory", "Pass - All"), ("", "something else")], "line 6 not understood: '|"),
    ([("Warning", "GPU 0 is hot")], "line 5 is a Warning row before any test"),
    ([("", "GPU0: Pass")], "line 5 not understood"),
])
def test_a_row_not_understood_is_a_finding_never_a_pass(rows, finding):
    diag = dcgm.parse_diag(table(*rows))
    assert any(finding in f for f in diag["findings"]), diag["findings"]
    assert not dcgm.passed(diag)


def test_a_table_cut_inside_its_last_row_keeps_that_row():
    text = HEAD + SECTION + row("GPU Memory", "Pass - All") + "| Targeted Power            | Fail - All"
    diag = dcgm.parse_diag(text)
    assert [(t["name"], t["status"]) for t in diag["tests"]] == [("GPU Memory", "pass"), ("Targeted Power", "fail")]
    assert diag["complete"] is False and diag["findings"][0].startswith("the table ends without its closing border")


def test_a_passing_table_cut_before_its_border_does_not_pass():
    diag = dcgm.parse_diag(table(("GPU Memory", "Pass - All"), foot=False))
    assert diag["failures"] == [] and not dcgm.passed(diag)


def test_crlf_indented_and_repeated_tables_are_read():
    once = table(("GPU Memory", "Pass - All"))
    text = "Running iteration 1 of 2...\r\n" + "".join("  " + line + "\r\n" for line in once.splitlines()) + \
        "Running iteration 2 of 2...\n" + table(("GPU Memory", "Fail - All"))
    diag = dcgm.parse_diag(text)
    assert [t["status"] for t in diag["tests"]] == ["pass", "fail"] and diag["complete"]


def test_dcgmi_failure_lines_outside_the_table_are_failures():
    text = table(("GPU Memory", "Pass - All")) + "Aborting the iterative runs of the diagnostic due to failure: x\n"
    diag = dcgm.parse_diag(text)
    assert [f["test"] for f in diag["failures"]] == ["dcgmi"] and not dcgm.passed(diag)


def test_a_diagnostic_warn_code_row_is_read():
    diag = dcgm.parse_diag(table(("Diagnostic", "Warn - All"), ("", "  Code: (000000000012)")))
    assert diag["tests"][0]["code"] == "Code: (000000000012)" and diag["findings"] == []


@pytest.mark.parametrize("text", [None, "", "Successfully ran diagnostic for group.\n", '{"DCGM GPU Diagnostic": {}}'])
def test_no_table_is_a_finding(text):
    diag = dcgm.parse_diag(text)
    assert diag["findings"] == ["no test result in dcgmi's output"] and not dcgm.passed(diag)


def test_a_wrapped_metadata_value_joins():
    meta = "|-----  Metadata  ----------+------------------------------------------------|\n"
    text = HEAD + meta + row("GPU Device IDs Detected", "2901, 2901, 2901, 2901, 2901, 2901, 2901, 290") + \
        row("", "1, 2901") + row("DCGM Version", "4.5.0") + SECTION + row("memory", "Pass") + FOOT
    diag = dcgm.parse_diag(text)
    assert diag["metadata"]["GPU Device IDs Detected"] == "2901, 2901, 2901, 2901, 2901, 2901, 2901, 2901, 2901"
    assert diag["version"] == "4.5.0" and dcgm.passed(diag)


def test_classify_and_parse_result():
    assert dcgm.classify("+-----  Stress  ------------+------------------------------------------------+") == \
        ("section", "Stress")
    assert dcgm.classify("|-----  Deployment  --------+------------------------------------------------|") == \
        ("section", "Deployment")
    assert dcgm.classify(FOOT.strip()) == ("border", "-")
    assert dcgm.classify("| Warning") == ("row", ("Warning", "", True))
    assert dcgm.parse_result("Fail - GPUs: 0, 3   ") == ("Fail", [0, 3])
    assert dcgm.parse_result("Pass - All") == ("Pass", [])
    assert dcgm.parse_result("Passed") is None
    assert dcgm.parse_entity("GPU 12: Fail") == ("GPU", 12, "Fail")
