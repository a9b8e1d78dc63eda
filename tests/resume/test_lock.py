"""One run per checkpoint folder: a second run (same job or another) is refused before it writes
anything, a dead run's lock never blocks a restart, and a restart of the same elastic run waits
for its previous incarnation to let go."""

from __future__ import annotations

import errno
import fcntl
import gc
import inspect
import json
import logging
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from torch import nn

import unidist
from tests._users import NOBODY, as_user, reachable_folder
from unidist.errors import CheckpointError
from unidist.resume import _lock as lock_module
from unidist.resume._handle import Dir
from unidist.resume._lock import LOCK, NEW, RunLock
from unidist.testing import DistributedTestError, run_distributed

ROOT = Path(__file__).resolve().parents[2]

#: A run that holds the folder: it restores, says so, and waits for its stdin to close.
HOLDER = """
import sys
import torch, unidist
state = unidist.ResumableState(sys.argv[1], job=sys.argv[2], model=torch.nn.Linear(2, 1))
state.restore()
state.save()
print("holding", flush=True)
sys.stdin.read()
state.close()
"""


def _hold(folder: Path, job: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), job],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "holding"
    return holder


def _state(folder: Path, job: str, **kw: Any) -> unidist.ResumableState:
    return unidist.ResumableState(folder, job=job, model=nn.Linear(2, 1), stop_signals=(), **kw)


def _listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize("job", ["run-a", "run-b"])
def test_a_second_run_is_refused_by_name_before_it_writes_anything(
    tmp_path: Path, job: str
) -> None:
    holder = _hold(tmp_path, "run-a")
    try:
        before = _listing(tmp_path)
        state = _state(tmp_path, job)
        with pytest.raises(CheckpointError) as refused:
            state.restore()
        assert _listing(tmp_path) == before  # nothing written, nothing removed
    finally:
        holder.communicate("", timeout=60)
    message = str(refused.value)
    assert f"in use by job 'run-a' (pid {holder.pid} on host {socket.gethostname()!r})" in message
    assert f"this is job {job!r}" in message
    assert "give this run a folder of its own" in message
    assert _state(tmp_path, "run-a").restore()  # the holder ended: the folder is free again


def test_a_dead_runs_lock_never_blocks_a_restart(tmp_path: Path) -> None:
    holder = _hold(tmp_path, "run-a")
    holder.send_signal(signal.SIGKILL)  # no close(), no cleanup: the kernel drops the lock
    holder.communicate(timeout=60)
    state = _state(tmp_path, "run-a")
    assert state.restore()
    state.close()


def test_a_restart_of_the_same_elastic_run_waits_for_its_earlier_start(tmp_path: Path) -> None:
    # torch's agent restarts a run under the same TORCHELASTIC_RUN_ID; rank 0 may move to a node
    # whose earlier rank 0 is still letting go. Waited for, not refused.
    holder = _hold(tmp_path, "run-a", env={"TORCHELASTIC_RUN_ID": "rdzv-7"})
    done: list[object] = []

    def restore() -> None:
        os.environ["TORCHELASTIC_RUN_ID"] = "rdzv-7"
        try:
            state = _state(tmp_path, "run-a", timeout=120)
            done.append(state.restore())
            state.close()
        except Exception as exc:  # shown by the assertion below
            done.append(exc)
        finally:
            del os.environ["TORCHELASTIC_RUN_ID"]

    waiting = threading.Thread(target=restore)
    waiting.start()
    holder.communicate("", timeout=60)  # the earlier start lets go
    waiting.join(timeout=120)
    assert done == [True]


def test_a_restart_of_another_run_id_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = _hold(tmp_path, "run-a", env={"TORCHELASTIC_RUN_ID": "rdzv-7"})
    try:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "rdzv-8")
        with pytest.raises(CheckpointError, match="in use by job 'run-a'"):
            _state(tmp_path, "run-a", timeout=300).restore()
    finally:
        holder.communicate("", timeout=60)


def test_states_of_one_process_share_the_lock(tmp_path: Path) -> None:
    first = _state(tmp_path, "run-a")
    first.restore()
    first.save()
    second = _state(tmp_path, "run-a")  # a state rebuilt in the same process: not a second run
    assert second.restore()
    second.close()
    first.close()


def _restore_on_two(folder: str) -> bool:
    return _state(Path(folder), "run-a").restore()  # the same job, a second time


@pytest.mark.multiprocess
def test_every_rank_of_a_second_run_is_refused(tmp_path: Path) -> None:
    holder = _hold(tmp_path, "run-a")
    try:
        with pytest.raises(DistributedTestError) as failed:
            run_distributed(_restore_on_two, str(tmp_path), timeout=120)
    finally:
        holder.communicate("", timeout=60)
    assert "in use by job 'run-a'" in failed.value.failures[0]
    assert "rank 0 could not use the checkpoint folder" in failed.value.failures[1]


# -- the lock itself, taken as ResumableState's rank 0 takes it ---------------------------------

#: A run that takes the folder's lock (RunLock.acquire on a Dir, as ResumableState's rank 0
#: does) and says so in one JSON line, or says why not; then holds it until its stdin closes.
#: ``fork``: a child forked by libc itself (as native code forks: Python's at-fork handlers do
#: not run, so it keeps every descriptor) that keeps running and says its pid;
#: ``child-acquires``: a child of ``os.fork`` tries the lock of the same folder, says what it got.
RUN = r"""
import ctypes, json, os, sys
from pathlib import Path
from unidist.resume._handle import Dir
from unidist.resume._lock import RunLock
from unidist.errors import CheckpointError
folder, job, run_id, then = sys.argv[1], sys.argv[2], sys.argv[3] or None, sys.argv[4]

def say(**what):  # one write per line: a forked child writes to the same pipe
    os.write(1, (json.dumps(what) + "\n").encode())

def take():
    try:
        return RunLock.acquire(Dir.open_root(Path(folder), create=True), job=job,
                               run_id=run_id, timeout=0)
    except CheckpointError as exc:
        say(refused=str(exc))
        os._exit(3)

lock = take()
if then in ("fork", "child-acquires"):
    child = ctypes.CDLL(None).fork() if then == "fork" else os.fork()
    if child == 0:
        if then == "child-acquires":
            take()
            say(**{"child holds": os.getpid()})
            os._exit(0)
        say(child=os.getpid())
        sys.stdin.read()
        os._exit(0)
    if then == "child-acquires":
        os.waitpid(child, 0)
say(holding=os.getpid())
sys.stdin.read()
lock.release()
"""

#: A process that opens FOLDER/.lock for reading and takes the locks named in argv[2]
#: (``flock``: a shared flock; ``read``: a POSIX read lock; ``ofd``: an open file description's
#: read lock), says so, and keeps them until its stdin closes.
SQUAT = r"""
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
kinds = sys.argv[2].split(",")
if "flock" in kinds:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
if "read" in kinds:
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
if "ofd" in kinds:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0) + bytes(8))
print("squatting", os.getpid(), flush=True)
sys.stdin.read()
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def _run(folder: Path, job: str, run_id: str = "", then: str = "hold") -> Run:
    """A run of its own process; returns once it has said whether it holds the lock."""
    process = subprocess.Popen(
        [sys.executable, "-c", RUN, str(folder), job, run_id, then],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    return Run(process)


class Run:
    """A process of RUN and what it said (one JSON object per line)."""

    def __init__(self, process: subprocess.Popen[str], *until: str) -> None:
        self.process = process
        self.said: dict[str, Any] = {}
        self.read_until(*(until or ("holding", "refused")))

    def read_until(self, *keys: str) -> None:
        assert self.process.stdout is not None
        while not any(key in self.said for key in keys):
            line = self.process.stdout.readline()
            assert line, (
                f"the run ended (exit code {self.process.wait(30)}) having said {self.said}"
            )
            self.said.update(json.loads(line))

    def end(self) -> None:
        self.process.communicate("", timeout=60)


def _squat(path: Path, kinds: str, *, user: int | None = NOBODY) -> subprocess.Popen[str]:
    squatter = subprocess.Popen(
        [*([] if user is None else as_user(user)), sys.executable, "-c", SQUAT, str(path), kinds],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert squatter.stdout is not None
    assert squatter.stdout.readline().split()[0] == "squatting"
    return squatter


def _take(
    folder: Path, job: str = "run-b", run_id: str | None = None, timeout: float = 0
) -> RunLock:
    root = Dir.open_root(folder, create=True)
    try:
        return RunLock.acquire(root, job=job, run_id=run_id, timeout=timeout)
    finally:
        root.close()


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder that uid 65534 can reach (pytest's own are private to root)."""
    with reachable_folder("unidist-lock-") as path:
        yield path


# 16: a dead run's forked helper --------------------------------------------------------------


def test_a_killed_runs_forked_child_never_keeps_the_folder_locked(tmp_path: Path) -> None:
    # A run SIGKILLed after it forked a helper (a Pool, a DataLoader worker) that lives on: the
    # helper still has the lock file open. The lock was the dead run's, and goes with it.
    run = _run(tmp_path, "run-a", then="fork")
    try:
        run.read_until("child")
        child = run.said["child"]
        lock_file = str(tmp_path / LOCK)
        assert lock_file in [
            os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")
        ]
        run.process.kill()
        run.process.wait(timeout=60)
        assert Path(f"/proc/{child}").exists()  # the child lives on (it waits for its stdin)
        lock = _take(tmp_path, "run-a")
        lock.release()
    finally:
        run.process.communicate("", timeout=60)  # EOF once the child, told to end, is gone


def test_a_forked_child_is_a_process_of_its_own_and_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path, "run-a", then="child-acquires")
    try:
        run.read_until("holding")
        assert "child holds" not in run.said
        assert f"in use by job 'run-a' (pid {run.process.pid} " in run.said["refused"]
    finally:
        run.end()


# 17: another local user ----------------------------------------------------------------------


@pytest.mark.otheruser
@pytest.mark.parametrize("kinds", ["flock", "read", "flock,read", "ofd"])
def test_another_users_lock_on_a_shared_folder_never_blocks_the_owners_runs(
    base: Path, kinds: str
) -> None:
    # The owner shares the folder read-only with the team (chmod -R go+rX); another user opens
    # .lock while it is readable and locks it (a shared flock, a POSIX or an open file
    # description's read lock: read access is all they need). The owner's runs go on, and a
    # second run of the owner is still refused while the first holds the folder.
    folder = base / "ckpt"
    _take(folder).release()
    subprocess.run(["chmod", "-R", "go+rX", str(folder)], check=True)
    before = (folder / LOCK).stat().st_ino
    squatter = _squat(folder / LOCK, kinds)
    try:
        first = _run(folder, "run-a")
        try:
            assert "holding" in first.said, first.said
            with pytest.raises(
                CheckpointError, match=rf"in use by job 'run-a' \(pid {first.process.pid} "
            ):
                _take(folder, "run-a")
        finally:
            first.end()
        _take(folder).release()
    finally:
        squatter.communicate("", timeout=60)
    info = (folder / LOCK).stat()
    assert stat.S_IMODE(info.st_mode) == 0o600  # private again, whatever the chmod -R did
    # A flock never meets the owner's lock; a read lock is left behind with the old file.
    assert (info.st_ino == before) == (kinds == "flock")
    assert sorted(os.listdir(folder)) == [LOCK]


def test_a_read_lock_of_this_users_own_process_is_refused_by_its_pid(tmp_path: Path) -> None:
    # No unidist run ever takes a read lock, but a process of the owner's own is not a stranger:
    # the folder is not taken from it.
    _take(tmp_path).release()
    before = (tmp_path / LOCK).stat().st_ino
    reader = _squat(tmp_path / LOCK, "read", user=None)
    try:
        with pytest.raises(CheckpointError) as refused:
            _take(tmp_path)
    finally:
        reader.communicate("", timeout=60)
    message = str(refused.value)
    assert f"pid {reader.pid}" in message
    assert "read lock" in message
    assert (tmp_path / LOCK).stat().st_ino == before


def _hidepid(real_stat: Callable[..., os.stat_result]) -> Callable[..., os.stat_result]:
    """``os.stat`` as /proc mounted with ``hidepid=2`` makes it: another user's process is not
    there at all (ENOENT, as for a process that ended)."""

    def hidden(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        info = real_stat(path, *args, **kw)
        name = str(path)
        if name.startswith("/proc/") and name[6:].isdigit() and info.st_uid != os.geteuid():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
        return info

    return hidden


#: RUN where /proc hides other users' processes (``hidepid=2``).
HIDEPID = (
    "from __future__ import annotations\nimport errno, os\nfrom typing import Any, Callable\n"
    + textwrap.dedent(inspect.getsource(_hidepid))
    + "os.stat = _hidepid(os.stat)\n"
    + RUN
)


def _as_nobody(folder: Path, script: str = RUN) -> Run:
    """``script`` (RUN, or RUN with something before it) run by uid 65534 on ``folder``."""
    process = subprocess.Popen(
        [*as_user(NOBODY), sys.executable, "-c", script, str(folder), "run-a", "", "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    return Run(process)


@pytest.mark.otheruser
def test_a_read_lock_of_another_user_that_proc_hides_is_replaced(base: Path) -> None:
    # /proc mounted with hidepid=2 shows the owner none of another user's processes: the
    # squatter's pid looks like that of a process that ended. That the owner may not signal it
    # (EPERM) says it lives and is another user's: its read lock is replaced, not waited for.
    folder = base / "ckpt"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)
    _as_nobody(folder).end()  # the owner, uid 65534, makes its .lock
    before = (folder / LOCK).stat().st_ino
    squatter = _squat(folder / LOCK, "read", user=None)  # root's read lock: another user's
    try:
        owner = _as_nobody(folder, HIDEPID)
        try:
            assert "holding" in owner.said, owner.said
        finally:
            owner.end()
    finally:
        squatter.communicate("", timeout=60)
    assert (folder / LOCK).stat().st_ino != before
    assert sorted(os.listdir(folder)) == [LOCK]


@pytest.mark.otheruser
def test_a_read_lock_that_proc_hides_from_root_is_refused_at_once_and_the_file_kept(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root may signal every process, so a signal tells root only that the hidden process
    # lives, not whose it is: nothing proves it is not root's own. Refused by its pid, at once
    # (it is not a replacement under way), with the way out; the file is left as it is.
    folder = base / "ckpt"
    _take(folder).release()
    subprocess.run(["chmod", "-R", "go+rX", str(folder)], check=True)
    before = (folder / LOCK).stat().st_ino
    squatter = _squat(folder / LOCK, "read")
    try:
        monkeypatch.setattr(os, "stat", _hidepid(os.stat))
        monkeypatch.setattr(lock_module, "time", _NoWait)
        with pytest.raises(CheckpointError) as refused:
            _take(folder)
    finally:
        monkeypatch.undo()
        squatter.communicate("", timeout=60)
    message = str(refused.value)
    assert f"pid {squatter.pid}, which /proc of this host does not say whose it is" in message
    assert "replacing" not in message
    assert f"when no run of yours uses the folder, rm {folder / LOCK} (the new" in message
    assert (folder / LOCK).stat().st_ino == before


#: RUN's arguments after the folder: job run-b, no run id, hold.
RUN_B = ("run-b", "", "hold")


@pytest.mark.netns
def test_a_read_lock_of_another_pid_namespace_is_refused_and_the_file_kept(
    tmp_path: Path,
) -> None:
    # The kernel reports the holder of a lock as pid 0 when it is a process of a pid namespace
    # the asking process cannot see (another container's, or the host's): whose it is, nothing
    # here can tell. Refused, never replaced.
    _take(tmp_path).release()
    before = (tmp_path / LOCK).stat().st_ino
    reader = _squat(tmp_path / LOCK, "read", user=None)
    try:
        inside = subprocess.Popen(
            ["unshare", "--pid", "--fork", sys.executable, "-c", RUN, str(tmp_path), *RUN_B],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        run = Run(inside)
        run.end()
    finally:
        reader.communicate("", timeout=60)
    message = run.said["refused"]
    assert "in use by a process of another pid namespace" in message
    assert f"rm {tmp_path / LOCK} (the new one is private" in message
    assert (tmp_path / LOCK).stat().st_ino == before


# 19: torchrun's placeholder run id -----------------------------------------------------------


class _NoWait:
    """Stands in for the lock module's ``time``: a wait would fail the test at once."""

    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def sleep(seconds: float) -> None:
        raise AssertionError(f"the lock waited ({seconds} s)")


@pytest.mark.parametrize(
    ("theirs", "ours"),
    [("none", "none"), ("", "none"), ("none", "rdzv-7"), ("unidist", "unidist")],
)
def test_a_run_with_a_launchers_placeholder_run_id_is_never_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, theirs: str, ours: str
) -> None:
    # Two torchrun launches without --rdzv-id both get the run id "none", two multi-node
    # launches of unidist launch "unidist": neither is a restart of the other. Refused at once,
    # naming the holder, with a HINT when this run's own id says nothing.
    holder = _run(tmp_path, "run-a", run_id=theirs)
    try:
        monkeypatch.setattr(lock_module, "time", _NoWait)
        with pytest.raises(CheckpointError) as refused:
            _take(tmp_path, "run-a", run_id=ours, timeout=300)
    finally:
        holder.end()
    message = str(refused.value)
    assert f"in use by job 'run-a' (pid {holder.process.pid} " in message
    assert "same run" not in message
    if ours != "rdzv-7":
        launcher = {"none": "torchrun", "unidist": "unidist launch"}[ours]
        assert f"This run's id is {launcher}'s placeholder {ours!r} (no --rdzv-id)" in message
        assert "HINT: pass the same real --rdzv-id" in message


def test_a_wait_for_an_earlier_start_is_logged_and_never_called_certain(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = _run(tmp_path, "run-a", run_id="rdzv-7")
    try:
        with (
            caplog.at_level(logging.WARNING, logger="unidist.resume"),
            pytest.raises(CheckpointError) as refused,
        ):
            _take(tmp_path, "run-a", run_id="rdzv-7", timeout=0.5)
    finally:
        holder.end()
    lines = [r.getMessage() for r in caplog.records if r.name == "unidist.resume"]
    assert len(lines) == 1, lines
    assert f"job 'run-a' (pid {holder.process.pid} " in lines[0]
    assert "up to 0.5 s" in lines[0]
    message = str(refused.value)
    assert "says it belongs to this same run" in message
    assert "it is an earlier start" not in message.lower()


def test_a_restart_that_waits_gets_the_folder_once_its_earlier_start_lets_go(
    tmp_path: Path,
) -> None:
    holder = _run(tmp_path, "run-a", run_id="rdzv-7")
    waiting = threading.Event()

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            waiting.set()

    said = Said()
    logging.getLogger("unidist.resume").addHandler(said)
    got: list[object] = []

    def take() -> None:
        try:
            got.append(_take(tmp_path, "run-a", run_id="rdzv-7", timeout=120))
        except Exception as exc:  # shown by the assertion below
            got.append(exc)

    taker = threading.Thread(target=take)
    try:
        taker.start()
        assert waiting.wait(timeout=120), "the restart never said it waits"
        holder.end()  # the earlier start lets go
        taker.join(timeout=120)
    finally:
        logging.getLogger("unidist.resume").removeHandler(said)
        holder.process.kill()
    [taken] = got
    assert isinstance(taken, RunLock), taken
    taken.release()


# 18: a lock file that cannot be made or written ----------------------------------------------


def _refused(command: list[str]) -> str:
    """The refusal RUN prints when ``command`` runs it: exit code 3, one line, no traceback."""
    done = subprocess.run(
        command, input="", capture_output=True, text=True, env=_env(), timeout=120
    )
    assert done.returncode == 3, f"exit code {done.returncode}: {done.stdout}{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    message: str = json.loads(done.stdout)["refused"]
    return message


def _refused_in_a_mount(tmp_path: Path, options: str, then: str) -> str:
    """What RUN says on a tmpfs of its own (``options``; ``then`` runs once ``ckpt`` is made),
    mounted in a mount namespace of its own: nothing is seen outside, and it all goes at exit."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (
        f"set -e; mount -t tmpfs -o mode=0755,{options} unidist-test {mnt}; "
        f"mkdir -m 700 {mnt}/ckpt; {then}; exec {sys.executable} -c \"$0\" {mnt}/ckpt run-a '' hold"
    )
    message = _refused(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, RUN])
    assert f"{mnt}/ckpt" in message
    assert "HINT:" in message
    return message


@pytest.mark.netns
@pytest.mark.parametrize(
    ("options", "then", "said"),
    [
        ("size=1m", "mount -o remount,ro {mnt}", "is on a read-only file system"),
        ("nr_inodes=2", "true", "has no free space or no free inode left"),
        ("size=4k", "head -c 8192 /dev/zero > {mnt}/fill || true", "has no free space"),
    ],
    ids=["read-only", "no free inode", "no free block"],
)
def test_a_folder_where_the_lock_file_cannot_be_made_or_written_is_named_with_a_hint(
    tmp_path: Path, options: str, then: str, said: str
) -> None:
    message = _refused_in_a_mount(tmp_path, options, then.format(mnt=tmp_path / "mnt"))
    assert said in message


@pytest.mark.otheruser
def test_a_folder_this_user_cannot_write_is_named_with_a_hint(base: Path) -> None:
    folder = base / "ckpt"
    folder.mkdir(mode=0o500)
    os.chown(folder, NOBODY, NOBODY)
    message = _refused(
        [*as_user(NOBODY), sys.executable, "-c", RUN, str(folder), "run-a", "", "hold"]
    )
    assert f"{folder}/.lock" in message
    assert "Permission denied" in message
    assert f"HINT: chmod u+w {folder}" in message


@pytest.mark.parametrize(
    ("call", "number", "said"),
    [
        ("open", errno.EROFS, "is on a read-only file system"),
        ("open", errno.ENOSPC, "has no free space or no free inode left"),
        ("open", errno.EDQUOT, "disk quota"),
        ("open", errno.EACCES, "Permission denied"),
        ("open", errno.EIO, "Input/output error"),
        ("pwrite", errno.ENOSPC, "has no free space or no free inode left"),
        ("pwrite", errno.EDQUOT, "disk quota"),
        ("lockf", errno.ENOLCK, "does not take locks"),
    ],
)
def test_an_error_of_the_lock_file_is_a_checkpoint_error_and_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, number: int, said: str
) -> None:
    owner = fcntl if call == "lockf" else os
    real = getattr(owner, call)

    def failing(*args: Any, **kw: Any) -> Any:
        if call != "open" or args[0] == LOCK:
            raise OSError(number, os.strerror(number))
        return real(*args, **kw)

    root = Dir.open_root(tmp_path, create=True)
    open_before = sorted(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(owner, call, failing)
    with pytest.raises(CheckpointError) as refused:
        RunLock.acquire(root, job="run-a", run_id=None, timeout=0)
    monkeypatch.undo()
    assert sorted(os.listdir("/proc/self/fd")) == open_before  # nothing left open or held
    message = str(refused.value)
    assert f"{tmp_path}/.lock" in message
    assert said in message
    assert "HINT:" in message
    RunLock.acquire(root, job="run-a", run_id=None, timeout=0).release()
    root.close()


def test_a_lock_whose_folder_handle_cannot_be_kept_is_let_go_and_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lock is taken, then its holder needs a handle of the folder of its own (a dup): with
    # no descriptor left, the locked file must be closed (which lets the lock go), not leaked.
    root = Dir.open_root(tmp_path, create=True)
    open_before = sorted(os.listdir("/proc/self/fd"))

    def no_descriptor_left(self: Dir) -> Dir:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(Dir, "dup", no_descriptor_left)
    with pytest.raises((CheckpointError, OSError)) as refused:
        RunLock.acquire(root, job="run-a", run_id=None, timeout=0)
    monkeypatch.undo()
    assert sorted(os.listdir("/proc/self/fd")) == open_before  # nothing left open or held
    assert isinstance(refused.value, CheckpointError), refused.value
    message = str(refused.value)
    assert f"{tmp_path}/.lock" in message
    assert "Too many open files in this process" in message
    assert "ulimit -n" in message
    other = _run(tmp_path, "run-b")
    try:
        assert "holding" in other.said, other.said
    finally:
        other.end()
    root.close()


# the price of a POSIX lock: any descriptor of .lock closed in the holding process drops it ----


def test_a_lock_dropped_by_a_stray_close_is_caught_by_check(tmp_path: Path) -> None:
    lock = _take(tmp_path, "run-a")
    try:
        lock.check()  # held: nothing to say
        (tmp_path / LOCK).read_bytes()  # user code that reads every file of the folder
        lock.check()  # dropped, and nobody took it: taken again
        os.close(os.open(tmp_path / LOCK, os.O_RDONLY))
        other = _run(tmp_path, "run-b")  # dropped again, and another run took it
        try:
            assert "holding" in other.said, other.said
            with pytest.raises(
                CheckpointError, match=rf"in use by job 'run-b' \(pid {other.process.pid} "
            ):
                lock.check()
        finally:
            other.end()
    finally:
        lock.release()


# threads of one process share its locks: one at a time opens or closes .lock ------------------


class _WouldHang(BaseException):
    """Not an Exception: no ``suppress(Exception)`` of the code under test hides it."""


class _WatchedGuard:
    """Stands in for the lock module's guard: says when a thread finds it taken (``contended``),
    and fails a thread that would wait for the guard it holds itself instead of hanging it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self.contended = threading.Event()
        self.self_waits = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            self._owner = threading.get_ident()
            return True
        if not blocking:
            return False
        if self._owner == threading.get_ident():
            self.self_waits += 1
            raise _WouldHang("a thread waits for the lock module's guard, which it holds")
        self.contended.set()
        self._lock.acquire()
        self._owner = threading.get_ident()
        return True

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_release_closes_the_file_before_another_thread_may_open_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Closing any descriptor of .lock drops every lock the process holds on it. A thread that
    # lets go is stopped just before it empties and closes its descriptor, while another thread
    # takes the folder: the taker must wait until that close is done (or it would open a
    # descriptor of its own, have its note erased, and hold a lock nobody holds).
    guard = _WatchedGuard()
    monkeypatch.setattr(lock_module, "_GUARD", guard)
    first = _take(tmp_path, "run-a")
    paused = threading.Event()
    moved_on = guard.contended  # set too once the taker is done
    problems: list[str] = []
    real_ftruncate = os.ftruncate

    def ftruncate(fd: int, length: int) -> None:
        if threading.current_thread() is releasing and not paused.is_set():
            paused.set()
            if not moved_on.wait(60):
                problems.append("the taker neither waited for the guard nor took the folder")
        real_ftruncate(fd, length)

    taken: list[object] = []

    def take() -> None:
        try:
            taken.append(_take(tmp_path, "run-b"))
        except Exception as exc:  # shown by the assertion below
            taken.append(exc)
        finally:
            moved_on.set()

    releasing = threading.Thread(target=first.release)
    taker = threading.Thread(target=take)
    monkeypatch.setattr(os, "ftruncate", ftruncate)
    releasing.start()
    assert paused.wait(60), "the release never came to empty the lock file"
    taker.start()
    releasing.join(60)
    taker.join(60)
    assert not releasing.is_alive(), "the release never ended"
    assert not taker.is_alive(), "the taker never ended"
    assert not problems, problems
    monkeypatch.undo()
    [second] = taken
    assert isinstance(second, RunLock), second
    try:
        other = _run(tmp_path, "run-c")
        try:
            assert "refused" in other.said, f"this process holds no lock any more: {other.said}"
            assert f"in use by job 'run-b' (pid {os.getpid()} " in other.said["refused"]
        finally:
            other.end()
    finally:
        second.release()


@pytest.mark.parametrize("step", ["acquire", "check"])
def test_a_dropped_lock_finalized_while_the_guard_is_held_is_let_go_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    # A state dropped without close() in a reference cycle is freed by the cyclic collector,
    # which may run inside a step that holds the guard, in that very thread: its lock's
    # finalizer must not wait for the guard (it would wait for ever), and the lock still goes.
    dropped, kept = tmp_path / "dropped", tmp_path / "kept"
    guard = _WatchedGuard()
    monkeypatch.setattr(lock_module, "_GUARD", guard)
    held = _take(kept, "run-b") if step == "check" else None
    real_try_lock = lock_module._try_lock
    collected: list[bool] = []

    def collecting(fd: int, where: Path) -> bool:
        if not collected:
            collected.append(True)
            gc.collect()  # under the guard: _try_lock is called only while it is held
        return real_try_lock(fd, where)

    gc.disable()
    try:
        cycle: list[object] = [_take(dropped, "run-a")]
        cycle.append(cycle)
        finalized = weakref.ref(cycle[0])
        del cycle
        monkeypatch.setattr(lock_module, "_try_lock", collecting)
        if held is None:
            held = _take(kept, "run-b")
        else:
            held.check()
    finally:
        gc.enable()
    assert collected
    assert finalized() is None
    assert guard.self_waits == 0, "the finalizer waited for the guard its own thread holds"
    other = _run(dropped, "run-c")  # the dropped lock was let go all the same
    try:
        assert "holding" in other.said, other.said
    finally:
        other.end()
    held.check()
    held.release()


def test_check_never_holds_the_guard_while_it_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # check() tries again while .lock is being replaced; meanwhile other threads may take and
    # let go of their folders' locks.
    lock = _take(tmp_path, "run-a")
    real_settled = lock_module._settled
    settling = [lock_module._SETTLING]  # a replacement under way, the first time
    guard_free: list[bool] = []

    def settled(folder: Dir, fd: int) -> Any:
        return settling.pop() if settling else real_settled(folder, fd)

    class Time:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            free = lock_module._GUARD.acquire(blocking=False)
            if free:
                lock_module._GUARD.release()
            guard_free.append(free)

    try:
        monkeypatch.setattr(lock_module, "_settled", settled)
        monkeypatch.setattr(lock_module, "time", Time)
        lock.check()
    finally:
        monkeypatch.undo()
        lock.release()
    assert guard_free == [True]


# off Linux -----------------------------------------------------------------------------------


def test_off_linux_a_holder_is_refused_by_what_the_lock_file_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # struct flock is laid out otherwise off Linux (macOS: l_start, l_len, l_pid, l_type,
    # l_whence): the kernel's answer is not read there. A holder is refused at once, by its note.
    holder = _run(tmp_path, "run-a", run_id="rdzv-7")
    root = Dir.open_root(tmp_path, create=True)
    real_fcntl = fcntl.fcntl

    def macos_fcntl(fd: int, cmd: int, arg: Any = 0) -> Any:
        answer = real_fcntl(fd, cmd, arg)
        if cmd != fcntl.F_GETLK:
            return answer
        kind, whence, start, length, pid = struct.unpack_from("hhqqi", answer)
        return struct.pack("qqihh", start, length, pid, kind, whence).ljust(len(answer), b"\0")

    try:
        monkeypatch.setattr(fcntl, "fcntl", macos_fcntl)
        monkeypatch.setattr(lock_module, "time", _NoWait)
        monkeypatch.setattr(sys, "platform", "darwin")
        with pytest.raises(CheckpointError) as refused:
            RunLock.acquire(root, job="run-a", run_id="rdzv-7", timeout=300)
    finally:
        monkeypatch.undo()
        root.close()
        holder.end()
    message = str(refused.value)
    assert f"in use by job 'run-a' (pid {holder.process.pid} on host " in message
    assert "on darwin unidist does not ask the kernel who holds a lock" in message


# the replacement of a read-locked .lock, played step by step ---------------------------------

#: RUN, stopped once at one step of the replacement (``open-new``: before it opens .lock.new;
#: ``rename``: before it renames .lock.new over .lock) until a line comes on its stdin.
PAUSED = (
    r"""
import json, os, sys
import unidist.resume._lock as lk
at = sys.argv.pop(1)

def pause():
    os.write(1, (json.dumps({"paused": os.getpid()}) + "\n").encode())
    sys.stdin.readline()

if at == "open-new":
    real_open = lk._open
    def _open(folder, name):
        if name == lk.NEW:
            lk._open = real_open
            pause()
        return real_open(folder, name)
    lk._open = _open
else:
    real_rename = os.rename
    def rename(*args, **kw):
        os.rename = real_rename
        pause()
        return real_rename(*args, **kw)
    os.rename = rename
"""
    + RUN
)


def _paused(folder: Path, at: str) -> Run:
    process = subprocess.Popen(
        [sys.executable, "-c", PAUSED, at, str(folder), "run-r", "", "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    return Run(process, "paused", "holding", "refused")


def _go_on(run: Run) -> None:
    assert run.process.stdin is not None
    run.process.stdin.write("go\n")
    run.process.stdin.flush()
    run.read_until("holding", "refused")


def _replacer_paused_at(folder: Path, step: str) -> tuple[subprocess.Popen[str], Run]:
    """An open file description's read lock on ``.lock`` (pid -1: never a unidist run's), a
    replacer paused at ``step``, then the read lock gone: (the squatter, the replacer)."""
    _take(folder).release()
    squatter = _squat(folder / LOCK, "ofd", user=None)
    replacer = _paused(folder, step)
    try:
        assert "paused" in replacer.said, replacer.said
        squatter.communicate("", timeout=60)
    except BaseException:
        squatter.kill()
        replacer.end()
        raise
    return squatter, replacer


def test_a_run_that_takes_the_old_file_while_it_is_being_replaced_lets_go(
    tmp_path: Path,
) -> None:
    # An open file description's read lock (pid -1: never a unidist run's) holds .lock; a
    # replacer stops just before its rename; the read lock goes, and a run locks the old file.
    # It must let go: the replacer's rename is coming.
    squatter, replacer = _replacer_paused_at(tmp_path, "rename")
    try:
        pid = replacer.process.pid
        with pytest.raises(
            CheckpointError, match=rf"another run of this user \(pid {pid}\), which is replacing"
        ):
            _take(tmp_path)
        _go_on(replacer)
        assert "holding" in replacer.said, replacer.said
        with pytest.raises(CheckpointError, match=rf"in use by job 'run-r' \(pid {pid} "):
            _take(tmp_path)
    finally:
        squatter.kill()
        replacer.end()
    _take(tmp_path).release()
    assert sorted(os.listdir(tmp_path)) == [LOCK]


def test_a_replacer_that_finds_the_old_file_taken_by_a_run_leaves_it_alone(
    tmp_path: Path,
) -> None:
    # The replacer saw only a read lock, then stops before it takes .lock.new; meanwhile the
    # read lock goes and a run takes .lock. The replacer looks again under .lock.new, finds the
    # run, removes .lock.new and is refused by the run's name.
    squatter, replacer = _replacer_paused_at(tmp_path, "open-new")
    try:
        before = (tmp_path / LOCK).stat().st_ino
        lock = _take(tmp_path, "run-b")
        try:
            _go_on(replacer)
            assert f"in use by job 'run-b' (pid {os.getpid()} " in replacer.said["refused"]
            assert (tmp_path / LOCK).stat().st_ino == before
            assert sorted(os.listdir(tmp_path)) == [LOCK]
            lock.check()  # still this process's
        finally:
            lock.release()
    finally:
        squatter.kill()
        replacer.end()


def test_a_left_over_replacement_file_is_taken_over(tmp_path: Path) -> None:
    # A replacer that died between making .lock.new and renaming it left the file, unlocked.
    _take(tmp_path).release()
    (tmp_path / NEW).touch(mode=0o600)
    squatter = _squat(tmp_path / LOCK, "ofd", user=None)
    try:
        _take(tmp_path).release()
    finally:
        squatter.communicate("", timeout=60)
    assert sorted(os.listdir(tmp_path)) == [LOCK]


def test_a_read_locked_left_over_replacement_file_is_named_with_a_hint(tmp_path: Path) -> None:
    _take(tmp_path).release()
    (tmp_path / NEW).touch(mode=0o600)
    squatters = [_squat(tmp_path / name, "ofd", user=None) for name in (LOCK, NEW)]
    try:
        with pytest.raises(CheckpointError, match=rf"HINT: rm {tmp_path / NEW} when no run"):
            _take(tmp_path)
        # An ordinary run is not kept out by it: no replacer ever read-locks .lock.new.
        squatters.pop(0).communicate("", timeout=60)
        _take(tmp_path).release()
    finally:
        for squatter in squatters:
            squatter.communicate("", timeout=60)


def test_a_read_lock_on_a_network_file_system_is_named_and_the_file_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On NFS another host may see the old .lock for a while after a rename: never replaced.
    _take(tmp_path).release()
    before = (tmp_path / LOCK).stat().st_ino
    monkeypatch.setattr(lock_module, "_local", lambda fd: False)
    squatter = _squat(tmp_path / LOCK, "ofd", user=None)
    try:
        with pytest.raises(CheckpointError, match="on a network file system unidist does not"):
            _take(tmp_path)
    finally:
        squatter.communicate("", timeout=60)
    assert (tmp_path / LOCK).stat().st_ino == before
