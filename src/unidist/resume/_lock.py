"""One run per checkpoint folder at a time: a lock that goes with the process that holds it.

Rank 0 of a run takes an exclusive POSIX record lock (``fcntl`` ``F_SETLK``: a write lock on the
whole file) on ``root/.lock`` before anything in the folder is written or removed, and holds it
for the run's life: until :meth:`RunLock.release`, or the process's end, however it ends. The
file holds who has the lock (job, host, pid, run id), which a refusal quotes.

Why a POSIX record lock and not ``flock``:

* It belongs to the process. A child forked later (a ``multiprocessing`` Pool, a DataLoader
  worker) does not inherit it, and the kernel drops it when the process ends, whatever children
  still have the file open. An ``flock`` belongs to the open file, which ``fork`` shares: a child
  that outlives its run would keep the run's folder locked, and every restart would be refused
  while it lives.
* It is the lock NFS has: the server holds it for the client (Linux emulates ``flock`` with it
  there), so a run on another node that shares the folder is refused too. Lustre takes either
  only when mounted with ``-o flock``.
* On a local file system an ``flock``, which anyone who can read the file may take, never meets
  it (Linux keeps the two kinds apart).

Its price: a process loses its POSIX locks on a file as soon as it closes *any* descriptor of
that file. So ``.lock`` is opened once per process (states of one process share it: ``_HELD``),
and nothing else in unidist opens it; code that reads every file of the folder in rank 0 (a
``shutil.copytree`` of it, say) lets the lock go, which :meth:`RunLock.check` notices. Threads
share their process's locks, so one thread at a time opens or closes a descriptor of ``.lock``
and changes ``_HELD`` (``_GUARD``, never held while waiting). A lock let go while the guard is
taken is counted off by the guard's holder before it lets the guard go (``_LET_GO``): the cyclic
garbage collector may finalize a dropped :class:`RunLock` inside any step that holds the guard,
in that very thread, and the finalizer must not wait for it. A forked child holds none of its
parent's locks, so it forgets them (``_HELD`` is emptied at fork) and is refused like any other
process.

**Another user.** ``.lock`` is made 0600 again at every acquire (the owner's ``chmod -R go+rX``
of the folder makes it readable). That is not enough: whoever opened it while it was readable
keeps the descriptor, and a read lock (``F_RDLCK``, or an open file description's read lock)
needs only read access, and refuses a write lock. But no unidist run ever takes a read lock (a
run takes a write lock, which needs write access and excludes every other lock), so a
conflicting read lock proves that no run holds the file. When the read lock is another user's
(or an open file description's, whose pid the kernel reports as -1), on a local file system,
the run replaces ``.lock`` by a fresh private file that no one else has open (:func:`_replace`).
Whose a process is, /proc says; where /proc hides other users' processes (``hidepid=2``), a
process this user may not signal is another user's (:func:`_whose`). A read lock of a process of
this user is refused by its pid, as a run is; so is one whose user this process cannot tell: a
pid of another pid namespace (the kernel reports it as 0: a process of another container, or of
the host), or a pid /proc hides from a process that may signal anyone (root). Nothing proves such
a process is not this user's, so its file is never taken from it; the refusal says how to remove
``.lock`` by hand. On a network file system the file is never replaced: another host may see the
old name for a while, and the check below needs every process to see the same names.

The replacement is safe against the owner's own runs starting at the same moment. A run that
takes ``.lock`` (write lock granted) then checks that no ``.lock.new`` is write-locked and that
``.lock`` still names the file it locked, and lets go and tries again otherwise. A replacer
write-locks ``.lock.new`` (created 0600, or left by a replacer that died), checks that the name
still names it, checks again under it that ``.lock`` names the file it examined and is
read-locked, and renames ``.lock.new`` over ``.lock``. Why no two runs ever both hold the lock:

1. Only the process that write-locks the file ``.lock.new`` names, and has checked that the name
   names it, renames or removes that name (anyone may create it where it is missing); write
   locks exclude each other, so one process at a time. So between its check and its rename, a
   replacer R alone changes ``.lock.new`` and ``.lock`` (the rename is the only thing that
   changes ``.lock``).
2. Say a run P ends up holding the file F that R replaces (``.lock`` names F at R's last look).
   If P locked F before R's last look, R saw P's write lock, not a read lock: no rename. So P
   locked F after it; P's look at ``.lock.new`` came later still, while R held the lock of the
   file ``.lock.new`` names (from R's check of that name to its rename): P saw a write lock and
   let go. Or P looked after the rename, and saw that ``.lock`` no longer names F: P let go.
3. A run never holds a file that ``.lock`` no longer names: by 2, for every rename in turn.

A replacer that died leaves ``.lock.new`` behind, unlocked: the next replacer takes it over.
Another user who read-locks such a leftover blocks only the replacement (ordinary runs ignore a
read lock on it, which no replacer holds); the refusal says to remove it.

**Off Linux** the kernel's answer to "who holds this lock" (``struct flock``) is not read: its
layout is Linux's here. A lock held by someone else is refused at once, naming whoever
``.lock`` says holds it, and never replaced (nor waited for as an earlier start of this run).

**Restarts.** A run restarted by torch's elastic agent may find its own previous incarnation
still letting go (rank 0 moved to another node whose agent restarted first): a holder of the same
run (``TORCHELASTIC_RUN_ID``) and the same job is waited for, up to the state's timeout, and the
wait is logged; any other holder is an error at once. A launcher's run id given no ``--rdzv-id``
is a placeholder, the same for every launch: torchrun's ``none`` (without ``--standalone``) and
``unidist launch``'s ``unidist`` (on several nodes). It names no run, and a holder with it (or
with none) is never waited for.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import socket
import stat
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unidist.errors import CheckpointError
from unidist.resume._handle import Dir, check_private

log = logging.getLogger("unidist.resume")

LOCK = ".lock"
#: A fresh, private lock file on its way to replace ``.lock`` (see :func:`_replace`).
NEW = ".lock.new"
#: Seconds between tries while a previous incarnation of the same run lets go.
_RETRY = 0.2
#: Tries, and seconds between them, while another run of this user replaces ``.lock``: a few
#: system calls, unless that run was stopped in the middle.
_SETTLE_TRIES = 50
_SETTLE = 0.02
_HOLDER_BYTES = 4096
#: The run id a launcher gives every launch without ``--rdzv-id`` -> the launcher: torchrun's
#: (without ``--standalone``), and ``unidist launch``'s on several nodes.
PLACEHOLDER_RUN_IDS = {"none": "torchrun", "unidist": "unidist launch"}

_OPEN = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_PROBE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: ``struct flock``: l_type, l_whence, l_start, l_len, l_pid (Linux's layout, 64-bit off_t; other
#: systems order it otherwise: see :func:`_conflict`).
_FLOCK = struct.Struct("hhqqi")
#: ``CAP_KILL``'s bit in ``CapEff`` of /proc/self/status: signal any process.
_CAP_KILL = 1 << 5
#: File systems (``statfs`` f_type) on which every process sees the same names at once.
_LOCAL_FILE_SYSTEMS = frozenset(
    {
        0xEF53,  # ext2, ext3, ext4
        0x58465342,  # xfs
        0x9123683E,  # btrfs
        0x01021994,  # tmpfs
        0x858458F6,  # ramfs
        0x794C7630,  # overlayfs
        0x2FC12FC1,  # zfs
        0xF2F52010,  # f2fs
        0xCA451A4E,  # bcachefs
        0x3153464A,  # jfs
    }
)


@dataclass
class _Held:
    """The lock as this process holds it: its file, its folder, how many states share it."""

    fd: int
    folder: Dir
    count: int = 1


#: (device, inode) of a locked folder -> the lock held on it by this process
_HELD: dict[tuple[int, int], _Held] = {}
#: Held while a thread opens or closes a descriptor of a ``.lock`` or changes ``_HELD`` (POSIX
#: locks are the process's), never while it waits; taken through ``_GUARDED``.
_GUARD = threading.Lock()
#: Keys of locks let go and not yet counted off in ``_HELD``: whoever holds ``_GUARD`` counts
#: them off before it lets the guard go (:func:`_leave`), so a finalizer never waits for it.
_LET_GO: list[tuple[int, int]] = []


class _Guarded:
    """``with _GUARDED``: hold ``_GUARD``; on the way out, count off the locks let go meanwhile."""

    def __enter__(self) -> None:
        _GUARD.acquire()

    def __exit__(self, *exc: object) -> None:
        _leave()


_GUARDED = _Guarded()


@dataclass(frozen=True)
class _Busy:
    """Why the lock was not taken this time.

    ``kind``: ``run`` (a write lock: a run, or a tool of this user), ``reader`` (a read lock of
    a process of this user's), ``unknown`` (a read lock of a process whose user cannot be told:
    of another pid namespace, pid 0; or hidden by /proc from a process that may signal anyone),
    ``stranger`` (another user's read lock on a local file system: the file is replaced),
    ``remote`` (a read lock on a network file system), ``leftover`` (a read lock on a left-over
    ``.lock.new`` too), ``unasked`` (off Linux: a lock whose kind and holder are not asked),
    ``settling`` (``.lock`` is being replaced, or was let go since: try again).
    """

    kind: str
    pid: int | None = None
    note: dict[str, Any] = field(default_factory=dict)


_SETTLING = _Busy("settling")


class RunLock:
    """The folder's lock, held by this process (see the module's docstring)."""

    def __init__(self, key: tuple[int, int]) -> None:
        self._key: tuple[int, int] | None = key

    @classmethod
    def acquire(cls, folder: Dir, *, job: str, run_id: str | None, timeout: float) -> RunLock:
        """Take the lock of ``folder`` or raise a CheckpointError that names its holder."""
        info = os.fstat(folder.fd)
        key = (info.st_dev, info.st_ino)
        run = _real_run_id(run_id)
        deadline = time.monotonic() + timeout
        settling = 0
        waiting = False
        while True:
            with _GUARDED:  # never held while waiting
                if key in _HELD:
                    _HELD[key].count += 1
                    return cls(key)
                got = _attempt(folder)
                if isinstance(got, int):
                    _HELD[key] = _keep(got, folder, job, run)
                    return cls(key)
            if got.kind == "settling" and settling < _SETTLE_TRIES:
                settling += 1
                time.sleep(_SETTLE)
                continue
            same_run = (
                got.kind == "run"
                and run is not None
                and _real_run_id(got.note.get("run")) == run
                and got.note.get("job") == job
            )
            if not same_run or time.monotonic() > deadline:
                raise _busy(folder.path, got, job, run_id=run_id, waited=same_run, timeout=timeout)
            if not waiting:
                waiting = True
                log.warning(
                    "the checkpoint folder %s is held by %s, which says it belongs to this same "
                    "run (TORCHELASTIC_RUN_ID %r): waiting up to %g s for it to let go",
                    folder.path,
                    _who(got),
                    run,
                    timeout,
                )
            time.sleep(_RETRY)

    def check(self) -> None:
        """Raise a CheckpointError unless this process still holds the folder's lock.

        A POSIX lock goes when the process closes any descriptor of its file (see the module's
        docstring); one lost that way, and not taken by anyone since, is taken again here.
        """
        for _ in range(_SETTLE_TRIES):
            with _GUARDED:  # never held while waiting
                held = _HELD.get(self._key) if self._key is not None else None
                if held is None:
                    raise CheckpointError(
                        "this state let go of its checkpoint folder's lock already."
                    )
                root = held.folder.path
                if _try_lock(held.fd, root / LOCK):
                    busy = _settled(held.folder, held.fd)
                else:
                    busy = _examine(held.fd, root)
            if busy is None or busy.kind != "settling":
                break
            time.sleep(_SETTLE)
        if busy is not None:
            raise CheckpointError(
                f"the checkpoint folder {root} of this run is now in use by {_who(busy)}: this "
                f"process let go of its lock when a descriptor of {root / LOCK} was closed in it "
                "(a POSIX lock goes with any descriptor of its file). Two runs on one folder "
                "overwrite and prune each other's checkpoints. HINT: never open the files of the "
                "checkpoint folder in rank 0 while the run holds it (copy it from another "
                "process, or after close())."
            )

    def release(self) -> None:
        """Let go (the last holder in this process closes the file, which drops the lock)."""
        with _GUARDED:  # counted off on the way out
            key, self._key = self._key, None
            if key is not None:
                _LET_GO.append(key)

    def __del__(self) -> None:
        # Never waits for the guard: the cyclic collector may run this inside a guarded step of
        # this very thread. Whoever holds the guard counts this lock off before it lets go.
        with contextlib.suppress(Exception):
            key, self._key = getattr(self, "_key", None), None
            if key is not None:
                _LET_GO.append(key)
                if _GUARD.acquire(blocking=False):
                    _leave()


def _leave() -> None:
    """Count off the locks let go while the guard was held, then let the guard go; again while
    a finalizer that found it taken has let go of one since (and the guard is free)."""
    while True:
        try:
            while _LET_GO:  # only the guard's holder takes from it; anyone appends
                _count_off(_LET_GO.pop())
        finally:
            _GUARD.release()
        if not _LET_GO or not _GUARD.acquire(blocking=False):
            return


def _count_off(key: tuple[int, int]) -> None:
    """One holder of ``key`` fewer; the last closes the file, which drops the lock (under the
    guard: another thread may not open the file before this closes it)."""
    held = _HELD.get(key)
    if held is None:  # forgotten at a fork
        return
    held.count -= 1
    if held.count > 0:
        return
    del _HELD[key]
    with contextlib.suppress(OSError):
        os.ftruncate(held.fd, 0)  # nobody holds it: nobody to name
    with contextlib.suppress(OSError):
        os.close(held.fd)
    with contextlib.suppress(OSError):
        held.folder.close()


def _forget_in_child() -> None:
    """A forked child holds none of its parent's POSIX locks: it must not think it does."""
    global _GUARD
    _GUARD = threading.Lock()  # another thread of the parent may have held it at the fork
    _LET_GO.clear()
    for held in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
        held.folder.close()
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _keep(fd: int, folder: Dir, job: str, run: str | None) -> _Held:
    """The lock just taken on ``fd``, with who holds it written in it and a handle of its folder
    of its own; on any error ``fd`` is closed (which drops the lock) and nothing is left open."""
    mine: Dir | None = None
    try:
        mine = folder.dup()
        me = {"job": job, "host": socket.gethostname(), "pid": os.getpid(), "run": run}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode()[:_HOLDER_BYTES], 0)
    except BaseException as exc:
        os.close(fd)
        if mine is not None:
            mine.close()
        if isinstance(exc, OSError):
            doing = (
                "write who holds it to" if mine is not None else "keep a handle of the folder of"
            )
            raise _unusable(folder.path / LOCK, exc, doing) from None
        raise
    return _Held(fd, mine)


def _real_run_id(run_id: object) -> str | None:
    """A run id that names a run: a launcher's placeholder (and nothing at all) names none."""
    if not isinstance(run_id, str) or run_id == "" or run_id in PLACEHOLDER_RUN_IDS:
        return None
    return run_id


# -- one try ----------------------------------------------------------------------------------


def _attempt(folder: Dir) -> int | _Busy:
    """Take ``.lock`` once: its descriptor (locked), or why not."""
    where = folder.path / LOCK
    fd = _open(folder, LOCK)
    keep = False
    try:
        if _try_lock(fd, where):
            settled = _settled(folder, fd)
            keep = settled is None
            return fd if settled is None else settled
        busy = _examine(fd, folder.path)
        if busy.kind == "stranger":
            got = _replace(folder, fd)
            keep = False
            return got
        return busy
    finally:
        if not keep:
            os.close(fd)  # drops this process's lock on it, if it got one


def _examine(fd: int, root: Path) -> _Busy:
    """Who holds the lock of ``fd`` (a ``stranger``: another user's read lock, replaceable)."""
    conflict = _conflict(fd, root / LOCK)
    if conflict is None:
        return _Busy("unasked", None, _holder(fd))
    kind, pid = conflict
    if kind == fcntl.F_UNLCK:
        return _SETTLING  # let go since: try again
    if kind == fcntl.F_WRLCK:
        return _Busy("run", pid, _holder(fd))
    if not _local(fd):
        return _Busy("remote", pid)
    if pid == -1:  # an open file description's lock, which unidist never takes
        return _Busy("stranger", pid)
    if pid == 0:  # a process of another pid namespace: whose, nothing here can tell
        return _Busy("unknown", pid)
    whose = _whose(pid)
    if whose == "gone":
        return _SETTLING  # ended since: try again
    return _Busy({"mine": "reader", "other": "stranger"}.get(whose, "unknown"), pid)


def _settled(folder: Dir, fd: int) -> _Busy | None:
    """None if the lock just taken on ``fd`` counts: no replacement of ``.lock`` is under way
    (``.lock.new`` is not write-locked) and ``.lock`` still names ``fd``'s file."""
    try:
        probe = os.open(NEW, _PROBE, dir_fd=folder.fd)
    except FileNotFoundError:
        probe = -1
    except OSError as exc:
        raise _unusable(folder.path / NEW, exc, "open") from None
    if probe >= 0:
        try:
            same = _same(probe, fd)
            # Off Linux (None) nothing is replaced (see _examine): no replacer holds it.
            kind, pid = _conflict(probe, folder.path / NEW) or (fcntl.F_UNLCK, 0)
        finally:
            os.close(probe)  # never fd's file (checked): this process holds no lock on it
        if same or kind == fcntl.F_WRLCK:
            return _Busy("settling", pid)
    return None if _names(folder, LOCK, fd) else _SETTLING


def _replace(folder: Dir, old: int) -> int | _Busy:
    """Put a fresh private ``.lock`` in place of ``old``'s file, which only another user's read
    lock holds; the new file's descriptor (locked), or why not (see the module's docstring)."""
    where = folder.path / NEW
    new = _open(folder, NEW)
    keep = owned = False
    try:
        if not _try_lock(new, where):
            kind, pid = _conflict(new, where) or (fcntl.F_UNLCK, 0)  # only Linux replaces
            return _Busy("leftover", pid) if kind == fcntl.F_RDLCK else _SETTLING
        if not _names(folder, NEW, new):
            return _SETTLING
        owned = True  # this process alone renames or removes NEW now
        if _names(folder, LOCK, old) and _examine(old, folder.path).kind == "stranger":
            os.rename(NEW, LOCK, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
            keep = True
            return new
        return _SETTLING  # taken or let go meanwhile: try again from the start
    except OSError as exc:
        raise _unusable(where, exc, "replace the lock file with") from None
    finally:
        if owned and not keep:
            with contextlib.suppress(OSError):
                os.unlink(NEW, dir_fd=folder.fd)
        if not keep:
            os.close(new)


# -- the file and its locks -------------------------------------------------------------------


def _open(folder: Dir, name: str) -> int:
    """Open (or create) ``name``, this user's alone, and private again if others could read it."""
    where = folder.path / name
    try:
        fd = os.open(name, _OPEN, 0o600, dir_fd=folder.fd)
    except OSError as exc:
        raise _unusable(where, exc, "create or open") from None
    try:
        info = os.fstat(fd)
        check_private(info, where)
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    except OSError as exc:
        os.close(fd)
        raise _unusable(where, exc, "make private") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _try_lock(fd: int, where: Path) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise _unusable(where, exc, "lock") from None
    return True


def _conflict(fd: int, where: Path) -> tuple[int, int] | None:
    """The type and pid of a lock that keeps a write lock on ``fd``'s file from this process
    (F_UNLCK: none), or None off Linux, where ``struct flock`` is laid out otherwise. The kernel
    names one such lock; a write lock excludes all others, so a read lock named means no write
    lock is held. Its pid: -1 for an open file description's lock, 0 for a process of another
    pid namespace; on NFS, maybe a process of another host."""
    if not _linux():
        return None
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0) + bytes(16)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError as exc:
        raise _unusable(where, exc, "ask who locks") from None
    kind, _, _, _, pid = _FLOCK.unpack_from(answer)
    return kind, pid


def _names(folder: Dir, name: str, fd: int) -> bool:
    """Whether ``name`` in ``folder`` is ``fd``'s file."""
    try:
        there = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


def _same(a: int, b: int) -> bool:
    first, second = os.fstat(a), os.fstat(b)
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def _linux() -> bool:
    return sys.platform.startswith("linux")


def _whose(pid: int) -> str:
    """Whose process ``pid`` of this host is: ``mine``, ``other`` (another user's), ``gone``,
    or ``unknown``.

    /proc says. Where it hides other users' processes (``hidepid=2``, ``hidepid=invisible``),
    ``kill(pid, 0)`` asks instead: refused (EPERM) for a live process this user may not signal,
    which is another user's (its real and saved uid are not this user's); ESRCH for none. A
    process that may signal any process (root, CAP_KILL) learns only that it lives, and nothing
    else outside /proc names a process's user: ``unknown``, which is refused and never replaced
    (nothing proves it is not this user's own).
    """
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        pass
    else:
        return "mine" if uid == os.geteuid() else "other"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "other"
    except OSError:
        return "unknown"
    return "unknown" if _may_signal_anyone() else "mine"


def _may_signal_anyone() -> bool:
    """Whether this process has CAP_KILL (root has it; so may a container's root not)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & _CAP_KILL)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def _local(fd: int) -> bool:
    """Whether ``fd``'s file system is one on which every process sees the same names at once."""
    if not _linux():
        return False
    buffer = ctypes.create_string_buffer(256)  # struct statfs: f_type first, 120 bytes
    if ctypes.CDLL(None, use_errno=True).fstatfs(fd, buffer) != 0:
        return False
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF in _LOCAL_FILE_SYSTEMS


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


# -- what is said -----------------------------------------------------------------------------


def _who(busy: _Busy) -> str:
    note = busy.note
    if note:
        return (
            f"job {note.get('job', '?')!r} (pid {note.get('pid', busy.pid or '?')} on host "
            f"{note.get('host', '?')!r})"
        )
    if busy.pid:
        return f"another process (pid {busy.pid}; it has not said who it is yet)"
    return "another process (it has not said who it is yet)"


def _busy(
    root: Path, busy: _Busy, job: str, *, run_id: str | None, waited: bool, timeout: float
) -> CheckpointError:
    lock, new = root / LOCK, root / NEW
    pid = f"pid {busy.pid}" if busy.pid and busy.pid > 0 else "a process this host cannot name"
    fix = "HINT: wait for that run to end (or stop it), or give this run a folder of its own."
    if busy.kind == "reader":
        who = f"{pid} of this user, which holds a read lock on {lock} (no unidist run takes one)"
        fix = "HINT: end that process (or have it let go of the file), or use a folder of your own."
    elif busy.kind == "remote":
        who = (
            f"{pid} (as the file system names it), which holds a read lock on {lock} (no unidist "
            "run takes one); on a network file system unidist does not replace that file, as "
            "other hosts may still see the old one for a while"
        )
        fix = (
            "HINT: have that process let go of it; or, when no run of yours uses the folder, "
            f"rm {lock} (the new one is private; the old one stays with whoever has it open)."
        )
    elif busy.kind == "leftover":
        who = (
            f"another user's read lock on {lock}, which unidist would replace, but {pid} also "
            f"read-locks {new}, which a run of yours left while replacing {lock}"
        )
        fix = f"HINT: rm {new} when no run of yours is starting on this folder, then start again."
    elif busy.kind == "unknown":
        whose = (
            "a process of another pid namespace (another container, or the host)"
            if busy.pid == 0
            else f"{pid}, which /proc of this host does not say whose it is"
        )
        who = (
            f"{whose}, which holds a read lock on {lock} (no unidist run takes one); nothing "
            "tells that it is not a process of this user, so unidist does not replace that file"
        )
        fix = (
            "HINT: have that process let go of it; or, when no run of yours uses the folder, "
            f"rm {lock} (the new one is private; the old one stays with whoever has it open)."
        )
    elif busy.kind == "unasked":
        who = f"{_who(busy)}, as {lock} says," if busy.note else f"a process that locks {lock}"
        who += (
            f" (on {sys.platform} unidist does not ask the kernel who holds a lock, so it does "
            "not wait for an earlier start of this run either)"
        )
    elif busy.kind == "settling":
        who = f"another run of this user ({pid}), which is replacing the lock file {lock}"
        fix = "HINT: that run may be stopped (SIGSTOP, a debugger): let it go on, or end it."
    else:
        who = _who(busy)
    said = ""
    if waited:
        said = (
            f" It says it belongs to this same run (TORCHELASTIC_RUN_ID {run_id!r}), and it did "
            f"not let go within {timeout:g} s."
        )
    elif run_id in PLACEHOLDER_RUN_IDS and busy.note.get("job") == job:
        said = (
            f" This run's id is {PLACEHOLDER_RUN_IDS[run_id]}'s placeholder {run_id!r} (no "
            "--rdzv-id), which every launch without one gets, so nothing tells a restart of that "
            "run from a second launch: it was not waited for."
        )
        fix = (
            "HINT: pass the same real --rdzv-id to every restart of one run when restarts may "
            "overlap (a restart then waits for its earlier start); else wait for that run to end "
            "(or stop it), or give this run a folder of its own."
        )
    return CheckpointError(
        f"the checkpoint folder {root} is in use by {who}; this is job {job!r}, and two runs "
        f"on one folder would overwrite and prune each other's checkpoints.{said} Nothing was "
        f"written or removed. {fix}"
    )


def _unusable(where: Path, exc: OSError, doing: str) -> CheckpointError:
    """A CheckpointError for an OSError of the lock file: what failed, why, and the fix."""
    folder = where.parent
    number = exc.errno or 0
    reason = f"{exc.strerror or exc} ({errno.errorcode.get(number, number)})"
    hint = "give this run a checkpoint folder on a file system that works"
    if number == errno.EROFS:
        reason = f"{folder} is on a read-only file system"
        hint = "remount it read-write, or give this run a checkpoint folder on a writable one"
    elif number == errno.ENOSPC:
        reason = f"the file system of {folder} has no free space or no free inode left"
        hint = f"free some (df -h {folder}; df -i counts inodes), or use another file system"
    elif number == errno.EDQUOT:
        reason = f"this user's disk quota on the file system of {folder} is used up"
        hint = "remove files of yours there (quota -s shows the use), or use another file system"
    elif number in (errno.EACCES, errno.EPERM):
        reason = f"{exc.strerror} for this user (uid {os.geteuid()})"
        hint = f"chmod u+w {folder} (and {where}, if it is there), or use a folder of your own"
    elif number in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
        reason = f"the file system of {folder} does not take locks ({exc.strerror})"
        hint = (
            "mount NFS with its lock manager (not -o nolock), Lustre with -o flock; or give "
            "this run a checkpoint folder on a local file system"
        )
    elif number == errno.ELOOP:
        reason = f"{where} is a symbolic link, not a file unidist made"
        hint = f"rm {where}"
    elif number == errno.EMFILE:
        reason = f"{exc.strerror} in this process"
        hint = "close the files this process no longer needs, or raise its limit (ulimit -n)"
    elif number == errno.EIO:
        hint = f"the file system of {folder} fails (dmesg may say why): {hint}"
    return CheckpointError(
        f"unidist could not {doing} {where}, the lock that keeps a second run out of the "
        f"checkpoint folder: {reason}. Nothing was written or removed. HINT: {hint}."
    )
