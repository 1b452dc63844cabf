# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Health of AMD GPUs from amd-smi and the amdgpu kernel log: the GPU probe's commands and the rows they give.

The GPU probe (flows/verify.gpu_probe) runs ``COMMANDS``: one amd-smi call per subcommand for all GPUs, asking
for JSON, found on the node's PATH, then in ``/opt/rocm/bin`` (where ROCm installs it), and on a simulated root
in its ``usr/bin``; each bounded by ``gpunode_tuning_command_timeouts.amd_smi``. After a call that hangs nothing
more is asked of amd-smi. ``rows`` turns the answers (read by core/amd_smi.py) and the kernel log's amdgpu classes
(core/amdgpu_log.py, counted per GPU) into verification rows, one per check:

- ``amd_smi``: amd-smi answers every call; missing, hanging, an error or JSON that does not decode while AMD GPUs
  are on the bus is drifted with the reason (never healthy, never not applicable: those GPUs are unchecked).
- ``amd_gpu_count``: the physical GPUs amd-smi lists (partitions of CPX/DPX/QPX modes counted once) against the
  AMD GPUs of the PCI bus.
- ``amd_ecc``: uncorrectable or deferred ECC errors (totals, per block where given) fail; correctable ones are
  reported.
- ``amd_bad_pages``: retired pages at or above the RAS threshold (or amd-smi's ``bad_page_threshold_exceeded``)
  fail; pending pages are ``pending_reboot`` (a GPU reset retires them).
- ``amd_pcie_link``: a link narrower than the GPU's maximum fails (width does not drop at idle); a slower
  one is reported (idle GPUs lower their link speed).
- ``amd_xgmi``: an XGMI link down between the GPUs fails (``xgmi -l``; without it ``topology``'s XGMI links).
- ``amd_kernel_log``: the amdgpu kernel-log trouble classes (GPU reset, VRAM lost, uncorrectable RAS errors,
  poison consumed, bad-page threshold, ring timeouts, fatal init errors) fail, counted per GPU.

A field amd-smi does not give (``N/A``, an older release) costs only its row: the row says which GPUs lack it.
A call amd-smi refuses as one it lacks (argparse's refusal, or its own ``{"error", "code"}`` document, exit 0 or
not: ``refusals``) is handled as an older release: ``xgmi -l`` falls back to topology, another call's checks are
``unsupported`` rows naming the release and amd-smi's words; the node is not failed for it.
Plain Python (3.8+), no Ansible import; names no family (the caller passes its row factory).
"""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.gpunode.tuning.plugins.module_utils.core import amd_smi, amdgpu_log, command
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import GpuCommand

TOOL = "amd-smi"
PACKAGE = "amd-smi-lib"
# Where ROCm installs amd-smi when it is not on PATH (below the node's root).
DIRS = ("opt/rocm/bin",)
MISSING = ("amd-smi not found on the node's PATH nor in /opt/rocm/bin: install ROCm's amd-smi-lib (ROCm 6 or "
           "later); the AMD GPUs on the bus are unchecked")
# Probe key -> amd_smi.COMMANDS name; the order is the order they run in.
KEYS = {"amd_version": "version", "amd_list": "list", "amd_static": "static", "amd_metric": "metric",
        "amd_bad_pages": "bad_pages", "amd_topology": "topology", "amd_xgmi_link_status": "xgmi_link_status"}
COMMANDS = tuple(GpuCommand(key, tuple(amd_smi.COMMANDS[name]["argv"]), tool=TOOL, package=PACKAGE, missing=MISSING,
                            standalone=True, dirs=DIRS, vendor="amd") for key, name in KEYS.items())
READERS = {"amd_list": amd_smi.read_list, "amd_static": amd_smi.read_static, "amd_metric": amd_smi.read_metric,
           "amd_bad_pages": amd_smi.read_bad_pages, "amd_topology": amd_smi.read_topology,
           "amd_xgmi_link_status": amd_smi.read_xgmi_link_status}
# The calls every row needs; xgmi -l is optional (before ROCm 6.4 topology answers for it).
REQUIRED = ("amd_list", "amd_static", "amd_metric", "amd_bad_pages", "amd_topology")

Row = Callable[..., dict]


def argv_text(key: str) -> str:
    """``amd-smi metric --json`` of a probe key."""
    return " ".join([TOOL] + list(amd_smi.COMMANDS[KEYS[key]]["argv"]))


def call_failure(key: str, answer: dict | None) -> str | None:
    """Why a call gave no answer to read (not asked, missing, hung, failed), None when it answered rc 0."""
    if not answer:
        return "%s was not asked" % argv_text(key)
    if answer.get("not_run"):
        return "%s was not asked: %s" % (argv_text(key), answer["not_run"])
    if answer.get("rc") == 127:
        return answer.get("stderr") or MISSING
    if answer.get("timed_out") or answer.get("rc") == command.TIMEOUT_RC:
        return "%s: %s" % (argv_text(key), command.failure(argv_text(key), answer_result(answer)))
    if answer.get("rc", 0) != 0:
        return command.failure(argv_text(key), answer_result(answer))
    return None


def answer_result(answer: dict) -> command.Result:
    """A probe's answer (``{rc, stdout, stderr, timed_out}``) as the ``command.Result`` the readers take."""
    return command.Result(answer.get("rc", 0), answer.get("stdout") or "", answer.get("stderr") or "",
                          timed_out=bool(answer.get("timed_out")))


def refusals(probe: dict) -> dict:
    """``{probe key: why}``: the calls this amd-smi refused, as a release without the subcommand or option does
    (argparse's refusal, or amd-smi's own error document for it, whatever its exit status)."""
    out = {}
    for key in READERS:
        answer = (probe or {}).get(key)
        if answer and not answer.get("not_run") and not answer.get("timed_out"):
            why = amd_smi.refusal(answer_result(answer))
            if why:
                out[key] = why
    return out


def release_text(probe: dict) -> str:
    """``amd-smi (tool 25.4.2+aca1101, rocm 6.4.1)`` from the probe's ``amd-smi version`` answer."""
    version = amd_smi.read_version(((probe or {}).get("amd_version") or {}).get("stdout"))
    release = ", ".join("%s %s" % (k, version[k]) for k in ("tool", "rocm") if version.get(k))
    return "amd-smi (%s)" % release if release else "amd-smi (version not known)"


def refused_reason(probe: dict, key: str, why: str) -> str:
    """What a refused call costs, naming the release: ``amd-smi (tool ..., rocm ...) refused `amd-smi bad-pages
    --json` (<its words>)``."""
    return "%s refused `%s` (%s): this release or system does not offer it" % (release_text(probe), argv_text(key),
                                                                               why)


def read_answers(probe: dict) -> tuple:
    """``(readings, problems, notes)``: each answered call read (key -> reader result), what failed, and notes
    (a call refused by this release: ``xgmi -l`` before ROCm 6.4, whose XGMI links come from topology; another
    call refused costs only its rows, which say so)."""
    readings, problems, notes = {}, [], []
    refused = refusals(probe)
    for key, reader in READERS.items():
        answer = probe.get(key)
        if key in refused:
            notes.append("%s is not known to this amd-smi (%s)%s" % (
                argv_text(key), refused[key],
                ": XGMI links from topology" if key == "amd_xgmi_link_status" else ": its checks are unsupported"))
            continue
        why = call_failure(key, answer)
        if why:
            if key in REQUIRED or not (answer or {}).get("not_run"):
                problems.append(why)
            continue
        reading = reader(answer.get("stdout"))
        if reading["finding"]:
            problems.append("%s: %s" % (argv_text(key), reading["finding"]))
            continue
        readings[key] = reading
    return readings, _unique(problems), notes


def _unique(items: list) -> list:
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def rows(facts: dict, gpus: list, probe: dict, row: Row) -> list:
    """The AMD rows of a host: ``gpus`` the selected AMD GPUs of the bus (facts' device dicts), ``probe`` the GPU
    probe's answers, ``row(name, desired, running, state, reason)`` the caller's row factory. No AMD GPU selected,
    or the probe disabled: no row."""
    if not gpus or (probe or {}).get("probe") == "disabled":
        return []
    probe = probe or {}
    bus = [g["bdf"] for g in gpus]
    readings, problems, notes = read_answers(probe)
    version = amd_smi.read_version((probe.get("amd_version") or {}).get("stdout"))
    out = [_tool_row(row, problems, notes, version, readings, len(bus))]
    names = _names(readings)
    refused = refusals(probe)
    builders = (("amd_list", "amd_gpu_count", len(bus), lambda r: count_row(row, r, bus, readings.get("amd_static"))),
                ("amd_metric", "amd_ecc", 0, lambda r: ecc_row(row, r, names)),
                ("amd_bad_pages", "amd_bad_pages", "below threshold",
                 lambda r: bad_pages_row(row, r, readings.get("amd_static"), names)),
                ("amd_metric", "amd_pcie_link", "maximum width",
                 lambda r: link_row(row, r, readings.get("amd_static"), names)))
    for key, name, desired, build in builders:
        if key in readings:
            out.append(build(readings[key]))
        elif key in refused:  # as an older amd-smi: the check is not offered, the node is not failed for it
            out.append(row(name, desired, None, "unsupported", refused_reason(probe, key, refused[key])))
    xgmi = xgmi_row(row, readings, names, len(bus))
    if xgmi:
        out.append(xgmi)
    elif "amd_topology" in refused:
        out.append(row("amd_xgmi", "all up", None, "unsupported",
                       refused_reason(probe, "amd_topology", refused["amd_topology"])))
    out.append(kernel_log_row(row, facts, bus))
    return out


def _tool_row(row: Row, problems: list, notes: list, version: dict, readings: dict, on_bus: int) -> dict:
    release = ", ".join("%s %s" % (k, version[k]) for k in ("tool", "rocm") if version.get(k))
    if problems:
        return row("amd_smi", "answers", "; ".join(problems)[:300], "drifted",
                   "%s; %d AMD GPU(s) on the PCI bus are not checked by it" % ("; ".join(problems), on_bus))
    listed = len(readings.get("amd_list", {}).get("gpus") or [])
    reason = "amd-smi%s answered %s for %d GPU(s)" % (" (%s)" % release if release else "",
                                                      ", ".join(amd_smi.COMMANDS[KEYS[k]]["argv"][0]
                                                                if k != "amd_xgmi_link_status" else "xgmi -l"
                                                                for k in READERS if k in readings), listed)
    return row("amd_smi", "answers", "answers", "applied", "; ".join([reason] + notes))


def gpu_bdfs(readings: dict) -> dict:
    """GPU index -> PCI address, from list (else static, topology)."""
    out = {}
    for key in ("amd_topology", "amd_static", "amd_list"):
        for g in (readings.get(key) or {}).get("gpus") or []:
            if g.get("gpu") is not None and g.get("bdf"):
                out[g["gpu"]] = g["bdf"]
    return out


def _names(readings: dict) -> dict:
    """GPU index -> ``"GPU 3 (0000:65:00.0)"``."""
    return {index: "GPU %d (%s)" % (index, bdf) for index, bdf in gpu_bdfs(readings).items()}


def _name(names: dict, index: Any) -> str:
    return names.get(index) or "GPU %s" % index


def count_row(row: Row, listed: dict, bus: list, static: dict | None) -> dict:
    """``amd_gpu_count``: amd-smi's physical GPUs (partitions counted once) against the AMD GPUs on the bus."""
    count = amd_smi.count_against_bus(listed["gpus"], bus)
    modes = sorted({g["compute_partition"] for g in (static or {}).get("gpus") or [] if g.get("compute_partition")})
    partitions = "" if count["partitions"] == len(count["physical"]) else \
        " (%d partitions%s)" % (count["partitions"], ", " + "/".join(modes) if modes else "")
    running = "%d listed by amd-smi%s, %d on the PCI bus" % (len(count["physical"]), partitions, len(count["bus"]))
    problems = []
    if count["missing"]:
        problems.append("on the PCI bus but not listed by amd-smi: %s (amdgpu not bound, or the GPU failed its "
                        "init?)" % ", ".join(count["missing"]))
    if count["unexpected"]:
        problems.append("listed by amd-smi but not on the PCI bus: %s (fallen off the bus?)"
                        % ", ".join(count["unexpected"]))
    if problems:
        return row("amd_gpu_count", len(count["bus"]), running, "drifted", "; ".join(problems))
    return row("amd_gpu_count", len(count["bus"]), running, "applied", "")


def _blocks(gpu: dict, kind: str) -> str:
    found = ["%s %d" % (block, counts[kind]) for block, counts in sorted(gpu.get("ecc_blocks", {}).items())
             if counts.get(kind)]
    return " in %s" % ", ".join(found) if found else ""


def ecc_row(row: Row, metric: dict, names: dict) -> dict:
    """``amd_ecc``: uncorrectable or deferred ECC errors fail, naming the GPU and block; correctable reported."""
    gpus = metric["gpus"]
    failing, reported, missing = [], [], []
    for g in gpus:
        name = _name(names, g["gpu"])
        if g["ecc_uncorrectable"] is None and g["ecc_deferred"] is None:
            missing.append(name)
        for kind, key in (("uncorrectable", "ecc_uncorrectable"), ("deferred", "ecc_deferred")):
            if g[key]:
                failing.append("%s: %d %s ECC error(s)%s" % (name, g[key], kind, _blocks(g, kind)))
        if g["ecc_correctable"]:
            reported.append("%s: %d correctable" % (name, g["ecc_correctable"]))
    if gpus and len(missing) == len(gpus):
        return row("amd_ecc", 0, None, "unsupported",
                   "amd-smi metric gives no ECC count (N/A) for %s: RAS not enabled on these GPUs?"
                   % ", ".join(missing))
    notes = (["reported: " + "; ".join(reported)] if reported else []) + \
        (["no ECC count (N/A) for %s" % ", ".join(missing)] if missing else [])
    if failing:
        return row("amd_ecc", 0, "; ".join(failing)[:300], "drifted", "; ".join(failing + notes))
    return row("amd_ecc", 0, 0, "applied", "; ".join(notes) or "no uncorrectable or deferred ECC error")


def threshold_reached(limit: dict, retired: int | None) -> bool | None:
    """Whether a GPU's retired pages reached its RAS threshold: amd-smi's ``bad_page_threshold_exceeded``, or
    ``retired >= bad_page_threshold``; None when neither is known (the health row and the guard's series)."""
    exceeded, threshold = limit.get("bad_page_threshold_exceeded"), limit.get("bad_page_threshold")
    if exceeded:
        return True
    if threshold and retired is not None:
        return retired >= threshold
    return exceeded


def bad_pages_row(row: Row, pages: dict, static: dict | None, names: dict) -> dict:
    """``amd_bad_pages``: retired pages at the RAS threshold fail (the driver stops using the GPU); pending pages
    are ``pending_reboot`` (a GPU reset retires them)."""
    limits = {g["gpu"]: g for g in (static or {}).get("gpus") or []}
    failing, pending, reported, unknown = [], [], [], []
    for g in pages["gpus"]:
        name = _name(names, g["gpu"])
        limit = limits.get(g["gpu"], {})
        threshold = limit.get("bad_page_threshold")
        retired = g.get("retired")
        if retired is None:
            unknown.append(name)
            continue
        if threshold_reached(limit, retired):
            failing.append("%s: %d retired page(s), RAS threshold %s reached: the GPU is due for replacement"
                           % (name, retired, threshold if threshold else "(amd-smi: exceeded)"))
        elif retired:
            reported.append("%s: %d retired page(s) of threshold %s" % (name, retired, threshold or "N/A"))
        if g.get("pending"):
            pending.append("%s: %d page(s) pending retirement" % (name, g["pending"]))
    notes = reported + (["no retired-page count for %s" % ", ".join(unknown)] if unknown else [])
    if failing:
        return row("amd_bad_pages", "below threshold", "; ".join(failing)[:300], "drifted",
                   "; ".join(failing + pending + notes))
    if pending:
        return row("amd_bad_pages", "below threshold", "; ".join(pending)[:300], "pending_reboot",
                   "; ".join(pending + notes) + "; a GPU reset (or reboot) retires them")
    if unknown and len(unknown) == len(pages["gpus"]):
        return row("amd_bad_pages", "below threshold", None, "unsupported", "; ".join(notes))
    return row("amd_bad_pages", "below threshold", "below threshold", "applied", "; ".join(notes) or "no bad page")


def link_row(row: Row, metric: dict, static: dict | None, names: dict) -> dict:
    """``amd_pcie_link``: width below the maximum fails; speed below it is reported (idle GPUs lower it)."""
    maxima = {g["gpu"]: g for g in (static or {}).get("gpus") or []}
    narrow, slow, unknown, seen = [], [], [], set()
    for g in metric["gpus"]:
        limit = maxima.get(g["gpu"], {})
        key = names.get(g["gpu"], g["gpu"])
        if key in seen:
            continue
        seen.add(key)
        name = _name(names, g["gpu"])
        width, max_width = g.get("pcie_width"), limit.get("max_pcie_width")
        speed, max_speed = g.get("pcie_speed_gts"), limit.get("max_pcie_speed_gts")
        if width is None or max_width is None:
            unknown.append(name)
        elif width < max_width:
            narrow.append("%s link x%d of x%d" % (name, width, max_width))
        if speed is not None and max_speed is not None and speed < max_speed:
            slow.append("%s link %g GT/s of %g GT/s" % (name, speed, max_speed))
    notes = (["informational: %s; idle GPUs lower their link speed" % "; ".join(slow)] if slow else []) + \
        (["no link width or maximum (N/A) for %s" % ", ".join(unknown)] if unknown else [])
    if narrow:
        return row("amd_pcie_link", "maximum width", "; ".join(narrow), "drifted",
                   "; ".join(["%s: trained below the maximum width (width does not drop at idle: check the riser, "
                              "slot and seating)" % "; ".join(narrow)] + notes))
    if unknown and len(unknown) == len(seen):
        return row("amd_pcie_link", "maximum width", None, "unsupported", "; ".join(notes))
    return row("amd_pcie_link", "maximum width", "maximum width", "applied",
               "; ".join(notes) or "%d GPU link(s) at their maximum width" % len(seen))


def xgmi_row(row: Row, readings: dict, names: dict, on_bus: int) -> dict | None:
    """``amd_xgmi``: every XGMI link between the GPUs up (``xgmi -l``; else topology's XGMI links enabled)."""
    status = readings.get("amd_xgmi_link_status")
    if status is not None:
        down = ["%s: %d XGMI link(s) down" % (_name(names, g["gpu"]), g["down"]) for g in status["gpus"] if g["down"]]
        up = sum(g["up"] for g in status["gpus"])
        source = "amd-smi xgmi -l"
    elif "amd_topology" in readings:
        links = [(g, link) for g in readings["amd_topology"]["gpus"] for link in g["links"]
                 if (link.get("link_type") or "").upper() == "XGMI"]
        if not links:
            return row("amd_xgmi", "all up", None, "not_applicable",
                       "no XGMI link between the GPUs (amd-smi topology): PCIe only" if on_bus > 1 else "one GPU")
        down = ["%s: XGMI link to GPU %s %s" % (_name(names, g["gpu"]), link["peer"], link["link_status"])
                for g, link in links if (link.get("link_status") or "").upper() not in ("ENABLED", "UP")]
        up = len(links) - len(down)
        source = "amd-smi topology"
    else:
        return None
    if down:
        return row("amd_xgmi", "all up", "; ".join(down)[:300], "drifted",
                   "%s (%s): a GPU-to-GPU link is down; collectives fall back or hang" % ("; ".join(down), source))
    return row("amd_xgmi", "all up", "all up", "applied", "%d XGMI link(s) up (%s)" % (up, source))


def kernel_log_row(row: Row, facts: dict, bus: list) -> dict:
    """``amd_kernel_log``: the amdgpu trouble classes of the kernel log, counted per GPU (any record level)."""
    kl = facts.get("kernel_log") or {}
    if not kl.get("available"):
        return row("amd_kernel_log", "no amdgpu fault", None, "unsupported",
                   "kernel log unavailable: %s" % (kl.get("reason") or "not read"))
    summary = kl.get("amdgpu") or amdgpu_log.summarize(())
    trouble = []
    for device, counts in sorted(summary["by_device"].items()):
        classes = ["%s %dx" % (c, counts[c]) for c in amdgpu_log.TROUBLE_CLASSES if counts.get(c)]
        if classes:
            trouble.append("%s: %s" % (device if device != amdgpu_log.UNKNOWN_DEVICE else "a GPU not named",
                                       ", ".join(classes)))
    running = ", ".join("%s %d" % (c, n) for c, n in summary["counts"].items() if n) or "none"
    if trouble:
        return row("amd_kernel_log", "no amdgpu fault", running, "drifted", "; ".join(trouble))
    correctable = summary["counts"].get("ras_correctable")
    return row("amd_kernel_log", "no amdgpu fault", running, "applied",
               "reported: %d correctable RAS error record(s)" % correctable if correctable else "")
