"""Pure functions of module_utils/families/tunables.py: key parsing, value checks, planning."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import sysctl_boot
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import tunables
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify


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
    # Keys that would change the meaning of a sysctl.d line: '-' (ignore errors), '=', a newline.
    "-vm.swappiness", "vm.swappiness\n", "vm.swappiness=1", "kernel.osrelease\nkernel.modprobe",
    "vm.swappiness\r", "vm.swappiness\u2028",
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


@pytest.mark.parametrize("desired,fragment", [
    ("x\nkernel.modprobe = /x", "line feed"),
    ("1\r", "carriage return"),
    ("1\x1b[2J", "escape"),
    ("1\x00", "NUL"),
    ("1\u2028kernel.modprobe=/x", "U+2028"),
    ("\u202e1", "U+202E"),
    ("-x", "starts with '-'"),
    ("-1 x", "starts with '-'"),
])
def test_validate_value_refuses_what_could_start_a_line_or_an_option(desired, fragment):
    with pytest.raises(tunables.TunableError, match="allowed is printable text") as exc:
        tunables.validate_sysctl_value("kernel.core_pattern", desired, "core")
    assert fragment in str(exc.value) and "kernel.core_pattern" in str(exc.value)


def test_plan_collects_every_input_error(build_node):
    root = build_node("tiny-vm")
    with pytest.raises(tunables.TunableError) as exc:
        tunables.plan_items(Node(root), {"vm.nope": "x\ny", "vm.max_map_count": "x"}, {"enabled": "sometimes"})
    msg = str(exc.value)
    assert "vm.nope: value 'x\\ny' contains line feed" in msg  # checked even where the key is missing
    assert "allowed are integers" in msg
    assert "allowed are always, madvise, never" in msg


def test_plan_marks_a_missing_key_and_keeps_the_others(build_node):
    root = build_node("tiny-vm")
    items = {i["key"]: i for i in tunables.plan_items(Node(root), {"vm.nope": 1, "vm.swappiness": 10})}
    assert "vm.nope does not exist on this node" in items["vm.nope"]["problem"]
    assert items["vm.swappiness"]["problem"] is None and items["vm.swappiness"]["desired"] == "10"


def test_plan_treats_symlink_escaping_proc_sys_as_missing(build_node, tmp_path):
    root = build_node("tiny-vm")
    (tmp_path / "outside").write_text("1\n")
    os.symlink(str(tmp_path / "outside"), os.path.join(root, "proc/sys/vm/escape"))
    (item,) = tunables.plan_items(Node(root), {"vm.escape": 0})
    assert "does not exist" in item["problem"]
    results, failed = tunables.apply(Node(root), [item])
    assert failed == ["vm.escape"]
    assert (tmp_path / "outside").read_text() == "1\n"


def test_sysctl_file_problem(build_node):
    root = build_node("tiny-vm")
    node = Node(root)
    assert tunables.sysctl_file_problem(node, "/etc/sysctl.d/90-gpunode-tuning.conf") is None
    os.mkdir(os.path.join(root, "etc/sysctl.d/90-gpunode-tuning.conf"))
    assert "is a directory" in tunables.sysctl_file_problem(node, "/etc/sysctl.d/90-gpunode-tuning.conf")
    with pytest.raises(tunables.TunableError, match="allowed is an absolute path"):
        tunables.sysctl_file_problem(node, "/etc/sysctl.d/x\n.conf")


def test_plan_same_key_twice(build_node):
    root = build_node("tiny-vm")
    with pytest.raises(tunables.TunableError, match="given twice"):
        tunables.plan_items(Node(root), {"vm.swappiness": 1, "vm/swappiness": 2})


def test_plan_items_reads_thp_choices(build_node):
    root = build_node("tiny-vm")
    items = tunables.plan_items(Node(root), {}, {"defrag": "defer+madvise"})
    assert items[0]["before"] == "madvise"
    assert items[0]["choices"] == ["always", "defer", "defer+madvise", "madvise", "never"]


# --- The sysctl files a boot applies after the drop-in (drift with a cause) ---


def test_sysctl_load_order_masks_by_name_sorts_by_name_and_ends_with_sysctl_conf():
    order = sysctl_boot.sysctl_load_order({
        "/etc/sysctl.d": ["90-gpunode-tuning.conf", "99-sysctl.conf", "cloud-optimization.conf", "README"],
        "/run/sysctl.d": ["50-run.conf"],
        "/usr/lib/sysctl.d": ["50-default.conf", "99-sysctl.conf", "10-coredump.conf"],
        "/lib/sysctl.d": ["50-default.conf"],
        "/etc": ["sysctl.conf"],
    })
    assert order == ["/usr/lib/sysctl.d/10-coredump.conf", "/usr/lib/sysctl.d/50-default.conf",
                     "/run/sysctl.d/50-run.conf", "/etc/sysctl.d/90-gpunode-tuning.conf",
                     "/etc/sysctl.d/99-sysctl.conf", "/etc/sysctl.d/cloud-optimization.conf", "/etc/sysctl.conf"]


def test_sysctl_overrides_are_later_files_with_another_value():
    ours = "/etc/sysctl.d/90-gpunode-tuning.conf"
    files = [("/usr/lib/sysctl.d/50-default.conf", {"vm.swappiness": "30", "net.core.somaxconn": "128"}),
             (ours, {"vm.swappiness": "10", "net.core.somaxconn": "65535"}),
             ("/etc/sysctl.d/cloud-optimization.conf", {"vm.swappiness": "60", "kernel.numa_balancing": "0"}),
             ("/etc/sysctl.conf", {"net.core.somaxconn": "65535"})]
    wanted = {"vm.swappiness": 10, "net.core.somaxconn": 65535, "kernel.numa_balancing": False}
    assert sysctl_boot.sysctl_overrides(files, ours, wanted) == {
        "vm.swappiness": {"file": "/etc/sysctl.d/cloud-optimization.conf", "value": "60"}}


def test_verification_reads_the_sysctl_files_below_the_root_once_each(build_node):
    root = build_node(cpus=2, gpus=1)
    os.makedirs(os.path.join(root, "usr/lib/sysctl.d"))
    with open(os.path.join(root, "etc/sysctl.conf"), "w", encoding="utf-8") as fh:
        fh.write("vm.swappiness = 1\n")
    os.symlink("../sysctl.conf", os.path.join(root, "etc/sysctl.d/99-sysctl.conf"))  # as Debian's procps ships it
    with open(os.path.join(root, "usr/lib/sysctl.d/99-sysctl.conf"), "w", encoding="utf-8") as fh:
        fh.write("vm.swappiness = 99\n")  # hidden by /etc/sysctl.d/99-sysctl.conf
    node = Node.open(root)
    assert [p for p, _v in verify.sysctl_files(node)] == ["/etc/sysctl.d/99-sysctl.conf"]
    over = verify.sysctl_overrides(node, {"sysctl": {"vm.swappiness": 10}}, "/etc/sysctl.d/90-gpunode-tuning.conf")
    assert over == {"vm.swappiness": {"file": "/etc/sysctl.d/99-sysctl.conf", "value": "1"}}
