# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every knob family shares: its record in the registry, the module's call, and a report row.

How it works and why: docs/dev/node-code.md, "core/family.py".
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

# The state of one setting in verification (docs/verify.md).
STATES = ("applied", "pending_reboot", "drifted", "not_applicable", "unsupported")
# PATH of the boot re-apply: a boot unit's environment is not a login shell's.


class FamilyError(Exception):
    """The module fails with this message; ``result`` is what it returns alongside (what was done)."""

    def __init__(self, msg: str, result: dict | None = None):
        super().__init__(msg)
        self.result = result or {}


class EvaluationError(ValueError):
    """Verification was called with something it cannot evaluate (a bug or a bad input shape)."""


class Call(NamedTuple):
    """One module run as the family sees it: the options and how to act on the controller's module (the fields:
    docs/dev/node-code.md, "core/family.py")."""

    params: dict
    check_mode: bool = False
    diff: bool = False
    warn: Callable[[str], None] = lambda _msg: None
    run_command: Callable[[list], tuple] | None = None
    atomic_move: Callable[[str, str], None] | None = None
    lookup: Any = None
    on_created: Callable[[list], None] | None = None


class FactsQuery(NamedTuple):
    """What a family's ``read`` is asked besides the node and the GPUs' selector (flows/verify.gather; the fields:
    docs/dev/node-code.md, "core/family.py")."""

    cpus: tuple = ()
    detail: bool = False
    options: dict = {}
    devices: tuple | None = None


class GpuCommand(NamedTuple):
    """One command the GPU probe of verification runs for a family (flows/verify.gpu_probe)."""

    key: str
    args: tuple = ()
    tool: str = "nvidia-smi"
    package: str = "nvidia-utils"
    fields: tuple = ()
    missing: str = ""
    standalone: bool = False
    dirs: tuple = ()
    vendor: str = ""
    alternatives: tuple = ()
    # Another tool: ``((name, value), ...)`` set in its environment (``NCCL_DEBUG=INFO`` for nccl-tests).
    env: tuple = ()


# An argument of a GpuCommand that the probe replaces with the number of GPUs on the bus (nccl-tests' ``-g``).
GPU_COUNT_ARG = "{gpus}"


class Concern(NamedTuple):
    """One thing the persistent flow makes survive a reboot, and how rollback takes it away (``Family.persist``;
    core/persistence.py gives its functions their ``PersistCall``)."""

    name: str
    # Tags that select it in the persistent flow and rollback (besides persistent / rollback).
    tags: tuple
    # (PersistCall) -> dict: write what the desired state asks; raises FamilyError.
    persist: Callable[..., dict]
    # (PersistCall) -> dict: remove everything it may have written; raises FamilyError.
    remove: Callable[..., dict]
    # Whether it writes the kernel arguments other families need: then their tags select it too.
    kernel_args: bool = False
    # What it writes, in a few words: tuning_persist's documentation of its ``concerns`` (tools/generate.py).
    description: str = ""


class Family(NamedTuple):
    """One knob family's entry in the registry (registry.py)."""

    name: str
    titles: dict
    module: str | None = None
    read: Callable[..., dict] | None = None
    read_options: dict | None = None
    facts_options: Callable[[dict], dict] | None = None
    facts_doc: str | None = None
    run: Callable[..., dict] | None = None
    evaluate: Callable[..., list] | None = None
    gpu_commands: Callable[[dict], tuple] | None = None
    reads_boot_config: Callable[[dict], bool] | None = None
    boot_sysctls: Callable[[dict], dict] | None = None
    runtime: Callable[..., bool] | None = None
    boot: Callable[..., tuple] | None = None
    reboot_only: tuple = ()
    persist_reboots: bool = False
    boot_key: str | None = None
    hotplug: Callable[[Any], list] | None = None
    tags: tuple = ()
    from_role: Callable[..., dict] | None = None
    role_problems: Callable[[dict], list] | None = None
    runtime_options: Callable[..., Any] | None = None
    restore_options: Callable[..., Any] | None = None
    argument_spec: dict | None = None
    persist: Any = None
    kernel_args: Callable[..., list] | None = None
    on_node: Callable[..., dict] | None = None
    per_cpu: tuple = ()
    drifted_cpus: Callable[[dict, int], Any] | None = None
    health: bool = False
    summary: Callable[[dict], str] | None = None
    items: str | None = None
    validate: dict | None = None
    export: Callable[..., dict] | None = None
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
    "The verification half")."""
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
    """Warn, naming why, about each option in ``reasons`` that the caller asked for by name."""
    preset = set(call.params.get("preset_options") or [])
    for key, why in sorted(reasons.items()):
        if key not in preset:
            call.warn("%s=%s does not apply on this node: %s" % (key, call.params.get(key), why))
