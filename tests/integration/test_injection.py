"""Hostile values in role variables never reach a file or a command line (issue 12, class 2).

Each test runs ansible-playbook against a fresh simulated node (tools/simnode.py) with one bad
value in its inventory and checks that the run fails naming it, and that the node shows no trace
of it: the drop-in the value was meant for is not written, and the node's modprobe never ran.
The helpers are those of test_playbooks.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_playbooks import (  # noqa: E402  (this directory is put on sys.path above)
    assert_host_untouched,
    build_node,
    run_playbook,
    snapshot,
    tree_changes,
    write_inventory,
)

SYSCTL_DROPIN = "etc/sysctl.d/90-gpunode-tuning.conf"
INJECTED_SYSCTL = "x\nkernel.modprobe = /x"


def files_below(root, rel):
    """Every file below root/rel with its content (names relative to root)."""
    out = {}
    for dirpath, _dirs, names in os.walk(os.path.join(root, rel)):
        for name in names:
            full = os.path.join(dirpath, name)
            with open(full, encoding="utf-8", errors="replace") as fh:
                out[os.path.relpath(full, root)] = fh.read()
    return out


@pytest.fixture
def immutable():
    """chattr +i on paths (root ignores chmod), undone at teardown so tmp cleanup works."""
    done = []

    def _set(path):
        subprocess.run(["chattr", "+i", path], check=True)
        done.append(path)

    yield _set
    for path in reversed(done):
        subprocess.run(["chattr", "-i", path], check=False)


def logging_modprobe(root, log):
    """Put a wrapper in front of the node's modprobe that logs each call's arguments to ``log``."""
    path = os.path.join(root, "usr/sbin/modprobe")
    os.rename(path, path + ".real")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('#!/bin/sh\nprintf "%%s\\n" "$*" >> "%s"\nexec "$0.real" "$@"\n' % log)
    os.chmod(path, 0o755)


def test_newline_in_a_sysctl_value_never_reaches_the_dropin(tmp_path):
    """`kernel.osrelease: "x\\nkernel.modprobe = /x"` used to add a line to the drop-in, rc 0."""
    root = build_node(tmp_path / "node", cpus=4, gpus=1)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-inj": root},
                                gpunode_tuning_sysctl_extra={"kernel.osrelease": INJECTED_SYSCTL})
    with open(os.path.join(root, "proc/sys/kernel/osrelease"), encoding="utf-8") as fh:
        osrelease = fh.read()

    proc = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert "sysctl kernel.osrelease: value" in proc.stdout
    assert "contains line feed" in proc.stdout and "allowed is printable text" in proc.stdout
    # Nothing of the family was written: no drop-in, no half-written temporary file, and no
    # other sysctl.d file carries the injected key.
    assert not os.path.lexists(os.path.join(root, SYSCTL_DROPIN))
    assert files_below(root, "etc/sysctl.d") == {}
    with open(os.path.join(root, "proc/sys/kernel/osrelease"), encoding="utf-8") as fh:
        assert fh.read() == osrelease
    assert_host_untouched()


def test_a_missing_sysctl_key_is_named_and_the_others_are_persisted(tmp_path):
    root = build_node(tmp_path / "node", cpus=4, gpus=1)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-miss": root},
                                gpunode_tuning_sysctl_extra={"vm.no_such_key": 1})
    proc = run_playbook("tune.yml", inventory, "--tags", "sysctl")
    assert proc.returncode != 0
    assert "sysctl key vm.no_such_key does not exist on this node" in proc.stdout
    with open(os.path.join(root, SYSCTL_DROPIN), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert "vm.swappiness=10" in lines and "kernel.numa_balancing=0" in lines
    assert not any("no_such_key" in line for line in lines)
    with open(os.path.join(root, "proc/sys/vm/swappiness"), encoding="utf-8") as fh:
        assert fh.read() == "10\n"  # the runtime flow applied the valid keys too


def test_check_mode_reports_an_unwritable_sysctl_dir(tmp_path, immutable):
    """--check used to return 0 where the real run then failed on /etc/sysctl.d."""
    root = build_node(tmp_path / "node", cpus=4, gpus=1)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-ro": root})
    immutable(os.path.join(root, "etc/sysctl.d"))
    before = snapshot(root)
    proc = run_playbook("tune.yml", inventory, "--tags", "sysctl", "--check")
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert "the sysctl drop-in %s/%s cannot be written" % (root, SYSCTL_DROPIN) in proc.stdout
    assert "does not accept new files" in proc.stdout
    assert tree_changes(before, snapshot(root)) == []


def test_option_like_module_name_is_refused_before_modprobe_runs(tmp_path):
    """`name: -r` used to run `modprobe -r` (unloading a module) with failed=false."""
    root = build_node(tmp_path / "node", cpus=4, gpus=1)
    log = tmp_path / "modprobe.log"
    logging_modprobe(root, str(log))
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-kmod": root},
                                gpunode_tuning_kmod_modules=[{"name": "-r", "params": {}, "required": False}])
    before = snapshot(root)
    proc = run_playbook("tune.yml", inventory, "--tags", "kmod")
    assert proc.returncode != 0
    assert "module name '-r' is invalid" in proc.stdout and "not starting with '-'" in proc.stdout
    assert not log.exists(), log.read_text()
    assert tree_changes(before, snapshot(root)) == []


def test_unit_name_with_a_newline_never_reaches_the_boot_unit(tmp_path):
    root = build_node(tmp_path / "node", cpus=4, gpus=1)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-unit": root},
                                gpunode_tuning_boot_unit_before=["vllm.service\nExecStartPre=/bin/sh -c id"])
    before = snapshot(root)
    proc = run_playbook("tune.yml", inventory, "--tags", "boot_unit")
    assert proc.returncode != 0
    assert "gpunode_tuning_boot_unit_before: unit name" in proc.stdout
    assert "allowed is a systemd unit name" in proc.stdout
    assert tree_changes(before, snapshot(root)) == []


def test_module_options_are_persisted_as_kmod_optional_validated_them(tmp_path):
    """modprobe.d gets kmod_optional's own rendering (a boolean used to be written as True)."""
    root = build_node(tmp_path / "node", cpus=4, gpus=1)
    log = tmp_path / "modprobe.log"
    logging_modprobe(root, str(log))
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-opts": root},
                                gpunode_tuning_kmod_modules=[{"name": "msr", "params": {"allow_writes": True}}])
    proc = run_playbook("tune.yml", inventory, "--tags", "kmod")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert log.read_text().splitlines() == ["-- msr allow_writes=1"]
    with open(os.path.join(root, "etc/modprobe.d/gpunode-tuning-msr.conf"), encoding="utf-8") as fh:
        assert fh.read().splitlines()[1:] == ["options msr allow_writes=1"]
    with open(os.path.join(root, "etc/modules-load.d/gpunode-tuning-msr.conf"), encoding="utf-8") as fh:
        assert fh.read().splitlines()[1:] == ["msr"]
