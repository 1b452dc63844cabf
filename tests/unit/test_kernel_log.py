"""Kernel-log parsing, filtering and classification (plugins/module_utils/core/kernel_log.py)."""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import kernel_log as kl
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node

# One record of each class, plus records that the level filter must drop, a continuation line,
# a user-space record (facility 3, "daemon") and malformed lines.
FIXTURE = b"".join([
    b"6,0,100000,-;Linux version 6.1.0-28-amd64\n",
    b"4,1,2000000,-;pcieport 0000:40:01.1: AER: Corrected error received: 0000:41:00.0\n",
    b"4,2,2000100,-;nvidia 0000:41:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)\n",
    b" SUBSYSTEM=pci\n",
    b" DEVICE=+pci:0000:41:00.0\n",
    b"4,3,2000200,-;nvidia 0000:41:00.0:   device [10de:2bb5] error status/mask=00000001/0000e000\n",
    b"3,4,3000000,-;NVRM: Xid (PCI:0000:61:00): 79, pid=2231, name=python3, GPU has fallen off the bus.\n",
    b"3,5,3000100,-;NVRM: GPU at PCI:0000:61:00: GPU-1a2b3c4d has fallen off the bus.\n",
    b"3,6,3000200,-;NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.\n",
    b"5,7,4000000,-;Lockdown: setpci: direct PCI access is restricted; see man kernel_lockdown.7\n",
    b"3,8,5000000,-;nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client\n",
    b"3,9,5000100,-;nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)\n",
    b"3,10,5000200,-;nvidia-peermem nv_mem_client_init:203 ERROR: ib_register_peer_memory_client failed\n",
    b"4,11,5000300,-;nvidia: module verification failed: signature and/or required key missing - tainting kernel\n",
    b"4,12,6000000,-;vxlan: non-ECT from 10.224.3.17 with TOS=0x2\n",
    b"4,13,6000100,-;vxlan: non-ECT from 192.168.9.9 with TOS=0x2\n",
    b"this line is not a record\n",
    b"4,14;missing fields\n",
    b"\n",
    b"2,15,7000000,-;mce: [Hardware Error]: Machine check events logged\n",
    b"27,16,7500000,-;systemd[1]: Failed to start foo.service.\n",
    b"30,17,7600000,-;systemd[1]: Started bar.service.\n",
    b"7,18,8000000,-;debug chatter\n",
])


def parse(levels=("err", "warn"), since=0, data=FIXTURE):
    return kl.parse_kmsg(data, kl.select_levels(levels), since)


def test_levels_err_means_err_and_worse():
    assert kl.select_levels(["err"]) == {0, 1, 2, 3}
    assert kl.select_levels(["warn"]) == {4}
    assert kl.select_levels(["crit", "info"]) == {2, 6}
    assert kl.select_levels([" ERR "]) == {0, 1, 2, 3}


@pytest.mark.parametrize("bad", [["warning"], ["3"], ["err", "bogus"]])
def test_bad_level_names_allowed_values(bad):
    with pytest.raises(kl.KernelLogError) as exc:
        kl.select_levels(bad)
    assert "emerg, alert, crit, err, warn, notice, info, debug" in str(exc.value)


def test_empty_levels_rejected():
    with pytest.raises(kl.KernelLogError, match="at least one"):
        kl.select_levels([])


def test_parse_filters_by_level_and_skips_malformed():
    records, stats = parse()
    seqs = [r[2] for r in records]
    # 0 (info), 17 (daemon.info) and 18 (debug) are dropped; 16 is daemon.err (27 & 7 == 3).
    assert seqs == [1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 15, 16]
    assert stats == {"total": 18, "malformed": 2, "selected": 14, "last_usec": 8000000}
    level, usec, seq, message = records[-1]
    assert (level, usec, seq) == (3, 7500000, 16)
    assert message == "systemd[1]: Failed to start foo.service."


def test_parse_notice_only():
    records = parse(levels=["notice"])[0]
    assert [r[3] for r in records] == ["Lockdown: setpci: direct PCI access is restricted; see man kernel_lockdown.7"]


def test_parse_since_is_inclusive():
    records, stats = parse(since=5000200)
    assert [r[2] for r in records] == [10, 11, 12, 13, 15, 16]
    assert stats["selected"] == 6


def test_parse_tolerates_garbage_only_and_empty():
    assert kl.parse_kmsg(b"", frozenset(range(8)))[0] == []
    records, stats = kl.parse_kmsg(b"\xff\xfe garbage\n;;;\n4,x,1,-;bad seq\n", frozenset(range(8)))
    assert records == []
    assert stats["malformed"] == 3 and stats["total"] == 0


def test_parse_message_with_semicolons_and_invalid_utf8():
    data = b"4,1,10,-;a; b; c \xff\n4,2,20,c,extra;next\n"
    records, stats = kl.parse_kmsg(data, frozenset([4]))
    assert [r[3] for r in records] == ["a; b; c \ufffd", "next"]
    assert stats["malformed"] == 0


@pytest.mark.parametrize("message, cls, extra", [
    ("pcieport 0000:40:01.1: AER: Corrected error received: 0000:41:00.0", "aer", {"device": "0000:40:01.1"}),
    ("nvidia 0000:41:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)",
     "aer", {"device": "0000:41:00.0", "severity": "Uncorrectable (Non-Fatal)"}),
    ("nvidia 0000:41:00.0:   device [10de:2bb5] error status/mask=00004000/00000000", "aer",
     {"device": "0000:41:00.0"}),
    ("NVRM: Xid (PCI:0000:41:00): 79, pid=2231, name=python3, GPU has fallen off the bus.", "xid",
     {"code": 79, "device": "0000:41:00"}),
    ("NVRM: Xid (PCI:0000:C1:00): 13, Graphics SM Warp Exception", "xid", {"code": 13, "device": "0000:c1:00"}),
    ("NVRM: GPU at PCI:0000:41:00: GPU-1a2b has fallen off the bus.", "fallen_off_bus", {"device": "0000:41:00"}),
    ("NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.", "fallen_off_bus", {"device": "0000:61:00.0"}),
    ("Lockdown: setpci: direct PCI access is restricted; see man kernel_lockdown.7", "lockdown",
     {"program": "setpci", "what": "direct PCI access"}),
    ("nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client", "module_failure",
     {"module": "nvidia_peermem"}),
    ("nvidia_peermem: Unknown symbol ib_unregister_peer_memory_client (err -22)", "module_failure",
     {"module": "nvidia_peermem"}),
    ("nvidia-peermem nv_mem_client_init:203 ERROR: ib_register_peer_memory_client failed", "module_failure",
     {"module": "nvidia_peermem"}),
    ("nvidia: module verification failed: signature and/or required key missing - tainting kernel",
     "module_failure", {"module": "nvidia"}),
    ("vxlan: non-ECT from 10.224.3.17 with TOS=0x2", "noise", {"rule": 0}),
    ("ACPI: _OSC: platform retains control of PCIe features (AE_NOT_FOUND)", "other", {}),
    ("Kernel is locked down from command line; see man kernel_lockdown.7", "other", {}),
])
def test_classify_default_rules(message, cls, extra):
    assert kl.classify(message, kl.compile_ignore_rules(None)) == (cls, extra)


def test_noise_rule_with_cidr_only_inside():
    rules = kl.compile_ignore_rules([{"pattern": r"^vxlan: non-ECT from", "cidr": "10.224.0.0/16"}])
    assert kl.classify("vxlan: non-ECT from 10.224.3.17 with TOS=0x2", rules) == (
        "noise", {"rule": 0, "address": "10.224.3.17"})
    assert kl.classify("vxlan: non-ECT from 10.225.3.17 with TOS=0x2", rules) == ("other", {})
    # No address in the message: a cidr rule cannot match.
    assert kl.classify("vxlan: non-ECT from somewhere with TOS=0x2", rules) == ("other", {})


def test_noise_rule_named_address_group_and_ipv6():
    rules = kl.compile_ignore_rules([
        {"pattern": r"peer (?P<address>\S+) reset", "cidr": "192.168.0.0/24"},
        {"pattern": r"^vxlan: non-ECT", "cidr": "fd00::/8"},
    ])
    # The named group wins over the first address in the message (10.0.0.1).
    assert kl.classify("from 10.0.0.1: peer 192.168.0.7 reset", rules) == (
        "noise", {"rule": 0, "address": "192.168.0.7"})
    assert kl.classify("vxlan: non-ECT from fd12:3456::1 with TOS=0x2", rules) == (
        "noise", {"rule": 1, "address": "fd12:3456::1"})
    assert kl.classify("vxlan: non-ECT from fe80::1 with TOS=0x2", rules)[0] == "other"


def test_noise_rules_come_first_and_empty_list_ignores_nothing():
    rules = kl.compile_ignore_rules([{"pattern": "Xid .*: 13,"}])
    assert kl.classify("NVRM: Xid (PCI:0000:41:00): 13, Graphics Exception", rules)[0] == "noise"
    assert kl.classify("NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.", rules)[0] == "xid"
    assert kl.classify("vxlan: non-ECT from 10.224.3.17 with TOS=0x2", kl.compile_ignore_rules([]))[0] == "other"


@pytest.mark.parametrize("rules, fragment", [
    ([{"pattern": "vxlan: (unclosed"}], "kmsg_ignore[0].pattern 'vxlan: (unclosed' is not a valid regular expression"),
    ([{"pattern": "x"}, {"pattern": "y", "cidr": "10.224.0.0/33"}],
     "kmsg_ignore[1].cidr '10.224.0.0/33' is not a network"),
    ([{"pattern": "y", "cidr": "not-a-net"}], "CIDR notation"),
    ([{"pattern": ""}], "kmsg_ignore[0].pattern must be a non-empty"),
    ([{"pattern": "x", "network": "10.0.0.0/8"}], "unknown key(s) network; allowed: pattern, cidr"),
    (["vxlan"], "kmsg_ignore[0] must be a dict"),
])
def test_bad_ignore_rules(rules, fragment):
    with pytest.raises(kl.KernelLogError) as exc:
        kl.compile_ignore_rules(rules)
    assert fragment in str(exc.value)


def test_summarize_counts_samples_and_codes():
    records = parse()[0]
    s = kl.summarize(records, kl.compile_ignore_rules(None))
    assert s["counts"] == {"aer": 3, "xid": 1, "fallen_off_bus": 2, "lockdown": 0, "module_failure": 4,
                           "noise": 2, "other": 2}
    assert s["trouble"] == 10
    assert s["xid_codes"] == {"79": 1}
    assert s["aer_severities"] == {"Correctable": 1}
    assert s["records"]["xid"] == [{
        "level": "err", "time": 3.0, "seq": 4, "code": 79, "device": "0000:61:00",
        "message": "NVRM: Xid (PCI:0000:61:00): 79, pid=2231, name=python3, GPU has fallen off the bus.",
    }]
    assert [r["message"] for r in s["records"]["other"]] == [
        "mce: [Hardware Error]: Machine check events logged", "systemd[1]: Failed to start foo.service."]
    assert [r["level"] for r in s["records"]["other"]] == ["crit", "err"]


def test_summarize_keeps_first_five_per_class():
    data = b"".join(b"4,%d,%d,-;vxlan: non-ECT from 10.224.0.%d with TOS=0x2\n" % (i, i * 1000, i) for i in range(12))
    records = kl.parse_kmsg(data, frozenset([4]))[0]
    s = kl.summarize(records, kl.compile_ignore_rules(None))
    assert s["counts"]["noise"] == 12
    assert [r["seq"] for r in s["records"]["noise"]] == [0, 1, 2, 3, 4]


def _node_with_kmsg(tmp_path, data):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_bytes(data)
    return Node(str(tmp_path))


def test_kernel_log_facts_from_file(tmp_path):
    facts = kl.kernel_log_facts(_node_with_kmsg(tmp_path, FIXTURE), since=3.0)
    assert facts["available"] is True and facts["reason"] is None
    assert facts["source"] == str(tmp_path / "dev" / "kmsg")
    assert facts["levels"] == ["err", "warn"] and facts["since"] == 3.0
    assert (facts["records_total"], facts["records_selected"], facts["malformed"]) == (18, 11, 2)
    assert facts["last_time"] == 8.0  # newest record at any level, the clock kmsg_since uses
    assert facts["counts"]["aer"] == 0 and facts["counts"]["xid"] == 1


def test_kernel_log_facts_bad_since(tmp_path):
    node = _node_with_kmsg(tmp_path, FIXTURE)
    with pytest.raises(kl.KernelLogError, match=r"kmsg_since must be >= 0"):
        kl.kernel_log_facts(node, since=-1)
    with pytest.raises(kl.KernelLogError, match=r"kmsg_since must be a number"):
        kl.kernel_log_facts(node, since="yesterday")


def test_unavailable_when_missing(tmp_path):
    facts = kl.kernel_log_facts(Node(str(tmp_path)))
    assert facts["available"] is False
    assert "cannot read %s" % (tmp_path / "dev" / "kmsg") in facts["reason"]
    assert "container" in facts["reason"]
    assert facts["counts"]["other"] == 0 and facts["records"]["aer"] == []
    assert facts["last_time"] is None


def test_unavailable_when_permission_denied(tmp_path, monkeypatch):
    node = _node_with_kmsg(tmp_path, FIXTURE)
    real_open = os.open

    def deny(path, flags, *args):
        if str(path).endswith("dev/kmsg"):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_open(path, flags, *args)

    monkeypatch.setattr(kl.os, "open", deny)
    facts = kl.kernel_log_facts(node)
    assert facts["available"] is False
    assert "Operation not permitted" in facts["reason"] and "dmesg_restrict" in facts["reason"]


def test_device_read_until_eagain(tmp_path):
    """A non-regular file (a FIFO standing in for /dev/kmsg): read records until EAGAIN, never block."""
    (tmp_path / "dev").mkdir()
    fifo = str(tmp_path / "dev" / "kmsg")
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)
    try:
        os.write(writer, FIXTURE)
        data, reason = kl.read_kmsg(Node(str(tmp_path)))  # the writer stays open: EOF never comes
    finally:
        os.close(writer)
        os.close(keep)
    assert reason is None
    assert data == FIXTURE


def test_device_read_skips_epipe(tmp_path, monkeypatch):
    (tmp_path / "dev").mkdir()
    fifo = str(tmp_path / "dev" / "kmsg")
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)
    real_read = os.read
    calls = {"n": 0}

    def flaky(fd, n):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EPIPE, "Broken pipe")  # records overwritten while reading
        return real_read(fd, n)

    monkeypatch.setattr(kl.os, "read", flaky)
    try:
        os.write(writer, b"3,0,1,-;first\n")
        data, reason = kl.read_kmsg(Node(str(tmp_path)))
    finally:
        os.close(writer)
        os.close(keep)
    assert (data, reason) == (b"3,0,1,-;first\n", None)
