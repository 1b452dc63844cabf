"""setpci_mrrs with faulty devices (issue 12, class 4): one bad device never stops the others.

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

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node

SETPCI = shutil.which("setpci")
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
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


def assert_only_mrrs_changed(before, after, expected):
    """Whole-file comparison: only DevCtl bits 14:12 of ``expected`` ({bdf: mrrs}) differ."""
    for bdf, old in before.items():
        new = after[bdf]
        if bdf not in expected:
            assert new == old, "%s was touched" % bdf
            continue
        assert len(new) == len(old) and old[:DEVCTL] == new[:DEVCTL] and old[DEVCTL + 2:] == new[DEVCTL + 2:], bdf
        o, n = struct.unpack_from("<H", old, DEVCTL)[0], struct.unpack_from("<H", new, DEVCTL)[0]
        assert (o ^ n) & ~0x7000 == 0, "%s: bits outside 14:12 changed: %04x -> %04x" % (bdf, o, n)
        assert pci.mrrs_of_devctl(n) == expected[bdf], bdf


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


@pytest.fixture
def commands_run(monkeypatch):
    seen = []
    real = command.run

    def spy(argv, *a, **k):
        seen.append(list(argv))
        return real(argv, *a, **k)

    monkeypatch.setattr(command, "run", spy)
    return seen


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
