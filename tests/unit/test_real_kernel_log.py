"""Kernel logs with Xid and AER lines as other people posted them (tests/data/real/kmsg-*), read as /dev/kmsg.

The captures are dmesg or journal text; the collection reads /dev/kmsg records. ``to_kmsg`` converts,
as the kernel would have handed the same records over: a syslog prefix ("Sep 19 16:18:04 host kernel:")
and the dmesg timestamp are dropped (the timestamp becomes TS_USEC, or the line number for
``dmesg -T``/``--ctime`` dates), every record gets level err (3) and the next sequence number, and a
line without a timestamp of its own (dmesg prints the later lines of a multi-line record that way,
indented or not) is appended to the record before it with ``\\x0a``, which is how /dev/kmsg escapes
the newline inside one record.
"""

from __future__ import annotations

import re

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import kernel_log
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_health_verify

_SYSLOG = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: ")
_STAMP = re.compile(r"^\[\s*(\d+)\.(\d+)\] ")
_DATE = re.compile(r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\] ")


def to_kmsg(text):
    """/dev/kmsg bytes of a dmesg or journal capture (see the module docstring)."""
    records = []
    for n, line in enumerate(text.splitlines()):
        line = _SYSLOG.sub("", line)
        stamp, date = _STAMP.match(line), _DATE.match(line)
        if stamp:
            records.append([int(stamp.group(1)) * 1000000 + int(stamp.group(2)), line[stamp.end():]])
        elif date:
            records.append([n, line[date.end():]])
        elif records:
            records[-1][1] += "\\x0a" + line.strip()
    return "".join("3,%d,%d,-;%s\n" % (seq, usec, msg) for seq, (usec, msg) in enumerate(records)).encode()


def summary(real, name):
    records, _stats = kernel_log.parse_kmsg(to_kmsg(real(name).text))
    return records, kernel_log.summarize(records, kernel_log.compile_ignore_rules(None))


def test_xid_79_after_a_surprise_down_on_an_intel_root_port(real):
    records, s = summary(real, "kmsg-dmesg-xid79-aer-intel-6f04-gpu-burn-1.txt")
    assert len(records) == 13
    assert s["xid_codes"] == {"79": 1} and s["records"]["xid"][0]["device"] == "0000:02:00"
    # "Corrected" (the older kernels' word) and "Uncorrected (Fatal)", both from the root port 0000:00:02.0.
    assert s["aer_severities"] == {"Correctable": 1, "Uncorrectable (Fatal)": 1}
    assert {r["device"] for r in s["records"]["aer"]} == {"0000:00:02.0"}
    facts = {"pci": {"devices": [{"bdf": "0000:02:00.0", "vendor": "0x10de", "class": "0x030200"}]},
             "kernel_log": dict(s, available=True)}
    row = gpu_health_verify.xid_row(facts)
    assert row["state"] == "drifted" and "Xid 79 GPU has fallen off the bus (1x on 0000:02:00.0)" in row["reason"]


def test_correctable_and_corrected_are_one_severity_on_amd_and_intel_ports(real):
    amd = summary(real, "kmsg-journal-aer-correctable-amd-1453-pop-3363.txt")[1]
    old_intel = summary(real, "kmsg-dmesg-aer-corrected-intel-8c12-coreboot-2.txt")[1]
    new_intel = summary(real, "kmsg-dmesg-aer-correctable-intel-2f08-rebaruefi-11.txt")[1]
    # The AMD root port [1022:1453] and the GPU below it report Correctable errors (two PCIe Bus Error lines).
    assert amd["aer_severities"] == {"Correctable": 2}
    assert {r["device"] for r in amd["records"]["aer"]} == {"0000:00:03.1", "0000:07:00.0"}
    # Three reports each on an Intel PCH port (2019 kernel: "Corrected") and a Haswell-E port ("Correctable").
    assert old_intel["aer_severities"] == new_intel["aer_severities"] == {"Correctable": 3}


def test_a_multi_line_fallen_off_the_bus_record_is_classified_as_one_message(real):
    raw = to_kmsg(real("kmsg-dmesg-fallen-off-multiline-570-nvsentinel-155.txt").text)
    assert b"installed in this system has\\x0aNVRM: fallen off the bus" in raw
    records, s = summary(real, "kmsg-dmesg-fallen-off-multiline-570-nvsentinel-155.txt")
    assert len(records) == 3
    assert s["counts"]["fallen_off_bus"] == 1 and s["records"]["fallen_off_bus"][0]["device"] == "0000:b3:00.0"
    assert s["records"]["fallen_off_bus"][0]["message"] == (
        "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and "
        "is not responding to commands.")


def test_flush_left_continuation_lines_join_their_record(real):
    records, s = summary(real, "kmsg-dmesg-nvrm-multiline-bigdata-133.txt")
    assert len(records) == 6
    assert s["counts"]["other"] == 6 and s["trouble"] == 0
    texts = [kernel_log.joined(r[3]) for r in records]
    assert ("NVRM: This can occur when a driver such as: nouveau, rivafb, nvidiafb or rivatv was loaded and obtained "
            "ownership of the NVIDIA device(s).") in texts


def test_xid_119_gsp_timeouts_name_their_gpu(real):
    _records, s = summary(real, "kmsg-dmesg-T-xid119-gsp-open-gpu-kernel-modules-446.txt")
    assert s["xid_codes"] == {"119": 7} and {r["device"] for r in s["records"]["xid"]} == {"0000:61:00"}
    facts = {"pci": {"devices": [{"bdf": "0000:61:00.0", "vendor": "0x10de", "class": "0x030200"}]},
             "kernel_log": dict(s, available=True)}
    row = gpu_health_verify.xid_row(facts)
    assert row["state"] == "drifted" and "Xid 119 GSP RPC timeout (7x on 0000:61:00.0)" in row["reason"]


def test_xid_13_and_109_are_reported_and_peermem_is_a_module_failure(real):
    _records, s = summary(real, "kmsg-dmesg-ctime-xid13-109-gpud-46.txt")
    assert s["xid_codes"] == {"13": 3, "109": 1}
    assert s["counts"]["module_failure"] == 1 and s["records"]["module_failure"][0]["module"] == "nvidia_peermem"
    facts = {"pci": {"devices": [{"bdf": "0000:cb:00.0", "vendor": "0x10de", "class": "0x030200"}]},
             "kernel_log": dict(s, available=True)}
    row = gpu_health_verify.xid_row(facts)
    assert row["state"] == "applied" and row["reason"] == (
        "reported: Xid 13 (3x on 0000:cb:00.0); Xid 109 (1x on 0000:cb:00.0)")


@pytest.mark.parametrize("escaped, text", [
    ("a\\x0ab", "a\nb"), ("tab\\x09here", "tab\there"), ("no escape", "no escape")])
def test_kmsg_escapes_are_decoded(escaped, text):
    assert kernel_log.unescape(escaped) == text
