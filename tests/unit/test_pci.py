"""module_utils/core/pci.py: decoding, selection and batched setpci on simulated nodes."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest
from support.lspci import parse_lspci_devctl

from ansible_collections.gpunode.tuning.plugins.module_utils.core import pci
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_mrrs

SETPCI = shutil.which("setpci")
LSPCI = shutil.which("lspci")


def _run(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _config(root, bdf):
    with open(os.path.join(root, "sys/bus/pci/devices", bdf, "config"), "rb") as fh:
        return fh.read()


# --- encoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("size,field", [(128, 0), (256, 1), (512, 2), (1024, 3), (2048, 4), (4096, 5)])
def test_mrrs_encoding_round_trips(size, field):
    assert pci.encode_mrrs(size) == field
    assert pci.decode_mrrs(field) == size


@pytest.mark.parametrize("bad", [0, 64, 300, 8192, -1, True, "4096", None])
def test_encode_mrrs_rejects_sizes_naming_the_allowed_ones(bad):
    with pytest.raises(ValueError, match="128, 256, 512, 1024, 2048, 4096"):
        pci.encode_mrrs(bad)


def test_decode_mrrs_reserved_and_out_of_range():
    assert pci.decode_mrrs(6) is None and pci.decode_mrrs(7) is None
    for bad in (8, -1, "5"):
        with pytest.raises(ValueError):
            pci.decode_mrrs(bad)


def test_setpci_assignment_uses_mask_7000_only():
    assert pci.setpci_mrrs_assignment(4096) == "CAP_EXP+08.w=5000:7000"
    assert pci.setpci_mrrs_assignment(128) == "CAP_EXP+08.w=0000:7000"
    for size in pci.MRRS_CHOICES:
        value, mask = pci.setpci_mrrs_assignment(size).split("=")[1].split(":")
        assert mask == "7000" and int(value, 16) & ~0x7000 == 0


def test_mrrs_and_mps_of_a_devctl_value():
    assert pci.mrrs_of_devctl(0x293F) == 512 and pci.mps_of_devctl(0x293F) == 256


# --- capability walk and decoding ----------------------------------------------------------


def test_decode_pcie_of_simulated_gpu_nvme_and_root_port(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4)
    gpu = pci.decode_pcie(_config(root, "0000:41:00.0"))
    assert gpu["cap_offset"] == 0x78 == pci.find_capability(_config(root, "0000:41:00.0"), 0x10)
    assert gpu["port_type"] == "endpoint"
    assert (gpu["mps"], gpu["mrrs"], gpu["devcap_mps_max"]) == (256, 512, 512)
    assert gpu["devctl"] == 0x293F
    assert (gpu["link_speed_capable"], gpu["link_speed_capable_code"]) == ("32.0 GT/s", 5)
    assert gpu["link_width_capable"] == 16
    assert (gpu["link_speed_current"], gpu["link_width_current"]) == ("32.0 GT/s", 16)
    nvme = pci.decode_pcie(_config(root, "0000:e3:00.0"))
    assert (nvme["link_speed_current"], nvme["link_width_current"]) == ("16.0 GT/s", 4)
    assert pci.decode_pcie(_config(root, "0000:40:01.1"))["port_type"] == "root_port"
    # The MSI capability (0x05) is found too; an absent ID is None.
    assert pci.find_capability(_config(root, "0000:41:00.0"), 0x05) == 0x68
    assert pci.find_capability(_config(root, "0000:41:00.0"), 0x11) is None


def test_decode_pcie_none_without_capability(build_node):
    root = build_node("tiny-vm")
    assert pci.decode_pcie(_config(root, "0000:00:03.0")) is None
    cfg = bytearray(_config(build_node("audited-epyc-8gpu", cpus=4), "0000:41:00.0"))
    cfg[0x06] &= ~0x10  # Status: no capability list
    assert pci.find_capability(cfg, 0x10) is None
    assert pci.decode_pcie(b"\xff" * 64) is None  # header only (unprivileged read)


def test_find_capability_survives_a_pointer_loop():
    cfg = bytearray(256)
    struct.pack_into("<H", cfg, 0x06, 0x10)
    cfg[0x34] = 0x40
    cfg[0x40], cfg[0x41] = 0x01, 0x50
    cfg[0x50], cfg[0x51] = 0x05, 0x40  # points back
    assert pci.find_capability(cfg, 0x10) is None


@pytest.mark.parametrize("preset", ["audited-epyc-8gpu", "xeon-4gpu-switch", "locked-bus-perf"])
def test_decode_agrees_with_real_lspci(build_node, preset):
    root = build_node(preset, cpus=4)
    node = Node(root)
    rc, out, err = _run([LSPCI] + node.pciutils_args() + ["-D", "-vvv"])
    assert rc == 0, err
    parsed = parse_lspci_devctl(out)
    devices = pci.list_devices(node)
    assert set(parsed) == {d["bdf"] for d in devices}
    for dev in devices:
        decoded = pci.decode_pcie(pci.read_config(dev))
        assert parsed[dev["bdf"]] == {"mps": decoded["mps"], "mrrs": decoded["mrrs"]}, dev["bdf"]


def test_parse_lspci_devctl_ignores_devcap_line():
    text = (
        "41:00.0 VGA compatible controller: NVIDIA Corporation Device 2bb5\n"
        "\t\tDevCap:\tMaxPayload 512 bytes, PhantFunc 0, Latency L0s unlimited\n"
        "\t\tDevCtl:\tCorrErr+ NonFatalErr+\n"
        "\t\t\tMaxPayload 256 bytes, MaxReadReq 4096 bytes\n"
    )
    assert parse_lspci_devctl(text) == {"0000:41:00.0": {"mps": 256, "mrrs": 4096}}


# --- listing and selection ------------------------------------------------------------------


def test_list_devices_fields(build_node):
    devices = pci.list_devices(Node(build_node("audited-epyc-8gpu", cpus=4)))
    bdfs = [d["bdf"] for d in devices]
    assert bdfs == sorted(bdfs) and len(bdfs) == 21
    gpu = next(d for d in devices if d["bdf"] == "0000:41:00.0")
    assert gpu["vendor"] == "0x10de" and gpu["device"] == "0x2bb5" and gpu["class"] == "0x030200"
    assert gpu["numa_node"] == 0 and gpu["path"].endswith("sys/bus/pci/devices/0000:41:00.0")


def test_default_selector_takes_gpus_only(build_node):
    node = Node(build_node("audited-epyc-8gpu", cpus=4))
    sel = pci.DeviceSelector()
    assert sel.is_default
    chosen = [d["bdf"] for d in pci.list_devices(node) if sel.matches(d)]
    assert chosen == ["0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0", "0000:81:00.0",
                      "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0"]
    # Not the GPU's audio function, not the NIC, the NVMe drive or any bridge.
    for bdf in ("0000:41:00.1", "0000:c2:00.0", "0000:e3:00.0", "0000:40:01.1"):
        assert bdf not in chosen


def test_default_selector_on_switch_topology(build_node):
    node = Node(build_node("xeon-4gpu-switch", cpus=4))
    chosen = [d for d in pci.list_devices(node) if pci.DeviceSelector.nvidia_gpus().matches(d)]
    assert [d["bdf"] for d in chosen] == ["0000:18:00.0", "0000:19:00.0", "0000:1a:00.0", "0000:1b:00.0"]
    assert all(d["class"] == "0x030000" for d in chosen)


def test_selector_criteria_combine():
    dev = {"bdf": "0000:c2:00.0", "vendor": "0x15b3", "device": "0x1021", "class": "0x020000"}
    assert pci.DeviceSelector(vendor="15b3").matches(dev)
    assert pci.DeviceSelector(vendor=0x15B3, class_prefixes=["02"]).matches(dev)
    assert pci.DeviceSelector(vendor="0x15B3", device="1021", class_prefixes=["0200"]).matches(dev)
    assert not pci.DeviceSelector(vendor="15b3", class_prefixes=["0207"]).matches(dev)
    assert pci.DeviceSelector(bdfs=["c2:00.0"]).matches(dev)
    assert not pci.DeviceSelector(bdfs=["c2:00.0"], vendor="10de").matches(dev)
    assert pci.DeviceSelector(class_prefixes=["020000"]).matches(dict(dev, **{"class": 0x020000}))


@pytest.mark.parametrize("text,expected", [
    ("0000:41:00.0", "0000:41:00.0"), ("41:00.0", "0000:41:00.0"), ("0001:C2:1F.7", "0001:c2:1f.7"),
])
def test_normalize_bdf(text, expected):
    assert pci.normalize_bdf(text) == expected


@pytest.mark.parametrize("bad", ["41:00", "41:20.0", "41:00.8", "0:41:00.0", "41:00.0;reboot", "$(id)", "",
                                 "0000:41:00.0 ", "0000:41:00.0\n-s", None, 4100])
def test_normalize_bdf_rejects(bad):
    if bad == "0000:41:00.0 ":
        assert pci.normalize_bdf(bad) == "0000:41:00.0"  # surrounding blanks are trimmed
        return
    with pytest.raises(ValueError, match="DDDD:BB:DD.F or BB:DD.F"):
        pci.normalize_bdf(bad)


@pytest.mark.parametrize("kwargs,match", [
    (dict(vendor="nvidia"), "vendor must be a 4-digit hex"),
    (dict(vendor="0x10de0"), "vendor must be a 4-digit hex"),
    (dict(device="g000"), "device must be a 4-digit hex"),
    (dict(vendor=0x10000), "fit in 4 hex digits"),
    (dict(class_prefixes=["030"]), "2, 4 or 6 hex digits"),
    (dict(class_prefixes=["display"]), "2, 4 or 6 hex digits"),
    (dict(class_prefixes=[300]), "2, 4 or 6 hex digits"),
])
def test_selector_rejects_malformed_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pci.DeviceSelector(**kwargs)


def test_pcie_bus_perf_detection(build_node):
    assert pci.pcie_bus_perf(Node(build_node("locked-bus-perf", cpus=4)))
    assert not pci.pcie_bus_perf(Node(build_node("audited-epyc-8gpu", cpus=4)))
    root = build_node("tiny-vm")
    with open(os.path.join(root, "proc/cmdline"), "w") as fh:
        fh.write("ro pci=noaer,pcie_bus_perf quiet\n")
    assert pci.pcie_bus_perf(Node(root))


# --- batched setpci ----------------------------------------------------------------------------


def _counting_runner():
    calls = []

    def run(argv):
        calls.append(argv)
        return _run(argv)

    return run, calls


def test_setpci_reads_many_devices_in_one_process(build_node):
    node = Node(build_node("audited-epyc-8gpu", cpus=4, gpus=16))
    run, calls = _counting_runner()
    sp = pci.Setpci(run, SETPCI, node.pciutils_args())
    devices = [d for d in pci.list_devices(node) if pci.decode_pcie(pci.read_config(d))]
    values, errors = sp.read_devctl([d["bdf"] for d in devices])
    assert not errors and len(calls) == 1
    for d in devices:
        assert values[d["bdf"]] == pci.decode_pcie(pci.read_config(d))["devctl"]


def test_setpci_writes_many_devices_in_one_process(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4)
    node = Node(root)
    run, calls = _counting_runner()
    sp = pci.Setpci(run, SETPCI, node.pciutils_args())
    assert sp.write_mrrs({"0000:41:00.0": 4096, "0000:61:00.0": 1024}) == (0, "")
    assert len(calls) == 1
    assert pci.decode_pcie(_config(root, "0000:41:00.0"))["mrrs"] == 4096
    assert pci.decode_pcie(_config(root, "0000:61:00.0"))["mrrs"] == 1024


def test_setpci_read_falls_back_per_device_when_one_is_gone(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4)
    node = Node(root)
    run, calls = _counting_runner()
    sp = pci.Setpci(run, SETPCI, node.pciutils_args())
    values, errors = sp.read_devctl(["0000:41:00.0", "0000:99:00.0", "0000:61:00.0"])
    assert values == {"0000:41:00.0": 0x293F, "0000:61:00.0": 0x293F}
    assert list(errors) == ["0000:99:00.0"]
    assert len(calls) == 4  # the batch, then one per device


def test_setpci_batches_are_bounded(build_node, monkeypatch):
    node = Node(build_node("audited-epyc-8gpu", cpus=4))
    monkeypatch.setattr(pci.Setpci, "BATCH", 3)
    run, calls = _counting_runner()
    sp = pci.Setpci(run, SETPCI, node.pciutils_args())
    gpus = [d["bdf"] for d in pci.list_devices(node) if pci.DeviceSelector().matches(d)]
    values, errors = sp.read_devctl(gpus)
    assert len(values) == 8 and not errors and len(calls) == 3


# --- the apply layer with a failing writer ------------------------------------------------------


def test_run_mrrs_reports_refused_writes_and_keeps_the_journal(build_node):
    """setpci refuses every write (as under an undetected lockdown): after the failed batch each
    device is tried alone, so each fails with its own setpci message; nothing changed, and the
    journal was saved before the first write."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import Journal

    root = build_node("audited-epyc-8gpu", cpus=4)
    node = Node(root)
    calls = []

    def run(argv):
        calls.append(argv)
        if any("=" in a and a.startswith("CAP_EXP") for a in argv):
            return 1, "", "setpci: sysfs_write: write failed: Operation not permitted"
        return _run(argv)

    journal = Journal(node, "/var/lib/gpunode-tuning/journal.json")
    result = pcie_mrrs.run_mrrs(node, lambda: pci.Setpci(run, SETPCI, node.pciutils_args()), journal, False,
                                mrrs=4096, selector=pci.DeviceSelector())
    assert len(result["failed_devices"]) == 8 and not result["changed"]
    assert all(d["reason"] == "write refused: setpci rc 1: setpci: sysfs_write: write failed: Operation not "
               "permitted" and d["mrrs_after"] == 512 for d in result["devices"])
    # The batch write and read-back, then each device written alone, then one read-back.
    writes = [a for a in calls if any(x.startswith("CAP_EXP+08.w=") for x in a)]
    assert [w.count("-s") for w in writes] == [8] + [1] * 8
    assert len(calls) == 11 and calls[-1].count("-s") == 8
    reopened = Journal(node, "/var/lib/gpunode-tuning/journal.json")
    assert set(reopened.entries("pcie_mrrs").values()) == {512} and len(reopened.entries("pcie_mrrs")) == 8


def test_run_mrrs_validates_mrrs_for_library_callers(build_node):
    node = Node(build_node("tiny-vm"))
    with pytest.raises(ValueError, match="128, 256"):
        pcie_mrrs.run_mrrs(node, None, None, True, mrrs=300)
