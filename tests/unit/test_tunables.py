"""The tunables family: module_utils/families/tunables.py's key parsing, value checks and planning, then the
kernel_tunables module (its API) through its entry point against simulated nodes.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import sysctl_boot
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.families import tunables, tunables_plan
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
    assert tunables_plan.sysctl_file_problem(node, "/etc/sysctl.d/90-gpunode-tuning.conf") is None
    os.mkdir(os.path.join(root, "etc/sysctl.d/90-gpunode-tuning.conf"))
    assert "is a directory" in tunables_plan.sysctl_file_problem(node, "/etc/sysctl.d/90-gpunode-tuning.conf")
    with pytest.raises(tunables.TunableError, match="allowed is an absolute path"):
        tunables_plan.sysctl_file_problem(node, "/etc/sysctl.d/x\n.conf")


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


JOURNAL = "/var/lib/gpunode-tuning/journal.json"
INFERENCE = {
    "sysctl": {"kernel.numa_balancing": 0, "vm.swappiness": 10, "net.core.rmem_max": 67108864,
               "net.ipv4.tcp_rmem": "4096 131072 67108864"},
    "transparent_hugepage": {"enabled": "madvise", "defrag": "defer+madvise"},
}


def read(root, rel):
    with open(os.path.join(root, rel)) as fh:
        return fh.read()


@pytest.fixture
def node_root(build_node):
    return build_node("audited-epyc-8gpu", cpus=4, gpus=1)


def test_values_written_and_read_back(node_root, run_module):
    result, failed = run_module("kernel_tunables", dict(INFERENCE, root=node_root))
    assert not failed, result
    assert result["changed"] is True
    s = result["settings"]
    assert s["kernel.numa_balancing"]["before"] == "1" and s["kernel.numa_balancing"]["after"] == "0"
    assert s["net.ipv4.tcp_rmem"]["before"] == "4096 131072 6291456"
    assert s["net.ipv4.tcp_rmem"]["after"] == "4096 131072 67108864"
    assert s["transparent_hugepage.enabled"]["before"] == "always"
    assert s["transparent_hugepage.enabled"]["after"] == "madvise"
    assert read(node_root, "proc/sys/kernel/numa_balancing") == "0\n"
    assert read(node_root, "proc/sys/vm/swappiness") == "10\n"
    assert read(node_root, "sys/kernel/mm/transparent_hugepage/enabled") == "always [madvise] never\n"
    assert read(node_root, "sys/kernel/mm/transparent_hugepage/defrag") == \
        "always defer [defer+madvise] madvise never\n"
    assert result["failed_keys"] == []


def test_rerun_is_unchanged(node_root, run_module, digest):
    run_module("kernel_tunables", dict(INFERENCE, root=node_root))
    before = digest(node_root)
    # Whitespace differences in multi-field values are not changes.
    args = dict(INFERENCE, root=node_root)
    args["sysctl"] = dict(INFERENCE["sysctl"], **{"net.ipv4.tcp_rmem": "4096\t131072   67108864"})
    result, failed = run_module("kernel_tunables", args)
    assert not failed and result["changed"] is False
    assert all(not r["changed"] for r in result["settings"].values())
    assert digest(node_root) == before


def test_check_mode_writes_nothing(node_root, run_module, digest):
    before = digest(node_root)
    result, failed = run_module("kernel_tunables", dict(INFERENCE, root=node_root, journal=JOURNAL),
                                check=True, diff=True)
    assert not failed and result["changed"] is True
    assert result["settings"]["vm.swappiness"]["after"] == "10"
    assert result["diff"]["before"]["vm.swappiness"] == "60"
    assert result["diff"]["after"]["vm.swappiness"] == "10"
    assert digest(node_root) == before


def test_journal_and_restore_give_identical_tree(node_root, run_module, digest):
    before = digest(node_root)
    result, failed = run_module("kernel_tunables", dict(INFERENCE, root=node_root, journal=JOURNAL))
    assert not failed
    with open(os.path.join(node_root, JOURNAL.lstrip("/"))) as fh:
        entries = json.load(fh)["families"]["tunables"]
    assert entries["vm.swappiness"]["original"] == "60"
    assert entries["net.ipv4.tcp_rmem"]["original"] == "4096\t131072\t6291456"
    assert entries["transparent_hugepage.enabled"]["original"] == "always"
    # A second run never overwrites the recorded originals.
    run_module("kernel_tunables", {"sysctl": {"vm.swappiness": 5}, "root": node_root, "journal": JOURNAL})
    result, failed = run_module("kernel_tunables", {"restore": True, "root": node_root, "journal": JOURNAL},
                                check=True)
    assert not failed and result["changed"]
    result, failed = run_module("kernel_tunables", {"restore": True, "root": node_root, "journal": JOURNAL})
    assert not failed and result["changed"], result
    assert result["settings"]["vm.swappiness"]["after"] == "60"
    assert digest(node_root) == before
    result, failed = run_module("kernel_tunables", {"restore": True, "root": node_root, "journal": JOURNAL})
    assert not failed and result["changed"] is False


def test_any_existing_key_with_slashes(node_root, run_module):
    result, failed = run_module("kernel_tunables", {"sysctl": {"fs/file-max": "1000000"}, "root": node_root})
    assert not failed and result["settings"]["fs.file-max"]["after"] == "1000000"


def test_readonly_proc_sys_is_skipped(node_root, run_module, digest, monkeypatch):
    class RO:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(tunables.os, "statvfs", lambda path: RO())
    before = digest(node_root)
    result, failed = run_module("kernel_tunables", {"sysctl": {"vm.swappiness": 10}, "skip_readonly": True,
                                                    "root": node_root})
    assert not failed and result["changed"] is False
    assert result["settings"]["vm.swappiness"]["skipped"] is True
    assert "read-only" in result["settings"]["vm.swappiness"]["reason"]
    assert digest(node_root) == before
    result, failed = run_module("kernel_tunables", {"sysctl": {"vm.swappiness": 10}, "root": node_root})
    assert not failed  # the simulated file is writable; without skip_readonly the write is tried


def _erofs_write(self, value, *parts):
    try:
        raise OSError(errno.EROFS, "Read-only file system")
    except OSError as exc:
        raise NodeError("writing %r to %s failed: %s" % (value, self.path(*parts), exc.strerror)) from exc


def test_erofs_write_skipped_or_failed(node_root, run_module, monkeypatch):
    monkeypatch.setattr(Node, "write", _erofs_write)
    args = {"sysctl": {"vm.swappiness": 10, "kernel.numa_balancing": 0}, "root": node_root, "journal": JOURNAL}
    result, failed = run_module("kernel_tunables", dict(args, skip_readonly=True))
    assert not failed and result["settings"]["vm.swappiness"]["skipped"]
    assert "Read-only file system" in result["settings"]["vm.swappiness"]["reason"]
    assert not os.path.exists(os.path.join(node_root, JOURNAL.lstrip("/")))  # nothing left to restore
    result, failed = run_module("kernel_tunables", args)
    assert failed
    assert set(result["failed_keys"]) == {"vm.swappiness", "kernel.numa_balancing"}
    assert "vm.swappiness" in result["msg"]


def test_value_that_does_not_take_fails_that_key_only(node_root, run_module, monkeypatch):
    real = Node.write

    def stubborn(self, value, *parts):
        if parts[0].endswith("swappiness"):
            return  # the kernel silently ignores it
        real(self, value, *parts)

    monkeypatch.setattr(Node, "write", stubborn)
    result, failed = run_module("kernel_tunables", {"sysctl": {"vm.swappiness": 10, "kernel.numa_balancing": 0},
                                                    "root": node_root})
    assert failed
    assert result["failed_keys"] == ["vm.swappiness"]
    assert "read back" in result["settings"]["vm.swappiness"]["reason"]
    assert result["settings"]["kernel.numa_balancing"]["changed"] is True
    assert read(node_root, "proc/sys/kernel/numa_balancing") == "0\n"


@pytest.mark.parametrize("args,fragment", [
    ({"sysctl": {"vm.no_such_key": 1}}, "does not exist"),
    ({"sysctl": {"../../etc/passwd": "x"}}, "allowed is"),
    ({"sysctl": {"/proc/sys/vm/swappiness": 10}}, "allowed is"),
    ({"sysctl": {"vm/../../../etc/hostname": "x"}}, "allowed is"),
    ({"sysctl": {"vm.swappiness;reboot": 1}}, "allowed is"),
    ({"sysctl": {"net.core.somaxconn": "ten"}}, "allowed are integers"),
    ({"sysctl": {"vm.swappiness": "ten"}}, "allowed is one integer 0-200 (Documentation/admin-guide/sysctl/vm.rst"),
    ({"sysctl": {"net.ipv4.tcp_rmem": "4096 big 6291456"}}, "allowed are integers"),
    ({"sysctl": {"vm.swappiness": ""}}, "empty"),
    ({"transparent_hugepage": {"enabled": "sometimes"}}, "allowed are always, madvise, never"),
    ({"transparent_hugepage": {"defrag": "eager"}}, "allowed are always, defer, defer+madvise, madvise, never"),
    ({"transparent_hugepage": {"shmem": "always"}}, "Supported parameters include"),
    ({"restore": True}, "journal"),
    ({"sysctl": {"vm.swappiness": 10}, "journal": "journal.json"}, "absolute"),
    ({"sysctl": {"vm.swappiness": 10, "vm.max_map_count": "x"}}, "allowed are integers"),
    # A value or key that would add a line to the persistent drop-in is refused at runtime too,
    # and a valid key next to it is not written either.
    ({"sysctl": {"kernel.osrelease": "x\nkernel.modprobe = /x"}}, "contains line feed (\\n)"),
    ({"sysctl": {"vm.swappiness": 10, "kernel.osrelease": "x\nkernel.modprobe = /x"}}, "kernel.osrelease"),
    ({"sysctl": {"vm.swappiness": "10\r"}}, "carriage return"),
    ({"sysctl": {"-vm.swappiness": 10}}, "no leading '/' or '-'"),
    ({"sysctl": {"vm.swappiness\n": 10}}, "allowed is a sysctl name"),
    ({"sysctl": {"kernel.core_pattern": "-x"}}, "starts with '-'"),
    ({"transparent_hugepage": {"enabled": "madvise\nnever"}}, "line feed"),
    ({"sysctl": {"vm.swappiness": 10}, "sysctl_file": "etc/sysctl.d/x.conf"}, "allowed is an absolute path"),
    ({"sysctl": {"vm.swappiness": 10}, "sysctl_file": "/etc/sysctl.d/x\n.conf"}, "allowed is an absolute path"),
])
def test_bad_input_fails_and_writes_nothing(node_root, run_module, digest, args, fragment):
    before = digest(node_root)
    result, failed = run_module("kernel_tunables", dict(args, root=node_root))
    assert failed
    assert fragment in result["msg"]
    assert digest(node_root) == before


def test_restore_with_unreadable_journal_fails(node_root, run_module, digest):
    path = os.path.join(node_root, JOURNAL.lstrip("/"))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as fh:
        fh.write("{not json")
    before = digest(node_root)
    result, failed = run_module("kernel_tunables", {"restore": True, "journal": JOURNAL, "root": node_root})
    assert failed and "unreadable" in result["msg"]
    assert digest(node_root) == before


def test_missing_key_fails_alone_and_the_others_are_applied(node_root, run_module):
    args = {"sysctl": {"vm.no_such_key": 1, "vm.swappiness": 10}, "transparent_hugepage": {"enabled": "madvise"},
            "root": node_root, "journal": JOURNAL}
    result, failed = run_module("kernel_tunables", args, check=True)
    assert failed and result["failed_keys"] == ["vm.no_such_key"]
    assert result["applied_keys"] == ["vm.swappiness", "transparent_hugepage.enabled"]
    assert read(node_root, "proc/sys/vm/swappiness") == "60\n"  # check mode

    result, failed = run_module("kernel_tunables", args)
    assert failed
    assert result["failed_keys"] == ["vm.no_such_key"]
    assert "vm.no_such_key does not exist on this node" in result["msg"]
    assert "Applied: vm.swappiness, transparent_hugepage.enabled" in result["msg"]
    assert result["settings"]["vm.no_such_key"]["reason"].startswith("sysctl key vm.no_such_key does not exist")
    assert read(node_root, "proc/sys/vm/swappiness") == "10\n"
    assert read(node_root, "sys/kernel/mm/transparent_hugepage/enabled") == "always [madvise] never\n"
    with open(os.path.join(node_root, JOURNAL.lstrip("/"))) as fh:
        assert set(json.load(fh)["families"]["tunables"]) == {"vm.swappiness", "transparent_hugepage.enabled"}


def test_missing_thp_fails_alone(node_root, run_module):
    os.rename(os.path.join(node_root, "sys/kernel/mm/transparent_hugepage/defrag"),
              os.path.join(node_root, "sys/kernel/mm/transparent_hugepage/defrag.gone"))
    result, failed = run_module("kernel_tunables", {"sysctl": {"vm.swappiness": 10},
                                                    "transparent_hugepage": {"defrag": "madvise"},
                                                    "root": node_root})
    assert failed and result["failed_keys"] == ["transparent_hugepage.defrag"]
    assert "not available on this node" in result["msg"]
    assert read(node_root, "proc/sys/vm/swappiness") == "10\n"


@pytest.fixture
def immutable(tmp_path):
    """chattr +i on paths (root ignores chmod), undone at teardown so tmp cleanup works."""
    done = []

    def _set(path):
        subprocess.run(["chattr", "+i", path], check=True)
        done.append(path)

    yield _set
    for path in reversed(done):
        subprocess.run(["chattr", "-i", path], check=False)


@pytest.mark.parametrize("check", [True, False])
def test_unwritable_sysctl_dropin_is_reported_before_anything_is_written(node_root, run_module, digest, immutable,
                                                                         check):
    immutable(os.path.join(node_root, "etc/sysctl.d"))
    before = digest(node_root)
    result, failed = run_module("kernel_tunables", {"sysctl": {"vm.swappiness": 10}, "root": node_root,
                                                    "sysctl_file": "/etc/sysctl.d/90-gpunode-tuning.conf",
                                                    "journal": JOURNAL}, check=check)
    assert failed
    assert "sysctl drop-in %s/etc/sysctl.d/90-gpunode-tuning.conf cannot be written" % node_root in result["msg"]
    assert "does not accept new files (immutable attribute or permissions)" in result["msg"]
    assert digest(node_root) == before


def test_immutable_sysctl_dropin_file_is_reported(node_root, run_module, immutable):
    path = os.path.join(node_root, "etc/sysctl.d/90-gpunode-tuning.conf")
    with open(path, "w") as fh:
        fh.write("vm.swappiness=10\n")
    args = {"sysctl": {"vm.swappiness": 10}, "root": node_root, "sysctl_file": "/etc/sysctl.d/90-gpunode-tuning.conf"}
    result, failed = run_module("kernel_tunables", args, check=True)
    assert not failed, result  # writable: the check passes and says nothing
    immutable(path)
    result, failed = run_module("kernel_tunables", args, check=True)
    assert failed and "cannot be replaced" in result["msg"]


def test_restore_goes_on_past_an_entry_it_cannot_restore(node_root, run_module):
    result, failed = run_module("kernel_tunables", dict(INFERENCE, root=node_root, journal=JOURNAL))
    assert not failed
    swappiness = os.path.join(node_root, "proc/sys/vm/swappiness")
    os.rename(swappiness, swappiness + ".gone")  # the key vanished (module unloaded, file replaced ...)

    result, failed = run_module("kernel_tunables", {"restore": True, "root": node_root, "journal": JOURNAL})
    assert failed
    assert result["failed_keys"] == ["vm.swappiness"]
    assert "vm.swappiness" in result["msg"] and "stay in the journal" in result["msg"]
    assert "kernel.numa_balancing" in result["applied_keys"]
    assert read(node_root, "proc/sys/kernel/numa_balancing") == "1\n"
    assert read(node_root, "sys/kernel/mm/transparent_hugepage/enabled") == "[always] madvise never\n"
    with open(os.path.join(node_root, JOURNAL.lstrip("/"))) as fh:
        assert list(json.load(fh)["families"]["tunables"]) == ["vm.swappiness"]

    os.rename(swappiness + ".gone", swappiness)
    result, failed = run_module("kernel_tunables", {"restore": True, "root": node_root, "journal": JOURNAL})
    assert not failed and result["applied_keys"] == ["vm.swappiness"]
    assert read(node_root, "proc/sys/vm/swappiness") == "60\n"
    assert not os.path.exists(os.path.join(node_root, JOURNAL.lstrip("/")))


def test_restore_never_builds_a_path_from_a_foreign_journal_entry(node_root, run_module, tmp_path):
    path = os.path.join(node_root, JOURNAL.lstrip("/"))
    run_module("kernel_tunables", {"sysctl": {"vm.swappiness": 10}, "root": node_root, "journal": JOURNAL})
    with open(path) as fh:
        data = json.load(fh)
    entry = data["families"]["tunables"]["vm.swappiness"]
    data["families"]["tunables"]["transparent_hugepage.../../../../etc/hostname"] = dict(entry, original="x")
    data["families"]["tunables"]["-kernel.modprobe"] = dict(entry, original="/x")
    with open(path, "w") as fh:
        json.dump(data, fh)
    with open(os.path.join(node_root, "etc/hostname"), "w") as fh:
        fh.write("node\n")
    result, failed = run_module("kernel_tunables", {"restore": True, "root": node_root, "journal": JOURNAL})
    assert failed
    assert set(result["failed_keys"]) == {"transparent_hugepage.../../../../etc/hostname", "-kernel.modprobe"}
    assert "not a transparent hugepage setting" in result["msg"] and "allowed is a sysctl name" in result["msg"]
    assert read(node_root, "proc/sys/vm/swappiness") == "60\n"
    assert read(node_root, "etc/hostname") == "node\n"
