"""The node root: a root that is not a node's root is a clear error naming it, in every module.

An empty root once meant the controller's "/", and a missing root read as a node with nothing on
it (so verification passed it). Runs with the empty root use check mode: on code that still took
"" for "/", they must not touch the machine running the tests.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError

JOURNAL = "/var/lib/gpunode-tuning/journal.json"

# One call per module that would read the node and, without check mode, write to it.
MODULE_ARGS = {
    "tuning_info": {"sysctls": ["vm.swappiness"]},
    "setpci_mrrs": {"mrrs": 4096, "journal": JOURNAL},
    "kernel_tunables": {"sysctl": {"vm.swappiness": 10}, "journal": JOURNAL},
    "cpu_cstate": {"disable": ["C2"], "journal": JOURNAL},
    "cpu_freq": {"governor": "performance", "journal": JOURNAL},
    "kmod_optional": {"name": "tcp_bbr", "journal": JOURNAL},
    "kernel_cmdline": {"arguments": ["iommu=pt"]},
}


def bad_root(kind, tmp_path):
    """A root of the given kind below tmp_path (nothing on the controller)."""
    if kind == "missing":
        return str(tmp_path / "no-such-node")
    if kind == "file":
        path = tmp_path / "a-file"
        path.write_text("not a node\n")
        return str(path)
    if kind == "no-sys":
        # A tree that looks like a node's /etc and /var but has no sys/: not a Linux root.
        (tmp_path / "nosys" / "etc" / "default").mkdir(parents=True)
        (tmp_path / "nosys" / "etc" / "default" / "grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
        (tmp_path / "nosys" / "proc" / "sys" / "vm").mkdir(parents=True)
        (tmp_path / "nosys" / "proc" / "sys" / "vm" / "swappiness").write_text("60\n")
        return str(tmp_path / "nosys")
    raise AssertionError(kind)


EXPECTED = {"missing": "does not exist", "file": "is not a directory", "no-sys": "has no sys/ directory"}


@pytest.mark.parametrize("module", sorted(MODULE_ARGS))
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_a_root_that_is_not_a_node_fails_every_module(tmp_path, run_module, digest, module, kind):
    root = bad_root(kind, tmp_path)
    before = digest(str(tmp_path))
    result, failed = run_module(module, dict(MODULE_ARGS[module], root=root))
    assert failed, "%s accepted a root that %s: %s" % (module, EXPECTED[kind], result)
    assert "root %s %s" % (root, EXPECTED[kind]) in result["msg"]
    assert "'/' for the running system" in result["msg"]  # what to give instead
    assert "Traceback" not in result["msg"]
    assert digest(str(tmp_path)) == before  # nothing created, not even the journal's directory
    assert not os.path.exists(os.path.join(root, "var"))


@pytest.mark.parametrize("module", sorted(MODULE_ARGS))
def test_an_empty_root_is_refused_never_the_controller(tmp_path, run_module, module):
    result, failed = run_module(module, dict(MODULE_ARGS[module], root=""), check=True)
    assert failed, "%s took root '' for the controller's /: %s" % (module, sorted(result))
    assert "root is empty" in result["msg"] and "'/' for the running system" in result["msg"]
    assert "tuning_facts" not in result


def test_facts_of_an_empty_root_are_not_the_controllers(run_module):
    # Before: root "" described the machine running Ansible.
    result, failed = run_module("tuning_info", {"root": ""})
    assert failed and "tuning_facts" not in result


def test_a_root_whose_sys_has_no_cpu_cannot_be_verified(tmp_path, run_module):
    # sys/ exists but holds nothing readable: facts full of nulls would let verification pass.
    (tmp_path / "bare" / "sys").mkdir(parents=True)
    result, failed = run_module("tuning_info", {"root": str(tmp_path / "bare")})
    assert failed
    assert "no CPU found below %s" % (tmp_path / "bare") in result["msg"]


def test_a_simulated_node_and_a_link_to_it_open(build_node, tmp_path, run_module):
    root = build_node("tiny-vm")
    link = tmp_path / "link"
    link.symlink_to(root)
    for r in (root, str(link), root + "/"):
        node = Node.open(r)
        assert not node.is_live and node.isdir("sys")
        result, failed = run_module("tuning_info", {"root": r})
        assert not failed, result["msg"]


@pytest.mark.parametrize("spelling", ["/", "//", "/tmp/..", "/./"])
def test_the_live_root_keeps_working(spelling):
    node = Node.open(spelling)
    assert node.root == "/" and node.is_live


@pytest.mark.parametrize("value", ["", "   ", None])
def test_node_refuses_an_empty_root(value):
    with pytest.raises(NodeError, match="root is empty"):
        Node(value)
    with pytest.raises(NodeError, match="root is empty"):
        Node.open(value)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_node_open_names_the_root(tmp_path, kind):
    root = bad_root(kind, tmp_path)
    with pytest.raises(NodeError) as err:
        Node.open(root)
    assert str(err.value).startswith("root %s %s" % (root, EXPECTED[kind]))


def test_a_dangling_link_is_a_missing_root(tmp_path):
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(NodeError, match="does not exist"):
        Node.open(str(link))


def test_write_problem_names_why_a_write_would_fail_and_writes_nothing(tmp_path):
    """What check mode asks before a real run would write: None, or the reason read after the path."""
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "ok").write_text("0\n")
    (tmp_path / "sys" / "dir").mkdir()
    (tmp_path / "sys" / "locked").write_text("0\n")
    node = Node.open(str(tmp_path))
    if subprocess.run(["chattr", "+i", node.path("sys/locked")], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not available here (needs root and a file system with attributes)")
    try:
        assert node.write_problem("sys/ok") is None
        assert node.write_problem("sys/gone") == "does not exist"
        assert node.write_problem("sys/ok/below") == "does not exist"
        assert node.write_problem("sys/dir") == "is a directory"
        assert node.write_problem("sys/locked") == ("is not writable (Operation not permitted: the file is "
                                                    "immutable or the kernel forbids the write)")
        with pytest.raises(NodeError, match="locked for writing: Operation not permitted"):
            node.write("1", "sys/locked")  # the real write fails where the probe said it would
    finally:
        subprocess.run(["chattr", "-i", node.path("sys/locked")], check=False)
    assert (tmp_path / "sys" / "ok").read_text() == "0\n" and (tmp_path / "sys" / "locked").read_text() == "0\n"
    assert sorted(os.listdir(tmp_path / "sys")) == ["dir", "locked", "ok"]
