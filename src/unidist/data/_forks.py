"""DataLoader workers that a fork left stuck before their first line: seen, and started again.

A worker started by ``fork`` gets a copy of the rank's memory, locks included, but only the
thread that forked it. A lock another thread held at that instant stays held in the child, where
no thread will ever release it. CPython takes one such lock, ``HEAD_LOCK``, in every forked child
before any of its code runs, and on Python 3.10 before 3.10.15 and 3.11 before 3.11.10 that lock
is taken before the child resets it (CPython gh-112275; 3.12 and later never had it:
:data:`unidist._base.workarounds.FORK_HEAD_LOCK`). A thread takes it without the GIL whenever it
enters Python from C for the first time: a gloo thread does, each time it frees the last
reference to a collective's work (torch's ``ProcessGroupGloo::runLoop``, about 10 times a second
in a training rank). A worker forked while one did never runs a line; torch's DataLoader
(``timeout=0``) waits for its batches forever, and every other rank waits on this one.

unidist's loaders watch the workers they fork: each worker reports from its init function that it
runs, and one thread of the rank waits for the reports, with a deadline
(``UNIDIST_WORKER_START_TIMEOUT``, 10 s by default). A worker that has not reported by then is
stopped (SIGSTOP). If it still has not reported, it never reached its init function, so it never
took an index from its queue: it is killed, and a new worker is forked in its place with the
same arguments and queues, so the loop gets the same batches in the same order (the new worker
is a copy of the rank as it is then: a dataset the loop changed in the meantime, which the next
epoch's workers would see changed too, is seen changed). One that
reported meanwhile was only slow, and goes on (SIGCONT). A replacement is watched the same way,
with twice the deadline, four times at most; then the worker is killed and torch's DataLoader
raises its own error for it ("DataLoader worker (pid N) is killed by signal"): never a hang.

The watch runs only on a Python that has the bug (:func:`watched`); elsewhere no worker is
watched, and ``UNIDIST_WORKER_START_TIMEOUT`` is not read. Workers started by ``spawn`` or
``forkserver`` are not watched either: they do not inherit this process's threads or their
locks. The torch privates a replacement writes are written by
:func:`unidist._base.workarounds.replace_dataloader_worker`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import multiprocessing.context
import os
import selectors
import signal
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from unidist._base.workarounds import FORK_HEAD_LOCK, replace_dataloader_worker

logger = logging.getLogger("unidist.data")

#: Times one worker is started again before the DataLoader is left to fail on it.
ATTEMPTS = 4
#: Seconds a worker gets to show that SIGSTOP stopped it (one asleep stops at once).
_STOP_DEADLINE = 5.0
_REPORT = 4  # bytes a worker writes to say it runs: its worker id, little-endian
#: Seconds the watching thread waits after a round of its loop failed; doubled after each
#: further failure in a row, up to ``_RETRY_MAX``; a round that succeeds starts it over.
_RETRY_FIRST = 0.1
_RETRY_MAX = 30.0
#: How many of the latest stuck workers :data:`replaced` keeps.
REPLACED_KEPT = 64

#: What this process did about its latest stuck workers (the last ``REPLACED_KEPT``), for tests
#: and reports: (worker id, stuck pid, pid of the worker started in its place, or None when the
#: DataLoader was left to fail on it).
replaced: collections.deque[tuple[int, int, int | None]] = collections.deque(maxlen=REPLACED_KEPT)


def forks(loader: Any) -> bool:
    """Whether ``loader``'s workers start by the standard library's ``fork`` method."""
    context = loader.multiprocessing_context
    if context is None:
        method = multiprocessing.get_start_method(allow_none=True)
        return (method or multiprocessing.get_all_start_methods()[0]) == "fork"
    return type(context) is getattr(multiprocessing.context, "ForkContext", None)


def watched(loader: Any) -> bool:
    """Whether ``loader``'s workers are watched: forked, on a Python with CPython gh-112275."""
    return FORK_HEAD_LOCK.present() and forks(loader)


class Recorder(multiprocessing.context.BaseContext):
    """The fork context, keeping what each worker was made from (``Process.start`` drops it)."""

    _name = "fork"

    def __init__(self) -> None:
        self.made: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def Process(self, *args: Any, **kwargs: Any) -> Any:  # multiprocessing's name
        process = multiprocessing.context.ForkProcess(*args, **kwargs)
        self.made.append((process, args, kwargs))
        return process

    def get_context(self, method: str | None = None) -> Any:
        if method not in (None, "fork"):
            return super().get_context(method)
        return self


@dataclass
class _Slot:
    """One worker not yet seen running."""

    worker_id: int
    process: Any
    made: tuple[tuple[Any, ...], dict[str, Any]]
    timeout: float
    deadline: float
    signums: tuple[int, ...]
    attempts: int = 0


@dataclass
class _Watch:
    """The workers of one DataLoader iterator, until each has said it runs."""

    iterator: weakref.ref[Any]
    read_fd: int
    write_fd: int
    slots: dict[int, _Slot]
    seen: set[int] = field(default_factory=set)
    buffer: bytearray = field(default_factory=bytearray)

    def take_reports(self) -> None:
        """Read every report waiting in the pipe (never blocks: the pipe is non-blocking)."""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while chunk := os.read(self.read_fd, 4096):
                self.buffer += chunk
        usable = len(self.buffer) - len(self.buffer) % _REPORT
        for at in range(0, usable, _REPORT):
            self.seen.add(int.from_bytes(self.buffer[at : at + _REPORT], "little"))
        del self.buffer[:usable]
        for worker_id in self.seen & set(self.slots):
            del self.slots[worker_id]

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def report_fds() -> tuple[int, int]:
    """A pipe for the reports of one iterator's workers: (read end, write end)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    return read_fd, write_fd


def report_to(fds: tuple[int, int]) -> tuple[int, int, int]:
    """What a worker's init function needs to report on the pipe ``fds``: its fds and inode."""
    return fds[0], fds[1], os.fstat(fds[1]).st_ino


def report(pipe: tuple[int, int, int], worker_id: int) -> None:
    """In a worker: say that it runs (first thing in its init function), then let go the pipe.

    Only into that pipe: an init function left on a loader by mistake (two threads iterating
    one loader at once) must not write into whatever file now has the fd's number.
    """
    read_fd, write_fd, inode = pipe
    with contextlib.suppress(OSError):
        if os.fstat(write_fd).st_ino == inode:
            os.write(write_fd, worker_id.to_bytes(_REPORT, "little"))
            for fd in (read_fd, write_fd):
                os.close(fd)


class _Watcher:
    """The one thread of a rank that waits for its forked workers' reports (see the docstring).

    It lives as long as the process: a worker it forks asks for SIGKILL when the thread that
    forked it ends (``PR_SET_PDEATHSIG``), which must mean when the rank ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: list[_Watch] = []
        self._wake: tuple[int, int] | None = None  # made with the thread

    def add(self, watch: _Watch) -> None:
        """Wait for ``watch``'s workers on this process's watching thread."""
        with self._lock:
            self._watches.append(watch)
            if self._wake is None:
                self._wake = report_fds()
                # Started here, by the thread that forks the workers, while the stop signals are
                # blocked: it keeps them blocked, as the workers it forks must have them.
                threading.Thread(
                    target=self._run,
                    args=(self._wake[0],),
                    name="unidist-worker-starts",
                    daemon=True,
                ).start()
            wake = self._wake[1]
        os.write(wake, b"w")

    def _run(self, wake: int) -> None:
        with selectors.DefaultSelector() as selector:  # epoll: select() refuses fds past 1023
            selector.register(wake, selectors.EVENT_READ)
            pause: float | None = None  # after a failed round; None after one that succeeded
            while True:
                try:
                    self._round(selector, wake)
                except Exception:  # never let a surprise end the thread that serves every loader
                    pause = _RETRY_FIRST if pause is None else min(_RETRY_MAX, 2 * pause)
                    logger.exception(
                        "unidist: watching DataLoader workers start failed; trying again in %g s",
                        pause,
                    )
                    self._pause(pause)
                else:
                    pause = None

    def _pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def _round(self, selector: selectors.BaseSelector, wake: int) -> None:
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            if watch.read_fd not in selector.get_map():
                selector.register(watch.read_fd, selectors.EVENT_READ)
        deadline = min((s.deadline for w in watches for s in w.slots.values()), default=None)
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if any(key.fd == wake for key, _ in selector.select(wait)):
            with contextlib.suppress(BlockingIOError):
                os.read(wake, 4096)
        for watch in watches:
            try:
                self._look(watch)
            except Exception:
                logger.exception("unidist: watching DataLoader workers start failed")
                for slot in watch.slots.values():  # as torch would have it: no stop of ours
                    _signal(slot.process, signal.SIGCONT)
                watch.slots.clear()
            if not watch.slots:
                selector.unregister(watch.read_fd)
                watch.close()
                with self._lock:
                    self._watches.remove(watch)

    def _look(self, watch: _Watch) -> None:
        watch.take_reports()
        iterator = watch.iterator()
        if iterator is None or getattr(iterator, "_shutdown", False):
            if iterator is not None and getattr(iterator, "_worker_pids_set", False):
                # torch is still joining its workers, their pids still registered: a kill now
                # would read as a failure. It unregisters them within seconds.
                for slot in watch.slots.values():
                    slot.deadline = time.monotonic() + 1.0
                return
            # The loop is over: a worker that never ran is killed (torch's SIGTERM cannot reach
            # it, the stop signals are blocked in it) and nothing is started in its place.
            for slot in watch.slots.values():
                _signal(slot.process, signal.SIGKILL)
            watch.slots.clear()
            return
        now = time.monotonic()
        for slot in [s for s in watch.slots.values() if s.deadline <= now]:
            watch.take_reports()
            if slot.worker_id in watch.slots:  # not reported, in the meantime
                self._overdue(watch, iterator, slot)

    def _overdue(self, watch: _Watch, iterator: Any, slot: _Slot) -> None:
        if not _signal(slot.process, signal.SIGSTOP):  # it ended: torch's DataLoader sees to it
            del watch.slots[slot.worker_id]
            return
        state = _settled(slot.process.pid)
        if state == "ended":
            del watch.slots[slot.worker_id]
            return
        if state == "running":  # not stopped in 5 s (in a disk wait, say): look again later
            _signal(slot.process, signal.SIGCONT)  # the stop may still be pending: cancel it
            slot.deadline = time.monotonic() + slot.timeout
            return
        watch.take_reports()
        if slot.worker_id not in watch.slots:  # it ran: only slow
            _signal(slot.process, signal.SIGCONT)
            return
        if slot.attempts >= ATTEMPTS:
            self._give_up(watch, slot, f"and {slot.attempts} started in its place did not either")
            return
        try:
            self._replace(iterator, slot)
        except Exception as error:  # a fork that failed (EAGAIN, ENOMEM), torch's internals
            self._give_up(watch, slot, f"and it cannot be started again ({error!r})")

    def _give_up(self, watch: _Watch, slot: _Slot, why: str) -> None:
        logger.error(
            "unidist: DataLoader worker %d (pid %d) did not start in %g s, %s; killing it, so "
            "the DataLoader fails on it instead of waiting forever. %s",
            slot.worker_id,
            slot.process.pid,
            slot.timeout,
            why,
            _HINT,
        )
        _signal(slot.process, signal.SIGKILL)
        replaced.append((slot.worker_id, slot.process.pid, None))  # the oldest drops out
        del watch.slots[slot.worker_id]

    def _replace(self, iterator: Any, slot: _Slot) -> None:
        stuck = slot.process
        args, kwargs = slot.made
        fresh = multiprocessing.context.ForkProcess(*args, **kwargs)
        fresh.daemon = stuck.daemon
        # The workers' stop signals as they are now (ResumableState may have added some since
        # this thread began): the new worker inherits them blocked, as the first one did.
        signal.pthread_sigmask(signal.SIG_BLOCK, slot.signums)
        fresh.start()
        replace_dataloader_worker(iterator, stuck, fresh)
        # No longer one of torch's, so its end is no failure. (torch's main thread looks at its
        # workers every 5 s; one that took the stuck worker from the list just before the swap
        # and asks it after this kill would call it dead: a window of microseconds.)
        _signal(stuck, signal.SIGKILL)
        stuck.join(_STOP_DEADLINE)
        replaced.append((slot.worker_id, stuck.pid, fresh.pid))  # the oldest drops out
        logger.warning(
            "unidist: DataLoader worker %d (pid %d) did not start in %g s: it is stuck before "
            "its first line, on a lock that another thread held when it was forked. Started "
            "worker %d again (pid %d); it reads the same batches. %s",
            slot.worker_id,
            stuck.pid,
            slot.timeout,
            slot.worker_id,
            fresh.pid,
            _HINT,
        )
        slot.process = fresh
        slot.attempts += 1
        slot.timeout *= 2
        slot.deadline = time.monotonic() + slot.timeout


def _signal(process: Any, signum: int) -> bool:
    """Signal a worker unless it has ended (its pid then may be another process's): sent?"""
    try:
        # WNOWAIT: the child stays waitable, for torch's SIGCHLD handler and its Process.
        if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return False  # ended, not yet reaped
        os.kill(process.pid, signum)
    except (ChildProcessError, ProcessLookupError):
        return False  # ended and reaped
    return True


_HINT = (
    f"HINT: this is CPython gh-112275 ({FORK_HEAD_LOCK.affected}), which a gloo thread meets: "
    "upgrade Python, or pass multiprocessing_context='forkserver' to the DataLoader; "
    "UNIDIST_WORKER_START_TIMEOUT sets the deadline (seconds; 0 turns the watch off)."
)


def _settled(pid: int) -> str:
    """'stopped', 'ended', or 'running' (not stopped within the deadline) after a SIGSTOP."""
    deadline = time.monotonic() + _STOP_DEADLINE
    pause = threading.Event()
    while time.monotonic() < deadline:
        try:
            # WNOWAIT: the child stays waitable, for torch's SIGCHLD handler and its Process.
            info = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "ended"
        if info is not None:
            return "stopped" if info.si_code == os.CLD_STOPPED else "ended"
        pause.wait(0.01)  # the kernel offers no event for "stopped" to wait on
    return "running"


_watcher = _Watcher()


def _after_fork_in_child() -> None:
    # A worker that makes loaders of its own watches them with a thread of its own: the copy it
    # got of this one has no thread, and its lock may have been held by one.
    global _watcher
    _watcher = _Watcher()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def watch(
    iterator: Any,
    fds: tuple[int, int],
    recorder: Recorder,
    timeout: float,
    signums: tuple[int, ...],
) -> None:
    """Watch the workers ``iterator`` forked through ``recorder`` (see the module docstring).

    ``signums``: the stop signals its workers start with blocked (a replacement too).
    """
    made = {id(process): (args, kwargs) for process, args, kwargs in recorder.made}
    deadline = time.monotonic() + timeout
    slots = {
        worker_id: _Slot(worker_id, process, made[id(process)], timeout, deadline, signums)
        for worker_id, process in enumerate(getattr(iterator, "_workers", ()))
        if id(process) in made
    }
    watch = _Watch(weakref.ref(iterator), fds[0], fds[1], slots)
    if slots:
        _watcher.add(watch)
    else:
        watch.close()
