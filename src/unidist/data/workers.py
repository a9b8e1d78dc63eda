"""DataLoader workers leave stop signals to their rank, so the rank can finish its step and save.

torch's elastic agent stops a rank by signalling its whole process group (``os.killpg``), and
SLURM signals every process of a job step: a rank's DataLoader workers get the SIGTERM too. torch
installs a SIGTERM handler in each worker that ends it, so the worker dies first and the rank,
busy finishing its step, raises "DataLoader worker (pid N) is killed by signal: Terminated"
before it can save. The stop was meant for the rank.

unidist's loaders (:class:`unidist.StatefulDataLoader`, what :func:`unidist.auto_dataloader`
returns) start their workers with the stop signals blocked (:func:`starting_workers`, in the
thread that forks them, so none can arrive before the worker is ready), and each worker takes
them on a thread of its own (``sigwaitinfo``), which knows who sent them:

* from the rank itself (torch's own ``worker.terminate()`` when a worker will not end): the worker
  leaves at once, as torch's handler has it leave;
* from anyone else (the agent, the scheduler, a terminal): the signal is the rank's to act on,
  and the worker goes on serving batches until its rank ends it, or dies with it: a worker
  started from the main thread asks the kernel for SIGKILL when its rank exits
  (``PR_SET_PDEATHSIG``), so none is left behind when a rank that saved leaves by its signal.

The data is the same, batch for batch: only what a signal does to a worker changes. Workers
started by the ``fork`` method (Linux's default) get the signals blocked from their first
instruction; with ``spawn`` and ``forkserver`` a signal that arrives before the worker's init
function runs still ends it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from unidist.data import _forks as forks
from unidist.environments.parse import worker_start_timeout

T = TypeVar("T")

#: Signals a rank may be told to stop by: torch's agent (SIGTERM), a terminal (SIGINT), SLURM's
#: ``--signal`` (SIGUSR1/SIGUSR2 by convention). ResumableState adds the ones it listens to.
STOP_SIGNALS: set[int] = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2}
if hasattr(signal, "SIGRTMIN"):  # unidist launch's stack-dump signal, should it reach a group
    STOP_SIGNALS.add(int(signal.SIGRTMIN) + 6)

_PR_SET_PDEATHSIG = 1


def supported() -> bool:
    return hasattr(signal, "pthread_sigmask") and hasattr(signal, "sigwaitinfo")


class WorkerInit:
    """The ``worker_init_fn`` that unidist's loaders give their workers (wrapping the user's)."""

    def __init__(
        self,
        inner: Callable[[int], Any] | None,
        signums: tuple[int, ...],
        rank_pid: int,
        die_with_rank: bool,
        report_to: tuple[int, int, int] | None = None,
    ) -> None:
        self.inner = inner
        self.signums = signums
        self.rank_pid = rank_pid
        self.die_with_rank = die_with_rank
        #: The pipe a forked worker says it runs on (:mod:`unidist.data._forks`).
        self.report_to = report_to

    def __call__(self, worker_id: int) -> None:
        if self.report_to is not None:
            forks.report(self.report_to, worker_id)
        leave_to_rank(self.signums, self.rank_pid, die_with_rank=self.die_with_rank)
        if self.inner is not None:
            self.inner(worker_id)


def leave_to_rank(signums: tuple[int, ...], rank_pid: int, *, die_with_rank: bool) -> None:
    """In a worker: take ``signums`` on a thread of our own (see the module's docstring)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signums)  # already so when forked; not if spawned
    if die_with_rank and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != rank_pid:  # the rank died before the request took hold
            os._exit(0)
    thread = threading.Thread(
        target=_answer, args=(signums, rank_pid), name="unidist-stop-signals", daemon=True
    )
    thread.start()


def _answer(signums: tuple[int, ...], rank_pid: int) -> None:
    while True:
        info = signal.sigwaitinfo(signums)
        if info.si_pid == rank_pid:
            os._exit(0)  # the rank ends its own worker: torch's handler does the same


def _same(iterator: T) -> T:
    return iterator


@contextlib.contextmanager
def starting_workers(loader: Any) -> Iterator[Callable[[T], T]]:
    """While ``loader`` makes its iterator: stop signals blocked here, the init function wrapped.

    A stop signal that arrives meanwhile waits until the workers exist, then reaches this rank
    as usual; each worker inherits the blocked signals and takes them on its own thread.
    Yields ``started``: pass it the iterator made, and the workers it forked are watched until
    each runs, on a Python with CPython gh-112275 (:mod:`unidist.data._forks`).

    Raises:
        ConfigurationError: ``UNIDIST_WORKER_START_TIMEOUT`` is not a number of seconds.
    """
    if not supported() or not getattr(loader, "num_workers", 0):
        yield _same
        return
    signums = tuple(sorted(STOP_SIGNALS))
    original, context = loader.worker_init_fn, loader.multiprocessing_context
    timeout = worker_start_timeout() if forks.watched(loader) else None
    fds = forks.report_fds() if timeout else None
    recorder = forks.Recorder()
    main = threading.current_thread() is threading.main_thread()
    pipe = None if fds is None else forks.report_to(fds)
    loader.worker_init_fn = WorkerInit(original, signums, os.getpid(), main, pipe)
    if fds is not None:
        loader.multiprocessing_context = recorder  # the fork context, keeping each worker's making

    watched = False

    def started(iterator: T) -> T:
        nonlocal watched
        if fds is not None and timeout:
            watched = True
            forks.watch(iterator, fds, recorder, timeout, signums)
        return iterator

    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield started
    finally:
        loader.worker_init_fn = original
        if fds is not None:
            loader.multiprocessing_context = context
            if not watched:  # no iterator was made (an error): nobody will read the pipe
                for fd in fds:
                    os.close(fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
