"""What the launcher's supervisor knows of each rank: one state, moved by one transition function.

The supervisor (:class:`unidist.launch.supervise.supervisor.Supervisor`) looks at every rank of
the latest start a few times per torch agent interval and reports what it sees as sightings;
:func:`advance` is the only code that changes a rank's :class:`RankWatch`. The culprit report
(:mod:`unidist.launch.supervise.report`) is built from these states and the ranks' own error
files. The states, and how a rank moves::

    RUNNING ── exited ──> FINISHED (status 0 or a done record)
       │                  FAILED   (an error file, or a non-zero status)
       │                  EXITED   (status unknown: torch's agent reaped it first; no record)
       ├── stop ──> STOPPING ── exited ──> STOPPED   (the launcher's SIGTERM, another rank failed)
       └── overdue ──> OVERDUE ── exited ──> OVERDUE (killed: not finished exit_timeout
                                                      after another rank finished)

Each event also records its facts (times in ns, the exit status, frozen or not), so the report
can order what happened; a rank seen gone takes no further event.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field

from unidist.launch.supervise.outcome import RankOutcome

__all__ = ["Observed", "RankState", "RankWatch", "Sighting", "advance"]


class RankState(enum.Enum):
    """Where one rank is, as the supervisor saw it (see the module docstring for the moves)."""

    RUNNING = "running"
    STOPPING = "stopping"  # sent SIGTERM by the launcher, not yet seen gone
    OVERDUE = "overdue"  # killed for not finishing exit_timeout after another rank finished
    FINISHED = "finished"
    FAILED = "failed"
    EXITED = "exited"  # gone, status unknown, nothing recorded
    STOPPED = "stopped"  # gone after the launcher's SIGTERM


class Sighting(str, enum.Enum):
    """What the supervisor saw happen to a rank: the input of :func:`advance`."""

    RUNNING = "running"  # seen running
    EXITED = "exited"  # seen gone (with its status and records)
    STOP = "stop"  # the launcher sent it SIGTERM
    OVERDUE = "overdue"  # killed for not finishing in time


#: The states of a rank that the supervisor has not yet seen gone.
LIVE = (RankState.RUNNING, RankState.STOPPING, RankState.OVERDUE)


@dataclass
class RankWatch:
    """One rank: its state and the facts behind it (times in ns since the epoch)."""

    state: RankState = RankState.RUNNING
    alive_at: int | None = None  # the last sweep that saw it running started then
    gone_at: int | None = None  # first seen exited
    status: int | None = None  # exit status (-N: signal N), if known
    failed_exit: bool = False  # exited with an error file or a non-zero status
    stopped_at: int | None = None  # the launcher sent SIGTERM
    frozen: bool = False  # in state T (SIGSTOP, a debugger) when the launcher stopped it
    overdue_at: int | None = None  # killed for not finishing in time

    @property
    def gone(self) -> bool:
        return self.gone_at is not None

    @property
    def terminated(self) -> bool:
        """Ended by a SIGTERM the launcher did not send: torch's agent stopping it (a node
        joined or left, or the agent's own stop), or someone else. Its agent, not the
        supervisor, decides what follows: a restart with the new nodes, or the job's end."""
        return self.gone and self.status == -signal.SIGTERM and self.stopped_at is None


def advance(
    watch: RankWatch,
    event: Sighting | str,
    at: int,
    *,
    status: int | None = None,
    failed: bool = False,
    finished: bool = False,
    frozen: bool = False,
) -> None:
    """Apply one event the supervisor saw to ``watch``.

    Args:
        watch: the rank's state, changed in place.
        event: :attr:`Sighting.RUNNING` (seen running at ``at``),
            :attr:`Sighting.EXITED` (seen gone, with ``status``, and whether its records say it
            ``failed`` or ``finished``), :attr:`Sighting.STOP` (the launcher sent SIGTERM;
            ``frozen``: the rank was in state T) or :attr:`Sighting.OVERDUE` (killed for not
            finishing in time); or its value.
        at: when, in ns since the epoch.

    Raises:
        ValueError: an unknown event.
    """
    try:
        event = Sighting(event)
    except ValueError:
        raise ValueError(f"unknown supervisor event {event!r}") from None
    if event is Sighting.RUNNING:
        watch.alive_at = at
    elif event is Sighting.EXITED:
        if watch.gone:
            return  # the first sighting counts
        watch.gone_at, watch.status, watch.failed_exit = at, status, failed
        if watch.state is RankState.STOPPING:
            watch.state = RankState.STOPPED
        elif watch.state is RankState.RUNNING:
            watch.state = (
                RankState.FAILED if failed else RankState.FINISHED if finished else RankState.EXITED
            )
    elif watch.gone:  # a stop or a hang
        return  # too late: the launcher stops or kills only ranks it has not seen gone
    elif event is Sighting.STOP:
        watch.stopped_at, watch.frozen = at, frozen
        if watch.state is RankState.RUNNING:
            watch.state = RankState.STOPPING
    else:  # Sighting.OVERDUE
        watch.overdue_at = at
        if watch.state in (RankState.RUNNING, RankState.STOPPING):
            watch.state = RankState.OVERDUE


@dataclass
class Observed:
    """What the launcher's supervisor saw of the latest start: one :class:`RankWatch` per rank."""

    ranks: dict[int, RankWatch] = field(default_factory=dict)  # global rank -> its watch
    remote: RankOutcome | None = None  # the culprit on another node, as its launcher said

    def watch(self, rank: int) -> RankWatch:
        """``rank``'s watch (a new one, RUNNING, the first time)."""
        return self.ranks.setdefault(rank, RankWatch())

    def get(self, rank: int) -> RankWatch:
        """``rank``'s watch, or a blank one (not stored) for a rank never seen."""
        return self.ranks.get(rank) or RankWatch()

    @property
    def failed(self) -> set[int]:
        """Ranks that exited with an error file or a non-zero status."""
        return {rank for rank, w in self.ranks.items() if w.failed_exit}

    @property
    def failed_on_their_own(self) -> set[int]:
        """:attr:`failed`, less the ranks :attr:`RankWatch.terminated` by a SIGTERM from outside.

        These are what the supervisor acts on (stopping the survivors, telling other nodes).
        torch's agent SIGTERMs every rank when a node joins; acting on that as a failure would
        make the other nodes' launchers stop their ranks before their own agents see the new
        node, and fail a job that torchrun carries on.
        """
        return {rank for rank, w in self.ranks.items() if w.failed_exit and not w.terminated}
