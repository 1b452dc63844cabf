"""Hostile values in role variables never reach a file or a command line (issue 12, class 2).

Each test runs ansible-playbook against a fresh simulated node (tools/simnode) with one bad
value in its inventory and checks that the run fails naming it, and that the node shows no trace
of it: the drop-in the value was meant for is not written, and the node's modprobe never ran.
The helpers are those of test_playbooks.py.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support.inventory import write_inventory
from support.nodes import BOOT_DESIRED, BOOT_RUNNER, assert_host_untouched, build_node, cstate_disabled, read_mrrs
from support.playbooks import assert_ok, failure_summary, run_playbook
from support.runner import run_boot_runner
from support.trees import snapshot, tree_changes

SYSCTL_DROPIN = "etc/sysctl.d/90-gpunode-tuning.conf"
# What the boot unit and the udev rule concerns write (relative to the node root).
BOOT_FILES = (
    BOOT_RUNNER,
    BOOT_DESIRED.lstrip("/"),
    "etc/systemd/system/gpunode-tuning-boot.service",
    "etc/systemd/system/multi-user.target.wants/gpunode-tuning-boot.service",
    "etc/udev/rules.d/70-gpunode-tuning.rules",
)
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
        assert [x for x in fh.read().splitlines() if not x.startswith("#")] == ["options msr allow_writes=1"]
    with open(os.path.join(root, "etc/modules-load.d/gpunode-tuning-msr.conf"), encoding="utf-8") as fh:
        assert fh.read().splitlines()[1:] == ["msr"]


# --- the boot script and the udev rule: every value they render is validated first -------------

# Each case: (variable, hostile value, what the message says about it). The script runs as root at
# every boot; the udev rule runs it on every hot-add.
BOOT_INJECTIONS = [
    ("gpunode_tuning_cpuidle_disable", ['C2"; touch /tmp/gpunode-injected; "'],
     "gpunode_tuning_cpuidle_disable: idle state name 'C2\"; touch /tmp/gpunode-injected; \"' is invalid: "
     "allowed is an idle state name as cpuidle/stateN/name shows it"),
    ("gpunode_tuning_cpuidle_disable", ["C2\ntouch /tmp/gpunode-injected"],
     "gpunode_tuning_cpuidle_disable: idle state name 'C2\\ntouch /tmp/gpunode-injected' is invalid"),
    ("gpunode_tuning_gpu_bdfs", ["41:00.0) reboot ;; *)"],
     "gpunode_tuning_gpu_bdfs: '41:00.0) reboot ;; *)' is not a PCI address: use DDDD:BB:DD.F or BB:DD.F"),
    ("gpunode_tuning_gpu_vendors", '10de", RUN+="/bin/sh -c id',
     "gpunode_tuning_gpu_vendors: vendor must be a 4-digit hex PCI id such as 10de or 0x10de"),
]


@pytest.mark.parametrize("variable,value,message", BOOT_INJECTIONS,
                         ids=["cstate-quote", "cstate-newline", "bdf", "vendor-udev"])
def test_hostile_boot_values_never_reach_the_boot_files_and_the_host_is_not_rebooted(
        tmp_path, variable, value, message):
    """A C-state name with `"; touch` or a newline used to be written into the root-run boot script. Each of
    these can be judged without the node: the precheck refuses it and nothing at all is written."""
    root = build_node(tmp_path / "node", cpus=4, gpus=1)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-boot": root}, gpunode_tuning_reboot_ok=True,
                                **{variable: value})
    before = snapshot(root)
    proc = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert proc.returncode != 0, proc.stdout[-4000:]
    summary = failure_summary(proc, "sim-boot")
    # The message names variable, value and rule, and that nothing changed.
    assert "bad variable(s), nothing was changed" in summary, summary
    assert message.replace(variable + ": ", "value of %s: " % variable, 1) in summary, summary
    assert tree_changes(before, snapshot(root)) == []
    for rel in BOOT_FILES:
        assert not os.path.lexists(os.path.join(root, rel)), rel
    assert not os.path.exists("/tmp/gpunode-injected")
    assert "Rebooting" not in proc.stdout
    assert_host_untouched()


def test_boot_runner_of_valid_values_selects_like_the_modules(tmp_path):
    """Short BDFs, an upper-case vendor, a name, a cpulist, EPP: the desired state holds them as given and
    the runner selects with the modules' own code (short BDFs match, the vendor's case does not matter)."""
    tuned = build_node(tmp_path / "tuned", cpus=4, gpus=2)
    inventory = write_inventory(
        tmp_path / "hosts.yml", {"sim-ok": tuned},
        gpunode_tuning_gpu_bdfs=["61:00.0"], gpunode_tuning_gpu_vendors="0x10DE",
        gpunode_tuning_cpuidle_disable=["C2"], gpunode_tuning_cpuidle_cpus="0-1,3",
        gpunode_tuning_cpufreq_epp="performance", gpunode_tuning_boot_unit_before=["vllm.service"])
    proc = run_playbook("tune.yml", inventory, "--tags", "persistent")
    assert_ok(proc)
    assert "Simulated root: never rebooted." in proc.stdout
    with open(os.path.join(tuned, BOOT_DESIRED.lstrip("/")), encoding="utf-8") as fh:
        desired = json.load(fh)
    assert desired["pcie_mrrs"]["bdfs"] == ["61:00.0"] and desired["cpuidle"]["cpus"] == "0-1,3"
    with open(os.path.join(tuned, "etc/systemd/system/gpunode-tuning-boot.service"), encoding="utf-8") as fh:
        assert "Before=vllm.service" in fh.read().splitlines()
    with open(os.path.join(tuned, "etc/udev/rules.d/70-gpunode-tuning.rules"), encoding="utf-8") as fh:
        assert ('ATTR{vendor}=="0x10de", RUN+="/usr/bin/python3 -I -B /%s --desired %s --only pcie_mrrs --bdf %%k"'
                % (BOOT_RUNNER, BOOT_DESIRED) in fh.read())

    fresh = build_node(tmp_path / "fresh", cpus=4, gpus=2)
    run = run_boot_runner(tuned, fresh)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [read_mrrs(fresh, bdf) for bdf in ("0000:41:00.0", "0000:61:00.0")] == [512, 4096]
    assert cstate_disabled(fresh, "C2") == {0, 1, 3}
    assert cstate_disabled(fresh, "C1") == set()


def test_a_null_latency_bound_leaves_the_idle_states_alone_at_boot_too(tmp_path):
    """No names and max_latency_us null is a no-op at runtime, and so at boot (the same rule)."""
    tuned = build_node(tmp_path / "tuned", cpus=2, gpus=1)
    inventory = write_inventory(tmp_path / "hosts.yml", {"sim-null": tuned},
                                gpunode_tuning_cpuidle_max_latency_us=None)
    assert_ok(run_playbook("tune.yml", inventory, "--tags", "boot_unit"))
    fresh = build_node(tmp_path / "fresh", cpus=2, gpus=1)
    run = run_boot_runner(tuned, fresh)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cpuidle: no state names and no latency bound: idle states left alone" in run.stdout
    for name in ("C1", "C2"):
        assert cstate_disabled(fresh, name) == set(), name
