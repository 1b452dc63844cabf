# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verification: compare a node's facts with the desired state, setting by setting.

Pure functions, no I/O: the tuning_info module reads the node (module_utils/flows/verify.py: the
facts, the kernel arguments configured for the next boot, the sysctl drop-in, the boot unit, the
journal marker, nvidia-smi) and calls ``evaluate_host`` here; the role renders the reports from its
result, and the controller-side filters (plugins/filter/verification.py) call ``fleet_summary`` and
``error_result``.

Every setting gets one state:

- ``applied``: the running value is the desired one.
- ``pending_reboot``: configured for the next boot but not running yet (a kernel argument in the
  boot configuration but not on ``/proc/cmdline``; amd-pstate wanted, acpi-cpufreq running and
  ``amd_pstate=<mode>`` configured).
- ``drifted``: neither.
- ``not_applicable``: the node lacks the hardware or driver (the reason says which).
- ``unsupported``: the hardware is there but cannot provide the value (a governor the driver does
  not offer, no EPP under the desired driver, config space that cannot be read).
"""

from __future__ import annotations

import base64
import json
from typing import Any, Iterable

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import fitness
from ansible_collections.gpunode.tuning.plugins.module_utils.core.bootloader import parse_dropin, parse_grubby_info
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import (
    STATES,
    EvaluationError,
    normalize_value,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.kernel_args import has_arg
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families

# Verdicts a caller can gate on (evaluate_host's gate): the whole desired state, or what runtime
# tuning can apply (the runtime rollout, which cannot switch a cpufreq driver or add kernel arguments).
GATES = ("full", "runtime")
# Report families only the persistent flow and a reboot bring (from the registry, registry.py).
REBOOT_ONLY_FAMILIES = all_families.reboot_only()
# Report families in report order, with their titles; the fleet summary has one column per family.
FAMILY_TITLES = all_families.report_titles()
FAMILIES = tuple(FAMILY_TITLES)
# Report families whose drifted and reset-pending rows are health findings (the rollout's health gate).
HEALTH_FAMILIES = all_families.health_families()
# Kernel-log classes (module_utils/core/kernel_log.py) that fail verification by default.
# The role's default too (defaults/main.yml): Xids are judged by gpu_health (the serious ones fail).
DEFAULT_FAIL_CLASSES = ("aer", "fallen_off_bus")
KMSG_CLASSES = ("aer", "xid", "fallen_off_bus", "lockdown", "module_failure", "noise", "other")


# The input of an evaluation is malformed; the message names what was expected.
VerificationError = EvaluationError


# -- Small parsers (text read from the node)


def parse_sysctl_conf(text: str | None) -> dict[str, str]:
    """``key = value`` lines of a sysctl.d file -> ``{dotted key: normalized value}``.

    Comments (``#``, ``;``) and blank lines are skipped; ``/`` separated keys are made dotted, a
    leading ``-`` (ignore errors) is dropped. A key set twice keeps its last value, as sysctl does.
    """
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key = key.strip().lstrip("-").strip()
        if "/" in key and "." not in key:
            key = key.replace("/", ".")
        out[key] = normalize_value(value)
    return out


def decode_journal(journal: Any) -> dict | None:
    """The journal as a dict, from a dict, JSON text or a slurp result (base64 ``content``)."""
    if journal in (None, "", {}):
        return None
    if isinstance(journal, dict) and "content" in journal and "families" not in journal:
        try:
            journal = base64.b64decode(journal["content"]).decode("utf-8")
        except (TypeError, ValueError) as exc:
            raise VerificationError("journal: slurp content is not base64: %s" % exc) from exc
    if isinstance(journal, (bytes, str)):
        try:
            journal = json.loads(journal)
        except ValueError as exc:
            raise VerificationError("journal: not JSON (%s)" % exc) from exc
    if not isinstance(journal, dict):
        raise VerificationError("journal: expected a dict, got %s" % type(journal).__name__)
    return journal


def kmsg_since(journal: Any = None, boot_id: str | None = None, override: float | None = None) -> dict:
    """From when the kernel log counts: ``{since, source, detail, last_applied}``.

    ``override`` (seconds since boot) wins. Otherwise the journal's ``last_applied`` marker is used
    when its boot id is the node's current one (its ``uptime`` is then a time in this boot);
    after a reboot, or without a marker, the whole boot counts (``since`` 0).
    """
    journal = decode_journal(journal)
    marker = (journal or {}).get("last_applied") or None
    boot_id = (boot_id or "").strip() or None
    if override not in (None, ""):
        try:
            since = float(override)
        except (TypeError, ValueError):
            raise VerificationError("gpunode_tuning_kmsg_since must be a number of seconds since boot, got %r"
                                    % (override,)) from None
        if since < 0:
            raise VerificationError("gpunode_tuning_kmsg_since must be >= 0, got %r" % (override,))
        return {"since": since, "source": "override", "last_applied": marker,
                "detail": "since %.1f s after boot (gpunode_tuning_kmsg_since)" % since}
    if not marker:
        return {"since": 0.0, "source": "boot", "last_applied": None,
                "detail": "since boot (the journal records no runtime tuning)"}
    if boot_id and marker.get("boot_id") == boot_id:
        since = float(marker.get("uptime") or 0)
        return {"since": since, "source": "journal", "last_applied": marker,
                "detail": "since the last runtime tuning (%s, family %s, %.1f s after boot)"
                          % (marker.get("time"), marker.get("family"), since)}
    return {"since": 0.0, "source": "boot", "last_applied": marker,
            "detail": "since boot (the last runtime tuning, %s, was in an earlier boot)" % marker.get("time")}


# -- Settings


class Context:
    """Everything besides tuning_facts that an evaluation looks at (all optional)."""

    def __init__(self, boot_config: dict | None = None, sysctl_persisted: dict | None = None, boot_unit: bool = False,
                 modules_persisted: Iterable[str] | None = None, root: str = "/", running_args: Iterable[str] = (),
                 sysctl_overrides: dict | None = None, boot_unit_state: dict | None = None):
        self.configured_args, self.cmdline_error = configured_arguments(boot_config)
        self.cmdline_source = (boot_config or {}).get("bootloader")
        self.running_args = list(running_args or [])
        self.sysctl_persisted = sysctl_persisted  # dict key -> value, or None when no drop-in
        # key -> {file, value}: a sysctl file applied after our drop-in sets the key otherwise.
        self.sysctl_overrides = dict(sysctl_overrides or {})
        self.boot_unit = bool(boot_unit)
        # parse_unit_state of the boot unit, None when systemd was not asked.
        self.boot_unit_state = boot_unit_state
        self.modules_persisted = set(modules_persisted or [])
        self.root = root or "/"
        # The GPU probe's answers on a live node (flows/verify.gpu_probe: the commands the families
        # ask for, Family.gpu_commands); None when not probed.
        self.gpu: dict | None = None

    def arg(self, arg: str) -> dict:
        """``{configured, running}`` of one kernel argument; configured is None when unknown."""
        configured = None if self.configured_args is None else has_arg(self.configured_args, arg)
        return {"configured": configured, "running": has_arg(self.running_args, arg)}

    def boot_persisted(self, desired: Any) -> Any:
        """What the boot unit re-applies: the desired value when the unit is enabled."""
        return desired if self.boot_unit else None


def configured_arguments(cmdline: dict | None) -> tuple[list[str] | None, str | None]:
    """Kernel arguments configured for the next boot: ``(args or None, why unknown)``.

    ``cmdline``: ``bootloader`` (grub or grubby), ``dropin_text`` (the GRUB drop-in as read on the
    node by tuning_info, None when it does not exist, so no argument of ours; ``dropin_error`` says
    why it could not be read) or ``dropin_slurp`` (the slurp result of the GRUB drop-in; "not
    found" means no drop-in), ``grubby`` (the result of ``grubby --info=DEFAULT``). Only this
    collection's drop-in is read on GRUB nodes.
    """
    cmdline = cmdline or {}
    if cmdline.get("bootloader") != "grubby" and "dropin_text" in cmdline:
        return _dropin_arguments(cmdline)
    if cmdline.get("bootloader") == "grubby":
        res = cmdline.get("grubby") or {}
        if res.get("skipped") or not res:
            return None, "grubby is not run on a simulated root"
        if res.get("rc") != 0:
            return None, "grubby --info=DEFAULT failed (rc %s): %s" % (
                res.get("rc"), (res.get("stderr") or res.get("msg") or "").strip()[:200])
        return parse_grubby_info(res.get("stdout")), None
    res = cmdline.get("dropin_slurp") or {}
    if not res or res.get("skipped"):
        return None, "the boot configuration was not read"
    if "content" in res:
        try:
            text = base64.b64decode(res["content"]).decode("utf-8", "replace")
        except (TypeError, ValueError) as exc:
            return None, "the drop-in is not readable: %s" % exc
        return parse_dropin(text)[1], None
    if "not found" in str(res.get("msg", "")).lower():
        return [], None
    return None, str(res.get("msg") or "the drop-in could not be read")


def _dropin_arguments(cmdline):
    """``configured_arguments`` of a drop-in text read on the node (None: no drop-in, so none of ours)."""
    if cmdline.get("dropin_error"):
        return None, "the drop-in could not be read: %s" % cmdline["dropin_error"]
    text = cmdline.get("dropin_text")
    return ([], None) if text is None else (parse_dropin(text)[1], None)


# -- Host and fleet


def kernel_log_section(kernel_log: dict | None, since_info: dict | None = None,
                       fail_classes: Iterable[str] = DEFAULT_FAIL_CLASSES) -> dict:
    """Kernel-log summary: counts per class, which classes fail, samples of every reported class."""
    kl = kernel_log or {}
    counts = {c: int((kl.get("counts") or {}).get(c, 0)) for c in KMSG_CLASSES}
    fail_classes = [c for c in (fail_classes or []) if c in KMSG_CLASSES]
    failing = {c: counts[c] for c in fail_classes if counts[c]}
    since_info = since_info or {}
    records = kl.get("records") or {}
    return {
        "available": bool(kl.get("available")),
        "reason": kl.get("reason"),
        "since": kl.get("since", since_info.get("since", 0.0)),
        "since_source": since_info.get("source", "boot"),
        "since_detail": since_info.get("detail", ""),
        "levels": kl.get("levels") or [],
        "records_total": kl.get("records_total", 0),
        "records_selected": kl.get("records_selected", 0),
        "counts": counts,
        "fail_classes": fail_classes,
        "failing": failing,
        "new_errors": sum(failing.values()),
        "warnings": sum(counts[c] for c in ("lockdown", "module_failure") if c not in fail_classes),
        "xid_codes": kl.get("xid_codes") or {},
        "aer_severities": kl.get("aer_severities") or {},
        "samples": {c: records.get(c) or [] for c in KMSG_CLASSES if records.get(c)},
    }


def count_states(settings: list[dict]) -> dict[str, int]:
    counts = dict.fromkeys(STATES, 0)
    for s in settings:
        counts[s["state"]] += 1
    return counts


def family_counts(settings: list[dict]) -> dict[str, dict[str, int]]:
    out = {}
    for s in settings:
        out.setdefault(s["family"], dict.fromkeys(STATES, 0))[s["state"]] += 1
    return {f: out[f] for f in FAMILIES if f in out}


def _context(facts: dict, context: dict | None) -> Context:
    """The Context of ``evaluate_host``'s ``context`` dict and the running kernel arguments of the facts."""
    c = dict(context or {})
    text = c.get("sysctl_persisted")
    return Context(boot_config=c.get("boot_config"),
                   sysctl_persisted=None if text is None else parse_sysctl_conf(text),
                   boot_unit=c.get("boot_unit"), modules_persisted=c.get("modules_persisted"),
                   root=c.get("root") or "/",
                   running_args=(facts.get("kernel") or {}).get("cmdline_args"),
                   sysctl_overrides=c.get("sysctl_overrides"), boot_unit_state=c.get("boot_unit_state"))


def _node_section(facts: dict, ctx: Context) -> dict:
    """What the report says about the node itself."""
    kernel = facts.get("kernel") or {}
    cpu = facts.get("cpu") or {}
    return {
        "root": ctx.root,
        "os": (facts.get("os") or {}).get("pretty_name"),
        "kernel": kernel.get("release"),
        "cmdline": kernel.get("cmdline"),
        "lockdown": kernel.get("lockdown"),
        "cpu": cpu.get("model"),
        "cpus": cpu.get("online_count"),
        "numa_nodes": cpu.get("numa_nodes"),
        "pci_selected": (facts.get("pci") or {}).get("count"),
        "boot_unit": ctx.boot_unit,
        "boot_unit_state": ctx.boot_unit_state,
        "versions": fitness.versions(facts.get("platform")),
        "warnings": fitness.eol_warnings(facts.get("platform")),
    }


def evaluate_host(facts: dict, desired: dict | None, context: dict | None = None,
                  kernel_log_since: dict | None = None, gpu: dict | None = None, fail_on_pending: bool = False,
                  fail_classes: Iterable[str] = DEFAULT_FAIL_CLASSES, host: str | None = None,
                  verified_at: str | None = None, gate: str = "full") -> dict:
    """Compare ``facts`` (tuning_facts) with ``desired``; return the host's verification result.

    ``desired``: one key per family of the registry (and per setting of a family with several, its
    ``Family.validate`` keys), each optional: absent or null is not part of the desired state; each
    family's ``evaluate`` reads its own. ``gpu``: the GPU probe's answers (flows/verify.gpu_probe).
    ``context``: a dict with ``boot_config`` (see ``configured_arguments``), ``sysctl_persisted``
    (the drop-in text), ``sysctl_overrides``, ``boot_unit`` (bool), ``boot_unit_state``,
    ``modules_persisted`` (names), ``root``.
    ``gate``: which verdict ``gate`` holds, ``full`` (the host's status) or ``runtime`` (see
    ``gate_verdict``); the settings and the host's status are the same either way.
    """
    if gate not in GATES:
        raise VerificationError("gate must be one of: %s (got %r)" % (", ".join(GATES), gate))
    if not isinstance(facts, dict):
        raise VerificationError("facts: expected the tuning_facts dict, got %s" % type(facts).__name__)
    if "tuning_facts" in facts and "kernel" not in facts:
        facts = facts["tuning_facts"]
    desired = desired or {}
    ctx = _context(facts, context)
    ctx.gpu = gpu
    settings = []
    for fam in registry.FAMILIES:
        if fam.evaluate is not None:
            settings += fam.evaluate(facts, desired, ctx)
    exports, sections = family_outputs(facts, desired, ctx)
    mark_runtime(settings, facts)
    mark_boot_unit_failed(settings, ctx.boot_unit_state)

    klog = kernel_log_section(facts.get("kernel_log"), kernel_log_since, fail_classes)
    counts = count_states(settings)
    failures = host_failures(settings, klog, fail_on_pending)
    pending = [s for s in settings if s["state"] == "pending_reboot"]
    result = {
        "host": host,
        "verified_at": verified_at,
        "status": "fail" if failures else "pass",
        "ok": not failures,
        "failures": failures,
        "reboot_required": bool(pending),
        "needs_reboot": needs_reboot(settings),
        "gate": gate_verdict(gate, failures, settings, klog),
        "node": _node_section(facts, ctx),
        "counts": counts,
        "families": family_counts(settings),
        "settings": settings,
        "kernel_log": klog,
        "pending": [s["id"] for s in pending],
        "exports": exports,
        "sections": sections,
    }
    result["junit"] = junit_section(result, fail_on_pending)
    return result


def family_outputs(facts: dict, desired: dict, ctx: Context) -> tuple[dict, list[dict]]:
    """``(exports, sections)``: each family's export documents ``{file name: document}`` and its report
    section ``{family, title, markdown}``, from the registry's ``export`` and ``report`` hooks.

    A family whose hook fails gets a section saying so, and no export; the others are still rendered.
    """
    exports, sections = {}, []
    for fam in registry.FAMILIES:
        title = fam.titles.get(fam.name) or fam.name
        try:
            if fam.export is not None:
                exports.update(fam.export(facts, desired, ctx) or {})
            text = fam.report(facts, desired, ctx) if fam.report is not None else None
        except (EvaluationError, KeyError, TypeError, ValueError, AttributeError) as exc:
            text = "Not rendered: %s: %s" % (type(exc).__name__, exc)
        if text:
            sections.append({"family": fam.name, "title": title, "markdown": text})
    return exports, sections


def _junit_setting_case(host, s, fail_on_pending):
    """One JUnit test case of a setting: drifted fails, not applicable/unsupported skip, pending passes with a note."""
    if s["state"] == "drifted" or (s["state"] == "pending_reboot" and fail_on_pending):
        kind = "failure"
    elif s["state"] in ("not_applicable", "unsupported"):
        kind = "skipped"
    else:
        kind = "pass"
    detail = "desired: %s\nrunning: %s\npersisted: %s" % (
        json.dumps(s["desired"]), json.dumps(s["running"]), json.dumps(s["persisted"]))
    return {"classname": "%s.%s" % (host, s["family"]), "name": s["id"], "kind": kind, "type": s["state"],
            "message": s["state"] + (": %s" % s["reason"] if s["reason"] else ""),
            "detail": detail + ("\nreason: %s" % s["reason"] if s["reason"] else "")}


def _junit_kernel_log_case(host, klog, cls):
    """One JUnit test case per kernel-log class that fails verification (skipped when the log is unreadable)."""
    n = int((klog.get("counts") or {}).get(cls, 0))
    if not klog.get("available"):
        kind, message = "skipped", "kernel log unavailable: %s" % klog.get("reason")
    else:
        kind = "failure" if n else "pass"
        message = "%d new %s record(s) %s" % (n, cls, klog.get("since_detail") or "")
    samples = (klog.get("samples") or {}).get(cls) or []
    return {"classname": "%s.kernel_log" % host, "name": "kernel_log.%s" % cls, "kind": kind, "type": "kernel_log",
            "message": message, "detail": "\n".join(r.get("message", "") for r in samples)}


def junit_section(result: dict, fail_on_pending: bool = False) -> dict:
    """The JUnit classification of a host's result, which verify_junit.xml.j2 only renders.

    ``cases``: one per setting, one per failing kernel-log class, one error case for an error
    result; each ``{classname, name, kind (pass, failure, skipped, error), type, message, detail}``;
    with the ``tests``, ``failures``, ``errors`` and ``skipped`` totals.
    """
    host = result.get("host") or "host"
    cases = [_junit_setting_case(host, s, fail_on_pending) for s in result.get("settings") or []]
    klog = result.get("kernel_log") or {}
    cases += [_junit_kernel_log_case(host, klog, cls) for cls in klog.get("fail_classes") or []]
    if result.get("status") == "error":
        failures = result.get("failures") or []
        cases.append({"classname": "%s.verification" % host, "name": "verification", "kind": "error",
                      "type": "error", "message": "; ".join(failures), "detail": "\n".join(failures)})
    totals = {kind: sum(1 for c in cases if c["kind"] == kind) for kind in ("failure", "error", "skipped")}
    return {"cases": cases, "tests": len(cases), "failures": totals["failure"], "errors": totals["error"],
            "skipped": totals["skipped"]}


def host_failures(settings: list[dict], klog: dict, fail_on_pending: bool = False) -> list[str]:
    """Why a host fails: its drifted settings, new kernel errors, pending settings when asked to."""
    failures = []
    drifted = [s for s in settings if s["state"] == "drifted"]
    if drifted:
        failures.append("%d drifted: %s" % (len(drifted), _by_family(drifted)))
    if klog["new_errors"]:
        failures.append("kernel log: %s %s" % (
            ", ".join("%d %s" % (n, c) for c, n in klog["failing"].items()), klog["since_detail"] or "since boot"))
    pending = [s for s in settings if s["state"] == "pending_reboot"]
    if pending and fail_on_pending:
        failures.append("%d pending a reboot (gpunode_tuning_verify_fail_on_pending): %s"
                        % (len(pending), _by_family(pending)))
    return failures


def mark_runtime(settings: list[dict], facts: dict) -> list[dict]:
    """Set each setting's ``runtime``: whether runtime tuning can bring it (True) or not (False).

    Only a reboot brings the report families of ``Family.reboot_only`` (kernel arguments); within a family
    its ``Family.runtime`` decides row by row (the cpufreq driver switch); every other row is runtime work.
    """
    rows_of: dict = {}
    for s in settings:
        rows_of.setdefault(s["family"], []).append(s)
    for report, rows in rows_of.items():
        fam = all_families.of_report(report)
        for s in rows:
            if report in REBOOT_ONLY_FAMILIES:
                s["runtime"] = False
            elif fam is not None and fam.runtime is not None:
                s["runtime"] = bool(fam.runtime(s, facts, rows))
            else:
                s["runtime"] = True
    return settings


def health_findings(result: dict) -> list:
    """What makes a host unhealthy for a rollout gate: ``"<row id>: <reason>"`` of each row of a health family
    (``Family.health``) that fails (drifted) or needs a GPU reset or reboot first (pending_reboot)."""
    if not isinstance(result, dict):
        raise VerificationError("health_findings: expected a verification result (dict), got %s"
                                % type(result).__name__)
    return ["%s: %s" % (s["id"], s.get("reason") or s["state"]) for s in result.get("settings") or []
            if s.get("family") in HEALTH_FAMILIES and s.get("state") in ("drifted", "pending_reboot")]


def parse_unit_state(unit: str, text: str | None) -> dict:
    """``systemctl show --property=ActiveState,SubState,Result,ExecMainStatus`` as ``{unit, known, failed, ...}``.

    ``failed``: the unit is in the failed state or its last run did not succeed (a oneshot whose
    ExecStart exited non-zero is ``ActiveState=failed``, ``Result=exit-code``).
    """
    props = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    active, result = props.get("ActiveState"), props.get("Result")
    if not active:
        return {"unit": unit, "known": False, "reason": "systemctl show printed no ActiveState"}
    return {"unit": unit, "known": True, "active_state": active, "sub_state": props.get("SubState"),
            "result": result, "exec_main_status": props.get("ExecMainStatus"),
            "failed": active == "failed" or result not in (None, "", "success")}


# Report families that the boot unit brings back at boot (the registry's boot functions).
BOOT_REPORT_FAMILIES = tuple(all_families.boot_report_families())


def mark_boot_unit_failed(settings: list[dict], unit_state: dict | None) -> list[dict]:
    """Name the failed boot unit as the cause of each drifted setting it would have brought back at boot."""
    if not (unit_state or {}).get("failed"):
        return settings
    why = "the boot unit %s failed at boot (%s, result %s, exit status %s)" % (
        unit_state["unit"], unit_state.get("active_state"), unit_state.get("result"),
        unit_state.get("exec_main_status"))
    for s in settings:
        if s["state"] == "drifted" and s["family"] in BOOT_REPORT_FAMILIES and s.get("runtime", True) \
                and "cause" not in s:
            s["cause"] = {"kind": "boot_unit_failed", "unit": unit_state["unit"], "result": unit_state.get("result")}
            s["reason"] = "; ".join(r for r in (s["reason"], why) if r)
    return settings


def needs_reboot(settings: list[dict]) -> list[str]:
    """One line per setting not in effect that only the persistent flow and a reboot bring."""
    out = []
    for s in settings:
        if s.get("runtime", True) or s["state"] not in ("drifted", "pending_reboot"):
            continue
        running = "%s runs" % s["running"] if s["running"] not in (None, "") else "not in effect"
        how = "configured, a reboot applies it" if s["state"] == "pending_reboot" \
            else "needs the persistent flow and a reboot"
        out.append("%s %s: %s wanted, %s (%s)" % (s["family"], s["name"], s["desired"], running, how))
    return out


def gate_verdict(gate: str, failures: list[str], settings: list[dict], klog: dict) -> dict:
    """The verdict a gate judges by: ``{name, status, ok, failures}``.

    ``full`` is the host's own verdict. ``runtime`` (the runtime rollout's gate) judges what runtime
    tuning can apply: settings only a reboot brings (``needs_reboot``) and settings pending a
    reboot do not fail it; drifted runtime settings and new kernel errors do.
    """
    if gate == "runtime":
        failures = host_failures([s for s in settings if s.get("runtime", True)], klog)
    return {"name": gate, "status": "fail" if failures else "pass", "ok": not failures, "failures": failures}


def _by_family(settings, most=3):
    """``pcie_mrrs (8), cpufreq driver, governor``: names per family, a count when there are many."""
    groups = {}
    for s in settings:
        groups.setdefault(s["family"], []).append(s["name"])
    parts = []
    for family, names in groups.items():
        parts.append("%s (%d)" % (family, len(names)) if len(names) > most
                     else "%s %s" % (family, ", ".join(names)))
    return "; ".join(parts)


def error_result(host: str | None, message: str, verified_at: str | None = None, gate: str = "full") -> dict:
    """The result of a host whose facts could not be gathered (the verify tasks rescued the error)."""
    failures = ["verification could not run: %s" % message]
    result = {
        "host": host,
        "verified_at": verified_at,
        "status": "error",
        "ok": False,
        "failures": failures,
        "reboot_required": False,
        "needs_reboot": [],
        "gate": {"name": gate, "status": "error", "ok": False, "failures": failures},
        "node": {},
        "counts": dict.fromkeys(STATES, 0),
        "families": {},
        "settings": [],
        "kernel_log": kernel_log_section({}, {}, ()),
        "pending": [],
        "exports": {},
        "sections": [],
    }
    result["junit"] = junit_section(result)
    return result


def fleet_summary(results: dict, hosts: list[str] | None = None, generated_at: str | None = None) -> dict:
    """Hosts x knob families from per-host results.

    ``results``: host -> result (or None when the host has none: unreachable, or failed before
    it was evaluated). ``hosts``: the order (default: sorted names). Failing hosts come first,
    most drifted settings first.
    """
    results = dict(results or {})
    names = list(hosts) if hosts else sorted(results)
    rows = []
    totals = dict.fromkeys(STATES, 0)
    families_seen = set()
    for name in names:
        res = results.get(name)
        if not isinstance(res, dict) or "status" not in res:
            rows.append({"host": name, "status": "missing", "ok": False, "counts": dict.fromkeys(STATES, 0),
                         "families": {}, "failures": ["no verification result (unreachable, or failed before "
                                                      "evaluation)"], "kmsg_new_errors": 0,
                         "reboot_required": False})
            continue
        for st, n in (res.get("counts") or {}).items():
            totals[st] = totals.get(st, 0) + n
        families_seen.update((res.get("families") or {}).keys())
        rows.append({
            "host": name,
            "status": res["status"],
            "ok": bool(res.get("ok")),
            "counts": res.get("counts") or dict.fromkeys(STATES, 0),
            "families": res.get("families") or {},
            "failures": res.get("failures") or [],
            "kmsg_new_errors": (res.get("kernel_log") or {}).get("new_errors", 0),
            "reboot_required": bool(res.get("reboot_required")),
            "versions": (res.get("node") or {}).get("versions") or {},
            "warnings": (res.get("node") or {}).get("warnings") or [],
            "unfit": ["%s: %s" % (x["id"], x.get("reason")) for x in res.get("settings") or [] if x.get("fit")],
        })
    order = {"error": 0, "missing": 0, "fail": 1, "pass": 2}
    failing = sorted((r for r in rows if not r["ok"]),
                     key=lambda r: (order.get(r["status"], 0), -r["counts"].get("drifted", 0),
                                    -r["kmsg_new_errors"], r["host"]))
    families = [f for f in FAMILIES if f in families_seen]
    cells = {}
    for r in rows:
        cells[r["host"]] = {f: _cell(r["families"].get(f)) for f in families}
    return {
        "versions": fleet_versions(rows),
        "unfit": [{"host": r["host"], "why": r["unfit"]} for r in rows if r.get("unfit")],
        "warnings": [{"host": r["host"], "why": r["warnings"]} for r in rows if r.get("warnings")],
        "generated_at": generated_at,
        "hosts": len(rows),
        "passed": sum(1 for r in rows if r["ok"]),
        "failed": len(failing),
        "pending_reboot_hosts": [r["host"] for r in rows if r["reboot_required"]],
        "totals": totals,
        "families": families,
        "family_titles": {f: FAMILY_TITLES[f] for f in families},
        "rows": rows,
        "cells": cells,
        "failing": failing,
    }


VERSION_KINDS = (("kernel", "Kernel"), ("nvidia_driver", "NVIDIA driver"), ("amd_driver", "AMD driver"))


def fleet_versions(rows: list) -> list:
    """The fleet's versions: ``[{what, version, flavor, hosts, unfit}]`` per kernel release and driver version
    (NVIDIA with its flavour), ``unfit`` the hosts of that version below a floor or unable to take a setting."""
    groups = {}
    for r in rows:
        v = r.get("versions") or {}
        for key, title in VERSION_KINDS:
            if not v.get(key):
                continue
            flavor = v.get("nvidia_flavor") if key == "nvidia_driver" else None
            entry = groups.setdefault((title, v[key], flavor), {"what": title, "version": v[key], "flavor": flavor,
                                                                "hosts": [], "unfit": []})
            entry["hosts"].append(r["host"])
            if r.get("unfit"):
                entry["unfit"].append(r["host"])
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], str(k[1]), str(k[2])))]


def _cell(counts):
    """A compact table cell: ``8 ok``, ``1 drifted / 7 ok``, ``n/a``."""
    if not counts:
        return "-"
    parts = []
    for st, label in (("drifted", "drifted"), ("pending_reboot", "pending"), ("unsupported", "unsupported"),
                      ("applied", "ok"), ("not_applicable", "n/a")):
        n = counts.get(st, 0)
        if n:
            parts.append(label if (label == "n/a" and len(parts) == 0 and n == sum(counts.values()))
                         else "%d %s" % (n, label))
    return " / ".join(parts) if parts else "-"
