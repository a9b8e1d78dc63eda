"""The owners' ``group=`` arguments (a list of ranks, a torch ProcessGroup) as unidist Groups.

Both kinds are kept for the session they were made in: when it ends (``unidist.finalize()``),
the groups made from lists are destroyed and the users' groups let go, so a list given after a
re-initialize makes a group of the new process group.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch.distributed as dist

import unidist
from unidist.collectives.groups import Group
from unidist.session import state as _state

__all__ = ["as_group", "remember"]

#: Groups made from Ignite's lists of ranks, by ranks: Ignite makes a new process group at
#: every call; one per list is the same collective contract (every rank passes the same list)
#: without a process group leaked per call.
_FROM_RANKS: dict[tuple[int, ...], Any] = {}
#: unidist Groups wrapping torch ProcessGroups the user made (Composer passes those), and those
#: Ignite's ``new_group`` gave out (:func:`remember`), by the torch group's id.
_FROM_TORCH: dict[int, tuple[Any, Group]] = {}


def as_group(group: object, what: str, *, lists: bool) -> Group | list[int] | None:
    """``group`` as a unidist :class:`~unidist.collectives.groups.Group` (None for the world).

    Takes a unidist Group, a torch ``ProcessGroup`` and, when ``lists`` (Ignite), a list of
    integer ranks; in one process a list stays a list, as in Ignite's serial model.

    Raises:
        ValueError: anything else (Ignite's type and wording), or a non-gloo torch group
            (unidist sends its control messages over gloo; build it with ``unidist.new_group``).
    """
    if group is None or isinstance(group, Group):
        return group
    if lists and isinstance(group, list):
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in group):
            raise _refuse(group, what, lists)
        if unidist.get_world_size() == 1:
            return group
        key = tuple(group)
        if key not in _FROM_RANKS:
            _FROM_RANKS[key] = unidist.new_group(group)
        made: Group = _FROM_RANKS[key]
        return made
    kept = _FROM_TORCH.get(id(group))
    if kept is not None and kept[0] is group:
        return kept[1]
    if isinstance(group, dist.ProcessGroup):
        return _from_torch(group, what)
    raise _refuse(group, what, lists)


def remember(group: Group) -> Any:
    """``group``'s torch handle, to give out where the owner gives a ProcessGroup; ``group=``
    turns it back into ``group`` (a non-member's handle is torch's non-member sentinel)."""
    _FROM_TORCH[id(group.handle)] = (group.handle, group)
    return group.handle


def _from_torch(group: Any, what: str) -> Group:
    backend = dist.get_backend(group)
    if backend != "gloo":
        raise ValueError(
            f"{what}(group=...) got a torch ProcessGroup on {backend}; unidist needs a gloo "
            "companion for its control messages, which only unidist.new_group(ranks) builds. "
            "HINT: make the group with unidist.new_group(ranks) (every rank calls it)."
        )
    ranks = tuple(sorted(dist.get_process_group_ranks(group)))
    made = Group(ranks, group, group)
    _FROM_TORCH[id(group)] = (group, made)
    return made


def _refuse(group: object, what: str, lists: bool) -> ValueError:
    takes = "list of int or ProcessGroup" if lists else "a torch ProcessGroup"
    return ValueError(
        f"Argument group should be {takes}, got {type(group)}, group={group!r:.80} (in {what}; "
        "a unidist Group works too). HINT: group=unidist.new_group(ranks), built on every rank."
    )


def _end_of_session() -> None:
    """Destroy the groups made from lists (nobody else holds them) and let go of the others.

    A session of a process group that unidist did not start leaves that group alive, so the
    groups made from lists would live on with it; the users' own groups are theirs to destroy.
    """
    made = list(_FROM_RANKS.values())
    _FROM_RANKS.clear()
    _FROM_TORCH.clear()
    for group in made:
        for handle in {id(h): h for h in (group.handle, group.control)}.values():
            if isinstance(handle, dist.ProcessGroup):
                # Already gone with the whole process group, or never registered: the session
                # ends regardless (a callback of the teardown must not raise).
                with contextlib.suppress(Exception):
                    dist.destroy_process_group(handle)


_state.at_session_end(_end_of_session)
