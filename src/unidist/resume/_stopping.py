"""Stop signals: noted when they arrive, acted on at the next step boundary that all ranks agree on.

torch's elastic agent stops every rank with SIGTERM (SIGKILL 30 s later) when a node joins or
leaves, and schedulers do the same before preemption. A rank that dies at once loses the steps
since its last checkpoint; one that finishes its step first can save. Handlers run in the main
thread between bytecodes, so a handler only notes the signal; :class:`unidist.ResumableState`
asks every rank at each step whether any rank got one.

A rank that saved because of a signal leaves by that same signal, with its default action, so
its launcher, torch's agent and any scheduler see exactly what they would have seen without
unidist: a rank killed by SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any

from unidist.data import workers
from unidist.errors import ConfigurationError, translate_errors
from unidist.session import state as _state

if TYPE_CHECKING:
    from unidist.session.communicator import SideChannel

#: Seconds between looks at the flag while waiting for this rank's own signal.
_POLL = 0.05


def default_stop_signals() -> tuple[int, ...]:
    """SIGTERM, and SIGUSR1 (SLURM's warning before a job's time runs out) unless this
    process already handles it (a handler set from Python, or one that ignores it)."""
    found: list[int] = [signal.SIGTERM]
    if hasattr(signal, "SIGUSR1") and signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL:
        found.append(signal.SIGUSR1)
    return tuple(found)


class StopSignals:
    """While installed, the signals in ``signums`` set :attr:`received` instead of killing."""

    def __init__(self, signums: Iterable[int]) -> None:
        self.signums = tuple(signal.Signals(s) for s in signums)
        self.received = 0  # the first stop signal's number, 0 while none came
        self.received_at: float | None = None  # when (monotonic)
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if not self.signums or self._previous:
            return
        if threading.current_thread() is not threading.main_thread():
            names = ", ".join(s.name for s in self.signums)
            raise ConfigurationError(
                f"ResumableState listens for {names} to save before the launcher stops the "
                "job, and Python lets only the main thread set signal handlers. HINT: create it "
                "in the main thread, or pass stop_signals=() to save only every save_every steps."
            )
        for signum in self.signums:
            self._previous[signum] = signal.signal(signum, self._note)
            workers.STOP_SIGNALS.add(signum)  # a loader's workers leave it to this rank

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if not self.received:
            self.received, self.received_at = signum, time.monotonic()

    def elapsed(self) -> float:
        """Seconds since this rank's stop signal (0 if none came: another rank's stop)."""
        return 0.0 if self.received_at is None else time.monotonic() - self.received_at

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def wait(self, timeout: float) -> int:
        """This rank's own stop signal, waited for up to ``timeout`` seconds (0 if none came)."""
        deadline = time.monotonic() + timeout
        while not self.received and time.monotonic() < deadline:
            time.sleep(_POLL)
        return self.received

    def leave(self, signum: int) -> None:
        """End this process by ``signum`` with its default action, as if no handler was set."""
        self.restore()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the signal ends the process; a signal that does not is an exit status
        raise SystemExit(128 + signum)


class StopVote:
    """Whether any rank got a stop signal: a two-integer MAX all-reduce, now and then.

    Asking at every step would cost a small step 7 % (a gloo all-reduce is hundreds of microseconds
    of CPU), so the ranks ask about twice a second (:data:`PERIOD`): each vote carries the flag
    and how many steps each rank proposes until the next vote (``PERIOD`` over its measured
    step time; the smallest proposal wins), so every rank knows at which step the next vote
    is, without asking. A vote runs in the background and is read at the next one, so a step
    never waits for the network, and every rank reads the same verdict at the same step: a
    signal stops the job within two vote intervals, about a second, at one step on every rank.

    It runs on the communicator's side channel (a gloo group of its own, see
    :class:`unidist.session.communicator.SideChannel`). One rank alone, or no torch process group,
    has nothing to ask: its own flag is the verdict at once.
    """

    #: Seconds of training between votes that the ranks aim for.
    PERIOD = 0.5
    #: Most steps between two votes, however short the steps.
    MAX_INTERVAL = 10_000

    def __init__(self) -> None:
        self._live = False
        self._channel: SideChannel | None = None
        self._work: Any = None
        self._flags: tuple[Any, Any] = (None, None)
        self._turn = 0
        self._next = 1  # the step at which the next vote is cast, the same on every rank
        self._last: tuple[int, float] | None = None  # (step, time) of this rank's last vote

    def start(self) -> None:
        """Make the vote's group (collective: every rank calls it at the same point)."""
        session = _state.published()
        if session is None:
            return
        self._channel = session.comm.side_channel("ResumableState's stop vote")
        if self._channel is None:  # one rank, or no torch process group: its own flag decides
            return
        import torch

        self._flags = (torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
        self._live = True

    def cast(self, step: int, flag: int) -> int:
        """At ``step``: the verdict of the last vote (0: nobody was signalled) when a vote is
        due, sending this rank's ``flag`` in the next one; 0 between votes."""
        if not self._live:
            return flag
        if step < self._next:
            return 0
        assert self._channel is not None
        verdict, interval = 0, 1
        now = time.monotonic()
        with translate_errors("ResumableState's stop vote (an all_reduce of two integers)"):
            if self._work is not None:
                self._work.wait()
                verdict = int(self._flags[self._turn][0])
                interval = -int(self._flags[self._turn][1])
            self._turn ^= 1  # two buffers: one is read while the other is in flight
            buffer = self._flags[self._turn]
            buffer[0] = flag
            buffer[1] = -self._proposal(step, now)
            self._work = self._channel.max_started(buffer)
        self._next = step + max(1, min(interval, self.MAX_INTERVAL))
        self._last = (step, now)
        return verdict

    def settle(self, step: int, flag: int) -> int:
        """At ``step``, which every rank reaches at the same point of its loop (an epoch's end):
        whether any rank has been signalled, asked now and waited for (the vote in flight
        included). The schedule starts again from here."""
        if not self._live:
            return flag
        import torch

        assert self._channel is not None
        verdict = 0
        with translate_errors("ResumableState's stop vote (an all_reduce of two integers)"):
            if self._work is not None:
                work, self._work = self._work, None
                work.wait()
                verdict = int(self._flags[self._turn][0])
            now = torch.tensor([flag, -1], dtype=torch.int64)
            self._channel.max(now)
        self._next = step + 1
        return max(verdict, int(now[0]))

    def agree(self, flag: int) -> int:
        """The smallest ``flag`` of every rank, asked now and waited for (a stop's decision)."""
        if not self._live:
            return flag
        import torch

        assert self._channel is not None
        with translate_errors("ResumableState's stop vote (an all_reduce of one integer)"):
            if self._work is not None:  # the vote in flight first: one collective at a time
                work, self._work = self._work, None
                work.wait()
            value = torch.tensor([-flag], dtype=torch.int64)
            self._channel.max(value)
        return -int(value[0])

    def _proposal(self, step: int, now: float) -> int:
        """Steps until the vote after the next one, as this rank would have it."""
        if self._last is None or step <= self._last[0] or now <= self._last[1]:
            return 1
        per_step = (now - self._last[1]) / (step - self._last[0])
        return max(1, min(self.MAX_INTERVAL, int(self.PERIOD / per_step)))

    def finish(self, timeout: float) -> None:
        """Let the vote in flight complete (every rank sent it), so none is left queued."""
        work, self._work = self._work, None
        if work is not None:
            with contextlib.suppress(Exception):  # a peer that is gone has its own error
                work.wait(timeout=timedelta(seconds=timeout))
