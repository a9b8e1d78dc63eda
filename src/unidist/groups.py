"""Groups of ranks, and what every collective needs to know about one.

:func:`new_group` makes a :class:`Group` (with a gloo companion for control messages when the main
backend is not gloo); :func:`members` resolves ``group=`` arguments and refuses non-members.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from unidist import _state
from unidist.errors import ConfigurationError, translated

if TYPE_CHECKING:
    from unidist._state import Session

__all__ = ["Group", "fail", "members", "new_group", "to_seconds"]


@dataclass(frozen=True, eq=False)
class Group:
    """A group of ranks made by :func:`new_group`.

    Attributes:
        ranks: the global ranks in the group, sorted; group rank ``i`` is ``ranks[i]``.
        handle: the adapter's own handle for the group.
        control: the gloo group used for control messages (the handle itself when it is gloo).
    """

    ranks: tuple[int, ...]
    handle: Any
    control: Any

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return len(self.ranks)

    def __contains__(self, rank: object) -> bool:
        return rank in self.ranks

    def rank_of(self, global_rank: int) -> int | None:
        """The group rank of ``global_rank``, or None when it is not a member."""
        return self.ranks.index(global_rank) if global_rank in self.ranks else None


def members(s: Session, group: Group | None, what: str) -> tuple[int, Any, Any]:
    """(size, adapter handle, control handle) of ``group``; refuses non-members."""
    if group is None:
        return s.topology.world_size, None, s.control
    if s.topology.rank not in group.ranks:
        raise ConfigurationError(
            f"rank {s.topology.rank} called {what} on a group of ranks {list(group.ranks)} it is "
            "not in. HINT: only members call collectives on a group (test `rank in group`)."
        )
    return len(group.ranks), group.handle, group.control


def fail(exc: BaseException, what: str) -> BaseException:
    return translated(exc, what) or exc


def to_seconds(timeout: float | timedelta) -> float:
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if not isinstance(seconds, int | float) or not seconds > 0:
        raise ConfigurationError(f"timeout={timeout!r} must be a positive number of seconds.")
    return float(seconds)


def new_group(ranks: Sequence[int]) -> Group:
    """Create a group of global ranks. Every rank must call it, members or not (as in torch).

    Raises:
        ConfigurationError: ranks are not distinct integers within the world.
    """
    s = _state.session("new_group")
    world = s.topology.world_size
    chosen = tuple(sorted(set(ranks))) if _all_ints(ranks) else ()
    if not chosen or len(chosen) != len(ranks) or chosen[0] < 0 or chosen[-1] >= world:
        raise ConfigurationError(
            f"new_group(ranks={list(ranks)!r}) needs distinct integer ranks in 0..{world - 1}."
        )
    if world == 1:
        return Group(chosen, chosen, None)
    try:
        handle = s.adapter.new_group(chosen)
        control = handle
        if s.torch_backed and s.backend != "gloo":
            import torch.distributed as dist

            control = dist.new_group(ranks=list(chosen), backend="gloo", timeout=s.timeout)
    except RuntimeError as exc:
        raise fail(exc, f"new_group({list(chosen)})") from exc
    return Group(chosen, handle, control)


def _all_ints(values: Sequence[object]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)
