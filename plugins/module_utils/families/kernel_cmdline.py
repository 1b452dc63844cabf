# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Persistent kernel command-line arguments: GRUB drop-ins (Debian/Ubuntu) and grubby (RHEL family).

GRUB: the arguments live in one drop-in under /etc/default/grub.d/ that appends to
``GRUB_CMDLINE_LINUX_DEFAULT``; update-grub sources /etc/default/grub and then every
``grub.d/*.cfg`` in name order. The configured command line is computed the same way, so an
argument set elsewhere in that chain is seen too.

Arguments are compared by key: ``key=value`` replaces any other value of ``key`` (and a bare
``key``); removing a bare ``key`` removes ``key=anything``. Pure functions parse and render;
``write_dropin`` is the one writer; ``run`` is the kernel_cmdline module's whole flow; its verification
rows are kernel_cmdline_verify.py.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, NamedTuple

from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    command,
    cpu,
    files,
    kernel_args,
    pci,
    persistence,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.bootloader import (  # noqa: F401 (re-exported)
    ASSIGN_RE,
    BOOTLOADERS,
    DEFAULT_DROPIN,
    GRUB_DROPIN_DIR,
    MANAGED_MARK,
    choose_bootloader,
    grub_unquote,
    parse_dropin,
    parse_grubby_info,
    read_text,
    shell_value,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import Family
from ansible_collections.gpunode.tuning.plugins.module_utils.core.kernel_args import (  # noqa: F401 (re-exported)
    arg_key,
    is_configured,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    NODE_ARGUMENT_SPEC,
    BinaryNotFound,
    Node,
    NodeError,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import ValidationError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate_boot import kernel_argument, write_problem

STATES = ("present", "absent")

# Report family of the kernel arguments (verification) and the key of the desired state.
NAME = "kernel_cmdline"


class CmdlineError(ValueError):
    """An input that cannot be applied, or a failed write; the message names what is allowed.

    ``result``: the module's result so far (returned with the failure).
    """

    def __init__(self, msg, result=None):
        super().__init__(msg)
        self.result = result or {}


def argument_problems(arguments: list, unique_keys: bool = True) -> list:
    """``[(index, message)]`` of every invalid argument (validate_boot.kernel_argument) and, with ``unique_keys``,
    every key given twice with another value. Removing two values of one key is fine (rollback removes
    every value it may have added)."""
    out = []
    keys = {}
    for index, arg in enumerate(arguments):
        try:
            kernel_argument(arg)
        except ValidationError as exc:
            out.append((str(index), str(exc)))
            continue
        key = arg_key(arg)
        if unique_keys and key in keys and keys[key] != arg:
            out.append((str(index), "key %s is given twice (%s and %s)" % (key, keys[key], arg)))
        keys[key] = arg
    return out


def desired_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["kernel_cmdline"]``: a list of kernel arguments (key: the list index)."""
    if want in (None, []):
        return []
    if not isinstance(want, list):
        return [("", "%s must be a list of kernel arguments (KEY or KEY=VALUE), got %r" % (NAME, want))]
    return argument_problems(want)


# Kernel arguments by the vendor of the node's GPUs (``desired["kernel_cmdline_gpu_vendor_args"]``, from the
# presets): decided on the node, as cpufreq's driver=native is, from the GPUs its PCI bus shows (``pci.gpu_vendor``);
# a node with both vendors' GPUs gets both lists. The persistent flow adds them (``gpu_vendor_kernel_args``),
# verification judges them like the configured arguments (``evaluate``).
GPU_VENDOR_KEY = "kernel_cmdline_gpu_vendor_args"
GPU_VENDOR_NAMES = ("amd", "nvidia")


def gpu_vendor_problems(want: Any) -> list:
    """``Family.validate`` of ``desired["kernel_cmdline_gpu_vendor_args"]``: ``{amd|nvidia: [kernel arguments]}``."""
    if want in (None, {}):
        return []
    allowed = "a mapping of GPU vendor (%s) to a list of kernel arguments (KEY or KEY=VALUE)" \
        % ", ".join(GPU_VENDOR_NAMES)
    if not isinstance(want, dict):
        return [("", "%s must be %s, got %r" % (GPU_VENDOR_KEY, allowed, want))]
    out = []
    for vendor, arguments in want.items():
        if vendor not in GPU_VENDOR_NAMES:
            out.append((str(vendor), "unknown GPU vendor %r; allowed: %s" % (vendor, ", ".join(GPU_VENDOR_NAMES))))
        elif not isinstance(arguments, list):
            out.append((vendor, "%s.%s must be a list of kernel arguments, got %r"
                        % (GPU_VENDOR_KEY, vendor, arguments)))
        else:
            out += [("%s[%s]" % (vendor, index), msg) for index, msg in argument_problems(arguments)]
    return out


def gpu_vendor_arguments(want: Any, vendors: Any) -> list:
    """The arguments of ``want`` for the GPU ``vendors`` of a node (in vendor order, each once)."""
    out = []
    for vendor in GPU_VENDOR_NAMES:
        if vendor in (vendors or ()) and isinstance(want, dict):
            out += [a for a in want.get(vendor) or [] if a not in out]
    return out


def node_gpu_vendors(node: Node) -> set:
    """The vendors (``amd``, ``nvidia``) of the GPUs on the node's PCI bus, selected or not (as facts'
    ``pci.gpu_vendors``)."""
    return {v for v in (pci.gpu_vendor(d) for d in pci.list_devices(node)) if v}


def gpu_vendor_kernel_args(pc, remove: bool = False) -> list:
    """``Family.kernel_args``: the arguments for this node's GPU vendors; with ``remove``, every vendor's (rollback
    removes what any node may have got)."""
    if remove:
        want = pc.settings.get(GPU_VENDOR_KEY) or {}
        return gpu_vendor_arguments(want, GPU_VENDOR_NAMES)
    want = pc.desired.get(GPU_VENDOR_KEY)
    return gpu_vendor_arguments(want, node_gpu_vendors(pc.node)) if want else []


def on_node(desired: dict, node: Node) -> dict:
    """``Family.on_node``: the arguments by GPU vendor of this node's vendors only; the entry dropped when none."""
    want = desired.get(GPU_VENDOR_KEY)
    if not isinstance(want, dict):
        return desired
    out = {k: v for k, v in desired.items() if k != GPU_VENDOR_KEY}
    vendors = node_gpu_vendors(node)
    mine = {v: list(a) for v, a in want.items() if v in vendors and a}
    if mine:
        out[GPU_VENDOR_KEY] = mine
    return out


def validate_arguments(arguments: list[str], unique_keys: bool = True) -> None:
    """Raise ``CmdlineError`` listing every invalid argument (and keys given twice, with ``unique_keys``)."""
    errors = [] if arguments else ["arguments must name at least one kernel argument (or set iommu_mode)"]
    errors += [msg for _index, msg in argument_problems(arguments or [], unique_keys)]
    if errors:
        raise CmdlineError("; ".join(errors))


def validate_dropin(path: str) -> None:
    """A GRUB drop-in must be a ``*.cfg`` file directly in /etc/default/grub.d (update-grub reads only those)."""
    if (not isinstance(path, str) or os.path.dirname(path) != GRUB_DROPIN_DIR or not path.endswith(".cfg")
            or not re.match(r"^[A-Za-z0-9_.-]+\.cfg$", os.path.basename(path)) or ".." in path):
        raise CmdlineError("dropin %r is invalid: allowed is a file NAME.cfg directly in %s (NAME of letters, "
                           "digits, '_', '.', '-'), e.g. %s" % (path, GRUB_DROPIN_DIR, DEFAULT_DROPIN))


def iommu_arguments(node: Node, mode: str | None, state: str) -> tuple[list[str], str | None]:
    """``(arguments, cpu vendor)`` of an IOMMU ``mode`` on this node: kernel_args.iommu_kernel_args' ``needed``
    for the vendor of the node's own /proc/cpuinfo (present), or its ``removable`` (absent: any vendor's)."""
    if mode in (None, "", "unmanaged"):
        return [], None
    if mode not in kernel_args.MODES:
        raise CmdlineError("invalid input, nothing was written: iommu_mode must be one of %s, got %r"
                           % (", ".join(kernel_args.MODES), mode))
    vendor = cpu.cpu_vendor(node)
    args = kernel_args.iommu_kernel_args(mode, vendor)
    return list(args.removable if state == "absent" else args.needed), vendor


def merge_arguments(arguments: list[str], extra: list[str]) -> list[str]:
    """``arguments`` then the ``extra`` ones not in it already, in order (duplicates are one argument)."""
    out = []
    for arg in list(arguments or []) + list(extra):
        if arg not in out:
            out.append(arg)
    return out


def add_arguments(current: list[str], wanted: list[str]) -> list[str]:
    """Return ``current`` with every argument of ``wanted`` present, replacing values of the same key in place."""
    out = list(current)
    for arg in wanted:
        key = arg_key(arg)
        positions = [i for i, a in enumerate(out) if arg_key(a) == key]
        if positions:
            first = positions[0]
            out = [a for i, a in enumerate(out) if i not in positions[1:]]
            out[first] = arg
        else:
            out.append(arg)
    return out


def remove_arguments(current: list[str], unwanted: list[str]) -> list[str]:
    """Return ``current`` without ``unwanted`` (a bare key removes every value of that key)."""
    out = list(current)
    for arg in unwanted:
        if "=" in arg:
            out = [a for a in out if a != arg]
        else:
            out = [a for a in out if arg_key(a) != arg]
    return out


# --- GRUB drop-in ----------------------------------------------------------------------------------


def grub_word(arg: str) -> str:
    """``arg`` as written in the drop-in: a value with ';' in GRUB single quotes.

    The shell that sources the drop-in keeps ';' and "'" inside the double quotes; grub-mkconfig
    copies the words into grub.cfg's ``linux`` line unquoted, where GRUB's own parser would take
    ';' for a command separator; its quotes keep the word whole and are removed before the kernel
    sees it (validate_boot.kernel_argument allows ';' and no "'" otherwise, so ``grub_unquote`` undoes it).
    """
    if ";" not in arg:
        return arg
    key, sep, value = arg.partition("=")
    return "%s%s'%s'" % (key, sep, value)


def render_dropin(args: list[str]) -> str | None:
    """The drop-in text for ``args`` (None when there is nothing to configure: the file goes away)."""
    if not args:
        return None
    return (
        "# %s (kernel_cmdline module). Do not edit: changes are overwritten.\n"
        "# Kernel command-line arguments for GPU node tuning, appended to the distribution's defaults.\n"
        "# Takes effect after update-grub and a reboot.\n"
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT %s"\n'
        % (MANAGED_MARK, " ".join(grub_word(a) for a in args))
    )


def grub_cmdline_args(texts: list[str | None]) -> list[str]:
    """Arguments update-grub would put on the kernel line, from config texts in the order sourced.

    Returns ``GRUB_CMDLINE_LINUX`` followed by ``GRUB_CMDLINE_LINUX_DEFAULT``, split into words.
    """
    env = {"GRUB_CMDLINE_LINUX": "", "GRUB_CMDLINE_LINUX_DEFAULT": ""}
    for text in texts:
        for line in (text or "").splitlines():
            m = ASSIGN_RE.match(line)
            if m:
                env[m.group(1)] = shell_value(m.group(2), env)
    words = env["GRUB_CMDLINE_LINUX"].split() + env["GRUB_CMDLINE_LINUX_DEFAULT"].split()
    return [grub_unquote(w) for w in words]


def grub_config_texts(node: Node, dropin: str, dropin_text: str | None) -> list[str | None]:
    """Texts update-grub would source, with ``dropin`` replaced by ``dropin_text`` (None: absent)."""
    texts = [read_text(node, "/etc/default/grub")]
    names = [n for n in node.listdir(GRUB_DROPIN_DIR) if n.endswith(".cfg")]
    base = os.path.basename(dropin)
    for name in sorted(set(names) | {base}):
        if name == base:
            texts.append(dropin_text)
        else:
            texts.append(read_text(node, GRUB_DROPIN_DIR + "/" + name))
    return texts


def plan_grub(node: Node, dropin: str, arguments: list[str], state: str) -> dict:
    """Plan the drop-in change. Returns a dict with before/after text and args, and ``changed``.

    Raises ``CmdlineError`` when the drop-in exists but is not ours (it is never overwritten).
    """
    before_text = read_text(node, dropin)
    managed, before_args = parse_dropin(before_text)
    if before_text is not None and not managed:
        raise CmdlineError("%s exists and is not managed by gpunode.tuning (no %r header): refusing to overwrite "
                           "it; choose another dropin name" % (dropin, MANAGED_MARK))
    if state == "present":
        after_args = add_arguments(before_args, arguments)
    else:
        after_args = remove_arguments(before_args, arguments)
    after_text = render_dropin(after_args)
    if after_args == before_args and before_text is not None and after_args:
        after_text = before_text  # already right: do not rewrite for header wording
    return dict(before_text=before_text, after_text=after_text, before_args=before_args, after_args=after_args,
                changed=after_text != before_text,
                configured_args=grub_cmdline_args(grub_config_texts(node, dropin, after_text)))


def dropin_problem(node: Node, dropin: str) -> str | None:
    """Why the drop-in could not be written or deleted (check mode predicts it), or None."""
    problem = write_problem(node.path(dropin))
    return None if problem is None else "%s cannot be written: %s" % (node.path(dropin), problem)


def write_dropin(node: Node, dropin: str, text: str | None, atomic_move: Callable[[str, str], None],
                 on_created: Callable[[list], None] | None = None) -> None:
    """Write (or with ``text`` None delete) the drop-in atomically (core/files.py: a temporary file in the target
    directory, flushed, then ``atomic_move``d over it). A missing /etc/default/grub.d (and parents) is created and
    ``on_created`` told of it: the writing flow journals it, so that rollback removes it."""
    full = node.path(dropin)
    directory = os.path.dirname(full)
    if text is None:
        if os.path.exists(full):
            os.unlink(full)
        return
    files.make_dirs(directory, 0o755, on_created)
    files.replace_file(full, text.encode("utf-8"), 0o644, fsync=True, move=atomic_move)


# --- grubby ------------------------------------------------------------------------------------------


def grubby_commands(grubby: str, arguments: list[str], state: str) -> list[str]:
    """The grubby argument list that adds or removes ``arguments`` on every kernel entry."""
    flag = "--args=" if state == "present" else "--remove-args="
    return [grubby, "--update-kernel=ALL", flag + " ".join(arguments)]


# --- detection and per-argument report ---------------------------------------------------------------------


def report(arguments: list[str], state: str, configured_args: list[str] | None,
           running_args: list[str]) -> dict:
    """Per argument: configured, running, pending_reboot. ``configured_args`` None means unknown."""
    out = {}
    for arg in arguments:
        running = is_configured(running_args, arg, state)
        configured = None if configured_args is None else is_configured(configured_args, arg, state)
        out[arg] = dict(configured=configured, running=running,
                        pending_reboot=None if configured is None else configured != running)
    return out


# --- the kernel_cmdline flow -------------------------------------------------------------------------


class Tools(NamedTuple):
    """What ``configure`` needs from its caller (the kernel_cmdline module)."""

    lookup: Any
    """Has ``get_bin_path(name)``: the live system's PATH lookup, for ``Node.bin_path``."""
    run: Callable[[list], tuple]
    """``run(argv) -> (rc, stdout, stderr)``."""
    atomic_move: Callable[[str, str], None]
    """Moves a written temp file onto its destination."""
    warn: Callable[[str], None]
    """Reports a warning."""
    on_created: Callable[[list], None] | None = None
    """Told of the directories a write created (``Call.on_created``)."""


def find_tool(node: Node, tools: Tools, name: str, package: str) -> str | None:
    """A boot tool of this node (``Node.bin_path``; a simulated root's own copy only), None when absent."""
    try:
        return node.bin_path(tools.lookup, name, package, host=False)
    except BinaryNotFound:
        return None


def configure(node: Node, tools: Tools, arguments: list[str], state: str = "present", bootloader: str = "auto",
              dropin: str = DEFAULT_DROPIN, update_bootloader: bool = True, check_mode: bool = False,
              diff: bool = False, iommu_mode: str | None = None) -> dict:
    """The kernel_cmdline module: validate, configure ``arguments`` through GRUB or grubby, report.

    ``iommu_mode`` adds the mode's arguments for this node's CPU (``iommu_arguments``). Returns the
    module's result. Raises ``CmdlineError`` (with the result so far in ``result``) on bad input,
    before anything is written, and when a write or a boot tool fails.
    """
    extra, vendor = iommu_arguments(node, iommu_mode, state)
    arguments = merge_arguments(arguments, extra)
    try:
        validate_arguments(arguments, unique_keys=state == "present")
    except CmdlineError as exc:
        raise CmdlineError("invalid input, nothing was written: %s" % exc) from None
    running = node.read("proc/cmdline", default="").split()
    if state == "absent" and bootloader == "auto" and _undetected(node, tools):
        # No GRUB configuration and no grubby: nothing of this collection's can be configured on this node,
        # so there is nothing to remove (a rollback must not fail where the persistent flow never wrote).
        return dict(changed=False, bootloader=None, supported=True, bootloader_updated=False, dropin=None,
                    configured_cmdline=None, iommu_arguments=extra, cpu_vendor=vendor, reboot_required=False,
                    arguments=report(arguments, state, None, running))
    bootloader = resolve_bootloader(node, tools, bootloader, dropin)
    out = dict(changed=False, bootloader=bootloader, supported=True, bootloader_updated=False,
               dropin=dropin if bootloader == "grub" else None, configured_cmdline=None,
               iommu_arguments=extra, cpu_vendor=vendor)
    try:
        if bootloader == "grub":
            configured = _apply_grub(node, tools, out, arguments, state, dropin, update_bootloader, check_mode, diff)
        else:
            configured = _apply_grubby(node, tools, out, arguments, state, check_mode, diff)
    except OSError as exc:
        raise CmdlineError(str(exc), out) from None
    except CmdlineError as exc:
        raise CmdlineError(str(exc), exc.result or out) from None
    out["arguments"] = report(arguments, state, configured, running)
    out["reboot_required"] = any(a["pending_reboot"] for a in out["arguments"].values())
    return out


def _undetected(node: Node, tools: Tools) -> bool:
    """True when ``auto`` finds no bootloader on the node (``choose_bootloader``)."""
    return choose_bootloader(node, "auto", lambda name, package: find_tool(node, tools, name, package)) is None


def resolve_bootloader(node: Node, tools: Tools, bootloader: str, dropin: str) -> str:
    """``grub`` or ``grubby``: the one asked for, or with ``auto`` the detected one; checks GRUB's inputs."""
    if bootloader == "auto":
        bootloader = choose_bootloader(node, bootloader, lambda name, package: find_tool(node, tools, name, package))
        if bootloader is None:  # present only: configure() returned earlier for absent
            raise CmdlineError("cannot tell the bootloader of this node from /etc/os-release; set bootloader "
                               "to one of: grub, grubby")
    if bootloader == "grub":
        try:
            validate_dropin(dropin)
        except CmdlineError as exc:
            raise CmdlineError("invalid input, nothing was written: %s" % exc) from None
        if not node.exists("etc/default/grub"):
            raise CmdlineError("%s does not exist: this node does not use GRUB configured through /etc/default/grub; "
                               "set bootloader to one of: grub, grubby" % node.path("etc/default/grub"))
    return bootloader


def _apply_grub(node, tools, out, arguments, state, dropin, update_bootloader, check_mode, diff):
    """Write the drop-in (and run update-grub on a live node); return the configured arguments."""
    plan = plan_grub(node, dropin, arguments, state)
    out.update(changed=plan["changed"], configured_cmdline=plan["configured_args"])
    if diff:
        out["diff"] = dict(before=plan["before_text"] or "", after=plan["after_text"] or "",
                           before_header=dropin, after_header=dropin)
    problem = dropin_problem(node, dropin) if plan["changed"] else None
    if problem:  # in check mode too: the real run would fail here
        raise CmdlineError("%s; nothing was written" % problem, out)
    if plan["changed"] and not check_mode:
        write_dropin(node, dropin, plan["after_text"], tools.atomic_move, tools.on_created)
        if node.is_live and update_bootloader:
            _update_grub(node, tools, out)
    for arg in arguments:
        if state == "absent" and is_configured(plan["configured_args"], arg, "absent"):
            tools.warn("%s is still configured outside %s (e.g. /etc/default/grub), which this module does "
                       "not edit" % (arg, dropin))
    return plan["configured_args"]


def _update_grub(node, tools, out):
    update_grub = find_tool(node, tools, "update-grub", "grub2-common")
    if not update_grub:
        tools.warn("update-grub not found: run your distribution's grub-mkconfig before rebooting")
        return
    rc, stdout, stderr = tools.run([update_grub])
    if rc != 0:
        raise CmdlineError("update-grub failed (rc %d): %s" % (rc, (stderr or stdout).strip()), out)
    out["bootloader_updated"] = True


def _apply_grubby(node, tools, out, arguments, state, check_mode, diff):
    """Change every kernel entry with grubby; return the default entry's arguments (None when unknown)."""
    grubby = find_tool(node, tools, "grubby", "grubby")
    out["dropin"] = None
    if not grubby:
        where = "this node" if node.is_live else "a simulated root (%s)" % node.root
        out["supported"] = False
        tools.warn("grubby is not available on %s: the boot configuration was neither read nor changed" % where)
        return None
    rc, stdout, stderr = tools.run([grubby, "--info=DEFAULT"])
    if rc != 0:
        raise CmdlineError("grubby --info=DEFAULT failed (rc %d): %s" % (rc, (stderr or stdout).strip()), out)
    before = parse_grubby_info(stdout)
    after = add_arguments(before, arguments) if state == "present" else remove_arguments(before, arguments)
    out["changed"] = after != before
    out["configured_cmdline"] = after
    if diff:
        out["diff"] = dict(before="args: %s\n" % " ".join(before), after="args: %s\n" % " ".join(after))
    if out["changed"] and not check_mode:
        rc, stdout, stderr = tools.run(grubby_commands(grubby, arguments, state))
        if rc != 0:
            raise CmdlineError("grubby failed (rc %d): %s" % (rc, (stderr or stdout).strip()), out)
        out["bootloader_updated"] = True
    return after


def run(call: contract.Call) -> dict:
    """The kernel_cmdline module: ``configure`` with the call's options and tools; returns the result.

    Raises FamilyError naming a bad root before anything is read, and for every ``CmdlineError``
    (with the result so far).
    """
    params = call.params
    try:
        node = Node.open(params["root"])
    except NodeError as exc:
        raise contract.FamilyError(str(exc)) from None
    tools = Tools(lookup=call.lookup, run=call.run_command, atomic_move=call.atomic_move, warn=call.warn,
                  on_created=call.on_created)
    try:
        return configure(node, tools, params["arguments"], state=params["state"], bootloader=params["bootloader"],
                         dropin=params["dropin"], update_bootloader=params["update_bootloader"],
                         check_mode=call.check_mode, diff=call.diff, iommu_mode=params.get("iommu_mode"))
    except CmdlineError as exc:
        raise contract.FamilyError(str(exc), exc.result) from None

# --- verification: kernel_cmdline_verify.py ---


# The kernel command line has nothing to re-apply at boot: the bootloader passes it.
# The options of its module (kernel_cmdline): the flow module completes each family's options with it too.
ARGUMENT_SPEC = dict(
    arguments=dict(type="list", elements="str", required=True),
    state=dict(type="str", choices=list(STATES), default="present"),
    bootloader=dict(type="str", choices=list(BOOTLOADERS), default="auto"),
    dropin=dict(type="str", default=DEFAULT_DROPIN),
    update_bootloader=dict(type="bool", default=True),
    iommu_mode=dict(type="str", choices=list(kernel_args.MODES), default="unmanaged"),
    **NODE_ARGUMENT_SPEC,
    **command.ARGUMENT_SPEC,
)


def from_role(v: dict, shared: dict) -> dict:
    enabled = v["gpunode_tuning_kernel_cmdline_enabled"]
    by_vendor = {k: list(x) for k, x in (v.get("gpunode_tuning_kernel_cmdline_gpu_vendor_args") or {}).items() if x}
    out = {NAME: list(v["gpunode_tuning_kernel_cmdline_args"] or []) if enabled else []}
    if enabled and by_vendor:
        out[GPU_VENDOR_KEY] = by_vendor
    return out


def _cmdline_options(pc, arguments: list, state: str) -> dict:
    """kernel_cmdline's options for the persistent flow: the role's bootloader and drop-in."""
    settings = pc.settings
    return {"arguments": arguments, "state": state, "bootloader": settings.get("kernel_cmdline_bootloader") or "auto",
            "dropin": settings.get("kernel_cmdline_dropin") or DEFAULT_DROPIN, "update_bootloader": pc.node.is_live}


def persist_cmdline(pc) -> dict:
    """The configured kernel arguments and those other families need (``Family.kernel_args``: a driver switch,
    ACS by kernel argument, the IOMMU mode's)."""
    if not pc.settings.get("kernel_cmdline_enabled"):
        return {"changed": False, "skipped": True, "reason": "gpunode_tuning_kernel_cmdline_enabled is false"}
    arguments = list(pc.desired.get(NAME) or [])
    arguments += [a for a in pc.family_kernel_args() if a not in arguments]
    if not arguments:
        return {"changed": False, "skipped": True, "reason": "no kernel argument to configure"}
    return pc.run_family(NAME, _cmdline_options(pc, arguments, "present"))


def remove_cmdline(pc) -> dict:
    """Every argument the persistent flow may have added (exact KEY=VALUE forms: an administrator's own stay)."""
    arguments = list(pc.settings.get("kernel_cmdline_args") or [])
    arguments += [a for a in pc.family_kernel_args(remove=True) if a not in arguments]
    if not arguments:
        return {"changed": False, "skipped": True, "reason": "no kernel argument to remove"}
    return pc.run_family(NAME, _cmdline_options(pc, arguments, "absent"))


PERSIST = persistence.Concern(NAME, (NAME,), persist_cmdline, remove_cmdline, kernel_args=True,
                              description="the kernel arguments (configured, and those the other families need: a "
                                          "cpufreq driver switch, ACS by kernel argument, the IOMMU mode's) through "
                                          "GRUB or grubby")


def _verification():
    """The verification half (families/kernel_cmdline_verify.py), imported when verification first calls it."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.families import kernel_cmdline_verify
    return kernel_cmdline_verify


DEFINITION = Family(
    name=NAME,
    titles={NAME: "kernel cmdline"},
    module="kernel_cmdline",
    run=run,
    evaluate=contract.later(_verification, "evaluate"),
    reads_boot_config=lambda desired: bool(desired.get(NAME) or desired.get(GPU_VENDOR_KEY)),
    reboot_only=(NAME,),
    from_role=from_role,
    argument_spec=ARGUMENT_SPEC,
    persist=PERSIST,
    kernel_args=gpu_vendor_kernel_args,
    on_node=on_node,
    validate={NAME: desired_problems, GPU_VENDOR_KEY: gpu_vendor_problems},
)
