"""gpu_settings: persistence mode and power limits through nvidia-smi (simnode's stand-in), journaled, rolled back."""

from __future__ import annotations

import json
import os

import pytest
import simnode

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_settings, family
from ansible_collections.gpunode.tuning.plugins.module_utils.core import calls as core_calls
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_settings, gpu_settings_verify

JOURNAL = "/var/lib/gpunode-tuning/journal.json"


def _table(root):
    with open(os.path.join(root, simnode.SMI_STATE)) as fh:
        return {g["pci.bus_id"].lower()[4:]: g for g in json.load(fh)["gpus"]}


@pytest.fixture
def node(build_node):
    # persistenced=False preset behaviour: the stand-in's GPUs start with persistence off.
    root = build_node(cpus=4, nvidia_smi=True)
    path = os.path.join(root, simnode.SMI_STATE)
    with open(path) as fh:
        table = json.load(fh)
    for g in table["gpus"]:
        g["persistence_mode"] = "Disabled"
    with open(path, "w") as fh:
        fh.write(json.dumps(table, indent=1) + "\n")  # the stand-in's own format
    return root


def test_apply_rerun_and_rollback(node, run_module, digest):
    before = digest(node)
    args = {"root": node, "journal": JOURNAL, "persistence": True, "power_limit": 450,
            "power_limits": {"41:00.0": 500}}
    result, failed = run_module("gpu_settings", args)
    assert not failed and result["changed"]
    table = _table(node)
    assert table["0000:41:00.0"]["power.limit"] == "500.00" and table["0000:61:00.0"]["power.limit"] == "450.00"
    assert {g["persistence_mode"] for g in table.values()} == {"Enabled"}
    journal = json.load(open(os.path.join(node, JOURNAL.lstrip("/"))))
    assert journal["families"]["gpu_settings"]["power_limit:0000:41:00.0"]["original"] == 600.0
    assert journal["families"]["gpu_settings"]["persistence:0000:41:00.0"]["original"] == "Disabled"
    # Rerun: nothing to do.
    again, failed = run_module("gpu_settings", args)
    assert not failed and not again["changed"] and again["changes"] == []
    # Rollback: every original back, the journal gone, the node byte-identical.
    restored, failed = run_module("gpu_settings", {"root": node, "journal": JOURNAL, "restore": True})
    assert not failed and restored["changed"]
    assert {g["power.limit"] for g in _table(node).values()} == {"600.00"}
    assert digest(node) == before


def test_check_mode_writes_nothing_and_says_what_would_change(node, run_module, digest):
    before = digest(node)
    result, failed = run_module("gpu_settings", {"root": node, "journal": JOURNAL, "power_limit": 300}, check=True,
                                diff=True)
    assert not failed and result["changed"] and len(result["changes"]) == 8
    assert result["diff"]["after"]["0000:41:00.0 power_limit"] == 300
    assert digest(node) == before


@pytest.mark.parametrize("args, error", [
    ({"power_limit": 9999}, "power limit 9999 W for 0000:01:00.0 is outside its range 150-600 W; nothing was changed"),
    ({"power_limit": 0}, "power_limit must be a whole number of watts > 0"),
    ({"power_limits": {"42:00.0": 300}}, "nvidia-smi lists no GPU at 0000:42:00.0"),
    ({"power_limits": {"gpu0": 300}}, "power_limits: 'gpu0' is not a PCI address"),
])
def test_bad_input_fails_before_any_write(node, run_module, digest, args, error):
    before = digest(node)
    result, failed = run_module("gpu_settings", dict(args, root=node, journal=JOURNAL))
    assert failed and error in result["msg"]
    assert digest(node) == before


def test_a_node_without_nvidia_smi_is_refused_by_name(build_node, run_module):
    root = build_node(cpus=4)
    result, failed = run_module("gpu_settings", {"root": root, "persistence": True})
    assert failed and "has no nvidia-smi" in result["msg"]


def test_boot_reapplies_without_a_journal(node):
    ok, msg = gpu_settings.boot(Node(node), {"power_limit": 400})
    assert ok and "0000:41:00.0 power_limit 400" in msg
    assert not os.path.exists(os.path.join(node, JOURNAL.lstrip("/")))
    assert gpu_settings.boot(Node(node), {"power_limit": 400}) == (True, "GPU settings already in place")


def _live_call(responses, calls, **params):
    """A Call on a 'live' node whose commands are faked: systemctl has the nvidia-persistenced unit."""
    def run(argv):
        calls.append(argv)
        for prefix, answer in responses:
            if argv[1:1 + len(prefix)] == prefix:
                return answer
        return 0, "", ""

    class Lookup:
        @staticmethod
        def get_bin_path(name):
            return "/usr/bin/" + name

    return family.Call(params=dict(params, root="/", journal=None, restore=False), run_command=run, lookup=Lookup())


def test_persistence_goes_through_the_daemon_where_it_is_installed(monkeypatch):
    monkeypatch.setattr(Node, "check_root", lambda self: None)
    query = "0, 00000000:41:00.0, Disabled, 600.00, 150.00, 600.00, 180, 2430, 14001, 3090, 14001\n"
    calls = []
    responses = [(["--query-gpu=" + ",".join(gpu_settings.FIELDS)], (0, query, "")),
                 (["list-unit-files"], (0, "nvidia-persistenced.service disabled enabled\n", "")),
                 (["is-enabled"], (1, "", "")), (["is-active"], (3, "", ""))]
    result = gpu_settings.run(_live_call(responses, calls, persistence=True))
    assert ["/usr/bin/systemctl", "enable", "--now", "nvidia-persistenced.service"] in calls
    assert not any("-pm" in c for c in calls)
    assert result["changes"][-1]["setting"] == "nvidia-persistenced"


def test_evaluate_reads_the_health_query():
    line = ("0, 00000000:41:00.0, Enabled, Enabled, Enabled, 0, 0, No, No, No, 450.00, 600.00, 600.00, "
            "0x0000000000000001, 0, 570.124.06")
    facts = {"gpu_probe": {"probe": "present", "health": {"rc": 0, "stdout": line}}}
    rows = {r["name"]: r for r in gpu_settings_verify.evaluate(facts, {"gpu_settings": {"persistence": True,
                                                                                        "power_limit": 400}}, None)}
    assert rows["persistence"]["state"] == "applied"
    assert rows["power_limit"]["state"] == "drifted" and "0000:41:00.0 450.00 W of 400 W" in rows["power_limit"][
        "reason"]
    assert rows["persistence_mode"]["state"] == "not_applicable"  # the health query alone lists no GPU
    # Nothing desired: only persistence_mode (verification's former gpu.persistence_mode), whatever is desired.
    assert [(r["name"], r["state"]) for r in gpu_settings_verify.evaluate({}, {}, None)] == [
        ("persistence_mode", "not_applicable")]
    missing = gpu_settings_verify.evaluate({}, {"gpu_settings": {"persistence": True}}, None)
    assert missing[0]["state"] == "not_applicable"


def test_a_root_that_is_not_a_node_and_an_escaping_journal_are_refused(node, run_module, digest, tmp_path):
    result, failed = run_module("gpu_settings", {"root": str(tmp_path / "no-such-node"), "power_limit": 300})
    assert failed and "does not exist" in result["msg"]
    before = digest(node)
    result, failed = run_module("gpu_settings", {"root": node, "power_limit": 300,
                                                 "journal": "/var/lib/../../../outside/journal.json"})
    assert failed and "outside the node root" in result["msg"]
    assert digest(node) == before and not (tmp_path / "outside").exists()


def test_restore_without_journaled_gpu_settings_passes_on_a_node_without_nvidia_smi(build_node, run_module):
    root = build_node(cpus=4)
    result, failed = run_module("gpu_settings", {"root": root, "journal": JOURNAL, "restore": True})
    assert not failed and not result["changed"] and result["changes"] == []


# --- clocks: locked graphics clocks (-lgc/-rgc) and application clocks (-ac/-rac) ---

CLOCKS = {"locked_clocks": {"min": 1980, "max": 1980}, "application_clocks": {"memory": 14001, "graphics": 1800}}


def test_clocks_apply_rerun_and_rollback(node, run_module, digest):
    before = digest(node)
    args = dict(CLOCKS, root=node, journal=JOURNAL)
    result, failed = run_module("gpu_settings", args)
    assert not failed and result["changed"] and len(result["changes"]) == 16
    table = _table(node)
    assert {g["clocks.current.graphics"] for g in table.values()} == {"1980"}  # the lock holds an idle GPU at min
    assert {(g["clocks.applications.memory"], g["clocks.applications.graphics"]) for g in table.values()} == {
        ("14001", "1800")}
    assert {g["application_clocks"]["graphics"] for g in result["gpus"]} == {1800}  # read back through the query
    entries = json.load(open(os.path.join(node, JOURNAL.lstrip("/"))))["families"]["gpu_settings"]
    assert entries["locked_clocks:0000:41:00.0"]["original"] == "unlocked"
    assert entries["application_clocks:0000:41:00.0"]["original"] == "14001,2430"
    again, failed = run_module("gpu_settings", args)
    assert not failed and not again["changed"] and again["changes"] == []
    restored, failed = run_module("gpu_settings", {"root": node, "journal": JOURNAL, "restore": True})
    assert not failed and restored["changed"]
    assert {g["clocks.current.graphics"] for g in _table(node).values()} == {str(simnode.SMI_IDLE_CLOCK)}
    assert digest(node) == before


def test_a_lock_lost_behind_the_journal_is_sent_again(node, run_module):
    args = {"root": node, "journal": JOURNAL, "locked_clocks": {"min": 1500, "max": 2000}}
    assert run_module("gpu_settings", args)[0]["changed"]
    # A driver reload drops the lock; the journal still holds it: the clock outside the range tells.
    rc = os.system("%s/usr/bin/nvidia-smi -i 0 -rgc >/dev/null" % node)
    assert rc == 0
    again, failed = run_module("gpu_settings", args)
    assert not failed and [c["gpu"] for c in again["changes"]] == ["0000:01:00.0"]


def test_clocks_check_mode_writes_nothing(node, run_module, digest):
    before = digest(node)
    result, failed = run_module("gpu_settings", dict(CLOCKS, root=node, journal=JOURNAL), check=True, diff=True)
    assert not failed and result["changed"] and len(result["changes"]) == 16
    assert result["diff"]["after"]["0000:41:00.0 locked_clocks"] == {"min": 1980, "max": 1980}
    assert result["diff"]["before"]["0000:41:00.0 application_clocks"] == {"memory": 14001, "graphics": 2430}
    assert digest(node) == before


@pytest.mark.parametrize("args, error", [
    ({"locked_clocks": {"min": 2000, "max": 1500}}, "locked_clocks: min 2000 MHz is above max 1500 MHz; allowed: "
                                                    "min <= max"),
    ({"locked_clocks": {"min": 1500}}, "locked_clocks must be a map {min: MHz, max: MHz} of whole MHz > 0"),
    ({"locked_clocks": {"min": "fast", "max": 1500}}, "locked_clocks.min must be a whole number of MHz > 0"),
    ({"locked_clocks": {"min": 1500, "max": 4000}}, "locked_clocks.max 4000 MHz for 0000:01:00.0 is above its "
                                                    "clocks.max.graphics 3090 MHz; allowed: 1-3090 MHz"),
    ({"application_clocks": {"memory": 20000, "graphics": 1800}}, "application_clocks.memory 20000 MHz for "
                                                                  "0000:01:00.0 is above its clocks.max.memory"),
    ({"application_clocks": {"memory": 14001, "graphics": 1800, "sm": 1}}, "application_clocks must be a map "
                                                                           "{memory: MHz, graphics: MHz}"),
    # a bad clock stops the power limit too: nothing is half-applied
    ({"power_limit": 300, "locked_clocks": {"min": 1, "max": 9999}}, "nothing was changed"),
])
def test_bad_clocks_fail_before_any_write(node, run_module, digest, args, error):
    before = digest(node)
    result, failed = run_module("gpu_settings", dict(args, root=node, journal=JOURNAL))
    assert failed and error in result["msg"]
    assert digest(node) == before


def test_a_gpu_without_application_clocks_is_refused_by_name(node, run_module, digest):
    path = os.path.join(node, simnode.SMI_STATE)
    table = json.load(open(path))
    table["gpus"][2]["clocks.applications.memory"] = "[N/A]"
    with open(path, "w") as fh:
        fh.write(json.dumps(table, indent=1) + "\n")
    before = digest(node)
    result, failed = run_module("gpu_settings", dict(CLOCKS, root=node, journal=JOURNAL))
    assert failed and "reports no application clocks ([N/A])" in result["msg"]
    assert digest(node) == before


def test_boot_reapplies_clocks_without_a_journal(node):
    ok, msg = gpu_settings.boot(Node(node), CLOCKS)
    assert ok and "0000:41:00.0 locked_clocks" in msg and "0000:41:00.0 application_clocks" in msg
    assert not os.path.exists(os.path.join(node, JOURNAL.lstrip("/")))
    assert {g["clocks.current.graphics"] for g in _table(node).values()} == {"1980"}
    ok, msg = gpu_settings.boot(Node(node), CLOCKS)
    assert ok and "application_clocks" not in msg  # already set; the lock cannot be read, so it is sent again


def test_evaluate_clock_rows_from_the_health_query():
    base = ("0, 00000000:41:00.0, Enabled, Enabled, Enabled, 0, 0, No, No, No, 450.00, 600.00, 600.00, "
            "0x0000000000000001, 0, 570.124.06, ")
    want = {"gpu_settings": CLOCKS}

    def rows(tail):
        facts = {"gpu_probe": {"probe": "present", "health": {"rc": 0, "stdout": base + tail}}}
        return {r["name"]: r for r in gpu_settings_verify.evaluate(facts, want, None)}

    good = rows("1980, 1800, 14001")
    assert good["locked_clocks"]["state"] == "applied" and good["application_clocks"]["state"] == "applied"
    bad = rows("180, 2430, 14001")
    assert bad["locked_clocks"]["state"] == "drifted" and "0000:41:00.0 180 MHz" in bad["locked_clocks"]["reason"]
    assert bad["application_clocks"]["state"] == "drifted"
    missing = gpu_settings_verify.evaluate({}, want, None)
    assert {r["name"]: r["state"] for r in missing} == {"locked_clocks": "not_applicable",
                                                        "application_clocks": "not_applicable",
                                                        "persistence_mode": "not_applicable"}


# --- AMD Instinct (the simulated MI300X node's amd-smi stand-in keeps what `amd-smi set` changes) ---

AMD = "mi300x-epyc-8gpu"


def _amd_state(root):
    with open(os.path.join(root, simnode.AMD_SMI_STATE)) as fh:
        answers = json.load(fh)["answers"]
    static, metric = json.loads(answers["static"])["gpu_data"], json.loads(answers["metric"])["gpu_data"]
    return ({g["bus"]["bdf"]: g["limit"]["socket_power"]["value"] for g in static},
            {s["bus"]["bdf"]: m["perf_level"] for s, m in zip(static, metric, strict=True)})


def _amd_calls(monkeypatch):
    """Record every argv the module runs (the runner still runs them)."""
    calls = []
    real = core_calls.run_argv

    def spy(argv, *a, **kw):
        calls.append(list(argv))
        return real(argv, *a, **kw)
    monkeypatch.setattr(core_calls, "run_argv", spy)
    return calls


def test_amd_power_cap_and_perf_level_apply_rerun_and_rollback(build_node, run_module, digest):
    root = build_node(AMD, cpus=4, amd_smi=True)
    before = digest(root)
    caps, _levels = _amd_state(root)
    first, second = sorted(caps)[:2]
    args = {"root": root, "journal": JOURNAL, "power_limit": 650, "power_limits": {first: 600},
            "perf_level": "stable_peak"}
    result, failed = run_module("gpu_settings", args)
    assert not failed, result
    assert result["changed"] and {c["vendor"] for c in result["changes"]} == {"amd"}
    caps, levels = _amd_state(root)
    assert caps[first] == 600 and caps[second] == 650 and len(caps) == 8
    assert set(levels.values()) == {"AMDSMI_DEV_PERF_LEVEL_STABLE_PEAK"}
    assert {g["power_limit"] for g in result["gpus"]} == {600.0, 650.0}
    journal = json.load(open(os.path.join(root, JOURNAL.lstrip("/"))))["families"]["gpu_settings"]
    assert journal["amd_power_cap:%s" % first]["original"] == 750.0
    assert journal["amd_perf_level:%s" % first]["original"] == "auto"
    again, failed = run_module("gpu_settings", args)
    assert not failed and not again["changed"] and again["changes"] == []
    restored, failed = run_module("gpu_settings", {"root": root, "journal": JOURNAL, "restore": True})
    assert not failed and restored["changed"], restored
    assert digest(root) == before


def test_amd_settings_check_mode_writes_nothing(build_node, run_module, digest):
    root = build_node(AMD, cpus=4, amd_smi=True)
    before = digest(root)
    result, failed = run_module("gpu_settings", {"root": root, "journal": JOURNAL, "power_limit": 700,
                                                 "perf_determinism_mhz": 1900}, check=True)
    assert not failed and result["changed"]
    assert {c["setting"] for c in result["changes"]} == {"power_limit", "perf_level"}
    assert {c["after"] for c in result["changes"] if c["setting"] == "perf_level"} == {"determinism"}
    assert digest(root) == before


def test_amd_set_is_one_call_per_value_for_the_gpus_that_differ():
    gpus = [{"bdf": "0000:%02x:00.0" % b, "index": i, "limit": 750.0, "min": 0, "max": 750, "perf_level": "auto"}
            for i, b in enumerate((0x05, 0x26, 0x46))]
    gpus[1]["limit"] = 600.0
    want = gpu_settings.validate({"power_limit": 600, "perf_determinism_mhz": 1900})
    steps = amd_settings.amd_plan(gpus, want)
    argvs = [a for a, _m in amd_settings.amd_argvs("amd-smi", gpus, steps, 1900)]
    assert argvs == [["amd-smi", "set", "-g", "0", "1", "2", "--perf-determinism", "1900"],
                     ["amd-smi", "set", "-g", "0", "2", "--power-cap", "600"]]


@pytest.mark.parametrize("raw,watts", [({"value": 750, "unit": "W"}, 750.0), ("750 W", 750.0),
                                       ({"value": 750000000, "unit": "uW"}, 750.0), (750000000, 750.0),
                                       (750, 750.0), ("N/A", None)])
def test_amd_power_cap_reads_watts_and_microwatts(raw, watts):
    assert amd_settings.amd_watts(raw) == watts


def test_amd_bad_input_and_out_of_range_cap_fail_before_any_write(build_node, run_module, digest):
    root = build_node(AMD, cpus=4, amd_smi=True)
    before = digest(root)
    result, failed = run_module("gpu_settings", {"root": root, "journal": JOURNAL, "perf_level": "turbo"})
    assert failed and "perf_level must be one of auto" in result["msg"]
    result, failed = run_module("gpu_settings", {"root": root, "journal": JOURNAL, "power_limit": 900})
    assert failed and "outside its range 0-750 W" in result["msg"]
    assert digest(root) == before


def test_amd_set_refused_is_reported_and_stays_rollbackable(build_node, run_module):
    root = build_node(AMD, cpus=4, amd_smi=True, amd_smi_mode="set_refused")
    result, failed = run_module("gpu_settings", {"root": root, "journal": JOURNAL, "power_limit": 700})
    assert failed and "AMDSMI_STATUS_NO_PERM" in result["msg"] and "--power-cap 700" in result["msg"]
    journal = json.load(open(os.path.join(root, JOURNAL.lstrip("/"))))["families"]["gpu_settings"]
    assert len([k for k in journal if k.startswith("amd_power_cap:")]) == 8


@pytest.mark.parametrize(("rc", "out", "err", "words"), [
    # amd-smi up to ROCm 7.1: its refusal on stdout, exit 0 -- nothing was set, however the exit reads.
    (0, '{"error": "Parameter \'--perf-determinism\' is invalid. Run \'--help\' for more info.", "code": -2}\n', "",
     "set -g 0 1 --perf-determinism 1900: this amd-smi does not offer it (Parameter '--perf-determinism' is "
     "invalid. Run '--help' for more info. (code -2))"),
    # Another error document with exit 0 (a library error) is a failure too, in amd-smi's words.
    (0, '{"error": "AMDSMI has returned error \'-1010\' - \'Permission Denied\'", "code": -1010}\n', "",
     "set -g 0 1 --perf-determinism 1900: amd-smi rc 0: AMDSMI has returned error '-1010' - 'Permission Denied' "
     "(code -1010)"),
    (0, "", "", None),
])
def test_an_amd_smi_set_answered_with_an_error_document_and_exit_0_is_not_taken_as_applied(rc, out, err, words):
    gpus = [{"bdf": "0000:05:00.0", "index": 0}, {"bdf": "0000:26:00.0", "index": 1}]
    steps = [(g["bdf"], "perf_level", "auto", "determinism") for g in gpus]
    seen = []

    def run(argv):
        seen.append(argv)
        return rc, out, err
    failed = amd_settings.amd_execute(family.Call(params={}, run_command=run), "amd-smi", gpus, steps, 1900)
    assert seen == [["amd-smi", "set", "-g", "0", "1", "--perf-determinism", "1900"]]  # one call for both GPUs
    assert failed == ([(s, words) for s in steps] if words else [])
