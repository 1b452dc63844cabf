"""amd-smi and rocm-smi answers as other people captured them (tests/data/real/amd-smi-*, amd-rocm-smi-*).

Every capture is read by core/amd_smi.py and the test says what a person reading it sees: the GPUs, the
fields that are there and the ones that read N/A, and the finding where the answer is no whole JSON.
The captures span the JSON shapes of the releases: a list (ROCm 6.1 to 6.3, and the RX 6600 notes),
``{"gpu_data": [...]}`` (ROCm 6.4/7.x), the topology dicts of ROCm 6.1.0 and the links list after it.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_smi

REAL = os.path.join(os.path.dirname(__file__), "..", "data", "real")

# Every capture this module reads; test_every_amd_smi_capture_is_read_here keeps the list whole.
CAPTURES = (
    "amd-rocm-smi-showtopo-4gpu-pcie-cut-rocm-smi-lib-108.txt",
    "amd-rocm-smi-showtopo-8gpu-mi308x-warning-ms-swift.txt",
    "amd-smi-bad-pages-text-mi300x-rocm-blogs.txt",
    "amd-smi-default-view-dpx-mi300x-cut-amdsmi-132.txt",
    "amd-smi-error-json-invalid-parameter-rocm6-derived.txt",
    "amd-smi-error-json-invalid-parameter-rocm7.2-derived.txt",
    "amd-smi-error-stderr-invalid-value-rocm-systems-3606.txt",
    "amd-smi-error-text-invalid-parameter-rocm6.4.1-amdsmi-91.txt",
    "amd-smi-help-commands-rocm6.0-amdsmi-readme.txt",
    "amd-smi-help-xgmi-rocm6.2-amdsmi-readme.txt",
    "amd-smi-help-xgmi-rocm7.1-amdsmi-docs.txt",
    "amd-smi-list-text-kfd-partition-rocm6.3-changelog.txt",
    "amd-smi-list-text-mi210-ai-nic-rocm-systems-3654.txt",
    "amd-smi-list-text-mi300x-rocm-blogs.txt",
    "amd-smi-metric-json-list-rx6600-luckylinux.txt",
    "amd-smi-metric-json-watch-line-cut-rocm-systems-2720.txt",
    "amd-smi-metric-power-json-list-rocm6.1-changelog.txt",
    "amd-smi-static-json-gpu-data-mi210-device-metrics-exporter.txt",
    "amd-smi-static-json-list-rx6600-luckylinux.txt",
    "amd-smi-static-json-warnings-cut-rx7800xt-ajean-39.txt",
    "amd-smi-static-json-warnings-derived.txt",
    "amd-smi-topology-json-access-type-rocm6.1.1-changelog.txt",
    "amd-smi-topology-json-edited-invalid-rocm6.1.1-changelog.txt",
    "amd-smi-topology-json-list-1gpu-rx6600-luckylinux.txt",
    "amd-smi-topology-json-list-old-shape-rocm6.1-changelog.txt",
    "amd-smi-version-rocm6.1-changelog.txt",
    "amd-smi-version-rocm6.4.0-k8s-device-plugin-157.txt",
    "amd-smi-version-rocm6.4.1-mi300a-legacy-rocm-build-4759.txt",
    "amd-smi-xgmi-link-status-text-rocm6.4-changelog.txt",
    "amd-smi-xgmi-text-8gpu-mi300-rocm6.1-changelog.txt",
)


def text(real, name):
    return real(name).text


def test_every_amd_smi_capture_is_read_here_and_named_in_the_readme():
    on_disk = sorted(n for n in os.listdir(REAL) if n.startswith(("amd-smi-", "amd-rocm-smi-")))
    assert on_disk == sorted(CAPTURES)
    with open(os.path.join(REAL, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert [n for n in CAPTURES if "| %s |" % n not in readme] == []


# --- static: identity, PCIe maxima, RAS, power cap ----------------------------------------------------------


def test_the_gpu_data_shape_of_an_mi210_reads_its_ras_threshold_and_power_cap(real):
    answer = amd_smi.read_static(text(real, "amd-smi-static-json-gpu-data-mi210-device-metrics-exporter.txt"))
    assert answer["finding"] is None and answer["skipped"] == []
    (gpu,) = answer["gpus"]
    assert (gpu["gpu"], gpu["market_name"], gpu["device_id"]) == (0, "AMD Instinct MI210", "0x740f")
    assert (gpu["max_pcie_width"], gpu["max_pcie_speed_gts"], gpu["pcie_interface_version"]) == (16, 16.0, "Gen 4")
    assert gpu["bad_page_threshold"] == 655
    assert (gpu["power_cap_w"], gpu["power_cap_min_w"], gpu["power_cap_max_w"]) == (300, 0, 300)
    assert gpu["ecc_block_state"]["UMC"] == "ENABLED" and gpu["ecc_block_state"]["XGMI_WAFL"] == "DISABLED"
    assert (gpu["numa_node"], gpu["vram_mb"]) == (1, 65520)
    # The capture's "bus" has no bdf and there is no partition section: those rows only are missing.
    assert gpu["missing"] == ["bad_page_threshold_exceeded", "bdf", "compute_partition", "memory_partition"]


def test_a_consumer_gpu_without_ras_reads_n_a_as_missing_rows_not_zeros(real):
    (gpu,) = amd_smi.read_static(text(real, "amd-smi-static-json-list-rx6600-luckylinux.txt"))["gpus"]
    assert gpu["bdf"] == "0000:0b:00.0" and gpu["max_pcie_width"] == 16 and gpu["max_pcie_speed_gts"] == 16.0
    assert gpu["bad_page_threshold"] is None and gpu["ecc_block_state"] == {}  # "ecc_block_state": "N/A"
    assert gpu["compute_partition"] is None and gpu["memory_partition"] is None  # "partition": N/A both
    assert gpu["power_cap_w"] == 100 and gpu["power_cap_min_w"] == 94
    assert "bad_page_threshold" in gpu["missing"] and "power_cap_w" not in gpu["missing"]


def test_warning_lines_before_a_whole_json_are_skipped_and_kept(real):
    answer = amd_smi.read_static(text(real, "amd-smi-static-json-warnings-derived.txt"))
    assert answer["finding"] is None
    assert len(answer["skipped"]) == 4 and "SyntaxWarning: 'return' in a 'finally' block" in answer["skipped"][0]
    assert [g["market_name"] for g in answer["gpus"]] == ["AMD Instinct MI210"]


def test_warning_lines_before_a_cut_json_are_a_finding_not_a_traceback(real):
    answer = amd_smi.read_static(text(real, "amd-smi-static-json-warnings-cut-rx7800xt-ajean-39.txt"))
    assert answer["gpus"] == []
    assert answer["finding"].startswith("amd-smi printed invalid JSON: ")
    assert len(answer["skipped"]) == 4


# --- metric: ECC, PCIe link, perf level ---------------------------------------------------------------------


def test_metric_reads_ecc_totals_and_a_link_running_below_its_maximum(real):
    (gpu,) = amd_smi.read_metric(text(real, "amd-smi-metric-json-list-rx6600-luckylinux.txt"))["gpus"]
    assert (gpu["ecc_correctable"], gpu["ecc_uncorrectable"], gpu["ecc_deferred"]) == (0, 0, 0)
    assert gpu["ecc_blocks"] == {}  # "ecc_blocks": "N/A"
    assert (gpu["pcie_width"], gpu["pcie_speed_gts"]) == (8, 16.0)
    (static,) = amd_smi.read_static(text(real, "amd-smi-static-json-list-rx6600-luckylinux.txt"))["gpus"]
    assert gpu["pcie_width"] < static["max_pcie_width"]  # x8 of x16: what a downtrained-link check compares
    assert gpu["perf_level"] == "auto" and gpu["power_w"] == 6
    assert gpu["missing"] == ["pcie_replay_count", "xgmi_err"]


def test_the_rocm_6_1_answer_to_one_metric_group_costs_only_the_other_rows(real):
    answer = amd_smi.read_metric(text(real, "amd-smi-metric-power-json-list-rocm6.1-changelog.txt"))
    (gpu,) = answer["gpus"]
    assert answer["finding"] is None and gpu["power_w"] == 10  # {"value": 10, "unit": "W"}
    assert gpu["ecc_uncorrectable"] is None and "ecc_uncorrectable" in gpu["missing"]
    assert "power_w" not in gpu["missing"]


def test_a_prompt_line_before_a_cut_watch_answer_is_a_finding(real):
    answer = amd_smi.read_metric(text(real, "amd-smi-metric-json-watch-line-cut-rocm-systems-2720.txt"))
    assert answer["skipped"] == ["'CTRL' + 'C' to stop watching output:"]
    assert answer["finding"].startswith("amd-smi printed invalid JSON") and answer["gpus"] == []


# --- list and the default view: partitions counted as physical GPUs -----------------------------------------


def test_the_mi300x_list_text_reads_three_gpus_and_keeps_the_truncation_note(real):
    answer = amd_smi.read_list(text(real, "amd-smi-list-text-mi300x-rocm-blogs.txt"))
    assert [(g["gpu"], g["bdf"]) for g in answer["gpus"]] == [(0, "0000:05:00.0"), (1, "0000:26:00.0"),
                                                              (2, "0000:46:00.0")]
    assert answer["gpus"][0]["uuid"] == "afff74a1-0000-1000-8054-e92b0a5d57c8"
    assert answer["skipped"] == ["[output truncated]"] and answer["gpus"][0]["partition_id"] is None


def test_the_list_names_kfd_node_and_partition_ids(real):
    gpus = amd_smi.read_list(text(real, "amd-smi-list-text-kfd-partition-rocm6.3-changelog.txt"))["gpus"]
    assert [(g["bdf"], g["kfd_id"], g["node_id"], g["partition_id"]) for g in gpus] == [
        ("0000:23:00.0", 45412, 1, 0), ("0000:26:00.0", 59881, 2, 0)]
    assert all(g["missing"] == [] for g in gpus)


def test_an_ai_nic_in_the_list_is_not_a_gpu(real):
    gpus = amd_smi.read_list(text(real, "amd-smi-list-text-mi210-ai-nic-rocm-systems-3654.txt"))["gpus"]
    assert [g["bdf"] for g in gpus] == ["0000:23:00.0"]  # 0000:e2:00.0 is the AI_NIC


def test_dpx_partitions_are_counted_as_physical_gpus_against_the_bus(real):
    view = amd_smi.read_default_view(text(real, "amd-smi-default-view-dpx-mi300x-cut-amdsmi-132.txt"))
    gpus = view["gpus"]
    assert [(g["gpu"], g["bdf"], g["compute_partition"], g["memory_partition"]) for g in gpus] == [
        (0, "0000:05:00.0", "DPX", "NPS1"), (1, "0000:05:00.1", None, None), (2, "0000:26:00.0", "DPX", "NPS1")]
    assert [g["uec"] for g in gpus] == [0, 0, 0] and gpus[0]["oam_id"] == 7
    counted = amd_smi.count_against_bus(gpus, ["0000:05:00.0", "0000:26:00.0"])
    assert counted["partitions"] == 3 and counted["physical"] == ["0000:05:00.0", "0000:26:00.0"]
    assert counted["missing"] == [] and counted["unexpected"] == []
    # A third MI300X on the bus that amd-smi does not list is missing, whatever the partitions.
    assert amd_smi.count_against_bus(gpus, ["0000:05:00.0", "0000:26:00.0", "0000:46:00.0"])["missing"] == [
        "0000:46:00.0"]


# --- bad pages ------------------------------------------------------------------------------------------


def test_no_bad_pages_found_reads_zero_retired_pending_and_unreservable(real):
    answer = amd_smi.read_bad_pages(text(real, "amd-smi-bad-pages-text-mi300x-rocm-blogs.txt"))
    assert [(g["gpu"], g["retired"], g["pending"], g["unreservable"]) for g in answer["gpus"]] == [
        (0, 0, 0, 0), (1, 0, 0, 0)]
    assert answer["skipped"] == ["[output truncated]"]


def test_bad_pages_in_json_count_the_listed_pages_and_n_a_is_no_zero():
    answer = amd_smi.read_bad_pages('{"gpu_data": [{"gpu": 0, "retired": [{"page_address": "0x5000", '
                                    '"page_size": 4096, "status": "RESERVED"}], "pending": "No bad pages found.", '
                                    '"un_res": "N/A"}]}')
    (gpu,) = answer["gpus"]
    assert (gpu["retired"], gpu["pending"], gpu["unreservable"]) == (1, 0, None)
    assert gpu["pages"]["retired"] == ["0x5000"] and gpu["missing"] == ["unreservable"]


# --- links between GPUs ---------------------------------------------------------------------------------


def test_the_rocm_6_1_0_topology_dicts_read_as_links(real):
    gpus = amd_smi.read_topology(text(real, "amd-smi-topology-json-list-old-shape-rocm6.1-changelog.txt"))["gpus"]
    assert [(g["gpu"], [(lk["peer"], lk["link_type"], lk["link_status"], lk["weight"], lk["hops"])
                        for lk in g["links"]]) for g in gpus] == [
        (0, [(1, "PCIE", "DISABLED", 40, 2)]), (1, [(0, "PCIE", "DISABLED", 40, 2)])]


def test_the_links_list_names_peers_by_bdf(real):
    gpus = amd_smi.read_topology(text(real, "amd-smi-topology-json-access-type-rocm6.1.1-changelog.txt"))["gpus"]
    assert [(g["bdf"], g["links"][0]["peer_bdf"], g["links"][0]["link_status"]) for g in gpus] == [
        ("0000:08:00.0", "0000:44:00.0", "DISABLED"), ("0000:44:00.0", "0000:08:00.0", "DISABLED")]
    assert gpus[0]["links"][0]["weight"] is None  # -a -t asks access and type only


def test_one_gpu_has_no_links_but_itself(real):
    answer = amd_smi.read_topology(text(real, "amd-smi-topology-json-list-1gpu-rx6600-luckylinux.txt"))
    assert answer["gpus"] == [{"gpu": 0, "bdf": "0000:0b:00.0", "links": []}]


def test_published_json_with_trailing_commas_is_a_finding(real):
    answer = amd_smi.read_topology(text(real, "amd-smi-topology-json-edited-invalid-rocm6.1.1-changelog.txt"))
    assert answer["gpus"] == []
    assert answer["finding"] == ("amd-smi printed invalid JSON: Expecting property name enclosed in double quotes "
                                 "(line 14, column 13)")


def test_xgmi_link_status_counts_links_up_down_and_disabled(real):
    answer = amd_smi.read_xgmi_link_status(text(real, "amd-smi-xgmi-link-status-text-rocm6.4-changelog.txt"))
    assert answer["finding"] is None
    assert [(g["gpu"], g["bdf"], g["up"], g["down"], g["disabled"]) for g in answer["gpus"]] == [
        (0, "0000:08:00.0", 5, 2, 1), (1, "0000:44:00.0", 5, 2, 1)]
    assert answer["gpus"][0]["links"] == ["U", "U", "U", "U", "D", "U", "D", "X"]


def test_xgmi_link_status_in_the_rocm_7_json_wrapper():
    answer = amd_smi.read_xgmi_link_status('{"xgmi_metric": [], "link_status": [{"gpu": 3, "bdf": "0000:5C:00.0", '
                                           '"link_status": ["U", "D", "N/A"]}]}')
    (gpu,) = answer["gpus"]
    assert (gpu["bdf"], gpu["up"], gpu["down"], gpu["links"]) == ("0000:5c:00.0", 1, 1, ["U", "D", "N/A"])


def test_the_xgmi_metric_table_of_eight_mi300_gpus(real):
    gpus = amd_smi.read_xgmi_metric(text(real, "amd-smi-xgmi-text-8gpu-mi300-rocm6.1-changelog.txt"))["gpus"]
    assert [g["bdf"] for g in gpus] == ["0000:0c:00.0", "0000:22:00.0", "0000:38:00.0", "0000:5c:00.0",
                                        "0000:9f:00.0", "0000:af:00.0", "0000:bf:00.0", "0000:df:00.0"]
    assert {(g["bit_rate_gbps"], g["max_bandwidth_gbps"], g["link_type"]) for g in gpus} == {(32, 512, "XGMI")}


def test_rocm_smi_showtopo_of_eight_mi308x_on_xgmi_with_a_warning_line(real):
    topo = amd_smi.read_rocm_smi_showtopo(text(real, "amd-rocm-smi-showtopo-8gpu-mi308x-warning-ms-swift.txt"))
    assert topo["finding"] is None and len(topo["links"]) == 8 * 7
    assert {(lk["link_type"], lk["weight"], lk["hops"]) for lk in topo["links"]} == {("XGMI", 15, 1)}
    assert topo["warnings"] == ["WARNING: AMD GPU device(s) is/are in a low-power state. "
                                "Check power control/runtime_status"]
    assert [(n["gpu"], n["node"]) for n in topo["numa"]] == [(i, 0 if i < 4 else 1) for i in range(8)]


def test_rocm_smi_showtopo_of_four_gpus_behind_pcie(real):
    topo = amd_smi.read_rocm_smi_showtopo(text(real, "amd-rocm-smi-showtopo-4gpu-pcie-cut-rocm-smi-lib-108.txt"))
    assert len(topo["links"]) == 12 and {(lk["link_type"], lk["weight"], lk["hops"]) for lk in topo["links"]} == {
        ("PCIE", 52, 3)}
    assert topo["numa"] == []  # the capture is cut after the Numa Nodes header


# --- the calls: which release accepts what --------------------------------------------------------------


def test_rocm_6_0_has_no_xgmi_command_6_2_no_link_status_7_1_both(real):
    assert "xgmi" not in amd_smi.parse_help(text(real, "amd-smi-help-commands-rocm6.0-amdsmi-readme.txt"))["commands"]
    assert {"bad-pages", "topology", "metric", "static", "list"} <= amd_smi.parse_help(
        text(real, "amd-smi-help-commands-rocm6.0-amdsmi-readme.txt"))["commands"]
    old = text(real, "amd-smi-help-xgmi-rocm6.2-amdsmi-readme.txt")
    new = text(real, "amd-smi-help-xgmi-rocm7.1-amdsmi-docs.txt")
    assert amd_smi.xgmi_link_status_known(None, old) is False and amd_smi.xgmi_link_status_known(None, new) is True
    assert ("xgmi_link_status", ["xgmi", "-l", "--json"]) not in amd_smi.plan(None, old)
    assert ("xgmi_link_status", ["xgmi", "-l", "--json"]) in amd_smi.plan(None, new)


@pytest.mark.parametrize("name,rocm,tool,link_status", [
    ("amd-smi-version-rocm6.1-changelog.txt", (6, 1, 0), "23.4.2+505b858", False),
    ("amd-smi-version-rocm6.4.0-k8s-device-plugin-157.txt", (6, 4, 0), "25.3.0+ede62f2", True),
    ("amd-smi-version-rocm6.4.1-mi300a-legacy-rocm-build-4759.txt", (6, 4, 1), "25.4.2+aca1101", True),
])
def test_the_version_line_decides_the_plan(real, name, rocm, tool, link_status):
    version = amd_smi.read_version(text(real, name))
    assert version["rocm_release"] == rocm and version["tool"] == tool
    assert amd_smi.xgmi_link_status_known(version["rocm_release"]) is link_status
    names = [n for n, _argv in amd_smi.plan(version["rocm_release"])]
    assert names[:5] == ["list", "static", "metric", "bad_pages", "topology"]
    assert ("xgmi_link_status" in names) is link_status
    assert all(argv[-1] == "--json" and "-g" not in argv for _n, argv in amd_smi.plan(version["rocm_release"]))


def test_a_release_that_refuses_an_option_is_told_apart_from_a_failure():
    refusal = (2, "", "usage: amd-smi xgmi [-h] ...\namd-smi xgmi: error: unrecognized arguments: -l\n")
    assert amd_smi.refused(refusal) is True
    assert amd_smi.refusal(refusal) == "amd-smi xgmi: error: unrecognized arguments: -l"
    assert amd_smi.refused((1, "", "ERROR:root:Unable to detect any GPU devices")) is False
    assert amd_smi.refused((0, "[]", "")) is False


@pytest.mark.parametrize(("name", "rc", "stream", "code"), [
    ("amd-smi-error-json-invalid-parameter-rocm6-derived.txt", 0, 1, -2),  # up to 7.1: stdout, exit 0
    ("amd-smi-error-json-invalid-parameter-rocm6-derived.txt", 254, 1, -2),  # the same document, exit non-zero
    ("amd-smi-error-json-invalid-parameter-rocm7.2-derived.txt", 195, 2, 195),  # renumbered, with error_type
])
def test_amd_smis_own_error_document_for_an_option_it_lacks_is_a_refusal_whatever_its_exit(real, name, rc, stream,
                                                                                           code):
    document = text(real, name)
    result = [rc, "", ""]
    result[stream] = document + "\n"
    why = amd_smi.refusal(tuple(result))
    assert why is not None and why.startswith("Parameter '-l' is invalid.") and why.endswith("(code %d)" % code)
    # Read as a command's answer it is amd-smi's error, never "no GPU list".
    reading = amd_smi.read_xgmi_link_status(document)
    assert reading["gpus"] == []
    assert reading["finding"] == ("amd-smi answered with its own error, not the GPUs: Parameter '-l' is invalid. "
                                  "Run '%s' for more info. (code %d)" % ("--help" if code == -2 else "amd-smi xgmi -h",
                                                                         code))


def test_the_text_refusal_of_a_vm_is_a_refusal_and_an_invalid_value_is_not(real):
    vm = text(real, "amd-smi-error-text-invalid-parameter-rocm6.4.1-amdsmi-91.txt")
    assert amd_smi.refusal((0, vm, "")) == ("Parameter '--compute-partition cpx' is invalid. Run '--help' for more "
                                            "info. (code -2)")
    invalid = text(real, "amd-smi-error-stderr-invalid-value-rocm-systems-3606.txt").splitlines()
    doc = amd_smi.error_document(invalid[0])
    assert (doc["code"], doc["refusal"]) == (-5, False)
    assert doc["error"].startswith("Value '-1' is not of valid type or format.")  # the exception's name is cut
    assert amd_smi.refusal((int(invalid[1]), "", invalid[0] + "\n")) is None  # a bad value is a failure
    assert amd_smi.read_static(invalid[0])["finding"].endswith("Run 'amd-smi static -h' for more info. (code -5)")


def test_other_error_documents_and_gpu_data_are_no_refusal():
    assert amd_smi.refusal((0, '{"error": "AMDSMI has returned error \'-1002\' - \'Command not supported\'", '
                               '"code": -1002}', "")) is None
    assert amd_smi.refusal((0, '{"gpu_data": [{"gpu": 0, "error": "N/A"}]}', "")) is None
    assert amd_smi.error_document('[{"gpu": 0}]') is None
    assert amd_smi.refusal((0, '{"error": "Command \'bad-pages\' is not supported on the system. Run \'--help\' '
                               'for more info.", "code": -7}', "")).endswith("(code -7)")


# --- values ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw,expected", [
    (16, 16), ({"value": 16, "unit": "GT/s"}, 16), ("16 GT/s", 16), ("1 W", 1), ("0.5 W", 0.5),
    ("N/A", None), ({"value": "N/A", "unit": "mV"}, None), ("50000-100000", None), (True, None), (None, None),
])
def test_numbers_are_read_from_every_form_amd_smi_prints(raw, expected):
    assert amd_smi.number(raw) == expected


@pytest.mark.parametrize("raw,expected", [
    ("0000:0B:00.0", "0000:0b:00.0"), ("00000000:41:00.0", "0000:41:00.0"), ("41:00.0", "0000:41:00.0"),
    ("0002:00:00.0", "0002:00:00.0"), ("N/A", None), ("card0", None),
])
def test_bdfs_read_as_sysfs_writes_them(raw, expected):
    assert amd_smi.normalize_bdf(raw) == expected


def test_an_older_release_prints_one_gpu_as_a_bare_object_and_other_names():
    # ROCm 6.0: no list around one GPU, "total_uncorrectable", "current_lanes", "ecc_block" with bare names.
    answer = amd_smi.read_metric('{"gpu": 0, "ecc": {"total_correctable": 3, "total_uncorrectable": 1}, '
                                 '"ecc_block": {"UMC": {"correctable": 3, "uncorrectable": 1}}, '
                                 '"pcie": {"current_lanes": 16, "current_speed": 32000}}')
    (gpu,) = answer["gpus"]
    assert (gpu["ecc_correctable"], gpu["ecc_uncorrectable"], gpu["ecc_deferred"]) == (3, 1, None)
    assert gpu["ecc_blocks"] == {"UMC": {"correctable": 3, "uncorrectable": 1, "deferred": None}}
    assert (gpu["pcie_width"], gpu["pcie_speed_gts"]) == (16, 32.0)  # MT/s read as GT/s


def test_no_json_at_all_and_json_without_gpus_are_findings():
    assert amd_smi.read_metric("")["finding"] == "amd-smi printed no JSON (empty output)"
    assert amd_smi.read_metric("ERROR: no GPUs")["finding"] == "amd-smi printed no JSON (first line 'ERROR: no GPUs')"
    assert amd_smi.read_metric('{"cpu_data": []}')["finding"].startswith("amd-smi's JSON holds no GPU list")
    assert amd_smi.read_metric('[{"gpu": 0}]\n[{"gpu": 1}]')["finding"].startswith("amd-smi printed more after")
