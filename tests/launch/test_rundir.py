"""Run folders: private to the user, new for every run, never another user's."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from tests.launch.helpers import JOB, launch
from unidist.errors import ConfigurationError
from unidist.launch.plan import rundir
from unidist.launch.plan.job import LaunchPlan
from unidist.launch.supervise.runner import Run


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


# -- log files in folders other users can write to ------------------------------------------------


def test_a_planted_link_at_a_log_path_is_never_followed(tmp_path: Path) -> None:
    # In a shared sticky folder (/tmp, a team's /scratch) another user plants out0.log -> a file
    # of the victim's (the user who launches): the launcher emptied and overwrote it.
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "out0.log"
    link.symlink_to(victim)
    with pytest.raises(ConfigurationError, match="is a symbolic link") as caught:
        rundir.private_file(link)
    assert str(link) in str(caught.value)
    assert victim.read_text() == "precious"
    assert link.is_symlink()


def test_a_hard_link_a_fifo_or_a_folder_is_never_a_log_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.link(victim, tmp_path / "linked.log")
    with pytest.raises(ConfigurationError, match="has 2 hard links"):
        rundir.private_file(tmp_path / "linked.log")
    assert victim.read_text() == "precious"
    os.mkfifo(tmp_path / "fifo.log")
    with pytest.raises(ConfigurationError, match="is not a regular file"):
        rundir.private_file(tmp_path / "fifo.log")  # at once: no writer waiting for a reader
    (tmp_path / "folder.log").mkdir()
    with pytest.raises(ConfigurationError, match="cannot write the log file"):
        rundir.private_file(tmp_path / "folder.log")


def test_a_launch_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    shared = tmp_path / "scratch"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp: anyone may create files, only owners remove them
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (shared / "out0.log").symlink_to(victim)
    logs = tmp_path / "logs"
    stdout = str(shared / "out{rank}.log")
    done = launch("-n", "2", "--log-dir", str(logs), "--stdout", stdout, JOB, "ok")
    assert done.returncode == 2, done.stderr
    assert f"the log file '{shared / 'out0.log'}' is a symbolic link" in done.stderr
    assert victim.read_text() == "precious"
    assert not logs.exists()  # refused before anything was created
    assert sorted(p.name for p in shared.iterdir()) == ["out0.log"]


def _run_with_template(tmp_path: Path, folder: Path) -> Run:
    plan = LaunchPlan(
        target="job.py", nproc=2, stdout=str(folder / "out{rank}.log"), log_root=tmp_path
    )
    run = Run(plan, rundir.create_run_folder(tmp_path), hand_over=True)
    envs = {local: {"RANK": str(local), "WORLD_SIZE": "2", "GROUP_RANK": "0"} for local in (0, 1)}
    run.begin(envs)
    return run


def test_torchs_agent_gets_the_files_unidist_created(tmp_path: Path) -> None:
    # torch's agent opens a script rank's log files itself, by name: in a folder where another
    # user may rename files, a link could replace unidist's file before that open. It gets
    # unidist's open file (/proc/self/fd/N) instead, whatever is at the path by then.
    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    run = _run_with_template(tmp_path, shared)
    try:
        slot = run.current.slots[0]  # type: ignore[union-attr]
        given, _ = run.log_dest(slot)
        assert given.startswith("/proc/self/fd/")
        victim = tmp_path / "victim.txt"
        victim.write_text("precious")
        slot.stdout.rename(tmp_path / "moved.log")  # what another user could do here
        slot.stdout.symlink_to(victim)
        with open(given, "w") as out:  # as torch's SubprocessHandler opens it
            out.write("rank output")
        assert victim.read_text() == "precious"
        assert (tmp_path / "moved.log").read_text() == "rank output"
    finally:
        run.release()
    private = tmp_path / "mine"
    private.mkdir(mode=0o700)
    run = _run_with_template(tmp_path, private)
    slot = run.current.slots[1]  # type: ignore[union-attr]
    # A log in the run folder: its name through the run folder's handle, whatever its path.
    assert run.log_dest(slot) == (str(private / "out1.log"), str(slot.read_stderr))
    assert str(slot.read_stderr).startswith(f"/proc/{os.getpid()}/fd/")
    assert os.path.samefile(slot.read_stderr, slot.stderr)


@pytest.mark.multiprocess
def test_a_launch_into_a_folder_others_may_write_to(tmp_path: Path) -> None:
    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    done = launch(
        "-n",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
        "--stdout",
        str(shared / "out{rank}.log"),
        "--stderr",
        str(shared / "err{rank}.log"),
        JOB,
        "ok",
    )
    assert done.returncode == 0, done.stderr
    assert "[rank1]: rank 1 total 3.0" in done.stdout
    assert "rank 1 total 3.0" in (shared / "out1.log").read_text()
    assert "hello on stderr" in (shared / "err0.log").read_text()
    assert mode(shared / "out0.log") == 0o600


def test_another_users_link_in_a_shared_folder_is_not_followed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from unidist.cli import main

    shared = tmp_path / "scratch"
    shared.mkdir()
    shared.chmod(0o1777)
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "0.log").write_text("precious")
    link = shared / "logs"
    link.symlink_to(mine)
    try:
        os.lchown(link, 4242, 4242)  # planted by user 4242
    except PermissionError:
        pytest.skip("making a link of another user's needs root")
    code = main(["launch", "--dry-run", "--stdout", str(link / "{rank}.log"), JOB])
    err = capsys.readouterr().err
    assert code == 2
    assert f"'{link}' is a symbolic link of another user's (uid 4242) in a shared folder" in err
    assert (mine / "0.log").read_text() == "precious"


def test_a_run_folder_replaced_before_it_is_opened_is_refused_and_left_alone(
    tmp_path: Path,
) -> None:
    plan = LaunchPlan(target="job.py", nproc=1, log_root=tmp_path)
    folder = rundir.create_run_folder(tmp_path)
    folder.rename(tmp_path / "moved")
    folder.mkdir(mode=0o755)  # someone's folder under the run folder's name
    (folder / "theirs.txt").write_text("theirs")
    with pytest.raises(ConfigurationError, match="is not the one unidist made"):
        Run(plan, folder)
    assert (folder / "theirs.txt").read_text() == "theirs"


def test_removing_a_run_folder_removes_what_its_handle_holds_never_what_its_name_now_is(
    tmp_path: Path,
) -> None:
    plan = LaunchPlan(target="job.py", nproc=1, log_root=tmp_path)
    folder = rundir.create_run_folder(tmp_path)
    run = Run(plan, folder)
    (run.io_folder / "sub").mkdir()
    (run.io_folder / "sub" / "rank0.log").write_text("log")
    folder.rename(tmp_path / "moved")  # what another user could do in a shared --log-dir
    folder.mkdir()
    (folder / "theirs.txt").write_text("theirs")
    rundir.remove_through(run.handle.fd, folder)
    assert (folder / "theirs.txt").read_text() == "theirs"
    assert list((tmp_path / "moved").iterdir()) == []  # emptied through the handle


def test_a_launcher_its_ranks_cannot_reach_through_proc_uses_the_folders_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that is not dumpable (setuid, file capabilities) has a /proc/<pid>/fd that
    # only root may read: its ranks could not write there.
    from unidist.launch.supervise import runner

    plan = LaunchPlan(target="job.py", nproc=1, log_root=tmp_path)
    reachable = Run(plan, rundir.create_run_folder(tmp_path))
    assert str(reachable.io_folder).startswith(f"/proc/{os.getpid()}/fd/")
    monkeypatch.setattr(runner, "_dumpable", lambda: False)
    folder = rundir.create_run_folder(tmp_path)
    assert Run(plan, folder).io_folder == folder
