"""What the other threads of the launcher tell its supervisor (:mod:`.supervisor`).

The supervisor owns every fact the launcher holds about its ranks; the exit clock, the relay
and the main thread never change those facts, they post one of these values to its inbox.
Each is immutable and carries what the supervisor needs to act on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unidist.launch.supervise.notices import Failure

__all__ = ["Culprit", "Event", "Exited", "Finish", "Forward", "HangFlag", "Tick"]


@dataclass(frozen=True)
class Tick:
    """Nothing happened for an interval: look at the ranks again."""


@dataclass(frozen=True)
class Exited:
    """The exit clock saw the process of ``key`` (start index, rank) end at ``at_ns``."""

    key: tuple[int, int]
    at_ns: int


@dataclass(frozen=True)
class Forward:
    """A signal the launcher got (SIGUSR1, SIGUSR2) to pass on to every rank."""

    signum: int


@dataclass(frozen=True)
class Culprit:
    """The relay read the job's culprit in rendezvous round ``round``."""

    round: str
    failure: Failure


@dataclass(frozen=True)
class HangFlag:
    """The relay found the hang flag raised in round ``round``, by node ``node`` as the flag
    says (None: a value no launcher of the job writes, or, when not ``read``, a value the
    store did not hand over)."""

    round: str
    node: int | None
    read: bool = True


@dataclass(frozen=True)
class Finish:
    """The job ended: a last look at the ranks, the final sweep, then the supervisor stops."""


#: Any of them.
Event = Tick | Exited | Forward | Culprit | HangFlag | Finish
