"""Run folders: private to the user, new for every run, never another user's."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from tests.launch.helpers import JOB, launch
from unidist.launch import rundir


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_default_parent_is_per_user_and_private(temp_dir: Path) -> None:
    first, second = rundir.create_run_folder(None), rundir.create_run_folder(None)
    assert first.parent == second.parent == temp_dir / f"unidist-{os.getuid()}"
    assert first != second  # a new folder for every run
    assert {mode(first.parent), mode(first), mode(second)} == {0o700}


def test_an_own_parent_that_is_too_open_is_closed(temp_dir: Path) -> None:
    parent = temp_dir / f"unidist-{os.getuid()}"
    parent.mkdir(mode=0o755)
    parent.chmod(0o755)
    assert rundir.create_run_folder(None).parent == parent
    assert mode(parent) == 0o700


def test_another_users_parent_is_never_used(
    temp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Someone else created our folder name first (in /tmp anyone can): it belongs to them.
    squatted = temp_dir / "unidist-4242"
    squatted.mkdir(mode=0o777)
    monkeypatch.setattr(os, "getuid", lambda: 4242)  # we are 4242; the folder is not ours
    folder = rundir.create_run_folder(None)
    assert squatted not in folder.parents
    assert mode(folder.parent) == mode(folder) == 0o700
    assert list(squatted.iterdir()) == []


def test_a_planted_symlink_is_not_followed(temp_dir: Path) -> None:
    target = temp_dir / "collects-everyones-logs"
    target.mkdir()
    (temp_dir / f"unidist-{os.getuid()}").symlink_to(target)
    folder = rundir.create_run_folder(None)
    assert target not in folder.resolve().parents
    assert list(target.iterdir()) == []


def test_log_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "rank0.stdout.log"
    path.parent.mkdir()
    path.write_text("old")
    path.chmod(0o644)
    rundir.private_file(path)
    assert (path.read_text(), mode(path)) == ("", 0o600)
    rundir.private_file(tmp_path / "new" / "deeper" / "rank1.log")
    assert mode(tmp_path / "new" / "deeper") == 0o700


@pytest.mark.multiprocess
def test_a_launch_beside_another_users_folder_works(tmp_path: Path) -> None:
    # The first user's /tmp/unidist made a second user's launch fail with PermissionError, and
    # anyone could pre-create it (here: a link) to receive everyone's logs.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("unidist", f"unidist-{os.getuid()}"):
        (tmp_path / name).symlink_to(elsewhere)
    done = launch("-n", "2", "--no-console", JOB, "ok", env={"TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert list(elsewhere.iterdir()) == []
