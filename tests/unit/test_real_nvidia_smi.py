"""nvidia-smi's answers as other people captured them (tests/data/real/smi-*): field lists, queries, errors.

The ``--query-gpu`` captures of nvidia_gpu_exporter hold the driver's answer to a long field list with
``--format=csv`` (a header, units on the values). Where a test needs the answer to OUR query, it is
projected from that CSV: the columns of our fields picked by the header's names, the units dropped
(``600.00 W`` -> ``600.00``), which is what ``--format=csv,noheader,nounits`` prints for the same
fields. Every test says what a person reading the capture sees.
"""

from __future__ import annotations

import re

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, nvidia_smi
from ansible_collections.gpunode.tuning.plugins.module_utils.families import (
    gpu_health,
    gpu_health_verify,
    gpu_settings,
    gpu_settings_verify,
)

QUERY_CAPTURES = {
    "smi-query-gpu-h100-590.48.01.txt": ("0000:00:09.0", "590.48.01"),
    "smi-query-gpu-h200-590.48.01.txt": ("0000:83:00.0", "590.48.01"),
    "smi-query-gpu-l40s-595.80.txt": ("0000:01:00.0", "595.80"),
    "smi-query-gpu-rtx2080s-610.57.04.txt": ("0000:0c:00.0", "610.57.04"),
}
HELP_CAPTURES = ("smi-help-query-gpu-h100-590.48.01.txt", "smi-help-query-gpu-l40s-595.80.txt",
                 "smi-help-query-gpu-rtx2080s-610.57.04.txt")


def project(text, fields):
    """Our ``--format=csv,noheader,nounits`` answer for ``fields``, out of a captured ``--format=csv`` answer."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = [re.sub(r" \[[^]]*\]$", "", h.strip()) for h in lines[0].split(",")]
    out = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        row = dict(zip(header, cells, strict=True))
        out.append(", ".join(re.sub(r" (W|MHz|%|MiB)$", "", row[f]) for f in fields))
    return "\n".join(out) + "\n"


def answered(health_text, fields, missing=()):
    return {"probe": "present", "health": {"rc": 0, "stdout": health_text, "stderr": "", "fields": list(fields),
                                           "missing": list(missing)}}


def facts_with(bdfs):
    devices = [{"bdf": b, "vendor": "0x10de", "class": "0x030200", "pcie": True, "responding": True,
                "link_speed": "32.0 GT/s", "link_speed_capable": "32.0 GT/s", "link_width": 16,
                "link_width_capable": 16} for b in bdfs]
    return {"pci": {"devices": devices, "nvidia_gpus": list(bdfs)}, "kernel_log": {"available": True, "xid_codes": {}}}


# --- --help-query-gpu: which fields a driver knows ---------------------------------------------------------


@pytest.mark.parametrize("name", HELP_CAPTURES)
def test_current_drivers_know_both_clock_reason_names_and_every_health_field(real, name):
    known = nvidia_smi.parse_help_fields(real(name).text)
    assert {"clocks_event_reasons.active", "clocks_throttle_reasons.active", "remapped_rows.pending",
            "pci.bus_id", "gpu_bus_id"} <= known  # "pci.bus_id" or "gpu_bus_id": both names of one field
    asked, missing = nvidia_smi.plan(nvidia_smi.HEALTH_FIELDS, known)
    assert missing == [] and all(field == name for field, name in asked)


def test_the_r465_era_driver_knows_only_the_throttle_name_and_no_remapped_rows(real):
    known = nvidia_smi.parse_help_fields(real("smi-help-query-gpu-r465-2021.txt").text)
    assert "clocks_throttle_reasons.active" in known and "clocks_event_reasons.active" not in known
    assert not any(f.startswith("remapped_rows.") for f in known)
    asked, missing = nvidia_smi.plan(nvidia_smi.HEALTH_FIELDS, known)
    # Exactly the fields this driver lacks cost their rows; the clock reasons are asked by their old name.
    assert missing == ["remapped_rows.pending", "remapped_rows.failure"]
    assert ("clocks_event_reasons.active", "clocks_throttle_reasons.active") in asked


def test_a_query_for_the_r465_driver_never_asks_a_field_it_refuses(real):
    known = nvidia_smi.parse_help_fields(real("smi-help-query-gpu-r465-2021.txt").text)
    seen = []

    def run(argv):  # a driver with exactly that field list, refusing as the real one does (stdout, exit 2)
        seen.append(argv)
        names = argv[1].split("=", 1)[1].split(",")
        bad = [n for n in names if n not in known]
        if bad:
            return command.Result(2, 'Field "%s" is not a valid field to query.\n\n' % bad[0], "")
        return command.Result(0, ", ".join("0" for _name in names) + "\n", "")
    answer = nvidia_smi.query(run, "nvidia-smi", nvidia_smi.HEALTH_FIELDS, known)
    assert len(seen) == 1 and answer["rc"] == 0
    assert answer["missing"] == ["remapped_rows.pending", "remapped_rows.failure"]
    assert "clocks_throttle_reasons.active" in seen[0][1]


def test_without_a_field_list_each_refusal_drops_or_renames_one_field_and_retries(real):
    known = nvidia_smi.parse_help_fields(real("smi-help-query-gpu-r465-2021.txt").text)
    calls = []

    def run(argv):
        calls.append(argv[1])
        names = argv[1].split("=", 1)[1].split(",")
        bad = [n for n in names if n not in known]
        if bad:
            return command.Result(2, 'Field "%s" is not a valid field to query.\n\n' % bad[0], "")
        return command.Result(0, "", "")
    answer = nvidia_smi.query(run, "nvidia-smi", nvidia_smi.HEALTH_FIELDS, None)
    assert answer["missing"] == ["remapped_rows.pending", "remapped_rows.failure"]
    assert len(calls) == 4  # remapped_rows.pending, .failure, then the event->throttle rename, then the answer
    assert "clocks_event_reasons.active" in answer["fields"] and "clocks_throttle_reasons.active" in calls[-1]


# --- --query-gpu answers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(QUERY_CAPTURES))
def test_a_real_answer_to_the_health_query_is_judged(real, name):
    bdf, driver = QUERY_CAPTURES[name]
    text = project(real(name).text, nvidia_smi.HEALTH_FIELDS)
    gpus = nvidia_smi.parse_health(text, list(nvidia_smi.HEALTH_FIELDS))
    assert [g["bdf"] for g in gpus] == [bdf] and gpus[0]["driver_version"] == driver
    facts = facts_with([bdf])
    facts["gpu_probe"] = answered(text, nvidia_smi.HEALTH_FIELDS)
    rows = {r["name"]: r for r in gpu_health_verify.evaluate(facts, {"gpu_health": {}}, None)}
    assert rows["gpu_count"]["state"] == "applied" and "nvidia_smi" not in rows
    assert rows["driver_version"]["running"] == driver
    assert rows["clocks_event"]["state"] == "applied"


def test_datacenter_gpus_have_ecc_the_geforce_answers_n_a(real):
    h100 = nvidia_smi.parse_health(project(real("smi-query-gpu-h100-590.48.01.txt").text, nvidia_smi.HEALTH_FIELDS),
                                   list(nvidia_smi.HEALTH_FIELDS))
    assert [r["state"] for r in gpu_health_verify.ecc_rows(h100)] == ["applied", "applied"]
    assert gpu_health_verify.power_row(h100)["running"] == "700.00 W"
    geforce = nvidia_smi.parse_health(
        project(real("smi-query-gpu-rtx2080s-610.57.04.txt").text, nvidia_smi.HEALTH_FIELDS),
        list(nvidia_smi.HEALTH_FIELDS))
    assert [r["state"] for r in gpu_health_verify.ecc_rows(geforce)] == ["not_applicable", "not_applicable"]
    assert gpu_health_verify.remap_row(geforce)["state"] == "applied"  # [N/A] is not a pending remap


def test_application_clocks_from_r590_are_reported_deprecated_not_unsupported(real):
    text = project(real("smi-query-gpu-l40s-595.80.txt").text, nvidia_smi.HEALTH_FIELDS)
    assert "[Requested functionality has been deprecated]" in text
    facts = facts_with(["0000:01:00.0"])
    facts["gpu_probe"] = answered(text, nvidia_smi.HEALTH_FIELDS)
    want = {"gpu_settings": {"application_clocks": {"memory": 9001, "graphics": 2520}}}
    row = gpu_settings_verify.evaluate(facts, want, None)[0]
    assert row["state"] == "unsupported" and "deprecated from R590 on" in row["reason"]
    assert "0000:01:00.0" in row["reason"]


def test_gpu_settings_refuses_application_clocks_a_r590_driver_deprecated(real):
    answer = project(real("smi-query-gpu-h200-590.48.01.txt").text, gpu_settings.FIELDS)

    def run(argv):
        return command.Result(0, answer, "")
    gpus = gpu_settings.read_gpus(run, "nvidia-smi")
    assert gpus[0]["app"] is None and gpus[0]["app_state"] == "deprecated" and gpus[0]["max_mem"] == 3201.0
    with pytest.raises(Exception, match=r"0000:83:00\.0 answers \[Requested functionality has been deprecated\]"):
        gpu_settings.clock_plan(gpus, {"app": {"memory": 3201, "graphics": 1980}, "locked": None}, set())


def test_an_old_noheader_answer_of_eight_gpus_parses_row_by_row(real):
    fields = ["index", "uuid", "name", "temperature.gpu", "utilization.gpu", "memory.used", "memory.total"]
    gpus, unparsed = nvidia_smi.parse_csv(real("smi-query-gpu-noheader-8gpu-gpustat-5.txt").text, fields)
    assert unparsed == [] and [g["index"] for g in gpus] == [str(i) for i in range(8)]
    assert gpus[1]["utilization.gpu"] == "86" and gpus[0]["name"] == "GeForce GTX TITAN X"


def test_an_answer_one_column_short_does_not_match_the_query(real):
    full = project(real("smi-query-gpu-h100-590.48.01.txt").text, nvidia_smi.HEALTH_FIELDS)
    short = full.rstrip("\n").rsplit(",", 1)[0] + "\n"
    facts = facts_with(["0000:00:09.0"])
    facts["gpu_probe"] = answered(short, nvidia_smi.HEALTH_FIELDS)
    rows = {r["name"]: r for r in gpu_health_verify.evaluate(facts, {"gpu_health": {}}, None)}
    assert rows["nvidia_smi"]["state"] == "drifted"
    assert "do not match the query of 19 field(s)" in rows["nvidia_smi"]["reason"]
    with pytest.raises(Exception, match="do not match the query"):
        gpu_settings.read_gpus(lambda argv: command.Result(0, short, ""), "nvidia-smi")


# --- errors ------------------------------------------------------------------------------------------------


def test_a_refused_field_is_read_from_stdout_as_the_real_driver_prints_it(real):
    line = real("smi-error-invalid-field-composable-resource-operator-37.txt").text
    # The operator logged exit code 2, stderr '' and this stdout (its quoting undone).
    stdout = re.search(r"stdout: '(.*)'\"", line).group(1).replace('\\"', '"').replace("\\n", "\n")
    result = command.Result(2, stdout, "")
    assert nvidia_smi.refused_field(result) == "device_minor"
    assert nvidia_smi.driver_down(result) is None  # a field the driver lacks is not a driver that is down


def exit9(real):
    """rc and stdout of the exporter's log line (its \\n escapes undone); stderr starts the same."""
    line = real("smi-error-exit9-nvidia-gpu-exporter-65.txt").text
    rc = int(re.search(r"code: (\d+)", line).group(1))
    stdout = re.search(r"stdout: (.*?) \| stderr:", line).group(1).replace("\\n", "\n")
    return command.Result(rc, stdout, stdout)


def test_exit_9_is_a_driver_that_does_not_answer_and_an_unhealthy_host(real):
    result = exit9(real)
    assert result.rc == 9 and nvidia_smi.driver_down(result).startswith("nvidia-smi failed (rc 9): NVIDIA-SMI has "
                                                                        "failed because it couldn't communicate")
    facts = facts_with(["0000:41:00.0"])
    facts["gpu_probe"] = {"probe": "present", "health": {"rc": 9, "stdout": result[1], "stderr": result[2]}}
    rows = {r["name"]: r for r in gpu_health_verify.evaluate(facts, {"gpu_health": {}}, None)}
    assert rows["nvidia_smi"]["state"] == "drifted" and "couldn't communicate" in rows["nvidia_smi"]["reason"]
    finding = gpu_health.health_findings({"settings": list(rows.values())})
    assert finding == ["gpu_health.nvidia_smi: " + rows["nvidia_smi"]["reason"]]
    # No NVIDIA GPU on the bus: not unhealthy, only unsupported.
    facts = facts_with([])
    facts["gpu_probe"] = {"probe": "present", "health": {"rc": 9, "stdout": result[1], "stderr": ""}}
    rows = {r["name"]: r for r in gpu_health_verify.evaluate(facts, {"gpu_health": {}}, None)}
    assert rows["nvidia_smi"]["state"] == "unsupported"


def test_gpu_settings_fails_naming_what_an_exit_9_nvidia_smi_printed(real):
    text = real("smi-error-exit9-gcp-compute-gpu-installation-18.txt").text
    with pytest.raises(Exception, match=r"rc 9\): NVIDIA-SMI has failed because it couldn't communicate"):
        gpu_settings.read_gpus(lambda argv: command.Result(9, text, ""), "nvidia-smi")


def test_the_man_page_says_9_is_the_driver_not_loaded(real):
    text = real("smi-man-return-codes-gpu-utils-88.txt").text
    codes = {int(m.group(1)): " ".join(m.group(2).split())
             for m in re.finditer(r"Return\s+code\s+(\d+)\s+-\s+(.*)", text)}
    assert codes[9] == "NVIDIA driver is not loaded" and codes[12].startswith("NVML Shared Library")
    assert nvidia_smi.DRIVER_DOWN_RC[9] == "NVIDIA driver is not loaded"


@pytest.mark.parametrize("name, bdf", [("smi-error-unknown-error-open-gpu-kernel-modules-387.txt", "0000:0B:00.0"),
                                       ("smi-error-gpu-lost-owod-81.txt", "0000:02:00.0")])
def test_a_lost_gpu_stops_the_conversation_and_is_named(real, name, bdf):
    text = real(name).text
    assert bdf in text
    result = command.Result(15, text, "")  # nvidia-smi(1): 15 is a GPU off the bus or otherwise inaccessible
    assert bdf in nvidia_smi.driver_down(result)
    # The same line inside an answer with rc 0 (other GPUs still listed) is an answer that does not match.
    rows, unparsed = nvidia_smi.parse_csv(text, list(nvidia_smi.HEALTH_FIELDS))
    assert rows == [] and unparsed == [text.strip()]


def test_a_gpu_the_driver_lists_but_the_bus_no_longer_shows_fails_the_count(real):
    text = project(real("smi-query-gpu-h200-590.48.01.txt").text, nvidia_smi.HEALTH_FIELDS)
    facts = facts_with(["0000:41:00.0"])  # the bus shows another GPU; the driver's 0000:83:00.0 is gone from it
    facts["gpu_probe"] = answered(text, nvidia_smi.HEALTH_FIELDS)
    row = {r["name"]: r for r in gpu_health_verify.evaluate(facts, {"gpu_health": {}}, None)}["gpu_count"]
    assert row["state"] == "drifted"
    assert "listed by the driver (nvidia-smi) but no longer on the PCI bus: 0000:83:00.0" in row["reason"]
    assert "on the bus but not listed by the driver (nvidia-smi): 0000:41:00.0" in row["reason"]
