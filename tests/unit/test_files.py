"""core/files.py: the one atomic writer (journal, drop-ins, guard status and metrics, reports, the runner's cache)."""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import file_updates, files


def entries(directory):
    return sorted(os.listdir(directory))


def test_replace_file_writes_the_bytes_with_the_mode_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "journal.json"
    path.write_bytes(b"old\n")
    files.replace_file(str(path), b"new\n", 0o600)
    assert path.read_bytes() == b"new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert entries(tmp_path) == ["journal.json"]


def test_replace_file_moves_through_the_callers_move_from_the_same_directory(tmp_path):
    moves = []

    def move(src, dest):
        moves.append((os.path.dirname(src), os.path.basename(src), dest, stat.S_IMODE(os.stat(src).st_mode)))
        os.replace(src, dest)

    files.replace_file(str(tmp_path / "60-gpunode-tuning.cfg"), b"x\n", 0o644, move=move)
    [(directory, name, dest, mode)] = moves
    assert directory == str(tmp_path) and dest == str(tmp_path / "60-gpunode-tuning.cfg")
    assert name.startswith(".60-gpunode-tuning.cfg.") and name.endswith(".tmp")  # guard_files.temp_patterns
    assert mode == 0o644  # the mode is set before the file appears under its name


def test_a_failed_move_keeps_the_old_file_and_removes_the_temporary_one(tmp_path):
    path = tmp_path / "guard-status.json"
    path.write_bytes(b"old\n")

    def refuse(_src, _dest):
        raise PermissionError(13, "Permission denied")

    with pytest.raises(PermissionError):
        files.replace_file(str(path), b"new\n", move=refuse)
    assert path.read_bytes() == b"old\n"
    assert entries(tmp_path) == ["guard-status.json"]


def test_fsync_flushes_the_file_and_then_its_directory_only_when_asked(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)) or real(fd))
    files.replace_file(str(tmp_path / "cache"), b"x")
    assert synced == []
    files.replace_file(str(tmp_path / "journal.json"), b"x", fsync=True)
    assert synced == [False, True]


def test_write_file_does_nothing_in_check_mode_and_nothing_when_unchanged(tmp_path):
    path = str(tmp_path / "host.md")
    assert file_updates.write_file(path, b"a\n", check_mode=True) == "created"
    assert entries(tmp_path) == []
    assert file_updates.write_file(path, b"a\n") == "created"
    before = os.stat(path)
    assert file_updates.write_file(path, b"a\n") is None
    assert os.stat(path).st_ino == before.st_ino  # not rewritten
    assert file_updates.write_file(path, b"b\n", check_mode=True) == "updated"
    assert (tmp_path / "host.md").read_bytes() == b"a\n"
    assert file_updates.write_file(path, b"b\n", fsync=True) == "updated"
    assert (tmp_path / "host.md").read_bytes() == b"b\n" and entries(tmp_path) == ["host.md"]


def test_write_file_names_the_path_when_the_directory_refuses(tmp_path):
    missing = str(tmp_path / "no-such-dir" / "host.md")
    with pytest.raises(file_updates.ReportError, match="cannot write file %s: No such file or directory" % missing):
        file_updates.write_file(missing, b"a\n", what="file")
