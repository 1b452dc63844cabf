"""The kmod family: module_utils/families/kmod.py's validation, classification and kernel log cursor, then
the kmod_optional module (its API) through its entry point against simulated nodes and their simulated modprobe.
"""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils import basic

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, module_params
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
    assert (module_params.compare(requested, current) == module_params.SAME) is same


def test_modprobe_args_never_a_shell_string():
    args = kmod.modprobe_args("/usr/sbin/modprobe", dict(name="nvidia", params={"b": True, "a": "x"}), "load")
    assert args == ["/usr/sbin/modprobe", "--", "nvidia", "a=x", "b=1"]
    assert kmod.modprobe_args("/m", dict(name="msr"), "unload") == ["/m", "-r", "--", "msr"]


def test_modprobe_options_line():
    req = dict(name="snd-hda-intel", state="present", params={"model": "auto", "index": -2, "enable": True})
    assert kmod.modprobe_options(req) == "options snd-hda-intel enable=1 index=-2 model=auto"
    assert kmod.modprobe_options(dict(name="msr", state="present", params={})) is None


JOURNAL = "/var/lib/gpunode-tuning/journal.json"


def journal_of(root):
    with open(os.path.join(root, JOURNAL.lstrip("/"))) as fh:
        return json.load(fh)


def test_peermem_fails_softly_on_audited_node(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    result, failed = run_module("kmod_optional", {"name": "nvidia_peermem", "root": root})
    assert not failed
    assert result["changed"] is False
    assert result["reason_class"] == "invalid_argument"
    assert result["loaded"] is False and result["persist_ok"] is False
    assert "MOFED" in result["message"] and "RDMA" in result["message"]
    assert result["log"] == ["nvidia-peermem nv_mem_client_init:203 ERROR: ib_register_peer_memory_client failed"]
    assert result["modules"][0]["reason_class"] == "invalid_argument"
    assert not os.path.exists(os.path.join(root, "sys/module/nvidia_peermem"))


def test_peermem_required_fails_the_task(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    result, failed = run_module("kmod_optional", {"name": "nvidia_peermem", "required": True, "root": root})
    assert failed
    assert "nvidia_peermem (invalid_argument)" in result["msg"]
    assert result["modules"][0]["persist_ok"] is False


def test_load_then_rerun_is_unchanged(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    result, failed = run_module("kmod_optional", {"name": "tcp_bbr", "root": root})
    assert not failed and result["changed"] is True
    assert result["loaded"] and not result["already_loaded"] and result["persist_ok"]
    assert os.path.isdir(os.path.join(root, "sys/module/tcp_bbr"))
    result, failed = run_module("kmod_optional", {"name": "tcp_bbr", "root": root})
    assert not failed and result["changed"] is False and result["already_loaded"]


def test_params_are_passed_and_read_back(build_node, run_module):
    root = build_node("tiny-vm")
    result, failed = run_module("kmod_optional", {"name": "msr", "params": {"allow_writes": "on"}, "root": root})
    assert not failed and result["changed"]
    with open(os.path.join(root, "sys/module/msr/parameters/allow_writes")) as fh:
        assert fh.read().strip() == "on"
    assert result["param_drift"] == {}


def test_param_drift_is_reported_not_reloaded(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    before = digest(root)
    result, failed = run_module("kmod_optional", {"name": "nvidia", "params": {"NVreg_EnableGpuFirmware": 0},
                                                  "root": root})
    assert not failed and result["changed"] is False
    assert result["param_drift"] == {"NVreg_EnableGpuFirmware": {"requested": "0", "current": "1"}}
    assert "not reloaded" in result["message"]
    assert digest(root) == before


def test_not_found_is_reported(build_node, run_module):
    root = build_node("tiny-vm")
    result, failed = run_module("kmod_optional", {"modules": [{"name": "no_such_mod"}, {"name": "msr"}],
                                                  "root": root})
    assert not failed
    by_name = {m["name"]: m for m in result["modules"]}
    assert by_name["no_such_mod"]["reason_class"] == "not_found"
    assert by_name["msr"]["loaded"] and by_name["msr"]["changed"]
    assert result["changed"] is True
    assert "name" not in result  # the list form has no top-level copy


def test_list_form_inherits_top_level_required(build_node, run_module):
    root = build_node("tiny-vm")
    result, failed = run_module("kmod_optional", {
        "modules": [{"name": "no_such_mod"}, {"name": "nvidia_peermem", "required": False}],
        "required": True, "root": root})
    assert failed
    assert "no_such_mod (not_found)" in result["msg"] and "nvidia_peermem" not in result["msg"]


def test_check_mode_predicts_and_writes_nothing(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    before = digest(root)
    result, failed = run_module("kmod_optional", {
        "modules": [{"name": "tcp_bbr"}, {"name": "nvidia"}, {"name": "nvidia_peermem"}],
        "journal": JOURNAL, "root": root}, check=True, diff=True)
    assert not failed and result["changed"] is True
    by_name = {m["name"]: m for m in result["modules"]}
    assert by_name["tcp_bbr"]["message"] == "would load"
    assert by_name["nvidia"]["already_loaded"] and not by_name["nvidia"]["changed"]
    assert result["diff"]["after"]["tcp_bbr"] == "loaded" and result["diff"]["before"]["tcp_bbr"] == "not loaded"
    assert digest(root) == before


def test_check_mode_already_loaded_is_no_change(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    result, failed = run_module("kmod_optional", {"name": "nvidia", "root": root}, check=True)
    assert not failed and result["changed"] is False


def test_unload_and_absent_noop(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    result, failed = run_module("kmod_optional", {"name": "mlx5_core", "state": "absent", "root": root})
    assert not failed and result["changed"] and not result["loaded"]
    assert not os.path.exists(os.path.join(root, "sys/module/mlx5_core"))
    result, failed = run_module("kmod_optional", {"name": "mlx5_core", "state": "absent", "root": root})
    assert not failed and result["changed"] is False


def test_builtin_cannot_be_unloaded(build_node, run_module):
    root = build_node("tiny-vm")
    result, failed = run_module("kmod_optional", {"name": "pcie_aspm", "state": "absent", "root": root})
    assert not failed and result["reason_class"] == "builtin"
    result, failed = run_module("kmod_optional", {"name": "pcie_aspm", "state": "absent", "required": True,
                                                  "root": root})
    assert failed and "builtin" in result["msg"]


def test_journal_then_restore_gives_identical_tree(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    before = digest(root)
    result, failed = run_module("kmod_optional", {"modules": [{"name": "tcp_bbr"}, {"name": "nvidia"}],
                                                  "journal": JOURNAL, "root": root})
    assert not failed and result["changed"]
    # Only the module this task loaded is journaled (nvidia was loaded already).
    assert set(journal_of(root)["families"]["kmod"]) == {"tcp_bbr"}
    result, failed = run_module("kmod_optional", {"restore": True, "journal": JOURNAL, "root": root}, check=True)
    assert not failed and result["changed"] is True
    assert os.path.isdir(os.path.join(root, "sys/module/tcp_bbr"))
    result, failed = run_module("kmod_optional", {"restore": True, "journal": JOURNAL, "root": root})
    assert not failed and result["changed"] is True
    assert [m["name"] for m in result["modules"]] == ["tcp_bbr"]
    assert digest(root) == before
    result, failed = run_module("kmod_optional", {"restore": True, "journal": JOURNAL, "root": root})
    assert not failed and result["changed"] is False


def test_failed_load_leaves_no_journal_entry(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    result, failed = run_module("kmod_optional", {"modules": [{"name": "nvidia_peermem"}, {"name": "msr"}],
                                                  "journal": JOURNAL, "root": root})
    assert not failed
    assert set(journal_of(root)["families"]["kmod"]) == {"msr"}


def test_simulated_root_never_runs_host_modprobe(build_node, run_module, monkeypatch):
    root = build_node("tiny-vm")
    seen = []
    real = command.run

    def spy(argv, *a, **k):
        seen.append(list(argv))
        return real(argv, *a, **k)

    monkeypatch.setattr(command, "run", spy)
    run_module("kmod_optional", {"name": "msr", "root": root})
    assert seen == [[os.path.join(root, "usr/sbin/modprobe"), "--", "msr"]]


@pytest.mark.parametrize("args,fragment", [
    ({"name": "nvidia;rm"}, "letters, digits"),
    ({"name": "nvidia rm"}, "letters, digits"),
    ({"name": "../../bin/sh"}, "letters, digits"),
    ({"name": "x" * 65}, "at most 64"),
    ({"name": "nvidia", "state": "loaded"}, "present, absent"),
    ({"name": "nvidia", "params": {"NVreg`id`": "1"}}, "parameter name"),
    ({"name": "nvidia", "params": {"NVreg_EnableGpuFirmware": "1 extra=2"}}, "no whitespace"),
    ({"name": "nvidia", "params": {"NVreg_EnableGpuFirmware": "1|reboot"}}, "no whitespace"),
    ({"name": "nvidia", "params": {"a": "1"}, "state": "absent"}, "only allowed with state=present"),
    ({"modules": [{"name": "ok"}, {"name": "bad$name"}]}, "letters, digits"),
    ({"modules": [{"name": "msr"}, {"name": "msr"}]}, "more than once"),
    ({"name": "msr", "modules": [{"name": "nvidia"}]}, "mutually exclusive"),
    ({"restore": True}, "journal"),
    ({}, "one of name or modules"),
    ({"name": "msr", "journal": "relative/journal.json"}, "absolute"),
    ({"name": "-r"}, "not starting with '-'"),
    ({"name": "msr\n"}, "letters, digits"),
    ({"name": "msr", "params": {"allow_writes": "on\ninstall msr /bin/sh"}}, "no whitespace"),
])
def test_bad_input_fails_and_writes_nothing(build_node, run_module, digest, args, fragment):
    root = build_node("tiny-vm")
    before = digest(root)
    result, failed = run_module("kmod_optional", dict(args, root=root))
    assert failed
    assert fragment in result["msg"]
    assert digest(root) == before


def test_without_modprobe_nothing_runs_and_only_required_modules_fail(build_node, run_module, digest, monkeypatch):
    warnings = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda _self, msg: warnings.append(msg))
    root = build_node("tiny-vm")
    os.unlink(os.path.join(root, "usr/sbin/modprobe"))
    before = digest(root)
    # A required module fails the family, naming why; an optional one is a warning, as any load that fails.
    result, failed = run_module("kmod_optional", {"name": "msr", "required": True, "journal": JOURNAL, "root": root})
    assert failed and "msr (no_modprobe)" in result["msg"] and "never run against a simulated root" in result["msg"]
    assert digest(root) == before
    result, failed = run_module("kmod_optional", {"modules": [{"name": "msr"}, {"name": "virtio_net"}],
                                                  "journal": JOURNAL, "root": root})
    assert not failed and result["changed"] is False
    msr, virtio = result["modules"]
    assert (msr["reason_class"], msr["loaded"], msr["persist_ok"]) == ("no_modprobe", False, False)
    assert "has no usr/sbin/modprobe" in msr["message"]
    assert virtio["reason_class"] is None and virtio["already_loaded"]
    assert [w for w in warnings if "no_modprobe" in w] == ["msr: %s (no_modprobe; not required)" % msr["message"]]
    assert digest(root) == before  # no journal written: nothing was loaded
    # Nothing to run: no modprobe needed.
    result, failed = run_module("kmod_optional", {"name": "virtio_net", "root": root})
    assert not failed and result["already_loaded"]


def spy_commands(monkeypatch):
    """Record every command the module runs (and still run it)."""
    seen = []
    real = command.run

    def spy(argv, *a, **k):
        seen.append(list(argv))
        return real(argv, *a, **k)

    monkeypatch.setattr(command, "run", spy)
    return seen


@pytest.mark.parametrize("modules", [
    [{"name": "-r"}],
    [{"name": "-r", "state": "absent"}],
    [{"name": "tcp_bbr"}, {"name": "--remove"}],
    [{"name": "tcp_bbr", "params": {"-r": "mlx5_core"}}],
])
def test_option_like_names_never_reach_modprobe(build_node, run_module, digest, monkeypatch, modules):
    """`name: -r` used to run `modprobe -r` and unload a module with failed=false."""
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    seen = spy_commands(monkeypatch)
    before = digest(root)
    result, failed = run_module("kmod_optional", {"modules": modules, "journal": JOURNAL, "root": root})
    assert failed and "invalid input, nothing was run" in result["msg"]
    assert "allowed are" in result["msg"]
    assert seen == []
    assert digest(root) == before
    assert os.path.isdir(os.path.join(root, "sys/module/mlx5_core"))


def test_params_come_back_as_the_modprobe_d_line(build_node, run_module):
    root = build_node("tiny-vm")
    result, failed = run_module("kmod_optional", {"name": "msr", "params": {"allow_writes": True}, "root": root})
    assert not failed
    assert result["modprobe_options"] == "options msr allow_writes=1"
    result, failed = run_module("kmod_optional", {"modules": [{"name": "cpuid"}], "root": root}, check=True)
    assert result["modules"][0]["modprobe_options"] is None


def _modprobe_that_cannot_unload(root, module):
    """Wrap the node's modprobe so that `modprobe -r -- MODULE` fails as for a module in use."""
    path = os.path.join(root, "usr/sbin/modprobe")
    os.rename(path, path + ".real")
    with open(path, "w") as fh:
        fh.write('#!/bin/sh\ncase " $* " in *" -r "*" %s "*) echo "modprobe: FATAL: Module %s is in use." >&2; '
                 'exit 1 ;; esac\nexec "$0.real" "$@"\n' % (module, module))
    os.chmod(path, 0o755)


def test_restore_goes_on_past_a_module_it_cannot_unload(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    result, failed = run_module("kmod_optional", {"modules": [{"name": "msr"}, {"name": "tcp_bbr"}],
                                                  "journal": JOURNAL, "root": root})
    assert not failed and result["changed"]
    _modprobe_that_cannot_unload(root, "msr")
    result, failed = run_module("kmod_optional", {"restore": True, "journal": JOURNAL, "root": root})
    assert failed
    assert "msr (in_use)" in result["msg"] and "stay in the journal" in result["msg"]
    by_name = {m["name"]: m for m in result["modules"]}
    assert by_name["tcp_bbr"]["changed"] and not os.path.exists(os.path.join(root, "sys/module/tcp_bbr"))
    assert os.path.isdir(os.path.join(root, "sys/module/msr"))
    assert set(journal_of(root)["families"]["kmod"]) == {"msr"}


def test_restore_never_passes_a_foreign_journal_name(build_node, run_module, monkeypatch):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    run_module("kmod_optional", {"name": "tcp_bbr", "journal": JOURNAL, "root": root})
    data = journal_of(root)
    data["families"]["kmod"]["-r"] = dict(data["families"]["kmod"]["tcp_bbr"])
    with open(os.path.join(root, JOURNAL.lstrip("/")), "w") as fh:
        json.dump(data, fh)
    seen = spy_commands(monkeypatch)
    result, failed = run_module("kmod_optional", {"restore": True, "journal": JOURNAL, "root": root})
    assert failed and "-r (invalid_name)" in result["msg"]
    assert seen == [[os.path.join(root, "usr/sbin/modprobe"), "-r", "--", "tcp_bbr"]]
    assert os.path.isdir(os.path.join(root, "sys/module/mlx5_core"))
    assert set(journal_of(root)["families"]["kmod"]) == {"-r"}
