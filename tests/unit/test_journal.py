"""The journal of originals: its path stays inside the node root, and a journal of the wrong shape
is a clear error with its path and what to do, before anything is written.

Before: a journal path with '..' was written outside the root (rollback then restored nothing, rc 0),
and valid JSON of the wrong shape failed with Python's exception text ("'families'").
"""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import FamilyError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import Journal, open_journal, open_node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError

JOURNAL = "/var/lib/gpunode-tuning/journal.json"
WHAT_TO_DO = "move it aside and re-run"


@pytest.fixture
def node_root(build_node):
    return build_node("audited-epyc-8gpu", cpus=2, gpus=1)


def tunables(run_module, root, journal, **kw):
    return run_module("kernel_tunables", dict(root=root, journal=journal, sysctl={"vm.swappiness": 1}, **kw))


def read_swappiness(root):
    with open(os.path.join(root, "proc/sys/vm/swappiness")) as fh:
        return fh.read().strip()


# -- The path stays inside the root

ESCAPES = [
    "/../outside/journal.json",
    "/var/lib/../../../outside/journal.json",
    "/var/../../outside/var/lib/gpunode-tuning/journal.json",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_a_journal_path_that_leaves_the_root_is_refused(node_root, run_module, digest, tmp_path, path):
    before = digest(node_root)
    swappiness = read_swappiness(node_root)
    result, failed = tunables(run_module, node_root, path)
    assert failed
    assert "journal path %s resolves to " % path in result["msg"]
    assert "outside the node root %s" % node_root in result["msg"]
    assert not os.path.exists(tmp_path / "outside")  # nothing written next to the root
    assert digest(node_root) == before and read_swappiness(node_root) == swappiness


@pytest.mark.parametrize("module,args", [
    ("cpu_cstate", {"disable": ["C2"]}),
    ("cpu_freq", {"governor": "performance"}),
    ("setpci_mrrs", {"mrrs": 4096}),
    ("kmod_optional", {"name": "tcp_bbr"}),
    ("cpu_cstate", {"restore": True}),
])
def test_every_journaling_module_refuses_the_escape(node_root, run_module, digest, tmp_path, module, args):
    before = digest(node_root)
    result, failed = run_module(module, dict(args, root=node_root, journal=ESCAPES[1]))
    assert failed and "outside the node root %s" % node_root in result["msg"]
    assert not os.path.exists(tmp_path / "outside")
    assert digest(node_root) == before


def test_a_symlink_that_leaves_the_root_is_refused(node_root, run_module, digest, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.makedirs(os.path.join(node_root, "var/lib"), exist_ok=True)
    os.symlink(str(outside), os.path.join(node_root, "var/lib/gpunode-tuning"))
    before = digest(node_root)
    result, failed = tunables(run_module, node_root, JOURNAL)
    assert failed
    assert "journal path %s resolves to %s/journal.json" % (JOURNAL, outside) in result["msg"]
    assert "outside the node root %s" % node_root in result["msg"]
    assert os.listdir(outside) == []
    assert digest(node_root) == before


def test_dot_dot_that_stays_inside_the_root_is_fine(node_root, run_module):
    result, failed = tunables(run_module, node_root, "/var/lib/../lib/gpunode-tuning/x/../journal.json")
    assert not failed, result["msg"]
    with open(os.path.join(node_root, JOURNAL.lstrip("/"))) as fh:
        assert "vm.swappiness" in json.load(fh)["families"]["tunables"]
    # ... and rollback through the plain path restores it.
    result, failed = run_module("kernel_tunables", dict(root=node_root, journal=JOURNAL, restore=True))
    assert not failed and result["changed"]
    assert not os.path.exists(os.path.join(node_root, JOURNAL.lstrip("/")))


@pytest.mark.parametrize("path", ["var/lib/journal.json", "/", "/var/lib/\njournal.json"])
def test_other_bad_paths_name_what_to_give(node_root, path):
    with pytest.raises(NodeError) as err:
        Journal(Node(node_root), path)
    assert repr(path) in str(err.value) or path in str(err.value)


def test_the_live_root_resolves_paths_as_the_kernel_does():
    assert Journal(Node("/"), "/nonexistent-gpunode-dir/../nonexistent-gpunode-journal.json").path == \
        "/nonexistent-gpunode-journal.json"


# -- A journal of the wrong shape

SHAPES = {
    "a list": [],
    "null": None,
    "a string": "journal",
    "no families": {"version": 1},
    "no version": {"families": {}},
    "families a list": {"version": 1, "families": []},
    "family a list": {"version": 1, "families": {"tunables": []}},
    "entry a number": {"version": 1, "families": {"tunables": {"vm.swappiness": 60}}},
    "entry without original": {"version": 1, "families": {"tunables": {"vm.swappiness": {"recorded": "x"}}}},
    "per-CPU original a string": {"version": 1, "families": {"cpuidle": {"C2": {"original": "0", "recorded": "x"}}}},
    "bad cpulist": {"version": 1, "families": {"cpuidle": {"C2": {"original": {"0": "zero"}, "recorded": "x"}}}},
    "last_applied a list": {"version": 1, "families": {}, "last_applied": []},
}


def plant(root, data):
    path = os.path.join(root, JOURNAL.lstrip("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(data, fh)
    return path


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("module,args", [
    ("kernel_tunables", {"sysctl": {"vm.swappiness": 1}}),
    ("kernel_tunables", {"restore": True}),
    ("cpu_cstate", {"restore": True}),
    ("cpu_freq", {"governor": "performance"}),
])
def test_a_journal_of_the_wrong_shape_is_a_clear_error(node_root, run_module, digest, shape, module, args):
    path = plant(node_root, SHAPES[shape])
    before = digest(node_root)
    result, failed = run_module(module, dict(args, root=node_root, journal=JOURNAL))
    assert failed
    msg = result["msg"]
    assert msg.startswith("journal %s is valid JSON but not a gpunode.tuning journal (" % path), msg
    assert WHAT_TO_DO in msg and "lost unless restored by hand" in msg
    assert digest(node_root) == before  # nothing written, the journal left as it was


def test_the_reason_says_what_is_wrong(node_root):
    cases = {
        "no families": '"families" is missing',
        "families a list": '"families" is a list',
        "entry without original": "family 'tunables', key 'vm.swappiness': the entry has no \"original\"",
        "bad cpulist": "value '0' has 'zero', not a cpulist",
        "a list": "the top level is a list",
    }
    for shape, reason in cases.items():
        plant(node_root, SHAPES[shape])
        with pytest.raises(NodeError) as err:
            Journal(Node(node_root), JOURNAL)
        assert reason in str(err.value), (shape, str(err.value))


def test_a_newer_version_says_which_collection_reads_it(node_root):
    path = plant(node_root, {"version": 2, "families": {}})
    with pytest.raises(NodeError) as err:
        Journal(Node(node_root), JOURNAL)
    assert str(err.value).startswith("journal %s has version 2; this collection reads version 1" % path)
    assert WHAT_TO_DO in str(err.value)


@pytest.mark.parametrize("content", ["{", "", "\x00\x01"])
def test_a_journal_that_is_not_json_keeps_the_old_message_and_says_what_to_do(node_root, run_module, content):
    path = plant(node_root, {})
    with open(path, "w") as fh:
        fh.write(content)
    result, failed = tunables(run_module, node_root, JOURNAL)
    assert failed and result["msg"].startswith("journal %s is unreadable" % path)
    assert WHAT_TO_DO in result["msg"]


# -- The API other modules use is unchanged


def test_record_save_reload_roundtrip(node_root):
    node = Node(node_root)
    j = Journal(node)
    assert j.path == os.path.join(node_root, JOURNAL.lstrip("/"))
    assert j.record("pcie_mrrs", "0000:41:00.0", 512) and not j.record("pcie_mrrs", "0000:41:00.0", 4096)
    assert j.record_per_cpu("cpuidle", "C2", {0: "0", 1: "1"})
    j.mark_applied("cpuidle")
    assert j.save()
    again = Journal(node, JOURNAL)
    assert again.entries("pcie_mrrs") == {"0000:41:00.0": 512}
    assert Journal.per_cpu(again.entries("cpuidle")["C2"]) == {0: "0", 1: "1"}
    assert again.data["last_applied"]["family"] == "cpuidle"


def test_an_entry_without_a_recorded_time_is_still_read(node_root):
    # "recorded" is informative: a journal edited by hand without it still rolls back.
    plant(node_root, {"version": 1, "families": {"cpuidle": {"C2": {"original": {"0": "0-1"}}}}})
    j = Journal(Node(node_root), JOURNAL)
    assert not j.record_per_cpu("cpuidle", "C2", {0: "1"})
    assert j.record_per_cpu("cpuidle", "C2", {2: "1"})
    assert j.data["families"]["cpuidle"]["C2"]["original"] == {"0": "0-1", "1": "2"}


def test_open_journal_refuses_a_bad_root_even_from_a_plain_node(tmp_path):
    # A caller that built its node with Node(root) instead of Node.open still stops here.
    with pytest.raises(NodeError, match="root %s does not exist" % (tmp_path / "gone")):
        open_journal(Node(str(tmp_path / "gone")), {"journal": JOURNAL, "restore": False})
    assert not os.path.exists(tmp_path / "gone")


def test_open_node_gives_the_node_and_journal_or_a_family_error(node_root, tmp_path):
    # A family's run opens both before anything is read; a bad root or journal becomes the module's message.
    node, journal = open_node({"root": node_root, "journal": JOURNAL, "restore": False})
    assert node.root == node_root and journal.path == os.path.join(node_root, JOURNAL.lstrip("/"))
    assert open_node({"root": node_root})[1] is None
    with pytest.raises(FamilyError, match="restore=true needs the journal option"):
        open_node({"root": node_root, "journal": None, "restore": True})
    with pytest.raises(FamilyError, match="root %s does not exist" % (tmp_path / "gone")):
        open_node({"root": str(tmp_path / "gone"), "journal": JOURNAL, "restore": False})
