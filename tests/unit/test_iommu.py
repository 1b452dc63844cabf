"""iommu: the one mode -> kernel argument mapping, and verification from the GPUs' IOMMU group types."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.families import iommu, iommu_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verification import Context
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verify import gather

DROPIN = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT %s"\n'


def _row(root, mode, configured=None, boot_unknown=False):
    """The iommu row of a simulated node; ``configured``: the arguments of our GRUB drop-in (None: no drop-in)."""
    facts = gather(Node(root))
    cmdline = {"bootloader": "grubby", "grubby": {"skipped": True}} if boot_unknown else \
        {"bootloader": "grub", "dropin_text": None if configured is None else DROPIN % configured}
    ctx = Context(boot_config=cmdline, running_args=facts["kernel"]["cmdline_args"], root=root)
    rows = iommu_verify.evaluate(facts, {"iommu": {"mode": mode}}, ctx)
    assert len(rows) == 1 and rows[0]["id"] == "iommu.mode"
    return rows[0]


def _boot_with(root, args):
    """What a reboot with ``args`` configured gives: them on /proc/cmdline."""
    path = os.path.join(root, "proc/cmdline")
    with open(path) as fh:
        text = fh.read().strip()
    with open(path, "w") as fh:
        fh.write("%s %s\n" % (text, args))


def test_one_mapping_per_mode_and_vendor():
    m = iommu.iommu_kernel_args
    assert m("passthrough", "AuthenticAMD") == (["iommu=pt"], ["iommu=pt", "iommu.passthrough=1"])
    assert m("passthrough", "GenuineIntel").needed == ["iommu=pt"]
    assert m("passthrough", "arm64 (CPU implementer 0x41)").needed == ["iommu.passthrough=1"]
    assert m("translated", "AuthenticAMD").needed == ["iommu=nopt"]
    assert m("translated", "GenuineIntel").needed == ["iommu=nopt", "intel_iommu=on"]
    assert m("translated", None).needed == ["iommu=nopt", "intel_iommu=on"]
    assert m("translated", "arm64 (CPU implementer 0x41)").needed == ["iommu.passthrough=0"]
    assert set(m("translated", "AuthenticAMD").removable) == {"iommu=nopt", "intel_iommu=on", "iommu.passthrough=0"}
    assert m("unmanaged", "AuthenticAMD") == ([], []) and m(None) == ([], [])
    assert all("amd_iommu" not in a for mode in iommu.MODES for a in m(mode, "AuthenticAMD").removable)
    with pytest.raises(ValueError, match="passthrough, translated, unmanaged"):
        m("pt", "AuthenticAMD")


def test_translated_groups_drift_until_the_argument_is_configured_then_pending(build_node):
    root = build_node(cpus=4, iommu="DMA-FQ")  # the audited EPYC: translated default domains
    row = _row(root, "passthrough")
    assert (row["state"], row["desired"]) == ("drifted", "passthrough")
    assert row["running"].startswith("DMA-FQ on 0000:01:00.0, 0000:21:00.0")
    assert "iommu=pt is neither on /proc/cmdline nor configured for the next boot" in row["reason"]
    pending = _row(root, "passthrough", configured="iommu=pt")
    assert (pending["state"], pending["persisted"]) == ("pending_reboot", "iommu=pt")
    assert "iommu=pt is configured for the next boot" in pending["reason"]
    unknown = _row(root, "passthrough", boot_unknown=True)
    assert unknown["state"] == "drifted" and "the boot configuration is unknown" in unknown["reason"]


def test_identity_groups_after_the_reboot_are_applied(build_node):
    root = build_node(cpus=4, iommu="identity")
    _boot_with(root, "iommu=pt")
    row = _row(root, "passthrough", configured="iommu=pt")
    assert (row["state"], row["reason"], row["persisted"]) == ("applied", "", "iommu=pt")
    assert iommu_verify.evaluate(gather(Node(root)), {"iommu": {"mode": "unmanaged"}}, None) == []
    assert iommu_verify.evaluate({}, {}, None) == []  # not part of the desired state


def test_argument_running_but_groups_translated_names_the_gpus(build_node):
    root = build_node(cpus=4, iommu="DMA")
    _boot_with(root, "iommu=pt")
    row = _row(root, "passthrough", configured="iommu=pt")
    assert row["state"] == "drifted"
    assert "iommu=pt is on /proc/cmdline but the groups of 0000:01:00.0" in row["reason"]


def test_translated_on_intel_needs_intel_iommu_on(build_node):
    root = build_node("xeon-4gpu-switch", cpus=4, iommu="identity")
    row = _row(root, "translated", configured="iommu=nopt")  # intel_iommu=on missing
    assert row["state"] == "drifted" and "iommu=nopt intel_iommu=on is neither" in row["reason"]
    pending = _row(root, "translated", configured="iommu=nopt intel_iommu=on")
    assert (pending["state"], pending["persisted"]) == ("pending_reboot", "iommu=nopt intel_iommu=on")


def test_no_active_iommu_is_not_applicable_or_pending(build_node):
    root = build_node(cpus=4)  # no IOMMU unit
    row = _row(root, "passthrough")
    assert (row["state"], row["running"]) == ("not_applicable", "no IOMMU active")
    assert "DMA is not translated" in row["reason"]
    assert _row(root, "translated", configured="iommu=nopt")["state"] == "pending_reboot"
    assert "disabled in the firmware" in _row(root, "translated")["reason"]


def test_arm64_passthrough_uses_iommu_passthrough(build_node):
    root = build_node("grace-arm64-4gpu", cpus=4, iommu="DMA")
    row = _row(root, "passthrough")
    assert row["state"] == "drifted" and "iommu.passthrough=1 is neither" in row["reason"]


def test_bad_desired_is_refused_and_missing_facts_unsupported():
    for want, text in (({"mode": "pt"}, "passthrough, translated, unmanaged"), ({"mod": "x"}, "allowed: mode"),
                       ("passthrough", "a mapping")):
        with pytest.raises(family.EvaluationError, match=text):
            iommu_verify.evaluate({}, {"iommu": want}, None)
    (row,) = iommu_verify.evaluate({}, {"iommu": {"mode": "passthrough"}}, None)
    assert row["state"] == "unsupported" and "the facts have no iommu section" in row["reason"]
    assert iommu.DEFINITION.reboot_only == ("iommu",) and iommu.DEFINITION.module is None
