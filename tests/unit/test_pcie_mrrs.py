"""The pcie_mrrs family through the setpci_mrrs module (its API), on simulated nodes, with the real setpci;
then with faulty devices (issue 12, class 4): one bad device never stops the others.

Faults are injected on the audited 8-GPU node as root: an immutable config file (``chattr +i``;
``chmod`` does not stop root), a config space truncated to its 64-byte header, a config that
vanishes mid-run (a setpci wrapper shipped in the node's ``usr/sbin``, which ``Node.bin_path``
prefers, deletes it before running the real setpci), a config replaced by a directory. The
real setpci runs against the simulated sysfs throughout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess

import pytest
from ansible.module_utils import basic
from support.lspci import parse_lspci_devctl

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node

SETPCI = shutil.which("setpci")
LSPCI = shutil.which("lspci")
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
AUDITED_GPUS = ["0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0", "0000:81:00.0",
                "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0"]


def devctl(cfg):
    return struct.unpack_from("<H", cfg, 0x78 + 8)[0]


def assert_only_mrrs_changed(before, after, expected):
    """Configs differ only in DevCtl bits 14:12 of ``expected`` ({bdf: mrrs}); all else byte-identical."""
    for bdf, old in before.items():
        new = after[bdf]
        if bdf not in expected:
            assert new == old, "%s was touched" % bdf
            continue
        cap = pci.find_capability(old, 0x10)
        assert old[:cap + 8] == new[:cap + 8] and old[cap + 10:] == new[cap + 10:], bdf
        o, n = struct.unpack_from("<H", old, cap + 8)[0], struct.unpack_from("<H", new, cap + 8)[0]
        assert (o ^ n) & ~0x7000 == 0, "%s: bits outside 14:12 changed: %04x -> %04x" % (bdf, o, n)
        assert pci.mrrs_of_devctl(n) == expected[bdf], bdf


def lspci_devctl(root):
    argv = [LSPCI] + Node(root).pciutils_args() + ["-D", "-vvv"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), check=True)
    return parse_lspci_devctl(proc.stdout)


@pytest.fixture
def warnings_seen(monkeypatch):
    seen = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, w, *a, **k: seen.append(w))
    return seen


@pytest.fixture
def commands_run(monkeypatch):
    """Every argv the module runs (the commands still run)."""
    seen = []
    real = command.run

    def spy(argv, *a, **k):
        seen.append(list(argv))
        return real(argv, *a, **k)

    monkeypatch.setattr(command, "run", spy)
    return seen


# --- applying -------------------------------------------------------------------------------


def test_sets_gpus_only_and_nothing_else(build_node, run_module, commands_run):
    root = build_node("audited-epyc-8gpu", cpus=4)
    before = configs(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    assert not failed, result["msg"]
    assert result["changed"] and result["failed_devices"] == []
    assert [d["bdf"] for d in result["devices"]] == AUDITED_GPUS
    gpu = result["devices"][2]
    assert gpu == {"bdf": "0000:41:00.0", "vendor": "0x10de", "device": "0x2bb5", "class": "0x030200",
                   "numa_node": 0, "mps": 256, "mrrs_before": 512, "mrrs_after": 4096, "changed": True,
                   "skipped": False, "failed": False, "reason": "set"}
    after = configs(root)
    assert_only_mrrs_changed(before, after, {b: 4096 for b in AUDITED_GPUS})
    # The audio function, the NIC, the NVMe drive and every bridge kept their bytes.
    for bdf in ("0000:41:00.1", "0000:c2:00.0", "0000:e3:00.0", "0000:40:01.1", "0000:c0:03.1"):
        assert after[bdf] == before[bdf]
    # Independent check with the real lspci.
    seen = lspci_devctl(root)
    assert all(seen[b] == {"mps": 256, "mrrs": 4096} for b in AUDITED_GPUS)
    assert seen["0000:41:00.1"]["mrrs"] == 512 and seen["0000:c2:00.0"]["mrrs"] == 512
    # Exactly two setpci processes: one write for all, one read-back for all; mask 0x7000 only.
    assert result["setpci_calls"] == 2 and len(commands_run) == 2
    write = commands_run[0]
    assert write.count("-s") == 8
    assert [a for a in write if a.startswith("CAP_EXP")] == ["CAP_EXP+08.w=5000:7000"] * 8


def test_rerun_reports_no_change_and_runs_nothing(build_node, run_module, commands_run, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    run_module("setpci_mrrs", {"mrrs": 2048, "root": root})
    snap = digest(root)
    commands_run.clear()
    result, failed = run_module("setpci_mrrs", {"mrrs": 2048, "root": root})
    assert not failed and not result["changed"]
    assert all(not d["changed"] and d["mrrs_before"] == d["mrrs_after"] == 2048 for d in result["devices"])
    assert all(d["reason"] == "already 2048" for d in result["devices"])
    assert commands_run == [] and digest(root) == snap


def test_check_mode_writes_nothing_and_predicts(build_node, run_module, digest, commands_run):
    root = build_node("audited-epyc-8gpu", cpus=4)
    snap = digest(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL},
                                check=True, diff=True)
    assert not failed and result["changed"]
    assert digest(root) == snap and commands_run == []
    assert all(d["mrrs_after"] == 4096 and d["changed"] for d in result["devices"])
    assert result["diff"]["before"]["0000:41:00.0"] == {"mrrs": 512}
    assert result["diff"]["after"]["0000:41:00.0"] == {"mrrs": 4096}
    assert set(result["diff"]["before"]) == set(AUDITED_GPUS)


def test_diff_only_in_diff_mode(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    result, failed = run_module("setpci_mrrs", {"mrrs": 1024, "root": root}, check=True)
    assert not failed and "diff" not in result
    result, failed = run_module("setpci_mrrs", {"mrrs": 1024, "root": root}, diff=True)
    assert not failed
    assert result["diff"]["after"]["0000:e1:00.0"] == {"mrrs": 1024}


def test_switch_topology_gpus_set_ports_untouched(build_node, run_module):
    root = build_node("xeon-4gpu-switch", cpus=4)
    before = configs(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    assert not failed
    gpus = ["0000:18:00.0", "0000:19:00.0", "0000:1a:00.0", "0000:1b:00.0"]
    assert [d["bdf"] for d in result["devices"]] == gpus
    assert_only_mrrs_changed(before, configs(root), {b: 4096 for b in gpus})


def test_selection_by_vendor_class_and_bdfs(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    before = configs(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 2048, "root": root, "vendor": "15B3",
                                                "class_prefixes": ["0200"]})
    assert not failed and [d["bdf"] for d in result["devices"]] == ["0000:c2:00.0"]
    result, failed = run_module("setpci_mrrs", {"mrrs": 1024, "root": root, "bdfs": ["41:00.0", "0000:61:00.0"]})
    assert not failed and [d["bdf"] for d in result["devices"]] == ["0000:41:00.0", "0000:61:00.0"]
    assert_only_mrrs_changed(before, configs(root), {"0000:c2:00.0": 2048, "0000:41:00.0": 1024,
                                                     "0000:61:00.0": 1024})


def test_device_without_pcie_capability_is_skipped(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    cfg_path = os.path.join(root, "sys/bus/pci/devices/0000:61:00.0/config")
    with open(cfg_path, "r+b") as fh:  # clear "capability list present" in the Status register
        fh.seek(0x06)
        fh.write(b"\x00")
    before = configs(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    assert not failed
    dev = next(d for d in result["devices"] if d["bdf"] == "0000:61:00.0")
    assert dev["skipped"] and not dev["changed"] and dev["reason"] == "no PCI Express capability"
    assert dev["mrrs_before"] is None
    expected = {b: 4096 for b in AUDITED_GPUS if b != "0000:61:00.0"}
    assert_only_mrrs_changed(before, configs(root), expected)


# --- journal and restore --------------------------------------------------------------------


def test_restore_brings_back_identical_bytes(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    pristine, before = digest(root), configs(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL})
    assert not failed
    with open(os.path.join(root, JOURNAL.lstrip("/"))) as fh:
        recorded = json.load(fh)["families"]["pcie_mrrs"]
    assert {b: e["original"] for b, e in recorded.items()} == {b: 512 for b in AUDITED_GPUS}
    # A second tuning does not overwrite the recorded originals.
    run_module("setpci_mrrs", {"mrrs": 2048, "root": root, "journal": JOURNAL})
    with open(os.path.join(root, JOURNAL.lstrip("/"))) as fh:
        assert all(e["original"] == 512 for e in json.load(fh)["families"]["pcie_mrrs"].values())
    # Restore in check mode changes nothing.
    snap = digest(root)
    result, failed = run_module("setpci_mrrs", {"restore": True, "root": root, "journal": JOURNAL}, check=True)
    assert not failed and result["changed"] and digest(root) == snap
    result, failed = run_module("setpci_mrrs", {"restore": True, "root": root, "journal": JOURNAL}, diff=True)
    assert not failed and result["changed"]
    assert all(d["mrrs_before"] == 2048 and d["mrrs_after"] == 512 for d in result["devices"])
    assert result["diff"]["after"]["0000:41:00.0"] == {"mrrs": 512}
    assert configs(root) == before
    # The emptied journal is removed, so the whole tree is as built.
    assert digest(root) == pristine
    result, failed = run_module("setpci_mrrs", {"restore": True, "root": root, "journal": JOURNAL})
    assert not failed and not result["changed"] and result["devices"] == []


def test_restore_keeps_entries_of_absent_devices(build_node, run_module, warnings_seen):
    root = build_node("audited-epyc-8gpu", cpus=4)
    run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL, "bdfs": ["41:00.0"]})
    path = os.path.join(root, JOURNAL.lstrip("/"))
    with open(path) as fh:
        data = json.load(fh)
    data["families"]["pcie_mrrs"]["0000:99:00.0"] = {"original": 256, "recorded": "2026-01-01T00:00:00Z"}
    with open(path, "w") as fh:
        json.dump(data, fh)
    result, failed = run_module("setpci_mrrs", {"restore": True, "root": root, "journal": JOURNAL})
    assert not failed
    gone = next(d for d in result["devices"] if d["bdf"] == "0000:99:00.0")
    assert gone["skipped"] and "not present" in gone["reason"]
    assert any("0000:99:00.0" in w for w in warnings_seen)
    with open(path) as fh:
        assert list(json.load(fh)["families"]["pcie_mrrs"]) == ["0000:99:00.0"]
    assert pci.mrrs_of_devctl(devctl(configs(root)["0000:41:00.0"])) == 512


# --- refusals and failures ------------------------------------------------------------------


def test_lockdown_refuses_before_writing(build_node, run_module, digest, warnings_seen, commands_run):
    root = build_node("locked-bus-perf", cpus=4)
    snap = digest(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL})
    assert failed
    assert "kernel lockdown is in integrity mode" in result["msg"] and "nothing was written" in result["msg"]
    assert "0000:41:00.0" in result["msg"] and "0000:61:00.0" in result["msg"]
    assert result["lockdown"] == "integrity" and result["pcie_bus_perf"] is True
    assert digest(root) == snap and commands_run == []  # no journal written either
    assert any("pci=pcie_bus_perf" in w for w in warnings_seen)


@pytest.mark.parametrize("mode", ["integrity", "confidentiality"])
def test_lockdown_modes_on_an_otherwise_writable_node(build_node, run_module, digest, mode):
    root = build_node("audited-epyc-8gpu", cpus=4)
    with open(os.path.join(root, "sys/kernel/security/lockdown"), "w") as fh:
        fh.write("none integrity confidentiality".replace(mode, "[%s]" % mode) + "\n")
    snap = digest(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL})
    assert failed and ("kernel lockdown is in %s mode" % mode) in result["msg"]
    assert result["lockdown"] == mode and result["pcie_bus_perf"] is False
    assert digest(root) == snap
    # Check mode predicts the same refusal.
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root}, check=True)
    assert failed and "lockdown" in result["msg"]


def test_lockdown_with_nothing_to_change_passes_and_warns_about_bus_perf(build_node, run_module, warnings_seen):
    root = build_node("locked-bus-perf", cpus=4)
    result, failed = run_module("setpci_mrrs", {"mrrs": 256, "root": root})
    assert not failed and not result["changed"]
    assert [d["mrrs_before"] for d in result["devices"]] == [256, 256]
    assert result["pcie_bus_perf"] is True
    assert any("pci=pcie_bus_perf" in w and "MPS" in w for w in warnings_seen)


def test_empty_selection_fails_unless_allowed(build_node, run_module, digest):
    root = build_node("tiny-vm")
    snap = digest(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    assert failed and "allow_empty" in result["msg"] and "NVIDIA and AMD GPUs" in result["msg"]
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "allow_empty": True})
    assert not failed and not result["changed"] and result["devices"] == []
    # A named device without a PCIe capability is skipped with its reason; that alone is empty.
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "bdfs": ["00:03.0"]})
    assert failed and "allow_empty" in result["msg"]
    assert result["devices"][0]["reason"] == "no PCI Express capability"
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "bdfs": ["00:03.0"],
                                                "allow_empty": True})
    assert not failed and result["devices"][0]["skipped"]
    assert digest(root) == snap


IGNORING_SETPCI = """#!/bin/sh
# A device that ignores config writes: run the real setpci, then put {bdf}'s config back.
cfg="{root}/sys/bus/pci/devices/{bdf}/config"
saved=$(mktemp)
cp "$cfg" "$saved"
{setpci} "$@"
rc=$?
cat "$saved" > "$cfg"
rm -f "$saved"
exit $rc
"""


def test_device_ignoring_the_write_fails_the_task_but_others_are_set(build_node, run_module):
    """The node ships a setpci wrapper (Node.bin_path prefers <root>/usr/sbin/setpci) that undoes
    every write to 61:00.0 after the real setpci ran: the device ignores writes."""
    root = build_node("audited-epyc-8gpu", cpus=4)
    wrapper = os.path.join(root, "usr/sbin/setpci")
    with open(wrapper, "w") as fh:
        fh.write(IGNORING_SETPCI.format(root=root, bdf="0000:61:00.0", setpci=SETPCI))
    os.chmod(wrapper, 0o755)
    before = configs(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    assert failed
    assert result["failed_devices"] == ["0000:61:00.0"]
    assert "0000:61:00.0: wrote MRRS 4096 but Device Control reads back 0x293f (MRRS 512): the write did " \
           "not take (the device ignored it). 7 other device(s) were set" in result["msg"]
    bad = next(d for d in result["devices"] if d["bdf"] == "0000:61:00.0")
    assert bad["failed"] and not bad["changed"] and bad["mrrs_after"] == 512
    others = [b for b in AUDITED_GPUS if b != "0000:61:00.0"]
    assert all(d["mrrs_after"] == 4096 and d["changed"] for d in result["devices"] if d["bdf"] in others)
    assert result["changed"]
    assert_only_mrrs_changed(before, configs(root), {b: 4096 for b in others})


def test_setpci_missing_names_the_package(build_node, run_module, monkeypatch, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    snap = digest(root)
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, *a, **k: None)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    assert failed and result["msg"] == "setpci not found: install the pciutils package on the node"
    assert digest(root) == snap


def test_header_only_config_is_named_as_such_not_as_permissions_when_root(build_node, run_module, digest):
    """As root, a 64-byte config space is a device that is not fully visible, not a permission
    problem; the other GPUs are still set and the task fails at the end naming that device."""
    root = build_node("audited-epyc-8gpu", cpus=4)
    with open(os.path.join(root, "sys/bus/pci/devices/0000:81:00.0/config"), "r+b") as fh:
        fh.truncate(64)
    before = configs(root)
    snap = digest(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root}, check=True)
    assert failed and digest(root) == snap
    assert "0000:81:00.0: config space is only 64 bytes: the device is not fully visible (no PCIe " \
           "capability readable)" in result["msg"]
    assert "as root" not in result["msg"] and "check mode" in result["msg"]
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    assert failed and result["failed_devices"] == ["0000:81:00.0"] and result["changed"]
    assert "run the module as root" not in result["msg"] and "7 other device(s) were set" in result["msg"]
    others = [b for b in AUDITED_GPUS if b != "0000:81:00.0"]
    assert_only_mrrs_changed(before, configs(root), {b: 4096 for b in others})


def test_header_only_config_asks_for_root_when_not_root(build_node, run_module, monkeypatch, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    for bdf in AUDITED_GPUS:  # what an unprivileged reader sees
        with open(os.path.join(root, "sys/bus/pci/devices", bdf, "config"), "r+b") as fh:
            fh.truncate(64)
    snap = digest(root)
    monkeypatch.setattr(pci.os, "geteuid", lambda: 1000)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    assert failed and result["failed_devices"] == AUDITED_GPUS and not result["changed"]
    assert all("only 64 bytes" in d["reason"] and d["reason"].endswith("run the module as root (become: true)")
               for d in result["devices"])
    assert result["setpci_calls"] == 0 and digest(root) == snap


@pytest.mark.parametrize("args,match", [
    ({"mrrs": 300}, "value of mrrs must be one of: 128, 256, 512, 1024, 2048, 4096"),
    ({"mrrs": 8192}, "value of mrrs must be one of: 128, 256, 512, 1024, 2048, 4096"),
    ({"mrrs": "big"}, "mrrs"),
    ({}, "mrrs is required (one of 128, 256, 512, 1024, 2048, 4096 bytes) unless restore=true"),
    ({"mrrs": 4096, "bdfs": ["41:00"]}, "use DDDD:BB:DD.F or BB:DD.F"),
    ({"mrrs": 4096, "bdfs": ["41:00.0;reboot"]}, "use DDDD:BB:DD.F or BB:DD.F"),
    ({"mrrs": 4096, "bdfs": ["41:00.0", "$(touch /tmp/x)"]}, "use DDDD:BB:DD.F or BB:DD.F"),
    ({"mrrs": 4096, "bdfs": ["0000:41:20.0"]}, "device 00-1f, function 0-7"),
    ({"mrrs": 4096, "bdfs": ["0000:99:00.0"]}, "bdfs not present on the node: 0000:99:00.0 (present: 0000:00:01.1"),
    ({"mrrs": 4096, "vendor": "nvidia"}, "vendor must be a 4-digit hex PCI id such as 10de or 0x10de"),
    ({"mrrs": 4096, "vendor": "0x10de0"}, "vendor must be a 4-digit hex PCI id"),
    ({"mrrs": 4096, "device": "2b-b5"}, "device must be a 4-digit hex PCI id"),
    ({"mrrs": 4096, "class_prefixes": ["030"]}, "is not 2, 4 or 6 hex digits"),
    ({"mrrs": 4096, "class_prefixes": ["0x03xx"]}, "is not 2, 4 or 6 hex digits"),
    ({"restore": True}, "restore=true needs the journal option"),
    ({"mrrs": 4096, "journal": "journal.json"}, "journal path must be absolute"),
])
def test_bad_input_fails_naming_what_is_allowed_and_writes_nothing(build_node, run_module, digest, args, match):
    root = build_node("audited-epyc-8gpu", cpus=4)
    snap = digest(root)
    result, failed = run_module("setpci_mrrs", dict(args, root=root))
    assert failed, result
    assert match in result["msg"]
    assert digest(root) == snap


def test_unwritable_journal_fails_before_any_config_write(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    before = configs(root)
    with open(os.path.join(root, "var/lib/gpunode-tuning"), "w") as fh:  # a file where the directory goes
        fh.write("")
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL})
    assert failed and "cannot save the journal" in result["msg"] and "nothing was written" in result["msg"]
    assert configs(root) == before


GPUS = ["0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0", "0000:81:00.0", "0000:a1:00.0",
        "0000:c1:00.0", "0000:e1:00.0"]
IMMUTABLE, SHORT, VANISHING, DIRECTORY = "0000:21:00.0", "0000:41:00.0", "0000:61:00.0", "0000:81:00.0"
HEALTHY = ["0000:01:00.0", "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0"]
DEVCTL = 0x78 + 8  # the GPUs' PCIe capability is at 0x78

REMOVING_SETPCI = """#!/bin/sh
# {bdf} is hot-removed while the task runs: its config goes before setpci starts.
rm -f "{cfg}"
exec {setpci} "$@"
"""

FREEZING_SETPCI = """#!/bin/sh
# {bdf}'s config becomes immutable while the task runs: the write is refused by the filesystem.
chattr +i "{cfg}"
exec {setpci} "$@"
"""


def cfg_path(root, bdf):
    return os.path.join(root, "sys/bus/pci/devices", bdf, "config")


def read_cfg(root, bdf):
    with open(cfg_path(root, bdf), "rb") as fh:
        return fh.read()


def configs(root):
    """{bdf: config bytes} of every function whose config is a readable file."""
    out = {}
    for bdf in sorted(os.listdir(os.path.join(root, "sys/bus/pci/devices"))):
        if os.path.isfile(cfg_path(root, bdf)):
            out[bdf] = read_cfg(root, bdf)
    return out


def setpci_mrrs(root, bdfs):
    """MRRS of ``bdfs`` as the real setpci reads them (one process)."""
    argv = [SETPCI] + Node(root).pciutils_args()
    for bdf in bdfs:
        argv += ["-s", bdf, "CAP_EXP+08.w"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    return {b: pci.mrrs_of_devctl(int(v, 16)) for b, v in zip(bdfs, out, strict=True)}


def journal_entries(root):
    path = os.path.join(root, JOURNAL.lstrip("/"))
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        return {b: e["original"] for b, e in json.load(fh)["families"].get("pcie_mrrs", {}).items()}


def ship_setpci(root, template, bdf):
    """Install a setpci wrapper in the node's usr/sbin (preferred by Node.bin_path)."""
    wrapper = os.path.join(root, "usr/sbin/setpci")
    with open(wrapper, "w") as fh:
        fh.write(template.format(bdf=bdf, cfg=cfg_path(root, bdf), setpci=SETPCI))
    os.chmod(wrapper, 0o755)


def chattr(flag, path):
    proc = subprocess.run(["chattr", flag, path], capture_output=True, text=True, check=False)
    if proc.returncode != 0 and flag == "+i":
        pytest.skip("chattr +i is not supported here: %s" % proc.stderr.strip())


@contextlib.contextmanager
def immutable(*paths, root=None):
    """Make files immutable for the test; always undone (also on every config under ``root``,
    which a wrapper may have frozen) so that tmp_path can be removed."""
    try:
        for p in paths:
            chattr("+i", p)
        yield
    finally:
        if root is not None:
            paths += tuple(cfg_path(root, b) for b in os.listdir(os.path.join(root, "sys/bus/pci/devices")))
        for p in paths:
            if os.path.isfile(p):
                chattr("-i", p)


def set_bit15(root, bdf):
    """Bit 15 of DevCtl set (Function Level Reset on an endpoint): a mask 0x7000 write keeps it."""
    with open(cfg_path(root, bdf), "r+b") as fh:
        fh.seek(DEVCTL + 1)
        value = fh.read(1)[0]
        fh.seek(DEVCTL + 1)
        fh.write(bytes([value | 0x80]))


def inject_static_faults(root):
    """Truncate one config to its header and replace another by a directory (immutable: see caller)."""
    with open(cfg_path(root, SHORT), "r+b") as fh:
        fh.truncate(64)
    os.unlink(cfg_path(root, DIRECTORY))
    os.mkdir(cfg_path(root, DIRECTORY))


def by_bdf(result):
    return {d["bdf"]: d for d in result["devices"]}


def assert_causes(result, failed):
    """Each failed device is named with its own cause, never with another device's error."""
    devs = by_bdf(result)
    assert result["failed_devices"] == sorted(failed)
    for bdf in failed:
        reason = devs[bdf]["reason"]
        assert devs[bdf]["failed"] and not devs[bdf]["changed"]
        assert "as root" not in reason, reason  # we are root: never a permissions hint
        assert not any(other in reason for other in GPUS if other != bdf), reason
        assert "%s: %s" % (bdf, reason) in result["msg"]
    if IMMUTABLE in failed:
        assert devs[IMMUTABLE]["reason"] == (
            "write refused: cannot open %s for writing (Operation not permitted): the file is immutable or the "
            "kernel forbids config-space writes" % cfg_path(result["_root"], IMMUTABLE))
    if SHORT in failed:
        assert devs[SHORT]["reason"] == ("config space is only 64 bytes: the device is not fully visible "
                                         "(no PCIe capability readable)")
    if DIRECTORY in failed:
        assert devs[DIRECTORY]["reason"] == ("config space unreadable: %s is a directory, not the device's "
                                             "config file" % cfg_path(result["_root"], DIRECTORY))
    if VANISHING in failed:
        assert devs[VANISHING]["reason"] == ("device vanished: %s is gone (hot-removed or reset while the task "
                                             "ran)" % cfg_path(result["_root"], VANISHING))


# --- applying --------------------------------------------------------------------------------


def test_four_faulty_gpus_never_stop_the_four_healthy_ones(build_node, run_module, commands_run, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    set_bit15(root, "0000:e1:00.0")
    inject_static_faults(root)
    ship_setpci(root, REMOVING_SETPCI, VANISHING)
    before = configs(root)
    with immutable(cfg_path(root, IMMUTABLE)):
        # Check mode predicts the three faults it can see and plans the others; writes nothing.
        snap = digest(root)
        result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL},
                                    check=True, diff=True)
        assert failed and digest(root) == snap and commands_run == []
        assert_causes(dict(result, _root=root), [IMMUTABLE, SHORT, DIRECTORY])
        assert result["msg"].startswith("check mode: a real run would fail. MRRS could not be set on 3 device(s)")
        assert result["msg"].endswith("5 other device(s) would be set")
        planned = [b for b, d in by_bdf(result).items() if d["changed"]]
        assert planned == sorted(HEALTHY + [VANISHING])
        assert all(by_bdf(result)[b]["mrrs_after"] == 4096 for b in planned)
        assert result["diff"]["after"][IMMUTABLE] == {"mrrs": 512}

        result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL})
        assert failed and result["changed"]
        assert_causes(dict(result, _root=root), [IMMUTABLE, SHORT, VANISHING, DIRECTORY])
        assert result["msg"].startswith("MRRS could not be set on 4 device(s): ")
        assert result["msg"].endswith(". 4 other device(s) were set")
        assert all(by_bdf(result)[b]["reason"] == "set" and by_bdf(result)[b]["mrrs_after"] == 4096 for b in HEALTHY)
        # Healthy GPUs at 4096 as the real setpci reads them; every other byte of every config
        # file unchanged (bit 15 of e1:00.0 is still set), the faulty ones untouched.
        assert setpci_mrrs(root, HEALTHY) == {b: 4096 for b in HEALTHY}
        after = configs(root)
        assert struct.unpack_from("<H", after["0000:e1:00.0"], DEVCTL)[0] & 0x8000
        del before[VANISHING]
        assert_only_mrrs_changed(before, after, {b: 4096 for b in HEALTHY})
        assert len(after[SHORT]) == 64 and os.path.isdir(cfg_path(root, DIRECTORY))
        # Every write used the mask 0x7000, never more.
        writes = [a for argv in commands_run for a in argv if a.startswith("CAP_EXP+08.w=")]
        assert writes and set(writes) == {"CAP_EXP+08.w=5000:7000"}
        # Originals journaled for what was to be written only (the vanished one included).
        assert journal_entries(root) == {b: 512 for b in HEALTHY + [VANISHING]}

        # A rerun changes nothing on the healthy GPUs, runs no setpci, still names the faults.
        commands_run.clear()
        snap = digest(root)
        result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL})
        assert failed and not result["changed"] and commands_run == [] and digest(root) == snap
        assert all(by_bdf(result)[b]["reason"] == "already 4096" for b in HEALTHY)
        assert_causes(dict(result, _root=root), [IMMUTABLE, SHORT, VANISHING, DIRECTORY])


def test_a_device_vanishing_mid_batch_is_not_blamed_on_the_others(build_node, run_module, commands_run):
    """setpci stops at the device it cannot open: the devices after it in the batch are written
    alone afterwards, and only the vanished device fails, with its own cause."""
    root = build_node("audited-epyc-8gpu", cpus=4)
    ship_setpci(root, REMOVING_SETPCI, VANISHING)
    before = configs(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root})
    assert failed and result["changed"]
    assert_causes(dict(result, _root=root), [VANISHING])
    others = [b for b in GPUS if b != VANISHING]
    assert all(by_bdf(result)[b]["reason"] == "set" for b in others)
    assert setpci_mrrs(root, others) == {b: 4096 for b in others}
    del before[VANISHING]
    assert_only_mrrs_changed(before, configs(root), {b: 4096 for b in others})
    # One batch for all; single-device writes only for those the failed batch left behind.
    writes = [argv.count("-s") for argv in commands_run if any(a.startswith("CAP_EXP+08.w=") for a in argv)]
    assert writes[0] == 8 and writes[1:] == [1] * len(others[3:])


def test_a_write_refused_mid_run_is_named_as_such(build_node, run_module):
    """The config becomes immutable after planning (the wrapper does it): setpci cannot open it
    for writing; that device fails as write refused, the others are set."""
    root = build_node("audited-epyc-8gpu", cpus=4)
    frozen = "0000:c1:00.0"
    ship_setpci(root, FREEZING_SETPCI, frozen)
    before = configs(root)
    with immutable(root=root):  # writable while the task plans; the wrapper's +i is undone after
        result, failed = run_module("setpci_mrrs", {"mrrs": 2048, "root": root})
        assert failed and result["failed_devices"] == [frozen]
        reason = by_bdf(result)[frozen]["reason"]
        assert reason.startswith("write refused: cannot open %s for writing (Operation not permitted)"
                                 % cfg_path(root, frozen)) and "as root" not in reason
        others = [b for b in GPUS if b != frozen]
        assert_only_mrrs_changed(before, configs(root), {b: 2048 for b in others})


def test_check_mode_fails_for_an_immutable_config_and_writes_nothing(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    with immutable(cfg_path(root, IMMUTABLE)):
        snap = digest(root)
        result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL}, check=True)
        assert failed and digest(root) == snap
        assert_causes(dict(result, _root=root), [IMMUTABLE])
        assert result["changed"] and sum(d["changed"] for d in result["devices"]) == 7
        # Already at the wanted value: nothing to write, so an immutable file is no failure.
        result, failed = run_module("setpci_mrrs", {"mrrs": 512, "root": root}, check=True)
        assert not failed and not result["changed"]


# --- restoring -------------------------------------------------------------------------------


def test_restore_goes_on_past_a_vanished_config_and_keeps_its_entry(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    pristine = configs(root)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL})
    assert not failed
    saved = read_cfg(root, SHORT)
    os.unlink(cfg_path(root, SHORT))  # the GPU's config is gone before the rollback
    snap = digest(root)
    result, failed = run_module("setpci_mrrs", {"restore": True, "root": root, "journal": JOURNAL}, check=True)
    assert failed and digest(root) == snap and "a real run would fail" in result["msg"]
    result, failed = run_module("setpci_mrrs", {"restore": True, "root": root, "journal": JOURNAL})
    assert failed and result["changed"] and result["failed_devices"] == [SHORT]
    assert by_bdf(result)[SHORT]["reason"].startswith("device vanished: %s is gone" % cfg_path(root, SHORT))
    assert result["msg"].endswith("7 other device(s) were restored; the failed entries stay in the journal "
                                  "%s for the next attempt" % os.path.join(root, JOURNAL.lstrip("/")))
    others = [b for b in GPUS if b != SHORT]
    assert all(by_bdf(result)[b]["reason"] == "restored" for b in others)
    assert journal_entries(root) == {SHORT: 512}
    now = configs(root)
    assert all(now[b] == pristine[b] for b in now)
    # The device is back: the next attempt restores it and the journal goes.
    with open(cfg_path(root, SHORT), "wb") as fh:
        fh.write(saved)
    result, failed = run_module("setpci_mrrs", {"restore": True, "root": root, "journal": JOURNAL})
    assert not failed and result["failed_devices"] == [] and configs(root) == pristine
    assert not os.path.exists(os.path.join(root, JOURNAL.lstrip("/")))


def test_restore_with_a_config_vanishing_mid_run(build_node, run_module):
    root = build_node("audited-epyc-8gpu", cpus=4)
    pristine = configs(root)
    run_module("setpci_mrrs", {"mrrs": 1024, "root": root, "journal": JOURNAL})
    ship_setpci(root, REMOVING_SETPCI, VANISHING)
    result, failed = run_module("setpci_mrrs", {"restore": True, "root": root, "journal": JOURNAL})
    assert failed
    assert_causes(dict(result, _root=root), [VANISHING])
    assert journal_entries(root) == {VANISHING: 512}
    now = configs(root)
    assert all(now[b] == pristine[b] for b in now)


def test_restore_of_an_immutable_config_keeps_its_entry(build_node, run_module, digest):
    root = build_node("audited-epyc-8gpu", cpus=4)
    run_module("setpci_mrrs", {"mrrs": 4096, "root": root, "journal": JOURNAL})
    with immutable(cfg_path(root, IMMUTABLE)):
        result, failed = run_module("setpci_mrrs", {"restore": True, "root": root, "journal": JOURNAL})
        assert failed
        assert_causes(dict(result, _root=root), [IMMUTABLE])
        assert journal_entries(root) == {IMMUTABLE: 512}
        assert pci.mrrs_of_devctl(struct.unpack_from("<H", read_cfg(root, IMMUTABLE), DEVCTL)[0]) == 4096
        others = [b for b in GPUS if b != IMMUTABLE]
        assert setpci_mrrs(root, others) == {b: 512 for b in others}
