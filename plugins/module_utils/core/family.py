# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every knob family shares: its record in the registry, the module's call, and a report row.

A knob family is one file in module_utils/families (``pcie_mrrs.py``, ``cpuidle.py``, ...) that reads, validates,
plans, applies (journaling originals) and restores its settings, evaluates them for verification
and re-applies them at boot. It exports one ``DEFINITION = Family(...)``; ``registry.py`` lists them.
Its module is a thin adapter (``run_module``): options in, one family call, result out.

Plain Python (3.8+), no Ansible import: the boot runner loads this on the node without Ansible.
"""

from __future__ import annotations

import shutil
from typing import Any, Callable, NamedTuple

from ansible_collections.gpunode.tuning.plugins.module_utils.core import command

# The state of one setting in verification (docs/verify.md).
STATES = ("applied", "pending_reboot", "drifted", "not_applicable", "unsupported")
# PATH of the boot re-apply: a boot unit's environment is not a login shell's.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class FamilyError(Exception):
    """The module fails with this message; ``result`` is what it returns alongside (what was done)."""

    def __init__(self, msg: str, result: dict | None = None):
        super().__init__(msg)
        self.result = result or {}


class EvaluationError(ValueError):
    """Verification was called with something it cannot evaluate (a bug or a bad input shape)."""


class Call(NamedTuple):
    """One module run as the family sees it: the options and how to act on the controller's module."""

    params: dict
    check_mode: bool = False
    diff: bool = False
    warn: Callable[[str], None] = lambda _msg: None
    # argv -> (rc, stdout, stderr), with LC_ALL=C: the module's run_command.
    run_command: Callable[[list], tuple] | None = None
    # (src, dest) -> None: the module's atomic_move.
    atomic_move: Callable[[str, str], None] | None = None
    # What Node.bin_path needs to find a live node's binaries: an object with get_bin_path(name).
    lookup: Any = None
    # Told of the directories a write of the family created (full paths, outermost first; files.make_dirs): the
    # writing flow records them in the journal, so that rollback removes them when empty (flows/writers.py).
    on_created: Callable[[list], None] | None = None


class FactsQuery(NamedTuple):
    """What a family's ``read`` is asked besides the node and the GPUs' selector (flows/verify.gather)."""

    # The node's online CPUs, as core/facts.py found them.
    cpus: tuple = ()
    # Per-CPU entries too (tuning_info's ``detail``): they grow with the number of CPUs.
    detail: bool = False
    # tuning_info's facts options the family reads (``Family.read_options``), each checked by its validator.
    options: dict = {}
    # The node's PCI functions as pci.list_devices lists them, listed once for every family (None: not listed).
    devices: tuple | None = None


class GpuCommand(NamedTuple):
    """One command the GPU probe of verification runs for a family (flows/verify.gpu_probe).

    Its answer is ``ctx.gpu[key]``: ``{rc, stdout, stderr, timed_out}`` (plus ``fields`` and ``missing`` of
    a negotiated query, ``not_run`` when the driver was down and it was not asked). nvidia-smi's commands
    run only where nvidia-smi is installed, and once the driver is down nothing more is asked of it.
    """

    # The probe's key of the answer; two families asking for the same key share one run.
    key: str
    # The arguments after the tool.
    args: tuple = ()
    # The binary (found as Node.bin_path finds it) and the package that provides it.
    tool: str = "nvidia-smi"
    package: str = "nvidia-utils"
    # nvidia-smi only: ``--query-gpu`` of these fields, negotiated with ``--help-query-gpu`` (nvidia_smi.query).
    fields: tuple = ()
    # Another tool: the stderr of the rc 127 answer when the node does not have it (what to install).
    missing: str = ""
    # Another tool: run also where nvidia-smi is not installed (amd-smi); else only beside nvidia-smi (dcgmi).
    standalone: bool = False
    # Another tool: directories below the node's root where it is looked for after PATH (``opt/rocm/bin``).
    dirs: tuple = ()
    # Asked only where a GPU of this vendor (``pci.gpu_vendor``: "amd") is on the bus; "" always.
    vendor: str = ""
    # Another tool: ``((tool, args), ...)`` run instead, the first found, where ``tool`` is not (TransferBench,
    # else rocm-bandwidth-test); the answer's ``tool`` names the one that ran.
    alternatives: tuple = ()


class Family(NamedTuple):
    """One knob family's entry in the registry (registry.py).

    Every field but ``name`` and ``titles`` is optional; each says which flow uses it. No code outside
    the family's own file and the registry names a family: what the flows need to know of one is here.
    """

    # Key of the family in the desired state (the boot runner's desired.json, verify's desired), its file
    # name, its tag, the prefix of its variables and its facts key.
    name: str
    # Report families it produces, in report order, with their titles (the fleet summary's columns).
    titles: dict
    # Its runtime module, None for a read-only family.
    module: str | None = None
    # (node, selector, query) -> dict: the family's facts, under facts[name] in tuning_info (selector: the
    # pci.DeviceSelector of the GPUs, pci_selector; query: a FactsQuery). None: it reads no facts.
    read: Callable[..., dict] | None = None
    # {tuning_info option: (value) -> value}: the facts options ``read`` takes (``query.options``); the
    # validator raises ValueError naming the allowed values, before anything is read.
    read_options: dict | None = None
    # (desired) -> {tuning_info option: value}: the options ``read`` needs to judge ``desired`` (the role's
    # verification and the guard pass them).
    facts_options: Callable[[dict], dict] | None = None
    # The RETURN documentation of ``tuning_facts.<name>`` (YAML, as in a module's RETURN, the section's
    # keys at the top level); tools/generate.py writes it into tuning_info's RETURN.
    facts_doc: str | None = None
    # (call) -> result dict; raises FamilyError. The module runs exactly this (run_module).
    run: Callable[..., dict] | None = None
    # (facts, desired, ctx) -> list of setting() rows; ``desired`` is the whole desired state.
    evaluate: Callable[..., list] | None = None
    # (desired) -> the GpuCommand tuples whose answers ``evaluate`` reads from ``ctx.gpu``.
    gpu_commands: Callable[[dict], tuple] | None = None
    # (desired) -> whether ``evaluate`` needs the kernel arguments configured for the next boot
    # (``ctx.arg``): verification reads the boot configuration only when a family does.
    reads_boot_config: Callable[[dict], bool] | None = None
    # (desired) -> {sysctl key: value} the persistent flow sets at boot for it (the sysctl drop-in):
    # verification reads the drop-in and the sysctl files that override it only when a family has some.
    boot_sysctls: Callable[[dict], dict] | None = None
    # (row, facts, rows) -> whether runtime tuning can bring this row of the family (``rows``: all its
    # rows); None: every row but those of ``reboot_only`` report families.
    runtime: Callable[..., bool] | None = None
    # (node, want) -> (ok, message): re-apply ``desired[name]`` at boot, None when the family has
    # nothing to re-apply (it persists through a file the kernel or a tool reads at boot).
    boot: Callable[..., tuple] | None = None
    # Report families that only the persistent flow and a reboot bring (never "applied" at runtime).
    reboot_only: tuple = ()
    # Key of ``boot``'s part of the desired state when it is not ``name`` (tunables re-apply "thp").
    boot_key: str | None = None
    # (want) -> the PCI vendor ids ([] any vendor) of the hot-added PCI functions whose settings ``boot``
    # re-applies, called as ``boot(node, want, bdf)``: the udev rule runs the boot runner with
    # ``--only <name> --bdf <function>``. None: not re-applied on hot-plug.
    hotplug: Callable[[Any], list] | None = None
    # Ansible tags of its settings that select it besides its name (tunables: numa_balancing, thp, sysctl).
    tags: tuple = ()
    # (values, shared) -> dict: the family's keys of the desired state, from the role's variables
    # (validated and typed: plugin_utils/desired_state.py); ``shared`` holds what several families use
    # (the GPUs' PCI selector). None: the role has no variables for it.
    from_role: Callable[..., dict] | None = None
    # (values) -> [message]: what is wrong with the role's variables of the family taken together (each
    # valid alone), for the precheck; None when nothing can be.
    role_problems: Callable[[dict], list] | None = None
    # (desired, values) -> its module's options for runtime tuning, or None when there is nothing to
    # do (switched off, nothing asked). The options the role's runtime flow runs ``run`` with.
    runtime_options: Callable[..., Any] | None = None
    # (values) -> its module's options for rollback (restore what the journal holds); None when the
    # family journals nothing.
    restore_options: Callable[..., Any] | None = None
    # Its module's argument spec: the options ``run`` gets, with their defaults (the flow module
    # validates and completes each family's options with it, as the family's own module does).
    argument_spec: dict | None = None
    # What the persistent flow writes for it (core/persistence.py's Concern: tags, persist, remove), None when the
    # family persists nothing of its own (the boot unit re-applies it, or it is read-only).
    persist: Any = None
    # (pc, remove) -> kernel arguments the family needs on the command line (the persistent flow adds
    # them), or, with ``remove``, every argument it may have added (rollback removes them).
    kernel_args: Callable[..., list] | None = None
    # (desired, node) -> the desired state with the family's node-dependent entries resolved for this node (the
    # kernel arguments by GPU vendor: only this node's vendors', none when it has no such GPU): what the node keeps
    # of the desired state (the guard's config). None: its entries are kept as they are.
    on_node: Callable[..., dict] | None = None
    # Keys of its journal entries whose original is kept per CPU (value -> cpulist, Journal.record_per_cpu);
    # ("*",): every key. The journal refuses a file where such an original is not (core/registry_tables.py).
    per_cpu: tuple = ()
    # (row, online CPUs) -> on how many CPUs a per-CPU row is wrong (0 when applied), None for a row that is
    # not per CPU: the guard's metric of drifted CPUs.
    drifted_cpus: Callable[[dict, int], Any] | None = None
    # Whether its drifted and reset-pending rows are health findings: the rollout's health gate
    # (the gpu_health_findings filter) and the guard's finding metrics.
    health: bool = False
    # (result) -> one line of what its runtime run did, for the flow's report (flow.summary otherwise).
    summary: Callable[[dict], str] | None = None
    # Key of its run's result that holds its items (a dict by name or a list of dicts), each with ``changed``
    # (or ``cpus_changed``) and ``skipped``: the flow's summary counts them and rollback's report names the
    # restored ones. None: only the result's ``changed`` is read.
    items: str | None = None
    # {desired-state key: (entry) -> [(key, message)]}: what is wrong in the family's entries of the desired
    # state that can be judged without the node (shape, syntax, ranges that do not depend on the hardware).
    # ``entry`` is ``desired[desired-state key]`` (None: not part of it, no problem); ``key`` the key inside it
    # ("bdfs"; a list index as text for a list entry; "" the entry as a whole); ``message`` names the value and
    # what is allowed. The family's module refuses the same before its first write (one rule, two callers).
    validate: dict | None = None
    # (facts, desired, ctx) -> {file name: JSON document}: what the family exports for programs. The
    # verification result carries them (``exports``) and the reports are written beside the host's
    # (``<host>.<file name>``); None when the family exports nothing.
    export: Callable[..., dict] | None = None
    # (facts, desired, ctx) -> Markdown text or None: the family's own section of the host's Markdown
    # report (the verification result's ``sections``, titled with the family's title).
    report: Callable[..., str | None] | None = None


class Later:
    """A family's function kept in another of its files, imported when first called (``later``)."""

    __slots__ = ("load", "attr", "_value")

    def __init__(self, load: Callable[[], Any], attr: str):
        self.load = load
        self.attr = attr
        self._value = None

    def resolve(self) -> Any:
        """What ``later`` stands for (importing its file now, if it was not yet)."""
        if self._value is None:
            self._value = getattr(self.load(), self.attr)
        return self._value

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return "later(%s.%s)" % (getattr(self.load, "__module__", "?"), self.attr)


def later(load: Callable[[], Any], attr: str) -> Later:
    """``load().<attr>``, imported on first use: a Family field an apply run never calls (docs/dev/adding-a-family.md,
    "The verification half"). ``load`` holds the import statement, so that Ansible's packer ships the file."""
    return Later(load, attr)


def resolve(value: Any) -> Any:
    """The value behind a Family field: what a ``later`` stands for, anything else as it is."""
    return value.resolve() if isinstance(value, Later) else value


def problems_text(problems: list) -> str:
    """``key: message; key: message`` of ``Family.validate`` problems (a module's error)."""
    return "; ".join("%s: %s" % (key, msg) if key else msg for key, msg in problems)


def entry_problem(name: str, entry: Any, allowed: str) -> list:
    """``[("", message)]`` when a desired-state entry is not a mapping, else ``[]`` (None is no entry)."""
    if entry is None or isinstance(entry, dict):
        return []
    return [("", "%s must be a mapping of %s, got %r" % (name, allowed, entry))]


def normalize_value(value: Any) -> str | None:
    """A value as text for comparison: booleans as 0/1, whitespace runs as single spaces."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    return " ".join(str(value).split())


def same(running: Any, desired: Any) -> bool:
    """Whether a running value is the desired one once both are normalised."""
    return normalize_value(running) == normalize_value(desired)


def setting(family: str, name: str, desired: Any, running: Any, state: str, reason: str = "",
            persisted: Any = None, vendor: str | None = None) -> dict:
    """One row of the verification report; a GPU family's rows name the GPUs' ``vendor`` (``nvidia``, ``amd``,
    ``amd,nvidia`` for a row over the GPUs of both)."""
    if state not in STATES:
        raise EvaluationError("state %r is not one of %s" % (state, ", ".join(STATES)))
    row = {
        "id": "%s.%s" % (family, name),
        "family": family,
        "name": name,
        "desired": desired,
        "running": running,
        "persisted": persisted,
        "state": state,
        "reason": reason,
    }
    if vendor:
        row["vendor"] = vendor
    return row


def with_vendor(evaluate: Callable[..., list], vendor: Any) -> Callable[..., list]:
    """A GPU family's ``evaluate`` whose rows name their GPUs' vendor: ``vendor`` a name (``"nvidia"``), or
    ``(row, facts) -> name or None``; a row that names its vendor already keeps it."""
    def _evaluate(facts: dict, desired: dict, ctx: Any = None) -> list:
        rows = evaluate(facts, desired, ctx)
        for row in rows:
            name = row.get("vendor") or (vendor(row, facts) if callable(vendor) else vendor)
            if name:
                row["vendor"] = name
        return rows
    _evaluate.__doc__ = evaluate.__doc__
    return _evaluate


def preset_options_spec(options: list) -> dict:
    """The ``preset_options`` option of a module whose ``options`` a preset may set for every node."""
    return dict(preset_options=dict(type="list", elements="str", default=[], choices=list(options)))


def warn_not_applicable(call: Call, reasons: dict) -> None:
    """Warn, naming why, about each option in ``reasons`` that the caller asked for by name.

    ``reasons`` is ``{option: why it does not apply on this node}``. An option listed in the call's
    ``preset_options`` came from a preset that sets it for every node (the role): there "not applicable"
    is the expected answer and stays in the result only.
    """
    preset = set(call.params.get("preset_options") or [])
    for key, why in sorted(reasons.items()):
        if key not in preset:
            call.warn("%s=%s does not apply on this node: %s" % (key, call.params.get(key), why))


def module_call(module: Any) -> Call:
    """The Call of an AnsibleModule (duck-typed: this file imports nothing of Ansible).

    Commands run through ``command.runner`` (bounded by the module's ``command_timeouts`` option, or the
    defaults): AnsibleModule.run_command has no timeout in the ansible-core releases supported.
    Raises FamilyError for timeouts that ``command.validate`` refuses.
    """
    try:
        run = command.runner(module.params.get("command_timeouts"))
    except command.TimeoutsError as exc:
        raise FamilyError(str(exc), {"changed": False}) from None
    return Call(params=module.params, check_mode=module.check_mode, diff=module._diff, warn=module.warn,
                run_command=run, atomic_move=module.atomic_move, lookup=module)


def run_module(module: Any, run: Callable[[Call], dict]) -> None:
    """The one shape of a family's module: options in, one family call, its result or its error out."""
    try:
        result = run(module_call(module))
    except FamilyError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(**result)


class SystemLookup:
    """What ``Node.bin_path`` asks of a module, without one: a lookup on the system PATH (boot re-apply)."""

    @staticmethod
    def get_bin_path(name: str) -> str | None:
        return shutil.which(name, path=SYSTEM_PATH)


def run_argv(argv: list) -> tuple:
    """``(rc, stdout, stderr)`` of a command in the C locale on the system PATH (boot re-apply), bounded by
    the default timeout of its kind (``command.DEFAULT_TIMEOUTS``)."""
    return command.run(argv, command.DEFAULT_TIMEOUTS[command.kind_of(argv)], {"PATH": SYSTEM_PATH})


def as_role_options(fam: Family, options: dict) -> dict:
    """``options`` as the role passes them: every value is the role's (a preset's, for every node), so
    the module does not warn about one that does not apply here (``preset_options``, where it has them)."""
    spec = (fam.argument_spec or {}).get("preset_options")
    if not spec:
        return options
    return dict(options, preset_options=[k for k in spec["choices"] if k in options])
