"""Pure functions of module_utils/families/kmod.py: validation, classification, kernel log cursor."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import kmod

# Messages as printed by kmod's modprobe and by the kernel (dmesg text without timestamps).
PEERMEM_EINVAL = "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument"
PEERMEM_LOG = ["nvidia-peermem nv_mem_client_init:203 ERROR: ib_register_peer_memory_client failed"]
NOT_FOUND = "modprobe: FATAL: Module foo not found in directory /lib/modules/6.1.0-28-amd64"
UNKNOWN_SYMBOL = ("modprobe: ERROR: could not insert 'nvidia_peermem': Unknown symbol in module, "
                  "or unknown parameter (see dmesg)")
UNKNOWN_SYMBOL_LOG = ["nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -2)",
                      "nvidia_peermem: Unknown symbol ib_unregister_peer_memory_client (err -2)"]
MISMATCH_LOG = ["nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client",
                "nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)"]
KEY_REJECTED = "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service"
LOCKDOWN_EPERM = "modprobe: ERROR: could not insert 'msr': Operation not permitted"
LOCKDOWN_LOG = ["Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7"]
ENOKEY = "modprobe: ERROR: could not insert 'zfs': Required key not available"
INSTALL_FALSE = ("modprobe: ERROR: ../libkmod/libkmod-module.c:1094 command_do() Error running install command "
                 "'/bin/false' for module usb_storage: retcode 1\nmodprobe: ERROR: could not insert 'usb_storage': "
                 "Invalid argument")
DEP_NOT_FOUND = "modprobe: FATAL: Module ib_core not found in directory /lib/modules/6.1.0-28-amd64"
EXEC_FORMAT = "modprobe: ERROR: could not insert 'foo': Exec format error"


@pytest.mark.parametrize("name,output,log,expected", [
    ("nvidia_peermem", PEERMEM_EINVAL, PEERMEM_LOG, "invalid_argument"),
    ("foo", NOT_FOUND, [], "not_found"),
    ("nvidia_peermem", UNKNOWN_SYMBOL, UNKNOWN_SYMBOL_LOG, "dependency_missing"),
    ("nvidia_peermem", PEERMEM_EINVAL, MISMATCH_LOG, "symbol_mismatch"),
    ("nvidia", KEY_REJECTED, [], "denied"),
    ("msr", LOCKDOWN_EPERM, LOCKDOWN_LOG, "denied"),
    ("zfs", ENOKEY, [], "denied"),
    ("usb_storage", INSTALL_FALSE, [], "denied"),
    ("nvidia_peermem", DEP_NOT_FOUND, [], "dependency_missing"),
    ("foo", EXEC_FORMAT, [], "unknown"),
    ("foo", "", [], "unknown"),
])
def test_classify_failure(name, output, log, expected):
    cls, msg = kmod.classify_failure(name, output, log)
    assert cls == expected
    assert name in msg


def test_peermem_message_explains_mofed_and_rdma():
    for name in ("nvidia_peermem", "nv_peer_mem"):
        cls, msg = kmod.classify_failure(name, PEERMEM_EINVAL.replace("nvidia_peermem", name), PEERMEM_LOG)
        assert cls == "invalid_argument"
        assert "MOFED" in msg and "RDMA" in msg and "harmless" in msg


def test_other_module_invalid_argument_quotes_the_log():
    cls, msg = kmod.classify_failure("foo", "modprobe: ERROR: could not insert 'foo': Invalid argument",
                                     ["foo: probe of 0000:41:00.0 failed with error -22"])
    assert cls == "invalid_argument"
    assert "MOFED" not in msg and "error -22" in msg


def test_symbol_mismatch_names_symbol():
    _cls, msg = kmod.classify_failure("nvidia_peermem", PEERMEM_EINVAL, MISMATCH_LOG)
    assert "ib_register_peer_memory_client" in msg and "MOFED" in msg


@pytest.mark.parametrize("output,expected", [
    ("modprobe: FATAL: Module nvidia is in use.", "in_use"),
    ("modprobe: FATAL: Module pcie_aspm is builtin.", "builtin"),
    ("modprobe: ERROR: could not remove 'msr': Operation not permitted", "denied"),
    ("rmmod: ERROR: ../libkmod/libkmod-module.c:799 kmod_module_remove_module() could not remove 'x': "
     "Resource temporarily unavailable", "in_use"),
    ("something odd", "unknown"),
])
def test_classify_unload_failure(output, expected):
    assert kmod.classify_unload_failure("x", output)[0] == expected


def test_kmsg_cursor_reads_only_new_records(build_node):
    root = build_node("tiny-vm")
    node = Node(root)
    cursor = kmod.KmsgCursor(node)
    assert cursor.available
    with open(node.path("dev/kmsg"), "a") as fh:
        fh.write("3,99,999999999,-;foo: Unknown symbol bar (err -2)\n")
    assert cursor.read_new() == ["foo: Unknown symbol bar (err -2)"]
    assert cursor.read_new() == []
    cursor.close()


def test_kmsg_cursor_missing_log(tmp_path):
    cursor = kmod.KmsgCursor(Node(str(tmp_path)))
    assert not cursor.available
    assert cursor.read_new() == []


def test_relevant_log_lines_filters_noise():
    lines = ["vxlan: non-ECT from 10.224.3.17 with TOS=0x2"] + PEERMEM_LOG + ["eth0: rx queue 3 refill ok"]
    assert kmod.relevant_log_lines(lines, "nvidia_peermem") == PEERMEM_LOG


@pytest.mark.parametrize("req,fragment", [
    (dict(name="nvidia;rm", state="present"), "letters, digits"),
    (dict(name="a" * 65, state="present"), "at most 64"),
    (dict(name="", state="present"), "letters, digits"),
    (dict(name="nvidia", state="loaded"), "present, absent"),
    (dict(name="nvidia", state="present", params={"a b": "1"}), "parameter name"),
    (dict(name="nvidia", state="present", params={"x": "1; reboot"}), "no whitespace"),
    (dict(name="nvidia", state="present", params={"x": "$(id)"}), "no whitespace"),
    (dict(name="nvidia", state="present", params={"x": None}), "no whitespace"),
    (dict(name="nvidia", state="absent", params={"x": "1"}), "only allowed with state=present"),
    # Anything modprobe could read as an option, or that splits its argv or a modprobe.d line.
    (dict(name="-r", state="present"), "not starting with '-'"),
    (dict(name="--remove", state="present"), "not starting with '-'"),
    (dict(name="nvidia\n", state="present"), "letters, digits"),
    (dict(name="nvidia\ninstall nvidia /bin/sh", state="present"), "letters, digits"),
    (dict(name="nvidia", state="present", params={"-r": "1"}), "parameter name"),
    (dict(name="nvidia", state="present", params={"x\n": "1"}), "parameter name"),
    (dict(name="nvidia", state="present", params={"x": "1\n"}), "no whitespace"),
    (dict(name="nvidia", state="present", params={"x": "1\ninstall nvidia /bin/sh"}), "no whitespace"),
    (dict(name="nvidia", state="present", params={"x": "a\tb"}), "no whitespace"),
    (dict(name="nvidia", state="present", params={"x": '"1"'}), "quotes"),
])
def test_validate_request(req, fragment):
    errors = kmod.validate_request(req)
    assert errors and fragment in "; ".join(errors)


def test_validate_accepts_good_params():
    assert kmod.validate_request(dict(name="nvidia-drm", state="present",
                                      params={"modeset": True, "fbdev": 1, "list": "1,2,0x3"})) == []


def test_same_module_twice_is_rejected():
    errors = kmod.validate_requests([dict(name="nvidia-drm", state="present"),
                                     dict(name="nvidia_drm", state="present")])
    assert errors == ["module nvidia_drm is given more than once"]


@pytest.mark.parametrize("requested,current,same", [
    ("1", "Y", True), ("0", "N", True), ("Y", "1", True), ("1", "N", False), ("4096", "4096", True),
    ("4096", "512", False), ("1", None, False),
])
def test_same_param_value(requested, current, same):
    assert kmod.same_param_value(requested, current) is same


def test_modprobe_args_never_a_shell_string():
    args = kmod.modprobe_args("/usr/sbin/modprobe", dict(name="nvidia", params={"b": True, "a": "x"}), "load")
    assert args == ["/usr/sbin/modprobe", "--", "nvidia", "a=x", "b=1"]
    assert kmod.modprobe_args("/m", dict(name="msr"), "unload") == ["/m", "-r", "--", "msr"]


def test_modprobe_options_line():
    req = dict(name="snd-hda-intel", state="present", params={"model": "auto", "index": -2, "enable": True})
    assert kmod.modprobe_options(req) == "options snd-hda-intel enable=1 index=-2 model=auto"
    assert kmod.modprobe_options(dict(name="msr", state="present", params={})) is None
