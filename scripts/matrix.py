#!/usr/bin/env python
"""The ansible-core version matrix: one environment per supported version, the tests that differ by version on each.

    scripts/matrix.py test [VERSION ...]     set up, then run the matrix tests on each version
    scripts/matrix.py setup [VERSION ...]    create or update the environments only
    scripts/matrix.py bin VERSION            set up VERSION, print its bin directory
    scripts/matrix.py versions               the versions, oldest first
    scripts/matrix.py python VERSION         the controller Python VERSION's environment is made from

A version is a pair of files: ``requirements/matrix-V.txt`` (ansible-core and its dependencies,
pinned, and pytest for the in-process tests) and ``requirements/matrix-V-collections.txt`` (the
``ansible`` package whose bundled collections are tested with it). Each environment is
``.cache/matrix/V/venv``: a virtual environment from the first file, made with a controller Python
that ansible-core supports (CONTROLLER_PYTHONS: 2.20 and 2.21 need 3.12 or newer, found among
pyenv's builds and on PATH; none found fails the setup, saying what to install), plus the
collections galaxy.yml depends on (and the collections those depend on), taken from the second
file's wheel (only downloaded, ~50 MB, kept in ``.cache/matrix/wheels``) into the environment's
``site-packages/ansible_collections``, where the ``ansible`` package puts them too. Installing that
whole package would cost ~550 MB and ~26 s per version. The setup fails when a bundled collection is
outside galaxy.yml's range or does not support the version's ansible-core. A stamp of the inputs
makes a rerun with nothing to do take well under a second. No apt package is needed.

``test`` runs, once per version and MATRIX_JOBS versions at a time (default: all at once), the
tests whose behaviour differs by ansible-core version: MATRIX_UNIT in-process with the version's
own Python, then MATRIX_TESTS (flows from tests/integration) with GPUNODE_ANSIBLE_BIN set to the
version's bin directory. It prints one line per version; logs go to reports/matrix/. The version
of the shared .venv (requirements.txt) runs MATRIX_UNIT only: the unit and integration stages run
everything with it (MATRIX_SHARED=all: the whole selection there too).
Environment: MATRIX_JOBS, MATRIX_SHARED, MATRIX_FLOWS, MATRIX_PYTHON_<V> (e.g. MATRIX_PYTHON_2_21=/usr/bin/python3.13:
the interpreter for version V's environment, instead of the one found).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(REPO, ".cache", "matrix")
WHEELS = os.path.join(CACHE, "wheels")
REQUIREMENTS = os.path.join(REPO, "requirements")
LOGS = os.path.join(REPO, "reports", "matrix")
# Bump to rebuild every environment when what setup does changes.
SETUP_REVISION = "2"
# The controller Pythons each ansible-core supports (its python_requires; ansible-test's
# CONTROLLER_PYTHON_VERSIONS), the one the matrix prefers first: 3.11 (the shared .venv's) up to 2.19,
# then two different ones for the two newest. A version missing here may use any Python 3.
CONTROLLER_PYTHONS = {
    "2.16": ("3.11", "3.10", "3.12"),
    "2.17": ("3.11", "3.10", "3.12"),
    "2.18": ("3.11", "3.12", "3.13"),
    "2.19": ("3.11", "3.12", "3.13"),
    "2.20": ("3.12", "3.13", "3.14"),
    "2.21": ("3.13", "3.12", "3.14"),
}
PYENV_ROOT = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")

# What the matrix runs on each version: only what behaves differently from one ansible-core to the
# next, each entry with why. Everything else (the families, the modules, the flows' own logic) runs
# on the node or in plain Python and is the same on every controller version: the unit and
# integration stages run it once, on the shared .venv. Before this list was trimmed, 2.16-2.18 each
# ran 32 flows (~550 s each on a loaded 2-core machine, docs/dev/testing.md has the figures).
#
# In-process, with the version's own Python and ansible-core (pytest --noconftest: tests/unit's
# conftest needs 2.19's module test helpers). Seconds each.
MATRIX_UNIT = [
    # ansible_compat's every function, role_variables' typed templating of the role's defaults and
    # presets (null stays null, 4096 an int: the 2.16-2.18 path differs from 2.19's), and that no other
    # file probes ansible-core; the benchmarks' callback on this core's real task results.
    "tests/unit/test_ansible_compat.py",
    # The variable checks: their one-line messages are built from ArgumentSpecValidator's errors,
    # whose classes and texts are ansible-core's.
    "tests/unit/test_role_variables.py",
    # The verify_reports action with this core's Templar and the role's templates: the host reports and
    # the fleet summary byte for byte (trust, environment options, trailing newlines differ by version).
    "tests/unit/test_verify_reports_action.py",
]
# The collection installed from its tarball into the environment as it is: the one test whose
# result depends on what the environment holds besides ansible-core.
INSTALLED_TEST = "tests/integration/test_installed_collection.py"
# Playbooks on simulated nodes (pytest node ids), with GPUNODE_ANSIBLE_BIN naming the version's bin.
MATRIX_TESTS = [
    # Check mode: every task's check_mode handling and the action plugins' (tuning_flow,
    # verify_reports) reading of it; nothing written.
    "tests/integration/test_playbooks.py::test_check_mode_writes_nothing",
    # The whole of tuning_flow in one test: an untagged run (runtime, persistent with the boot runner
    # sent through the connection's remote tmpdir, verification and its reports), a `--tags persistent`
    # rerun with changed=0, rollback removing every file; the desired state built from the templated
    # role defaults and presets (4096, 100, the thp dict) reaching the node typed.
    "tests/integration/test_playbooks.py::test_persistent_then_rollback_removes_every_file",
    # The precheck's failure as a user reads it: before 2.19 the message is only in the result's JSON.
    "tests/integration/test_precheck.py::test_bad_variable_is_one_short_line",
    # A warning from an action plugin as printed (wrapped at 80 columns before 2.19), once per run
    # although every host's worker computes it; with a deprecated tag alias (--tags mrrs) in check mode.
    "tests/integration/test_precheck.py::test_unknown_variable_warns_with_the_nearest_name",
    # meta/runtime.yml's plugin_routing: the redirect and its deprecation are ansible-core's to apply.
    # The rollout's positive path: `serial` from a filter (a list of batch sizes: a typed template),
    # each host's one task (tuning_flow rollout: the role's defaults through a static import, facts set
    # from the action's result) in every batch, the summary play.
    "tests/integration/test_rollout.py::test_default_runtime_rollout_passes_an_acpi_cpufreq_fleet_canary_first",
    # An unreachable host in the one task: the action returns an unreachable result that ignore_unreachable
    # keeps in the play and that sets no fact (its record is read from the registered result); the message
    # of a connection failure as each core words it.
    "tests/integration/test_rollout.py::test_unreachable_host_is_reported_once",
    # The rollout's stop: the measure gate's float gains through set_fact (typed templating), the canary
    # rolled back, end_play before the next batch, later hosts untouched; then a passing canary.
    "tests/integration/test_rollout_measure_gate.py",
    # The tarball installed with this ansible-galaxy against the environment's collections (galaxy.yml's
    # ranges, requires_ansible: no "does not support" warning), its playbooks by FQCN outside the
    # checkout: verify (exit status 2, reports), `--tags runtime` twice (changed=0), rollback; a second
    # node on the managed-node floor's Python of this core (3.8 before 2.20, 3.9 from 2.20).
    # Tag selection is ansible-core's: `--list-tags` listing every task's tags (the generated lists
    # included) and `--skip-tags always` running the flows (ansible_run_tags / ansible_skip_tags and the
    # flow tasks' inherited tags as each core computes them).
    "tests/integration/test_tags_playbooks.py::test_list_tags_shows_every_tag_that_selects_a_family_or_a_concern",
    "tests/integration/test_tags_playbooks.py::test_skip_tags_always_still_checks_the_variables_and_runs_every_flow",
    # The facts the flows export, read with facts injected as variables and without (inject_facts_as_vars):
    # a failed family fails its host and keeps it from a reboot, the reboot sequence sees reboot_required, the
    # variables are reused, the rollout's fleet summary has the host; 2.21 warns on a top-level fact read.
    "tests/integration/test_facts_as_variables.py",
    INSTALLED_TEST,
]
# Tag selection also runs above: `--tags persistent`, `--tags runtime` and the alias `--tags mrrs`.
# Not per version, and why:
# - the rest of test_verify.py, test_precheck.py and test_playbooks.py: the node's side (modules,
#   families) and messages built in Python; the reports' rendering is in MATRIX_UNIT.
# - the failing and the unhealthy canary (test_rollout.py): the same end_play stop as the measure gate,
#   for reasons the modules and filters compute.
# - ansible-runner (test_ansible_runner.py): the execution environment pins ansible-core 2.19.14 with
#   ansible-runner 2.4.3 (ee/, docs/awx.md), the versions of the shared .venv where it runs.
SUMMARY = re.compile(r"^=* ?(\d+ (?:passed|failed|error|errors|skipped|deselected)[^=]*?)=*$", re.M)


def log(message):
    print("matrix: %s" % message, file=sys.stderr, flush=True)


def versions():
    """The matrix's ansible-core versions (``2.16``, ...), oldest first."""
    found = []
    for path in glob.glob(os.path.join(REQUIREMENTS, "matrix-*.txt")):
        match = re.fullmatch(r"matrix-(\d+\.\d+)\.txt", os.path.basename(path))
        if match:
            found.append(match.group(1))
    return sorted(found, key=Version)


def env_dir(version):
    return os.path.join(CACHE, version, "venv")


def bin_dir(version):
    return os.path.join(env_dir(version), "bin")


def requirement_files(version):
    core = os.path.join(REQUIREMENTS, "matrix-%s.txt" % version)
    bundle = os.path.join(REQUIREMENTS, "matrix-%s-collections.txt" % version)
    for path in (core, bundle):
        if not os.path.isfile(path):
            raise SystemExit("matrix: %s is missing (version %s)" % (os.path.relpath(path, REPO), version))
    return core, bundle


def pinned(path, name):
    """The version ``name==X`` in requirements file ``path`` pins."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            match = re.fullmatch(r"%s==(\S+)" % re.escape(name), line.split("#")[0].strip(), re.I)
            if match:
                return match.group(1)
    raise SystemExit("matrix: %s pins no %s==VERSION" % (os.path.relpath(path, REPO), name))


def dependencies():
    """galaxy.yml's collection dependencies: {name: version range}."""
    with open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle).get("dependencies") or {}


class NoPython(RuntimeError):
    """No supported controller Python for a version: what to install is in the message."""


_PYTHONS = {}


def probe(path, minor):
    """Whether ``path`` runs as Python ``minor`` with venv and ensurepip (a pyenv shim of a version not
    selected, or Debian's python3.X without python3.X-venv, does not)."""
    try:
        proc = subprocess.run([path, "-c", "import sys, venv, ensurepip; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == minor


def candidates(minor):
    """Interpreters that may be Python ``minor``: this one, pyenv's builds (newest first), PATH, /usr/bin."""
    found = []
    if "%d.%d" % sys.version_info[:2] == minor:
        found.append(sys.executable)
    builds = glob.glob(os.path.join(PYENV_ROOT, "versions", minor + ".*", "bin", "python" + minor))
    found += sorted(builds, key=lambda p: Version(p.split(os.sep)[-3]) if re.fullmatch(
        r"\d+\.\d+\.\d+", p.split(os.sep)[-3]) else Version("0"), reverse=True)
    found += [p for p in (shutil.which("python" + minor), "/usr/bin/python" + minor) if p]
    return list(dict.fromkeys(found))


def python(version):
    """The controller Python that ``version``'s environment is made from (NoPython when there is none)."""
    if version in _PYTHONS:
        return _PYTHONS[version]
    supported = CONTROLLER_PYTHONS.get(version)
    override = os.environ.get("MATRIX_PYTHON_" + version.replace(".", "_"))
    if override:
        if supported and not any(probe(override, minor) for minor in supported):
            raise NoPython("MATRIX_PYTHON_%s=%s is not a Python %s with venv; ansible-core %s supports %s on the "
                           "controller" % (version.replace(".", "_"), override, "/".join(supported), version,
                                           ", ".join(supported)))
        _PYTHONS[version] = override
        return override
    if not supported:
        _PYTHONS[version] = sys.executable
        return sys.executable
    for minor in supported:
        for path in candidates(minor):
            if probe(path, minor):
                _PYTHONS[version] = path
                return path
    wanted = supported[0]
    raise NoPython(
        "ansible-core %s needs Python %s on the controller; none was found (pyenv builds under %s/versions, "
        "python3.X on PATH, /usr/bin). Install one and rerun: `pyenv install %s` (pyenv), or on Debian 13 "
        "`apt-get install python%s python%s-venv`; or name one: MATRIX_PYTHON_%s=/path/to/python%s"
        % (version, " or ".join(supported), PYENV_ROOT, wanted, wanted, wanted, version.replace(".", "_"), wanted))


def stamp_path(version):
    """The stamp file whose name is the digest of everything the environment is made from."""
    digest = hashlib.sha256(SETUP_REVISION.encode())
    for path in requirement_files(version):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    digest.update(json.dumps(dependencies(), sort_keys=True).encode())
    with open(os.path.join(REPO, "scripts", "offline_get_pip.py"), "rb") as handle:
        digest.update(handle.read())
    digest.update(subprocess.run([python(version), "-VV"], capture_output=True, check=True).stdout)
    return os.path.join(env_dir(version), ".matrix-%s" % digest.hexdigest()[:16])


def run(cmd, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode:
        raise RuntimeError("%s failed (rc %d):\n%s%s" % (" ".join(cmd), proc.returncode, proc.stdout, proc.stderr))
    return proc.stdout


def bundle_wheel(bundle_file, interpreter):
    """The wheel of the ``ansible`` package pinned in ``bundle_file``, downloaded once.

    ``interpreter``: a Python the package supports (pip checks its Requires-Python: ansible 13 wants 3.12).
    """
    version = pinned(bundle_file, "ansible")
    wheel = os.path.join(WHEELS, "ansible-%s-py3-none-any.whl" % version)
    if not os.path.isfile(wheel):
        os.makedirs(WHEELS, exist_ok=True)
        scratch = tempfile.mkdtemp(dir=WHEELS)  # a download cut short never looks complete
        try:
            run([interpreter, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                 "--dest", scratch, "-r", bundle_file])
            os.replace(os.path.join(scratch, os.path.basename(wheel)), wheel)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return wheel


def in_range(version, spec):
    """Whether a collection ``version`` satisfies a Galaxy-style range (``*`` or ``>=1.0,<2``)."""
    return spec.strip() == "*" or Version(version) in SpecifierSet(spec)


def bundled_collection(archive, name, spec, core):
    """(version, member names) of collection ``name`` in the wheel ``archive``, checked.

    Fails when it is missing, outside galaxy.yml's range ``spec``, or does not support ``core``.
    """
    wheel = os.path.basename(archive.filename)
    prefix = "ansible_collections/%s/" % name.replace(".", "/")
    members = [n for n in archive.namelist() if n.startswith(prefix)]
    if prefix + "MANIFEST.json" not in members:
        raise RuntimeError("%s carries no %s" % (wheel, name))
    version = json.loads(archive.read(prefix + "MANIFEST.json"))["collection_info"]["version"]
    if not in_range(version, str(spec)):
        raise RuntimeError("%s %s (from %s) is outside galaxy.yml's range %s: widen the range or pin another "
                           "ansible package" % (name, version, wheel, spec))
    runtime = {}
    if prefix + "meta/runtime.yml" in members:
        runtime = yaml.safe_load(archive.read(prefix + "meta/runtime.yml")) or {}
    requires = str(runtime.get("requires_ansible") or "*")
    if not in_range(core, requires):
        raise RuntimeError("%s %s (from %s) requires ansible-core %s, not %s" % (name, version, wheel, requires, core))
    return version, members


def extract_collections(wheel, site_packages, core):
    """Put galaxy.yml's dependencies from ``wheel`` into ``site_packages``, and theirs; {name: version}.

    A user's ``pip install ansible`` has every collection a dependency needs (community.general 13
    depends on community.library_inventory_filtering_v1): without them ``ansible-galaxy collection
    install`` of our tarball would ask Galaxy for them.
    """
    found = {}
    wanted = sorted(dependencies().items())
    with zipfile.ZipFile(wheel) as archive:
        while wanted:
            name, spec = wanted.pop(0)
            if name in found:
                if not in_range(found[name], str(spec)):
                    raise RuntimeError("%s %s is outside %s, which another collection needs"
                                       % (name, found[name], spec))
                continue
            version, members = bundled_collection(archive, name, spec, core)
            shutil.rmtree(os.path.join(site_packages, "ansible_collections", *name.split(".")), ignore_errors=True)
            archive.extractall(site_packages, members)
            found[name] = version
            prefix = "ansible_collections/%s/" % name.replace(".", "/")
            manifest = json.loads(archive.read(prefix + "MANIFEST.json"))["collection_info"]
            wanted += sorted((manifest.get("dependencies") or {}).items())
    return found


def install_offline_get_pip(venv_python):
    """scripts/setup.sh's offline pip bootstrap for this ansible-test's pinned pip (sanity)."""
    pip_version = run([venv_python, "-c", (
        "import sys, types\n"
        "from ansible_test._internal.python_requirements import get_venv_packages\n"
        "print(get_venv_packages(types.SimpleNamespace(version='%d.%d' % sys.version_info[:2]))['pip'])")]).strip()
    target = os.path.expanduser("~/.ansible/test/cache/get_pip_%s.py" % pip_version.replace(".", "_"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    scratch = "%s.%d" % (target, os.getpid() + id(venv_python))  # versions set up at once may share it
    shutil.copyfile(os.path.join(REPO, "scripts", "offline_get_pip.py"), scratch)
    os.replace(scratch, target)


def setup_version(version):
    """Create or update the environment of ``version``; return what it holds (from its stamp)."""
    stamp = stamp_path(version)
    if os.path.isfile(stamp):
        with open(stamp, encoding="utf-8") as handle:
            return json.load(handle)
    start = time.monotonic()
    core_file, bundle_file = requirement_files(version)
    venv = env_dir(version)
    shutil.rmtree(venv, ignore_errors=True)
    run([python(version), "-m", "venv", venv])
    venv_python = os.path.join(venv, "bin", "python")
    run([venv_python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", core_file])
    site_packages = run([venv_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    core = pinned(core_file, "ansible-core")
    held = {"python": run([venv_python, "-c", "import platform; print(platform.python_version())"]).strip(),
            "ansible-core": core, "ansible": pinned(bundle_file, "ansible")}
    held.update(extract_collections(bundle_wheel(bundle_file, venv_python), site_packages, core))
    install_offline_get_pip(venv_python)
    with open(stamp, "w", encoding="utf-8") as handle:
        json.dump(held, handle)
    log("%s: environment ready in %.0f s (%s)" % (version, time.monotonic() - start, describe(held)))
    return held


def describe(held):
    return ", ".join("%s %s" % item for item in held.items())


def setup(selected):
    """Set up every selected version, in parallel (mostly downloads and unpacking); {version: held}."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(selected))) as pool:
        futures = {v: pool.submit(setup_version, v) for v in selected}
    failed = {v: f.exception() for v, f in futures.items() if f.exception()}
    for version, exc in failed.items():
        log("%s: setup failed: %s" % (version, exc))
    if failed:
        raise SystemExit(1)
    return {v: f.result() for v, f in futures.items()}


def shared_version():
    """The version of the shared .venv: requirements.txt's ansible-core (``2.19``)."""
    return ".".join(pinned(os.path.join(REPO, "requirements.txt"), "ansible-core").split(".")[:2])


# The versions that run MATRIX_TESTS besides MATRIX_UNIT: both ends of each group of cores that behave alike
# (docs/compatibility.md, "What holds on which core": 2.16 to 2.18, 2.19, 2.20 and 2.21), and 2.19 through the
# shared .venv's whole integration stage. 2.17 and 2.20, each between two tested cores of its group, run MATRIX_UNIT
# (MATRIX_FLOWS=all: the flows on every version, about 2 minutes more on 2 CPUs).
FLOWS_VERSIONS = ("2.16", "2.18", "2.21")


def selection(version):
    """``(unit tests, integration tests)`` for ``version``: the shared .venv's runs MATRIX_UNIT only, and so does a
    version outside FLOWS_VERSIONS unless MATRIX_FLOWS=all."""
    if version == shared_version() and os.environ.get("MATRIX_SHARED") != "all":
        return MATRIX_UNIT, []
    if version not in FLOWS_VERSIONS and os.environ.get("MATRIX_FLOWS") != "all" and version != shared_version():
        return MATRIX_UNIT, []
    return MATRIX_UNIT, MATRIX_TESTS


def pytest_run(handle, cmd, env):
    handle.write("$ %s\n" % " ".join(cmd))
    handle.flush()
    rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False).returncode
    handle.flush()
    return rc


def test_version(version):
    """Run ``version``'s selection; (version, rc, seconds, pytest's summary lines)."""
    os.makedirs(LOGS, exist_ok=True)
    logfile = os.path.join(LOGS, "%s.log" % version)
    unit, flows = selection(version)
    # Each version's pytest its own base temp: pytest prunes other numbered runs under the shared one.
    basetemp = tempfile.mkdtemp(prefix="gpunode-matrix-%s." % version)
    common = ["-q", "-p", "no:cacheprovider", "--durations=10"]
    start = time.monotonic()
    rcs, parts = [], []
    with open(logfile, "w", encoding="utf-8") as handle:
        # In-process on the version's own Python; the collection found on the path as the conftest would put it.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, ".collections"),
                                                           os.path.join(REPO, "tools")]))
        env.pop("GPUNODE_ANSIBLE_BIN", None)
        rcs.append(pytest_run(handle, [os.path.join(bin_dir(version), "python"), "-m", "pytest", *common,
                                       "--noconftest", "--basetemp", os.path.join(basetemp, "unit"), *unit], env))
        parts.append("unit")
        if flows:
            env = dict(os.environ, GPUNODE_ANSIBLE_BIN=bin_dir(version))
            handle.write("GPUNODE_ANSIBLE_BIN=%s\n" % bin_dir(version))
            rcs.append(pytest_run(handle, [sys.executable, "-m", "pytest", *common, "--basetemp",
                                           os.path.join(basetemp, "flows"), *flows], env))
            parts.append("flows")
    seconds = time.monotonic() - start
    shutil.rmtree(basetemp, ignore_errors=True)
    with open(logfile, encoding="utf-8") as handle:
        summaries = SUMMARY.findall(handle.read())
    summary = "; ".join("%s: %s" % (part, text.strip()) for part, text in zip(parts, summaries, strict=False))
    return version, max(rcs), seconds, summary or "no pytest summary"


def test(selected, jobs):
    """Set up, run every selected version's selection, ``jobs`` at a time; exit status 1 if any failed."""
    start = time.monotonic()
    held = setup(selected)
    log("environments ready in %.0f s; running %d in-process and %d playbook test selection(s) on %s (%s: "
        "in-process only), %d at a time" % (time.monotonic() - start, len(MATRIX_UNIT), len(MATRIX_TESTS),
                                            ", ".join(selected), shared_version(), jobs))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(test_version, selected))
    failed = []
    for version, rc, seconds, summary in results:
        status = "passed" if rc == 0 else "FAILED"
        print("matrix: ansible-core %-8s %s in %4.0f s: %s  [%s; log reports/matrix/%s.log]"
              % (held[version]["ansible-core"], status, seconds, summary, describe(held[version]), version))
        if rc:
            failed.append(version)
    print("matrix: %d version(s) in %.0f s%s" % (len(selected), time.monotonic() - start,
                                                 ", FAILED: " + ", ".join(failed) if failed else ", all passed"))
    return 1 if failed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("command", choices=["test", "setup", "bin", "versions", "python"])
    parser.add_argument("versions", nargs="*", help="default: every version of requirements/matrix-*.txt")
    args = parser.parse_args(argv)
    known = versions()
    unknown = sorted(set(args.versions) - set(known))
    if unknown:
        parser.error("unknown version(s) %s; the matrix has %s" % (", ".join(unknown), ", ".join(known)))
    selected = args.versions or known
    if args.command == "versions":
        print("\n".join(known))
        return 0
    if args.command == "bin":
        if len(args.versions) != 1:
            parser.error("bin wants exactly one version")
        setup(selected)
        print(bin_dir(selected[0]))
        return 0
    if args.command == "python":
        if len(args.versions) != 1:
            parser.error("python wants exactly one version")
        try:
            print(python(selected[0]))
        except NoPython as exc:
            log(str(exc))
            return 1
        return 0
    if args.command == "setup":
        setup(selected)
        return 0
    # Every version at once by default: the shared .venv's version runs seconds only, and two at a time
    # left a core idle while the last version ran alone (472 s against about 330 s for four at once).
    return test(selected, int(os.environ.get("MATRIX_JOBS") or len(selected)))


if __name__ == "__main__":
    sys.exit(main())
