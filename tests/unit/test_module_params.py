"""Module parameters that wait for a boot (issue 44): core/module_params.py, the kmod family's rows and persistence,
on real captures and on a simulated node whose nvidia_uvm runs with HMM on (uvm_disable_hmm=N)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import simnode
from simnode import modparams as simnode_modparams

from ansible_collections.gpunode.tuning.plugins.module_utils.core import module_options as mo
from ansible_collections.gpunode.tuning.plugins.module_utils.core import module_params as mp
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.core.persistence import HEADER, NodeFiles
from ansible_collections.gpunode.tuning.plugins.module_utils.families import kmod_plan
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification as v
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify

UVM_FILE = "etc/modprobe.d/gpunode-tuning-nvidia_uvm.conf"
WANT = {"kmod": {"modules": [{"name": "nvidia_uvm", "params": {"uvm_disable_hmm": 1, "uvm_perf_prefetch_threshold":
                                                               "0x33", "NVreg_Nope": 1}}]}}


@pytest.mark.parametrize("requested,current,verdict", [
    ("1", "Y", mp.SAME), ("true", "Y", mp.SAME), ("on", "Y", mp.SAME), ("0", "N", mp.SAME), ("off", "N", mp.SAME),
    ("1", "N", mp.DIFFERS), ("0", "Y", mp.DIFFERS), ("Y", "1", mp.SAME), ("y", "N", mp.DIFFERS),
    ("51", "51", mp.SAME), ("0x33", "51", mp.SAME), ("51", "52", mp.DIFFERS), ("-1", "-1", mp.SAME),
    ("1,2,0x3", "1,2,3", mp.SAME), ("1,2", "1,2,3", mp.DIFFERS),
    ("performance", "performance", mp.SAME), ("Performance", "performance", mp.DIFFERS),
    ("1", None, mp.UNSUPPORTED), ("0", None, mp.UNSUPPORTED),
])
def test_compare_as_the_kernel_shows_it(requested, current, verdict):
    assert mp.compare(requested, current) == verdict


def test_kernel_form_of_a_bool_is_Y_or_N():
    assert [mp.kernel_form(x, "N") for x in ("1", "true", "0", "off", "7")] == ["Y", "Y", "N", "N", "7"]
    assert mp.kernel_form("1", "0") == "1" and mp.kernel_form("1", None) == "1"


@pytest.mark.parametrize("current,persisted,written_in,state,words", [
    ("Y", "1", "A", "applied", ""),
    (None, "1", "A", "unsupported", "never a reason to reboot"),
    ("N", None, None, "drifted", "persistent flow writes the options line"),
    ("N", "0", "A", "drifted", "persistent flow writes the options line"),  # our line sets another value
    ("N", "1", "A", "pending_reboot", "next boot"),
    ("N", "true", "A", "pending_reboot", "next boot"),  # the line's value in any bool spelling
    ("N", "1", "B", "drifted", "initramfs"),  # a boot since the line was written did not apply it
    ("N", "1", None, "pending_reboot", "next boot"),  # no stamp: cannot tell, not a failure
])
def test_judge(current, persisted, written_in, state, words):
    got, reason = mo.judge("nvidia_uvm", "uvm_disable_hmm", "1", current, persisted, written_in, "A")
    assert got == state and words in reason


def test_options_file_keeps_its_boot_while_its_line_is_the_same():
    first = mo.options_text(HEADER, "options nvidia_uvm uvm_disable_hmm=1", "A", None)
    assert first.splitlines()[2] == "options nvidia_uvm uvm_disable_hmm=1"
    assert mo.parse_options(first) == {"params": {"uvm_disable_hmm": "1"}, "boot_id": "A"}
    assert mo.options_text(HEADER, "options nvidia_uvm uvm_disable_hmm=1", "B", first) == first
    again = mo.options_text(HEADER, "options nvidia_uvm uvm_disable_hmm=0", "B", first)
    assert mo.parse_options(again) == {"params": {"uvm_disable_hmm": "0"}, "boot_id": "B"}
    unstamped = HEADER + "options nvidia_uvm uvm_disable_hmm=1\n"  # written before the stamp existed
    assert mo.parse_options(mo.options_text(HEADER, "options nvidia_uvm uvm_disable_hmm=1", "B", unstamped)) == {
        "params": {"uvm_disable_hmm": "1"}, "boot_id": "B"}


def test_real_gpu_operator_example_reads_Y_for_1(real):
    """NVIDIA's own example: uvm_disable_hmm=1 in the options, and the node shows Y: applied, not a difference."""
    parts = {}
    for block in real("modparams-uvm-disable-hmm-Y-gpu-operator-docs.txt").text.split("==> ")[1:]:
        command, _sep, output = block.partition(" <==\n")
        parts[command] = output
    key, _sep, value = parts["cat nvidia-uvm.conf"].strip().partition("=")
    shown = parts["cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm"].strip()
    assert (key, value, shown) == ("uvm_disable_hmm", "1", "Y")
    assert "uvm_disable_hmm" in parts["ls /sys/module/nvidia_uvm/parameters/"].split()
    assert mo.judge("nvidia_uvm", key, value, shown, value, "A", "B") == ("applied", "")


def test_real_modinfo_names_what_the_simulated_node_exports(real):
    """The simulated nvidia_uvm exports parameters the real module declares (modinfo's parm lines)."""
    declared = {line.split(":", 2)[1].strip() for line in
                real("modinfo-nvidia-uvm-535.129.03-nvidia-vaapi-driver-260.txt").text.splitlines()
                if line.startswith("parm:")}
    assert set(simnode_modparams.EXPORTED["nvidia_uvm"]) <= declared


def _rows(root):
    facts = verify.gather(Node(root), modules=["nvidia_uvm"])
    result = v.evaluate_host(facts, WANT, {"root": root})
    return {s["id"]: s for s in result["settings"]}, result


def test_simulated_node_pending_then_applied_by_a_boot_then_failed_when_a_boot_did_not(build_node):
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    node = Node(root)
    assert node.read("sys/module/nvidia_uvm/parameters/uvm_disable_hmm") == "N"
    rows, _result = _rows(root)  # no options line of ours: the running value is simply not the wanted one
    assert rows["kmod.nvidia_uvm"]["state"] == "applied"
    assert rows["kmod.nvidia_uvm.uvm_disable_hmm"]["state"] == "drifted"
    assert rows["kmod.nvidia_uvm.uvm_perf_prefetch_threshold"]["state"] == "applied"  # 0x33 is 51
    assert rows["kmod.nvidia_uvm.NVreg_Nope"]["state"] == "unsupported"

    boot = node.read(mp.BOOT_ID)
    with open(os.path.join(root, UVM_FILE), "w", encoding="utf-8") as fh:
        fh.write(mo.options_text(HEADER, "options nvidia_uvm uvm_disable_hmm=1 NVreg_Nope=1", boot, None))
    rows, result = _rows(root)
    hmm = rows["kmod.nvidia_uvm.uvm_disable_hmm"]
    assert (hmm["state"], hmm["desired"], hmm["running"], hmm["persisted"]) == ("pending_reboot", "Y", "N", "1")
    assert result["ok"] and result["reboot_required"] and hmm["runtime"] is False
    assert any("nvidia_uvm.uvm_disable_hmm" in line for line in result["needs_reboot"])

    done = simnode.reboot(root)
    assert done["module_params"]["ignored"] == ["nvidia_uvm: unknown parameter 'NVreg_Nope' ignored"]
    rows, result = _rows(root)
    assert rows["kmod.nvidia_uvm.uvm_disable_hmm"]["state"] == "applied" and not result["reboot_required"]

    # Rollback (here in check mode: nothing removed) says the module keeps the value until it is loaded again.
    out = kmod_plan.remove_modules(SimpleNamespace(node=node, files=NodeFiles(node, check_mode=True)))
    assert out["still_running"] == ["nvidia_uvm uvm_disable_hmm=Y"] and "/" + UVM_FILE in out["summary"]
    assert os.path.exists(os.path.join(root, UVM_FILE))

    # The module loaded from an initramfs without the options: the boot did not apply it, and that fails.
    with open(os.path.join(root, "sys/module/nvidia_uvm/parameters/uvm_disable_hmm"), "w") as fh:
        fh.write("N\n")
    rows, result = _rows(root)
    assert rows["kmod.nvidia_uvm.uvm_disable_hmm"]["state"] == "drifted" and not result["ok"]
    assert "initramfs" in rows["kmod.nvidia_uvm.uvm_disable_hmm"]["reason"]
    assert rows["kmod.nvidia_uvm.NVreg_Nope"]["state"] == "unsupported"


def test_a_later_options_line_or_the_command_line_wins_and_is_no_reason_to_reboot(build_node):
    """modprobe passes the .conf files' options by file name, then the command line's; the kernel keeps the last."""
    root = build_node("audited-epyc-8gpu", cpus=4, gpus=1)
    node = Node(root)
    own = "/" + UVM_FILE
    for rel, text in (("etc/modprobe.d/aa-uvm.conf", "options nvidia_uvm uvm_disable_hmm=0\n"),  # before ours
                      ("lib/modprobe.d/zz-uvm.conf", "options nvidia_uvm uvm_disable_hmm=0\n"),  # hidden by /etc's
                      ("etc/modprobe.d/zz-uvm.conf", "options nvidia-uvm uvm_perf_prefetch_enable=0\n")):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w", encoding="utf-8") as fh:
            fh.write(text)
    assert mo.overriding(node, "nvidia_uvm", own) == {
        "uvm_perf_prefetch_enable": {"value": "0", "source": "/etc/modprobe.d/zz-uvm.conf"}}
    with open(os.path.join(root, "etc/modprobe.d/zz-uvm.conf"), "a", encoding="utf-8") as fh:
        fh.write("options nvidia_uvm uvm_disable_hmm=0\n")
    assert mo.overriding(node, "nvidia_uvm", own)["uvm_disable_hmm"]["source"] == "/etc/modprobe.d/zz-uvm.conf"

    # The persistent flow asks no reboot for it (fit before tuned) and says why; verification fails it, not pending.
    pc = SimpleNamespace(node=node, unfit={})
    drift = {"uvm_disable_hmm": {"requested": "1", "current": "N"}}
    assert kmod_plan.pending_params(pc, [{"name": "nvidia_uvm", "param_drift": drift}]) == {}
    assert "/etc/modprobe.d/zz-uvm.conf sets uvm_disable_hmm=0" in pc.unfit["kmod.nvidia_uvm.uvm_disable_hmm"]
    with open(os.path.join(root, UVM_FILE), "w", encoding="utf-8") as fh:
        fh.write(mo.options_text(HEADER, "options nvidia_uvm uvm_disable_hmm=1", node.read(mp.BOOT_ID), None))
    rows, result = _rows(root)
    assert rows["kmod.nvidia_uvm.uvm_disable_hmm"]["state"] == "drifted" and not result["reboot_required"]
    assert "zz-uvm.conf sets uvm_disable_hmm=0" in rows["kmod.nvidia_uvm.uvm_disable_hmm"]["reason"]

    os.remove(os.path.join(root, "etc/modprobe.d/zz-uvm.conf"))  # the command line comes after every file
    with open(os.path.join(root, "proc/cmdline"), "a", encoding="utf-8") as fh:
        fh.write(" nvidia_uvm.uvm_disable_hmm=N")
    assert mo.overriding(node, "nvidia_uvm", own) == {"uvm_disable_hmm": {"value": "N", "source": mo.CMDLINE}}
    assert kmod_plan.pending_params(SimpleNamespace(node=node, unfit={}),
                                    [{"name": "nvidia_uvm", "param_drift": drift}]) == {}
    with open(os.path.join(root, "proc/cmdline"), "a", encoding="utf-8") as fh:
        fh.write(" nvidia_uvm.uvm_disable_hmm=on")  # the last one wins, and it is the wanted value
    assert kmod_plan.pending_params(SimpleNamespace(node=node, unfit={}),
                                    [{"name": "nvidia_uvm", "param_drift": drift}]) == {
        "nvidia_uvm.uvm_disable_hmm": "1 (running N)"}
