"""kmod_optional through its entry point, against simulated nodes and their simulated modprobe."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command

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


def test_simulated_root_without_modprobe_fails_cleanly(build_node, run_module, digest):
    root = build_node("tiny-vm")
    os.unlink(os.path.join(root, "usr/sbin/modprobe"))
    before = digest(root)
    result, failed = run_module("kmod_optional", {"name": "msr", "journal": JOURNAL, "root": root})
    assert failed and "never run against a simulated root" in result["msg"]
    assert digest(root) == before
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
