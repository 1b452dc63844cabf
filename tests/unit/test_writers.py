"""The node's one lock around the writing flows (tuning_apply, tuning_persist), and the directories rollback
takes back (plugins/module_utils/flows/writers.py, core/lock.py, core/journal.py's created_dirs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from support.checkout import REPO
from support.trees import snapshot, tree_changes

from ansible_collections.gpunode.tuning.plugins.module_utils.core import lock

JOURNAL = "/var/lib/gpunode-tuning/journal.json"
LOCK = "var/lib/gpunode-tuning/.lock"
COLLECTIONS = os.path.join(REPO, ".collections")
RUNTIME = [{"name": "pcie_mrrs", "options": {"mrrs": 4096, "vendor": "10de", "class_prefixes": ["0300", "0302"],
                                             "allow_empty": True}},
           {"name": "cpuidle", "options": {"max_latency_us": 2}}]
TUNABLES = [{"name": "tunables", "options": {"transparent_hugepage": {"enabled": "madvise", "defrag": "defer+madvise"},
                                             "sysctl": {"vm.swappiness": 1}}}]
RESTORE = [{"name": n, "options": {"restore": True, **({"allow_empty": True} if n == "pcie_mrrs" else {})}}
           for n in ("pcie_mrrs", "cpuidle", "tunables")]


def module_process(name, args):
    """The module as Ansible runs it on the node: its own Python process, its arguments in a file."""
    path = os.path.join(args["root"], "..", "%s-%d.json" % (name, time.monotonic_ns()))
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, fh)
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    module = "ansible_collections.gpunode.tuning.plugins.modules.%s" % name
    return subprocess.Popen([sys.executable, "-m", module, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd="/")


def finished(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return json.loads(out[out.index("{"):]) if "{" in out else {"failed": True, "msg": out + err}


def holder_process(root, flow, seconds):
    """Another process holding the node's lock as ``flow`` for ``seconds``; returns once it holds it."""
    code = ("import sys, time\n"
            "from ansible_collections.gpunode.tuning.plugins.module_utils.core import lock\n"
            "with lock.NodeLock(sys.argv[1], sys.argv[2]):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(float(sys.argv[3]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, os.path.join(root, LOCK), flow, str(seconds)],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=COLLECTIONS))
    assert proc.stdout.readline().strip() == "held"
    return proc


def without_var(root):
    shutil.rmtree(os.path.join(root, "var"))
    return root


def test_rollback_removes_the_directories_our_writes_created_and_restores_to_the_byte(build_node, run_module):
    """A node that had no /var: runtime creates /var/lib/gpunode-tuning for the journal and records what it created;
    rollback removes all of it, and the lock's file."""
    root = without_var(build_node())
    before = snapshot(root)
    result, failed = run_module("tuning_apply", {"families": RUNTIME + TUNABLES, "root": root, "journal": JOURNAL})
    assert not failed and result["changed"], result
    with open(os.path.join(root, JOURNAL.lstrip("/")), encoding="utf-8") as fh:
        assert json.load(fh)["created_dirs"] == ["/var", "/var/lib", "/var/lib/gpunode-tuning"]
    assert not os.path.exists(os.path.join(root, LOCK))  # released: the lock file goes
    result, failed = run_module("tuning_apply", {"families": RESTORE, "root": root, "journal": JOURNAL})
    assert not failed and result["changed"], result
    assert tree_changes(before, snapshot(root)) == []  # /var included: it was not there before


def test_rollback_leaves_the_directories_that_existed_before(build_node, run_module):
    root = build_node()
    # var/lib exists without our directory in it (the simulator's own var/lib/simnode beside it).
    assert "gpunode-tuning" not in os.listdir(os.path.join(root, "var/lib"))
    before = snapshot(root)
    run_module("tuning_apply", {"families": TUNABLES, "root": root, "journal": JOURNAL})
    with open(os.path.join(root, JOURNAL.lstrip("/")), encoding="utf-8") as fh:
        assert json.load(fh)["created_dirs"] == ["/var/lib/gpunode-tuning"]
    run_module("tuning_apply", {"families": RESTORE, "root": root, "journal": JOURNAL})
    assert tree_changes(before, snapshot(root)) == [] and os.path.isdir(os.path.join(root, "var/lib"))


def test_persistent_files_directories_are_recorded_and_rollback_removes_them(build_node, run_module):
    root = build_node()
    shutil.rmtree(os.path.join(root, "etc/sysctl.d"))
    before = snapshot(root)
    settings = {"sysctl_file": "/etc/sysctl.d/90-gpunode-tuning.conf"}
    desired = {"sysctl": {"vm.swappiness": 1}}
    result, failed = run_module("tuning_persist", {"concerns": ["sysctl"], "desired": desired, "settings": settings,
                                                   "root": root, "journal": JOURNAL})
    assert not failed, result
    with open(os.path.join(root, JOURNAL.lstrip("/")), encoding="utf-8") as fh:
        assert "/etc/sysctl.d" in json.load(fh)["created_dirs"]
    again, failed = run_module("tuning_persist", {"concerns": ["sysctl"], "desired": desired, "settings": settings,
                                                  "root": root, "journal": JOURNAL})
    assert not failed and not again["changed"], again
    result, failed = run_module("tuning_persist", {"state": "absent", "concerns": ["sysctl"], "settings": settings,
                                                   "root": root, "journal": JOURNAL})
    assert not failed, result
    assert tree_changes(before, snapshot(root)) == []


def test_a_second_writer_waits_bounded_then_fails_naming_the_holder(build_node, run_module):
    root = build_node()
    holder = holder_process(root, "persistent", 30)
    try:
        before = snapshot(root)
        started = time.monotonic()
        result, failed = run_module("tuning_apply", {"families": TUNABLES, "root": root, "journal": JOURNAL,
                                                     "lock_timeout": 1})
        waited = time.monotonic() - started
        after = snapshot(root)
    finally:
        holder.kill()
        holder.wait()
    assert failed and 1 <= waited < 10, (waited, result)
    assert "is held by the persistent run (pid %d on " % holder.pid in result["msg"], result["msg"]
    assert "since 20" in result["msg"] and "this runtime run waited 1.0 s" in result["msg"]
    assert "stops before writing anything" in result["msg"]
    assert tree_changes(before, after) == []


def test_a_second_writer_waits_for_the_first_and_then_runs(build_node):
    """Held for 2 s by another writer, a runtime run waits (it writes nothing meanwhile), then runs when the lock
    is let go."""
    root = build_node()
    thp = os.path.join(root, "sys/kernel/mm/transparent_hugepage/enabled")
    with open(thp, encoding="utf-8") as fh:
        untouched = fh.read()
    holder = holder_process(root, "persistent", 2)
    started = time.monotonic()
    writer = module_process("tuning_apply", {"families": TUNABLES, "root": root, "journal": JOURNAL,
                                             "lock_timeout": 30})
    time.sleep(1)
    with open(thp, encoding="utf-8") as fh:
        assert fh.read() == untouched and writer.poll() is None  # still waiting, nothing written
    holder.wait()
    result = finished(writer)
    assert not result.get("failed") and result["changed"] and time.monotonic() - started >= 2, result
    with open(thp, encoding="utf-8") as fh:
        assert "[madvise]" in fh.read()


def test_check_mode_and_verification_take_no_lock(build_node, run_module):
    root = without_var(build_node())
    holder = holder_process(root, "rollback", 30)
    try:
        before = snapshot(root)
        started = time.monotonic()
        result, failed = run_module("tuning_apply", {"families": TUNABLES, "root": root, "journal": JOURNAL,
                                                     "lock_timeout": 20}, check=True)
        assert not failed and result["changed"] and time.monotonic() - started < 10, result
        info, failed = run_module("tuning_info", {"root": root})
        assert not failed and time.monotonic() - started < 15, info
        assert tree_changes(before, snapshot(root)) == []
    finally:
        holder.kill()
        holder.wait()
    fresh = without_var(build_node())
    run_module("tuning_apply", {"families": TUNABLES, "root": fresh, "journal": JOURNAL}, check=True)
    assert not os.path.exists(os.path.join(fresh, "var"))  # check mode: no lock file, no directory for it


@pytest.mark.parametrize("stagger", [0.0, 0.2, 0.4])
def test_two_writers_at_once_then_rollback_restores_the_node_to_the_byte(build_node, stagger):
    """Two runtime runs of different families and a persistent run, started together (the later ones ``stagger``
    seconds apart, so that their journal writes fall inside another's) against a node without /var: each journals
    into the one journal (its originals, the directories it created); the lock serializes them, so none loses
    another's entries, and rollback restores the node to the byte."""
    root = without_var(build_node())
    shutil.rmtree(os.path.join(root, "etc/sysctl.d"))
    before = snapshot(root)
    persistent = {"concerns": ["sysctl"], "desired": {"sysctl": {"vm.swappiness": 1}},
                  "settings": {"sysctl_file": "/etc/sysctl.d/90-gpunode-tuning.conf"}, "root": root,
                  "journal": JOURNAL}
    procs = []
    for name, args in (("tuning_apply", {"families": RUNTIME, "root": root, "journal": JOURNAL}),
                       ("tuning_apply", {"families": TUNABLES, "root": root, "journal": JOURNAL}),
                       ("tuning_persist", persistent)):
        procs.append(module_process(name, args))
        time.sleep(stagger)
    results = [finished(p) for p in procs]
    assert not any(r.get("failed") for r in results), results
    with open(os.path.join(root, JOURNAL.lstrip("/")), encoding="utf-8") as fh:
        journaled = json.load(fh)
    assert {"pcie_mrrs", "cpuidle", "tunables"} <= set(journaled["families"]), journaled
    assert {"/var", "/var/lib", "/var/lib/gpunode-tuning", "/etc/sysctl.d"} <= set(journaled["created_dirs"])
    removed = finished(module_process("tuning_persist", dict(persistent, state="absent")))
    restored = finished(module_process("tuning_apply", {"families": RESTORE, "root": root, "journal": JOURNAL}))
    assert not removed.get("failed") and not restored.get("failed") and restored["changed"], (removed, restored)
    assert tree_changes(before, snapshot(root)) == []


def test_the_lock_sits_next_to_the_journal(build_node):
    from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import writers

    root = build_node()
    node = Node.open(root)
    assert writers.lock_file(node) == os.path.join(root, LOCK)
    assert writers.lock_file(node, "/srv/tuning/j.json") == os.path.join(root, "srv/tuning/.lock")
    try:
        writers.lock_file(node, "relative.json")
    except lock.LockError as exc:
        assert "must be absolute" in str(exc)
    else:
        raise AssertionError("a relative journal path was accepted")


def install_boot_runner(root, state):
    """The runner and its desired state, as the persistent flow installs them for the boot unit."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot

    runner = os.path.join(root, "usr/local/lib/gpunode-tuning/apply-boot-tuning.sh")
    os.makedirs(os.path.dirname(runner), exist_ok=True)
    with open(runner, "w", encoding="utf-8") as fh:
        fh.write(boot.runner_text(boot.carried_sources(os.path.join(REPO, "plugins", "module_utils"))))
    desired = os.path.join(root, boot.DESIRED_PATH.lstrip("/"))
    os.makedirs(os.path.dirname(desired), exist_ok=True)
    with open(desired, "w", encoding="utf-8") as fh:
        json.dump(dict(state, version=1), fh)
    return [sys.executable, "-I", "-B", runner, "--desired", boot.DESIRED_PATH, "--root", root]


def test_the_boot_runner_takes_the_lock_and_fails_naming_the_holder(build_node):
    root = build_node()
    argv = install_boot_runner(root, {"thp": {"enabled": "madvise", "defrag": "defer+madvise"}})
    thp = os.path.join(root, "sys/kernel/mm/transparent_hugepage/enabled")
    with open(thp, encoding="utf-8") as fh:
        untouched = fh.read()
    holder = holder_process(root, "rollback", 30)
    try:
        proc = subprocess.run(argv + ["--lock-timeout", "0.5"], capture_output=True, text=True, check=False, cwd="/",
                              timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is held by the rollback run (pid %d" % holder.pid in proc.stdout and "this boot run waited" in proc.stdout
    with open(thp, encoding="utf-8") as fh:
        assert fh.read() == untouched  # nothing re-applied while another writer held the node
    os.unlink(os.path.join(root, LOCK))  # the killed holder's file; the next run takes it over either way
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, cwd="/", timeout=60)
    assert proc.returncode == 0 and "thp" in proc.stdout, proc.stdout + proc.stderr
    assert not os.path.exists(os.path.join(root, LOCK))


def test_the_guard_reapply_takes_the_lock(build_node, monkeypatch):
    from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import guard

    root = build_node()
    config = {"guard": {"status_file": "/var/lib/gpunode-tuning/guard-status.json"}}
    plan = {"thp": {"enabled": "madvise", "defrag": "defer+madvise"}}
    holder = holder_process(root, "persistent", 30)
    monkeypatch.setattr(lock, "DEFAULT_TIMEOUT", 0.5)
    try:
        [(key, ok, message)] = guard.reapply(Node.open(root), config, plan)
    finally:
        holder.kill()
        holder.wait()
    assert key == "thp" and not ok and "is held by the persistent run (pid %d" % holder.pid in message, message
    assert "this guard-reapply run waited" in message
    os.unlink(os.path.join(root, LOCK))
    [(key, ok, message)] = guard.reapply(Node.open(root), config, plan)
    assert ok, message


def test_the_boot_unit_and_udev_rule_name_a_journal_that_is_not_the_default():
    """The runner's lock is next to the journal: a journal elsewhere reaches the runner as --journal; the default
    keeps the unit and the rule as they were (no rewrite on upgrade)."""
    from ansible_collections.gpunode.tuning.plugins.module_utils.flows import boot

    settings = {"boot_python": "/usr/bin/python3", "boot_script": "/usr/local/lib/gpunode-tuning/apply-boot-tuning.sh"}
    desired = {"pcie_mrrs": {"mrrs": 4096, "vendor": "10de"}}
    assert "--journal" not in boot.unit_text(dict(settings, journal=JOURNAL))
    assert "--journal" not in boot.rule_text(dict(settings, journal=JOURNAL), desired)
    unit = boot.unit_text(dict(settings, journal="/srv/tuning/journal.json"))
    assert "--desired /etc/gpunode-tuning/desired.json --journal /srv/tuning/journal.json\n" in unit
    assert " --journal /srv/tuning/journal.json --only pcie_mrrs --bdf %k" in boot.rule_text(
        dict(settings, journal="/srv/tuning/journal.json"), desired)


def test_a_directory_a_familys_persistent_write_creates_is_journaled_and_rollback_removes_it(build_node, run_module):
    """Issue 42: an Ubuntu node without /etc/default/grub.d. kernel_cmdline's drop-in write creates it (outside the
    concern's NodeFiles); the journal records it and rollback gives back the tree byte for byte."""
    root = build_node("mi300x-epyc-8gpu", cpus=4)
    os.rmdir(os.path.join(root, "etc/default/grub.d"))
    before = snapshot(root)
    settings = {"kernel_cmdline_enabled": True, "kernel_cmdline_args": ["iommu=pt"]}
    args = {"concerns": ["kernel_cmdline"], "desired": {"kernel_cmdline": ["iommu=pt"]}, "settings": settings,
            "root": root, "journal": JOURNAL}
    result, failed = run_module("tuning_persist", args)
    assert not failed and result["changed"], result
    assert os.path.isfile(os.path.join(root, "etc/default/grub.d/60-gpunode-tuning.cfg"))
    with open(os.path.join(root, JOURNAL.lstrip("/")), encoding="utf-8") as fh:
        assert "/etc/default/grub.d" in json.load(fh)["created_dirs"]
    result, failed = run_module("tuning_persist", dict(args, state="absent"))
    assert not failed and result["changed"], result
    assert tree_changes(before, snapshot(root)) == []  # grub.d included: it was not there before


def test_a_directory_that_existed_before_the_persistent_write_stays_at_rollback(build_node, run_module):
    root = build_node("mi300x-epyc-8gpu", cpus=4)
    before = snapshot(root)
    settings = {"kernel_cmdline_enabled": True, "kernel_cmdline_args": ["iommu=pt"]}
    args = {"concerns": ["kernel_cmdline"], "desired": {"kernel_cmdline": ["iommu=pt"]}, "settings": settings,
            "root": root, "journal": JOURNAL}
    assert not run_module("tuning_persist", args)[1]
    assert os.path.isfile(os.path.join(root, "etc/default/grub.d/60-gpunode-tuning.cfg"))
    assert not run_module("tuning_persist", dict(args, state="absent"))[1]
    assert tree_changes(before, snapshot(root)) == [] and os.path.isdir(os.path.join(root, "etc/default/grub.d"))


def test_families_and_flows_create_directories_only_through_the_journaled_helpers():
    """Every directory a family or flow creates goes through files.make_dirs (told to Call.on_created) or NodeFiles
    (told to its on_created): a bare os.makedirs would leave a directory rollback does not know. The guard's own
    lock directory is its state, not a tuning write."""
    base = os.path.join(REPO, "plugins", "module_utils")
    found = []
    for sub in ("families", "flows"):
        for name in sorted(os.listdir(os.path.join(base, sub))):
            if name.endswith(".py"):
                with open(os.path.join(base, sub, name), encoding="utf-8") as fh:
                    found += ["%s/%s:%d" % (sub, name, i) for i, line in enumerate(fh, 1)
                              if "os.makedirs(" in line or "os.mkdir(" in line]
    assert [f for f in found if not f.startswith("flows/guard.py:")] == []
