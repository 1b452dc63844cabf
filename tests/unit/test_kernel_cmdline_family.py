"""module_utils/families/kernel_cmdline.py: arguments, drop-in render/parse, GRUB config parsing, the configure flow."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import kernel_args
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.families import kernel_cmdline as bc

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
