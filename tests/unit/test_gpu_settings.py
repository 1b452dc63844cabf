"""gpu_settings: persistence mode and power limits through nvidia-smi (simnode's stand-in), journaled, rolled back."""

from __future__ import annotations

import json
import os

import pytest
import simnode

from ansible_collections.gpunode.tuning.plugins.module_utils import family, gpu_settings
from ansible_collections.gpunode.tuning.plugins.module_utils.node import Node

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
    query = "0, 00000000:41:00.0, Disabled, 600.00, 150.00, 600.00\n"
    calls = []
    responses = [(gpu_settings.QUERY, (0, query, "")),
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
    rows = {r["name"]: r for r in gpu_settings.evaluate(facts, {"gpu_settings": {"persistence": True,
                                                                               "power_limit": 400}}, None)}
    assert rows["persistence"]["state"] == "applied"
    assert rows["power_limit"]["state"] == "drifted" and "0000:41:00.0 450.00 W of 400 W" in rows["power_limit"][
        "reason"]
    assert gpu_settings.evaluate({}, {}, None) == []
    missing = gpu_settings.evaluate({}, {"gpu_settings": {"persistence": True}}, None)
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
