"""Waits that involve every rank: barriers (optionally with their own deadline), agreements, flags.

Each goes through the session's communicator (:mod:`unidist.session.communicator`), chosen once
by :func:`unidist.initialize`: on torch.distributed, unidist's control store
(:mod:`unidist.session.control`; a collective cannot be abandoned cleanly, a store wait can, and
the arrivals recorded so far name the missing ranks; each costs every rank a few store
operations whatever the world size). Features above (one-rank helpers, the microbatch vote) use
these, never the store itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from unidist.collectives.groups import Group, members
from unidist.environments import variables as _env
from unidist.errors import ConfigurationError
from unidist.session import lifecycle
from unidist.session.communicator import ExpectedValues
from unidist.session.wire import Json

if TYPE_CHECKING:
    from unidist.session.state import Session

__all__ = ["ExpectedValues", "Flag", "agree", "barrier", "exchange", "timed_barrier"]


def barrier(timeout: float | timedelta | None = None, *, group: Group | None = None) -> None:
    """Wait until every rank of the group arrives.

    Args:
        timeout: seconds to wait. ``None`` waits as long as the process group's timeout (the
            ``timeout`` given to :func:`unidist.initialize`). With a timeout, the error names the
            ranks that did not arrive.
        group: synchronise this group instead of the whole world.

    Raises:
        ConfigurationError: a timeout that is no number of seconds or timedelta (a group passed
            first, as torch's and Composer's ``barrier(group)`` take it).
        DistributedTimeoutError: not every rank arrived in time.
    """
    if timeout is not None and not isinstance(timeout, int | float | timedelta):
        raise ConfigurationError(
            f"barrier({timeout!r}): unidist.barrier's first argument is the timeout in seconds; "
            "torch's and Composer's barrier take the group first. HINT: pass the group by "
            "keyword, barrier(group=unidist.new_group(ranks))."
        )
    session = lifecycle.session_for("barrier")
    size, handle, _ = members(session, group, "barrier")
    if timeout is not None:
        _env.timeout_seconds(timeout)
    if size == 1:
        return
    if timeout is None:  # the adapter's own barrier, bounded by the process group's timeout
        session.comm.barrier(range(size), handle, None, f"barrier over {size} ranks")
        return
    timed_barrier(session, group, timeout, f"barrier over {size} ranks")


def timed_barrier(
    session: Session, group: Group | None, timeout: float | timedelta, what: str
) -> None:
    """A barrier that gives up after ``timeout`` on every rank and names the missing ranks.

    It goes through the session's communicator (:mod:`unidist.session.communicator`): over
    unidist's control store where there is one (a collective cannot be abandoned cleanly, a
    store wait can); under an adapter that is not built on torch.distributed it is the
    adapter's barrier, bounded by the session timeout.
    """
    seconds = _env.timeout_seconds(timeout)
    ranks = group.ranks if group is not None else range(session.topology.world_size)
    handle = group.handle if group is not None else None
    session.comm.barrier(tuple(ranks), handle, seconds, what)


def exchange(
    value: Json,
    *,
    publish: bool,
    wait_for: Sequence[int],
    timeout: float | timedelta | None,
    what: str,
) -> dict[int, Json]:
    """Every rank calls it: publishers send ``value``; each rank gets the values of ``wait_for``.

    It is an :func:`agree`: every rank waits until all have arrived (a publisher too), and each
    gets every published value, so publish from a few ranks only. Values are plain JSON data
    (``None``, bools, numbers, strings, lists, dicts with string keys; tuples come back as
    lists), encoded as JSON on every path and never pickled. The ranks give up after ``timeout``
    (default: the session timeout) with an error that names the ranks that did not arrive. Used
    by one_rank_first and one_rank_only.
    """
    session = lifecycle.session_for(what)
    seconds = _env.timeout_seconds(timeout if timeout is not None else session.timeout)
    world = tuple(range(session.topology.world_size))
    return session.comm.exchange(
        world, value, publish=publish, wait_for=wait_for, seconds=seconds, what=what
    )


def agree(
    value: Json,
    combine: Callable[[dict[int, Json]], Json],
    timeout: float | timedelta | None,
    what: str,
    expected: ExpectedValues | None = None,
) -> Json:
    """Every rank contributes ``value``; every rank gets ``combine({rank: value, ...})``.

    The agreement behind the microbatch vote: it costs each rank a few store operations however
    many ranks there are. ``combine`` must be a pure function of its argument (it runs on one
    rank, the last to arrive, on the control store; without a control store, on every rank);
    its result reaches every rank, so every rank decides the same. Values and the result are
    plain JSON data, at most 64 KiB and 1 MiB. The ranks give up after ``timeout`` (default:
    the session timeout) with an error that names the ranks that did not arrive. ``expected``
    (equal on every rank) names the value each rank sends when nothing happened: when every
    rank sent it, the last rank combines without reading the values (see
    :class:`~unidist.session.control.ExpectedValues`).
    """
    session = lifecycle.session_for(what)
    seconds = _env.timeout_seconds(timeout if timeout is not None else session.timeout)
    world = tuple(range(session.topology.world_size))
    return session.comm.agree(world, value, combine, seconds, what, expected)


class Flag:
    """A flag that any rank raises and every rank looks at without waiting (on the control store).

    Each rank builds it from the same parts (``Flag(session, "microbatch", 3, 7)``), so they all
    name the same key. Without a control store (an adapter that is not built on
    torch.distributed) or in a single process there is nothing to look at: :attr:`usable` is
    False, :meth:`is_raised` is always False and the other methods do nothing.
    """

    def __init__(self, session: Session, *parts: object) -> None:
        self.name = "/".join(str(part) for part in parts)
        self._signal = session.comm.signal(self.name)

    @property
    def usable(self) -> bool:
        """Whether other ranks can see this flag."""
        return self._signal.usable

    def raise_flag(self) -> None:
        """Raise the flag (visible to every rank at once; it never waits)."""
        self._signal.raise_flag()

    def is_raised(self) -> bool:
        """Whether some rank raised the flag (one store round trip; never waits)."""
        return self._signal.is_raised()

    def lower(self) -> None:
        """Delete the flag (call it once no rank can still be looking at it)."""
        self._signal.lower()
