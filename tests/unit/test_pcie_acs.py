"""The pcie_acs family (families/pcie_acs.py) and the pcie_acs module on simulated nodes, with the real setpci/lspci."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import subprocess

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family, pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import iommu_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs as acs
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs_verify as acs_verify

SETPCI = shutil.which("setpci")
LSPCI = shutil.which("lspci")
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
AUDITED_GPU_PORTS = ["0000:00:01.1", "0000:20:01.1", "0000:40:01.1", "0000:60:01.1", "0000:80:01.1",
                     "0000:a0:01.1", "0000:c0:01.1", "0000:e0:01.1"]
AUDITED_OTHER_PORTS = ["0000:c0:03.1", "0000:e0:03.1"]  # the NIC's and the NVMe drive's root ports
needs_setpci = pytest.mark.skipif(SETPCI is None, reason="setpci (pciutils) is not installed")


def configs(root):
    base = os.path.join(root, "sys/bus/pci/devices")
    out = {}
    for bdf in sorted(os.listdir(base)):
        with open(os.path.join(base, bdf, "config"), "rb") as fh:
            out[bdf] = fh.read()
    return out


def ctl(cfg):
    return acs.decode_acs(cfg)["ctl"]


def assert_only_redirect_cleared(before, after, expected):
    """Only ACSCtl bits 2, 3, 5 of ``expected`` bridges changed (to 0); every other byte identical."""
    for bdf, old in before.items():
        new = after[bdf]
        if bdf not in expected:
            assert new == old, "%s was touched" % bdf
            continue
        pos = pci.find_ext_capability(old, pci.PCI_EXT_CAP_ID_ACS) + pci.ACS_CTRL
        assert old[:pos] == new[:pos] and old[pos + 2:] == new[pos + 2:], bdf
        o, n = struct.unpack_from("<H", old, pos)[0], struct.unpack_from("<H", new, pos)[0]
        assert (o ^ n) & ~acs.REDIRECT_MASK == 0, "%s: bits outside the mask changed %04x -> %04x" % (bdf, o, n)
        assert n & acs.REDIRECT_MASK == 0, bdf


def device_dir(root, bdf):
    return os.path.realpath(os.path.join(root, "sys/bus/pci/devices", bdf))


def bind(root, bdf, driver):
    """Give a simulated function a ``driver`` link, as the kernel does when a driver binds."""
    target = os.path.join(root, "sys/bus/pci/drivers", driver)
    os.makedirs(target, exist_ok=True)
    os.symlink(target, os.path.join(device_dir(root, bdf), "driver"))


@contextlib.contextmanager
def immutable(path):
    if subprocess.run(["chattr", "+i", path], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not available here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", path], check=False)


# -- Decoding and paths


@pytest.mark.skipif(LSPCI is None, reason="lspci (pciutils) is not installed")
@pytest.mark.parametrize("preset", ["audited-epyc-8gpu", "xeon-4gpu-switch"])
def test_decode_matches_lspci_vvv(build_node, preset):
    root = build_node(preset)
    argv = [LSPCI] + Node(root).pciutils_args() + ["-D", "-vvv"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=dict(os.environ, LC_ALL="C")).stdout
    seen = {}
    for block in out.split("\n\n"):
        m = re.search(r"ACSCap:\s*(.*)\n\s*ACSCtl:\s*(.*)", block)
        if m and block.strip():
            seen[block.split()[0]] = (" ".join(m.group(1).split()), " ".join(m.group(2).split()))
    assert seen, "lspci decoded no ACS capability on %s" % preset
    for bdf, cfg in configs(root).items():
        decoded = acs.decode_acs(cfg)
        if bdf not in seen:
            assert decoded is None, bdf
            continue
        assert (acs.describe(decoded["cap"]), acs.describe(decoded["ctl"])) == seen[bdf], bdf


def test_ext_capability_walk_is_bounded():
    assert pci.find_ext_capability(bytes(256), 0x0D) is None  # no extended space (not root)
    cfg = bytearray(4096)
    struct.pack_into("<I", cfg, 0x100, 0x0001 | (1 << 16) | (0x100 << 20))  # AER pointing at itself
    assert pci.find_ext_capability(bytes(cfg), 0x0D) is None
    struct.pack_into("<I", cfg, 0x100, 0x0001 | (1 << 16) | (0x200 << 20))
    struct.pack_into("<IHH", cfg, 0x200, 0x000D | (1 << 16), 0x005F, 0x003D)
    decoded = acs.decode_acs(bytes(cfg))
    assert decoded["offset"] == 0x200 and decoded["ctl_bits"]["EgressCtrl"] and decoded["redirect"]
    assert acs.describe(0x003D) == "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans-"


def test_gpu_directly_under_root_port(build_node):
    root = build_node()
    assert [b for b, _p in acs.bridge_chain(Node(root), "0000:41:00.0")] == ["0000:40:01.1"]


def test_gpu_behind_switch_chain_is_root_port_first(build_node):
    root = build_node("xeon-4gpu-switch")
    chain = acs.bridge_chain(Node(root), "0000:19:00.0")
    assert [b for b, _p in chain] == ["0000:15:01.0", "0000:16:00.0", "0000:17:01.0"]
    facts = acs_verify.read(Node(root))
    assert facts["bridges"]["0000:16:00.0"]["acs"] is None  # the switch's upstream port has none
    assert facts["bridges"]["0000:16:00.0"]["acs_state"] == acs.NO_ACS
    assert facts["bridges"]["0000:15:01.0"]["gpus"] == ["0000:18:00.0", "0000:19:00.0", "0000:1a:00.0",
                                                        "0000:1b:00.0"]


def add_nic_under_switch(root):
    """A NIC behind its own downstream port of the GPUs' switch (17:1f.0 -> 30:00.0)."""
    up = device_dir(root, "0000:16:00.0")
    port_src, port = device_dir(root, "0000:17:00.0"), os.path.join(up, "0000:17:1f.0")
    os.makedirs(port)
    for name in os.listdir(port_src):
        if os.path.isfile(os.path.join(port_src, name)):
            shutil.copy(os.path.join(port_src, name), port)
    nic = os.path.join(port, "0000:30:00.0")
    shutil.copytree(device_dir(root, "0000:18:00.0"), nic, symlinks=True)
    for name, value in (("vendor", "0x15b3"), ("device", "0x1021"), ("class", "0x020000")):
        with open(os.path.join(nic, name), "w") as fh:
            fh.write(value + "\n")
    links = os.path.join(root, "sys/bus/pci/devices")
    for bdf, path in (("0000:17:1f.0", port), ("0000:30:00.0", nic)):
        os.symlink(os.path.relpath(path, links), os.path.join(links, bdf))


@needs_setpci
def test_gpu_and_nic_under_one_switch_only_gpu_ports_change(build_node, run_module):
    root = build_node("xeon-4gpu-switch", gpus=2)
    add_nic_under_switch(root)
    assert [b for b, _p in acs.bridge_chain(Node(root), "0000:30:00.0")] == \
        ["0000:15:01.0", "0000:16:00.0", "0000:17:1f.0"]
    before = configs(root)
    result, failed = run_module("pcie_acs", {"root": root})
    assert not failed, result["msg"]
    assert_only_redirect_cleared(before, configs(root), {"0000:15:01.0", "0000:17:00.0", "0000:17:01.0"})
    skipped = [b["bdf"] for b in result["bridges"] if b["skipped"]]
    assert skipped == ["0000:16:00.0"]


# -- The module


@needs_setpci
def test_clears_redirect_on_gpu_root_ports_only_then_rerun_and_restore(build_node, run_module):
    root = build_node()
    before = configs(root)
    result, failed = run_module("pcie_acs", {"root": root, "journal": JOURNAL}, diff=True)
    assert not failed, result["msg"]
    after = configs(root)
    assert_only_redirect_cleared(before, after, set(AUDITED_GPU_PORTS))
    for bdf in AUDITED_OTHER_PORTS:
        assert ctl(after[bdf]) == 0x001D
    assert result["changed"] and result["setpci_calls"] == 1 and not result["not_applicable"]
    assert {b["bdf"]: (b["acs_ctl_before"], b["acs_ctl_after"]) for b in result["bridges"]} == \
        {b: ("0x001d", "0x0011") for b in AUDITED_GPU_PORTS}
    assert result["diff"]["after"]["0000:40:01.1"]["ACSCtl"].startswith("SrcValid+ TransBlk- ReqRedir- CmpltRedir-")
    assert result["kernel_arg"] == "pci=disable_acs_redir=" + ";".join(AUDITED_GPU_PORTS)
    with open(os.path.join(root, JOURNAL.lstrip("/"))) as fh:
        journaled = json.load(fh)["families"]["pcie_acs"]
    assert {b: e["original"] for b, e in journaled.items()} == {b: 0x001D for b in AUDITED_GPU_PORTS}

    again, failed = run_module("pcie_acs", {"root": root, "journal": JOURNAL})
    assert not failed and not again["changed"] and again["setpci_calls"] == 0

    restored, failed = run_module("pcie_acs", {"root": root, "journal": JOURNAL, "restore": True})
    assert not failed, restored["msg"]
    assert configs(root) == before
    assert not os.path.exists(os.path.join(root, JOURNAL.lstrip("/")))


@needs_setpci
def test_check_mode_writes_nothing(build_node, run_module, digest):
    root = build_node()
    snapshot = digest(root)
    result, failed = run_module("pcie_acs", {"root": root, "journal": JOURNAL}, check=True, diff=True)
    assert not failed and result["changed"] and result["setpci_calls"] == 0
    assert digest(root) == snapshot
    assert result["diff"]["before"]["0000:40:01.1"]["ACSCtl"] != result["diff"]["after"]["0000:40:01.1"]["ACSCtl"]


@needs_setpci
def test_vfio_below_a_bridge_is_refused_others_set(build_node, run_module):
    root = build_node(vfio=["0000:41:00.0"])
    before = configs(root)
    result, failed = run_module("pcie_acs", {"root": root})
    assert failed and "0000:40:01.1" in result["msg"] and "vfio-pci" in result["msg"]
    assert result["failed_bridges"] == ["0000:40:01.1"]
    refused = [b for b in result["bridges"] if b["refused"]]
    assert [b["bdf"] for b in refused] == ["0000:40:01.1"] and refused[0]["vfio_devices"] == ["0000:41:00.0"]
    assert "0000:60:01.1" in result["kernel_arg"] and "0000:40:01.1" not in result["kernel_arg"]
    others = set(AUDITED_GPU_PORTS) - {"0000:40:01.1"}
    assert_only_redirect_cleared(before, configs(root), others)


def test_lockdown_refuses_before_any_write(build_node, run_module, digest):
    root = build_node("locked-bus-perf")
    snapshot = digest(root)
    result, failed = run_module("pcie_acs", {"root": root, "journal": JOURNAL})
    assert failed and "lockdown" in result["msg"] and "nothing was written" in result["msg"]
    assert digest(root) == snapshot


@needs_setpci
def test_one_unwritable_bridge_does_not_stop_the_others(build_node, run_module):
    root = build_node()
    before = configs(root)
    bad = os.path.join(device_dir(root, "0000:60:01.1"), "config")
    with immutable(bad):
        result, failed = run_module("pcie_acs", {"root": root, "journal": JOURNAL})
    assert failed and result["failed_bridges"] == ["0000:60:01.1"]
    assert "0000:60:01.1" in result["msg"] and "write refused" in result["msg"]
    assert_only_redirect_cleared(before, configs(root), set(AUDITED_GPU_PORTS) - {"0000:60:01.1"})


def test_not_applicable_without_acs_on_the_paths(build_node, run_module, digest):
    root = build_node(gpus=2)
    for bdf in ("0000:40:01.1", "0000:60:01.1"):
        path = os.path.join(device_dir(root, bdf), "config")
        with open(path, "r+b") as fh:
            fh.seek(0x100)
            fh.write(bytes(4))  # no extended capability at all
    snapshot = digest(root)
    result, failed = run_module("pcie_acs", {"root": root})
    assert not failed and result["not_applicable"] and not result["changed"]
    assert all(b["skipped"] and b["reason"] == acs.NO_ACS for b in result["bridges"])
    assert digest(root) == snapshot


def test_bad_input_names_what_is_allowed(build_node, run_module):
    root = build_node()
    result, failed = run_module("pcie_acs", {"root": root, "bdfs": ["99:00.0"]})
    assert failed and "not present" in result["msg"]
    result, failed = run_module("pcie_acs", {"root": root, "restore": True})
    assert failed and "journal" in result["msg"]
    result, failed = run_module("pcie_acs", {"root": root, "vendor": "xyz"})
    assert failed and "hex" in result["msg"]


def test_unmanaged_reads_and_writes_nothing(build_node, run_module, digest):
    root = build_node()
    snapshot = digest(root)
    result, failed = run_module("pcie_acs", {"root": root, "mode": "unmanaged", "journal": JOURNAL})
    assert not failed and not result["changed"] and digest(root) == snapshot


# -- Verification and boot


class _Ctx:
    def __init__(self, configured=(), running=(), boot_unit=False):
        self.configured, self.running, self.boot_unit = list(configured), list(running), boot_unit

    def arg(self, arg):
        return {"configured": arg in self.configured, "running": arg in self.running}

    def boot_persisted(self, desired):
        return desired if self.boot_unit else None


@needs_setpci
def test_evaluate_drifted_then_applied_and_boot_reapplies(build_node):
    root = build_node(gpus=2)
    node = Node(root)
    desired = {"pcie_acs": {"mode": "disable_redirect", "persist": "boot_unit"}}
    rows = acs_verify.evaluate({"pcie_acs": acs_verify.read(node)}, desired, _Ctx(boot_unit=True))
    assert [(r["name"], r["state"]) for r in rows] == [("0000:40:01.1", "drifted"), ("0000:60:01.1", "drifted")]
    assert "root complex" in rows[0]["reason"] and rows[0]["persisted"] == acs_verify.DESIRED_TEXT
    ok, msg = acs.DEFINITION.boot(node, desired["pcie_acs"])
    assert ok, msg
    rows = acs_verify.evaluate({"pcie_acs": acs_verify.read(node)}, desired, _Ctx())
    assert {r["state"] for r in rows} == {"applied"} and rows[0]["id"] == "pcie_acs.0000:40:01.1"
    assert acs.DEFINITION.boot(node, desired["pcie_acs"]) == (True, "ACS redirect disabled on no bridge (already off)")


def test_evaluate_pending_reboot_unmanaged_and_vfio(build_node):
    root = build_node(gpus=2)
    node = Node(root)
    arg = "pci=disable_acs_redir=0000:40:01.1;0000:60:01.1"
    desired = {"pcie_acs": {"mode": "disable_redirect", "persist": "kernel_arg"}}
    rows = acs_verify.evaluate({"pcie_acs": acs_verify.read(node)}, desired, _Ctx(configured=[arg]))
    assert {r["state"] for r in rows} == {"pending_reboot"} and rows[0]["persisted"] == arg
    assert acs_verify.evaluate({"pcie_acs": acs_verify.read(node)}, {"pcie_acs": {"mode": "unmanaged"}}, _Ctx()) == []
    bind(root, "0000:61:00.0", "vfio-pci")
    rows = acs_verify.evaluate({"pcie_acs": acs_verify.read(node)}, desired, _Ctx())
    assert rows[1]["state"] == "drifted" and "vfio-pci" in rows[1]["reason"]
    assert acs.DEFINITION.name == "pcie_acs" and family.resolve(acs.DEFINITION.read) is acs_verify.read
    assert family.STATES  # rows validated by family.setting


def test_facts_iommu_groups_and_args(build_node):
    root = build_node(gpus=1, iommu="DMA-FQ")
    with open(os.path.join(root, "proc/cmdline"), "w") as fh:
        fh.write("ro quiet iommu=pt amd_iommu=on\n")
    facts = acs_verify.read(Node(root), pci.DeviceSelector())
    # The IOMMU's own state is the IOMMU family's facts (facts["iommu"]); ACS keeps its arguments and the groups.
    assert iommu_verify.read(Node(root), pci.DeviceSelector()) == {
        "active": True, "units": ["ivhd0"], "kernel_args": ["iommu=pt", "amd_iommu=on"],
        "gpus": [{"bdf": "0000:41:00.0", "iommu_group": facts["gpus"][0]["iommu_group"],
                  "iommu_group_type": "DMA-FQ"}]}
    assert facts["kernel_args"] == []
    group = facts["gpus"][0]["iommu_group"]
    assert group is not None and facts["gpus"][0]["iommu_group_type"] == "DMA-FQ"
    # the GPU and its HDMI-audio function share a slot, so a group
    assert sorted(os.listdir(os.path.join(root, "sys/kernel/iommu_groups", group, "devices"))) == \
        ["0000:41:00.0", "0000:41:00.1"]
    assert iommu_verify.read(Node(build_node(gpus=1)))["active"] is False


@needs_setpci
def test_simulated_p2p_verdict_turns_ok_once_redirect_is_off(build_node, run_module):
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import nvidia_smi

    root = build_node("xeon-4gpu-switch", gpus=2, nvidia_smi=True)
    smi = os.path.join(root, "usr/bin/nvidia-smi")

    def p2p(kind):
        out = subprocess.run([smi, "topo", "-p2p", kind], capture_output=True, text=True, check=True).stdout
        return nvidia_smi.parse_p2p(out)

    assert [(p["a"], p["b"], p["status"]) for p in p2p("r")["not_ok"]] == [("GPU0", "GPU1", "CNS"),
                                                                           ("GPU1", "GPU0", "CNS")]
    result, failed = run_module("pcie_acs", {"root": root})
    assert not failed, result["msg"]
    assert p2p("r")["not_ok"] == [] and p2p("w")["not_ok"] == []
    assert {p["status"] for p in p2p("n")["pairs"]} == {"NS"}  # PCIe GPUs: no NVLink
