# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verification on the node: read what it needs besides the facts, then evaluate, in one module call.

``verify(node, desired, options, tools, facts_options)`` is what tuning_info does with its
``desired`` option: it reads the journal marker and boot id (from when the kernel log counts), the
facts, the boot configuration (this collection's GRUB drop-in, or ``grubby --info=DEFAULT`` on a live
grubby node), the sysctl drop-in and the sysctl files applied after it (a key another file overrides at boot names
that file), the boot unit link and its systemd state, modules-load.d files, and probes the GPUs
with nvidia-smi on a live node; then ``verification.evaluate_host`` states every setting. All of it
is read-only, so it runs the same in and out of check mode.

Commands are found and run through ``tools`` (the module's ``Node.bin_path`` and ``run_command``),
so this file has no Ansible import.
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import command, nvidia_smi, sysctl_boot
from ansible_collections.gpunode.tuning.plugins.module_utils.core import facts as node_facts
from ansible_collections.gpunode.tuning.plugins.module_utils.core.bootloader import DEFAULT_DROPIN, choose_bootloader
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verification

# The ``verify`` option's defaults: the role's defaults for the same paths and switches.
VERIFY_DEFAULTS = {
    "bootloader": "auto",
    "cmdline_dropin": DEFAULT_DROPIN,
    "sysctl_file": "/etc/sysctl.d/90-gpunode-tuning.conf",
    "journal": "/var/lib/gpunode-tuning/journal.json",
    "kmsg_since": None,
    "boot_unit_link": "/etc/systemd/system/multi-user.target.wants/gpunode-tuning-boot.service",
    "modules_load_dir": "/etc/modules-load.d",
    "file_prefix": "gpunode-tuning-",
    "gpu": True,
    "fail_on_pending": False,
    "fail_classes": list(verification.DEFAULT_FAIL_CLASSES),
    "gate": "full",
    "host": None,
    "verified_at": None,
}
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# nvidia-smi calls of the GPU section, keyed as verification.gpu_section reads them; ``health``, gpu_health's
# query, is negotiated (nvidia_smi.query) from the fields ``--help-query-gpu`` lists, asked first.
GPU_COMMANDS = (
    ("query", ["--query-gpu=index,pci.bus_id,persistence_mode", "--format=csv,noheader"]),
    ("topology", ["topo", "-m"]),
    ("p2p_read", ["topo", "-p2p", "r"]),
    ("p2p_write", ["topo", "-p2p", "w"]),
    ("p2p_nvlink", ["topo", "-p2p", "n"]),
)


def gather(node: Node, pci_selector: dict | None = None, **options: Any) -> dict[str, Any]:
    """The ``tuning_facts`` of ``node``: the node's own (core/facts.py) and each family's (``Family.read``).

    ``options``: ``core.facts.gather``'s keyword arguments. Raises ``FactsError`` or ``NodeError``.
    """
    facts = node_facts.gather(node, pci_selector=pci_selector, **options)
    selector = node_facts.build_selector(pci_selector)
    for fam in registry.FAMILIES:
        if fam.read is not None:
            facts[fam.name] = fam.read(node, selector)
    return facts


class Tools(NamedTuple):
    """How commands are found and run on the node.

    ``find(name, package)``: the command's path or None; ``run(argv)``: ``(rc, stdout, stderr)``.
    """

    find: Callable[[str, str], str | None]
    run: Callable[[list[str]], tuple[int, str, str]]


def read_optional(node: Node, path: str) -> str | None:
    """A file's text below the node root; None when it does not exist. Other read errors raise."""
    full = node.path(path)
    try:
        with open(full, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise verification.VerificationError("cannot read %s: %s" % (full, exc.strerror or exc)) from exc


def kmsg_window(node: Node, options: dict[str, Any]) -> dict[str, Any]:
    """From when the kernel log counts: the override, else the journal marker of this boot, else boot."""
    override = options.get("kmsg_since")
    journal = boot_id = None
    if override is None:
        journal = read_optional(node, options["journal"])
        # The journal's uptime refers to the boot it was written in; only the boot id tells.
        if journal is not None:
            boot_id = read_optional(node, BOOT_ID)
    return verification.kmsg_since(journal, boot_id, override)


def boot_configuration(node: Node, desired: dict[str, Any], options: dict[str, Any], tools: Tools) -> dict[str, Any]:
    """The ``cmdline`` context of ``evaluate_host``: the kernel arguments configured for the next boot.

    Read only when the desired state has kernel arguments, or a cpufreq driver, an IOMMU mode or ACS
    persisted by kernel argument (whose arguments verification looks for): the GRUB drop-in of this
    collection, or grubby on a live node (a simulated root has no grubby to ask). An unreadable
    drop-in or a failing grubby leaves the configuration unknown, which the report says per setting.
    """
    # Unknown (no os-release, neither bootloader's files): GRUB, whose drop-in can be read anywhere.
    bootloader = choose_bootloader(node, options["bootloader"], tools.find) or "grub"
    out = {"bootloader": bootloader, "dropin": options["cmdline_dropin"]}
    iommu_mode = (desired.get("iommu") or {}).get("mode")
    acs_arg = (desired.get("pcie_acs") or {}).get("persist") == "kernel_arg"
    if not desired.get("kernel_cmdline") and not (desired.get("cpufreq") or {}).get("driver") \
            and iommu_mode in (None, "unmanaged") and not acs_arg:
        return out
    if bootloader == "grubby":
        out["grubby"] = _grubby_info(node, tools)
        return out
    try:
        out["dropin_text"] = read_optional(node, options["cmdline_dropin"])
    except verification.VerificationError as exc:
        out["dropin_error"] = str(exc)
    return out


def _grubby_info(node, tools):
    if not node.is_live:
        return {"skipped": True}
    grubby = tools.find("grubby", "grubby")
    if not grubby:
        return {"rc": 127, "stdout": "", "stderr": "grubby not found on the node (install the grubby package)"}
    rc, stdout, stderr = tools.run([grubby, "--info=DEFAULT"])
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def persisted_files(node: Node, options: dict[str, Any]) -> tuple[bool, list[str]]:
    """``(boot unit enabled, modules loaded at boot)``: the wants link and our modules-load.d files."""
    boot_unit = os.path.lexists(node.path(options["boot_unit_link"]))
    prefix = options["file_prefix"]
    modules = [name[len(prefix):-len(".conf")] for name in node.listdir(options["modules_load_dir"])
               if name.startswith(prefix) and name.endswith(".conf") and len(name) > len(prefix) + 5]
    return boot_unit, modules


def sysctl_files(node: Node) -> list[tuple[str, dict[str, str]]]:
    """``[(path, {key: value})]`` of every sysctl file a boot applies, in the order it applies them.

    The directories of ``sysctl_boot.SYSCTL_DIRS`` and ``/etc/sysctl.conf``, read below the node root;
    a file that cannot be read counts as empty (what it sets is unknown, not an error here).
    """
    listing = {d: node.listdir(d) for d in sysctl_boot.SYSCTL_DIRS}
    conf_dir = os.path.dirname(sysctl_boot.SYSCTL_CONF)
    if os.path.isfile(node.path(sysctl_boot.SYSCTL_CONF)):
        listing[conf_dir] = [os.path.basename(sysctl_boot.SYSCTL_CONF)]
    out, seen = [], set()
    for path in sysctl_boot.sysctl_load_order(listing):
        real = os.path.realpath(node.path(path))
        if real in seen:  # Debian's /etc/sysctl.d/99-sysctl.conf -> ../sysctl.conf: read once
            continue
        seen.add(real)
        try:
            text = read_optional(node, path)
        except verification.VerificationError:
            text = None
        out.append((path, verification.parse_sysctl_conf(text)))
    return out


def sysctl_overrides(node: Node, desired: dict[str, Any], sysctl_file: str) -> dict[str, dict[str, str]]:
    """The desired sysctls (and NUMA balancing) that a file applied after ``sysctl_file`` sets otherwise."""
    wanted = dict(desired.get("sysctl") or {})
    if desired.get("numa_balancing") is not None:
        wanted["kernel.numa_balancing"] = desired["numa_balancing"]
    if not wanted:
        return {}
    return sysctl_boot.sysctl_overrides(sysctl_files(node), sysctl_file, wanted)


def boot_unit_state(node: Node, options: dict[str, Any], tools: Tools, enabled: bool) -> dict[str, Any] | None:
    """``systemctl show`` of the boot unit (ActiveState, SubState, Result, ExecMainStatus) where it can be asked.

    None when the unit is not enabled, when systemd does not run the live node, or when no
    systemctl is found (a simulated node is asked only through the stand-in it ships).
    """
    if not enabled or (node.is_live and not os.path.isdir("/run/systemd/system")):
        return None
    systemctl = tools.find("systemctl", "systemd")
    if not systemctl:
        return None
    unit = os.path.basename(options["boot_unit_link"])
    rc, stdout, stderr = tools.run([systemctl, "show", "--property=ActiveState,SubState,Result,ExecMainStatus",
                                    "--", unit])
    if rc != 0:
        return {"unit": unit, "known": False, "reason": (stderr or stdout or "rc %s" % rc).strip()[:200]}
    return verification.parse_unit_state(unit, stdout)


def gpu_probe(node: Node, options: dict[str, Any], tools: Tools,
              desired: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``gpu`` input of ``evaluate_host``: nvidia-smi's answers on a node that has it.

    A simulated node is probed only through the nvidia-smi it ships (``<root>/usr/bin``, a
    stand-in answering from its own table; ``tools.find`` never returns the controller's there).
    ``dcgm``: ``dcgmi diag -r 1`` when ``desired["gpu_health"]["dcgm_diag"]`` asks for it.
    Exit codes are kept, not failed on: a driver that does not answer is a finding per GPU setting.
    Every command is bounded (``tools.run``); once nvidia-smi hangs or the driver is down
    (``nvidia_smi.driver_down``), it is asked nothing more: each later answer is that failure, marked
    ``not_run``, so a wedged GPU costs one timeout, not one per command.
    """
    if not options["gpu"]:
        return {"probe": "disabled"}
    smi = tools.find("nvidia-smi", "nvidia-utils")
    if not smi:
        return {"probe": "absent" if node.is_live else "simulated"}
    out: dict[str, Any] = {"probe": "present"}
    help_result = tools.run([smi, *nvidia_smi.HELP_ARGS])
    down = nvidia_smi.driver_down(help_result)
    if down:
        stopped = _answer(help_result, down)
        out.update({key: dict(stopped) for key, _args in GPU_COMMANDS}, health=dict(stopped))
    else:
        known = nvidia_smi.parse_help_fields(help_result[1]) if help_result[0] == 0 else None
        out["health"] = nvidia_smi.query(tools.run, smi, nvidia_smi.HEALTH_FIELDS, known)
        down = nvidia_smi.driver_down(_tuple(out["health"]))
        for key, args in GPU_COMMANDS:
            if down:
                out[key] = _answer(_tuple(out["health"]), down)
                continue
            out[key] = _answer(tools.run([smi, *args]))
            down = nvidia_smi.driver_down(_tuple(out[key]))
    if ((desired or {}).get("gpu_health") or {}).get("dcgm_diag"):
        out["dcgm"] = _dcgm(tools)
    if ((desired or {}).get("gpu_p2p") or {}).get("min_gbps") is not None:
        out["nvbandwidth"] = _nvbandwidth(tools)
    return out


def _answer(result: tuple, not_run: str | None = None) -> dict[str, Any]:
    """``{rc, stdout, stderr, timed_out}`` of a command; ``not_run`` when an earlier failure stopped it."""
    out = {"rc": result[0], "stdout": result[1], "stderr": result[2], "timed_out": command.timed_out(result)}
    if not_run:
        out["not_run"] = not_run
    return out


def _tuple(answer: dict[str, Any]) -> command.Result:
    return command.Result(answer["rc"], answer["stdout"], answer["stderr"], timed_out=answer.get("timed_out", False))


def _dcgm(tools: Tools) -> dict[str, Any]:
    """``dcgmi diag -r 1`` (bounded by the dcgmi timeout); dcgmi missing: rc 127 with what to install."""
    dcgmi = tools.find("dcgmi", "datacenter-gpu-manager")
    if not dcgmi:
        return {"rc": 127, "stdout": "", "stderr": "dcgmi not found: install DCGM (datacenter-gpu-manager) on the node"}
    return _answer(tools.run([dcgmi, *nvidia_smi.DCGM_ARGS]))


def _nvbandwidth(tools: Tools) -> dict[str, Any]:
    """The measured GPU pair bandwidths (gpu_p2p's min_gbps); never installed by the check."""
    nvb = tools.find("nvbandwidth", "nvbandwidth")
    if not nvb:
        return {"rc": 127, "stdout": "", "stderr": "nvbandwidth not found on the node: build it from "
                "github.com/NVIDIA/nvbandwidth to measure GPU pair bandwidth"}
    return _answer(tools.run([nvb, *nvidia_smi.NVBANDWIDTH_ARGS]))


def verify(node: Node, desired: dict[str, Any], options: dict[str, Any] | None, tools: Tools,
           facts_options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(facts, verification)`` of the node against ``desired`` (``evaluate_host``'s desired state).

    ``options``: the ``verify`` option (``VERIFY_DEFAULTS`` for what is not given);
    ``facts_options``: ``facts.gather``'s keyword arguments but ``kmsg_since``, which the journal
    marker decides. Raises ``VerificationError``, ``FactsError`` or ``NodeError``.
    """
    opts = dict(VERIFY_DEFAULTS)
    opts.update({k: v for k, v in (options or {}).items() if v is not None})
    desired = desired or {}
    since = kmsg_window(node, opts)
    facts = gather(node, kmsg_since=since["since"], **facts_options)
    boot_unit, modules = persisted_files(node, opts)
    sysctl_wanted = desired.get("sysctl") or desired.get("numa_balancing") is not None
    context = {
        "root": node.root,
        "boot_config": boot_configuration(node, desired, opts, tools),
        "sysctl_persisted": read_optional(node, opts["sysctl_file"]) if sysctl_wanted else None,
        "sysctl_overrides": sysctl_overrides(node, desired, opts["sysctl_file"]) if sysctl_wanted else {},
        "boot_unit": boot_unit,
        "boot_unit_state": boot_unit_state(node, opts, tools, boot_unit),
        "modules_persisted": modules,
    }
    result = verification.evaluate_host(
        facts, desired, context, kernel_log_since=since, gpu=gpu_probe(node, opts, tools, desired),
        fail_on_pending=opts["fail_on_pending"], fail_classes=opts["fail_classes"], host=opts["host"],
        verified_at=opts["verified_at"], gate=opts["gate"])
    return facts, result
