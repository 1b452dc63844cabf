"""AER counters (issue 44): the sysfs files parsed from real captures, and the health gate's verdicts on a
simulated node: a fatal count on a GPU's bridge fails, a non-fatal one is reported then fails once it grows
since the guard's last reading, correctable errors fail above a rate per hour."""

from __future__ import annotations

import json
import os
import re

import simnode
from support.captures import REAL_CAPTURES

from ansible_collections.gpunode.tuning.plugins.module_utils.core import aer
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_health, gpu_health_verify

GPU, BRIDGE = "0000:41:00.0", "0000:40:01.1"


def _real(name):
    with open(os.path.join(REAL_CAPTURES, name), encoding="utf-8") as fh:
        return fh.read()


def test_kernel_abi_sample_names_with_spaces():
    text = _real("sysfs-aer-dev-abi-sample-linux-docs.txt")
    correctable, fatal = [part.split("\n", 1)[1] for part in text.split("localhost ")[1:]]
    parsed = aer.parse_counters(correctable)
    assert parsed["Receiver Error"] == 2 and parsed["RELAY_NUM Rollover"] == 0 and parsed[aer.TOTAL] == 2
    assert len(parsed) == 9
    assert aer.parse_counters(fatal)["TLP Prefix Blocked Error"] == 0 and len(aer.parse_counters(fatal)) == 18


def test_umockdev_record_of_a_real_machine():
    lines = dict(line[3:].split("=", 1) for line in _real(
        "sysfs-aer-resource-umockdev-amd-psp-fwupd.txt").splitlines() if line.startswith("A: aer_dev_"))
    assert sorted(lines) == ["aer_dev_correctable", "aer_dev_fatal", "aer_dev_nonfatal"]
    for name, flat in lines.items():
        text = re.sub(r"(?<=\d)(?=[A-Z])", "\n", flat)  # umockdev dropped the newlines
        parsed = aer.parse_counters(text)
        assert parsed[aer.TOTAL] == 0 and not any(k.startswith("TOTAL_ERR_") for k in parsed)
        assert len(parsed) == (9 if name == "aer_dev_correctable" else 19)
        assert "RxErr" in parsed if name == "aer_dev_correctable" else "PoisonTLPBlocked" in parsed
    assert aer.parse_counters("garbage\n") is None


def _rows(root, per_hour=None):
    facts = {"gpu_health": gpu_health_verify.read(Node(root))}
    rows = aer.rows(facts["gpu_health"]["aer"], per_hour, lambda n, d, r, s, why: (n, s, why))
    return {n: (s, why) for n, s, why in rows}


def _guard_left(root, when):
    """The guard's status as a run leaves it: this reading (without ``previous``), ``when`` seconds ago."""
    reading = gpu_health_verify.read(Node(root))["aer"]
    reading["time"] -= when
    path = os.path.join(root, aer.PREVIOUS_STATUS)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"aer": aer.stored(reading)}, fh)


def test_fatal_count_on_a_gpus_bridge_fails_naming_it(build_node):
    root = build_node(cpus=4, gpus=2)
    assert {n: s for n, (s, _w) in _rows(root).items()} == dict.fromkeys(
        ["aer_fatal", "aer_nonfatal", "aer_correctable"], "applied")
    simnode.set_aer(root, BRIDGE, "fatal", {"DLP": 1, "SDES": 2})
    state, why = _rows(root)["aer_fatal"]
    assert state == "drifted" and why == "bridge %s above GPU %s: DLP 1, SDES 2" % (BRIDGE, GPU)


def test_nonfatal_is_reported_at_first_sight_and_fails_once_it_grows(build_node):
    root = build_node(cpus=4, gpus=2)
    simnode.set_aer(root, GPU, "nonfatal", {"CmpltTO": 3})
    state, why = _rows(root)["aer_nonfatal"]
    assert state == "applied" and why.startswith("reported: GPU %s: CmpltTO 3 since boot" % GPU)
    assert "no earlier reading of this boot" in why
    _guard_left(root, 600)
    assert _rows(root)["aer_nonfatal"][0] == "applied"  # same counts as the guard's last reading
    simnode.set_aer(root, GPU, "nonfatal", {"CmpltTO": 5})
    state, why = _rows(root)["aer_nonfatal"]
    assert state == "drifted"
    assert why == "GPU %s: CmpltTO 2 more since the guard's last reading (CmpltTO 5 in all since boot)" % GPU


def test_another_boots_reading_is_no_baseline(build_node):
    root = build_node(cpus=4, gpus=2)
    simnode.set_aer(root, GPU, "nonfatal", {"CmpltTO": 3})
    _guard_left(root, 600)
    path = os.path.join(root, aer.PREVIOUS_STATUS)
    with open(path, encoding="utf-8") as fh:
        status = json.load(fh)
    status["aer"]["boot_id"] = "another boot"
    status["aer"]["devices"][GPU]["nonfatal"]["CmpltTO"] = 0
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(status, fh)
    assert _rows(root)["aer_nonfatal"][0] == "applied"


def test_correctable_fails_above_the_rate_per_hour(build_node):
    root = build_node(cpus=4, gpus=2)
    simnode.set_aer(root, BRIDGE, "correctable", {"RxErr": 40})
    assert _rows(root, per_hour=10)["aer_correctable"][0] == "applied"  # first sight: counts since boot
    _guard_left(root, 3600)
    simnode.set_aer(root, BRIDGE, "correctable", {"RxErr": 45, "BadTLP": 1})  # 6 in an hour
    state, why = _rows(root, per_hour=10)["aer_correctable"]
    assert state == "applied" and "RxErr 45" in why
    simnode.set_aer(root, BRIDGE, "correctable", {"Timeout": 20})  # 26 in an hour
    state, why = _rows(root, per_hour=10)["aer_correctable"]
    assert state == "drifted" and why.startswith("bridge %s above GPU %s: 26.0 per hour since the guard's last "
                                                 "reading, above 10" % (BRIDGE, GPU))
    assert _rows(root)["aer_correctable"][0] == "applied"  # no rate set: reported only


def test_no_counter_files_is_unsupported(build_node):
    root = build_node(cpus=4, gpus=2)
    for dirpath, _dirs, files in os.walk(os.path.join(root, "sys/devices")):
        for name in files:
            if name.startswith("aer_dev_"):
                os.unlink(os.path.join(dirpath, name))
    rows = _rows(root)
    assert {s for s, _w in rows.values()} == {"unsupported"} and "before 4.19" in rows["aer_fatal"][1]


def test_health_gate_and_the_rate_variable(build_node):
    root = build_node(cpus=4, gpus=2)
    simnode.set_aer(root, BRIDGE, "fatal", {"DLP": 1})
    facts = {"pci": {"devices": []}, "gpu_health": gpu_health_verify.read(Node(root))}
    rows = gpu_health_verify.evaluate(facts, {"gpu_health": {"aer_correctable_per_hour": 5}})
    fatal = [r for r in rows if r["name"] == "aer_fatal"][0]
    assert fatal["state"] == "drifted" and BRIDGE in fatal["reason"]
    assert gpu_health.health_findings({"settings": rows}) == [
        "gpu_health.aer_fatal: bridge %s above GPU %s: DLP 1" % (BRIDGE, GPU)]
    problems = gpu_health.desired_problems({"aer_correctable_per_hour": -1})
    assert problems and "aer_correctable_per_hour must be a number >= 0" in problems[0][1]
    assert gpu_health.desired_problems({"aer_correctable_per_hour": 0}) == []
    assert gpu_health.from_role({"gpunode_tuning_gpu_health_aer_correctable_per_hour": 12}, {})["gpu_health"][
        "aer_correctable_per_hour"] == 12.0


def test_the_precheck_names_the_rate_variable():
    from ansible_collections.gpunode.tuning.plugins.plugin_utils import desired_state

    var = "gpunode_tuning_gpu_health_aer_correctable_per_hour"
    lines = desired_state.desired_problems({"gpu_health": {"aer_correctable_per_hour": -1}}, {var})
    assert lines == ["value of %s: gpu_health.aer_correctable_per_hour must be a number >= 0 (correctable AER "
                     "errors per hour) or null, got -1" % var]
