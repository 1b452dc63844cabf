# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard: re-verify the node on a timer and report it as a JSON status and as Prometheus metrics.

``gpunode-tuning-guard.timer`` starts ``gpunode-tuning-guard.service`` every
``gpunode_tuning_guard_interval``; the service runs the boot runner (which carries this package's
module_utils, module_utils/flows/boot.py's runner_text) with the node's python3, no Ansible::

    python3 -I -B RUNNER guard --config /etc/gpunode-tuning/guard.json [--root DIR]

One run: ``verify_node.verify`` (what ``tuning_info`` runs) against the whole desired state of the
config file (module_utils/flows/guard_files.py writes it), then the Xid events of the kernel log since
boot (counted by sequence number, so a count only grows within a boot and restarts at the next),
when each setting was first seen drifted (kept in the status file from run to run), and with
``reapply`` the drifted runtime-only families re-applied by the boot runner's own functions
(``boot.boot_each``) and the node verified again. It writes the status file (JSON, next to the
journal) and ``gpunode-tuning.prom`` in node_exporter's textfile directory (guard_metrics.py), each
through a temporary file in the same directory and a rename. A textfile directory that does not exist
(node_exporter not installed yet) is not a failure: the metrics are off (the status says why) and start
at the first run after it exists; the guard never creates it. It is read-only otherwise, holds an
exclusive lock on the status directory (a second run at the same time does nothing), and every
command it runs has a timeout. Exit status: 0 when the node was verified (drifted or not) and the
files were written, 1 when verification or a write failed (the status says why), 2 when the config
or the root cannot be used.

Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import sys
import time
from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import (
    aer,
    amd_health,
    amdgpu_log,
    command,
    files,
    kernel_log,
    lock,
    nvidia_smi,
    pci,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.calls import SYSTEM_PATH, SystemLookup
from ansible_collections.gpunode.tuning.plugins.module_utils.core.facts import FactsError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import EvaluationError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import (
    BinaryNotFound,
    Node,
    NodeError,
)
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import ValidationError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate_boot import absolute_path
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families, boot, guard_metrics
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify as verify_node

VERSION = 1
PREFIX = "gpunode-tuning-guard"
TEXTFILE = "gpunode-tuning.prom"
REAPPLY_FLOW = "guard-reapply"
FACTS_KEYS = ("pci_selector", "sysctls", "modules", "kmsg_levels", "kmsg_ignore")
GUARD_DEFAULTS = {
    "textfile_dir": "/var/lib/prometheus/node-exporter",
    "status_file": "/var/lib/gpunode-tuning/guard-status.json",
    "reapply": False,
    "interval_seconds": 300,
    "command_timeout_seconds": 30,
    "preset": None,
    "collection_version": None,
    "host": None,
}
_BDF = re.compile(r"\b[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\b")
_XID_MARK = b"NVRM: Xid"


class GuardError(Exception):
    """The guard's config or root cannot be used; the message names the file and what is wrong."""


def _say(line: str) -> None:
    """One line to stdout (journald); module_utils' linters forbid print()."""
    sys.stdout.write("%s\n" % line)
    sys.stdout.flush()


# -- The config file (written by the persistent flow: guard_files.config_document)


def validate_config(data: Any, where: str = "the guard config") -> dict:
    """The config with defaults filled in; GuardError naming ``where`` and the allowed keys otherwise."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise GuardError("%s is not a version %d guard config (written by gpunode.tuning's persistent flow)"
                         % (where, VERSION))
    unknown = sorted(set(data) - {"version", "desired", "facts", "verify", "guard"})
    if unknown:
        raise GuardError("%s: unknown keys %s; allowed: desired, facts, verify, guard" % (where, ", ".join(unknown)))
    for key in ("desired", "facts", "verify", "guard"):
        if not isinstance(data.get(key, {}), dict):
            raise GuardError("%s: %s must be an object" % (where, key))
    checks = (("facts", FACTS_KEYS), ("verify", tuple(verify_node.VERIFY_DEFAULTS)), ("guard", tuple(GUARD_DEFAULTS)))
    for key, allowed in checks:
        bad = sorted(set(data.get(key) or {}) - set(allowed))
        if bad:
            raise GuardError("%s: unknown %s keys %s; allowed: %s" % (where, key, ", ".join(bad), ", ".join(allowed)))
    guard = dict(GUARD_DEFAULTS)
    guard.update({k: v for k, v in (data.get("guard") or {}).items() if v is not None})
    try:
        guard_options(guard)
    except ValidationError as exc:
        raise GuardError("%s: %s" % (where, exc)) from None
    return {"desired": dict(data.get("desired") or {}), "facts": dict(data.get("facts") or {}),
            "verify": dict(data.get("verify") or {}), "guard": guard}


def guard_options(guard: dict) -> dict:
    """Check the ``guard`` section in place: paths absolute, numbers positive, ``reapply`` a boolean."""
    if guard["textfile_dir"] != "":
        guard["textfile_dir"] = absolute_path(guard["textfile_dir"])
    guard["status_file"] = absolute_path(guard["status_file"])
    for key in ("interval_seconds", "command_timeout_seconds"):
        value = guard[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValidationError("guard.%s must be a whole number of seconds >= 1, got %r" % (key, value))
    if not isinstance(guard["reapply"], bool):
        raise ValidationError("guard.reapply must be true or false, got %r" % (guard["reapply"],))
    return guard


def load_config(path: str) -> dict:
    """The validated config in ``path``; GuardError naming the file when it is unusable."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise GuardError("cannot read the guard config %s: %s" % (path, exc)) from None
    return validate_config(data, path)


# -- Commands on the node: the node's own (a simulated node's stand-ins), each with a timeout


def command_tools(node: Node, timeout: int) -> verify_node.Tools:
    """``verify_node.Tools`` for the guard: Node.bin_path on the system PATH, every command bounded by ``timeout``."""

    def find(name, package):
        try:
            return node.bin_path(SystemLookup, name, package, host=False)
        except BinaryNotFound:
            return None

    def run(argv):
        # The collection's one bounded runner (its process group killed at the guard's command timeout).
        return command.run(argv, timeout, {"PATH": SYSTEM_PATH})

    return verify_node.Tools(find, run)


# -- Xid events since boot (a counter per GPU and code, by kernel-log sequence number)


def xid_events(data: bytes, after_seq: int = -1) -> list:
    """``[(seq, device, code)]``: the kernel's Xid records in kmsg ``data`` with a sequence number above ``after_seq``.

    Only kernel records count (facility 0: a PRI below 8), at any level. The search looks for the
    ``NVRM: Xid`` marker only, so a 100,000-record log without one costs a single scan.
    """
    out = []
    pos = data.find(_XID_MARK)
    while pos != -1:
        start = data.rfind(b"\n", 0, pos) + 1
        end = data.find(b"\n", pos)
        end = len(data) if end == -1 else end
        head, sep, message = data[start:end].partition(b";")
        fields = head.split(b",")
        if sep and len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit() and int(fields[0]) < 8:
            seq = int(fields[1])
            cls, extra = kernel_log.classify(message.decode("utf-8", "replace"))
            if cls == "xid" and seq > after_seq:
                out.append((seq, extra["device"], extra["code"]))
        pos = data.find(_XID_MARK, end)
    return out


def last_seq(data: bytes) -> int | None:
    """The sequence number of the newest record in kmsg ``data`` (None for an empty log)."""
    end = len(data)
    while end > 0 and data[end - 1:end] == b"\n":  # not rstrip(): that copies a log of megabytes
        end -= 1
    while end > 0:
        start = data.rfind(b"\n", 0, end) + 1
        fields = data[start:end].split(b",", 2)
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            return int(fields[1])
        end = start - 1  # a continuation line (" SUBSYSTEM=...") or a malformed one: the one before
    return None


def gpu_address(device: str, gpus: list) -> str:
    """The GPU a kernel-log device names (``0000:41:00`` -> ``0000:41:00.0``), as the GPU list spells it."""
    return next((g for g in gpus if g == device or g.startswith(device + ".")), device if "." in device
                else device + ".0")


def update_xids(previous: dict | None, boot_id: str, data: bytes | None, gpus: list) -> dict:
    """The Xid counters of this run: the previous run's of this boot plus the records logged since.

    A new boot id, or a log whose newest record is older than the last one counted (the log was
    rebuilt), starts from zero. An unreadable log keeps the counts as they were.
    """
    prev = previous if (previous or {}).get("boot_id") == boot_id and boot_id else None
    counts = {g: dict(c) for g, c in ((prev or {}).get("counts") or {}).items()}
    after = int((prev or {}).get("last_seq", -1))
    newest = last_seq(data) if data is not None else None
    if newest is not None and newest < after:
        counts, after = {}, -1
    for _seq, device, code in xid_events(data, after) if data is not None else []:
        gpu = counts.setdefault(gpu_address(device, gpus), {})
        gpu[str(code)] = gpu.get(str(code), 0) + 1
    serious = dict.fromkeys(gpus, 0)
    for gpu, codes in counts.items():
        serious[gpu] = sum(n for code, n in codes.items() if int(code) in kernel_log.SERIOUS_XIDS)
    top = max(after, -1 if newest is None else newest)
    return {"boot_id": boot_id, "available": data is not None, "last_seq": top, "counts": counts, "serious": serious}


# -- The status: pure functions of a verification result and the previous status


def selected_gpus(facts: dict | None, vendor: str | None = None) -> list:
    """The selected PCI functions that are GPUs (``pci.gpu_vendor``: NVIDIA's, AMD's), of ``vendor`` when given."""
    devices = ((facts or {}).get("pci") or {}).get("devices") or []
    return [d for d in devices if pci.gpu_vendor(d) and vendor in (None, pci.gpu_vendor(d))]


def gpu_links(facts: dict | None) -> list:
    """Per GPU its PCIe link width and speed against the maximum (speeds in transfers per second)."""
    out = []
    for g in selected_gpus(facts):
        if not g.get("pcie"):
            continue
        out.append({"gpu": g["bdf"], "vendor": pci.gpu_vendor(g), "link_width": g.get("link_width"),
                    "link_max_width": g.get("link_width_capable"),
                    "link_transfers_per_second": guard_metrics.transfers_per_second(g.get("link_speed")),
                    "link_max_transfers_per_second": guard_metrics.transfers_per_second(g.get("link_speed_capable"))})
    return out


def health_findings(settings: list, vendors: dict | None = None) -> list:
    """``[{gpu, vendor, check, state, reason}]``: each health row (``Family.health``) that fails or needs a reset,
    per GPU it names.

    The GPUs are the PCI addresses in the row's running value and reason (a health family names every GPU
    it finds at fault there); a finding of the node as a whole (a DCGM verdict) has ``gpu`` "". ``vendor``: the
    GPU's on the bus (``vendors``, facts' ``pci.gpu_vendors``), else the row's.
    """
    health = all_families.health_families()
    vendors = vendors or {}
    out = []
    for s in settings:
        if s["family"] not in health or s["state"] not in ("drifted", "pending_reboot"):
            continue
        gpus = sorted(set(_BDF.findall("%s %s" % (s.get("running") or "", s.get("reason") or "")))) or [""]
        out += [{"gpu": g, "vendor": vendors.get(g) or s.get("vendor") or "", "check": s["name"], "state": s["state"],
                 "reason": s["reason"]} for g in gpus]
    return out


def update_gpu_faults(data: bytes | None, vendors: dict) -> dict:
    """The amdgpu kernel-log fault events of this boot (``amdgpu_log``'s classes, every record level), counters
    since boot like the Xid ones: ``{"counts": {gpu: {class: n}}, "serious": {gpu: n}, "vendor": {gpu: vendor}}``;
    ``serious`` (the trouble classes) exists for every AMD GPU on the bus from the first run, at 0."""
    amd = sorted(b for b, v in vendors.items() if v == "amd")
    summary = amdgpu_log.summarize(kernel_log.parse_kmsg(data, None)[0] if data and b"amdgpu" in data else ())
    counts = {gpu: dict(sorted(c.items())) for gpu, c in sorted(summary["by_device"].items())}
    serious = dict.fromkeys(amd, 0)
    for gpu, c in counts.items():
        serious[gpu] = sum(n for cls, n in c.items() if cls in amdgpu_log.TROUBLE_CLASSES)
    return {"counts": counts, "serious": serious,
            "vendor": {gpu: vendors.get(gpu) or "amd" for gpu in set(counts) | set(serious)}}


NO_GPU_MEMORY = {"ecc": [], "ecc_blocks": [], "bad_pages": [], "bad_page_thresholds": []}
_BAD_PAGE_STATES = ("retired", "pending", "unreservable")


def gpu_memory(probe: dict | None, facts: dict | None) -> dict:
    """ECC error counts and bad pages per GPU, from the GPU probe's answers verification judged (no call of its own).

    ``{"ecc": [{gpu, vendor, type, count}], "ecc_blocks": [{gpu, vendor, type, block, count}],
    "bad_pages": [{gpu, vendor, state, count}], "bad_page_thresholds": [{gpu, vendor, threshold, reached}]}``.
    AMD (``amd-smi metric``, ``bad-pages``, ``static``): correctable, uncorrectable and deferred totals and per
    block (the blocks with an error only), retired/pending/unreservable pages, the RAS threshold. NVIDIA (the
    health query): uncorrectable errors since the driver loaded (``ecc.errors.uncorrected.volatile.total``) and a
    row-remapping failure as the threshold reached (``remapped_rows.failure``); the query has no corrected or
    per-page counts. A GPU or a
    field the tool does not give (N/A, a failed call) has no sample: a missing count is never a zero.
    """
    out = {k: [] for k in NO_GPU_MEMORY}
    probe = nvidia_smi.probe_answers(probe)
    vendors = set((((facts or {}).get("pci") or {}).get("gpu_vendors") or {}).values())
    if "amd" in vendors:
        _amd_memory(probe, out)
    if "nvidia" in vendors:
        _nvidia_memory(probe, out)
    return out


def _amd_memory(probe: dict, out: dict) -> None:
    readings, _problems, _notes = amd_health.read_answers(probe)
    bdfs = amd_health.gpu_bdfs(readings)

    def gpu(index):
        return bdfs.get(index) or "gpu%s" % index
    _amd_ecc(readings, gpu, out)
    _amd_pages(readings, gpu, out)


def _amd_ecc(readings: dict, gpu: Callable, out: dict) -> None:
    for g in (readings.get("amd_metric") or {}).get("gpus") or []:
        for kind in ("correctable", "uncorrectable", "deferred"):
            if g.get("ecc_" + kind) is not None:
                out["ecc"].append({"gpu": gpu(g["gpu"]), "vendor": "amd", "type": kind, "count": g["ecc_" + kind]})
        for block, counts in sorted((g.get("ecc_blocks") or {}).items()):
            if not any(counts.values()):
                continue  # a block with no error has no series (about 20 blocks x 3 types per GPU otherwise)
            for kind, n in counts.items():
                if n is not None:
                    out["ecc_blocks"].append({"gpu": gpu(g["gpu"]), "vendor": "amd", "type": kind, "block": block,
                                              "count": n})


def _amd_pages(readings: dict, gpu: Callable, out: dict) -> None:
    retired = {}
    for g in (readings.get("amd_bad_pages") or {}).get("gpus") or []:
        retired[g["gpu"]] = g.get("retired")
        for state in _BAD_PAGE_STATES:
            if g.get(state) is not None:
                out["bad_pages"].append({"gpu": gpu(g["gpu"]), "vendor": "amd", "state": state, "count": g[state]})
    for g in (readings.get("amd_static") or {}).get("gpus") or []:
        threshold = g.get("bad_page_threshold")
        reached = amd_health.threshold_reached(g, retired.get(g["gpu"]))
        if threshold is not None or reached is not None:
            out["bad_page_thresholds"].append({"gpu": gpu(g["gpu"]), "vendor": "amd", "threshold": threshold,
                                               "reached": reached})


def _nvidia_memory(probe: dict, out: dict) -> None:
    health = probe.get("health") or {}
    if probe.get("probe") != "present" or health.get("rc", 0) != 0 or health.get("timed_out"):
        return
    for g in nvidia_smi.parse_health(health.get("stdout"), health.get("fields")):
        volatile = str(g.get("ecc.errors.uncorrected.volatile.total") or "").strip()
        if volatile.isdigit():
            out["ecc"].append({"gpu": g["bdf"], "vendor": "nvidia", "type": "uncorrectable", "count": int(volatile)})
        failure = str(g.get("remapped_rows.failure") or "").strip().lower()
        if failure in ("yes", "no"):
            out["bad_page_thresholds"].append({"gpu": g["bdf"], "vendor": "nvidia", "threshold": None,
                                               "reached": failure == "yes"})


def drifted_cpus(s: dict, online: int) -> int | None:
    """How many CPUs a per-CPU setting is wrong on (0 when applied), as its family counts them
    (``Family.drifted_cpus``); None for any other setting."""
    fam = all_families.of_report(s["family"])
    if fam is None or fam.drifted_cpus is None:
        return None
    return fam.drifted_cpus(s, online)


def status_settings(result: dict | None, facts: dict | None, previous: dict | None, now: float) -> list:
    """The settings of the status: verification's rows, the CPUs they differ on, when first seen drifted."""
    before = {s["id"]: s for s in (previous or {}).get("settings") or [] if isinstance(s, dict) and "id" in s}
    online = ((facts or {}).get("cpu") or {}).get("online_count") or 0
    out = []
    for s in (result or {}).get("settings") or []:
        row = {k: s.get(k) for k in ("id", "family", "name", "state", "desired", "running", "reason")}
        if s.get("cause"):
            row["cause"] = s["cause"]
        row["drifted_cpus"] = drifted_cpus(s, online)
        first = None
        if s["state"] == "drifted":
            prev = before.get(s["id"]) or {}
            first = prev.get("first_seen_drifted") if prev.get("state") == "drifted" else None
            first = now if first is None else first
        row["first_seen_drifted"] = first
        row["first_seen_drifted_at"] = None if first is None else iso_time(first)
        out.append(row)
    return out


def iso_time(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def reapply_counts(previous: dict | None, boot_id: str, reapplied: list) -> dict:
    """Families re-applied (successfully) since boot: the previous run's counts of this boot plus this run's."""
    prev = previous if (previous or {}).get("boot_id") == boot_id and boot_id else {}
    counts = dict((prev or {}).get("counts") or {})
    for key, ok, _msg in reapplied:
        if ok:
            counts[key] = counts.get(key, 0) + 1
    return {"boot_id": boot_id, "counts": counts,
            "last_run": [{"family": k, "ok": ok, "message": msg} for k, ok, msg in reapplied]}


def build_status(config: dict, outcome: dict, previous: dict | None, now: float) -> dict:
    """The status a run writes (and renders as metrics): ``outcome`` holds facts, result, error, xid, reapplied."""
    guard = config["guard"]
    result, facts, prev = outcome.get("result"), outcome.get("facts"), previous or {}
    status = {
        "version": VERSION, "host": guard["host"], "preset": guard["preset"],
        "collection_version": guard["collection_version"], "mode": "reapply" if guard["reapply"] else "read-only",
        "interval_seconds": guard["interval_seconds"],
        "run": {"started_at": iso_time(outcome["started"]), "timestamp": now,
                "duration_seconds": round(outcome["duration"], 6), "success": result is not None,
                "error": outcome.get("error")},
        "verdict": result["status"] if result is not None else "error",
        "failures": result["failures"] if result is not None else ["verification could not run: %s"
                                                                   % outcome.get("error")],
        "counts": (result or {}).get("counts") or {},
        "settings": status_settings(result, facts, prev, now),
        "boot_unit": ((result or {}).get("node") or {}).get("boot_unit_state"),
        "gpus": gpu_links(facts),
        "health_findings": health_findings((result or {}).get("settings") or [],
                                           ((facts or {}).get("pci") or {}).get("gpu_vendors")),
        "gpu_faults": outcome.get("gpu_faults") or {"counts": {}, "serious": {}, "vendor": {}},
        "gpu_memory": outcome.get("gpu_memory") or dict(NO_GPU_MEMORY),
        "kernel_log": {k: ((result or {}).get("kernel_log") or {}).get(k) for k in ("since", "since_detail", "counts")},
        "xid": outcome["xid"],
        "reapply": reapply_counts(prev.get("reapply"), outcome["xid"]["boot_id"], outcome.get("reapplied") or []),
        # issue 44: the AER reading the next run (and verification) compares with, and each GPU's BARs
        "aer": aer.stored(facts_part(facts, "aer")) or prev.get("aer"),
        "gpu_bars": gpu_bars(facts),
    }
    return status


def facts_part(facts: dict | None, key: str) -> Any:
    """``key`` of the first family's facts section that has it (the health family's ``aer`` reading, the P2P
    family's ``bars``): the guard names no family."""
    for section in (facts or {}).values():
        if isinstance(section, dict) and isinstance(section.get(key), dict):
            return section[key]
    return None


def gpu_bars(facts: dict | None) -> list:
    """``[{gpu, vendor, bar, size, max_supported}]``: each selected GPU's memory BARs (gpu_p2p's facts), the
    largest size its Resizable BAR capability supports for each (None without one)."""
    out = []
    for bdf, g in sorted((facts_part(facts, "bars") or {}).items()):
        rebar = {int(k): v for k, v in (g.get("rebar") or {}).items()}
        for index, size in sorted((int(k), v) for k, v in (g.get("bars") or {}).items()):
            supported = (rebar.get(index) or {}).get("supported")
            out.append({"gpu": bdf, "vendor": g.get("vendor") or "", "bar": index, "size": size,
                        "max_supported": max(supported) if supported else None, "memory": g.get("memory")})
    return out


# -- One run


def verify_once(node: Node, config: dict, tools: verify_node.Tools) -> tuple:
    """``(facts, result, error, probe)``: verification as tuning_info runs it, and the GPU probe's answers it judged
    by; an error instead of raising."""
    facts_options = {k: v for k, v in config["facts"].items() if v is not None}
    try:
        facts, result, probe = verify_node.verify_probed(node, config["desired"], config["verify"], tools,
                                                         facts_options)
    except (FactsError, NodeError, EvaluationError, kernel_log.KernelLogError) as exc:
        return None, None, str(exc), {}
    except ImportError as exc:  # a kmsg_ignore rule with a cidr on a node without python3-netaddr
        return None, None, "kmsg_ignore rules with a cidr need python3-netaddr on the node (%s)" % exc, {}
    return facts, result, None, probe


def reapply_plan(result: dict, desired: dict) -> dict:
    """The boot families to re-apply: those with a drifted setting that runtime tuning brings (not a reboot)."""
    report_to_key = all_families.boot_report_families()
    keys = {report_to_key[s["family"]] for s in result.get("settings") or []
            if s["state"] == "drifted" and s.get("runtime", True) and s["family"] in report_to_key}
    state = boot.boot_state(desired)
    return {k: state[k] for k in keys if k in state}


def reapply(node: Node, config: dict, plan: dict) -> list:
    """``boot.boot_each`` of ``plan`` under the node's lock (flows/writers.py: ``.lock`` next to the journal, in the
    status file's directory), as every writing flow; held by another writer past the wait, nothing is re-applied
    and each family's entry says who holds it."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import writers

    journal = os.path.join(os.path.dirname(config["guard"]["status_file"]), "journal.json")
    try:
        with writers.writing(node, journal, REAPPLY_FLOW):
            return boot.boot_each(node, plan)
    except lock.LockError as exc:
        return [(key, False, "not re-applied: %s" % exc) for key in sorted(plan) if key != "version"]


def run(node: Node, config: dict, tools: verify_node.Tools, previous: dict | None,
        clock: Callable[[], float] = time.time) -> dict:
    """Verify (and with ``reapply`` re-apply and verify again), count Xids; the status of this run."""
    started, t0 = clock(), time.monotonic()
    facts, result, error, probe = verify_once(node, config, tools)
    reapplied = []
    if config["guard"]["reapply"] and result is not None:
        try:
            plan = reapply_plan(result, config["desired"])
        except boot.BootError as exc:
            plan, reapplied = {}, [("desired", False, "cannot re-apply: %s" % exc)]
        if plan:
            reapplied = reapply(node, config, plan)
            for key, ok, msg in reapplied:
                _say("%s: re-applied %s: %s%s" % (PREFIX, key, "" if ok else "FAILED: ", msg))
            facts, result, error, probe = verify_once(node, config, tools)
    boot_id = node.read(verify_node.BOOT_ID, default="")
    data, _why = kernel_log.read_kmsg(node)
    xid = update_xids((previous or {}).get("xid"), boot_id, data, [g["bdf"] for g in selected_gpus(facts, "nvidia")])
    faults = update_gpu_faults(data, ((facts or {}).get("pci") or {}).get("gpu_vendors") or {})
    outcome = {"facts": facts, "result": result, "error": error, "xid": xid, "gpu_faults": faults,
               "gpu_memory": gpu_memory(probe, facts),
               "reapplied": reapplied,
               "started": started, "duration": time.monotonic() - t0}
    return build_status(config, outcome, previous, clock())


# -- Files: the lock, the previous status (written by core/files.py's replace_file: readers never see half)


def read_previous(path: str) -> dict | None:
    """The last run's status, None when there is none or it cannot be read (the next one replaces it)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == VERSION else None


class Busy(Exception):
    """Another guard run holds the lock."""


def lock_directory(directory: str) -> int:
    """An exclusive, non-blocking flock on ``directory`` (created 0700 when missing); Busy when held."""
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700)
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy(directory) from None
    return fd


def write_outputs(node: Node, config: dict, status: dict) -> list:
    """Write the metrics (when a textfile directory is set) and then the status; the problems, if any."""
    problems = []
    textfile_dir = config["guard"]["textfile_dir"]
    metrics = {"file": None, "written": False, "off": True, "reason": "gpunode_tuning_guard_textfile_dir is empty"}
    if textfile_dir:
        target = node.path(textfile_dir)
        metrics["file"] = os.path.join(textfile_dir, TEXTFILE)
        if not os.path.lexists(target):
            # Not an error: the metrics start at the first run after the directory exists.
            metrics["reason"] = missing_textfile_dir(textfile_dir)
        else:
            metrics["off"] = False
            try:
                files.replace_file(os.path.join(target, TEXTFILE), guard_metrics.render(status).encode("utf-8"))
                metrics.update(written=True, reason="")
            except OSError as exc:
                metrics["reason"] = "cannot write the metrics %s: %s" % (metrics["file"], files.os_error(exc))
                problems.append(metrics["reason"])
    status["metrics"] = metrics
    try:
        # Compact: json's C encoder (an indent selects the pure-Python one, several times slower).
        files.replace_file(node.path(config["guard"]["status_file"]),
                           (json.dumps(status, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8"))
    except OSError as exc:
        problems.append("cannot write the status %s: %s" % (config["guard"]["status_file"], files.os_error(exc)))
    return problems


def missing_textfile_dir(textfile_dir: str) -> str:
    """What the guard and the persistent flow say of a textfile directory that does not exist (yet)."""
    return ("node_exporter's textfile directory %s does not exist: metrics are off and start at the first guard run "
            "after it exists (install prometheus-node-exporter, or set gpunode_tuning_guard_textfile_dir to its "
            "--collector.textfile.directory, or to \"\" for no metrics); the status file is written either way"
            % textfile_dir)


def summary(status: dict) -> str:
    """The run's journald line: verdict, counts, what drifted."""
    drifted = [s["id"] for s in status["settings"] if s["state"] == "drifted"]
    return "%s: %s in %.2f s; %s%s" % (
        PREFIX, status["verdict"], status["run"]["duration_seconds"],
        ", ".join("%d %s" % (n, k) for k, n in sorted(status["counts"].items()) if n) or "no settings",
        ("; drifted: " + ", ".join(drifted[:10]) + (" ..." if len(drifted) > 10 else "")) if drifted else "")


def parse_args(argv: list | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PREFIX, description="Re-verify gpunode.tuning's settings; write metrics.")
    parser.add_argument("--config", required=True, help="the guard config JSON file (below --root)")
    parser.add_argument("--root", default="/", help="the node root (a simulated node's directory in tests)")
    return parser.parse_args(argv)


def main(argv: list | None = None) -> int:
    """The guard unit's entry point (``RUNNER guard ...``); returns the exit status."""
    args = parse_args(argv)
    try:
        node = Node.open(args.root)
        config = load_config(node.path(args.config) if args.root != "/" else args.config)
        status_path = node.path(config["guard"]["status_file"])
        fd = lock_directory(os.path.dirname(status_path))
    except Busy as exc:
        _say("%s: another guard run holds %s; this one does nothing" % (PREFIX, exc))
        return 0
    except OSError as exc:
        where = "%s: " % exc.filename if exc.filename else ""
        _say("%s: FAILED: %s%s" % (PREFIX, where, files.os_error(exc)))
        return 2
    except (GuardError, NodeError) as exc:
        _say("%s: FAILED: %s" % (PREFIX, exc))
        return 2
    try:
        tools = command_tools(node, config["guard"]["command_timeout_seconds"])
        status = run(node, config, tools, read_previous(status_path))
        problems = write_outputs(node, config, status)
    finally:
        os.close(fd)
    _say(summary(status))
    if status["metrics"]["off"] and config["guard"]["textfile_dir"]:
        _say("%s: %s" % (PREFIX, status["metrics"]["reason"]))
    problems = ([status["run"]["error"]] if status["run"]["error"] else []) + problems + [
        "re-applying %s failed: %s" % (r["family"], r["message"]) for r in status["reapply"]["last_run"] if not r["ok"]]
    for problem in problems:
        _say("%s: FAILED: %s" % (PREFIX, problem))
    return 0 if status["run"]["success"] and not problems else 1
