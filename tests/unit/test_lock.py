"""core/lock.py: one lock per node. Real processes contend for it; its directories come and go with it."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import lock, lock_holder
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import writers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(REPO, ".collections")
# A second writer in its own process: by MODE, takes the lock as FLOW, says "held" and releases when told
# (a line on stdin: "wait"), or adds 1 to a counter file N times, each time under the lock ("count").
WRITER = r"""
import os, sys, time
from ansible_collections.gpunode.tuning.plugins.module_utils.core import lock
path, flow, mode, arg = sys.argv[1:5]
if mode == "count":
    counter = os.path.join(os.path.dirname(os.path.dirname(path)), "counter")
    for _round in range(int(arg)):
        with lock.NodeLock(path, flow, timeout=30, poll=0.001):
            with open(counter) as fh:
                value = int(fh.read())
            time.sleep(0.0005)
            with open(counter, "w") as fh:
                fh.write(str(value + 1))
    sys.exit(0)
held = lock.NodeLock(path, flow, timeout=30).acquire()
print("held", os.getpid(), flush=True)
sys.stdin.readline()
held.release()
print("released", flush=True)
"""


def writer(path, flow="persistent", mode="wait", arg="0"):
    """The writer process (its stdin, stdout and stderr are pipes)."""
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    return subprocess.Popen([sys.executable, "-c", WRITER, path, flow, mode, arg], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def said(proc, within=20.0):
    """The writer's next line (bounded: a writer that says nothing fails the test, it does not hang it)."""
    ready, _writable, _errors = select.select([proc.stdout], [], [], within)
    assert ready, "the writer said nothing within %s s: %s" % (within, proc.stderr.read() if proc.poll() else "")
    return proc.stdout.readline().split()


@pytest.fixture
def node(tmp_path):
    """A node root (an empty directory) and its lock path."""
    return str(tmp_path), writers.lock_file(Node(str(tmp_path)))


@pytest.fixture
def holder(node):
    """A writer process holding the node's lock; told to let go (or killed) at the end."""
    procs = []

    def start(flow="persistent", mode="wait", arg="0"):
        proc = writer(node[1], flow, mode, arg)
        procs.append(proc)
        word, pid = said(proc)
        assert word == "held" and int(pid) == proc.pid
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()


# -- Two writers at once


def test_a_second_writer_waits_then_fails_naming_the_holder(node, holder):
    proc = holder("persistent")
    t0 = time.monotonic()
    with pytest.raises(lock.LockTimeout) as caught:
        lock.NodeLock(node[1], "runtime", timeout=0.6, poll=0.05).acquire()
    elapsed = time.monotonic() - t0
    exc = caught.value
    assert 0.6 <= exc.waited and 0.6 <= elapsed < 30
    assert exc.holder["flow"] == "persistent" and exc.holder["pid"] == proc.pid and exc.holder["alive"] is True
    message = str(exc)
    assert message.startswith("the node lock %s is held by the persistent run (pid %d on " % (node[1], proc.pid))
    assert ", since %s" % exc.holder["started"] in message and exc.holder["started"].endswith("Z")
    assert re.search(r"; this runtime run waited \d+\.\d s for it and stops before writing anything: run it again "
                     r"when that run has finished$", message)
    assert read_record(node[1])["pid"] == proc.pid  # the waiter wrote nothing


def test_a_wait_of_zero_tries_once(node, holder):
    holder("guard")
    t0 = time.monotonic()
    with pytest.raises(lock.LockTimeout, match="held by the guard run"):
        lock.NodeLock(node[1], "rollback", timeout=0).acquire()
    assert time.monotonic() - t0 < 1


def let_go(proc, after):
    """Tell a waiting writer to release the lock ``after`` seconds from now."""
    def tell():
        proc.stdin.write("\n")
        proc.stdin.flush()
    timer = threading.Timer(after, tell)
    timer.start()
    return timer


def test_release_lets_the_waiter_in(node, holder):
    proc = holder("rollback")
    seen = []
    let_go(proc, 0.5)
    with lock.NodeLock(node[1], "runtime", timeout=20, poll=0.05, on_wait=seen.append) as taken:
        assert 0.3 < taken.waited < 20
        assert [h["flow"] for h in seen] == ["rollback"] and seen[0]["pid"] == proc.pid  # told once, while waiting
        assert read_record(node[1])["flow"] == "runtime" and read_record(node[1])["pid"] == os.getpid()
    assert said(proc) == ["released"]
    assert os.listdir(node[0]) == []  # the last writer out left nothing behind


def test_a_dead_holder_does_not_block(node, holder):
    proc = holder("boot")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    stale = lock_holder.read_holder(node[1])
    assert stale["flow"] == "boot" and stale["pid"] == proc.pid and stale["alive"] is False  # its record stays
    assert "that process no longer runs" in lock_holder.holder_text(stale)
    with lock.NodeLock(node[1], "persistent", timeout=0) as taken:
        assert taken.waited < 1 and read_record(node[1])["flow"] == "persistent"
    assert not os.path.exists(node[1])


def test_two_writers_at_once_never_interleave(node):
    """Each writer reads, waits and writes a counter under the lock: no update is lost."""
    os.makedirs(os.path.dirname(node[1]))
    counter = os.path.join(os.path.dirname(os.path.dirname(node[1])), "counter")
    with open(counter, "w") as fh:
        fh.write("0")
    procs = [writer(node[1], flow, "count", "60") for flow in ("runtime", "guard")]
    for proc in procs:
        assert proc.wait(60) == 0, proc.stderr.read()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
    with open(counter) as fh:
        assert fh.read() == "120"


# -- The record, the directories, check mode


def read_record(path):
    with open(path) as fh:
        return json.load(fh)


def test_the_holder_records_itself_and_creates_what_is_missing(node):
    root, path = node
    with lock.NodeLock(path, "persistent") as taken:
        record = read_record(path)
        assert set(record) == {"flow", "pid", "host", "started", "since"}
        assert (record["flow"], record["pid"]) == ("persistent", os.getpid()) and taken.record == record
        assert taken.created == [os.path.join(root, d) for d in ("var", "var/lib", "var/lib/gpunode-tuning")]
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert lock_holder.read_holder(path)["alive"] is True
    assert os.listdir(root) == []  # lock file and the three directories it made are gone


def test_directories_that_existed_stay(node):
    root, path = node
    os.makedirs(os.path.join(root, "var", "lib"))
    with lock.NodeLock(path, "runtime") as taken:
        assert taken.created == [os.path.join(root, "var", "lib", "gpunode-tuning")]
    assert os.listdir(os.path.join(root, "var", "lib")) == []


def test_a_directory_holding_the_journal_stays_until_rollback_hands_it_back(node):
    root, path = node
    journal = os.path.join(os.path.dirname(path), "journal.json")
    with lock.NodeLock(path, "persistent") as taken:
        created = list(taken.created)  # what the flow records in the journal
        with open(journal, "w") as fh:
            fh.write("{}")
    assert sorted(os.listdir(os.path.dirname(path))) == ["journal.json"]  # only the lock file went
    with lock.NodeLock(path, "rollback") as taken:
        assert taken.created == []
        os.unlink(journal)  # the journal, emptied by rollback, removes itself
        taken.remove_on_release(created)
    assert os.listdir(root) == []


def test_only_directories_above_the_lock_are_handed_over(node):
    with lock.NodeLock(node[1], "rollback") as taken, pytest.raises(lock.LockError, match="not a directory above"):
        taken.remove_on_release([os.path.join(node[0], "etc")])


def test_check_mode_takes_and_creates_nothing(node):
    with writers.writing(Node(node[0]), None, "persistent", check_mode=True) as taken:
        assert taken.lock is None
    assert os.listdir(node[0]) == []
    with writers.writing(Node(node[0]), None, "persistent") as taken:
        assert taken.lock.held and os.path.exists(node[1])
    assert os.listdir(node[0]) == []


def test_the_same_process_takes_it_again_nested(node):
    with lock.NodeLock(node[1], "guard") as outer:
        with lock.NodeLock(node[1], "boot", timeout=0) as inner:
            assert inner.nested and inner.record == outer.record
            inner.remove_on_release([os.path.dirname(node[1])])
        assert outer.held and read_record(node[1])["flow"] == "guard"  # the inner release let nothing go
    assert os.listdir(node[0]) == []


def test_read_holder_never_creates_and_ignores_garbage(node):
    root, path = node
    assert lock_holder.read_holder(path) is None and os.listdir(root) == []
    os.makedirs(os.path.dirname(path))
    for garbage in (b"", b"{not json", b"[1]", b'{"pid": "x"}', b"\xff\xfe"):
        with open(path, "wb") as fh:
            fh.write(garbage)
        assert lock_holder.read_holder(path) is None
    assert lock_holder.holder_text(None) == "a run that has not written its record yet"


def test_a_file_replaced_under_a_waiter_is_not_taken(node):
    """A waiter that locks the file a releasing holder has just unlinked notices and does not keep it."""
    path = node[1]
    os.makedirs(os.path.dirname(path))
    open(path, "w").close()
    fd = os.open(path, os.O_RDWR)
    try:
        os.unlink(path)
        open(path, "w").close()
        assert lock.NodeLock(path, "runtime")._try(fd) == "stale"
    finally:
        os.close(fd)


@pytest.mark.parametrize("path, why", [
    ("var/lib/gpunode-tuning/journal.json", "must be absolute"),
    ("/var/lib/\ngpunode-tuning/journal.json", "control character"),
    ("/../../etc/journal.json", "outside the node root"),
    ("/", "the node root"),
])
def test_the_lock_stays_below_the_root(tmp_path, path, why):
    """The lock is the file next to the journal, whose path must stay below the node root (journal.resolve_path)."""
    with pytest.raises(lock.LockError, match=why):
        writers.lock_file(Node(str(tmp_path)), path)


def test_a_symlink_out_of_the_root_is_refused(tmp_path):
    os.makedirs(tmp_path / "node" / "var")
    os.symlink(str(tmp_path / "elsewhere"), str(tmp_path / "node" / "var" / "lib"))
    with pytest.raises(lock.LockError, match="outside the node root"):
        writers.lock_file(Node(str(tmp_path / "node")))
    lock_file = writers.lock_file(Node(str(tmp_path / "node")), "/run/journal.json")
    assert lock_file == str(tmp_path / "node" / "run" / ".lock")
    assert lock.next_to("/n/var/lib/gpunode-tuning/journal.json") == "/n/var/lib/gpunode-tuning/.lock"


@pytest.mark.parametrize("kwargs, why", [
    ({"flow": ""}, "flow name"), ({"flow": "a\nb"}, "flow name"), ({"flow": "x" * 65}, "flow name"),
    ({"flow": "runtime", "timeout": -1}, "timeout"), ({"flow": "runtime", "timeout": True}, "timeout"),
    ({"flow": "runtime", "poll": 0}, "poll"),
])
def test_bad_arguments_are_refused_before_anything_is_made(node, kwargs, why):
    with pytest.raises(lock.LockError, match=why):
        lock.NodeLock(node[1], **kwargs)
    assert os.listdir(node[0]) == []


def test_a_directory_that_cannot_be_made_names_the_path_and_errno(node):
    root, path = node
    with open(os.path.join(root, "var"), "w") as fh:
        fh.write("a file where a directory should be")
    with pytest.raises(lock.LockError, match=r"cannot create the lock's directory .*/var/lib: .*\(errno ENOTDIR\)"):
        lock.NodeLock(path, "persistent").acquire()
