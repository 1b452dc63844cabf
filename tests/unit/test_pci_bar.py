"""BAR1 and Resizable BAR (issue 44): the capability decoded as lspci shows it on real GPUs, the sizes of sysfs'
``resource``, and the P2P check's verdict per GPU on a simulated 8-GPU node."""

from __future__ import annotations

import os
import re
import struct

import simnode
from support.captures import REAL_CAPTURES, Capture, config_bytes
from support.p2p import rows as _rows

from ansible_collections.gpunode.tuning.plugins.module_utils.core import pci, pci_bar
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_p2p

GIB, MIB = 1 << 30, 1 << 20
LSPCI_LINE = re.compile(r"BAR (\d): current size: (\w+), supported: (.*)$")
REBAR_CAPTURES = ("lspci-rebar-rtx3090-256mb-cut-rebaruefi-11.txt",
                  "lspci-rebar-rx7900xtx-bar0-cut-rpi-pcie-devices-503.txt")


def _bytes(text):
    n, unit = re.match(r"^(\d+)([MGT])B$", text).groups()
    return int(n) << {"M": 20, "G": 30, "T": 40}[unit]


def _config(entries, at=0x400, before=((0x100, 0x0001),)):
    """4 KiB of config space whose extended list leads (through ``before``) to a Resizable BAR capability at ``at``,
    each entry written as pci_regs.h lays it out: PCI_REBAR_CAP bit (n + 4) for 1 MiB << n, PCI_REBAR_CTRL's
    BAR index (bits 0-2), count of BARs (bits 5-7, first entry) and current size (bits 8-13)."""
    cfg = bytearray(4096)
    chain = list(before) + [(at, pci_bar.PCI_EXT_CAP_ID_REBAR)]
    for (pos, cap_id), nxt in zip(chain, [c[0] for c in chain[1:]] + [0], strict=True):
        struct.pack_into("<I", cfg, pos, cap_id | (1 << 16) | (nxt << 20))
    for i, (index, current, supported) in enumerate(entries):
        cap = sum(1 << ((s >> 20).bit_length() - 1 + 4) for s in supported)
        ctrl = index | (((current >> 20).bit_length() - 1) << 8) | ((len(entries) << 5) if i == 0 else 0)
        struct.pack_into("<II", cfg, at + 4 + 8 * i, cap, ctrl)
    return bytes(cfg)


def _lspci_entries(name):
    with open(os.path.join(REAL_CAPTURES, name), encoding="utf-8") as fh:
        lines = [m.groups() for m in map(LSPCI_LINE.search, fh.read().splitlines()) if m]
    return [(int(i), _bytes(cur), [_bytes(s) for s in sup.split()]) for i, cur, sup in lines]


def test_decoder_gives_back_lspcis_lines_of_real_gpus():
    for name in REBAR_CAPTURES:
        entries = _lspci_entries(name)
        assert entries, name
        decoded = pci_bar.decode_rebar(_config(entries))
        with open(os.path.join(REAL_CAPTURES, name), encoding="utf-8") as fh:
            want = [m.group(0) for m in map(LSPCI_LINE.search, fh.read().splitlines()) if m]
        got = ["BAR %d: current size: %s, supported: %s" % (i, pci_bar.lspci_size(d["current"]),
                                                            " ".join(pci_bar.lspci_size(s) for s in d["supported"]))
               for i, d in sorted(decoded.items())]
        assert got == want, name
    rtx3090 = pci_bar.decode_rebar(_config(_lspci_entries(REBAR_CAPTURES[0])))
    assert rtx3090[1]["current"] == 256 * MIB and max(rtx3090[1]["supported"]) == 32 * GIB


def test_a_real_config_space_dump_of_a_gpu_with_the_capability():
    # pciutils' test file: lspci -vv decodes it as "BAR 0: current size: 256MB, supported: 256MB 512MB 1GB 2GB 4GB"
    cfg = config_bytes(Capture("lspci-xxxx-rebar-amd-fiji-pciutils.txt").text)
    assert len(cfg) == 4096 and pci.find_ext_capability(cfg, pci_bar.PCI_EXT_CAP_ID_REBAR) == 0x200
    assert pci_bar.decode_rebar(cfg) == {0: {"current": 256 * MIB, "supported": [256 * MIB << n for n in range(5)]}}
    assert pci_bar.decode_rebar(cfg[:0x200]) is None  # cut before it


def test_no_capability_and_sizes_above_128_tib():
    assert pci_bar.decode_rebar(bytes(256)) is None  # no extended space
    assert pci_bar.decode_rebar(_config([])[:0x400]) is None  # the list ends before it
    cfg = bytearray(_config([(1, 256 * MIB, [256 * MIB])]))
    struct.pack_into("<I", cfg, 0x400 + 8, struct.unpack_from("<I", cfg, 0x400 + 8)[0] | 1 << 16)  # 256 TiB
    assert pci_bar.decode_rebar(bytes(cfg))[1]["supported"] == [256 * MIB, 256 << 40]


def test_resource_sizes_from_a_real_sysfs_file():
    with open(os.path.join(REAL_CAPTURES, "sysfs-aer-resource-umockdev-amd-psp-fwupd.txt"), encoding="utf-8") as fh:
        raw = [line for line in fh.read().splitlines() if line.startswith("A: resource=")][0][len("A: resource="):]
    text = "\n".join(re.findall(r"0x[0-9a-f]{16} 0x[0-9a-f]{16} 0x[0-9a-f]{16}", raw))  # umockdev lost the newlines
    assert len(text.splitlines()) == 13
    assert pci_bar.memory_bars(text) == {2: 1 * MIB, 5: 8 << 10}


def test_verdict_fails_only_a_bar_the_firmware_left_small():
    state, why = pci_bar.verdict(256 * MIB, 96 * GIB, [64 * MIB << n for n in range(12)])
    assert state == "drifted"
    assert why == ("256 MiB, smaller than the GPU's 96 GiB of memory, while its Resizable BAR capability supports up "
                   "to 128 GiB: the firmware left it small; " + pci_bar.FIRMWARE_FIX)
    assert "Above 4G Decoding" in why and "Resizable BAR" in why
    by_design = pci_bar.verdict(256 * MIB, 24 * GIB, [64 * MIB, 128 * MIB, 256 * MIB])  # a 256 MB-only VBIOS
    assert by_design[0] == "applied" and "by design" in by_design[1] and "reported only" in by_design[1]
    assert pci_bar.verdict(256 * MIB, 16 * GIB, None)[0] == "applied"  # no capability at all
    assert pci_bar.verdict(128 * GIB, 96 * GIB, [128 * GIB])[0] == "applied"
    assert pci_bar.verdict(256 * MIB, None, [128 * GIB])[0] == "applied"  # memory unknown: reported
    assert pci_bar.verdict(None, 96 * GIB, None)[0] == "unsupported"


def _bar_rows(root):
    return gpu_p2p.bar_rows({"gpu_p2p": gpu_p2p.read(Node(root))})


def test_simulated_8_gpu_node_small_bar1_fails_naming_the_gpu_and_full_bars_pass(build_node):
    root = build_node(cpus=4)
    rows = _bar_rows(root)
    assert [(r["name"], r["state"]) for r in rows] == [("bar1", "applied")]
    assert rows[0]["running"] == "BAR1 128 GiB on 8 GPUs"
    simnode.set_gpu_bar(root, "0000:41:00.0", 1, 256 * MIB)
    rows = _bar_rows(root)
    assert [(r["name"], r["state"]) for r in rows] == [("bar1.0000:41:00.0", "drifted")]
    assert rows[0]["running"] == "256 MiB"
    assert rows[0]["reason"].startswith("GPU 0000:41:00.0 BAR1: 256 MiB, smaller than the GPU's 96 GiB of memory, "
                                        "while its Resizable BAR capability supports up to 128 GiB")
    assert rows[0]["reason"].endswith(pci_bar.FIRMWARE_FIX)


def test_one_gpu_is_not_applicable_and_json_keys_are_read(build_node):
    root = build_node(cpus=4, gpus=1)
    assert [r["state"] for r in _bar_rows(root)] == ["not_applicable"]
    root = build_node(cpus=4, gpus=2)
    facts = gpu_p2p.read(Node(root))
    as_json = {b: dict(g, bars={str(k): v for k, v in g["bars"].items()},
                       rebar={str(k): v for k, v in g["rebar"].items()}) for b, g in facts["bars"].items()}
    assert [r["state"] for r in gpu_p2p.bar_rows({"gpu_p2p": {"bars": as_json}})] == ["applied"]


def test_verification_with_the_p2p_check_running_fails_the_small_bar1(build_node):
    root = build_node(cpus=4, nvidia_smi=True)
    assert _rows(root, bars=True)["bar1"]["state"] == "applied"
    simnode.set_gpu_bar(root, "0000:81:00.0", 1, 256 * MIB)
    rows = _rows(root, bars=True)
    assert "bar1" not in rows and rows["bar1.0000:81:00.0"]["state"] == "drifted"
    assert "256 MiB, smaller than the GPU's 96 GiB" in rows["bar1.0000:81:00.0"]["reason"]
