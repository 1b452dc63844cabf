# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verification on the node: read what it needs besides the facts, then evaluate, in one module call.

``verify(node, desired, options, tools, facts_options)`` is what tuning_info does with its
``desired`` option: it reads the journal marker and boot id (from when the kernel log counts), the
facts (the node's, core/facts.py, and each family's, ``Family.read``), the boot configuration
when a family judges against it (this collection's GRUB drop-in, or ``grubby --info=DEFAULT`` on a
live grubby node), the sysctl drop-in and the sysctl files applied after it when a family sets sysctls
at boot (a key another file overrides at boot names that file), the boot unit link and its systemd
state, modules-load.d files, and runs the GPU commands the families ask for (``Family.gpu_commands``)
on a node with nvidia-smi; then ``verification.evaluate_host`` states every setting. All of it is
read-only, so it runs the same in and out of check mode.

Commands are found and run through ``tools`` (the module's ``Node.bin_path`` and ``run_command``),
so this file has no Ansible import.
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    command,
    kernel_log,
    nvidia_smi,
    pci,
    sysctl_boot,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core import facts as node_facts
from ansible_collections.gpunode.tuning.plugins.module_utils.core.bootloader import DEFAULT_DROPIN, choose_bootloader
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import GPU_COUNT_ARG, FactsQuery
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    BinaryNotFound,
    Node,
    parse_cpulist,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families, verification

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
# The options of tuning_info (and of the rollout's health and verification steps, module tuning_rollout).
ARGUMENT_SPEC = dict(
    pci_selector=dict(
        type="dict",
        options=dict(
            vendor=dict(type="list", elements="str"),
            device=dict(type="str"),
            class_prefixes=dict(type="list", elements="str"),
            bdfs=dict(type="list", elements="str"),
        ),
    ),
    sysctls=dict(type="list", elements="str", default=[]),
    kmsg_since=dict(type="float", default=0),
    kmsg_levels=dict(type="list", elements="str", default=list(kernel_log.DEFAULT_LEVELS),
                     choices=list(kernel_log.LEVEL_NAMES)),
    kmsg_ignore=dict(
        type="list",
        elements="dict",
        options=dict(pattern=dict(type="str", required=True), cidr=dict(type="str")),
    ),
    modules=dict(type="list", elements="str", default=[]),
    detail=dict(type="bool", default=False),
    desired=dict(type="dict"),
    verify=dict(
        type="dict",
        options=dict(
            bootloader=dict(type="str", choices=["auto", "grub", "grubby"], default="auto"),
            cmdline_dropin=dict(type="str", default=VERIFY_DEFAULTS["cmdline_dropin"]),
            sysctl_file=dict(type="str", default=VERIFY_DEFAULTS["sysctl_file"]),
            journal=dict(type="str", default=VERIFY_DEFAULTS["journal"]),
            kmsg_since=dict(type="float"),
            boot_unit_link=dict(type="str", default=VERIFY_DEFAULTS["boot_unit_link"]),
            modules_load_dir=dict(type="str", default=VERIFY_DEFAULTS["modules_load_dir"]),
            file_prefix=dict(type="str", default=VERIFY_DEFAULTS["file_prefix"]),
            gpu=dict(type="bool", default=True),
            fail_on_pending=dict(type="bool", default=False),
            fail_classes=dict(type="list", elements="str", choices=list(verification.KMSG_CLASSES),
                              default=list(verification.DEFAULT_FAIL_CLASSES)),
            gate=dict(type="str", choices=list(verification.GATES), default="full"),
            host=dict(type="str"),
            verified_at=dict(type="str"),
        ),
    ),
    **NODE_ARGUMENT_SPEC,
    **command.ARGUMENT_SPEC,
)
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# The GPU probe's tool: the families name the commands (Family.gpu_commands); nvidia-smi is found once, and
# its answers stop at the first that says the driver is down.
SMI = "nvidia-smi"


def gather(node: Node, pci_selector: dict | None = None, detail: bool = False, **options: Any) -> dict[str, Any]:
    """The ``tuning_facts`` of ``node``: the node's own (core/facts.py) and each family's (``Family.read``).

    ``options``: ``core.facts.gather``'s keyword arguments and the families' facts options
    (``Family.read_options``: ``sysctls``, ``modules``), each checked before anything is read; an unknown
    one is a TypeError, as for a function. Raises ``FactsError`` or ``NodeError``.
    """
    checks = all_families.read_options()
    family_options = {}
    for key in [k for k in options if k in checks]:
        value = options.pop(key)
        try:
            family_options[key] = checks[key](value)
        except node_facts.FactsError:
            raise
        except ValueError as exc:
            raise node_facts.FactsError("%s: %s" % (key, exc)) from None
    selector = node_facts.build_selector(pci_selector)
    devices = tuple(pci.list_devices(node))  # once, for the node's pci section and every family that reads PCI
    facts = node_facts.gather(node, pci_selector=pci_selector, devices=list(devices), **options)
    query = FactsQuery(cpus=tuple(parse_cpulist(facts["cpu"]["online"])), detail=bool(detail),
                       options=family_options, devices=devices)
    for fam in registry.FAMILIES:
        if fam.read is not None:
            facts[fam.name] = fam.read(node, selector, query)
    return facts


def gpu_vendors(facts: dict[str, Any]) -> set:
    """The vendors of the GPUs on the node's bus (facts' ``pci.gpu_vendors``), selected or not."""
    return set(((facts.get("pci") or {}).get("gpu_vendors") or {}).values())


class Tools(NamedTuple):
    """How commands are found and run on the node.

    ``find(name, package)``: the command's path or None; ``run(argv)``: ``(rc, stdout, stderr)``; a command with
    its own environment (``GpuCommand.env``) is run as ``run(argv, env)``.
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

    Read only when a family judges its settings against it (``Family.reads_boot_config``): the GRUB
    drop-in of this collection, or grubby on a live node (a simulated root has no grubby to ask). An
    unreadable drop-in or a failing grubby leaves the configuration unknown, which the report says per
    setting.
    """
    # Unknown (no os-release, neither bootloader's files): GRUB, whose drop-in can be read anywhere.
    bootloader = choose_bootloader(node, options["bootloader"], tools.find) or "grub"
    out = {"bootloader": bootloader, "dropin": options["cmdline_dropin"]}
    if not any(fam.reads_boot_config(desired) for fam in registry.FAMILIES if fam.reads_boot_config is not None):
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


def boot_sysctls(desired: dict[str, Any]) -> dict[str, Any]:
    """Every sysctl the families set at boot for ``desired`` (``Family.boot_sysctls``): the drop-in's keys."""
    wanted: dict[str, Any] = {}
    for fam in registry.FAMILIES:
        if fam.boot_sysctls is not None:
            wanted.update(fam.boot_sysctls(desired))
    return wanted


def sysctl_overrides(node: Node, desired: dict[str, Any], sysctl_file: str) -> dict[str, dict[str, str]]:
    """The sysctls set at boot (``boot_sysctls``) that a file applied after ``sysctl_file`` sets otherwise."""
    wanted = boot_sysctls(desired)
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


def gpu_commands(desired: dict[str, Any] | None) -> list:
    """The GPU commands the families ask for (``Family.gpu_commands``), each key once: nvidia-smi's negotiated
    queries first, then its other commands, then other tools, each group in registry order."""
    seen: dict = {}
    for fam in registry.FAMILIES:
        for cmd in fam.gpu_commands(desired or {}) if fam.gpu_commands is not None else ():
            seen.setdefault(cmd.key, cmd)
    cmds = list(seen.values())
    return ([c for c in cmds if c.tool == SMI and c.fields] + [c for c in cmds if c.tool == SMI and not c.fields]
            + [c for c in cmds if c.tool != SMI])


def gpu_count(facts: dict[str, Any]) -> int:
    """The GPUs a CUDA (else ROCm) program sees on the node: the NVIDIA GPUs on the bus, else the AMD ones."""
    vendors = list(((facts.get("pci") or {}).get("gpu_vendors") or {}).values())
    return vendors.count("nvidia") or vendors.count("amd")


def gpu_probe(node: Node, options: dict[str, Any], tools: Tools,
              desired: dict[str, Any] | None = None, vendors: Any = None, gpus: int = 0) -> dict[str, Any]:
    """The ``gpu`` input of ``evaluate_host``: the answers of the commands the families ask for (``gpu_commands``).

    Only on a node that has nvidia-smi: a simulated node is probed only through the nvidia-smi it ships
    (``<root>/usr/bin``, a stand-in answering from its own table; ``tools.find`` never returns the
    controller's there). Exit codes are kept, not failed on: a driver that does not answer is a finding per GPU
    setting. Every command is bounded (``tools.run``); once nvidia-smi hangs or the driver is down
    (``nvidia_smi.driver_down``, asked ``--help-query-gpu`` first), it is asked nothing more: each later answer
    is that failure, marked ``not_run``, so a wedged GPU costs one timeout, not one per command. Another tool
    (dcgmi, nvbandwidth) is run as asked; missing, its answer is rc 127 with what to install. A command of a
    vendor's tool (``GpuCommand.vendor``: amd-smi) runs only where ``vendors`` (the vendors of the GPUs on the
    bus; None: every vendor) has that vendor, with or without nvidia-smi (``standalone``). ``gpus``: the number that
    replaces ``family.GPU_COUNT_ARG`` in a command's arguments (nccl-tests' ``-g``).
    """
    if not options["gpu"]:
        return {"probe": "disabled"}
    cmds = [c for c in gpu_commands(desired) if not c.vendor or vendors is None or c.vendor in vendors]
    smi = tools.find(SMI, "nvidia-utils")
    if not smi:
        out = {"probe": "absent" if node.is_live else "simulated"}
        out.update(_other_tools(node, tools, [c for c in cmds if c.tool != SMI and c.standalone], gpus))
        return out
    out: dict[str, Any] = {"probe": "present"}
    help_result = tools.run([smi, *nvidia_smi.HELP_ARGS])
    down = nvidia_smi.driver_down(help_result)
    known = nvidia_smi.parse_help_fields(help_result[1]) if help_result[0] == 0 and not down else None
    last = help_result
    for cmd in (c for c in cmds if c.tool == SMI):
        if down:
            out[cmd.key] = _answer(last, down)
            continue
        if cmd.fields:
            out[cmd.key] = nvidia_smi.query(tools.run, smi, tuple(cmd.fields), known)
        else:
            out[cmd.key] = _answer(tools.run([smi, *cmd.args]))
        last = _tuple(out[cmd.key])
        down = nvidia_smi.driver_down(last)
    out.update(_other_tools(node, tools, [c for c in cmds if c.tool != SMI], gpus))
    return out


def _other_tools(node: Node, tools: Tools, cmds: list, gpus: int = 0) -> dict[str, Any]:
    """The answers of the commands of other tools, in order; after one of a tool hangs, that tool, and every other
    tool of its vendor (``GpuCommand.vendor``: amd-smi hung, TransferBench is not started on those GPUs), is asked
    nothing more (each later answer is that failure, marked ``not_run``): one timeout, not one per command."""
    out: dict[str, Any] = {}
    hung: dict[str, str] = {}
    for cmd in cmds:
        why = hung.get(cmd.tool) or (hung.get("vendor:" + cmd.vendor) if cmd.vendor else None)
        if why:
            out[cmd.key] = {"rc": command.TIMEOUT_RC, "stdout": "", "stderr": why, "timed_out": True, "not_run": why}
            continue
        out[cmd.key] = _other_tool(node, tools, cmd, gpus)
        if out[cmd.key].get("timed_out"):
            hung[cmd.tool] = command.failure(cmd.tool, _tuple(out[cmd.key]))
            if cmd.vendor:
                hung.setdefault("vendor:" + cmd.vendor, hung[cmd.tool])
    return out


def _answer(result: tuple, not_run: str | None = None) -> dict[str, Any]:
    """``{rc, stdout, stderr, timed_out}`` of a command; ``not_run`` when an earlier failure stopped it."""
    out = {"rc": result[0], "stdout": result[1], "stderr": result[2], "timed_out": command.timed_out(result)}
    if not_run:
        out["not_run"] = not_run
    return out


def _tuple(answer: dict[str, Any]) -> command.Result:
    return command.Result(answer["rc"], answer["stdout"], answer["stderr"], timed_out=answer.get("timed_out", False))


def _other_tool(node: Node, tools: Tools, cmd: Any, gpus: int = 0) -> dict[str, Any]:
    """A GPU command of another tool than nvidia-smi (bounded by its kind's timeout), found on PATH, then in its
    ``dirs`` below the node's root (else the first of its ``alternatives`` found; a ``tool`` given as an absolute
    path: that file below the node's root only); missing: rc 127 and what to install (``GpuCommand.missing``).
    Never installed by the check. ``GpuCommand.env`` is set for it; ``GPU_COUNT_ARG`` becomes ``gpus``."""
    for tool, args in ((cmd.tool, cmd.args),) + tuple(cmd.alternatives):
        if os.path.isabs(tool):
            path = node.path(tool) if os.access(node.path(tool), os.X_OK) else None
        else:
            path = tools.find(tool, cmd.package) or next(
                (p for p in (node.path(d, tool) for d in cmd.dirs) if os.access(p, os.X_OK)), None)
        if path:
            argv = [path, *(str(gpus) if a == GPU_COUNT_ARG else a for a in args)]
            answer = _answer(tools.run(argv, dict(cmd.env)) if cmd.env else tools.run(argv))
            if cmd.alternatives:
                answer["tool"] = tool
            return answer
    return {"rc": 127, "stdout": "", "stderr": cmd.missing or "%s not found on the node" % cmd.tool}


def verify(node: Node, desired: dict[str, Any], options: dict[str, Any] | None, tools: Tools,
           facts_options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(facts, verification)`` of the node against ``desired`` (``evaluate_host``'s desired state).

    ``options``: the ``verify`` option (``VERIFY_DEFAULTS`` for what is not given);
    ``facts_options``: ``facts.gather``'s keyword arguments but ``kmsg_since``, which the journal
    marker decides. Raises ``VerificationError``, ``FactsError`` or ``NodeError``.
    """
    facts, result, _probe = verify_probed(node, desired, options, tools, facts_options)
    return facts, result


def verify_probed(node: Node, desired: dict[str, Any], options: dict[str, Any] | None, tools: Tools,
                  facts_options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``verify``, and the GPU probe's answers it judged by (the guard exports the GPUs' ECC and bad pages)."""
    opts = dict(VERIFY_DEFAULTS)
    opts.update({k: v for k, v in (options or {}).items() if v is not None})
    desired = desired or {}
    since = kmsg_window(node, opts)
    facts = gather(node, kmsg_since=since["since"], **facts_options)
    boot_unit, modules = persisted_files(node, opts)
    sysctl_wanted = bool(boot_sysctls(desired))
    context = {
        "root": node.root,
        "boot_config": boot_configuration(node, desired, opts, tools),
        "sysctl_persisted": read_optional(node, opts["sysctl_file"]) if sysctl_wanted else None,
        "sysctl_overrides": sysctl_overrides(node, desired, opts["sysctl_file"]) if sysctl_wanted else {},
        "boot_unit": boot_unit,
        "boot_unit_state": boot_unit_state(node, opts, tools, boot_unit),
        "modules_persisted": modules,
    }
    probe = gpu_probe(node, opts, tools, desired, gpu_vendors(facts), gpu_count(facts))
    result = verification.evaluate_host(
        facts, desired, context, kernel_log_since=since, gpu=probe,
        fail_on_pending=opts["fail_on_pending"], fail_classes=opts["fail_classes"], host=opts["host"],
        verified_at=opts["verified_at"], gate=opts["gate"])
    return facts, result, probe


def module_tools(module, node: Node) -> Tools:
    """Commands on the node for the verification: found through Node.bin_path, run as an argument list."""

    def find(name, package):
        try:
            # host=False: on a simulated root only a command the node ships, never the controller's.
            return node.bin_path(module, name, package, host=False)
        except BinaryNotFound:
            return None

    # Bounded (command.py): AnsibleModule.run_command has no timeout on the ansible-core releases supported.
    return Tools(find, command.runner(module.params["command_timeouts"]))


def run(module) -> dict[str, Any]:
    """tuning_info's work on ``module.params`` (ARGUMENT_SPEC's): ``{"tuning_facts"}``, with ``desired`` also
    ``{"verification"}``. ``module`` only needs ``params`` and ``get_bin_path``; its ``warn``, when it has one, gets
    the node's warnings. Raises FactsError, NodeError, VerificationError or command.TimeoutsError.
    """
    p = module.params
    node = Node.open(p["root"])
    run_tools = module_tools(module, node)
    options = dict(pci_selector=p["pci_selector"], sysctls=p["sysctls"], kmsg_levels=p["kmsg_levels"],
                   kmsg_ignore=p["kmsg_ignore"], modules=p["modules"], detail=p["detail"])
    if p["desired"] is None:
        return {"tuning_facts": gather(node, kmsg_since=p["kmsg_since"], **options)}
    facts, result = verify(node, p["desired"], p["verify"], run_tools, options)
    warn = getattr(module, "warn", None)
    for line in ((result.get("node") or {}).get("warnings") or []) if callable(warn) else []:
        warn(line)  # the node's own (a driver branch past its end of life): the run's warnings, never a failure
    return {"tuning_facts": facts, "verification": result}
