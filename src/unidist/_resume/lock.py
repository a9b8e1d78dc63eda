"""One run per checkpoint folder at a time: a lock that the kernel lets go when its holder dies.

Rank 0 of a run takes an exclusive ``flock`` on ``root/.lock`` before anything in the folder is
written or removed, and holds it for the run's life (until :meth:`RunLock.release`, or the
process's end, however it ends: the kernel drops the lock with the last open descriptor, so a
stale lock from a dead run never blocks a restart). On NFS, Linux turns ``flock`` into a lock
that the server holds for every client, so a second run on another node that shares the folder
is refused too. The file holds who has the lock (job, host, pid), which the refusal quotes.

Within one process the lock is shared: a second :class:`unidist.ResumableState` on the same
folder (a test that resumes in place, a state rebuilt after an error) is not a second run.

A run restarted by torch's elastic agent may find its own previous incarnation still letting go
(rank 0 moved to another node whose agent restarted first): a holder of the same run
(``TORCHELASTIC_RUN_ID``) and the same job is waited for, up to the state's timeout; any other
holder is an error at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from unidist._resume.handle import Dir, check_private
from unidist.errors import CheckpointError

LOCK = ".lock"
#: Seconds between tries while a previous incarnation of the same run lets go.
_RETRY = 0.2
_HOLDER_BYTES = 4096

#: (device, inode) of a locked folder -> [descriptor, holders in this process]
_HELD: dict[tuple[int, int], list[int]] = {}


class RunLock:
    """The folder's lock, held by this process (see the module's docstring)."""

    def __init__(self, key: tuple[int, int]) -> None:
        self._key: tuple[int, int] | None = key

    @classmethod
    def acquire(cls, folder: Dir, *, job: str, run_id: str | None, timeout: float) -> RunLock:
        """Take the lock of ``folder`` or raise a CheckpointError that names its holder."""
        info = os.fstat(folder.fd)
        key = (info.st_dev, info.st_ino)
        if key in _HELD:
            _HELD[key][1] += 1
            return cls(key)
        fd = os.open(
            LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder.fd
        )
        try:
            check_private(os.fstat(fd), folder.path / LOCK)
            deadline = time.monotonic() + timeout
            while not _try_lock(fd):
                holder = _holder(fd)
                same_run = run_id is not None and holder.get("run") == run_id
                if not (same_run and holder.get("job") == job) or time.monotonic() > deadline:
                    raise _busy(folder.path, holder, job, waited=same_run, timeout=timeout)
                time.sleep(_RETRY)
            me = {"job": job, "host": socket.gethostname(), "pid": os.getpid(), "run": run_id}
            data = json.dumps(me).encode()[:_HOLDER_BYTES]
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)
            raise
        _HELD[key] = [fd, 1]
        return cls(key)

    def release(self) -> None:
        """Let go (the last holder in this process closes the file, which drops the lock)."""
        key, self._key = self._key, None
        if key is None or key not in _HELD:
            return
        entry = _HELD[key]
        entry[1] -= 1
        if entry[1] == 0:
            del _HELD[key]
            with contextlib.suppress(OSError):
                os.ftruncate(entry[0], 0)  # nobody holds it: nobody to name
            os.close(entry[0])

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _holder(fd: int) -> dict[str, Any]:
    """Who holds the lock, as its holder wrote it (a damaged note reads as unknown)."""
    try:
        value = json.loads(os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8"))
    except (OSError, RecursionError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    keep = {"job": str, "host": str, "pid": int, "run": str}
    return {k: v for k, v in value.items() if k in keep and isinstance(v, keep[k])}


def _busy(
    root: Path, holder: dict[str, Any], job: str, *, waited: bool, timeout: float
) -> CheckpointError:
    who = (
        f"job {holder.get('job', '?')!r} (pid {holder.get('pid', '?')} on host "
        f"{holder.get('host', '?')!r})"
        if holder
        else "another process (it has not said who it is yet)"
    )
    wait = (
        f" It is an earlier start of this same run, and it did not let go within {timeout:g} s."
        if waited
        else ""
    )
    return CheckpointError(
        f"the checkpoint folder {root} is in use by {who}; this is job {job!r}, and two runs "
        f"on one folder would overwrite and prune each other's checkpoints.{wait} Nothing was "
        "written or removed. HINT: wait for that run to end (or stop it), or give this run a "
        "folder of its own."
    )
