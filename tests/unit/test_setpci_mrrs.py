"""The setpci_mrrs module through its entry point, on simulated nodes, with the real setpci."""

from __future__ import annotations

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


def configs(root):
    """{bdf: config bytes} of every PCI function of a node."""
    base = os.path.join(root, "sys/bus/pci/devices")
    out = {}
    for bdf in sorted(os.listdir(base)):
        with open(os.path.join(base, bdf, "config"), "rb") as fh:
            out[bdf] = fh.read()
    return out


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
