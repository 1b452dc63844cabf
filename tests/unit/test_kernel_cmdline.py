"""kernel_cmdline through its entry point, against simulated nodes."""

from __future__ import annotations

import os
import subprocess

import pytest

DROPIN = "etc/default/grub.d/60-gpunode-tuning.cfg"


@pytest.fixture
def debian(build_node):
    return build_node("tiny-vm")


def read(root, rel):
    with open(os.path.join(root, rel)) as fh:
        return fh.read()


def test_present_writes_dropin_and_reports_pending(debian, run_module):
    result, failed = run_module("kernel_cmdline", {"arguments": ["amd_pstate=active", "iommu=pt", "quiet"],
                                                   "root": debian})
    assert not failed, result
    assert result["changed"] is True and result["bootloader"] == "grub"
    text = read(debian, DROPIN)
    assert "Managed by gpunode.tuning" in text
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active iommu=pt quiet"' in text
    assert result["arguments"]["amd_pstate=active"] == {"configured": True, "running": False, "pending_reboot": True}
    assert result["arguments"]["quiet"] == {"configured": True, "running": False, "pending_reboot": True}
    assert result["reboot_required"] is True
    assert result["bootloader_updated"] is False  # never update-grub on a simulated root
    assert result["configured_cmdline"] == ["quiet", "amd_pstate=active", "iommu=pt", "quiet"]
    assert oct(os.stat(os.path.join(debian, DROPIN)).st_mode & 0o777) == "0o644"
    assert [n for n in os.listdir(os.path.join(debian, "etc/default/grub.d")) if n.startswith(".")] == []


def test_running_argument_is_not_pending(build_node, run_module):
    root = build_node("epyc-pstate-epp", cpus=2, gpus=1)
    result, failed = run_module("kernel_cmdline", {"arguments": ["amd_pstate=active"], "root": root})
    assert not failed
    assert result["arguments"]["amd_pstate=active"] == {"configured": True, "running": True, "pending_reboot": False}
    assert result["reboot_required"] is False


def test_rerun_is_unchanged(debian, run_module, digest):
    run_module("kernel_cmdline", {"arguments": ["amd_pstate=active", "iommu=pt"], "root": debian})
    before = digest(debian)
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt", "amd_pstate=active"], "root": debian})
    assert not failed and result["changed"] is False
    assert digest(debian) == before


def test_key_value_replaces_existing_value(debian, run_module):
    run_module("kernel_cmdline", {"arguments": ["amd_pstate=passive", "iommu=pt"], "root": debian})
    result, failed = run_module("kernel_cmdline", {"arguments": ["amd_pstate=active"], "root": debian}, diff=True)
    assert not failed and result["changed"]
    assert "amd_pstate=active iommu=pt\"" in read(debian, DROPIN)
    assert "passive" not in read(debian, DROPIN)
    assert "amd_pstate=passive" in result["diff"]["before"] and "amd_pstate=active" in result["diff"]["after"]


def test_check_and_diff_mode_write_nothing(debian, run_module, digest):
    before = digest(debian)
    result, failed = run_module("kernel_cmdline", {"arguments": ["amd_pstate=active"], "root": debian},
                                check=True, diff=True)
    assert not failed and result["changed"] is True
    assert result["diff"]["before"] == ""
    assert "amd_pstate=active" in result["diff"]["after"]
    assert result["diff"]["after_header"] == "/" + DROPIN
    assert result["arguments"]["amd_pstate=active"]["configured"] is True
    assert digest(debian) == before


def test_absent_removes_and_deletes_empty_dropin(debian, run_module, digest):
    before = digest(debian)
    run_module("kernel_cmdline", {"arguments": ["amd_pstate=active", "iommu=pt"], "root": debian})
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "state": "absent", "root": debian})
    assert not failed and result["changed"]
    assert "iommu" not in read(debian, DROPIN) and "amd_pstate=active" in read(debian, DROPIN)
    assert result["arguments"]["iommu=pt"] == {"configured": False, "running": False, "pending_reboot": False}
    result, failed = run_module("kernel_cmdline", {"arguments": ["amd_pstate"], "state": "absent", "root": debian},
                                diff=True)
    assert not failed and result["changed"]
    assert result["diff"]["after"] == ""
    assert not os.path.exists(os.path.join(debian, DROPIN))
    assert digest(debian) == before
    result, failed = run_module("kernel_cmdline", {"arguments": ["amd_pstate"], "state": "absent", "root": debian})
    assert not failed and result["changed"] is False


def test_absent_of_running_argument_is_pending(build_node, run_module):
    root = build_node("locked-bus-perf", cpus=2, gpus=1)
    result, failed = run_module("kernel_cmdline", {"arguments": ["pci=pcie_bus_perf"], "state": "absent",
                                                   "root": root})
    assert not failed and result["changed"] is False
    assert result["arguments"]["pci=pcie_bus_perf"] == {"configured": False, "running": True, "pending_reboot": True}
    assert result["reboot_required"] is True


def test_foreign_dropin_is_never_overwritten(debian, run_module, digest):
    path = os.path.join(debian, DROPIN)
    with open(path, "w") as fh:
        fh.write('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT nomodeset"\n')
    before = digest(debian)
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "root": debian})
    assert failed and "not managed by gpunode.tuning" in result["msg"]
    assert digest(debian) == before


def test_rhel_simulated_root_is_reported_unsupported(build_node, run_module, digest):
    root = build_node("xeon-4gpu-switch", cpus=2, gpus=1)
    before = digest(root)
    result, failed = run_module("kernel_cmdline", {"arguments": ["intel_idle.max_cstate=1", "quiet"], "root": root})
    assert not failed
    assert result["bootloader"] == "grubby" and result["supported"] is False and result["changed"] is False
    assert result["dropin"] is None
    assert result["arguments"]["quiet"] == {"configured": None, "running": True, "pending_reboot": None}
    assert result["reboot_required"] is False
    assert digest(root) == before


def test_rhel_simulated_root_with_its_own_grubby(build_node, run_module):
    root = build_node("xeon-4gpu-switch", cpus=2, gpus=1)
    log = os.path.join(root, "grubby.log")
    script = os.path.join(root, "usr/sbin/grubby")
    with open(script, "w") as fh:
        fh.write('#!/bin/sh\nif [ "$1" = "--info=DEFAULT" ]; then echo \'args="ro rhgb quiet"\'; exit 0; fi\n'
                 'echo "$@" >> %s\n' % log)
    os.chmod(script, 0o755)
    result, failed = run_module("kernel_cmdline", {"arguments": ["intel_idle.max_cstate=1"], "root": root})
    assert not failed and result["changed"] and result["bootloader_updated"]
    assert read(root, "grubby.log") == "--update-kernel=ALL --args=intel_idle.max_cstate=1\n"
    assert result["arguments"]["intel_idle.max_cstate=1"]["pending_reboot"] is True
    result, failed = run_module("kernel_cmdline", {"arguments": ["rhgb"], "state": "absent", "root": root},
                                check=True, diff=True)
    assert not failed and result["changed"] and result["diff"]["after"] == "args: ro quiet\n"
    assert read(root, "grubby.log") == "--update-kernel=ALL --args=intel_idle.max_cstate=1\n"


@pytest.mark.parametrize("args,fragment", [
    ({"arguments": ['amd_pstate="active"']}, "no quotes"),
    ({"arguments": ["iommu=pt quiet"]}, "no quotes, whitespace"),
    ({"arguments": ["memmap=2G$4G"]}, "shell characters"),
    ({"arguments": ["a;reboot"]}, "shell characters"),
    ({"arguments": ["`reboot`"]}, "shell characters"),
    ({"arguments": ["a|b"]}, "shell characters"),
    ({"arguments": []}, "at least one"),
    ({"arguments": ["a=1", "a=2"]}, "given twice"),
    ({"arguments": ["iommu=pt"], "state": "on"}, "present, absent"),
    ({"arguments": ["iommu=pt"], "bootloader": "lilo"}, "auto, grub, grubby"),
    ({"arguments": ["iommu=pt"], "dropin": "/etc/default/grub"}, "NAME.cfg"),
    ({"arguments": ["iommu=pt"], "dropin": "/etc/default/grub.d/../../../etc/passwd.cfg"}, "NAME.cfg"),
    ({}, "arguments"),
    ({"arguments": ["amd_pstate=active\n"]}, "'amd_pstate=active\\n' is invalid"),
    ({"arguments": ['iommu=pt"\nGRUB_CMDLINE_LINUX="init=/bin/sh']}, "no quotes"),
    ({"arguments": ["-rf"]}, "not starting with '-'"),
])
def test_bad_input_fails_and_writes_nothing(debian, run_module, digest, args, fragment):
    before = digest(debian)
    result, failed = run_module("kernel_cmdline", dict(args, root=debian))
    assert failed
    assert fragment in result["msg"]
    assert digest(debian) == before


def test_grub_without_default_grub_fails(build_node, run_module):
    root = build_node("xeon-4gpu-switch", cpus=2, gpus=1)
    result, failed = run_module("kernel_cmdline", {"arguments": ["quiet"], "bootloader": "grub", "root": root})
    assert failed and "grub, grubby" in result["msg"]


def test_absent_of_argument_set_in_etc_default_grub_stays_configured(debian, run_module, digest):
    before = digest(debian)
    result, failed = run_module("kernel_cmdline", {"arguments": ["quiet"], "state": "absent", "root": debian})
    assert not failed and result["changed"] is False
    assert result["arguments"]["quiet"]["configured"] is True  # /etc/default/grub is not ours to edit
    assert digest(debian) == before


def test_update_grub_runs_only_on_live_root_and_only_when_changed(debian, run_module, monkeypatch, tmp_path):
    """Pretend the simulated root is live to see which commands would run (a logging update-grub)."""
    from ansible.module_utils import basic

    from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node

    log = tmp_path / "update-grub.log"
    fake = tmp_path / "update-grub"
    fake.write_text("#!/bin/sh\necho ran >> %s\n" % log)
    fake.chmod(0o755)
    monkeypatch.setattr(Node, "is_live", property(lambda self: True))
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path",
                        lambda self, name, *a, **k: str(fake) if name == "update-grub" else None)
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "root": debian})
    assert not failed and result["bootloader_updated"] is True
    assert log.read_text() == "ran\n"
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "root": debian})
    assert not failed and result["bootloader_updated"] is False
    result, failed = run_module("kernel_cmdline", {"arguments": ["amd_pstate=active"], "root": debian,
                                                   "update_bootloader": False})
    assert not failed and result["changed"] and result["bootloader_updated"] is False
    result, failed = run_module("kernel_cmdline", {"arguments": ["nosmt"], "root": debian}, check=True)
    assert not failed and result["changed"] and result["bootloader_updated"] is False
    assert log.read_text() == "ran\n"


@pytest.mark.parametrize("check", [True, False])
def test_unwritable_dropin_is_reported_in_check_mode_too(debian, run_module, digest, check):
    grub_d = os.path.join(debian, "etc/default/grub.d")
    subprocess.run(["chattr", "+i", grub_d], check=True)
    try:
        before = digest(debian)
        result, failed = run_module("kernel_cmdline", {"arguments": ["amd_pstate=active"], "root": debian},
                                    check=check)
    finally:
        subprocess.run(["chattr", "-i", grub_d], check=True)
    assert failed
    assert "%s/%s cannot be written" % (debian, DROPIN) in result["msg"]
    assert "does not accept new files" in result["msg"]
    assert digest(debian) == before


def test_dropin_that_is_a_directory_is_reported(debian, run_module):
    os.mkdir(os.path.join(debian, DROPIN))
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "root": debian}, check=True)
    assert failed and "is a directory" in result["msg"]


def test_missing_grub_d_is_created(debian, run_module):
    os.rmdir(os.path.join(debian, "etc/default/grub.d"))
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "root": debian}, check=True)
    assert not failed, result
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "root": debian})
    assert not failed and "iommu=pt" in read(debian, DROPIN)
