"""The kernel_cmdline family: the kernel_cmdline module through its entry point against simulated nodes, then
module_utils/families/kernel_cmdline.py: arguments, drop-in render/parse, GRUB config parsing, the configure flow.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import kernel_args
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.families import kernel_cmdline as bc

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


def test_a_node_whose_bootloader_cannot_be_told(debian, run_module, digest):
    """No os-release, no GRUB configuration, no grubby: adding fails naming the choices; removing has nothing to do."""
    for rel in ("etc/os-release", "etc/default/grub"):
        os.unlink(os.path.join(debian, rel))
    shutil.rmtree(os.path.join(debian, "etc/default/grub.d"), ignore_errors=True)
    before = digest(debian)
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "root": debian})
    assert failed and "cannot tell the bootloader" in result["msg"] and "grub, grubby" in result["msg"]
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "state": "absent", "root": debian})
    assert not failed and result["changed"] is False and result["bootloader"] is None
    reported = result["arguments"]["iommu=pt"]
    assert (reported["configured"], reported["pending_reboot"]) == (None, None)
    assert digest(debian) == before
    # Asked for by name, GRUB without its configuration is still refused, for removal too.
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=pt"], "state": "absent", "bootloader": "grub",
                                                   "root": debian})
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


DEBIAN_GRUB = ('GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n'
               'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n')


def test_add_replaces_value_of_same_key_in_place():
    assert bc.add_arguments(["quiet", "amd_pstate=passive", "iommu=pt"], ["amd_pstate=active"]) == \
        ["quiet", "amd_pstate=active", "iommu=pt"]


def test_add_appends_new_and_collapses_duplicates():
    assert bc.add_arguments(["a=1", "b", "a=2"], ["a=3", "c"]) == ["a=3", "b", "c"]
    assert bc.add_arguments(["nosmt=force"], ["nosmt"]) == ["nosmt"]


def test_remove_exact_and_by_key():
    args = ["quiet", "pci=pcie_bus_perf", "iommu=pt", "pci=noaer"]
    assert bc.remove_arguments(args, ["pci=pcie_bus_perf"]) == ["quiet", "iommu=pt", "pci=noaer"]
    assert bc.remove_arguments(args, ["pci"]) == ["quiet", "iommu=pt"]
    assert bc.remove_arguments(args, ["iommu=off"]) == args


def test_has_arg_uses_last_value():
    assert kernel_args.has_arg(["amd_pstate=passive", "amd_pstate=active"], "amd_pstate=active")
    assert not kernel_args.has_arg(["amd_pstate=active", "amd_pstate=passive"], "amd_pstate=active")
    assert bc.is_configured(["pci=noaer"], "pci", "absent")
    assert not bc.is_configured(["pci=noaer"], "pci", "present")


def test_render_and_parse_round_trip():
    text = bc.render_dropin(["amd_pstate=active", "iommu=pt"])
    assert text.startswith("# Managed by gpunode.tuning")
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active iommu=pt"\n' in text
    assert bc.parse_dropin(text) == (True, ["amd_pstate=active", "iommu=pt"])
    assert bc.render_dropin([]) is None


def test_parse_foreign_dropin():
    managed, args = bc.parse_dropin('GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} nomodeset"\n')
    assert managed is False and args == ["nomodeset"]


def test_grub_cmdline_args_expands_in_order():
    dropin = bc.render_dropin(["amd_pstate=active"])
    other = "GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX console=ttyS0,115200n8\"  # serial\n"
    assert bc.grub_cmdline_args([DEBIAN_GRUB, dropin, other]) == \
        ["console=ttyS0,115200n8", "quiet", "amd_pstate=active"]
    assert bc.grub_cmdline_args(["GRUB_CMDLINE_LINUX_DEFAULT='quiet $X'\n", None]) == ["quiet", "$X"]
    assert bc.grub_cmdline_args(["export GRUB_CMDLINE_LINUX=nosmt\n"]) == ["nosmt"]


@pytest.mark.parametrize("arg", [
    'amd_pstate="active"', "iommu=pt quiet", "memmap=2G$4G", "a=`id`", "a;reboot", "a|b", "a&b", "a>b",
    "=value", "", "a'b", "a\\b", "-rf", "a\nb",
    # A trailing newline used to pass (re.match with '$'); it would break the drop-in's quotes.
    "amd_pstate=active\n", "quiet\r", "a\x00", "a\tb", "a\u2028b", '"', "--args=x", "a=b\nGRUB_DISABLE_OS_PROBER=false",
])
def test_bad_arguments(arg):
    with pytest.raises(bc.CmdlineError, match="allowed is"):
        bc.validate_arguments([arg])


@pytest.mark.parametrize("arg", [
    "amd_pstate=active", "iommu=pt", "intel_idle.max_cstate=1", "crashkernel=1G-4G:192M",
    "console=ttyS0,115200n8", "isolcpus=managed_irq,domain,2-31", "root=UUID=3f1c-2a9e", "quiet",
    "transparent_hugepage=madvise", "processor.max_cstate=1",
])
def test_good_arguments(arg):
    bc.validate_arguments([arg])


def test_same_key_twice_rejected():
    with pytest.raises(bc.CmdlineError, match="given twice"):
        bc.validate_arguments(["amd_pstate=active", "amd_pstate=passive"])


@pytest.mark.parametrize("path", [
    "/etc/default/grub", "/etc/default/grub.d/x.conf", "/etc/default/grub.d/../grub.cfg", "60-x.cfg",
    "/etc/default/grub.d/sub/60-x.cfg", "/etc/default/grub.d/a b.cfg",
])
def test_bad_dropin(path):
    with pytest.raises(bc.CmdlineError, match="allowed is a file NAME.cfg"):
        bc.validate_dropin(path)


def test_parse_grubby_info():
    info = ('index=0\nkernel="/boot/vmlinuz-5.14.0-503.el9.x86_64"\n'
            'args="ro crashkernel=1G-4G:192M rhgb quiet"\nroot="/dev/mapper/rhel-root"\n')
    assert bc.parse_grubby_info(info) == ["ro", "crashkernel=1G-4G:192M", "rhgb", "quiet"]


def test_grubby_commands():
    assert bc.grubby_commands("/usr/sbin/grubby", ["a=1", "b"], "present") == \
        ["/usr/sbin/grubby", "--update-kernel=ALL", "--args=a=1 b"]
    assert bc.grubby_commands("/g", ["a"], "absent") == ["/g", "--update-kernel=ALL", "--remove-args=a"]


def test_report():
    rep = bc.report(["amd_pstate=active", "quiet"], "present", ["quiet", "amd_pstate=active"], ["ro", "quiet"])
    assert rep["amd_pstate=active"] == {"configured": True, "running": False, "pending_reboot": True}
    assert rep["quiet"] == {"configured": True, "running": True, "pending_reboot": False}
    rep = bc.report(["x"], "present", None, [])
    assert rep["x"] == {"configured": None, "running": False, "pending_reboot": None}


# --- configure: the kernel_cmdline flow without Ansible ------------------------------------------


class _Lookup:
    """The live system's PATH lookup as Node.bin_path takes it; here it always finds one."""

    @staticmethod
    def get_bin_path(name):
        return "/usr/sbin/" + name


def _tools(warnings, calls):
    def run(argv):
        calls.append(argv)
        return 0, 'args="ro quiet"\n', ""

    return bc.Tools(lookup=_Lookup(), run=run, atomic_move=os.replace, warn=warnings.append)


def test_configure_writes_the_dropin_and_reports(build_node):
    root = build_node("tiny-vm")
    warnings, calls = [], []
    out = bc.configure(Node(root), _tools(warnings, calls), ["iommu=pt"])
    assert out["changed"] and out["bootloader"] == "grub" and out["reboot_required"]
    assert out["arguments"]["iommu=pt"] == {"configured": True, "running": False, "pending_reboot": True}
    with open(os.path.join(root, bc.DEFAULT_DROPIN.lstrip("/"))) as fh:
        assert "iommu=pt" in fh.read()
    assert calls == [] and warnings == []  # a simulated root: update-grub is not run


def test_configure_raises_with_the_result_so_far_and_writes_nothing(build_node, digest):
    root = build_node("tiny-vm")
    before = digest(root)
    with pytest.raises(bc.CmdlineError, match="invalid input, nothing was written: .*given twice"):
        bc.configure(Node(root), _tools([], []), ["a=1", "a=2"])
    os.makedirs(os.path.join(root, "etc/default/grub.d"), exist_ok=True)
    with open(os.path.join(root, bc.DEFAULT_DROPIN.lstrip("/")), "w") as fh:
        fh.write('GRUB_CMDLINE_LINUX_DEFAULT="mine"\n')
    before = digest(root)
    with pytest.raises(bc.CmdlineError, match="not managed by gpunode.tuning") as exc:
        bc.configure(Node(root), _tools([], []), ["iommu=pt"])
    assert exc.value.result["bootloader"] == "grub"
    assert digest(root) == before


def test_a_simulated_root_never_runs_the_controllers_grubby(build_node):
    # The lookup finds a grubby on the controller's PATH; a simulated root without its own must not use it.
    root = build_node("xeon-4gpu-switch", cpus=2, gpus=1)
    warnings, calls = [], []
    out = bc.configure(Node(root), _tools(warnings, calls), ["iommu=pt"])
    assert out["supported"] is False and calls == []
    assert "grubby is not available on a simulated root" in warnings[0]
    assert bc.find_tool(Node(root), _tools([], []), "grubby", "grubby") is None


def test_bin_path_raises_naming_the_package():
    class NoneFound:
        @staticmethod
        def get_bin_path(name):
            return None

    with pytest.raises(NodeError, match="^setpci not found: install the pciutils package on the node$"):
        Node("/").bin_path(NoneFound(), "setpci", "pciutils")


def test_choose_bootloader_reads_id_like_and_asks_for_grubby_on_a_live_node_only(build_node):
    root = build_node("tiny-vm")
    asked = []

    def find(name, package):
        asked.append(name)
        return "/usr/sbin/grubby"

    with open(os.path.join(root, "etc/os-release"), "w") as fh:
        fh.write('ID="rocky"\nID_LIKE="rhel centos fedora"\n')
    assert bc.choose_bootloader(Node(root), "auto", find) == "grubby"
    with open(os.path.join(root, "etc/os-release"), "w") as fh:
        fh.write('ID=neon\nID_LIKE="ubuntu debian"\n')
    assert bc.choose_bootloader(Node(root), "auto", find) == "grub"
    assert bc.choose_bootloader(Node(root), "grubby", find) == "grubby"
    assert asked == []  # a simulated root never asks the controller's PATH
