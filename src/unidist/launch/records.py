"""The records ranks leave for their launcher, and who a PID really is.

Each rank writes small JSON files into its run's event folder (``UNIDIST_EVENTS``): ``start``
(pid, process start time, rank, host), then ``done`` or ``error``. The error record is torch's
error file: the file ``TORCHELASTIC_ERROR_FILE`` names, in the JSON that torch's ``@record``
and ``ErrorHandler`` write (``{"message": {"message": "Type: text", "extraInfo": {"py_callstack":
..., "timestamp": ...}}}``), so a script's ``@record`` and unidist's rank wrapper write one file
in one format, and torch's agent reads it too. unidist adds, inside ``extraInfo``, an ``unidist``
object: whether the exception was the rank's own fault, and when (ns). A file without it (a
program that wrote torch's format itself) still counts, as the rank's own failure at the file's
timestamp. Files are named ``<kind>-s<start>-r<rank>.json``, where ``start``
counts the starts of this node's ranks in this run (restarts after a failure and after a change
of membership alike), so a record is never mistaken for another start's. The folder is private
and new for every run (:mod:`unidist.launch.plan.rundir`); records are plain JSON, checked on
reading.

:class:`Start` and :class:`Slot` are the launcher's side: where torch's agent put each rank.

A full disk must not silence the rank that filled it (a log that grew until the disk was full is
the usual way): each rank takes room for its error file when it starts (:func:`reserve`, a
hidden file of :data:`RESERVE_BYTES` beside it) and, when the disk is full, writes the record
into that room in place (padded with spaces, which JSON ignores) and renames it: no new block is
needed, and none is freed for the logs to take. Writing a record never raises: a rank's exit
status must not depend on whether its launcher's records could be written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "AWAIT_LEAVE",
    "AWAIT_LEAVE_SECONDS",
    "ERROR_FILE",
    "EVENTS",
    "START",
    "Slot",
    "Start",
    "error_file",
    "left",
    "mark_left",
    "process_start_time",
    "read",
    "release",
    "release_left",
    "reserve",
    "write",
    "write_error",
]

#: The variables that tell a rank where its records go and which start it belongs to.
EVENTS = "UNIDIST_EVENTS"
START = "UNIDIST_START"
#: Set by a launcher with a relay (a job of several nodes): the last rank of a node to finish
#: waits until the launcher has left the relay's round (:func:`left`) before it exits.
AWAIT_LEAVE = "UNIDIST_AWAIT_LEAVE"
#: How long that rank waits at most (the relay's round trip has a 2 s deadline).
AWAIT_LEAVE_SECONDS = 5.0
#: torch's variable: where a rank writes why it failed (torch's ``@record`` reads it too).
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
_KINDS = ("start", "error", "done")
#: The room each rank keeps for its error file (torch's format, traceback cut to fit).
RESERVE_BYTES = 16 * 1024
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class Slot:
    """One rank of one start of this node, as torch's agent placed it.

    ``stdout`` and ``stderr`` are its log files as messages show them; ``io_stdout`` and
    ``io_stderr``, when set, are the names the launcher reads and hands on (through the run
    folder's handle: see :mod:`unidist.launch.supervise.runner`).
    """

    rank: int
    local_rank: int
    node_rank: int
    world_size: int
    stdout: Path
    stderr: Path
    io_stdout: Path | None = None
    io_stderr: Path | None = None

    @property
    def read_stdout(self) -> Path:
        return self.io_stdout or self.stdout

    @property
    def read_stderr(self) -> Path:
        return self.io_stderr or self.stderr


@dataclass(frozen=True)
class Start:
    """One start of this node's ranks: its index in the run, and local rank -> :class:`Slot`."""

    index: int
    slots: dict[int, Slot]


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, Linux), to tell it from a reused PID."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    return None


def error_file(events: Path, start: int | str, rank: int | str) -> Path:
    """Where the rank ``rank`` of start ``start`` writes its error file (``ERROR_FILE``);
    ``"*"`` for either gives a glob pattern."""
    return events / f"error-s{start}-r{rank}.json"


def left(events: Path, start: int) -> Path:
    """The file the launcher creates once it has left the relay's round of start ``start``."""
    return events / f"left-s{start}"


def mark_left(events: Path, start: int) -> None:
    """Say (to the ranks of start ``start``) that the launcher left the relay's round."""
    with contextlib.suppress(OSError):
        left(events, start).touch(mode=0o600)


def await_leave() -> None:
    """Inside a rank that recorded ``done``: if every rank of its node has, wait (at most
    :data:`AWAIT_LEAVE_SECONDS`) until the launcher has left the relay's round. Ranks that
    finish earlier leave at once: torch's agent sees the node done only when the last exits."""
    env = os.environ
    folder = env.get(EVENTS)
    if not folder or not env.get(AWAIT_LEAVE):
        return
    start, rank = int(env.get(START, "0")), env.get("RANK", "?")
    events = Path(folder)
    with contextlib.suppress(OSError, ValueError):
        done = sum(1 for _ in events.glob(f"done-s{start}-r*.json"))
        if done < int(env.get("LOCAL_WORLD_SIZE", "1")):
            return
        deadline = time.monotonic() + AWAIT_LEAVE_SECONDS
        while not left(events, start).exists():
            if time.monotonic() > deadline:
                print(
                    f"unidist: rank {rank} waited {AWAIT_LEAVE_SECONDS:g} s for its launcher to "
                    f"leave the relay's round ({left(events, start)} never appeared); exiting",
                    file=sys.stderr,
                )
                return
            time.sleep(0.01)


def write(kind: str, identity: dict[str, Any], payload: dict[str, Any]) -> None:
    """Write one record atomically (inside a rank); a record that cannot be written is lost."""
    folder = os.environ.get(EVENTS)
    if not folder:
        return
    start = os.environ.get(START, identity.get("attempt", 0))
    record = {**identity, **payload, "start": int(start), "time_ns": time.time_ns()}
    with contextlib.suppress(OSError):
        _replace(Path(folder, f"{kind}-s{start}-r{identity['rank']}.json"), record)


def write_error(identity: dict[str, Any], exc: BaseException, kind: str, callstack: str) -> None:
    """Write this rank's error file (``ERROR_FILE``) in torch's format, atomically; on a full
    disk, into the room :func:`reserve` kept for it.

    Args:
        identity: the rank's identity (rank, pid, host, ...), kept under ``unidist``.
        exc: the exception the rank fails with.
        kind: ``raised`` (its own fault), ``collateral`` or ``timeout`` (another rank's).
        callstack: the formatted traceback.
    """
    path = os.environ.get(ERROR_FILE)
    if not path:
        return
    now = time.time_ns()
    ours = {**identity, "kind": kind, "type": type(exc).__name__, "time_ns": now}
    ours["start"] = int(os.environ.get(START, identity.get("attempt", 0)))

    def record(text: str, stack: str) -> dict[str, Any]:
        extra = {"py_callstack": stack, "timestamp": str(now // 1_000_000_000), "unidist": ours}
        return {"message": {"message": text, "extraInfo": extra}}

    text = f"{type(exc).__name__}: {exc}"
    try:
        _replace(Path(path), record(text, callstack))
    except OSError as failed:
        if failed.errno in _NO_SPACE:
            with contextlib.suppress(OSError):
                _into_reserve(Path(path), lambda cut: record(text[:cut], callstack[-cut:]))
        return
    release()


def reserve() -> None:
    """Take room on the disk for this rank's error file, to write it even when the disk is
    full (inside a rank of ``unidist launch``, at its start); nothing if there is none to take."""
    path = os.environ.get(ERROR_FILE)
    if not path or not os.environ.get(EVENTS):
        return
    room = _reserve_of(Path(path))
    with contextlib.suppress(OSError):
        fd = os.open(room, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:  # written, not sparse: the blocks are this file's from now on
            os.write(fd, b" " * RESERVE_BYTES)
        finally:
            os.close(fd)


def release() -> None:
    """Give back the room this rank kept for its error file (inside a rank)."""
    path = os.environ.get(ERROR_FILE)
    if path and os.environ.get(EVENTS):
        with contextlib.suppress(OSError):
            _reserve_of(Path(path)).unlink()


def release_left(events: Path) -> None:
    """Remove the rooms left in ``events`` by ranks that never gave theirs back (killed ones):
    the launcher, at a restart and after the run."""
    with contextlib.suppress(OSError):
        for room in events.glob(_reserve_of(error_file(events, "*", "*")).name):
            with contextlib.suppress(OSError):
                room.unlink()


def _reserve_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.reserve")


def _into_reserve(path: Path, record: Callable[[int], dict[str, Any]]) -> None:
    """Write ``record(cut)`` (a record whose long texts are cut to ``cut`` characters) into
    the room kept for ``path``, then rename the room to ``path``; raises OSError if there is
    no room or the record does not fit."""
    room = _reserve_of(path)
    fd = os.open(room, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # no O_TRUNC: its blocks
    try:
        size = os.fstat(fd).st_size
        cut = size
        data = json.dumps(record(cut)).encode()
        while len(data) > size and cut > 0:
            cut //= 2
            data = json.dumps(record(cut)).encode()
        if len(data) > size:
            raise OSError(errno.ENOSPC, "the record does not fit in its reserve", str(room))
        os.pwrite(fd, data.ljust(size), 0)
    finally:
        os.close(fd)
    room.replace(path)


def _replace(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # tracebacks: private
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(record))
        tmp.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read(events: Path, start: int) -> dict[tuple[str, int], dict[str, Any]]:
    """(kind, rank) -> record, for one start. Malformed files are skipped."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    with contextlib.suppress(OSError):
        for path in events.glob(f"*-s{start}-r*.json"):
            kind = path.name.split("-", 1)[0]
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())
                if kind == "error":
                    data = _from_error_file(data, path)
                if kind in _KINDS and isinstance(data, dict) and _valid(data):
                    found[(kind, int(data["rank"]))] = data
    return found


def _from_error_file(data: Any, path: Path) -> Any:
    """torch's error-file JSON -> the flat record the report reads (rank, kind, type, message,
    traceback, time_ns); a file unidist did not complete counts as the rank's own failure."""
    outer = data.get("message") if isinstance(data, dict) else None
    if not isinstance(outer, dict):
        return None
    text = str(outer.get("message", ""))
    extra = _mapping(outer.get("extraInfo"))
    ours = _mapping(extra.get("unidist"))
    name, _, message = text.partition(": ")
    stamp = str(extra.get("timestamp", ""))
    rank = path.name.rsplit("-r", 1)[-1].removesuffix(".json")
    flat: dict[str, Any] = {
        "rank": int(rank) if rank.isdigit() else None,
        "pid": 0,
        "kind": "raised",
        "type": name if message else "Error",
        "message": (message if message else text)[:2000],
        "traceback": str(extra.get("py_callstack", ""))[-6000:],
        "time_ns": int(stamp) * 1_000_000_000 if stamp.isdigit() else 0,
    }
    flat.update({k: v for k, v in ours.items() if k not in ("message", "traceback")})
    return flat


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _valid(data: dict[str, Any]) -> bool:
    ints = ("rank", "pid", "time_ns")
    return all(isinstance(data.get(name), int) for name in ints)
