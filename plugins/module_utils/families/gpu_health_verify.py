# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU health findings for verification: the ``gpu_health`` family's verification half (read, evaluate, report;
gpu_health.py holds what the runs that do not verify need of it).

A sick GPU makes every tuning result meaningless, so verification judges what the collection
already reads: the PCIe link of each selected GPU (Link Capabilities against Link Status, from
config space), the expected GPU count, nvidia-smi's health fields on a node that has nvidia-smi,
the Xid codes of the kernel log and, when asked, ``dcgmi diag -r 1``.

Severities (the state of each row; ``drifted`` fails verification):

- ``link_width``: a GPU trained below its capable width fails (width does not drop at idle: a
  bad riser, slot or seating). ``link_speed``: below capability is informational (idle GPUs lower
  their link speed to save power) unless the GPU is busy (utilization >= ``BUSY_UTILIZATION``).
- ``gpu_count``: fewer GPUs on the PCI bus than ``gpu_count``, or a GPU on the bus that the driver
  does not list (nvidia-smi), fails.
- ``driver_count``: every NVIDIA GPU on the PCI bus is listed by the driver (``nvidia-smi --query-gpu``), else
  it fails (fallen off the bus?); judged whenever nvidia-smi is asked, whatever the desired state holds
  (verification's former GPU section).
- ``ecc_mode``: current differs from pending = ``pending_reboot`` (a reboot or GPU reset brings it).
- ``ecc_uncorrected``: volatile uncorrectable errors (since the driver loaded) fail; aggregate
  (lifetime) ones only are reported.
- ``memory_remap``: a remapping failure fails; a retired page or remapped row pending is
  ``pending_reboot`` (a GPU reset activates it).
- ``power_limit``: reported (a limit below the default may be deliberate). ``clocks_event``:
  hardware slowdown, hardware thermal slowdown and power brake fail; others are reported.
  ``driver_version``: reported. Persistence mode: gpu_settings' ``persistence_mode`` row.
- ``xid``: the codes in ``SERIOUS_XIDS`` fail, the others are reported.
- ``dcgm_diag``: ``dcgmi diag -r 1``'s table read row by row (core/dcgm.py, DCGM 2.x, 3.x and 4.x): any
  ``Fail`` or ``Error`` (on a test's row, a GPU's row, an Error note), a row not understood or a table cut before
  its border fails, whatever dcgmi's exit status; so does a non-zero exit; ``Warn`` is reported; dcgmi
  missing is ``unsupported``.
- ``aer_fatal``, ``aer_nonfatal``, ``aer_correctable`` (core/aer.py): the AER counters of each GPU and each
  bridge above it; a fatal count fails naming the device and the errors; a non-fatal count is reported at first
  sight and fails once it grows since the guard's last reading; correctable errors fail above
  ``aer_correctable_per_hour`` between two readings. No counter files (before 4.19): ``unsupported``.
- ``responding``: a GPU whose config space reads all 0xff (vendor id ffff) fails, named.
- ``nvidia_smi``: on a node with NVIDIA GPUs on the bus, an nvidia-smi that hangs, fails (exit 9, a lost
  GPU) or answers something that does not match the query fails; the health gate of a rollout with it.
- one ``unsupported`` row per health field the driver does not know (``nvidia_smi.query``'s ``missing``),
  named by the field; the rows that need only such fields are left out, the others are judged.

Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    aer,
    amd_health,
    command,
    dcgm,
    family,
    nvidia_smi,
    pci,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core import platform as fit
from ansible_collections.gpunode.tuning.plugins.module_utils.core.kernel_log import SERIOUS_XIDS
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, read_small
from ansible_collections.gpunode.tuning.plugins.module_utils.core.nvidia_smi import HEALTH_FIELDS
from ansible_collections.gpunode.tuning.plugins.module_utils.families.gpu_health import (
    AER_RATE,
    NAME,
    validate,
)

PERSISTENCED_COMM = "nvidia-persistenced"


# The kernel truncates comm to 15 characters: a real node shows "nvidia-persiste".
_PERSISTENCED_PREFIX = PERSISTENCED_COMM[:15]


# tuning_info's RETURN of tuning_facts.gpu_health (tools/generate.py writes it there).
FACTS_DOC = r"""
description: NVIDIA driver user-space state.
returned: always
type: dict
contains:
  persistenced:
    description: The NVIDIA persistence daemon, found by a scan of C(/proc/*/comm).
    type: dict
    returned: always
    contains:
      running:
        description: True when a C(nvidia-persistenced) process exists.
        type: bool
        returned: always
        sample: true
      pids:
        description: Its process ids.
        type: list
        elements: int
        returned: always
        sample: [2187]
  driver_version:
    description: C(/sys/module/nvidia/version); null when the driver is not loaded.
    type: str
    returned: always
    sample: 570.124.06
  aer:
    description:
      - The AER error counters (core/aer.py) of each selected GPU and each bridge above it, from
        C(aer_dev_correctable), C(aer_dev_nonfatal) and C(aer_dev_fatal) (error name to count since boot, the
        C(TOTAL_ERR_*) line as C(TOTAL)); C(gpu) names the GPU below each device, C(missing) the devices without
        the files, C(previous) the guard's last reading of this boot (null when none); C(time) is seconds since
        boot. Null without a selected GPU.
    type: dict
    returned: always
    sample: {"boot_id": "5c1d...", "time": 1765000000.0, "devices": {"0000:41:00.0": {"fatal": {"TOTAL": 0}}},
             "gpu": {"0000:41:00.0": "0000:41:00.0"}, "missing": [], "previous": null}
"""


# The fields each health row judges; a row none of whose fields the driver knows is left out.
ROW_FIELDS = {
    "ecc": ("ecc.mode.current", "ecc.mode.pending", "ecc.errors.uncorrected.volatile.total"),
    "memory_remap": ("retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure"),
    "power_limit": ("power.limit", "power.default_limit"),
    "clocks_event": ("clocks_event_reasons.active",),
    "driver_version": ("driver_version",),
}


BUSY_UTILIZATION = 10  # percent: a GPU this busy keeps its link at full speed


# clocks_event_reasons bits (nvml.h nvmlClocksEventReason*): which fail, which are reported.
CLOCK_EVENTS_FAILING = {0x8: "HW slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake slowdown"}


CLOCK_EVENTS_REPORTED = {0x1: "GPU idle", 0x2: "applications clocks setting", 0x4: "SW power cap",
                         0x10: "sync boost", 0x20: "SW thermal slowdown", 0x100: "display clock setting"}


def _number(value: Any) -> float | None:
    """A CSV number; None for ``[N/A]``, ``[Not Supported]`` and the like."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _row(name: str, desired: Any, running: Any, state: str, reason: str = "") -> dict:
    return family.setting(NAME, name, desired, running, state, reason)


def _gpus(facts: dict, vendor: str | None = None) -> list:
    """The selected PCI devices that are GPUs (``pci.gpu_vendor``), of ``vendor`` (``nvidia``, ``amd``) when given."""
    devices = (facts.get("pci") or {}).get("devices") or []
    return [d for d in devices if pci.gpu_vendor(d) and vendor in (None, pci.gpu_vendor(d))]


def vendors_of(gpus: list) -> str | None:
    """The vendors of GPUs, as a row's ``vendor`` (``amd,nvidia`` for both); None for none."""
    return ",".join(sorted({pci.gpu_vendor(g) for g in gpus if pci.gpu_vendor(g)})) or None


# The rows about every vendor's GPUs (config space, the count); every other row is about one vendor's.
_ANY_VENDOR = ("link_width", "link_speed", "responding", "gpu_count", "kernel_floor") + tuple(n for _s, n in aer.ROWS)


def _speed(text: Any) -> float | None:
    m = re.match(r"^\s*([0-9.]+)", str(text or ""))
    return float(m.group(1)) if m else None


def link_rows(facts: dict, busy: dict) -> list:
    """``link_width`` and ``link_speed`` over the selected GPUs; ``busy``: bdf -> utilization %."""
    gpus = [g for g in _gpus(facts) if g.get("pcie") and g.get("link_width_capable")]
    if not gpus:
        why = "no selected GPU with a readable PCI Express capability"
        return [_row("link_width", None, None, "not_applicable", why),
                _row("link_speed", None, None, "not_applicable", why)]
    narrow = ["%s link x%s of x%s" % (g["bdf"], g["link_width"], g["link_width_capable"])
              for g in gpus if (g.get("link_width") or 0) < g["link_width_capable"]]
    widths = sorted({"x%s" % g["link_width_capable"] for g in gpus})
    if narrow:
        rows = [_row("link_width", "/".join(widths), "; ".join(narrow), "drifted",
                     "%s: trained below the capable width (width does not drop at idle: check the riser, "
                     "slot and seating)" % "; ".join(narrow))]
    else:
        rows = [_row("link_width", "/".join(widths), "/".join(widths), "applied",
                     "%d GPU link(s) at their capable width" % len(gpus))]
    return rows + [_speed_row(gpus, busy)]


def _speed_row(gpus: list, busy: dict) -> dict:
    slow, hot = [], []
    for g in gpus:
        cur, cap = _speed(g.get("link_speed")), _speed(g.get("link_speed_capable"))
        if cur is None or cap is None or cur >= cap:
            continue
        util = busy.get(g["bdf"])
        text = "%s link %s of %s" % (g["bdf"], g.get("link_speed"), g.get("link_speed_capable"))
        if util is not None and util >= BUSY_UTILIZATION:
            hot.append("%s while %d%% busy" % (text, util))
        else:
            slow.append(text + (" at %d%% utilization" % util if util is not None else ""))
    caps = "/".join(sorted({str(g.get("link_speed_capable")) for g in gpus}))
    if hot:
        return _row("link_speed", caps, "; ".join(hot), "drifted",
                    "%s: a busy GPU keeps its link at full speed; trained down (signal integrity?)" % "; ".join(hot))
    if slow:
        return _row("link_speed", caps, "; ".join(slow), "applied",
                    "informational: %s; idle GPUs lower their link speed to save power (a finding only "
                    "when the GPU is busy)" % "; ".join(slow))
    return _row("link_speed", caps, caps, "applied", "%d GPU link(s) at their capable speed" % len(gpus))


def count_row(facts: dict, want: int | None, smi: list | None) -> dict | None:
    """``gpu_count``: expected count against the PCI bus and, when nvidia-smi answered, the driver.

    A GPU on the bus that the driver does not list fails, and so does one the driver lists that the bus
    no longer shows. None when neither a count is wanted nor nvidia-smi's list is known.
    """
    on_bus = [g["bdf"] for g in _gpus(facts)]
    problems = []
    if want is not None and len(on_bus) < want:
        problems.append("%d of %d expected GPUs on the PCI bus" % (len(on_bus), want))
    if smi is not None:
        listed = {g["bdf"] for g in smi}
        missing = [g["bdf"] for g in _gpus(facts, "nvidia") if g["bdf"] not in listed]
        if missing:
            problems.append("on the bus but not listed by the driver (nvidia-smi): %s" % ", ".join(missing))
        bus = set((facts.get("pci") or {}).get("nvidia_gpus") or on_bus)
        gone = sorted(b for b in listed if b not in bus)
        if gone:
            problems.append("listed by the driver (nvidia-smi) but no longer on the PCI bus: %s (fallen off the bus?)"
                            % ", ".join(gone))
    if want is None and smi is None:
        return None
    running = "%d on the PCI bus%s" % (len(on_bus), "" if smi is None else ", %d listed by nvidia-smi" % len(smi))
    desired = want if want is not None else len(on_bus)
    if problems:
        return _row("gpu_count", desired, running, "drifted", "; ".join(problems))
    return _row("gpu_count", desired, running, "applied", "")


def responding_row(facts: dict) -> dict:
    """``responding``: a GPU whose config space reads all 0xff (vendor id ffff) has stopped answering: fails."""
    gpus = _gpus(facts)
    if not gpus:
        return _row("responding", None, None, "not_applicable", "no selected GPU on the PCI bus")
    dead = ["%s %s" % (g["bdf"], g.get("error")) for g in gpus if g.get("responding") is False]
    if dead:
        return _row("responding", "all", "; ".join(dead), "drifted",
                    "%s; reseat or replace the GPU (a reboot may bring it back for a while)" % "; ".join(dead))
    return _row("responding", "all", "all", "applied", "%d GPU(s) answer config-space reads" % len(gpus))


def driver_count_row(facts: dict, probe: dict, root: str = "/") -> dict | None:
    """``driver_count``: the driver (``nvidia-smi --query-gpu``) lists every NVIDIA GPU on the PCI bus.

    ``not_applicable`` where nvidia-smi is not asked (a simulated root, none installed); None when verification
    was told not to probe the GPUs, or the probe has no GPU list (a probe recorded without the query).
    """
    state, why = nvidia_smi.probe_status(probe, root)
    if state == "disabled" or (state == "present" and "query" not in probe):
        return None
    if state != "present":
        return _row("driver_count", None, None, "not_applicable", why)
    query = probe["query"] or {}
    on_bus = _gpus(facts, "nvidia")
    if query.get("rc", 0) != 0:
        return _row("driver_count", len(on_bus), None, "drifted", nvidia_smi.smi_failure(query))
    gpus = nvidia_smi.parse_gpu_query(query.get("stdout"))
    if on_bus and len(gpus) < len(on_bus):
        seen = {g["bdf"] for g in gpus}
        missing = [d["bdf"] for d in on_bus if d["bdf"] not in seen]
        return _row("driver_count", len(on_bus), len(gpus), "drifted",
                    "the driver sees %d of %d GPUs on the PCI bus (missing: %s); fallen off the bus?"
                    % (len(gpus), len(on_bus), ", ".join(missing) or "?"))
    return _row("driver_count", len(on_bus) or len(gpus), len(gpus), "applied", "%d GPUs visible to the driver"
                % len(gpus))


def _each(gpus: list, test) -> list:
    """``"<bdf> <text>"`` for each GPU where ``test(gpu)`` returns text."""
    out = []
    for g in gpus:
        text = test(g)
        if text:
            out.append("%s %s" % (g["bdf"], text))
    return out


def ecc_rows(gpus: list) -> list:
    """``ecc_mode`` (pending change = pending_reboot) and ``ecc_uncorrected`` (volatile fails)."""
    modes = sorted({g["ecc.mode.current"] for g in gpus})
    if all(m.startswith("[") for m in modes):  # [N/A]: a GPU without ECC memory
        why = "the GPUs report no ECC (%s)" % "/".join(modes)
        return [_row("ecc_mode", None, "/".join(modes), "not_applicable", why),
                _row("ecc_uncorrected", 0, None, "not_applicable", why)]
    changing = _each(gpus, lambda g: "ECC %s, %s pending" % (g["ecc.mode.current"], g["ecc.mode.pending"])
                     if g["ecc.mode.pending"] != g["ecc.mode.current"] and not g["ecc.mode.pending"].startswith("[")
                     else "")
    if changing:
        mode = _row("ecc_mode", "unchanged", "; ".join(changing), "pending_reboot",
                    "%s: a reboot (or GPU reset) applies the pending ECC mode" % "; ".join(changing))
    else:
        mode = _row("ecc_mode", None, "/".join(modes), "applied", "ECC mode %s" % "/".join(modes))
    volatile = _each(gpus, lambda g: "%d uncorrectable ECC error(s) since the driver loaded"
                     % _number(g["ecc.errors.uncorrected.volatile.total"])
                     if (_number(g["ecc.errors.uncorrected.volatile.total"]) or 0) > 0 else "")
    aggregate = _each(gpus, lambda g: "%d uncorrectable ECC error(s) in its lifetime"
                      % _number(g["ecc.errors.uncorrected.aggregate.total"])
                      if (_number(g["ecc.errors.uncorrected.aggregate.total"]) or 0) > 0 else "")
    if volatile:
        unc = _row("ecc_uncorrected", 0, "; ".join(volatile), "drifted", "; ".join(volatile + aggregate))
    else:
        unc = _row("ecc_uncorrected", 0, 0, "applied",
                   ("reported: " + "; ".join(aggregate)) if aggregate else "no uncorrectable ECC error")
    return [mode, unc]


def _yes(value: str) -> bool:
    return str(value).strip().lower() in ("yes", "1", "true")


def remap_row(gpus: list) -> dict:
    """``memory_remap``: remapping failure fails; a pending retired page or row remap needs a reset."""
    failed = _each(gpus, lambda g: "row remapping failed" if _yes(g["remapped_rows.failure"]) else "")
    kinds = (("retired page pending", "retired_pages.pending"), ("row remap pending", "remapped_rows.pending"))
    pending = _each(gpus, lambda g: ", ".join(t for t, f in kinds if _yes(g[f])))
    if failed:
        return _row("memory_remap", "none pending", "; ".join(failed + pending), "drifted",
                    "%s: the GPU cannot repair its memory (replace it)" % "; ".join(failed))
    if pending:
        return _row("memory_remap", "none pending", "; ".join(pending), "pending_reboot",
                    "%s: a GPU reset or reboot activates the remap" % "; ".join(pending))
    return _row("memory_remap", "none pending", "none pending", "applied", "")


def power_row(gpus: list) -> dict:
    """``power_limit``: reported; a limit below the default may be deliberate (the settings family)."""
    capped = _each(gpus, lambda g: "%s W of default %s W (max %s W)" % (
        g["power.limit"], g["power.default_limit"], g["power.max_limit"])
        if None not in (_number(g["power.limit"]), _number(g["power.default_limit"]))
        and _number(g["power.limit"]) < _number(g["power.default_limit"]) else "")
    limits = "/".join(sorted({g["power.limit"] for g in gpus}))
    reason = ("reported: capped below the default: " + "; ".join(capped)) if capped else "at the default limit"
    return _row("power_limit", None, limits + (" W" if _number(limits) is not None else ""), "applied", reason)


def _events(value: str) -> int:
    try:
        return int(str(value).strip(), 16)
    except ValueError:
        return 0


def _grouped(gpus: list, test) -> list:
    """Like ``_each``, but a text every GPU shares is said once: ``"<text> on all N GPUs"``."""
    texts = [test(g) for g in gpus]
    if len(gpus) > 1 and texts[0] and texts.count(texts[0]) == len(gpus):
        return ["%s on all %d GPUs" % (texts[0], len(gpus))]
    return _each(gpus, test)


def clocks_row(gpus: list) -> dict:
    """``clocks_event``: hardware slowdowns fail, software reasons and idle are reported."""
    def names(g, table):
        bits = _events(g["clocks_event_reasons.active"])
        return ", ".join(n for b, n in table.items() if bits & b)
    failing = _each(gpus, lambda g: names(g, CLOCK_EVENTS_FAILING))
    reported = _grouped(gpus, lambda g: names(g, CLOCK_EVENTS_REPORTED))
    if failing:
        return _row("clocks_event", "no HW slowdown", "; ".join(failing), "drifted",
                    "%s: the GPU throttles in hardware (cooling or power delivery)" % "; ".join(failing))
    return _row("clocks_event", "no HW slowdown", "none" if not reported else "; ".join(reported), "applied",
                ("reported: " + "; ".join(reported)) if reported else "")


def driver_row(gpus: list, facts: dict) -> dict:
    """``driver_version``: reported; a user space that differs from the loaded module is a finding."""
    versions = sorted({g["driver_version"] for g in gpus})
    module = (facts.get(NAME) or {}).get("driver_version")
    if module and versions and versions != [module]:
        return _row("driver_version", module, "/".join(versions), "drifted",
                    "nvidia-smi reports %s, the loaded kernel module %s (reboot after a driver upgrade)"
                    % ("/".join(versions), module))
    return _row("driver_version", None, "/".join(versions), "applied", "")


def _driver_of(gpus: list, facts: dict) -> str:
    versions = sorted({g.get("driver_version") for g in gpus if g.get("driver_version")})
    return "/".join(versions) or (facts.get(NAME) or {}).get("driver_version") or "of unknown version"


def _field_rows(missing: list, driver: str) -> list:
    """One ``unsupported`` row per health field the driver does not know: only that field's judgement is lost."""
    return [_row(field, "answered", None, "unsupported",
                 "the driver (%s) does not know the nvidia-smi field %s: what needs it is not judged"
                 % (driver, field)) for field in missing]


def _failed_query(facts: dict, health: dict) -> list:
    """The row of a health query that did not answer: unhealthy when NVIDIA GPUs are on the bus."""
    why = nvidia_smi.driver_down(_result(health)) or command.failure("nvidia-smi --query-gpu", _result(health))
    if nvidia_smi.refused_field(_result(health)):
        return [_row("nvidia_smi", "answers", None, "unsupported", why)]
    if not _gpus(facts):
        return [_row("nvidia_smi", "answers", None, "unsupported", why + " (and no NVIDIA GPU is on the PCI bus)")]
    return [_row("nvidia_smi", "answers", None, "drifted", why)]


def _result(health: dict) -> command.Result:
    return command.Result(health.get("rc", 0), health.get("stdout") or "", health.get("stderr") or "",
                          timed_out=bool(health.get("timed_out")))


def smi_rows(facts: dict, health: dict | None) -> tuple:
    """``(rows, gpus)`` from the health query (``nvidia_smi.query``'s dict); gpus None when it did not answer."""
    if health is None:
        return [], None
    if health.get("rc", 0) != 0 or health.get("timed_out"):
        return _failed_query(facts, health), None
    fields = health.get("fields")
    gpus, unparsed = nvidia_smi.parse_csv(health.get("stdout"), list(fields or HEALTH_FIELDS))
    if fields is None and not gpus:
        gpus, unparsed = nvidia_smi.parse_csv(health.get("stdout"), list(HEALTH_FIELDS[:-3]))
    missing = list(health.get("missing") or [])
    rows = _field_rows(missing, _driver_of(gpus, facts))
    answer = _answer_row(facts, gpus, unparsed, fields or HEALTH_FIELDS)
    if answer is not None:
        rows.append(answer)
    if not gpus:
        if answer is None:
            rows.append(_row("nvidia_smi", "answers", None, "not_applicable", "nvidia-smi lists no GPU"))
        return rows, (gpus if answer is None else None)
    for g in gpus:  # a field the driver lacks reads as [N/A]: the rows that need only it are left out below
        for field in missing:
            g.setdefault(field, "[N/A]")
    known = set(fields or HEALTH_FIELDS)

    def has(row):
        return any(f in known for f in ROW_FIELDS[row])
    rows += ecc_rows(gpus) if has("ecc") else []
    rows += [r(gpus) for name, r in (("memory_remap", remap_row), ("power_limit", power_row),
                                     ("clocks_event", clocks_row)) if has(name)]
    rows += [driver_row(gpus, facts)] if has("driver_version") else []
    return rows, gpus


def _answer_row(facts: dict, gpus: list, unparsed: list, fields) -> dict | None:
    """A health answer that does not match the query, or that says a GPU is lost: drifted; else None."""
    problems = []
    if unparsed:
        problems.append(nvidia_smi.mismatch(unparsed, list(fields)))
    lost = _each(gpus, _lost_cells)
    problems += lost
    if not problems:
        return None
    state = "drifted" if _gpus(facts, "nvidia") or lost else "unsupported"
    return _row("nvidia_smi", "answers", "; ".join(problems)[:300], state, "; ".join(problems))


def _xid_devices(kernel_log: dict, facts: dict) -> dict:
    """code -> sorted GPU addresses, from the kernel log's Xid samples (``0000:41:00`` -> ``.0``)."""
    bdfs = [g["bdf"] for g in _gpus(facts, "nvidia")]
    out = {}
    for rec in (kernel_log.get("records") or {}).get("xid") or []:
        dev = str(rec.get("device") or "")
        full = next((b for b in bdfs if b == dev or b.startswith(dev + ".")), dev if "." in dev else dev + ".0")
        out.setdefault(str(rec.get("code")), set()).add(full)
    return {code: sorted(devs) for code, devs in out.items()}


def xid_row(facts: dict) -> dict:
    """``xid``: serious codes (``SERIOUS_XIDS``) fail, the others are reported, naming the GPUs."""
    kl = facts.get("kernel_log") or {}
    if not kl.get("available"):
        return _row("xid", "no serious Xid", None, "unsupported",
                    "kernel log unavailable: %s" % (kl.get("reason") or "not read"))
    codes = kl.get("xid_codes") or {}
    devices = _xid_devices(kl, facts)

    def describe(code):
        where = devices.get(code)
        what = SERIOUS_XIDS.get(int(code), "")
        return "Xid %s%s (%dx%s)" % (code, " " + what if what else "", codes[code],
                                     " on " + ", ".join(where) if where else "")
    serious = [describe(c) for c in sorted(codes, key=int) if int(c) in SERIOUS_XIDS]
    other = [describe(c) for c in sorted(codes, key=int) if int(c) not in SERIOUS_XIDS]
    running = ", ".join("Xid %s" % c for c in sorted(codes, key=int)) or "none"
    if serious:
        return _row("xid", "no serious Xid", running, "drifted", "; ".join(serious + other))
    return _row("xid", "no serious Xid", running, "applied", ("reported: " + "; ".join(other)) if other else "")


def parse_dcgm_diag(text: str | None) -> dict:
    """``dcgmi diag``'s table read row by row by ``core/dcgm.py`` (DCGM 2.x, 3.x and 4.x layouts; its docstring
    gives the shape: ``{version, tests: [{name, section, result, gpus, notes, status, ...}], failures, findings}``)."""
    return dcgm.parse_diag(text)


def dcgm_row(answer: dict | None) -> dict:
    """``dcgm_diag``: ``dcgmi diag -r 1``'s verdict (missing dcgmi: unsupported).

    Every row is judged by its result whatever dcgmi's exit status: a Fail or Error row fails with exit 0, a
    row the reader does not understand (or a table cut before its border) is a finding that fails, never a
    pass; an all-pass table with a non-zero exit fails naming the exit status.
    """
    if not answer or answer.get("skipped"):
        why = (answer or {}).get("reason") or "dcgmi diag was not run (a simulated node without dcgmi?)"
        return _row("dcgm_diag", "pass", None, "unsupported", why)
    if answer.get("rc") == 127:
        return _row("dcgm_diag", "pass", None, "unsupported", answer.get("stderr") or "dcgmi is not installed")
    if answer.get("timed_out"):
        return _row("dcgm_diag", "pass", "no answer", "drifted",
                    (answer.get("stderr") or "").strip().splitlines()[-1])
    diag = dcgm.parse_diag(answer.get("stdout"))
    problems = dcgm.problems(diag)
    version = " (DCGM %s)" % diag["version"] if diag["version"] else ""
    rc = answer.get("rc", 0)
    if problems or rc != 0 or not dcgm.passed(diag):
        said = (answer.get("stderr") or "") + " " + (answer.get("stdout") or "")
        detail = "; ".join(problems[:5]) or " ".join(said.split())[:300] or "no result table"
        if len(problems) > 5:
            detail += "; and %d more" % (len(problems) - 5)
        if not problems:
            detail = "every test passed but dcgmi exited %s: %s" % (rc, detail[:300])
        return _row("dcgm_diag", "pass", "fail", "drifted", "dcgmi diag -r 1%s (rc %s): %s" % (version, rc, detail))
    summary = ", ".join("%s %s" % (t["name"], t["result"]) for t in diag["tests"])
    warned = "; warnings: " + "; ".join(dcgm.describe(w) for w in diag["warnings"]) if diag["warnings"] else ""
    return _row("dcgm_diag", "pass", "pass", "applied",
                "dcgmi diag -r 1 passed%s: %s%s" % (version, summary[:300], warned[:300]))


def fitness_rows(facts: dict, floors: dict) -> list:
    """Fit before tuned: ``driver_fitness`` (each NVIDIA GPU's generation against the loaded driver's flavour and
    version, and ``floors``: drifted naming the GPU, the driver and the floor), ``kernel_floor`` when a kernel
    floor is set. A driver branch past its end of life is a warning (``fitness_warnings``), never a row."""
    out = []
    driver = (facts.get("platform") or {}).get("nvidia_driver") or {}
    gpus = _gpus(facts, "nvidia")
    if gpus and driver.get("version"):
        judged = fit.driver_fitness(gpus, driver, floors)
        want = "generation needs (%s)" % ", ".join(sorted(set(judged["generations"].values())))
        running = "%s %s" % (driver.get("flavor") or "unknown flavour", driver["version"])
        if judged["failures"]:
            out.append(dict(_row("driver_fitness", want, running, "drifted", "; ".join(judged["failures"])),
                            fit=True))
        else:
            out.append(_row("driver_fitness", want, running, "applied", ""))
    below = fit.kernel_below(facts.get("platform"), floors)
    if floors.get("kernel"):
        release = ((facts.get("platform") or {}).get("kernel") or {}).get("release")
        row = _row("kernel_floor", floors["kernel"], release, "drifted" if below else "applied", below or "")
        out.append(dict(row, fit=True) if below else row)
    return out


def evaluate(facts: dict, desired: dict, ctx: Any = None) -> list:
    """The health rows of a host (the contract's evaluate; ``desired`` is the whole desired state).

    The nvidia-smi and DCGM answers are ``verify_node.gpu_probe``'s result, taken from ``ctx.gpu``
    or else ``facts["gpu_probe"]`` (absent: the rows that need them are left out): ``health``
    (``nvidia_smi.query``'s {rc, stdout, stderr, timed_out, fields, missing}; without ``fields``, the
    columns of ``HEALTH_FIELDS``), ``query`` and ``dcgm`` when they ran. Only ``driver_count`` when ``desired``
    has no ``gpu_health`` key; ``{}`` asks for the checks without an expected count or DCGM.
    """
    probe = nvidia_smi.probe_answers(getattr(ctx, "gpu", None) or facts.get("gpu_probe"))
    driver = driver_count_row(facts, probe, getattr(ctx, "root", "/"))
    tail = [driver] if driver else []
    if NAME not in (desired or {}):
        return _with_vendor(tail, facts)  # not part of the desired state (the role always asks; tuning_info may not)
    want = validate((desired or {}).get(NAME))
    health = probe.get("health") if probe.get("probe") == "present" else None
    rows, smi = smi_rows(facts, health)
    if driver and driver["state"] == "drifted" and driver["running"] is None \
            and any(r["name"] == "nvidia_smi" and r["state"] == "drifted" for r in rows):
        # The same nvidia-smi that failed the health query failed the GPU list: one finding, nvidia_smi's.
        tail = [_row("driver_count", driver["desired"], None, "unsupported",
                     "the GPUs could not be listed (see nvidia_smi): %s" % driver["reason"])]
    busy = {g["bdf"]: _number(g.get("utilization.gpu")) for g in smi or []
            if _number(g.get("utilization.gpu")) is not None}
    out = link_rows(facts, busy) + [responding_row(facts)] + fitness_rows(facts, want["floors"])
    count = count_row(facts, want["gpu_count"], smi)
    out += [count] if count else []
    out += rows + [xid_row(facts)] + aer.rows((facts.get(NAME) or {}).get("aer"), want[AER_RATE], _row)
    if want["dcgm_diag"]:
        out.append(dcgm_row(probe.get("dcgm")))
    return _with_vendor(out + tail, facts) + amd_health.rows(facts, _gpus(facts, "amd"), ctx_gpu(facts, ctx),
                                                             _amd_row)


def ctx_gpu(facts: dict, ctx: Any) -> dict:
    """The GPU probe's answers: ``ctx.gpu``, else ``facts["gpu_probe"]``, else {}."""
    return getattr(ctx, "gpu", None) or facts.get("gpu_probe") or {}


def _amd_row(name: str, desired: Any, running: Any, state: str, reason: str = "") -> dict:
    return family.setting(NAME, name, desired, running, state, reason, vendor="amd")


def _with_vendor(rows: list, facts: dict) -> list:
    """Each row with its ``vendor``: the GPUs' of a row about every vendor's GPUs, else NVIDIA's (nvidia-smi, Xid,
    DCGM)."""
    every = vendors_of(_gpus(facts))
    for r in rows:
        vendor = every if r["name"] in _ANY_VENDOR else "nvidia"
        if vendor:
            r["vendor"] = vendor
    return rows


def read(node: Node, selector: Any = None, query: Any = None) -> dict:
    """The family's facts (``facts["gpu_health"]``): whether nvidia-persistenced runs (a scan of /proc/*/comm),
    the loaded driver's version."""
    pids = []
    proc = node.path("proc")
    for entry in node.listdir("proc"):
        if entry.isdigit():
            comm = read_small(os.path.join(proc, entry, "comm"))
            if comm and comm.startswith(_PERSISTENCED_PREFIX) and PERSISTENCED_COMM.startswith(comm):
                pids.append(int(entry))
    gpus = [d for d in pci.listed(node, query) if pci.gpu_vendor(d) and (selector is None or selector.matches(d))]
    return {
        "persistenced": {"running": bool(pids), "pids": sorted(pids)},
        "driver_version": read_small(node.path("sys/module/nvidia/version")),
        # the AER counters of the GPUs and the bridges above them (core/aer.py); no GPU: None
        "aer": aer.read(node, gpus) if gpus else None,
    }


def gpu_commands(desired: dict) -> tuple:
    """The health query and the GPU list; ``dcgmi diag -r 1`` when the desired state asks for it; amd-smi's calls
    (``amd_health.COMMANDS``, run also where nvidia-smi is not installed)."""
    dcgm = ((desired or {}).get(NAME) or {}).get("dcgm_diag")
    return (nvidia_smi.HEALTH, nvidia_smi.QUERY) + ((nvidia_smi.DCGM,) if dcgm else ()) + amd_health.COMMANDS


def report(facts: dict, desired: dict, ctx: Any = None) -> str:
    """The GPUs the driver lists (nvidia-smi) against the PCI bus, with their persistence mode."""
    probe = nvidia_smi.probe_answers(getattr(ctx, "gpu", None) or facts.get("gpu_probe"))
    state, why = nvidia_smi.probe_status(probe, getattr(ctx, "root", "/"))
    query = probe.get("query") or {}
    if state == "present" and query.get("rc", 0) != 0:
        state, why = "error", nvidia_smi.smi_failure(query)
    if state != "present":
        return "%s: %s." % (state.replace("_", " ").capitalize(), why)
    gpus = nvidia_smi.parse_gpu_query(query.get("stdout"))
    lines = ["%d GPU(s) visible to the driver (%d on the PCI bus)." % (len(gpus), len(_gpus(facts))), "",
             "| GPU | PCI address | Persistence mode |", "|---|---|---|"]
    lines += ["| %s | %s | %s |" % (g["index"], g["bdf"], g["persistence_mode"]) for g in gpus]
    return "\n".join(lines)


def _lost_cells(gpu: dict[str, str]) -> str:
    """What a GPU answered where it lost its values (``[GPU is lost]``, ``[Unknown Error]``), "" when none."""
    lost = nvidia_smi.lost_fields(gpu)
    if not lost:
        return ""
    return "answers %s for %s" % ("/".join(sorted({gpu[f] for f in lost})), ", ".join(lost))
