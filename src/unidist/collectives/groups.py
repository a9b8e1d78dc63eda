"""Groups of ranks, and what every collective needs to know about one.

:func:`new_group` makes a :class:`Group` (with a gloo companion for control messages when the main
backend is not gloo); :func:`members` resolves ``group=`` arguments and refuses non-members.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unidist._base.migration import foreign_keywords
from unidist.errors import ConfigurationError, translate_errors
from unidist.session import lifecycle

if TYPE_CHECKING:
    from unidist.session.state import Session

__all__ = ["Group", "members", "new_group", "refuse_group"]


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


def refuse_group(group: object, what: str) -> ConfigurationError:
    """The error for a ``group=`` that is not a :class:`Group` (a ``ValueError``, as Ignite's)."""
    return ConfigurationError(
        f"{what}(group=...) takes a unidist.Group, got {type(group).__name__} {group!r:.80} "
        "(Ignite's group= also takes a list of ranks, Composer's a torch ProcessGroup). "
        "HINT: build it once with group = unidist.new_group(ranks) on every rank."
    )


def is_outsider(session: Session, group: Group | None, what: str) -> bool:
    """Whether this rank is not in ``group`` (after checking that ``group`` is a Group).

    The gathers and reductions give a non-member its own value back, as Ignite's and torch's
    do, so that code that calls them on every rank keeps working.
    """
    if group is None:
        return False
    if not isinstance(group, Group):
        raise refuse_group(group, what)
    return session.topology.rank not in group.ranks


def members(session: Session, group: Group | None, what: str) -> tuple[int, Any, Any]:
    """(size, adapter handle, control handle) of ``group``; refuses non-members."""
    if group is None:
        return session.topology.world_size, None, session.control
    if not isinstance(group, Group):
        raise refuse_group(group, what)
    if session.topology.rank not in group.ranks:
        raise ConfigurationError(
            f"rank {session.topology.rank} called {what} on a group of ranks {list(group.ranks)} "
            "it is not in. HINT: only members call collectives on a group (test `rank in group`)."
        )
    return len(group.ranks), group.handle, group.control


#: Keywords of torch's ``new_group`` that Ignite's ``new_group(ranks, **kwargs)`` passes on.
NEW_GROUP_KEYWORDS = (
    "timeout",
    "backend",
    "pg_options",
    "use_local_synchronization",
    "group_desc",
    "device_id",
    "sort_ranks",  # newer torch (not in 2.7)
)


@foreign_keywords(
    dict.fromkeys(
        NEW_GROUP_KEYWORDS,
        (
            "ignite.distributed.new_group (for torch.distributed.new_group)",
            "unidist's groups use the session's backend and timeout; give only the ranks",
        ),
    )
)
def new_group(ranks: Sequence[int]) -> Group:
    """Create a group of global ranks. Every rank must call it, members or not (as in torch).

    Raises:
        ConfigurationError: ranks are not distinct integers within the world.
    """
    session = lifecycle.session_for("new_group")
    world = session.topology.world_size
    if not isinstance(ranks, Sequence) or isinstance(ranks, str | bytes):
        raise ConfigurationError(
            f"new_group(ranks={ranks!r}) needs a list of distinct integer ranks in "
            f"0..{world - 1}, got {type(ranks).__name__}. HINT: new_group([{ranks!r}])."
        )
    chosen = tuple(sorted(set(ranks))) if _all_ints(ranks) else ()
    if not chosen or len(chosen) != len(ranks) or chosen[0] < 0 or chosen[-1] >= world:
        raise ConfigurationError(
            f"new_group(ranks={list(ranks)!r}) needs distinct integer ranks in 0..{world - 1}."
        )
    if world == 1:
        return Group(chosen, chosen, None)
    with translate_errors(f"new_group({list(chosen)})"):
        handle = session.comm.new_group(chosen)
        companion = session.comm.companion(chosen)  # a gloo group beside an NCCL one
    return Group(chosen, handle, handle if companion is None else companion)


def _all_ints(values: Sequence[object]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)
