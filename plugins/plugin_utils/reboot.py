# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet reboot's decisions (issue 30): its settings, the drain backend's node states, the budget.

Pure functions, no I/O, controller side: the playbooks run the commands (``sinfo``, ``scontrol``) and hand
their output here; what comes back is a decision the playbook acts on.

- Settings: ``reboot_settings`` checks ``gpunode_tuning_reboot_max_unavailable`` (a host count or a share of the
  play's hosts), the three timeouts and ``gpunode_tuning_drain`` (no silent default once ``reboot_ok`` is set).
- Slurm: ``parse_sinfo`` (``sinfo -N -h -o "%N|%T|%E"``) and ``parse_scontrol_nodes`` (``scontrol show node``,
  one line per node with ``-o`` or a block of lines without) give each node its state, flags, reason, whether
  it is out of service and whether the drain is ours (a reason starting ``gpunode.tuning:``). The states and
  their suffixes are sinfo(1)'s NODE STATE CODES; tests/data/real/slurm-* are the captures they are tested on.
- Budget: ``reboot_plan`` says which hosts may be drained and rebooted now, which wait for a slot, which
  continue (already drained by us) and which are left alone (out of service for someone else), counting
  every host of the run that is out of service, for any reason, against ``max_unavailable``.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable
from typing import Any

DRAIN_BACKENDS = ("none", "slurm", "kubernetes", "command")
# How a later run recognises the drains of this collection (Slurm's reason, the command backend's records).
OUR_REASON_PREFIX = "gpunode.tuning:"
DEFAULTS = {"max_unavailable": 1, "reboot_timeout": 1800, "wait_timeout": 3600, "drain_timeout": 3600,
            "claim_lease": 3600, "budget_scope": "fleet"}
TIMEOUT_VARIABLES = {"reboot_timeout": "gpunode_tuning_reboot_timeout",
                     "wait_timeout": "gpunode_tuning_reboot_wait_timeout",
                     "drain_timeout": "gpunode_tuning_drain_timeout",
                     "claim_lease": "gpunode_tuning_reboot_claim_lease"}
# gpunode_tuning_reboot_budget_scope: "run" counts the run's hosts, "fleet" every node of the backend's fleet.
BUDGET_SCOPES = ("run", "fleet")
# A timeout longer than this is a unit mistake (milliseconds), not a wait anyone means: 31 days.
MAX_TIMEOUT = 31 * 86400
MAX_UNAVAILABLE_ALLOWED = ("a host count of 1 or more, or a share of the play's hosts from 1% to 100% (\"10%\": "
                           "rounded down, at least 1 host)")
# Slurm reasons reach scontrol's command line: printable text of a sane length.
MAX_REASON = 200

_INTEGER = re.compile(r"^\s*[0-9]+\s*$")
_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")
_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}

# --- settings ----------------------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    return repr(value) if not isinstance(value, str) else '"%s"' % value


def max_unavailable_count(value: Any, hosts: int) -> tuple[int | None, str | None]:
    """``(hosts allowed out of service at once, None)`` or ``(None, problem)``: gpunode_tuning_reboot_max_unavailable.

    ``hosts``: the play's hosts. A share is of them, rounded down, and never below 1 host; a count above
    ``hosts`` is allowed (the budget then never binds). 0, a negative number, 0% or over 100%, a fraction of
    a host, a boolean or text that is neither is refused.
    """
    problem = "gpunode_tuning_reboot_max_unavailable must be %s (got %s)" % (MAX_UNAVAILABLE_ALLOWED, _shown(value))
    if isinstance(value, bool) or value is None:
        return None, problem
    if isinstance(value, int) or (isinstance(value, str) and _INTEGER.match(value)):
        count = int(value)
        return (count, None) if count >= 1 else (None, problem)
    match = _PERCENT.match(value) if isinstance(value, str) else None
    if not match or not 0 < float(match.group(1)) <= 100:
        return None, problem
    return max(1, math.floor(max(hosts, 0) * float(match.group(1)) / 100)), None


def timeout_seconds(name: str, value: Any, default: int) -> tuple[int | None, str | None]:
    """``(seconds, None)`` or ``(None, problem)``: whole seconds from 1 to MAX_TIMEOUT (None: ``default``)."""
    if value is None:
        return default, None
    if not isinstance(value, bool) and (isinstance(value, int) or (isinstance(value, str) and _INTEGER.match(value))):
        seconds = int(value)
        if 1 <= seconds <= MAX_TIMEOUT:
            return seconds, None
    return None, "%s must be a whole number of seconds from 1 to %d (31 days) (got %s)" % (name, MAX_TIMEOUT,
                                                                                           _shown(value))


def _reboot_ok(value: Any) -> tuple[bool | None, str | None]:
    if isinstance(value, bool):
        return value, None
    parsed = _BOOLS.get(str(value).strip().lower()) if value is not None else False
    if parsed is None:
        return None, "gpunode_tuning_reboot_ok must be true or false (got %s)" % _shown(value)
    return parsed, None


def drain_backend(value: Any, reboot_ok: bool) -> tuple[str | None, str | None]:
    """``(backend, None)`` or ``(None, problem)``: gpunode_tuning_drain, required (no default) once reboot_ok is set."""
    if value is None or (isinstance(value, str) and not value.strip()):
        if reboot_ok:
            return None, ("gpunode_tuning_reboot_ok is true, so gpunode_tuning_drain must say how hosts leave service "
                          "before they reboot: one of %s (none reboots without draining, and must be chosen "
                          "explicitly)" % ", ".join(DRAIN_BACKENDS))
        return None, None
    if isinstance(value, str) and value.strip() in DRAIN_BACKENDS:
        return value.strip(), None
    return None, "gpunode_tuning_drain must be one of %s (got %s)" % (", ".join(DRAIN_BACKENDS), _shown(value))


def reboot_settings(raw: dict, hosts: int) -> tuple[dict, list[str]]:
    """``(settings, errors)`` from the reboot variables without their prefix (``max_unavailable``, ``reboot_timeout``,
    ``wait_timeout``, ``drain_timeout``, ``drain``, ``reboot_ok``; None or absent: the default).

    ``hosts``: the play's hosts (for a share). Every error names the variable, what it got and what is allowed;
    the settings mean something only when there is none. One value per run: the caller passes the run's.
    """
    errors = []
    out: dict = {}
    out["reboot_ok"], problem = _reboot_ok(raw.get("reboot_ok"))
    errors += [problem] if problem else []
    raw_budget = raw.get("max_unavailable")
    out["max_unavailable"], problem = max_unavailable_count(
        DEFAULTS["max_unavailable"] if raw_budget is None else raw_budget, hosts)
    errors += [problem] if problem else []
    out["max_unavailable_given"] = DEFAULTS["max_unavailable"] if raw_budget is None else raw_budget
    for key, name in TIMEOUT_VARIABLES.items():
        out[key], problem = timeout_seconds(name, raw.get(key), DEFAULTS[key])
        errors += [problem] if problem else []
    out["drain"], problem = drain_backend(raw.get("drain"), bool(out["reboot_ok"]))
    errors += [problem] if problem else []
    scope = raw.get("budget_scope")
    scope = DEFAULTS["budget_scope"] if scope is None else scope
    if scope not in BUDGET_SCOPES:
        errors.append("gpunode_tuning_reboot_budget_scope must be one of %s (got %s)" % (", ".join(BUDGET_SCOPES),
                                                                                         _shown(scope)))
    out["budget_scope"] = scope
    return out, errors


COMMAND_VARIABLES = ("gpunode_tuning_drain_command", "gpunode_tuning_drain_check_command",
                     "gpunode_tuning_undrain_command", "gpunode_tuning_drain_fleet_command")
FLEET_LIST_VARIABLES = ("gpunode_tuning_drain_slurm_fleet_partitions",)
POLL_RANGE = (0.1, 300.0)
# A Slurm node name reaches scontrol's argv: a hostname-like word, never an option.
_SLURM_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def command_argv(value: Any) -> list | None:
    """The argv of a command variable (a string, split as a shell would but run without one, or a list of
    strings); None when it is not one."""
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError:
            return None
    elif isinstance(value, (list, tuple)) and all(isinstance(a, str) for a in value):
        argv = list(value)
    else:
        return None
    if not argv or any(not a or "\0" in a or "\n" in a for a in argv):
        return None
    return argv


def slurm_node_name(host: str, given: Any = None) -> str:
    """The host's Slurm node: ``given``, else the inventory name up to its first dot."""
    return str(given) if given else str(host).split(".", 1)[0]


def role_problems(values: dict) -> list[str]:
    """The precheck's lines for the reboot variables (role variable names, with prefix), [] when all is well.

    The budget's share is judged against one host here (whether it is a valid value); the run counts it
    against the play's hosts.
    """
    raw = {"reboot_ok": values.get("gpunode_tuning_reboot_ok"), "drain": values.get("gpunode_tuning_drain"),
           "max_unavailable": values.get("gpunode_tuning_reboot_max_unavailable"),
           "budget_scope": values.get("gpunode_tuning_reboot_budget_scope")}
    raw.update({key: values.get(name) for key, name in TIMEOUT_VARIABLES.items()})
    got, errors = reboot_settings(raw, 1)
    for name in FLEET_LIST_VARIABLES:
        given = values.get(name)
        if given is not None and not (isinstance(given, list) and given
                                      and all(isinstance(p, str) and _SLURM_NODE.match(p) for p in given)):
            errors.append("%s must be a non-empty list of Slurm partition names (letters, digits, '.', '_', '-') "
                          "(got %s)" % (name, _shown(given)))
    selector = values.get("gpunode_tuning_drain_kubernetes_fleet_selector")
    if selector is not None and not (isinstance(selector, str) and selector.strip() and "\n" not in selector):
        errors.append("gpunode_tuning_drain_kubernetes_fleet_selector must be a Kubernetes label selector, one line "
                      "(\"gpunode.tuning/fleet=a100\") (got %s)" % _shown(selector))
    if got.get("reboot_ok") and got.get("drain") == "command":
        for name in ("gpunode_tuning_drain_command", "gpunode_tuning_drain_check_command",
                     "gpunode_tuning_undrain_command"):
            if values.get(name) is None:
                errors.append("gpunode_tuning_drain is command, so %s must be set (a command string or an argv "
                              "list)" % name)
    for name in COMMAND_VARIABLES:
        if values.get(name) is not None and command_argv(values[name]) is None:
            errors.append("%s must be a command string or a non-empty list of non-empty argument strings without "
                          "line breaks (got %s)" % (name, _shown(values[name])))
    poll = values.get("gpunode_tuning_reboot_poll_interval")
    if poll is not None and (isinstance(poll, bool) or not isinstance(poll, (int, float))
                             or not POLL_RANGE[0] <= float(poll) <= POLL_RANGE[1]):
        errors.append("gpunode_tuning_reboot_poll_interval must be a number of seconds from %s to %s (got %s)"
                      % (POLL_RANGE[0], POLL_RANGE[1], _shown(poll)))
    node = values.get("gpunode_tuning_drain_slurm_node")
    if node is not None and not (isinstance(node, str) and _SLURM_NODE.match(node)):
        errors.append("gpunode_tuning_drain_slurm_node must be a Slurm node name (letters, digits, '.', '_', '-', "
                      "not starting with '-') (got %s)" % _shown(node))
    return errors


# --- Slurm's node states -----------------------------------------------------------------------------------

# sinfo(1) NODE STATE CODES: the suffix of a %T / %t state, as the flag scontrol shows for it.
SUFFIX_FLAGS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "!": "POWER_DOWN",
                "%": "POWERING_DOWN", "$": "MAINT", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED", "-": "PLANNED"}
# sinfo's short (%t) and long (%T) names, and scontrol's, as one upper-case name.
STATE_NAMES = {"alloc": "ALLOCATED", "comp": "COMPLETING", "drain": "DRAINED", "drng": "DRAINING",
               "failg": "FAILING", "futr": "FUTURE", "mix": "MIXED", "npc": "PERFCTRS", "plnd": "PLANNED",
               "pow_dn": "POWER_DOWN", "pow_up": "POWERING_UP", "resv": "RESERVED", "unk": "UNKNOWN",
               "boot": "REBOOT", "maintenance": "MAINT"}
# scontrol's flags as the names above: it spells MAINT out.
FLAG_NAMES = {"MAINTENANCE": "MAINT"}
# What each name implies as a flag (sinfo folds the DRAIN and FAIL flags into the state's name).
IMPLIED_FLAGS = {"DRAINED": ("DRAIN",), "DRAINING": ("DRAIN",), "FAIL": ("FAIL",), "FAILING": ("FAIL",),
                 "MAINT": ("MAINT",)}
# Out of service (issue 30): DRAIN, DRAINING, DOWN, FAIL, MAINT, REBOOT_* and NOT_RESPONDING; and INVAL (registered
# with fewer resources than configured) and UNKNOWN (not yet known to be up): neither can be counted on for work.
OUT_OF_SERVICE_STATES = frozenset({"DOWN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT", "REBOOT",
                                   "REBOOT_ISSUED", "REBOOT_REQUESTED", "INVAL", "UNKNOWN"})
OUT_OF_SERVICE_FLAGS = frozenset({"DRAIN", "FAIL", "MAINT", "NOT_RESPONDING", "REBOOT_ISSUED", "REBOOT_REQUESTED"})


def _canonical(name: str) -> str:
    low = name.strip().lower()
    return STATE_NAMES.get(low, low.upper())


def _split_suffixes(word: str) -> tuple[str, list[str]]:
    """``("down", ["NOT_RESPONDING"])`` from ``down*``: the name and the flags of its suffix characters."""
    flags = []
    while word and word[-1] in SUFFIX_FLAGS:
        flags.append(SUFFIX_FLAGS[word[-1]])
        word = word[:-1]
    return word, flags


def slurm_state(token: str) -> dict:
    """``{"state", "flags", "out_of_service"}`` of one state as sinfo (``drng@``, ``down*``, ``reboot^``) or scontrol
    (``MIXED+DRAIN+REBOOT_REQUESTED``, ``REBOOT*+DRAIN``) prints it; ``flags`` sorted, upper case, MAINTENANCE as
    MAINT."""
    parts = token.strip().split("+")
    if len(parts) > 1 and not parts[-1]:  # sinfo's ALLOCATED+: allocated, and jobs completing
        parts = parts[:-1] + ["COMPLETING"]
    base, flags = _split_suffixes(parts[0]) if parts else ("", [])
    state = _canonical(base) if base else "UNKNOWN"
    for part in parts[1:]:
        name, more = _split_suffixes(part)
        flags += [FLAG_NAMES.get(name.upper(), name.upper())] + more if name else more
    flags += list(IMPLIED_FLAGS.get(state, ()))
    flags = sorted(set(flags))
    out = state in OUT_OF_SERVICE_STATES or bool(OUT_OF_SERVICE_FLAGS.intersection(flags))
    return {"state": state, "flags": flags, "out_of_service": out}


def is_our_reason(reason: Any) -> bool:
    """Whether a drain reason is one this collection set (it starts ``gpunode.tuning:``)."""
    return isinstance(reason, str) and reason.strip().startswith(OUR_REASON_PREFIX)


def _node_record(state_token: str, reason: str) -> dict:
    record = slurm_state(state_token)
    record["reason"] = reason
    record["ours"] = is_our_reason(reason) and record["out_of_service"]
    return record


def parse_sinfo(text: str, separator: str = "|") -> dict:
    """``{node: {"state", "flags", "reason", "out_of_service", "ours"}}`` from ``sinfo -N -h -o "%N|%T|%E"``.

    A node listed once per partition keeps its first line (the states are the node's, not the partition's);
    sinfo's reason ``none`` is "". Lines without a state are skipped.
    """
    out: dict = {}
    for line in text.splitlines():
        fields = line.split(separator, 2)
        if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
            continue
        reason = fields[2].strip() if len(fields) > 2 else ""
        out.setdefault(fields[0].strip(), _node_record(fields[1], "" if reason == "none" else reason))
    return out


# scontrol's fields: a word of letters at the start or after white space, then "=". A value runs to the next one
# or the end of its line (OS= holds spaces). Reason is cut out first: it is free text.
_FIELD = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_]*)=")
_REASON = re.compile(r"(?:(?<=\s)|^)Reason=")
# What scontrol appends to a reason: [user@time].
_REASON_STAMP = re.compile(r"\s\[[^\]\n@]*@[^\]\n]*\]")
# Fields scontrol may print after Reason on its line (25.11: ReservationName; a node comment).
_AFTER_REASON = re.compile(r"\s(?:Comment|Extra|ReservationName|InstanceId|InstanceType|Topology)=")


def _take_reason(record: str) -> tuple[str, str]:
    """``(reason without its [user@time], the record without the Reason field)``."""
    match = _REASON.search(record)
    if not match:
        return "", record
    line_end = record.find("\n", match.end())
    line_end = len(record) if line_end < 0 else line_end
    stamp = _REASON_STAMP.search(record, match.end(), line_end)
    after = _AFTER_REASON.search(record, match.end(), line_end)
    end = stamp.start() if stamp else after.start() if after else line_end
    resume = stamp.end() if stamp else end
    return record[match.end():end].strip(), record[:match.start()] + record[resume:]


def scontrol_fields(record: str) -> dict:
    """``{field: value}`` of one node's ``scontrol show node`` record (either layout); ``Reason`` without its stamp."""
    reason, rest = _take_reason(record)
    matches = list(_FIELD.finditer(rest))
    fields = {}
    for match, nxt in zip(matches, matches[1:] + [None], strict=True):
        value = rest[match.end():nxt.start() if nxt else len(rest)]
        fields.setdefault(match.group(1), value.split("\n")[0].strip())
    if reason:
        fields["Reason"] = reason
    return fields


def parse_scontrol_nodes(text: str) -> dict:
    """``{node: {"state", "flags", "reason", "out_of_service", "ours", "boot_time", "slurmd_start_time"}}`` from
    ``scontrol show node`` (``-o``: one line per node; without it, a ``NodeName=`` line and indented lines)."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("NodeName="):
            records.append([line])
        elif records and line.strip():
            records[-1].append(line)
    out = {}
    for lines in records:
        fields = scontrol_fields("\n".join(lines))
        record = _node_record(fields.get("State", ""), fields.get("Reason", ""))
        record.update(boot_time=fields.get("BootTime"), slurmd_start_time=fields.get("SlurmdStartTime"))
        out[fields["NodeName"]] = record
    return out


def drain_reason(pending: Iterable[str]) -> str:
    """The reason this collection drains a node with: ``gpunode.tuning: reboot for ARG ARG`` (what the reboot applies).

    Printable text only (it reaches scontrol's command line), cut to MAX_REASON characters.
    """
    what = " ".join(str(p) for p in pending if str(p).strip()) or "pending changes"
    text = "%s reboot for %s" % (OUR_REASON_PREFIX, what)
    text = "".join(c if c.isprintable() else " " for c in text)
    return " ".join(text.split())[:MAX_REASON]


# --- the claim (issue 42) -----------------------------------------------------------------------------------

# The claim at the end of our reasons: the run (ansible-playbook's pid and start), the controller, the run's start
# (the controller's clock: shown, never compared) and the lease in seconds. Whether it is live is judged by the
# scheduler's clock alone: the time slurmctld stamped on the reason (renewed by the live run) against its now.
_CLAIM = re.compile(r"\s*\{claim run=([A-Za-z0-9._-]{1,40}) ctl=([A-Za-z0-9._-]{1,60}) start=([0-9]{1,12}) "
                    r"lease=([0-9]{1,9})\}\s*$")
_NAME = re.compile(r"[^A-Za-z0-9._-]")


def claim_of(run: str, controller: str, start: float, lease: int) -> dict:
    """This run's claim: ``{"run", "ctl", "start", "lease"}`` (the names cut to what a reason carries)."""
    return {"run": _NAME.sub("_", str(run))[:40], "ctl": _NAME.sub("_", str(controller))[:60] or "controller",
            "start": int(start), "lease": int(lease)}


def claim_mark(claim: dict) -> str:
    return "{claim run=%s ctl=%s start=%d lease=%d}" % (claim["run"], claim["ctl"], claim["start"], claim["lease"])


def claimed_reason(reason: str, claim: dict | None) -> str:
    """``reason`` (cut to fit) with the claim's mark at its end; without a claim, ``reason`` as it is."""
    if not claim:
        return reason[:MAX_REASON]
    mark = claim_mark(claim)
    return "%s %s" % (strip_claim(reason)[:max(MAX_REASON - len(mark) - 1, 20)].rstrip(), mark)


def parse_claim(reason: Any) -> dict | None:
    """The claim at the end of one of our reasons, or None."""
    if not is_our_reason(reason):
        return None
    match = _CLAIM.search(reason)
    if not match:
        return None
    return {"run": match.group(1), "ctl": match.group(2), "start": int(match.group(3)), "lease": int(match.group(4))}


_CLAIM_LINE = re.compile(r"^claim:\s*(\{claim [^{}]*\})(?:\s+age=(-?[0-9]{1,12}))?\s*$")


def parse_claim_line(text: Any) -> tuple:
    """``(claim, age)`` from the command backend's check output: its last line ``claim: {claim run=... ctl=...
    start=... lease=...} age=<s>`` (the age since the user's scheduler stamped the drain or its renewal; None when
    left out). ``(None, None)`` without such a line; ValueError for a ``claim:`` line that is not one."""
    found = None
    for line in str(text or "").splitlines():
        if line.strip().startswith("claim:"):
            found = line.strip()
    if found is None:
        return None, None
    match = _CLAIM_LINE.match(found)
    claim = _CLAIM.fullmatch(match.group(1)) if match else None
    if claim is None or (match.group(2) is not None and int(match.group(2)) < 0):
        raise ValueError("the check command printed %r; a claim line is "
                         "'claim: {claim run=<run> ctl=<controller> start=<epoch> lease=<s>} age=<s>'" % found[:200])
    return ({"run": claim.group(1), "ctl": claim.group(2), "start": int(claim.group(3)), "lease": int(claim.group(4))},
            None if match.group(2) is None else int(match.group(2)))


def strip_claim(reason: str) -> str:
    return _CLAIM.sub("", reason or "")


def same_claim(a: dict | None, b: dict | None) -> bool:
    return bool(a and b and a["run"] == b["run"] and a["ctl"] == b["ctl"])


def claim_live(claim: dict, stamped: int | None, now: int | None) -> bool:
    """Whether another run's claim still holds: the scheduler's now is within the claim's lease of the time the
    scheduler stamped on the reason. Without either time it holds (never taken on a guess)."""
    if stamped is None or now is None:
        return True
    return now - stamped <= claim["lease"]


def claim_text(claim: dict, stamped: int | None, now: int | None) -> str:
    age = "renewed %d s ago" % (now - stamped) if stamped is not None and now is not None else "renewal time unknown"
    return "claimed by the live run %s on %s (%s, lease %d s)" % (claim["run"], claim["ctl"], age, claim["lease"])


def parse_sinfo_stamped(text: str) -> dict:
    """``{node: {..., "reason_time": epoch or None, "partitions": [names]}}`` from
    ``SLURM_TIME_FORMAT=%s sinfo -N -h -o "%N|%T|%H|%P|%E"`` (a node listed once per partition; %H the time
    slurmctld stamped on the reason, in seconds since the epoch; the default partition's ``*`` cut off)."""
    out: dict = {}
    for line in text.splitlines():
        fields = line.split("|", 4)
        if len(fields) < 5 or not fields[0].strip() or not fields[1].strip():
            continue
        name, reason = fields[0].strip(), fields[4].strip()
        record = out.get(name)
        if record is None:
            record = _node_record(fields[1], "" if reason == "none" else reason)
            stamp = fields[2].strip()
            record["reason_time"] = int(stamp) if stamp.isdigit() else None
            record["partitions"] = []
            out[name] = record
        part = fields[3].strip().rstrip("*")
        if part and part not in record["partitions"]:
            record["partitions"].append(part)
    return out


_SDIAG_AT = re.compile(r"^sdiag output at .*\(([0-9]+)\)\s*$", re.M)


def parse_sdiag_time(text: str) -> int | None:
    """slurmctld's clock from sdiag's first line (``sdiag output at <time> (<epoch>)``: the controller's answer
    carries its own time), or None."""
    match = _SDIAG_AT.search(text or "")
    return int(match.group(1)) if match else None


def slurm_hosts(nodes: dict, node_of: dict) -> dict:
    """Each host's Slurm node read: ``{"out_of_service": [hosts], "ours": [hosts], "missing": [hosts], "why": {host:
    "drained: reason"}}`` from parsed nodes and ``{host: Slurm node name}``. A host whose node Slurm does not list
    is ``missing``, and counted out of service: nothing says it can take work."""
    out: dict = {"out_of_service": [], "ours": [], "missing": [], "why": {}}
    for host, name in node_of.items():
        node = nodes.get(name)
        if node is None:
            out["missing"].append(host)
            out["out_of_service"].append(host)
            out["why"][host] = "Slurm lists no node %s" % name
            continue
        if node["out_of_service"]:
            out["out_of_service"].append(host)
            out["why"][host] = "%s%s" % (node["state"].lower(), ": " + node["reason"] if node["reason"] else "")
        if node["ours"]:
            out["ours"].append(host)
    return out


# --- the budget ----------------------------------------------------------------------------------------------


def reboot_plan(hosts: Iterable[str], out_of_service: Iterable[str], ours: Iterable[str], want: Iterable[str],  # noqa: PLR0913
                max_unavailable: int, halted: str | None = None, claimed: dict | None = None,
                fleet_out: dict | None = None) -> dict:
    """Which hosts of the run may be drained and rebooted now, and why the others may not.

    ``hosts``: the run's hosts in rollout order (earlier hosts get the free slots first). ``out_of_service``: those
    out of service now for any reason (drained or down in the scheduler, cordoned, not Ready, unreachable,
    ours included). ``ours``: those out of service by this collection (its drain reason, annotation or record).
    ``want``: those that need a reboot. ``halted``: why no further host may reboot (a host that did not come
    back, a wait that timed out), or None.

    Returns ``start`` (drain and reboot now, within ``max_unavailable``), ``continue`` (drained by us already:
    their reboot goes on, in the slot they hold), ``wait`` (no free slot now, or halted), ``skip`` (out of
    service by someone else: never drained, rebooted or resumed by us; a host ``claimed`` by another live run
    ``{host: why}`` waits instead), ``fleet_out`` (``{node: why}``, the fleet scope: nodes out of service that are
    not hosts of the run, each holding a slot), ``resume`` (drained by us but needing
    no reboot any more: returned to service after the gate), ``unavailable`` (every host of the run out of
    service), ``free`` (slots left) and ``why`` ({host: reason} for every host not started).
    """
    order = list(dict.fromkeys(hosts))
    members, unavailable = set(order), set(out_of_service)
    down = [h for h in order if h in unavailable]
    claimed = dict(claimed or {})
    fleet_out = dict(fleet_out or {})
    mine, needs = (set(ours) & set(down)) - set(claimed), set(want) & members
    plan: dict = {"start": [], "continue": [], "wait": [], "skip": [], "unavailable": down,
                  "resume": [h for h in order if h in mine and h not in needs], "why": {}}
    free = max(int(max_unavailable) - len(down) - len(fleet_out), 0)
    for host in (h for h in order if h in needs):
        if host in mine:
            plan["continue"].append(host)
        elif host in claimed:
            plan["wait"].append(host)
            plan["why"][host] = "waiting: %s" % claimed[host]
        elif host in down:
            plan["skip"].append(host)
            plan["why"][host] = "out of service before this run, not by gpunode.tuning: left as it is"
        elif halted:
            plan["wait"].append(host)
            plan["why"][host] = "not rebooted: %s" % halted
        elif free > 0:
            plan["start"].append(host)
            free -= 1
        else:
            plan["wait"].append(host)
            plan["why"][host] = _budget_used(max_unavailable, down, plan["start"], fleet_out)
    plan["free"] = free
    return plan


def _budget_used(max_unavailable: int, down: list, starting: list, fleet_out: dict) -> str:
    taken = down + starting
    shown = ", ".join(taken[:10]) + (", ..." if len(taken) > 10 else "")
    text = ("waiting for a slot: gpunode_tuning_reboot_max_unavailable is %d and %d host(s) of the run are out of "
            "service or starting now (%s)" % (max_unavailable, len(taken), shown))
    if fleet_out:
        names = sorted(fleet_out)
        text += "; the fleet's slots are also held by %d node(s) outside the run: %s" % (len(names), "; ".join(
            "%s (%s)" % (n, " ".join(str(fleet_out[n]).split())[:120]) for n in names[:10])
            + ("; ..." if len(names) > 10 else ""))
    return text
