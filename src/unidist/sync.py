"""Waits that involve every rank: barriers (optionally with their own deadline) and exchanges.

Waits with a deadline go through unidist's control store (:mod:`unidist._control`): a collective
cannot be abandoned cleanly, a store wait can, and the missing keys name the missing ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from unidist import _state, collectives
from unidist.groups import Group, fail, members, to_seconds

if TYPE_CHECKING:
    from unidist._state import Session

__all__ = ["barrier", "exchange", "timed_barrier"]


def barrier(timeout: float | timedelta | None = None, *, group: Group | None = None) -> None:
    """Wait until every rank of the group arrives.

    Args:
        timeout: seconds to wait. ``None`` waits as long as the process group's timeout (the
            ``timeout`` given to :func:`unidist.initialize`). With a timeout, the error names the
            ranks that did not arrive.
        group: synchronise this group instead of the whole world.

    Raises:
        DistributedTimeoutError: not every rank arrived in time.
    """
    s = _state.session("barrier")
    size, handle, _ = members(s, group, "barrier")
    if timeout is not None:
        to_seconds(timeout)
    if size == 1:
        return
    if timeout is None:
        try:
            s.adapter.barrier(handle)
        except RuntimeError as exc:
            raise fail(exc, f"barrier over {size} ranks") from exc
        return
    timed_barrier(s, group, timeout, f"barrier over {size} ranks")


def timed_barrier(s: Session, group: Group | None, timeout: float | timedelta, what: str) -> None:
    """A barrier that gives up after ``timeout`` on every rank and names the missing ranks.

    It goes through unidist's control store (see :mod:`unidist._control`): a collective cannot
    be abandoned cleanly, a store wait can. Without a control store (an adapter that is not
    built on torch.distributed) it is the adapter's barrier, bounded by the session timeout.
    """
    seconds = to_seconds(timeout)
    if s.plane is None:
        try:
            s.adapter.barrier(group.handle if group is not None else None)
        except RuntimeError as exc:
            raise fail(exc, what) from exc
        return
    members = group.ranks if group is not None else range(s.topology.world_size)
    s.plane.barrier(tuple(members), seconds, what)


def exchange(
    value: object,
    publish: bool,
    wait_for: Sequence[int],
    timeout: float | timedelta | None,
    what: str,
) -> dict[int, object]:
    """Every rank calls it: publishers send ``value``; each rank gets the values of ``wait_for``.

    The waiting ranks give up after ``timeout`` (default: the session timeout) with an error
    that names the ranks they waited for. Used by one_rank_first and one_rank_only.
    """
    s = _state.session(what)
    seconds = to_seconds(timeout if timeout is not None else s.timeout)
    if s.plane is not None:
        return s.plane.exchange(
            tuple(range(s.topology.world_size)), value, publish, wait_for, seconds, what
        )
    everyone = collectives.all_gather_object((publish, value if publish else None))
    return {rank: everyone[rank][1] for rank in wait_for}
