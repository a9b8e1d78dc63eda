"""The owners' ``group=`` arguments as unidist Groups (src/unidist/compat/_groups.py).

Ignite's ``group=[0, 1]`` is made into a process group once per list and kept, and a torch
ProcessGroup that Composer's callers pass is wrapped once and kept. Those caches belong to the
session they were made in: ``unidist.finalize()`` destroys the groups made from lists and lets
go of the users' groups, so that after a re-initialize a list means a group of the new process
group, and no user group is held. The issue: "the rank-list and torch-group caches are never
cleared on ``finalize()``: after a re-initialize a rank list maps to a group of a destroyed
process group, and user process groups are never released."
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from unidist.collectives.groups import Group
from unidist.testing import run_distributed

pytestmark = pytest.mark.multiprocess


def _is_live(handle: Any) -> bool:
    """Whether ``handle`` is a group of the live process group (destroyed ones are not)."""
    import torch.distributed as dist

    try:
        dist.get_process_group_ranks(handle)
    except (ValueError, RuntimeError, KeyError):
        return False
    return True


def reduce_over_a_list_across_a_reinitialize() -> tuple[list[int], list[int], bool, bool]:
    import unidist
    import unidist.compat.ignite as idist
    from unidist.compat._groups import as_group

    rank = unidist.get_rank()
    before = idist.all_reduce(torch.tensor([rank + 1]), group=[0, 1])
    old = as_group([0, 1], "test", lists=True)
    unidist.finalize()
    unidist.initialize("gloo", timeout=20)
    after = idist.all_reduce(torch.tensor([rank + 10]), group=[0, 1])
    new = as_group([0, 1], "test", lists=True)
    assert isinstance(new, Group)
    return before.tolist(), after.tolist(), new is not old, _is_live(new.handle)


def test_a_rank_list_after_a_reinitialize_is_a_group_of_the_new_process_group() -> None:
    results = run_distributed(reduce_over_a_list_across_a_reinitialize, timeout=90)
    assert results == [([3], [21], True, True)] * 2


def finalize_with_a_group_unidist_did_not_start() -> tuple[bool, bool, int, int]:
    import torch.distributed as dist

    import unidist
    import unidist.compat.ignite as idist
    from unidist.compat import _groups, composer as cdist

    dist.init_process_group("gloo")  # the script's own group: unidist adopts it, and keeps it
    idist.all_reduce(torch.tensor([1]), group=[0, 1])
    made = _groups.as_group([0, 1], "test", lists=True)
    assert isinstance(made, Group)
    users = dist.new_group([0, 1])
    cdist.barrier(group=users)
    unidist.finalize()
    held = len(_groups._FROM_RANKS), len(_groups._FROM_TORCH)
    return _is_live(made.handle), _is_live(users), *held


def test_finalize_destroys_the_groups_made_from_lists_and_forgets_the_users_groups() -> None:
    # The process group is the script's, so finalize leaves it alive: the group made from
    # [0, 1] is unidist's own and is destroyed, the user's own group is the user's to destroy.
    results = run_distributed(finalize_with_a_group_unidist_did_not_start, init=False, timeout=90)
    assert results == [(False, True, 0, 0)] * 2
