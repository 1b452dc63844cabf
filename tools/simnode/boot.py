"""The simulated reboot (issue 30): what a boot of the node brings, from the files the tuning left on it."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import uuid

from . import aspm, modparams
from .boot_faults import apply_boot_faults
from .cpu import CPU_BASE, cpufreq_family, set_cpufreq_driver
from .kernel import kernel_runs_amd_pstate
from .tree import Tree, read_rel

# -- Simulated reboot (issue 30): what a boot of the node would bring, from the files the tuning left

REBOOT_NEVER_RETURNS = "var/lib/simnode/reboot-never-returns"


# The first simulated boot records the command line without our drop-in and the node's own drivers,
# so that a later boot without the drop-in (after a rollback) goes back to them.
BOOT_RECORD = "var/lib/simnode/boot.json"
GRUB_DROPIN = "/etc/default/grub.d/60-gpunode-tuning.cfg"
JOURNAL = "/var/lib/gpunode-tuning/journal.json"
BOOT_UNIT = "etc/systemd/system/gpunode-tuning-boot.service"
BOOT_UNIT_WANTS = "etc/systemd/system/multi-user.target.wants/gpunode-tuning-boot.service"
SYSCTL_DIRS = ("etc/sysctl.d", "run/sysctl.d", "usr/local/lib/sysctl.d", "usr/lib/sysctl.d", "lib/sysctl.d")
MODULES_LOAD_DIRS = ("etc/modules-load.d", "run/modules-load.d", "usr/local/lib/modules-load.d",
                     "usr/lib/modules-load.d", "lib/modules-load.d")
# The tuning_apply module options that put each journaled family back (the rollback's own).
RESTORE_OPTIONS = {"pcie_mrrs": {"restore": True, "allow_empty": True}}
ACS_CAP_ID, ACS_REDIRECT = 0x000D, 0x002C  # ReqRedir, CmpltRedir, EgressCtrl: what disable_acs_redir= clears
REBOOT_COMMAND_TIMEOUT = 120
# This package (tools/simnode), which the node's reboot command runs, and the checkout's collections beside tools/.
PACKAGE = os.path.dirname(os.path.abspath(__file__))
COLLECTIONS = os.path.join(os.path.dirname(os.path.dirname(PACKAGE)), ".collections")


# The node's own reboot, as the collection's reboot sequence runs it on a simulated root (its path is the
# simulator's, never a real system's: a root that is a real system's copy has no such file to run).
REBOOT_COMMAND = "var/lib/simnode/reboot"
REBOOT_SCRIPT = """#!/bin/sh
# The simulated node's reboot: tools/simnode reboot on the root this file lives in (3 levels up).
root=$(cd "$(dirname "$0")/../../.." && pwd) || exit 2
exec "@PYTHON@" "@SIMNODE@" reboot "$root"
"""


def write_reboot_command(t: Tree) -> None:
    """Ship REBOOT_COMMAND: this Python running this package's ``reboot`` on the root."""
    script = REBOOT_SCRIPT.replace("@PYTHON@", sys.executable).replace("@SIMNODE@", PACKAGE)
    t.write(REBOOT_COMMAND, script.encode(), mode=0o755)


def grub_dropin_args(text: str | None) -> list:
    """The kernel arguments a GRUB drop-in adds (``GRUB_CMDLINE_LINUX_DEFAULT="$... ARGS"``), unquoted as GRUB does."""
    args = []
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key not in ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT"):
            continue
        value = value.strip().strip('"')
        for var in ("$GRUB_CMDLINE_LINUX_DEFAULT", "${GRUB_CMDLINE_LINUX_DEFAULT}", "$GRUB_CMDLINE_LINUX",
                    "${GRUB_CMDLINE_LINUX}"):
            value = value.replace(var, " ")
        args += [word.replace("'", "") for word in value.split()]
    return args


def add_kernel_args(current: list, wanted: list) -> list:
    """``current`` with each of ``wanted``: a key already there takes the new value in place, others append."""
    out = list(current)
    for arg in wanted:
        key = arg.split("=", 1)[0]
        at = [i for i, a in enumerate(out) if a.split("=", 1)[0] == key]
        if at:
            out = [a for i, a in enumerate(out) if i not in at[1:]]
            out[at[0]] = arg
        else:
            out.append(arg)
    return out


def _last_value(args: list, key: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if "=" in a and a.split("=", 1)[0] == key]
    return values[-1] if values else None


def cpufreq_after_boot(args: list, cpu_vendor: str | None, default: tuple, release: str = "6.8",
                       cppc: bool = True) -> tuple:
    """``(scaling driver, pstate mode)`` a kernel ``release`` with ``args`` loads on this CPU (``cppc``: the
    firmware's ACPI CPPC is on); ``default`` without a choice, or with one the kernel cannot honour."""
    amd, intel = _last_value(args, "amd_pstate"), _last_value(args, "intel_pstate")
    if amd in ("active", "passive", "guided") and not kernel_runs_amd_pstate(release, cppc, amd):
        return default  # an argument this kernel or firmware cannot honour stays without effect
    if cpu_vendor == "AuthenticAMD" and amd in ("disable", "active", "passive", "guided"):
        return {"disable": ("acpi-cpufreq", None), "active": ("amd-pstate-epp", "active")}.get(amd, ("amd-pstate", amd))
    if cpu_vendor == "GenuineIntel" and intel in ("disable", "active", "passive"):
        return {"disable": ("acpi-cpufreq", None), "active": ("intel_pstate", "active"),
                "passive": ("intel_cpufreq", "passive")}[intel]
    return default


def iommu_after_boot(args: list, default: str | None) -> str | None:
    """The IOMMU groups' default domain type a kernel with ``args`` gives (passthrough: identity)."""
    if _last_value(args, "iommu") == "pt" or _last_value(args, "iommu.passthrough") in ("1", "on", "y"):
        return "identity"
    if _last_value(args, "iommu") == "nopt" or _last_value(args, "iommu.passthrough") in ("0", "off", "n"):
        return "DMA-FQ"
    return default


def acs_redirect_bdfs(args: list) -> list:
    """The functions ``pci=disable_acs_redir=BDF;BDF`` names (the kernel's domain-less form gets domain 0000)."""
    out = []
    for arg in args:
        if arg.startswith("pci="):
            for option in arg[len("pci="):].split(","):
                if option.startswith("disable_acs_redir="):
                    out += [b if b.count(":") == 2 else "0000:" + b
                            for b in option.split("=", 1)[1].split(";") if b]
    return out


def running_cpufreq(root: str) -> tuple | None:
    """``(scaling driver, pstate mode or None)`` the node runs, None without cpufreq."""
    return _running_cpufreq(Tree(root))


def _running_cpufreq(t: Tree) -> tuple | None:
    driver = read_rel(t, f"{CPU_BASE}/cpufreq/policy0/scaling_driver")
    if driver is None:
        return None
    status = read_rel(t, f"{CPU_BASE}/amd_pstate/status") or read_rel(t, f"{CPU_BASE}/intel_pstate/status")
    family = cpufreq_family(driver.strip())
    return driver.strip(), (status.strip() if status and family != "acpi-cpufreq" else None)


def _iommu_type(t: Tree) -> str | None:
    groups = t.path("sys/kernel/iommu_groups")
    names = sorted(os.listdir(groups)) if os.path.isdir(groups) else []
    if not names:
        return None
    return (read_rel(t, f"sys/kernel/iommu_groups/{names[0]}/type") or "").strip() or None


def _boot_record(t: Tree) -> dict:
    """The node's boot without our drop-in: recorded at the first simulated boot, read at the later ones."""
    text = read_rel(t, BOOT_RECORD)
    if text:
        return json.loads(text)
    record = {"boots": 0, "cmdline": (read_rel(t, "proc/cmdline") or "").split(), "cpufreq": _running_cpufreq(t),
              "iommu": _iommu_type(t)}
    return record


def _cpu_vendor(t: Tree) -> str | None:
    for line in (read_rel(t, "proc/cpuinfo") or "").splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return None


def _clear_acs_redirect(t: Tree, bdf: str) -> bool:
    """Clear ReqRedir, CmpltRedir and EgressCtrl in ``bdf``'s ACS control, as the kernel does at boot."""
    path = t.path(f"sys/bus/pci/devices/{bdf}/config")
    if not os.path.exists(path):
        return False
    with open(path, "r+b") as fh:
        cfg = bytearray(fh.read())
        offset, hops = 0x100, 0
        while 0x100 <= offset < len(cfg) - 8 and hops < 64:  # a broken list must not loop for ever
            hops += 1
            header = struct.unpack_from("<I", cfg, offset)[0]
            if header & 0xFFFF == ACS_CAP_ID:
                ctl = struct.unpack_from("<H", cfg, offset + 6)[0]
                struct.pack_into("<H", cfg, offset + 6, ctl & ~ACS_REDIRECT & 0xFFFF)
                fh.seek(0)
                fh.write(cfg)
                return True
            offset = header >> 20
    return False


def _next_boot(t: Tree, record: dict, dropin: str) -> dict:
    """What the next boot's command line is (the node's own plus the drop-in's) and the driver it loads."""
    args = add_kernel_args(record["cmdline"], grub_dropin_args(read_rel(t, dropin.lstrip("/"))))
    running = _running_cpufreq(t)
    wanted = None
    if running is not None and record.get("cpufreq"):
        release = (read_rel(t, "proc/sys/kernel/osrelease") or "").strip()
        cppc = os.path.isdir(t.path(f"{CPU_BASE}/cpu0/acpi_cppc"))
        wanted = tuple(cpufreq_after_boot(args, _cpu_vendor(t), tuple(record["cpufreq"]), release, cppc))
    return {"args": args, "running": running, "wanted": wanted}


def _apply_command_line(t: Tree, record: dict, boot: dict) -> dict:
    """The new /proc/cmdline, and what it brings: the cpufreq driver, the IOMMU groups' type, ACS redirect off."""
    args = boot["args"]
    before = (read_rel(t, "proc/cmdline") or "").split()
    t.write("proc/cmdline", " ".join(args))
    out = {"cmdline": " ".join(args), "added": [a for a in args if a not in before],
           "dropped": [a for a in before if a not in args], "cpufreq": None, "iommu": None, "acs_cleared": []}
    if boot["wanted"] is not None:
        if boot["wanted"] != tuple(boot["running"]):
            set_cpufreq_driver(t.root, *boot["wanted"])
        out["cpufreq"] = {"before": list(boot["running"]), "after": list(boot["wanted"])}
    groups = t.path("sys/kernel/iommu_groups")
    wanted_type = iommu_after_boot(args, record.get("iommu"))
    if os.path.isdir(groups) and wanted_type:
        for name in sorted(os.listdir(groups)):
            t.write(f"sys/kernel/iommu_groups/{name}/type", wanted_type)
        out["iommu"] = wanted_type
    out["acs_cleared"] = [b for b in acs_redirect_bdfs(args) if _clear_acs_redirect(t, b)]
    return out


def _run(argv: list, timeout: float = REBOOT_COMMAND_TIMEOUT, env: dict | None = None) -> tuple:
    """``(rc, stdout, stderr)``; a command that does not finish in ``timeout`` seconds is killed (rc 124)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd="/",
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 124, "", "%s did not finish within %s s" % (argv[0], timeout)
    except OSError as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def reset_journaled(root: str, journal: str = JOURNAL, collections: str = COLLECTIONS, skip: tuple = ()) -> dict:
    """Every journaled runtime value back to its original, as a reboot resets it, with the journal kept as it is.

    The collection's own rollback writes them (its tuning_apply module, run on a copy of the journal below the
    root, with ``collections`` on the module's path): the same files, the same values, no second writer to keep
    in step. ``skip``: families whose values this boot replaces anyway (cpufreq when the driver changes: the new
    driver starts with its own). Returns ``{"families": [...], "failed": {family: message}}``.
    """
    t = Tree(root)
    text = read_rel(t, journal.lstrip("/"))
    families = sorted(set(json.loads(text).get("families", {})) - set(skip)) if text else []
    if not families:
        return {"families": [], "failed": {}}
    copy = os.path.join(os.path.dirname(journal), ".simnode-reboot-" + os.path.basename(journal))
    t.write(copy, text.encode(), mode=0o600)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"ANSIBLE_MODULE_ARGS": {"root": t.root, "journal": copy, "fail_on_error": False, "families": [
            {"name": name, "options": RESTORE_OPTIONS.get(name, {"restore": True})} for name in families]}}, fh)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (collections, os.environ.get("PYTHONPATH")) if p))
    try:
        rc, out, err = _run([sys.executable, "-m", "ansible_collections.gpunode.tuning.plugins.modules.tuning_apply",
                             fh.name], env=env)
    finally:
        os.unlink(fh.name)
        if os.path.exists(t.path(copy)):
            os.unlink(t.path(copy))
    try:
        result = json.loads(out)
    except ValueError:
        return {"families": families, "failed": {"*": "tuning_apply exited %d: %s %s" % (rc, out[-500:], err[-500:])}}
    return {"families": families, "failed": dict(result.get("failed_families") or {})}


def _conf_files(t: Tree, dirs: tuple, suffix: str = ".conf") -> list:
    """The files a boot reads from ``dirs`` (an earlier directory hides the same name in a later one), by name."""
    chosen: dict = {}
    for directory in dirs:
        names = os.listdir(t.path(directory)) if os.path.isdir(t.path(directory)) else []
        for name in names:
            if name.endswith(suffix) and name not in chosen:
                chosen[name] = f"{directory}/{name}"
    return [chosen[name] for name in sorted(chosen)]


def _conf_lines(t: Tree, rel: str) -> list:
    return [line.strip() for line in (read_rel(t, rel) or "").splitlines()
            if line.strip() and not line.strip().startswith(("#", ";"))]


def apply_sysctl_files(root: str) -> dict:
    """What systemd-sysctl does at boot: every sysctl.d file in load order, then /etc/sysctl.conf.

    Returns ``{"applied": {key: value}, "missing": [keys the node lacks]}`` (``-key`` lines may be missing).
    """
    t = Tree(root)
    files = _conf_files(t, SYSCTL_DIRS) + (["etc/sysctl.conf"] if os.path.isfile(t.path("etc/sysctl.conf")) else [])
    out: dict = {"applied": {}, "missing": []}
    for rel in files:
        for line in _conf_lines(t, rel):
            key, sep, value = line.partition("=")
            key, optional = key.strip().lstrip("-"), key.strip().startswith("-")
            if not sep or "*" in key:
                continue
            path = "proc/sys/" + key.replace(".", "/")
            if os.path.isfile(t.path(path)):
                t.write(path, value.strip())
                out["applied"][key] = value.strip()
            elif not optional:
                out["missing"].append(key)
    return out


def load_boot_modules(root: str) -> dict:
    """What systemd-modules-load does at boot: each module of modules-load.d, through the node's modprobe, with
    the options modprobe.d gives it. Returns ``{"loaded": [...], "failed": {module: message}}``."""
    t = Tree(root)
    options: dict = {}
    for rel in _conf_files(t, ("etc/modprobe.d", "run/modprobe.d", "usr/lib/modprobe.d", "lib/modprobe.d")):
        for words in (line.split() for line in _conf_lines(t, rel)):
            if len(words) > 2 and words[0] == "options":
                options.setdefault(words[1].replace("-", "_"), []).extend(words[2:])
    out: dict = {"loaded": [], "failed": {}}
    modprobe = t.path("usr/sbin/modprobe")
    for rel in _conf_files(t, MODULES_LOAD_DIRS):
        for name in _conf_lines(t, rel):
            rc, _stdout, err = _run([modprobe, name, *options.get(name.replace("-", "_"), [])])
            if rc == 0:
                out["loaded"].append(name)
            else:
                out["failed"][name] = err.strip() or "modprobe exited %d" % rc
    return out


def run_boot_unit(root: str) -> dict:
    """Run gpunode-tuning-boot.service's ExecStart as the boot would, when the unit is there and enabled.

    The runner below the root runs with this Python (the node's stands in for it), isolated (``-I -B``) and with
    ``--root`` added. Returns ``{"ran": bool, "rc", "output": [lines]}`` (``why`` when it did not run).
    """
    t = Tree(root)
    unit = read_rel(t, BOOT_UNIT)
    if unit is None or not os.path.lexists(t.path(BOOT_UNIT_WANTS)):
        return {"ran": False, "why": "no enabled %s" % os.path.basename(BOOT_UNIT)}
    start = next((line.split("=", 1)[1].split() for line in unit.splitlines() if line.startswith("ExecStart=")), [])
    script = next((w for w in start[1:] if w.startswith("/")), None)
    if script is None or "--desired" not in start:
        return {"ran": False, "why": "ExecStart of %s is not the boot runner's: %s" % (BOOT_UNIT, " ".join(start))}
    desired = start[start.index("--desired") + 1]
    rc, out, err = _run([sys.executable, "-I", "-B", t.path(script), "--desired", desired, "--root", t.root])
    return {"ran": True, "rc": rc, "output": (out + err).splitlines()}


def reboot(root: str, dropin: str = GRUB_DROPIN, journal: str = JOURNAL, collections: str = COLLECTIONS) -> dict:
    """Reboot the simulated node at ``root`` as the kernel and systemd would, with what the tuning left on it.

    In this order: each journaled runtime value reset to its original (cpufreq's only when the driver stays:
    a new driver starts with its own); the kernel command line becomes the
    node's own plus the GRUB drop-in's arguments (``dropin``), and with it the cpufreq driver (amd_pstate=,
    intel_pstate=), the IOMMU groups' type (iommu=pt) and ACS redirect (pci=disable_acs_redir=); a new boot
    id, a fresh uptime, an empty kernel log; the sysctl and modules-load drop-ins applied; then the boot
    unit's re-apply run as the unit would. A root holding REBOOT_NEVER_RETURNS never comes back: nothing
    changes, its boot id stays, ``returned`` is False.

    Returns what happened: ``returned``, ``boot_id`` (and ``previous_boot_id``), ``cmdline`` (``added``,
    ``dropped``), ``cpufreq`` ({before, after}), ``iommu``, ``acs_cleared``, ``reset``, ``sysctl``,
    ``modules``, ``boot_unit``, and ``problems`` (what failed, in words).
    """
    t = Tree(root)
    previous = (read_rel(t, "proc/sys/kernel/random/boot_id") or "").strip()
    if os.path.exists(t.path(REBOOT_NEVER_RETURNS)):
        return {"returned": False, "boot_id": previous, "previous_boot_id": previous,
                "problems": ["%s: the node never comes back (%s)" % (t.root, REBOOT_NEVER_RETURNS)]}
    apply_boot_faults(root, check_only=True)  # a bad fault file fails the boot before anything changes
    record = _boot_record(t)
    out: dict = {"returned": True, "previous_boot_id": previous}
    boot = _next_boot(t, record, dropin)
    switching = boot["wanted"] is not None and boot["wanted"] != tuple(boot["running"])
    out["reset"] = reset_journaled(root, journal, collections, skip=("cpufreq",) if switching else ())
    out.update(_apply_command_line(t, record, boot))
    out["aspm_policy"] = aspm.after_boot(root, boot["args"])
    out["boot_id"] = str(uuid.uuid4())
    t.write("proc/sys/kernel/random/boot_id", out["boot_id"])
    t.write("proc/uptime", "21.37 40.11")
    t.write("dev/kmsg", b"")
    out["gpu_faults"] = apply_boot_faults(root)
    out["module_params"] = modparams.reload_with_options(root)  # modules load again with their options
    out["sysctl"] = apply_sysctl_files(root)
    out["modules"] = load_boot_modules(root)
    out["boot_unit"] = run_boot_unit(root)
    record["boots"] += 1
    t.write(BOOT_RECORD, json.dumps(record, indent=1, sort_keys=True))
    out["problems"] = _reboot_problems(out)
    return out


def _reboot_problems(out: dict) -> list:
    problems = ["reset of %s failed: %s" % (k, v) for k, v in sorted(out["reset"]["failed"].items())]
    problems += ["sysctl %s: the node has no such key" % k for k in out["sysctl"]["missing"]]
    problems += ["module %s did not load at boot: %s" % (k, v) for k, v in sorted(out["modules"]["failed"].items())]
    unit = out["boot_unit"]
    if unit["ran"] and unit["rc"] != 0:
        problems.append("the boot unit's re-apply exited %d: %s" % (unit["rc"], " | ".join(unit["output"][-5:])))
    return problems
