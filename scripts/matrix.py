#!/usr/bin/env python
"""The ansible-core version matrix: one environment per supported version, the flows on each.

    scripts/matrix.py test [VERSION ...]     set up, then run the matrix tests on each version
    scripts/matrix.py setup [VERSION ...]    create or update the environments only
    scripts/matrix.py bin VERSION            set up VERSION, print its bin directory
    scripts/matrix.py versions               the versions, oldest first

A version is a pair of files: ``requirements/matrix-V.txt`` (ansible-core and its dependencies,
pinned) and ``requirements/matrix-V-collections.txt`` (the ``ansible`` package whose bundled
collections are tested with it). Each environment is ``.cache/matrix/V/venv``: a virtual
environment from the first file, plus the collections galaxy.yml depends on, taken from the
second file's wheel (only downloaded, ~50 MB, kept in ``.cache/matrix/wheels``) into the
environment's ``site-packages/ansible_collections``, where the ``ansible`` package puts them too.
Installing that whole package would cost ~550 MB and ~26 s per version. The setup fails when a
bundled collection is outside galaxy.yml's range or does not support the version's ansible-core.
A stamp of the inputs makes a rerun with nothing to do take well under a second. No apt package
is needed.

``test`` runs MATRIX_TESTS (the flows that matter, from tests/integration) once per version with
GPUNODE_ANSIBLE_BIN set to that environment's bin directory, MATRIX_JOBS versions at a time
(default 2: the machine's cores), and prints one line per version; logs go to reports/matrix/.
The full integration suite runs on the shared .venv (the newest version) in its own stage, so on
the newest version only the installed-tarball test runs here (MATRIX_NEWEST=all: every one).
Environment: MATRIX_JOBS, MATRIX_NEWEST, PYTHON (the interpreter for the environments; default
this one).
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
SETUP_REVISION = "1"

# The collection installed from its tarball into the environment as it is: the one test whose
# result depends on what the environment holds besides ansible-core.
INSTALLED_TEST = "tests/integration/test_installed_collection.py"
# The flows that matter on every version, on simulated nodes (pytest node ids). On the newest
# version only INSTALLED_TEST runs here (MATRIX_NEWEST=all: every one): the integration stage runs
# the full suite, these included, with the same ansible-core and collection versions (.venv, whose
# pins tests/unit/test_version_matrix.py holds equal to the newest version's).
MATRIX_TESTS = [
    # runtime + persistent in check mode write nothing
    "tests/integration/test_playbooks.py::test_check_mode_writes_nothing",
    # the precheck: bad values named before any change, by every playbook; unknown names warned about
    "tests/integration/test_playbooks.py::test_bad_values_fail_validation_before_any_change",
    *("tests/integration/test_precheck.py::test_" + name for name in (
        "bad_variable_is_one_short_line", "every_playbook_names_the_variable_its_value_and_what_is_allowed",
        "an_empty_or_relative_root_plans_nothing", "unknown_variable_warns_with_the_nearest_name",
        "unknown_variable_fails_when_strict")),
    # runtime, idempotent rerun (changed=0), rollback byte-identical
    "tests/integration/test_playbooks.py::test_runtime_is_idempotent_and_rollback_restores_the_tree",
    # runtime + persistent + verify, persistent rerun (changed=0), rollback removes every file
    "tests/integration/test_playbooks.py::test_persistent_then_rollback_removes_every_file",
    # verify: states, kernel-log classes, reports, exit status (one tuning run, one verify run),
    # the tuning_facts redirect (plugin routing), one module run per host (a callback plugin counts)
    *("tests/integration/test_verify.py::test_" + name for name in (
        "verify_leaves_every_node_byte_identical", "exit_status_is_nonzero_when_a_host_drifts",
        "applied_after_runtime_tuning", "pending_reboot_from_the_grub_dropin", "drifted_on_the_untuned_audited_node",
        "not_applicable_on_tiny_vm", "kernel_log_classes", "kernel_log_counts_from_boot_after_a_reboot",
        "a_host_that_errors_is_reported", "junit_parses_as_testsuite_testcase", "markdown_reports_read_well",
        "fleet_summary_lists_failing_and_missing_hosts_first", "tuning_facts_still_works_redirected_with_a_deprecation",
        "verification_is_one_module_run_on_the_node")),
    # the rollout: canary and batches, the batch gate, the health gate, the measure gate
    "tests/integration/test_rollout.py::test_default_runtime_rollout_passes_an_acpi_cpufreq_fleet_canary_first",
    "tests/integration/test_rollout.py::test_failing_canary_stops_the_rollout",
    "tests/integration/test_rollout.py::test_unhealthy_canary_is_not_tuned_and_stops_the_rollout",
    "tests/integration/test_rollout_measure_gate.py",
    # the tarball installed with ansible-galaxy, its playbooks run by FQCN outside the checkout
    INSTALLED_TEST,
]
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


def python():
    return os.environ.get("PYTHON") or sys.executable


def stamp_path(version):
    """The stamp file whose name is the digest of everything the environment is made from."""
    digest = hashlib.sha256(SETUP_REVISION.encode())
    for path in requirement_files(version):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    digest.update(json.dumps(dependencies(), sort_keys=True).encode())
    with open(os.path.join(REPO, "scripts", "offline_get_pip.py"), "rb") as handle:
        digest.update(handle.read())
    digest.update(subprocess.run([python(), "-VV"], capture_output=True, check=True).stdout)
    return os.path.join(env_dir(version), ".matrix-%s" % digest.hexdigest()[:16])


def run(cmd, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode:
        raise RuntimeError("%s failed (rc %d):\n%s%s" % (" ".join(cmd), proc.returncode, proc.stdout, proc.stderr))
    return proc.stdout


def bundle_wheel(bundle_file):
    """The wheel of the ``ansible`` package pinned in ``bundle_file``, downloaded once."""
    version = pinned(bundle_file, "ansible")
    wheel = os.path.join(WHEELS, "ansible-%s-py3-none-any.whl" % version)
    if not os.path.isfile(wheel):
        os.makedirs(WHEELS, exist_ok=True)
        scratch = tempfile.mkdtemp(dir=WHEELS)  # a download cut short never looks complete
        try:
            run([python(), "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
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
    """Put galaxy.yml's dependencies from ``wheel`` into ``site_packages``; {name: version}."""
    found = {}
    with zipfile.ZipFile(wheel) as archive:
        for name, spec in sorted(dependencies().items()):
            version, members = bundled_collection(archive, name, spec, core)
            shutil.rmtree(os.path.join(site_packages, "ansible_collections", *name.split(".")), ignore_errors=True)
            archive.extractall(site_packages, members)
            found[name] = version
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
    run([python(), "-m", "venv", venv])
    venv_python = os.path.join(venv, "bin", "python")
    run([venv_python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", core_file])
    site_packages = run([venv_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    core = pinned(core_file, "ansible-core")
    held = {"ansible-core": core, "ansible": pinned(bundle_file, "ansible")}
    held.update(extract_collections(bundle_wheel(bundle_file), site_packages, core))
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


def test_version(version, tests):
    """Run ``tests`` with ``version``'s ansible-core; (version, rc, seconds, pytest's summary line)."""
    os.makedirs(LOGS, exist_ok=True)
    logfile = os.path.join(LOGS, "%s.log" % version)
    env = dict(os.environ, GPUNODE_ANSIBLE_BIN=bin_dir(version))
    # Each version's pytest its own base temp: pytest prunes other numbered runs under the shared one.
    basetemp = tempfile.mkdtemp(prefix="gpunode-matrix-%s." % version)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10", "--basetemp", basetemp,
           *tests]
    start = time.monotonic()
    with open(logfile, "w", encoding="utf-8") as handle:
        handle.write("$ GPUNODE_ANSIBLE_BIN=%s %s\n" % (bin_dir(version), " ".join(cmd)))
        handle.flush()
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False).returncode
    seconds = time.monotonic() - start
    shutil.rmtree(basetemp, ignore_errors=True)
    with open(logfile, encoding="utf-8") as handle:
        summaries = SUMMARY.findall(handle.read())
    return version, rc, seconds, summaries[-1].strip() if summaries else "no pytest summary"


def test(selected, tests, jobs):
    """Set up, run ``tests`` on every selected version, ``jobs`` at a time; exit status 1 if any failed."""
    start = time.monotonic()
    held = setup(selected)
    log("environments ready in %.0f s; running %d test selection(s) on %s, %d at a time"
        % (time.monotonic() - start, len(tests), ", ".join(selected), jobs))
    newest = versions()[-1]
    newest_tests = tests if os.environ.get("MATRIX_NEWEST") == "all" else [INSTALLED_TEST]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda v: test_version(v, newest_tests if v == newest else tests), selected))
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
    parser.add_argument("command", choices=["test", "setup", "bin", "versions"])
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
    if args.command == "setup":
        setup(selected)
        return 0
    # Every version at once by default: the newest runs only the tarball test, so two at a time left
    # one core idle while the last old version ran alone (472 s against about 330 s for all four at once).
    return test(selected, MATRIX_TESTS, int(os.environ.get("MATRIX_JOBS") or len(selected)))


if __name__ == "__main__":
    sys.exit(main())
