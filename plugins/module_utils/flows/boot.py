# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Boot re-apply: the runtime families of a desired-state file, by the functions the modules call.

The persistent flow writes the desired state (``/etc/gpunode-tuning/desired.json``) and the runner,
which carries this package's module_utils (templates/gpunode-tuning-boot.py.j2);
``gpunode-tuning-boot.service`` runs it at boot with the node's python3, and the udev rule runs it
for one hot-added PCI function, re-applying the families that declare it (``Family.hotplug``)::

    python3 -I -B RUNNER --desired /etc/gpunode-tuning/desired.json
    python3 -I -B RUNNER --desired /etc/gpunode-tuning/desired.json --only FAMILY --bdf 0000:41:00.0
    python3 -I -B RUNNER guard --config /etc/gpunode-tuning/guard.json      (the guard: module_utils/flows/guard.py)

No journal: boot re-apply is not a change to roll back (the runtime run journaled the originals). It
writes under the node's lock (flows/writers.py: ``.lock`` next to the journal, ``--journal``, default
``/var/lib/gpunode-tuning/journal.json``), as every writing flow does: held by another writer for
longer than ``lock.DEFAULT_TIMEOUT`` (60 s), it re-applies nothing and exits 2 naming the holder.
No Ansible import, Python 3.8+, standard library only. One line per family goes to stdout
(journald); the exit status is 1 when a family failed, after every family was tried, and 2 when
the desired state or the root cannot be read.

Desired state: ``version`` and, for each family that re-applies something at boot (``Family.boot``),
its part of the desired state under the family's ``boot_key`` or name (absent: not re-applied), e.g.
``{"version": 1, "<family>": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ansible_collections.gpunode.tuning.plugins.module_utils import registry
from ansible_collections.gpunode.tuning.plugins.module_utils.core import lock, persistence, validate, validate_boot
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import FamilyError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import all_families

VERSION = 1
# The desired-state keys boot re-applies, in order (the registry's families with a boot function).
FAMILIES = tuple(key for key, _fam in all_families.boot_families())
PREFIX = "gpunode-tuning-boot"
DEFAULT_JOURNAL = "/var/lib/gpunode-tuning/journal.json"


class BootError(Exception):
    """The desired state cannot be used, or a family cannot run; the message says why."""


def _say(line):
    """One line to stdout (journald at boot); module_utils' linters forbid print()."""
    sys.stdout.write("%s\n" % line)
    sys.stdout.flush()


def boot_state(desired: dict) -> dict:
    """The part of a desired state that boot re-applies: ``version`` and each boot family that is set."""
    known = {fam.name for fam in registry.FAMILIES} | set(FAMILIES) | set(all_families.report_titles()) \
        | {key for fam in registry.FAMILIES for key in (fam.validate or {})}
    unknown = sorted(set(desired) - known - {"version"})
    if unknown:
        raise BootError("unknown families %s; known are %s" % (", ".join(unknown), ", ".join(sorted(known))))
    out = {"version": VERSION}
    for key in FAMILIES:
        if desired.get(key) not in (None, {}, [], ""):
            out[key] = desired[key]
    return out


def load_desired(path: str) -> dict:
    """The desired state in ``path``; BootError naming the file when it is unusable."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise BootError("cannot read the desired state %s: %s" % (path, exc)) from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise BootError("%s is not a version %d desired state (written by gpunode.tuning's persistent flow)"
                        % (path, VERSION))
    unknown = sorted(set(data) - set(FAMILIES) - {"version"})
    if unknown:
        raise BootError("%s has unknown families %s; known are %s" % (path, ", ".join(unknown), ", ".join(FAMILIES)))
    for family in FAMILIES:
        if data.get(family) is not None and not isinstance(data[family], dict):
            raise BootError("%s: %s must be an object" % (path, family))
    return data


def _boot_one(fam, node: Node, want: dict, bdf: str | None) -> tuple[bool, str]:
    """One family's re-apply; its error, expected or not, is its failure and never stops the others."""
    try:
        return fam.boot(node, want, bdf) if bdf is not None else fam.boot(node, want)
    except (BootError, NodeError, ValueError, FamilyError) as exc:
        return False, str(exc)
    except Exception as exc:  # noqa: BLE001 (a bug in one family must not stop the others at boot)
        return False, "%s: %s" % (type(exc).__name__, exc)


def boot_each(node: Node, desired: dict, only: list | None = None, bdf: str | None = None) -> list:
    """``[(key, ok, message)]``: every family of ``desired`` re-applied by the registry's boot functions.

    Only the families named in ``only`` when given; ``bdf`` (one hot-added PCI function) goes to the
    families that re-apply on hot-plug (``Family.hotplug``). A failure does not stop the others. The
    guard re-applies drifted families with this too (gpunode_tuning_guard_reapply).
    """
    hotplug = {fam.name for fam in all_families.hotplug_families()}
    out = []
    for key, fam in all_families.boot_families():
        want = desired.get(key)
        if want is None or (only is not None and fam.name not in only):
            continue
        ok, msg = _boot_one(fam, node, want, bdf if fam.name in hotplug else None)
        out.append((key, ok, msg))
    return out


def run_families(node: Node, desired: dict, only: list | None = None, bdf: str | None = None) -> int:
    """Re-apply every family of ``desired`` (``boot_each``), one line per family; 1 when one failed, else 0."""
    status = 0
    for key, ok, msg in boot_each(node, desired, only, bdf):
        _say("%s: %s: %s%s" % (PREFIX, key, "" if ok else "FAILED: ", msg))
        status |= 0 if ok else 1
    return status


def family_named(name: str) -> str:
    """``name`` when it is a family's name."""
    names = {fam.name for fam in registry.FAMILIES}
    if name in names:
        return name
    raise ValueError("no family %r; known: %s" % (name, ", ".join(sorted(names))))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PREFIX, description="Re-apply gpunode.tuning's runtime settings at boot.")
    parser.add_argument("--desired", required=True, help="the desired-state JSON file (below --root)")
    parser.add_argument("--root", default="/", help="the node root (a simulated node's directory in tests)")
    parser.add_argument("--only", action="append", metavar="FAMILY",
                        help="only this family (repeatable)")
    parser.add_argument("--journal", default=DEFAULT_JOURNAL,
                        help="the journal's path on the node: the node's lock is next to it (default %(default)s)")
    parser.add_argument("--lock-timeout", type=float, default=None, metavar="SECONDS",
                        help="how long to wait for the node's lock held by another writer (default 60)")
    parser.add_argument("--bdf", help="only this PCI function (the udev rule; with --only, for the families that "
                                      "re-apply on hot-plug)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.only is not None:
        try:
            args.only = [family_named(name) for name in args.only]
        except ValueError as exc:
            parser.error(str(exc))
    if args.bdf is not None:
        hotplug = {fam.name for fam in all_families.hotplug_families()}
        if not args.only or not set(args.only) <= hotplug:
            parser.error("--bdf needs --only with families that re-apply on hot-plug (%s)"
                         % ", ".join(sorted(hotplug)))
    return args


def main(argv: list[str] | None = None) -> int:
    """The boot unit's and the udev rule's entry point (the guard's with ``guard``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["guard"]:
        # The guard unit runs the same runner: `RUNNER guard --config FILE` (module_utils/flows/guard.py).
        # Imported here: guard imports this module.
        from ansible_collections.gpunode.tuning.plugins.module_utils.flows import guard

        return guard.main(argv[1:])
    args = parse_args(argv)
    try:
        node = Node.open(args.root)
        desired = load_desired(node.path(args.desired) if args.root != "/" else args.desired)
    except (BootError, NodeError) as exc:
        _say("%s: FAILED: %s" % (PREFIX, exc))
        return 2
    # Imported here: writers imports the journal, which the runner does not need before it writes.
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import writers

    try:
        with writers.writing(node, args.journal, "boot", timeout=args.lock_timeout):
            status = run_families(node, desired, args.only, args.bdf)
    except lock.LockError as exc:
        _say("%s: FAILED: %s" % (PREFIX, exc))
        return 2
    sys.stdout.flush()
    return status


# --- persistence: the runner, the desired state, the unit and the udev rule (persist.py's concerns) ---

UNIT_NAME = "gpunode-tuning-boot.service"
UNIT_PATH = "/etc/systemd/system/" + UNIT_NAME
WANTS_LINK = "/etc/systemd/system/multi-user.target.wants/" + UNIT_NAME
BOOT_DIR = "/etc/gpunode-tuning"
DESIRED_PATH = BOOT_DIR + "/desired.json"
GUARD_CONFIG_PATH = BOOT_DIR + "/guard.json"
CARRIED_PACKAGE = "ansible_collections.gpunode.tuning.plugins.module_utils"
# The runner's code after its SOURCES: imports the collection's packages from them, nothing else.
RUNNER_LOADER = '''

# The guard unit runs this file every few minutes: it sets GPUNODE_TUNING_CODE_CACHE to a root-only
# file where the compiled SOURCES are kept (marshal), valid while this very file (path, inode, size,
# modification time: the persistent flow replaces it whenever SOURCES change) and the Python
# version are the same. Compiling everything costs more CPU than a whole guard run.
CODE_CACHE = os.environ.get("GPUNODE_TUNING_CODE_CACHE") or None


def _cache_key():
    st = os.stat(__file__)
    return (importlib.util.MAGIC_NUMBER, os.path.abspath(__file__), st.st_ino, st.st_size, st.st_mtime_ns,
            len(SOURCES), sum(len(text) for text in SOURCES.values()))


def _load_cache():
    """{name: code} from CODE_CACHE when it is ours (owned by this user, writable by nobody else) and current."""
    try:
        fd = os.open(CODE_CACHE, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                return {}
            key, code = marshal.loads(fh.read())
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    return code if key == _cache_key() and isinstance(code, dict) else {}


def _save_cache(code):
    """Write CODE_CACHE, mode 0600, with the collection's atomic writer (carried: boot.main imported it);
    a cache that cannot be written is only slower."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.core import files

    try:
        files.replace_file(CODE_CACHE, marshal.dumps((_cache_key(), code)), 0o600)
    except OSError:
        pass


# A meta path finder and loader by protocol (find_spec, create_module, exec_module): subclassing
# importlib.abc's classes would import importlib.resources and pathlib, a third of the guard's CPU.
class _Carried:
    """Imports the collection's packages and module_utils from SOURCES, nothing else."""

    def __init__(self):
        self.code = _load_cache() if CODE_CACHE else {}
        self.compiled = False

    def find_spec(self, name, path=None, target=None):
        parts = PACKAGE.split(".")
        if name in {".".join(parts[: i + 1]) for i in range(len(parts))}:
            return importlib.util.spec_from_loader(name, self, is_package=True)
        short = name[len(PACKAGE) + 1:] if name.startswith(PACKAGE + ".") else None
        if short is not None and short + ".__init__" in SOURCES:  # a package of module_utils (families)
            return importlib.util.spec_from_loader(name, self, origin="%s (%s)" % (__file__, name), is_package=True)
        if short in SOURCES:
            return importlib.util.spec_from_loader(name, self, origin="%s (%s)" % (__file__, name))
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        short = module.__name__[len(PACKAGE) + 1:]
        key = short if short in SOURCES else short + ".__init__"
        if key in SOURCES and module.__name__.startswith(PACKAGE + "."):
            code = self.code.get(key)
            if code is None:
                path = "%s/module_utils/%s.py" % (__file__, key.replace(".", "/"))
                code = self.code[key] = compile(SOURCES[key], path, "exec")
                self.compiled = True
            exec(code, module.__dict__)


_CARRIED = _Carried()
sys.meta_path.insert(0, _CARRIED)
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot

_STATUS = boot.main()
if CODE_CACHE and _CARRIED.compiled:
    _save_cache(_CARRIED.code)
sys.exit(_STATUS)
'''


# What the node runs: the boot runner's entry point and the guard's (imported by boot.main).
ENTRY_POINTS = ("flows.boot", "flows.guard")


def _imported_names(source: str) -> set:
    """The module_utils names (``core.node``, ``registry``, ...) a source file imports, in any spelling."""
    import ast  # the controller's work (the persistent flow), not the node's at every boot

    out = set()
    for item in ast.walk(ast.parse(source)):
        if isinstance(item, ast.ImportFrom) and (item.module or "").startswith(CARRIED_PACKAGE):
            base = item.module[len(CARRIED_PACKAGE):].lstrip(".")
            out |= {".".join(p for p in (base, alias.name) if p) for alias in item.names}
            if base:
                out.add(base)
        elif isinstance(item, ast.Import):
            out |= {a.name[len(CARRIED_PACKAGE) + 1:] for a in item.names if a.name.startswith(CARRIED_PACKAGE + ".")}
    return out


def carried_sources(directory: str, entry_points: tuple = ENTRY_POINTS) -> dict:
    """``{name: source}`` of the module_utils files the node runs: the entry points and what they import.

    ``directory`` is the collection's module_utils (on the controller). A file in a package is named with
    dots (``families.pcie_mrrs``; a package's ``__init__`` as ``core.__init__``); the runner imports it
    under that name. Controller-only code and the modules' adapters are not carried.
    """
    out, todo = {}, list(entry_points)
    while todo:
        name = todo.pop()
        path = os.path.join(directory, *name.split("."))
        for candidate, key in ((path + ".py", name), (os.path.join(path, "__init__.py"), name + ".__init__")):
            if key not in out and os.path.isfile(candidate):
                with open(candidate, encoding="utf-8") as handle:
                    out[key] = handle.read()
                todo += sorted(_imported_names(out[key]) - set(out))
                parts = name.split(".")
                todo += [".".join(parts[:i]) for i in range(1, len(parts))]
    return out


def runner_text(sources: dict) -> str:
    """The boot runner: one Python file carrying ``sources`` (module_utils name -> text) that runs ``main``.

    One file, written by one step: the boot code and the runtime modules are the same code, and no
    other copy of the collection on the node (an Ansible installation) can be the code that runs,
    since the collection's package names resolve only to what this file carries.
    """
    if "flows.boot" not in sources:
        raise BootError("the runner's sources have no flows/boot.py: not the collection's module_utils")
    lines = ["# Managed by gpunode.tuning (role tuning); removed by playbooks/rollback.yml.",
             "# The boot re-apply runner: it carries the collection's module_utils (below, one entry per file,",
             "# exactly as in the collection) and runs module_utils/flows/boot.py:",
             "#   python3 -I -B THIS --desired %s [--only FAMILY --bdf BDF]" % DESIRED_PATH,
             "#   python3 -I -B THIS guard --config %s   (the guard unit: flows/guard.py)" % GUARD_CONFIG_PATH,
             "import importlib.util", "import marshal", "import os", "import sys", "",
             "PACKAGE = %s" % json.dumps(CARRIED_PACKAGE), "SOURCES = {"]
    lines += ["    %s: %s," % (json.dumps(name), json.dumps(sources[name])) for name in sorted(sources)]
    return "\n".join(lines) + "\n}\n" + RUNNER_LOADER


def _boot_settings(settings: dict) -> tuple:
    """The validated (python, script, before units) the unit and the rule are written with."""
    try:
        python = validate_boot.absolute_path(settings["boot_python"])
        script = validate_boot.absolute_path(settings["boot_script"])
        before = validate_boot.systemd_unit_names(settings.get("boot_unit_before") or [])
    except validate.ValidationError as exc:
        raise FamilyError("%s; nothing was written" % exc) from None
    return python, script, before


def journal_argument(settings: dict) -> str:
    """`` --journal PATH`` when the role's journal is not the default (the runner's lock is next to it), else ""."""
    journal = settings.get("journal") or DEFAULT_JOURNAL
    if journal == DEFAULT_JOURNAL:
        return ""
    try:
        return " --journal %s" % validate_boot.absolute_path(journal)
    except validate.ValidationError as exc:
        raise FamilyError("gpunode_tuning_journal: %s; nothing was written" % exc) from None


def unit_text(settings: dict) -> str:
    """The oneshot unit that runs the runner at boot, before the inference services."""
    python, script, before = _boot_settings(settings)
    lines = [persistence.HEADER.rstrip("\n"),
             "# gpunode.tuning: re-apply the runtime-only settings at boot, before the inference services, with",
             "# the node's python3 and the collection's own code (no Ansible at boot).",
             "[Unit]", "Description=Re-apply gpunode.tuning runtime settings (PCIe MRRS and ACS, C-states, cpufreq, "
             "THP, GPU settings)",
             "# Modules from modules-load.d first; udev's coldplug (which loads the cpufreq driver) is",
             "# triggered by then, and the runner waits for it to settle when no cpufreq policy exists yet.",
             "After=systemd-modules-load.service systemd-udev-trigger.service"]
    if before:
        lines.append("Before=%s" % " ".join(before))
    lines += ["", "[Service]", "Type=oneshot", "RemainAfterExit=yes",
              "ExecStart=%s -I -B %s --desired %s%s" % (python, script, DESIRED_PATH, journal_argument(settings)), "",
              "[Install]", "WantedBy=multi-user.target"]
    return "\n".join(lines) + "\n"


def hotplug_wanted(desired: dict) -> list:
    """The families the udev rule re-applies for ``desired``: those that re-apply on hot-plug and are set."""
    return [fam for fam in all_families.hotplug_families() if desired.get(fam.boot_key or fam.name) not in (None, {})]


def rule_text(settings: dict, desired: dict) -> str:
    """The udev rule that re-applies the hot-plug families (``Family.hotplug``) on a matching PCI function added
    after boot."""
    python, script, _before = _boot_settings(settings)
    families = hotplug_wanted(desired)
    vendors = []
    for fam in families:
        vendors += [v for v in fam.hotplug(desired.get(fam.boot_key or fam.name)) if v not in vendors]
    if any(not fam.hotplug(desired.get(fam.boot_key or fam.name)) for fam in families):
        vendors = []  # a family that takes any vendor: no vendor key
    try:
        vendors = [validate_boot.pci_id(v) for v in vendors]
    except validate.ValidationError as exc:
        raise FamilyError("gpunode_tuning_gpu_vendors: %s; nothing was written" % exc) from None
    only = "".join(" --only %s" % fam.name for fam in families)
    journal = journal_argument(settings)
    run = 'RUN+="%s -I -B %s --desired %s%s%s --bdf %%k"' % (python, script, DESIRED_PATH, journal, only)
    rules = ['ACTION=="add", SUBSYSTEM=="pci"%s, %s' % (', ATTR{vendor}=="%s"' % v if v else "", run)
             for v in vendors or [None]]
    return (persistence.HEADER
            + "# gpunode.tuning: a PCI function added after boot (hot-add, remove/rescan after a GPU\n"
            "# reset) comes back at its power-up settings; the boot runner sets %s again when the\n"
            "# desired state's selector matches it. The vendor key only spares udev a Python start per\n"
            "# unrelated device.\n" % ", ".join(fam.name for fam in families)
            + "".join(rule + "\n" for rule in rules))


def boot_wanted(pc) -> dict:
    """The part of the desired state boot re-applies, or {} when the unit is off or has nothing to do."""
    state = boot_state(pc.desired)
    return state if pc.settings.get("boot_unit_enabled") and len(state) > 1 else {}


def persist_boot_unit(pc) -> dict:
    """Runner, desired state and unit written, the unit enabled (systemctl, or its wants link)."""
    state = boot_wanted(pc)
    if not state:
        return {"changed": False, "skipped": True, "reason": "no family to re-apply at boot (or the unit is off)"}
    python, script, _before = _boot_settings(pc.settings)
    if pc.node.is_live and not os.access(python, os.X_OK):
        raise FamilyError("gpunode_tuning_boot_python %s is not an executable file on the node; the boot unit runs "
                          "the tuning with it: install python3 (3.8 or later) or set gpunode_tuning_boot_python to "
                          "the node's python3; nothing was written" % python)
    pc.files.write(script, pc.settings["runner_text"], 0o755)
    pc.files.write(DESIRED_PATH, json.dumps(state, indent=4, sort_keys=True) + "\n")
    unit_changed = pc.files.write(UNIT_PATH, unit_text(pc.settings))
    if persistence.systemd_running(pc.node):
        if unit_changed:
            persistence.run_command(pc, ["systemctl", "daemon-reload"], "reloading systemd")
        persistence.run_command(pc, ["systemctl", "enable", UNIT_NAME], "enabling the boot unit")
    else:
        pc.files.link(WANTS_LINK, UNIT_PATH)
    return {"families": sorted(k for k in state if k != "version")}


def remove_boot_unit(pc) -> dict:
    """The unit disabled and removed, with the runner, its desired state and its directories."""
    script = pc.settings["boot_script"]
    if persistence.systemd_running(pc.node) and pc.files.read(UNIT_PATH) is not None:
        persistence.run_command(pc, ["systemctl", "disable", UNIT_NAME], "disabling the boot unit")
    paths = [WANTS_LINK, UNIT_PATH, script, DESIRED_PATH, BOOT_DIR]
    if os.path.basename(os.path.dirname(script)) == "gpunode-tuning":
        paths.append(os.path.dirname(script))
    removed = [p for p in paths if pc.files.remove(p)]
    if removed and persistence.systemd_running(pc.node):
        persistence.run_command(pc, ["systemctl", "daemon-reload"], "reloading systemd")
    return {}


def persist_udev(pc) -> dict:
    """The udev rule for hot-added GPUs, when a family that re-applies on hot-plug is re-applied at boot."""
    rule = pc.settings["udev_rule"]
    if not (pc.settings.get("udev_enabled") and hotplug_wanted(boot_wanted(pc))):
        return {"changed": False, "skipped": True,
                "reason": "the udev rule is off, or no family that re-applies on hot-plug (%s) is re-applied at boot"
                          % ", ".join(fam.name for fam in all_families.hotplug_families())}
    if pc.files.write(rule, rule_text(pc.settings, pc.desired)):
        persistence.run_command(pc, ["udevadm", "control", "--reload"], "reloading udev rules")
    return {}


def remove_udev(pc) -> dict:
    if pc.files.remove(pc.settings["udev_rule"]):
        persistence.run_command(pc, ["udevadm", "control", "--reload"], "reloading udev rules")
    return {}


BOOT_UNIT_DOC = ("the boot runner, its desired state and a systemd oneshot unit that re-applies the runtime-only "
                 "settings at boot")
UDEV_DOC = "a udev rule that re-applies the hot-plug families (Family.hotplug) on a hot-added GPU"


def concerns() -> list:
    """The boot unit's and the udev rule's concerns; their tags follow the registry's boot families."""
    # A family that re-applies one of its settings at boot (tunables: THP) is selected by that setting's tag.
    boot_tags = {tag for _key, fam in all_families.boot_families()
                 for tag in ((fam.name, fam.boot_key) if fam.boot_key else all_families.selecting_tags(fam))}
    hotplug_tags = {tag for fam in all_families.hotplug_families() for tag in all_families.selecting_tags(fam)}
    return [persistence.Concern("boot_unit", tuple(sorted(boot_tags | {"boot_unit"})), persist_boot_unit,
                                remove_boot_unit, description=BOOT_UNIT_DOC),
            persistence.Concern("udev", tuple(sorted(hotplug_tags | {"udev"})), persist_udev, remove_udev,
                                description=UDEV_DOC)]
