"""When each rank's process exited, stamped as it happens (pidfds, Linux 5.3 and later).

The supervisor's looks see an exit up to one interval late, under load later still, and two ranks
found gone in one sweep could have died in either order: a rank that crashed and left no record
(its disk was full) would be ordered by the sweep, not by the crash. :class:`ExitClock` blocks in
``poll()`` on a pidfd per rank and stamps each exit when it wakes, so the report orders such
crashes by when they happened. It keeps no stamps: each goes to the ``notify`` it was given (the
supervisor's inbox). Where pidfds are missing (another OS, an old kernel) it stamps nothing and
the sweeps' times stand.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable, Hashable

__all__ = ["ExitClock"]


class ExitClock(threading.Thread):
    """A thread that stamps the exit of every process it is asked to watch.

    Args:
        notify: called from this thread with (key, ns since the epoch) for each exit.
        interval: seconds between looks for newly watched processes while none exits.
    """

    def __init__(self, notify: Callable[[Hashable, int], None], interval: float = 0.05) -> None:
        super().__init__(name="unidist-launch-exit-clock", daemon=True)
        self._interval_ms = max(1, int(interval * 1000))
        self._lock = threading.Lock()
        self._poll = select.poll() if hasattr(select, "poll") else None
        self._fds: dict[int, Hashable] = {}  # pidfd -> key
        self._known: set[Hashable] = set()
        self._notify = notify
        self._halt = threading.Event()

    def watch(self, key: Hashable, pid: int) -> None:
        """Start watching ``pid`` (once per ``key``); a process that already exited is stamped
        on the next wake, so only a watch begun before the exit gives its real time."""
        with self._lock:
            if key in self._known or self._poll is None or self._halt.is_set():
                return
            self._known.add(key)
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):  # gone and reaped, or no pidfds here
                return
            self._fds[fd] = key
            self._poll.register(fd, select.POLLIN)

    def run(self) -> None:
        if self._poll is None:
            return
        while not self._halt.is_set():
            ready = self._poll.poll(self._interval_ms)
            now = time.time_ns()
            ended = []
            with self._lock:
                for fd, _ in ready:
                    key = self._fds.pop(fd, None)
                    self._poll.unregister(fd)
                    os.close(fd)
                    if key is not None:
                        ended.append(key)
            for key in ended:
                self._notify(key, now)

    def stop(self) -> None:
        """Stop the thread and close every pidfd it still holds (once it has ended: a thread
        still in ``poll()`` keeps its descriptors, whose numbers could be reused otherwise)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        if self.is_alive():
            return
        with self._lock:
            for fd in self._fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
