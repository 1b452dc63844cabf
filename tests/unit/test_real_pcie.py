"""Config space as lspci dumped it on real machines (tests/data/real/lspci-*): link widths, ACS, dead devices.

``config_bytes`` turns lspci's hex dump (``-xxx``: 256 bytes, ``-xxxx``: 4096) into the bytes sysfs'
``config`` file holds: each ``OFFSET: 16 bytes`` line at its offset. The assertions are what lspci
printed from the same bytes (``LnkSta: ... Width x4``, ``ACSCtl: ... ReqRedir+``, ``rev ff``).
"""

from __future__ import annotations

import os
import re

from support.captures import config_bytes

from ansible_collections.gpunode.tuning.plugins.module_utils.core import pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.facts import pci_facts
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_health_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_p2p as p2p
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs as acs
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs_verify as acs_verify


def lspci_says(text, key):
    """The first ``key:`` line lspci decoded (``LnkSta``, ``ACSCtl``)."""
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.strip().startswith(key + ":"))


def test_the_gpu_link_is_x4_of_x4_as_lspci_decoded_it(real):
    text = real("lspci-vvv-xxxx-gpu-gp108m-x4-pciutils.txt").text
    cfg = config_bytes(text)
    assert len(cfg) >= 0x100 and cfg[:4] == bytes.fromhex("de10101d")  # vendor 10de, device 1d10
    decoded = pci.decode_pcie(cfg)
    assert lspci_says(text, "LnkSta").startswith("Speed 8GT/s (ok), Width x4 (ok)")
    assert (decoded["link_width_current"], decoded["link_width_capable"]) == (4, 4)
    assert decoded["link_speed_current"] == "8.0 GT/s" and decoded["mrrs"] == 512 and decoded["mps"] == 256
    assert pci.not_responding(cfg) is None


def test_acs_control_off_and_on_as_lspci_decoded_it(real):
    off = real("lspci-vvv-xxxx-root-port-acs-off-intel-9d10-pciutils.txt").text
    on = real("lspci-vvv-xxxx-root-port-acs-redirect-haswell-e-pciutils.txt").text
    switch = real("lspci-vvv-xxxx-plx-switch-port-acs-off-pciutils.txt").text
    assert "ReqRedir- CmpltRedir-" in lspci_says(off, "ACSCtl") and "ReqRedir+ CmpltRedir+" in lspci_says(on, "ACSCtl")
    for text, redirect in ((off, False), (on, True)):
        decoded = acs.decode_acs(config_bytes(text))
        assert decoded["redirect"] is redirect
        assert acs.describe(decoded["ctl"]) == lspci_says(text, "ACSCtl")
    assert pci.decode_pcie(config_bytes(on))["port_type"] == "root_port"
    # The switch port's file holds a 256-byte dump (-xxx): lspci read ACS at 0xf24, the dump has no extended space.
    assert "Capabilities: [f24 v1] Access Control Services" in switch and len(config_bytes(switch)) == 256
    assert acs.decode_acs(config_bytes(switch)) is None
    assert pci.decode_pcie(config_bytes(switch))["port_type"] == "downstream_port"


def test_a_bridge_that_stopped_answering_reads_all_ff(real):
    text = real("lspci-vvxxx-dead-bridge-all-ff-coreboot-4.txt").text
    assert "!!! Unknown header type 7f" in text
    cfg = config_bytes(text)
    assert len(cfg) == 0xF0 and set(cfg) == {0xFF}
    assert pci.not_responding(cfg) == (
        "not responding: config space reads 0xff (the device fell off the bus or lost power)")
    assert pci.config_fault(cfg).startswith("not responding")  # MRRS fails that device, never writes it
    assert acs.decode_acs(cfg) is None


def test_rev_ff_and_prog_if_ff_are_a_config_space_of_all_ones(real):
    text = real("lspci-rev-ff-nvidia-gpu-bumblebee-172.txt").text
    m = re.search(r"\[(10de):(0fd1)\] \(rev (ff)\) \(prog-if (ff)\)", text)
    assert m and "header type 7f" in text
    # What the kernel hands lspci for it: every byte 0xff (revision 0x08, prog-if 0x09, header type 0x0e & 0x7f).
    cfg = b"\xff" * 256
    assert (cfg[0x08], cfg[0x09], cfg[0x0E] & 0x7F) == (0xFF, 0xFF, 0x7F)
    assert pci.not_responding(cfg).startswith("not responding: config space reads 0xff")
    assert pci.not_responding(b"\xff\xff" + bytes(254)) == (
        "not responding: vendor id reads ffff (the device fell off the bus or lost power)")


def _device(tree, path, cfg, cls):
    """A sysfs function directory with the config bytes of a capture (vendor/device/class taken from them)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config"), "wb") as fh:
        fh.write(cfg)
    vendor, device = int.from_bytes(cfg[0:2], "little"), int.from_bytes(cfg[2:4], "little")
    for name, value in (("vendor", "0x%04x" % vendor), ("device", "0x%04x" % device), ("class", cls),
                        ("numa_node", "-1")):
        with open(os.path.join(path, name), "w") as fh:
            fh.write(value + "\n")
    bdf = os.path.basename(path)
    link = os.path.join(tree, "sys/bus/pci/devices", bdf)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(path, os.path.dirname(link)), link)


def node_from_captures(tmp_path, bridge_cfg, gpu_cfg):
    """A node whose PCI tree is a real bridge's and a real GPU's config space (the pairing is ours)."""
    tree = str(tmp_path)
    bridge = os.path.join(tree, "sys/devices/pci0000:00/0000:00:1c.0")
    _device(tree, bridge, bridge_cfg, "0x060400")
    _device(tree, os.path.join(bridge, "0000:02:00.0"), gpu_cfg, "0x030200")
    return Node(tree)


def test_a_real_gpu_below_a_real_redirecting_root_port_is_named_with_its_bridge(real, tmp_path):
    gpu = config_bytes(real("lspci-vvv-xxxx-gpu-gp108m-x4-pciutils.txt").text)
    bridge = config_bytes(real("lspci-vvv-xxxx-root-port-acs-redirect-haswell-e-pciutils.txt").text)
    node = node_from_captures(tmp_path, bridge, gpu)
    facts = {"pcie_acs": acs_verify.read(node), "gpu_p2p": p2p.read(node), "pci": pci_facts(node, pci.DeviceSelector())}
    assert facts["pcie_acs"]["gpus"][0]["bridges"] == ["0000:00:1c.0"]
    assert facts["gpu_p2p"]["redirect"] == {"0000:02:00.0": ["0000:00:1c.0"]}
    assert p2p._redirecting(facts) == {"0000:02:00.0": ["0000:00:1c.0"]}
    rows = {r["name"]: r for r in gpu_health_verify.link_rows(facts, {})}
    assert rows["link_width"]["state"] == "applied" and rows["link_width"]["running"] == "x4"


def test_a_dead_gpu_below_a_live_bridge_fails_gpu_health_and_is_never_written(real, tmp_path, run_module):
    bridge = config_bytes(real("lspci-vvv-xxxx-root-port-acs-off-intel-9d10-pciutils.txt").text)
    dead = b"\xff" * 256  # what rev ff / header type 7f decode to (lspci-rev-ff-nvidia-gpu-bumblebee-172.txt)
    node = node_from_captures(tmp_path, bridge, dead)
    # sysfs keeps the vendor and class the kernel read at enumeration; only config reads fail.
    with open(node.path("sys/bus/pci/devices/0000:02:00.0/vendor"), "w") as fh:
        fh.write("0x10de\n")
    facts = {"pci": pci_facts(node, pci.DeviceSelector())}
    entry = facts["pci"]["devices"][0]
    assert entry["responding"] is False and entry["error"].startswith("not responding: config space reads 0xff")
    row = gpu_health_verify.responding_row(facts)
    assert row["state"] == "drifted"
    assert row["reason"].startswith("0000:02:00.0 not responding: config space reads 0xff")
    os.makedirs(node.path("proc"), exist_ok=True)
    result, failed = run_module("setpci_mrrs", {"mrrs": 4096, "root": node.root})
    assert failed and result["failed_devices"] == ["0000:02:00.0"]
    assert "not responding: config space reads 0xff" in result["msg"] and result["setpci_calls"] == 0
    with open(node.path("sys/bus/pci/devices/0000:02:00.0/config"), "rb") as fh:
        assert fh.read() == dead
