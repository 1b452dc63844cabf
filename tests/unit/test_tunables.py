"""Pure functions of module_utils/tunables.py: key parsing, value checks, planning."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils import tunables
from ansible_collections.gpunode.tuning.plugins.module_utils.node import Node


@pytest.mark.parametrize("key,parts", [
    ("vm.swappiness", ["vm", "swappiness"]),
    ("kernel/numa_balancing", ["kernel", "numa_balancing"]),
    ("net.ipv4.conf.eth0/100.rp_filter", ["net", "ipv4", "conf", "eth0.100", "rp_filter"]),
    ("net/ipv4/conf/eth0.100/rp_filter", ["net", "ipv4", "conf", "eth0.100", "rp_filter"]),
    ("fs.file-max", ["fs", "file-max"]),
])
def test_key_components(key, parts):
    assert tunables.key_components(key) == parts


def test_canonical_key_round_trips():
    parts = ["net", "ipv4", "conf", "eth0.100", "rp_filter"]
    assert tunables.canonical_key(parts) == "net.ipv4.conf.eth0/100.rp_filter"
    assert tunables.key_components(tunables.canonical_key(parts)) == parts


@pytest.mark.parametrize("key", [
    "", "../../etc/passwd", "/etc/passwd", "vm..swappiness", "vm/../../../etc/shadow", ".vm.swappiness",
    "vm.swappiness.", "vm. swappiness", "vm.swap$piness", "a" * 300, "vm.swappiness\x00",
])
def test_bad_keys(key):
    with pytest.raises(tunables.TunableError, match="allowed is"):
        tunables.key_components(key)


@pytest.mark.parametrize("desired,current,expected", [
    ("10", "60", "10"),
    ("-1", "0", "-1"),
    ("4096  87380\t6291456", "4096\t131072\t6291456", "4096 87380 6291456"),
    ("cubic", "bbr", "cubic"),
])
def test_validate_value_ok(desired, current, expected):
    assert tunables.validate_sysctl_value("k", desired, current) == expected


@pytest.mark.parametrize("desired,current,fragment", [
    ("ten", "60", "allowed are integers"),
    ("1.5", "60", "allowed are integers"),
    ("4096 x 6291456", "4096\t131072\t6291456", "allowed are integers"),
    ("1 2 3 4", "4096\t131072\t6291456", "at most 3"),
    ("", "60", "empty"),
])
def test_validate_value_rejects(desired, current, fragment):
    with pytest.raises(tunables.TunableError, match=fragment):
        tunables.validate_sysctl_value("k", desired, current)


def test_value_string():
    assert tunables.value_string(True) == "1"
    assert tunables.value_string([4096, 131072, 6291456]) == "4096 131072 6291456"
    assert tunables.value_string(10) == "10"


def test_plan_collects_every_error(build_node):
    root = build_node("tiny-vm")
    with pytest.raises(tunables.TunableError) as exc:
        tunables.plan_items(Node(root), {"vm.nope": 1, "vm.swappiness": "x"}, {"enabled": "sometimes"})
    msg = str(exc.value)
    assert "vm.nope does not exist" in msg
    assert "allowed are integers" in msg
    assert "allowed are always, madvise, never" in msg


def test_plan_rejects_symlink_escaping_proc_sys(build_node, tmp_path):
    root = build_node("tiny-vm")
    (tmp_path / "outside").write_text("1\n")
    import os

    os.symlink(str(tmp_path / "outside"), os.path.join(root, "proc/sys/vm/escape"))
    with pytest.raises(tunables.TunableError, match="does not exist"):
        tunables.plan_items(Node(root), {"vm.escape": 0})


def test_plan_same_key_twice(build_node):
    root = build_node("tiny-vm")
    with pytest.raises(tunables.TunableError, match="given twice"):
        tunables.plan_items(Node(root), {"vm.swappiness": 1, "vm/swappiness": 2})


def test_plan_items_reads_thp_choices(build_node):
    root = build_node("tiny-vm")
    items = tunables.plan_items(Node(root), {}, {"defrag": "defer+madvise"})
    assert items[0]["before"] == "madvise"
    assert items[0]["choices"] == ["always", "defer", "defer+madvise", "madvise", "never"]
