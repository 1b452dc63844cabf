"""amdgpu kernel-log messages classified per GPU (core/amdgpu_log.py), on logs people posted (amd-kmsg-*).

The captures are dmesg or journal text; ``to_kmsg`` turns them into /dev/kmsg records as the kernel hands
them over (prefix and timestamp dropped, one record per line), every record at level info (6): the driver
logs resets, VRAM loss and RAS counts at info, and the classes must be found whatever the level. The
records go through kernel_log.parse_kmsg, as the collection reads them, and then amdgpu_log.summarize.

Lines for the classes no public log was found for (poison consumed, the bad-page threshold, deferred and
per-die RAS counts) are built from the driver's format strings and say so.
"""

from __future__ import annotations

import os
import re

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amdgpu_log, kernel_log

REAL = os.path.join(os.path.dirname(__file__), "..", "data", "real")
CAPTURES = (
    "amd-kmsg-dmesg-T-athub-ue-reset-mi50-legacy-rocm-build-1886.txt",
    "amd-kmsg-dmesg-T-ring-timeout-reset-navi33-steamos-2802.txt",
    "amd-kmsg-dmesg-athub-ue-aca-mi300x-legacy-rocm-build-4021.txt",
    "amd-kmsg-dmesg-fatal-init-mi210-legacy-rocm-build-3712.txt",
    "amd-kmsg-dmesg-fatal-init-mi210-rocm7.1-rocm-install-on-linux-615.txt",
    "amd-kmsg-dmesg-psp-hw-init-failed-domain-0002-legacy-rocm-build-2995.txt",
    "amd-kmsg-dmesg-ring-timeout-mode2-reset-legacy-rocm-build-6273.txt",
    "amd-kmsg-dmesg-vram-lost-reset-failed-legacy-rocm-build-2804.txt",
    "amd-kmsg-journal-iso-reset-succeeded-gfx1103-rocm-sdk-builder-141.txt",
    "amd-kmsg-ras-umc-ce-ue-r9700-skriptoteket.txt",
)
INFO = 6


def to_kmsg(text, level=INFO):
    """/dev/kmsg bytes of a dmesg or journal capture: one record per line, at ``level``."""
    records = [amdgpu_log.message_of(line) for line in text.splitlines() if line.strip()]
    return "".join("%d,%d,%d,-;%s\n" % (level, seq, seq * 1000, msg) for seq, msg in enumerate(records)).encode()


def summary(real, name, level=INFO):
    records, _stats = kernel_log.parse_kmsg(to_kmsg(real(name).text, level), None)
    return amdgpu_log.summarize(records)


def found(s):
    return {cls: n for cls, n in s["counts"].items() if n}


def test_every_kernel_log_capture_is_read_here_and_named_in_the_readme():
    assert sorted(n for n in os.listdir(REAL) if n.startswith("amd-kmsg-")) == sorted(CAPTURES)
    with open(os.path.join(REAL, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert [n for n in CAPTURES if "| %s |" % n not in readme] == []


def test_an_athub_uncorrectable_error_then_a_reset_on_an_mi50(real):
    s = summary(real, "amd-kmsg-dmesg-T-athub-ue-reset-mi50-legacy-rocm-build-1886.txt")
    assert found(s) == {"ras_uncorrectable": 1, "gpu_reset": 1} and s["trouble"] == 2
    assert s["by_device"] == {"0000:e3:00.0": {"ras_uncorrectable": 1, "gpu_reset": 1}}
    assert s["ras_blocks"] == {"ras_uncorrectable": {"athub": 1}}
    assert s["records"]["ras_uncorrectable"][0]["event"] == "ERREVENT_ATHUB_INTERRUPT"


def test_the_mi300x_hive_error_is_counted_on_the_gpu_that_raised_it(real):
    s = summary(real, "amd-kmsg-dmesg-athub-ue-aca-mi300x-legacy-rocm-build-4021.txt")
    # The ACA records the other GPUs of the hive log are details, not more errors.
    assert found(s) == {"ras_uncorrectable": 1} and list(s["by_device"]) == ["0000:1c:00.0"]


def test_vram_lost_and_a_failed_reset(real):
    s = summary(real, "amd-kmsg-dmesg-vram-lost-reset-failed-legacy-rocm-build-2804.txt")
    assert found(s) == {"vram_lost": 1, "gpu_reset_failed": 1}
    # "[drm] VRAM is lost due to GPU reset!" names no device; the failed reset does.
    assert s["by_device"] == {"unknown": {"vram_lost": 1}, "0000:0b:00.0": {"gpu_reset_failed": 1}}


@pytest.mark.parametrize("name,bdf", [
    ("amd-kmsg-dmesg-ring-timeout-mode2-reset-legacy-rocm-build-6273.txt", "0000:c5:00.0"),
    ("amd-kmsg-dmesg-T-ring-timeout-reset-navi33-steamos-2802.txt", "0000:03:00.0"),
])
def test_a_ring_timeout_then_one_reset_counted_once(real, name, bdf):
    s = summary(real, name)
    # "Ring gfx_0.0.0 reset failed", "MODE2 reset" and "GPU reset succeeded" are not further resets.
    assert found(s) == {"ring_timeout": 1, "gpu_reset": 1}
    assert s["by_device"] == {bdf: {"ring_timeout": 1, "gpu_reset": 1}}
    assert s["records"]["ring_timeout"][0]["ring"] == "gfx_0.0.0"


def test_a_reset_that_succeeds_and_ring_lines_that_are_no_timeout(real):
    s = summary(real, "amd-kmsg-journal-iso-reset-succeeded-gfx1103-rocm-sdk-builder-141.txt")
    assert found(s) == {"gpu_reset": 1} and s["by_device"] == {"0000:c3:00.0": {"gpu_reset": 1}}


@pytest.mark.parametrize("name,bdf", [
    ("amd-kmsg-dmesg-fatal-init-mi210-legacy-rocm-build-3712.txt", "0000:48:00.0"),
    ("amd-kmsg-dmesg-fatal-init-mi210-rocm7.1-rocm-install-on-linux-615.txt", "0000:83:00.0"),
])
def test_a_gpu_that_fails_to_initialise_counts_once(real, name, bdf):
    s = summary(real, name)
    assert found(s) == {"init_failed": 1} and s["by_device"] == {bdf: {"init_failed": 1}}


def test_a_log_cut_before_the_fatal_line_shows_no_init_failure(real):
    # The stored copy ends after "hw_init of IP block <psp> failed -22": the cause, not the verdict line.
    s = summary(real, "amd-kmsg-dmesg-psp-hw-init-failed-domain-0002-legacy-rocm-build-2995.txt")
    assert found(s) == {} and s["trouble"] == 0


def test_ras_counts_by_block_at_info_level_and_correctable_is_no_trouble(real):
    s = summary(real, "amd-kmsg-ras-umc-ce-ue-r9700-skriptoteket.txt")
    assert found(s) == {"ras_correctable": 1, "ras_uncorrectable": 1} and s["trouble"] == 1
    assert s["ras_blocks"] == {"ras_correctable": {"umc": 1048560}, "ras_uncorrectable": {"umc": 1048560}}
    # The same records at info level are what kernel_log's default err/warn filter would never see.
    records, _total = kernel_log.parse_kmsg(to_kmsg(real("amd-kmsg-ras-umc-ce-ue-r9700-skriptoteket.txt").text),
                                            kernel_log.select_levels(kernel_log.DEFAULT_LEVELS))
    assert records == []


@pytest.mark.parametrize("level", range(8))
def test_the_class_does_not_depend_on_the_level(real, level):
    s = summary(real, "amd-kmsg-dmesg-vram-lost-reset-failed-legacy-rocm-build-2804.txt", level)
    assert found(s) == {"vram_lost": 1, "gpu_reset_failed": 1}


# Built from the driver's format strings (amdgpu_ras.c, amdgpu_ras_eeprom.c, kfd_int_process_v9.c,
# amdgpu_job.c), with a device prefix as dev_info/dev_warn prints it: no public log of these was found.
DEV = "amdgpu 0000:41:00.0: amdgpu: "


@pytest.mark.parametrize("message,cls,extra", [
    (DEV + "{5}poison is consumed by client 12, kick off gpu reset flow", "poison_consumed", {"client": 12}),
    (DEV + "RAS poison consumption, fall back to gpu reset flow: client id 3", "poison_consumed", {"client": 3}),
    (DEV + "Saved bad pages 150 reaches threshold value 128", "bad_page_threshold",
     {"bad_pages": 150, "threshold": 128}),
    (DEV + "Saved bad pages(150) reaches threshold value(128).", "bad_page_threshold",
     {"bad_pages": 150, "threshold": 128}),
    (DEV + "RAS records:130 exceed threshold:128", "bad_page_threshold", {"bad_pages": 130, "threshold": 128}),
    (DEV + "{3}socket: 0, die: 1, 2 new uncorrectable hardware errors detected in umc block", "ras_uncorrectable",
     {"block": "umc", "count": 2}),
    (DEV + "{3}socket: 0, die: 1, 4 new deferred hardware errors detected in umc block", "ras_deferred",
     {"block": "umc", "count": 4}),
    (DEV + "1 deferred hardware errors detected in sdma block", "ras_deferred", {"block": "sdma", "count": 1}),
    ("[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx timeout, signaled seq=9, emitted seq=11", "ring_timeout",
     {"ring": "gfx", "device": None}),
])
def test_lines_of_the_driver_format_strings(message, cls, extra):
    got_cls, got = amdgpu_log.classify(message)
    assert got_cls == cls
    assert {k: got[k] for k in extra} == extra
    if "device" not in extra:
        assert got["device"] == "0000:41:00.0"


@pytest.mark.parametrize("message", [
    DEV + "no uncorrectable hardware errors detected in umc block",  # an all-clear
    DEV + "{3}socket: 0, die: 1, 9 uncorrectable hardware errors detected in total in umc block",  # a running total
    DEV + "RAS records:120 exceeds 90% of threshold:128",  # a warning before the threshold
    DEV + "ring gfx_0.0.0 uses VM inv eng 0 on hub 0",
    DEV + "GPU reset succeeded, trying to resume",
    "[drm] Fence fallback timer expired on ring uvd_0",
    "i915 0000:00:02.0: [drm] GPU HANG: ecode 12:1:85dffffb, in Xorg [1234]",
    "NVRM: Xid (PCI:0000:41:00): 79, pid=1, GPU has fallen off the bus.",
])
def test_lines_that_are_no_amdgpu_fault(message):
    assert amdgpu_log.classify(message)[0] == "other"


def test_a_failed_reset_counts_once_per_gpu():
    # As a bug report quoted on the amd-gfx list shows it (two GPUs of one hive, then the recovery's summary).
    lines = ["amdgpu 0000:04:00.0: amdgpu: GPU reset(9) failed", "amdgpu 0000:07:00.0: amdgpu: GPU reset(9) failed",
             "amdgpu 0000:04:00.0: amdgpu: GPU reset end with ret = -22",
             "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* GPU Recovery Failed: -22"]
    s = amdgpu_log.summarize(lines)
    assert s["by_device"] == {"0000:04:00.0": {"gpu_reset_failed": 1}, "0000:07:00.0": {"gpu_reset_failed": 1}}


def test_the_running_total_is_not_counted_twice():
    lines = [DEV + "{3}socket: 0, die: 0, 2 new uncorrectable hardware errors detected in umc block",
             DEV + "{3}socket: 0, die: 0, 2 uncorrectable hardware errors detected in total in umc block",
             DEV + "{4}socket: 0, die: 0, 1 new uncorrectable hardware errors detected in umc block",
             DEV + "{4}socket: 0, die: 0, 3 uncorrectable hardware errors detected in total in umc block"]
    s = amdgpu_log.summarize(lines)
    assert s["counts"]["ras_uncorrectable"] == 2 and s["ras_blocks"] == {"ras_uncorrectable": {"umc": 3}}


@pytest.mark.parametrize("line,message", [
    ("[  649.968330] [drm] VRAM is lost due to GPU reset!", "[drm] VRAM is lost due to GPU reset!"),
    ("[Sat Jan  7 14:25:56 2023] amdgpu 0000:e3:00.0: amdgpu: GPU reset begin!",
     "amdgpu 0000:e3:00.0: amdgpu: GPU reset begin!"),
    ("Oct 07 15:47:47 sanori-laptop kernel: amdgpu 0000:03:00.0: amdgpu: GPU reset begin!",
     "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!"),
    ("2024-08-18T01:19:31.352108+00:00 minipc kernel: amdgpu 0000:c3:00.0: amdgpu: GPU reset begin!",
     "amdgpu 0000:c3:00.0: amdgpu: GPU reset begin!"),
])
def test_dmesg_and_journal_prefixes_are_dropped(line, message):
    assert amdgpu_log.message_of(line) == message


def test_every_class_is_documented_and_trouble_leaves_out_correctable():
    doc = amdgpu_log.__doc__
    assert all(re.search(r"``%s``" % cls, doc) for cls in amdgpu_log.CLASSES)
    assert set(amdgpu_log.CLASSES) - set(amdgpu_log.TROUBLE_CLASSES) == {"ras_correctable"}
