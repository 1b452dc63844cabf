"""pcie_aspm: the policy file and Link Control parsed from real captures, plan, run (check mode, rerun, restore,
EPERM), boot, the kernel argument, and evaluate's states on simulated nodes, including the nodes whose kernel does
not control ASPM (pcie_aspm=off, the firmware keeping control, no CONFIG_PCIEASPM) and a kernel before 5.5."""

from __future__ import annotations

import errno
import os

import pytest
import simnode
from simnode import aspm as simnode_aspm
from support.captures import config_bytes
from support.trees import snapshot, tree_changes

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.journal import Journal
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_aspm as aspm
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_aspm_plan as aspm_plan
from ansible_collections.gpunode.tuning.plugins.module_utils.families import pcie_aspm_verify as aspm_verify
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verification import Context

GPUS = ("0000:41:00.0", "0000:61:00.0")
ROOT_PORTS = ("0000:40:01.1", "0000:60:01.1")
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
WANT = {"policy": "performance", "links": "off", "allow_empty": True}


def node2(build_node, **kw):
    return build_node("audited-epyc-8gpu", gpus=2, cpus=1, **kw)


def run(root, check=False, diff=False, **params):
    params = dict(dict(WANT, root=root, journal=JOURNAL, restore=False), **params)
    return aspm.run(family.Call(params=params, check_mode=check, diff=diff))


def facts_of(root):
    return {aspm.NAME: aspm_verify.read(Node(root))}


def rows_of(root, want=None, ctx=None):
    return {r["name"]: r
            for r in aspm_verify.evaluate(facts_of(root), {aspm.NAME: dict(want or WANT)}, ctx or Context())}


def config(root, bdf):
    with open(os.path.join(root, "sys/bus/pci/devices", bdf, "config"), "rb") as fh:
        return fh.read()


# --- parsers, on real captures ---


def test_the_policy_file_as_a_real_kernel_printed_it(real):
    capture = real("sysfs-pcie-aspm-policy-default-bdwex0-pepc.txt")
    path, _sep, text = capture.text.partition(":")
    assert path == "/" + aspm.POLICY_FILE
    assert aspm.parse_policy(text) == {"current": "default", "choices": list(aspm.POLICIES)}
    # What the family writes on a simulated node is the same shape, the written policy bracketed.
    assert aspm.policy_text("default") + "\n" == text
    assert aspm.parse_policy(aspm.policy_text("performance"))["current"] == "performance"
    assert aspm.parse_policy(None) == {"current": None, "choices": []}


@pytest.mark.parametrize("name, lnkctl, support", [
    ("lspci-vvv-xxxx-endpoint-aspm-l1-enabled-intel-10c9-pciutils.txt", "L1 Enabled", "L0s L1"),
    ("lspci-vvv-xxxx-root-port-aspm-l1-enabled-intel-9d10-pciutils.txt", "L1 Enabled", "L1"),
    ("lspci-vvv-xxxx-gpu-gp108m-x4-pciutils.txt", "Disabled", "L0s L1"),
    ("lspci-vvv-xxxx-root-port-acs-off-intel-9d10-pciutils.txt", "Disabled", "none"),
])
def test_link_control_aspm_bits_as_lspci_decoded_them(real, name, lnkctl, support):
    text = real(name).text
    said = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.strip().startswith("LnkCtl:"))
    cap = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.strip().startswith("LnkCap:"))
    link = aspm.decode_link(config_bytes(text))
    assert said.startswith("ASPM %s" % lnkctl) and link["aspm"] == lnkctl
    assert link["lnkctl_aspm"] == (2 if lnkctl == "L1 Enabled" else 0)
    said_cap = "ASPM %s" % support if support != "none" else "ASPM not supported"
    assert link["aspm_support"] == support and said_cap in cap


# --- reading a simulated node ---


def test_read_finds_the_gpu_links_their_attributes_and_link_control(build_node):
    facts = aspm_verify.read(Node(node2(build_node, aspm="l1")))
    assert facts["policy"] == "default" and facts["control"] == "os"
    assert [g["path"] for g in facts["gpus"]] == [[ROOT_PORTS[0], GPUS[0]], [ROOT_PORTS[1], GPUS[1]]]
    assert facts["links"][GPUS[0]] == {"up": ROOT_PORTS[0], "down": GPUS[0], "gpus": [GPUS[0]],
                                       "attrs": {"l0s_aspm": 0, "l1_aspm": 1}}
    assert {b: d["aspm"] for b, d in facts["devices"].items()} == dict.fromkeys(GPUS + ROOT_PORTS, "L1 Enabled")


def test_a_switch_path_has_two_links_and_no_link_on_the_switch_bus(build_node):
    root = build_node("xeon-4gpu-switch", gpus=2, cpus=2, aspm="l1")
    facts = aspm_verify.read(Node(root))
    ports = {b: d["port_type"] for b, d in facts["devices"].items()}
    for gpu in facts["gpus"]:
        kinds = [ports[b] for b in gpu["path"]]
        assert kinds == ["root_port", "upstream_port", "downstream_port", "endpoint"], kinds
        assert gpu["path"][1] in facts["links"] and gpu["path"][3] in facts["links"]
        assert gpu["path"][2] not in facts["links"]  # upstream to downstream port is the switch's own bus


# --- the run ---


def test_runtime_sets_the_policy_clears_the_links_and_reruns_unchanged(build_node, digest):
    root = node2(build_node, aspm="l1")
    tree = snapshot(root)
    before = digest(root)
    check = run(root, check=True)
    assert check["changed"] and digest(root) == before  # check mode writes nothing, journal included
    result = run(root, diff=True)
    assert [i["name"] for i in result["items"] if i["changed"]] == [
        "policy", GPUS[0] + "/l1_aspm", GPUS[1] + "/l1_aspm"]
    assert result["diff"]["after"]["policy"] == "performance"
    facts = aspm_verify.read(Node(root))
    assert facts["policy"] == "performance" and all(lk["attrs"]["l1_aspm"] == 0 for lk in facts["links"].values())
    assert {d["aspm"] for d in facts["devices"].values()} == {"Disabled"}
    assert all(r["state"] == "applied" for r in rows_of(root).values())
    assert run(root)["changed"] is False
    journal = Journal(Node(root), JOURNAL).entries(aspm.NAME)
    assert journal == {"policy": "default", GPUS[0] + "/l1_aspm": 1, GPUS[1] + "/l1_aspm": 1}
    restored = run(root, restore=True)
    assert restored["changed"] and Journal(Node(root), JOURNAL).entries(aspm.NAME) == {}
    changed = tree_changes(tree, snapshot(root))
    assert changed == [], changed  # byte-identical: policy, attributes, Link Control, no journal left


def test_only_what_was_asked_is_written(build_node):
    root = node2(build_node, aspm="l1")
    result = run(root, links="keep")
    assert [i["name"] for i in result["items"]] == ["policy"]
    assert aspm_verify.read(Node(root))["links"][GPUS[0]]["attrs"]["l1_aspm"] == 1
    nothing = run(root, policy=None, links="keep")
    assert nothing["items"] == [] and "left as it is" in nothing["msg"]


def test_bad_input_names_what_is_allowed_and_writes_nothing(build_node, digest):
    root = node2(build_node)
    before = digest(root)
    with pytest.raises(family.FamilyError, match="policy must be one of default, performance, powersave, "
                                                 "powersupersave"):
        run(root, policy="fast")
    assert aspm_plan.desired_problems({"links": "on", "persist": "grub"}) == [
        ("links", "links must be one of off, keep, got 'on'"),
        ("persist", "persist must be one of boot_unit, kernel_arg, got 'grub'")]
    assert digest(root) == before


def test_an_eperm_on_the_policy_write_is_unsupported_and_stops_every_write(build_node, monkeypatch):
    root = node2(build_node, aspm="l1")
    real_write = Node.write

    def refuse(self, value, *parts):
        if parts and parts[0].endswith("policy"):
            try:
                raise PermissionError(errno.EPERM, "Operation not permitted")
            except PermissionError as exc:
                raise NodeError("writing %r failed" % value) from exc
        real_write(self, value, *parts)

    monkeypatch.setattr(Node, "write", refuse)
    warnings = []
    result = aspm.run(family.Call(params=dict(WANT, root=root, journal=JOURNAL, restore=False),
                                  warn=warnings.append))
    assert not result["changed"] and "EPERM" in result["unsupported"]["policy"]
    assert [i["name"] for i in result["items"] if i["skipped"]] == ["policy", GPUS[0] + "/l1_aspm",
                                                                    GPUS[1] + "/l1_aspm"]
    assert aspm_verify.read(Node(root))["links"][GPUS[0]]["attrs"]["l1_aspm"] == 1  # nothing written after the refusal
    assert Journal(Node(root), JOURNAL).entries(aspm.NAME) == {}  # nothing to restore
    assert any("unsupported" in w and "EPERM" in w for w in warnings)


@pytest.mark.parametrize("mode, control, words", [
    ("off", "off", "pcie_aspm=off is on the kernel command line"),
    ("firmware", "firmware", "the firmware keeps ASPM control"),
    ("no-policy", "no_policy", "CONFIG_PCIEASPM"),
])
def test_a_kernel_without_aspm_control_is_unsupported_and_nothing_is_written(build_node, digest, mode, control,
                                                                             words):
    root = node2(build_node, aspm=mode)
    before = digest(root)
    warnings = []
    result = aspm.run(family.Call(params=dict(WANT, root=root, journal=JOURNAL, restore=False),
                                  warn=warnings.append))
    assert result["control"] == control and result["items"] == [] and not result["changed"]
    assert words in result["unsupported"]["policy"] and words in result["unsupported"]["links"]
    assert digest(root) == before and len(warnings) == 2
    rows = rows_of(root)
    assert {n: (r["state"], r.get("fit")) for n, r in rows.items()} == {
        "policy": ("unsupported", True), GPUS[0]: ("unsupported", True), GPUS[1]: ("unsupported", True)}
    assert rows[GPUS[0]]["running"] == "%s L1 Enabled; %s L1 Enabled" % (ROOT_PORTS[0], GPUS[0])
    assert words in rows["policy"]["reason"]
    assert aspm_plan.boot(Node(root), WANT)[0] is True and digest(root) == before


def test_pcie_aspm_off_with_aspm_left_off_by_the_firmware_is_applied_for_the_links(build_node):
    root = node2(build_node)
    with open(os.path.join(root, "proc/cmdline"), "a", encoding="utf-8") as fh:
        fh.write(" pcie_aspm=off")
    rows = rows_of(root)
    assert rows["policy"]["state"] == "unsupported" and "pcie_aspm=off" in rows["policy"]["reason"]
    assert rows[GPUS[0]]["state"] == "applied" and "firmware" in rows[GPUS[0]]["reason"]


def test_a_kernel_before_5_5_sets_the_policy_and_says_the_links_are_unsupported(build_node):
    root = node2(build_node, aspm="old-kernel", kernel="5.4.0-150-generic")
    rows = rows_of(root)
    assert rows["policy"]["state"] == "drifted"
    assert rows[GPUS[0]]["state"] == "unsupported" and "5.5" in rows[GPUS[0]]["reason"] and rows[GPUS[0]]["fit"]
    result = run(root)
    assert [i["name"] for i in result["items"]] == ["policy"] and "5.5" in result["unsupported"]["links"]


# --- verification ---


def test_evaluate_names_the_functions_whose_aspm_is_on(build_node):
    root = node2(build_node, aspm="l1")
    rows = rows_of(root, ctx=Context(boot_unit=True))
    assert rows["policy"]["state"] == "drifted" and rows["policy"]["running"] == "default"
    row = rows[GPUS[0]]
    assert row["state"] == "drifted" and row["desired"] == aspm_verify.ASPM_DISABLED
    assert row["persisted"] == "ASPM Disabled"
    assert row["running"] == "%s L1 Enabled; %s L1 Enabled" % (ROOT_PORTS[0], GPUS[0])
    assert aspm_verify.evaluate(facts_of(root), {aspm.NAME: None}, Context()) == []
    assert aspm_verify.evaluate({}, {aspm.NAME: WANT}, Context())[0]["state"] == "unsupported"


def test_a_policy_by_kernel_argument_is_pending_until_the_reboot(build_node):
    root = node2(build_node)
    want = dict(WANT, persist="kernel_arg")
    dropin = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT pcie_aspm.policy=performance"\n'
    ctx = Context(boot_config={"bootloader": "grub", "dropin_text": dropin})
    row = rows_of(root, want, ctx)["policy"]
    assert (row["state"], row["persisted"]) == ("pending_reboot", "pcie_aspm.policy=performance")
    simnode_aspm.after_boot(root, ["ro", "pcie_aspm.policy=performance"])
    assert rows_of(root, want, ctx)["policy"]["state"] == "applied"


class _PC:
    def __init__(self, root, want, unfit):
        self.node, self.desired, self.unfit = Node(root), {aspm.NAME: want}, unfit


def test_kernel_args_only_for_kernel_arg_persistence_and_a_node_that_can_take_it(build_node):
    root, off = node2(build_node), node2(build_node, aspm="off")
    unfit = {}
    assert aspm_plan.kernel_args(_PC(root, dict(WANT, persist="boot_unit"), unfit)) == []
    assert aspm_plan.kernel_args(_PC(root, dict(WANT, persist="kernel_arg"), unfit)) == ["pcie_aspm.policy=performance"]
    assert aspm_plan.kernel_args(_PC(off, dict(WANT, persist="kernel_arg"), unfit)) == [] and "pcie_aspm=off" in unfit[
        "pcie_aspm.policy"]
    assert len(aspm_plan.kernel_args(_PC(root, None, {}), remove=True)) == 4


def test_boot_reapplies_links_and_policy_without_a_journal(build_node):
    root = node2(build_node, aspm="l1")
    ok, msg = aspm_plan.boot(Node(root), dict(WANT, persist="boot_unit"))
    assert ok and "policy" in msg and not os.path.exists(os.path.join(root, JOURNAL.lstrip("/")))
    assert all(r["state"] == "applied" for r in rows_of(root).values())
    assert aspm_plan.boot(Node(root), dict(WANT))[1] == "already set"


def test_the_family_is_registered_with_its_tag_variables_and_role_rules():
    fam = registry.by_name(aspm.NAME)
    assert all_families.selecting_tags(fam) == ("pcie_aspm",) and fam.boot is not None and fam.kernel_args is not None
    values = {"gpunode_tuning_pcie_aspm_policy": "performance", "gpunode_tuning_pcie_aspm_links": "off",
              "gpunode_tuning_pcie_aspm_persist": "kernel_arg", "gpunode_tuning_kernel_cmdline_enabled": False}
    assert aspm_plan.from_role(values, {"selector": {}})[aspm.NAME]["persist"] == "kernel_arg"
    assert "gpunode_tuning_kernel_cmdline_enabled" in aspm_plan.role_problems(values)[0]
    kept = dict(values, gpunode_tuning_pcie_aspm_policy=None, gpunode_tuning_pcie_aspm_links="keep")
    assert aspm_plan.from_role(kept, {"selector": {}}) == {aspm.NAME: None}


def test_the_guard_names_aspm_drift_and_reapplies_it(build_node):
    """What the registry gives every family: the guard's drifted rows and metrics, and its re-apply (boot)."""
    from support.guard import OPTIONS, install, metrics, run_guard, status

    root = node2(build_node, aspm="l1")
    simnode.write_node_exporter_dir(root)
    desired = {aspm.NAME: dict(WANT, persist="boot_unit", vendor="10de", class_prefixes=["0300", "0302"])}
    facts = dict(OPTIONS["facts"], sysctls=[], modules=[])
    install(root, desired=desired, facts=facts)
    assert run_guard(root, cache=False).returncode == 0
    drifted = {s["id"] for s in status(root)["settings"] if s["state"] == "drifted"}
    assert drifted == {"pcie_aspm.policy", "pcie_aspm." + GPUS[0], "pcie_aspm." + GPUS[1]}
    on = {dict(p)["setting"] for (n, p), v in metrics(root).items()
          if n == "gpunode_tuning_setting_state" and dict(p)["family"] == aspm.NAME and dict(p)["state"] == "drifted"
          and v == 1}
    assert on == {"policy", GPUS[0], GPUS[1]}
    install(root, desired=desired, facts=facts, reapply=True)
    run = run_guard(root, cache=False)
    assert "re-applied pcie_aspm" in run.stdout, run.stdout + run.stderr
    assert {s["state"] for s in status(root)["settings"] if s["family"] == aspm.NAME} == {"applied"}


def test_a_simulated_reboot_boots_the_policy_argument(build_node):
    """The kernel argument of persist: kernel_arg reaches the policy at the simulated boot (simnode.aspm.after_boot),
    with performance clearing ASPM on the GPU links; without the argument the node's own policy comes back."""
    root = node2(build_node, aspm="l1")
    dropin = os.path.join(root, simnode.GRUB_DROPIN.lstrip("/"))
    os.makedirs(os.path.dirname(dropin), exist_ok=True)
    with open(dropin, "w", encoding="utf-8") as fh:
        fh.write('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT pcie_aspm.policy=performance"\n')
    report = simnode.reboot(root)
    assert report["aspm_policy"] == "performance" and not report["problems"], report
    assert all(r["state"] == "applied" for r in rows_of(root, dict(WANT, persist="kernel_arg"), Context(
        running_args=aspm_verify.read(Node(root))["kernel_args"])).values())
    os.unlink(dropin)
    assert simnode.reboot(root)["aspm_policy"] is None
