"""The exit clock stamps each exit as it happens, in the order the processes died."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Hashable

from tests._waiting import wait_for
from unidist.launch.supervise.exits import ExitClock


def _clock(interval: float = 0.05) -> tuple[ExitClock, dict[Hashable, int]]:
    stamps: dict[Hashable, int] = {}
    return ExitClock(lambda key, at: stamps.setdefault(key, at), interval), stamps


def test_exits_found_together_are_stamped_in_the_order_they_happened() -> None:
    clock, stamps = _clock()
    clock.start()
    first, second = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    try:
        clock.watch("first", first.pid)
        clock.watch("second", second.pid)
        clock.watch("second", first.pid)  # a key is watched once: this changes nothing
        first.kill()
        wait_for(lambda: stamps.get("first") is not None, 10, "the first exit's stamp")
        time.sleep(0.02)  # the second dies measurably later (what is measured, not awaited)
        second.kill()
        wait_for(lambda: stamps.get("second") is not None, 10, "the second exit's stamp")
        # Not reaped yet, as under torch's agent: a sweep now would find both gone at once.
        early, late = stamps.get("first"), stamps.get("second")
        assert early is not None
        assert late is not None
        assert early < late
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
        clock.stop()
    assert stamps.get("never watched") is None


def test_a_process_that_cannot_be_watched_gets_no_stamp() -> None:
    clock, stamps = _clock()
    clock.start()
    done = subprocess.Popen(["true"])
    done.wait()  # reaped: no pidfd can be opened for it any more
    clock.watch("gone", done.pid)
    time.sleep(0.1)  # a wake of the clock (nothing to wait on: no stamp may come)
    assert stamps.get("gone") is None
    clock.stop()
