"""Issue 14's persistence: the IOMMU mode and ACS redirect as kernel arguments (kernel_cmdline).

The IOMMU mode's arguments are chosen by kernel_cmdline from the node's own CPU (iommu_mode), and
``pci=disable_acs_redir=BDF;BDF`` passes the validator and the GRUB drop-in with its ';' quoted.
Verification reports both pending_reboot until a (simulated) reboot puts them on /proc/cmdline.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import validate as v
from ansible_collections.gpunode.tuning.plugins.module_utils.core import validate_boot as vb
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import kernel_cmdline
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_acs as acs
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verify import gather

DROPIN = "etc/default/grub.d/60-gpunode-tuning.cfg"
ACS_ARG = "pci=disable_acs_redir=0000:40:01.1;0000:60:01.1"
needs_setpci = pytest.mark.skipif(shutil.which("setpci") is None, reason="setpci (pciutils) is not installed")


def read(root, rel):
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return fh.read()


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def grub_node(build_node, preset, **kwargs):
    """A simulated node of ``preset`` that boots through GRUB (the Xeon preset is RHEL: made Debian-like)."""
    root = build_node(preset, cpus=2, gpus=2, **kwargs)
    if not os.path.exists(os.path.join(root, "etc/default/grub")):
        write(root, "etc/os-release", 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n')
        write(root, "etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    return root


def reboot(root, args, group_type=None):
    """What a reboot with ``args`` configured gives: them on /proc/cmdline (and the groups' new type)."""
    running = kernel_cmdline.add_arguments(read(root, "proc/cmdline").split(), args)
    write(root, "proc/cmdline", " ".join(running) + "\n")
    groups = os.path.join(root, "sys/kernel/iommu_groups")
    for n in os.listdir(groups) if group_type else []:
        write(root, "sys/kernel/iommu_groups/%s/type" % n, group_type)


def rows(root, desired):
    """Verification of ``desired`` with the drop-in as read on the node (tuning_info's dropin_text)."""
    facts = gather(Node(root))
    cmdline = {"bootloader": "grub", "dropin_text": read(root, DROPIN)}
    result = verification.evaluate_host(facts, desired, {"root": root, "boot_config": cmdline})
    return {s["id"]: s for s in result["settings"]}


# --- the validator ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arg", [
    ACS_ARG,
    "pci=disable_acs_redir=0000:00:01.1",
    "pci=disable_acs_redir=00:01.1;40:01.1",  # the kernel's domain-less form
    "pci=disable_acs_redir=" + ";".join("0000:%02x:01.1" % b for b in range(64)),  # longer than other arguments
])
def test_validator_accepts_the_acs_redirect_list(arg):
    assert vb.kernel_argument(arg) == arg


@pytest.mark.parametrize("arg", [
    "iommu=pt;reboot",
    "foo=a;b",
    "pci=realloc;0000:00:01.1",
    "pci=disable_acs_redir=0000:00:01.1;",
    "pci=disable_acs_redir=;0000:00:01.1",
    "pci=disable_acs_redir=0000:00:01.1;;0000:40:01.1",
    "pci=disable_acs_redir=0000:00:01.1;$(reboot)",
    "pci=disable_acs_redir=0000:00:01.1;`id`",
    "pci=disable_acs_redir=0000:00:01.1;0000:40:01.1\n",
    "pci=disable_acs_redir=0000:00:01.1; 0000:40:01.1",
    "pci=disable_acs_redir='0000:00:01.1;0000:40:01.1'",
    'pci=disable_acs_redir=0000:00:01.1;0000:40:01.1"',
    "pci=disable_acs_redir=0000:00:01.8;0000:40:01.1",  # function 8 does not exist
    "pci=disable_acs_redir=pci:10de:2330;0000:40:01.1",  # the id form: not what pcie_acs computes
    "pci=disable_acs_redir=0000:00:01.1;" * 2,
])
def test_validator_refuses_semicolon_elsewhere(arg):
    with pytest.raises(v.ValidationError, match="only between the PCI addresses of pci=disable_acs_redir="):
        vb.kernel_argument(arg)


# --- the drop-in text ------------------------------------------------------------------------------


def test_dropin_quotes_the_acs_list_and_parses_it_back():
    text = kernel_cmdline.render_dropin(["iommu=pt", ACS_ARG])
    assert "iommu=pt pci='disable_acs_redir=0000:40:01.1;0000:60:01.1'\"\n" in text
    assert kernel_cmdline.parse_dropin(text) == (True, ["iommu=pt", ACS_ARG])
    assert kernel_cmdline.grub_cmdline_args(['GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n', text]) == \
        ["quiet", "iommu=pt", ACS_ARG]
    assert kernel_cmdline.render_dropin(["iommu=pt"]).splitlines()[-1].count("'") == 0  # nothing else is quoted


def test_shell_sourcing_the_dropin_keeps_the_list(tmp_path):
    """update-grub sources the drop-in with /bin/sh: the ';' must not end the assignment."""
    path = tmp_path / "60-gpunode-tuning.cfg"
    path.write_text(kernel_cmdline.render_dropin(["iommu=pt", ACS_ARG]))
    script = 'GRUB_CMDLINE_LINUX_DEFAULT=quiet; . "$1"; printf %s "$GRUB_CMDLINE_LINUX_DEFAULT"'
    out = subprocess.run(["sh", "-c", script, "sh", str(path)], capture_output=True, text=True, check=True)
    # What grub-mkconfig copies to grub.cfg's linux line: one word, quoted for GRUB's own parser.
    assert out.stdout == "quiet iommu=pt pci='disable_acs_redir=0000:40:01.1;0000:60:01.1'" and not out.stderr


# --- kernel_cmdline with iommu_mode on simulated nodes ---------------------------------------------


@pytest.mark.parametrize("preset, mode, vendor, expected", [
    ("audited-epyc-8gpu", "passthrough", "AuthenticAMD", ["iommu=pt"]),
    ("xeon-4gpu-switch", "passthrough", "GenuineIntel", ["iommu=pt"]),
    ("xeon-4gpu-switch", "translated", "GenuineIntel", ["iommu=nopt", "intel_iommu=on"]),
    ("grace-arm64-4gpu", "passthrough", "arm64 (CPU implementer 0x41)", ["iommu.passthrough=1"]),
    ("grace-arm64-4gpu", "translated", "arm64 (CPU implementer 0x41)", ["iommu.passthrough=0"]),
])
def test_iommu_mode_adds_the_nodes_vendor_arguments(build_node, run_module, digest, preset, mode, vendor, expected):
    root = grub_node(build_node, preset)
    snapshot = digest(root)
    planned, failed = run_module("kernel_cmdline", {"arguments": [], "iommu_mode": mode, "root": root}, check=True)
    assert not failed, planned["msg"]
    assert planned["changed"] and digest(root) == snapshot  # check mode writes nothing
    assert (planned["iommu_arguments"], planned["cpu_vendor"]) == (expected, vendor)

    result, failed = run_module("kernel_cmdline", {"arguments": ["quiet"], "iommu_mode": mode, "root": root})
    assert not failed, result["msg"]
    assert kernel_cmdline.parse_dropin(read(root, DROPIN))[1] == ["quiet"] + expected
    assert all(result["arguments"][a]["pending_reboot"] for a in expected) and result["reboot_required"]
    again, failed = run_module("kernel_cmdline", {"arguments": ["quiet"], "iommu_mode": mode, "root": root})
    assert not failed and not again["changed"]

    # Rollback: state=absent removes every argument the mode may have got, the others stay.
    run_module("kernel_cmdline", {"arguments": ["other=1"], "root": root})
    gone, failed = run_module("kernel_cmdline", {"arguments": ["quiet"], "iommu_mode": mode, "state": "absent",
                                                 "root": root})
    assert not failed and gone["changed"], gone
    assert set(gone["iommu_arguments"]) >= set(expected)
    assert kernel_cmdline.parse_dropin(read(root, DROPIN))[1] == ["other=1"]


def test_iommu_mode_on_grubby_without_grubby_still_names_the_arguments(build_node, run_module):
    root = build_node("xeon-4gpu-switch", cpus=2, gpus=1)  # RHEL: grubby, absent on a simulated root
    result, failed = run_module("kernel_cmdline", {"arguments": [], "iommu_mode": "translated", "root": root})
    assert not failed and result["supported"] is False and not result["changed"]
    assert result["iommu_arguments"] == ["iommu=nopt", "intel_iommu=on"]


def test_iommu_mode_conflicting_with_an_argument_writes_nothing(build_node, run_module, digest):
    root = grub_node(build_node, "audited-epyc-8gpu")
    snapshot = digest(root)
    result, failed = run_module("kernel_cmdline", {"arguments": ["iommu=nopt"], "iommu_mode": "passthrough",
                                                   "root": root})
    assert failed and "key iommu is given twice (iommu=nopt and iommu=pt)" in result["msg"]
    assert "nothing was written" in result["msg"] and digest(root) == snapshot
    result, failed = run_module("kernel_cmdline", {"arguments": [], "root": root})
    assert failed and "at least one kernel argument (or set iommu_mode)" in result["msg"]
    result, failed = run_module("kernel_cmdline", {"arguments": [], "iommu_mode": "bogus", "root": root})
    assert failed and "passthrough, translated, unmanaged" in result["msg"]
    assert digest(root) == snapshot


# --- verification: pending until the reboot, then applied --------------------------------------------


@pytest.mark.parametrize("preset, arg", [("audited-epyc-8gpu", "iommu=pt"),
                                         ("grace-arm64-4gpu", "iommu.passthrough=1")])
def test_iommu_passthrough_pending_then_applied_after_reboot(build_node, run_module, preset, arg):
    root = grub_node(build_node, preset, iommu="DMA-FQ")
    desired = {"iommu": {"mode": "passthrough"}}
    assert rows(root, desired)["iommu.mode"]["state"] == "drifted"
    result, failed = run_module("kernel_cmdline", {"arguments": [], "iommu_mode": "passthrough", "root": root})
    assert not failed and result["iommu_arguments"] == [arg]
    row = rows(root, desired)["iommu.mode"]
    assert (row["state"], row["persisted"]) == ("pending_reboot", arg), row

    reboot(root, [arg], group_type="identity")
    row = rows(root, desired)["iommu.mode"]
    assert (row["state"], row["reason"], row["persisted"]) == ("applied", "", arg), row


@needs_setpci
def test_acs_kernel_arg_pending_then_applied_after_reboot(build_node, run_module):
    root = grub_node(build_node, "audited-epyc-8gpu")
    want = {"mode": "disable_redirect", "persist": "kernel_arg", "allow_empty": True}
    # the persistent flow's plan: pcie_acs in check mode names the bridges; nothing is written.
    plan, failed = run_module("pcie_acs", {"root": root, "allow_empty": True}, check=True)
    assert not failed and plan["kernel_arg"] == ACS_ARG, plan
    result, failed = run_module("kernel_cmdline", {"arguments": [plan["kernel_arg"]], "root": root})
    assert not failed and result["arguments"][ACS_ARG] == {"configured": True, "running": False,
                                                           "pending_reboot": True}
    assert "pci='disable_acs_redir=0000:40:01.1;0000:60:01.1'" in read(root, DROPIN)
    states = {k: (r["state"], r["persisted"]) for k, r in rows(root, {"pcie_acs": want}).items()
              if k.startswith("pcie_acs.")}
    assert states == {"pcie_acs.0000:40:01.1": ("pending_reboot", ACS_ARG),
                      "pcie_acs.0000:60:01.1": ("pending_reboot", ACS_ARG)}

    # The reboot: the argument is on /proc/cmdline and the kernel cleared redirect on those bridges.
    reboot(root, [ACS_ARG])
    ok, msg = acs.DEFINITION.boot(Node(root), dict(want, persist="boot_unit"))
    assert ok, msg
    states = {k: r["state"] for k, r in rows(root, {"pcie_acs": want}).items() if k.startswith("pcie_acs.")}
    assert set(states.values()) == {"applied"}
    again, failed = run_module("kernel_cmdline", {"arguments": [ACS_ARG], "root": root})
    assert not failed and not again["changed"] and again["reboot_required"] is False
    gone, failed = run_module("kernel_cmdline", {"arguments": [ACS_ARG], "state": "absent", "root": root})
    assert not failed and gone["changed"] and read(root, DROPIN) is None
