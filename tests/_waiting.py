"""Waiting in tests on the thing itself, never for a fixed time that a busy machine outlasts."""

from __future__ import annotations

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
