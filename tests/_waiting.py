"""Waiting in tests on the thing itself, never for a fixed time that a busy machine outlasts."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``condition()`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def stay_away(folder: str | Path, until_told_by: Iterable[int], timeout: float = 60) -> str:
    """On a rank that plays the missing one: wait until each rank in ``until_told_by`` said so.

    The other ranks call :func:`tell` once they have seen this rank missing (their wait timed
    out), so the absence lasts exactly as long as the test needs, however slow the machine.
    """
    marks = [Path(folder, f"told-by-{rank}") for rank in until_told_by]
    wait_for(lambda: all(mark.exists() for mark in marks), timeout, f"{marks} to appear")
    return "stayed away"


def tell(folder: str | Path, rank: int) -> None:
    """On a waiting rank: let the rank that stays away (:func:`stay_away`) come back."""
    Path(folder, f"told-by-{rank}").touch()


def join_store_threads(timeout: float) -> None:
    """After a test killed a store host it had stopped: wait for unidist's threads still on it.

    ``connect_within`` gives up on a stopped host in time, but cannot interrupt torch's client,
    whose thread (and a relay that started it) runs on until the host dies; torch then logs the
    reset connection. Joined here, that log is the test's captured output, not a line printed
    in the middle of another test's.
    """
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name in ("unidist-store-connect", "unidist-launch-relay"):
            thread.join(max(0.0, deadline - time.monotonic()))


def wait_stopped(pid: int, what: str) -> None:
    """Return once ``/proc`` shows every thread of ``pid`` stopped (the store serves from one).

    ``kill`` only queues a SIGSTOP: on a busy machine a thread may run on a moment longer, long
    enough to answer a client that connects at once (the matrix once saw that connection succeed
    where the test expects it to fail).
    """

    def every_thread_stopped() -> bool:
        try:
            states = [
                t.read_text().rsplit(")", 1)[1].split()[0]
                for t in Path(f"/proc/{pid}/task").glob("*/stat")
            ]
        except FileNotFoundError:  # a thread ended meanwhile: look again
            return False
        return all(state == "T" for state in states)

    wait_for(every_thread_stopped, 10, f"{what} to stop")


def stop(pid: int) -> None:
    """SIGSTOP ``pid`` and return once it is stopped."""
    os.kill(pid, signal.SIGSTOP)
    wait_stopped(pid, f"every thread of {pid}")


def signal_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits, sent but not yet handled, for process ``pid`` (a stopped one).

    ``kill`` to a process queues the signal in the process's shared set (``ShdPnd``); one sent to
    a thread lands in its own (``SigPnd``). Both are hexadecimal masks, bit ``signum - 1``.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    masks = [line.split()[1] for line in status.splitlines() if line[:7] in ("SigPnd:", "ShdPnd:")]
    return any(int(mask, 16) >> (signum - 1) & 1 for mask in masks)
