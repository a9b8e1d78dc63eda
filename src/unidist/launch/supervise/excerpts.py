"""What a report quotes from a rank's logs: the end of its stderr, where a stopped or crashed
rank was (from faulthandler's dump, the user's frames last), and a log that could not be written
(a full disk, an I/O error) named as the likely cause of the failure.

Logs are read as the files unidist created (never through a link) and shown escaped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from unidist.launch.printing import shown
from unidist.launch.supervise.outcome import RankOutcome, Status

__all__ = ["check_logs", "crash_excerpt", "excerpt", "stack_excerpt", "storage_problem"]

_TAIL_LINES = 15
#: Frames of the machinery around the user's code, left out of a stopped rank's stack.
_MACHINERY = ("runpy", "/unidist/launch/", "/multiprocessing/", "/torch/distributed/elastic/")
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")


#: Errors that mean the storage of a log failed (not the program).
_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}


def storage_problem(folder: Path) -> str | None:
    """Why files cannot be written in ``folder`` now: ``No space left on device (ENOSPC)``, a
    disk quota, an I/O error or a read-only file system; None if a page writes and syncs.

    Tries it: a hidden file of one page, written, synced and removed.
    """
    fd = -1
    name = None
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".unidist-probe-")
        os.write(fd, b"\n" * 4096)
        os.fsync(fd)
    except OSError as exc:
        if exc.errno in _STORAGE_ERRORS:
            return f"{os.strerror(exc.errno)} ({errno.errorcode[exc.errno]})"
        return None
    finally:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(name)
    return None


def check_logs(outcomes: Iterable[RankOutcome]) -> None:
    """Name the logs of failed ranks that could not be written (a full disk, an I/O error):
    the likely cause of their failure, which the rank itself may have had no way to report."""
    probed: dict[Path, str | None] = {}
    for o in outcomes:
        if o.status not in (Status.OK, Status.STOPPED):
            _check_logs(o, probed)


def _check_logs(o: RankOutcome, probed: dict[Path, str | None]) -> None:
    """Name a log that could not be written, the likely cause of a rank's failure."""
    found: dict[str, list[Path]] = {}
    shown_as = {o.read_stdout or o.stdout: o.stdout, o.read_stderr or o.stderr: o.stderr}
    for path, shown_path in shown_as.items():
        if path.parent not in probed:
            probed[path.parent] = storage_problem(path.parent)
        why = probed[path.parent]
        if why is not None:
            found.setdefault(why, []).append(shown_path)
    if not found:
        return
    o.log_error = "; ".join(
        f"rank {o.rank}'s log {', '.join(str(p) for p in paths)}: {why}"
        for why, paths in found.items()
    )
    if o.status == Status.CRASHED and o.detail.endswith("without a Python exception"):
        o.detail = o.detail.replace(
            "without a Python exception", "when its log could not be written"
        )


def excerpt(o: RankOutcome, lines: int = _TAIL_LINES) -> list[str]:
    if o.status == Status.LOST:
        return ["      its ranks' logs are on its host, in its launcher's log folder"]
    if o.remote:
        return [
            f"      full logs on {o.host}: {shown(o.stderr)}",
            f"                 {shown(o.stdout)}",
        ]
    text = _read(o.read_stderr or o.stderr)
    stack: list[str] = []
    if o.status in (Status.STOPPED, Status.HUNG):
        stack = stack_excerpt(text, lines)
    elif o.status == Status.CRASHED:
        stack = crash_excerpt(text, lines)
    kept = stack or [line for line in text.rstrip().splitlines() if line.strip()][-lines:]
    body = [f"      | {line}" for line in kept] if kept else ["      | (stderr is empty)"]
    return [*body, f"      full logs: {shown(o.stderr)}", f"                 {shown(o.stdout)}"]


def _read(path: Path) -> str:
    try:  # never through a link: the log is the file unidist created
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as log:
            return (log.read() or b"").decode(errors="replace")
    except OSError:
        return ""


def stack_excerpt(text: str, frames: int) -> list[str]:
    """Where a stopped rank was, from the last stack dump in its stderr, user's frames last.

    faulthandler writes the innermost frame first, and the outermost frames are the launcher's
    (runpy, the bootstrap); the tail of the log would show only those. This keeps the main
    thread's frames minus that machinery, innermost ``frames`` of them, in traceback order.
    """
    blocks = _thread_blocks(text.splitlines())
    if not blocks:
        return []
    kept = _users_frames(_main_block(blocks) or blocks[-1], frames)
    if not kept:
        return []
    return ["stack when stopped (most recent call last):", *kept]


_FATAL = re.compile(r"^Fatal Python error: (.+)$")


def crash_excerpt(text: str, frames: int) -> list[str]:
    """Where a rank was when it crashed in native code, from faulthandler's dump in its log.

    A rank of ``unidist launch`` enables faulthandler, which answers a segmentation fault (an
    abort, a bus error) with ``Fatal Python error: ...`` and every thread's stack, the crashing
    thread's marked ``Current thread``; the tail of the log would show the outermost frames
    and the list of extension modules. This keeps the crashing thread's frames (as
    :func:`stack_excerpt` keeps a stopped rank's) and, when it is not the main thread (a
    native thread of torch or gloo that runs Python rarely or never), the main thread's too:
    what the script was doing. Empty when the log holds no such dump.
    """
    lines = text.splitlines()
    start = next((i for i in range(len(lines) - 1, -1, -1) if _FATAL.match(lines[i])), None)
    if start is None:
        return []
    blocks = _thread_blocks(lines[start + 1 :])
    crashing = next((b for b in blocks if b.header.startswith("Current thread")), None)
    main = _main_block(blocks)
    out = [lines[start]]  # "Fatal Python error: Segmentation fault"
    shown_main = main if main is not crashing else None  # once, as the crashing thread
    for title, block in (("crashing thread", crashing), ("main thread", shown_main)):
        if block is None:
            continue
        shown_frames = _users_frames(block, frames) or ["  (no Python frame: in native code)"]
        out += [f"{title} (most recent call last):", *shown_frames]
    return out


@dataclass
class _Block:
    """One thread of a faulthandler dump: its header line and its frames, innermost first."""

    header: str
    frames: list[str]


def _thread_blocks(lines: list[str]) -> list[_Block]:
    """The threads of the faulthandler dumps in ``lines``, in the order they were written."""
    blocks: list[_Block] = []
    for line in lines:
        if _THREAD.match(line):
            blocks.append(_Block(line, []))
        elif blocks and line.startswith('  File "'):
            blocks[-1].frames.append(line)
    return blocks


def _main_block(blocks: list[_Block]) -> _Block | None:
    """The main thread's (the last with runpy's or unidist's bootstrap frames: faulthandler
    writes the main thread last), or None."""
    mains = [b for b in blocks if any("/unidist/launch/" in f or "runpy" in f for f in b.frames)]
    return mains[-1] if mains else None


def _users_frames(block: _Block, frames: int) -> list[str]:
    """The innermost ``frames`` of ``block`` that are not the machinery, in traceback order."""
    kept = [f for f in block.frames if not any(part in f for part in _MACHINERY)][:frames]
    return list(reversed(kept))
