"""Module parameters of a simulated node (issue 44): what /sys/module/<module>/parameters shows, and a boot that
loads each module again with the options modprobe.d and the kernel command line give it.

kernel.write_modules calls ``write_params`` when it builds a node (after the preset's own modules) and
``reload_with_options`` from boot.reboot (after the fresh kernel log). The parameters are those a real
driver exports, with the kernel's formatting: a ``bool`` shows ``Y``/``N`` whatever the options said (``1``,
``on``, ``true``), integers in decimal. ``nvidia_uvm``'s names and types are from a real ``modinfo nvidia_uvm``
(tests/data/real/modinfo-nvidia-uvm-535.129.03-nvidia-vaapi-driver-260.txt) and the NVIDIA GPU Operator's
listing (tests/data/real/modparams-uvm-disable-hmm-Y-gpu-operator-docs.txt); the values are the defaults of
the open driver's source on x86_64 (``uvm_disable_hmm`` false since the r550 drivers: HMM on). The NVIDIA
driver's ``NVreg_*`` parameters are declared with mode 0 (``module_param(x, int, 0)`` in nv-linux.h) and so
have no file here on a real node; the presets that write one keep their own (older) stand-in.
"""

from __future__ import annotations

import json
import os

# Defaults of the parameters a module exports, as the kernel shows them, for the modules a preset loads.
EXPORTED = {
    "nvidia_uvm": {
        "uvm_ats_mode": "1",
        "uvm_perf_prefetch_enable": "1",
        "uvm_perf_prefetch_threshold": "51",
        "uvm_perf_prefetch_min_faults": "1",
        "uvm_perf_thrashing_enable": "1",
        "uvm_disable_hmm": "N",
    },
}
# What the build recorded: {module: {param: default}}; a boot starts each loaded module from these.
DEFAULTS = "var/lib/simnode/module-param-defaults.json"
MODPROBE_DIRS = ("etc/modprobe.d", "run/modprobe.d", "usr/local/lib/modprobe.d", "usr/lib/modprobe.d",
                 "lib/modprobe.d")
TRUE_WORDS = ("1", "y", "yes", "true", "on")
FALSE_WORDS = ("0", "n", "no", "false", "off")


def _path(root: str, rel: str) -> str:
    return os.path.join(root, rel)


def _write(root: str, rel: str, text: str) -> None:
    full = _path(root, rel)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")


def _read(root: str, rel: str) -> str | None:
    try:
        with open(_path(root, rel), encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def write_params(root: str, modules: dict) -> None:
    """Each loaded module of the preset (``modules``: {name: {param: value}}) exports its EXPORTED parameters (the
    preset's own values win); the defaults are recorded for the boot."""
    defaults = {}
    for name, given in modules.items():
        shown = dict(EXPORTED.get(name, {}), **given)
        for param, value in shown.items():
            if _read(root, "sys/module/%s/parameters/%s" % (name, param)) is None:
                _write(root, "sys/module/%s/parameters/%s" % (name, param), value)
        if shown:
            defaults[name] = shown
    _write(root, DEFAULTS, json.dumps(defaults, indent=1, sort_keys=True))


def modprobe_options(root: str) -> dict:
    """``{module: {param: value}}`` of every ``options`` line modprobe.d gives (files by name, an earlier directory
    hiding the same name in a later one; a later line wins for a parameter, as the kernel parses them in order)."""
    chosen: dict = {}
    for directory in MODPROBE_DIRS:
        full = _path(root, directory)
        for name in sorted(os.listdir(full)) if os.path.isdir(full) else []:
            if name.endswith(".conf") and name not in chosen:
                chosen[name] = os.path.join(directory, name)
    out: dict = {}
    for name in sorted(chosen):
        for line in (_read(root, chosen[name]) or "").splitlines():
            words = line.split()
            if len(words) > 2 and words[0] == "options":
                for word in words[2:]:
                    key, sep, value = word.partition("=")
                    out.setdefault(words[1].replace("-", "_"), {})[key] = value if sep else "1"
    return out


def _shown(value: str, default: str) -> str:
    """A value as the kernel shows it for a parameter whose default shows ``default`` (bools as Y/N)."""
    if default in ("Y", "N"):
        if value.lower() in TRUE_WORDS:
            return "Y"
        if value.lower() in FALSE_WORDS:
            return "N"
    return value


def _cmdline_options(root: str) -> dict:
    out: dict = {}
    for word in (_read(root, "proc/cmdline") or "").split():
        key, sep, value = word.partition("=")
        module, dot, param = key.partition(".")
        if sep and dot and module and param and "/" not in module:
            out.setdefault(module.replace("-", "_"), {})[param] = value
    return out


def reload_with_options(root: str) -> dict:
    """What a boot does to each loadable module that is loaded again: its parameters start from their defaults and
    take modprobe.d's options, then the command line's ``module.param=``; an option the module does not export is
    ignored with the kernel's warning in the log. Returns ``{"set": {module: {param: value}}, "ignored": [...]}``."""
    try:
        defaults = json.loads(_read(root, DEFAULTS) or "{}")
    except ValueError:
        defaults = {}
    wanted = modprobe_options(root)
    for module, params in _cmdline_options(root).items():
        wanted.setdefault(module, {}).update(params)
    out: dict = {"set": {}, "ignored": []}
    base = _path(root, "sys/module")
    for module in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if not os.path.exists(os.path.join(base, module, "initstate")):
            continue  # built in: no reload
        start = dict(defaults.get(module, {}))
        for param, value in (wanted.get(module) or {}).items():
            if _read(root, "sys/module/%s/parameters/%s" % (module, param)) is None:
                out["ignored"].append("%s: unknown parameter '%s' ignored" % (module, param))
                continue
            start[param] = _shown(value, start.get(param, ""))
        for param, value in start.items():
            if _read(root, "sys/module/%s/parameters/%s" % (module, param)) is not None:
                _write(root, "sys/module/%s/parameters/%s" % (module, param), value)
        if start:
            out["set"][module] = start
    if out["ignored"]:
        with open(_path(root, "dev/kmsg"), "a", encoding="utf-8") as fh:
            for seq, message in enumerate(out["ignored"]):
                fh.write("4,%d,1000000,-;%s\n" % (seq, message))
    return out
