"""One rank's page: a small shared-memory file of where the rank is, written by the rank and read
by its launcher.

Every rank that ``unidist launch`` or :func:`unidist.testing.run_distributed` starts keeps one
(``UNIDIST_PROGRESS`` names it): a page in the run's private folder, mapped by the rank and read by
the launcher without asking the rank anything, so a rank stuck in C code, in a collective or
frozen by SIGSTOP still shows where it last was. The rank's stack thread
(:mod:`unidist.hangs.stacks`) is its only writer; the launcher writes one field only,
``request`` (a stack dump, answered in ``answered``). A seqlock keeps reads whole: the writer
makes ``seq`` odd before it writes and even after; a reader that sees an odd or changed ``seq``
reads again.

Layout (little-endian; ``Q`` = u64, times from ``CLOCK_MONOTONIC`` in ns, comparable on one host)::

    seq magic pid main_thread beat ticks steps step_at world_seq all_seq motion state state_at
    user_samples comm_samples data_samples backward_samples answered
    op[32] frame[256] where[256]
    ... request (the page's last 8 bytes: the launcher's, outside the seqlock)

Nothing in it is executed or unpickled: numbers and short UTF-8 texts, each bounded.
"""

from __future__ import annotations

import contextlib
import enum
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

SIZE = 4096
MAGIC = 0x3176_6770_6469_6E75  # "unidpgv1", little-endian
_NUMBERS = [
    "seq",
    "magic",
    "pid",
    "main_thread",
    "beat",
    "ticks",
    "steps",
    "step_at",
    "world_seq",
    "all_seq",
    "motion",
    "state",
    "state_at",
    "user_samples",
    "comm_samples",
    "data_samples",
    "backward_samples",
    "answered",
]
_TEXTS = (("op", 32), ("frame", 256), ("where", 256))
_FORMAT = "<" + "Q" * len(_NUMBERS) + "".join(f"{n}s" for _, n in _TEXTS)
_STRUCT = struct.Struct(_FORMAT)
_REQUEST = SIZE - 8
#: Tries a reader makes before it takes what it has (a writer that died mid-write).
_READ_TRIES = 50


class State(enum.IntEnum):
    """What the rank's main thread was doing at the last sample."""

    UNKNOWN = 0
    USER = 1  # its own code (or a library it calls)
    COLLECTIVE = 2  # inside a collective (torch.distributed's or unidist's), or waiting for one
    BACKWARD = 3  # in autograd's backward (DDP and FSDP run their collectives from there)
    DATA = 4  # waiting for the DataLoader
    DONE = 5  # the script returned


@dataclass(frozen=True)
class Snapshot:
    """One whole read of a record."""

    pid: int
    main_thread: int
    beat: int
    ticks: int
    steps: int
    step_at: int
    world_seq: int
    all_seq: int
    motion: int
    state: State
    state_at: int
    samples: dict[str, int]
    request: int
    answered: int
    op: str
    frame: str
    where: str

    @property
    def progress(self) -> tuple[int, int, int]:
        """What counts as the rank moving on: collectives issued, steps, moves in its own code."""
        return (self.all_seq, self.steps, self.motion)


def _text(value: str, size: int) -> bytes:
    data = value.encode("utf-8", "replace")[:size]
    return data.ljust(size, b"\0")


class Writer:
    """The rank's side: creates the record (private, 0600) and writes it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._seq = 0
        self.values: dict[str, int | str] = dict.fromkeys(_NUMBERS, 0)
        self.values.update({name: "" for name, _ in _TEXTS})
        self.values["magic"] = MAGIC
        self.values["pid"] = os.getpid()

    def request(self) -> int:
        """The stack dumps the launcher asked for so far (it writes this field alone)."""
        return int.from_bytes(self._map[_REQUEST : _REQUEST + 8], "little")

    def flush(self) -> None:
        """Write :attr:`values` whole (the launcher's ``request`` field is not among them)."""
        self._seq += 1
        self._map[0:8] = self._seq.to_bytes(8, "little")  # odd: being written
        self.values["seq"] = self._seq
        numbers = [int(self.values[name]) for name in _NUMBERS]
        texts = [_text(str(self.values[name]), size) for name, size in _TEXTS]
        _STRUCT.pack_into(self._map, 0, *numbers, *texts)
        self._seq += 1
        self._map[0:8] = self._seq.to_bytes(8, "little")  # even: whole

    def close(self) -> None:
        with contextlib.suppress(ValueError, BufferError):
            self._map.close()


def read(path: str | os.PathLike[str]) -> Snapshot | None:
    """The record at ``path``, or None while it is missing, short or not a record."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = b""
        request = int.from_bytes(os.pread(fd, 8, _REQUEST), "little")
        for _ in range(_READ_TRIES):
            data = os.pread(fd, _STRUCT.size, 0)
            if len(data) < _STRUCT.size:
                return None
            first = int.from_bytes(data[:8], "little")
            if first % 2 == 0 and os.pread(fd, 8, 0) == data[:8]:
                break
    finally:
        os.close(fd)
    fields = _STRUCT.unpack(data)
    numbers = dict(zip(_NUMBERS, fields[: len(_NUMBERS)], strict=True))
    if numbers["magic"] != MAGIC:
        return None
    texts = [raw.rstrip(b"\0").decode("utf-8", "replace") for raw in fields[len(_NUMBERS) :]]
    try:
        state = State(numbers["state"])
    except ValueError:
        state = State.UNKNOWN
    return Snapshot(
        pid=numbers["pid"],
        main_thread=numbers["main_thread"],
        beat=numbers["beat"],
        ticks=numbers["ticks"],
        steps=numbers["steps"],
        step_at=numbers["step_at"],
        world_seq=numbers["world_seq"],
        all_seq=numbers["all_seq"],
        motion=numbers["motion"],
        state=state,
        state_at=numbers["state_at"],
        samples={
            "user": numbers["user_samples"],
            "comm": numbers["comm_samples"],
            "data": numbers["data_samples"],
            "backward": numbers["backward_samples"],
        },
        request=request,
        answered=numbers["answered"],
        op=texts[0],
        frame=texts[1],
        where=texts[2],
    )


def ask_for_stacks(path: str | os.PathLike[str]) -> int:
    """Ask the rank for a dump of every thread's stack; returns the request's number."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            current = int.from_bytes(os.pread(fd, 8, _REQUEST), "little")
            os.pwrite(fd, (current + 1).to_bytes(8, "little"), _REQUEST)
            return current + 1
        finally:
            os.close(fd)
    return 0


def path_for(folder: Path, rank: int, start: int | None = None) -> Path:
    """The record of ``rank`` (of ``start``, under ``unidist launch``) in ``folder``."""
    prefix = "" if start is None else f"s{start}-"
    return folder / f"progress-{prefix}r{rank}.bin"
