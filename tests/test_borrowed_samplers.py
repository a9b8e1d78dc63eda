"""Borrowed sampler names give the owner's indices: torch's, Composer's and Ignite's samplers.

A script ported by renaming (``torch.utils.data.DistributedSampler`` -> ``unidist.
DistributedSampler``, Composer's ``dist.get_sampler`` -> ``unidist.get_sampler``, Ignite's
``idist.auto_dataloader`` -> ``unidist.auto_dataloader``) must read exactly the same samples,
epoch by epoch, including when it iterates again without ``set_epoch``. Each test compares
with the installed original, not with our reading of its documentation.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from hypothesis import given, settings, strategies as st

import unidist
from unidist.session import state as _state

LENGTHS = st.integers(0, 300)
WORLDS = st.integers(1, 6)
SEEDS = st.integers(0, 2**31)


def _torch_shards(
    length: int, world: int, epochs: list[int | None], **kw: Any
) -> list[list[list[int]]]:
    """Per rank, the indices of each pass; ``None`` in ``epochs``: iterate without set_epoch."""
    out = []
    for rank in range(world):
        sampler = torch.utils.data.DistributedSampler(
            range(length), num_replicas=world, rank=rank, **kw
        )
        out.append(_passes(sampler, epochs))
    return out


def _passes(sampler: Any, epochs: list[int | None]) -> list[list[int]]:
    passes = []
    for epoch in epochs:
        if epoch is not None:
            sampler.set_epoch(epoch)
        passes.append(list(sampler))
    return passes


EPOCH_PLANS = st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(LENGTHS, WORLDS, st.booleans(), SEEDS, st.booleans(), EPOCH_PLANS)
def test_distributed_sampler_renamed_from_torch_gives_torch_indices(
    length: int, world: int, shuffle: bool, seed: int, drop_last: bool, epochs: list[int | None]
) -> None:
    kw = dict(shuffle=shuffle, seed=seed, drop_last=drop_last)
    expected = _torch_shards(length, world, epochs, **kw)
    for rank in range(world):
        ours = unidist.DistributedSampler(range(length), num_replicas=world, rank=rank, **kw)
        assert _passes(ours, epochs) == expected[rank]
        assert len(ours) == len(expected[rank][-1])
    # torch's positional order works too: (dataset, num_replicas, rank, shuffle, seed, drop_last)
    positional = unidist.DistributedSampler(range(length), world, 0, shuffle, seed, drop_last)
    assert _passes(positional, epochs) == expected[0]


def test_peeking_at_the_first_index_does_not_shift_the_order() -> None:
    ours = unidist.DistributedSampler(range(40), num_replicas=2, rank=1)
    theirs = torch.utils.data.DistributedSampler(range(40), num_replicas=2, rank=1)
    assert next(iter(ours)) == next(iter(theirs))
    assert list(ours) == list(theirs)
    assert list(ours) == list(theirs)


def test_num_replicas_and_world_size_are_one_setting() -> None:
    with pytest.raises(unidist.ConfigurationError, match="pass only one of them"):
        unidist.DistributedSampler(10, num_replicas=2, world_size=2, rank=0)


@pytest.mark.composer
@settings(max_examples=40, deadline=None)
@given(LENGTHS, WORLDS, st.booleans(), SEEDS, st.booleans(), EPOCH_PLANS)
def test_get_sampler_renamed_from_composer_gives_composer_indices(
    length: int, world: int, shuffle: bool, seed: int, drop_last: bool, epochs: list[int | None]
) -> None:
    from composer.utils import dist

    kw = dict(shuffle=shuffle, seed=seed, drop_last=drop_last)
    for rank in range(world):
        theirs = dist.get_sampler(range(length), num_replicas=world, rank=rank, **kw)
        ours = unidist.get_sampler(range(length), num_replicas=world, rank=rank, **kw)
        assert _passes(ours, epochs) == _passes(theirs, epochs)
    # Composer's default is no shuffle; ours too.
    theirs = dist.get_sampler(range(length), num_replicas=world, rank=0)
    ours = unidist.get_sampler(range(length), num_replicas=world, rank=0)
    assert list(ours) == list(theirs)


def _batches(loader: Any, epochs: list[int | None]) -> list[list[int]]:
    passes = []
    for epoch in epochs:
        if epoch is not None:
            loader.sampler.set_epoch(epoch)
        passes.append([int(i) for batch in loader for i in batch])
    return passes


@pytest.mark.ignite
@pytest.mark.parametrize(("world", "rank"), [(2, 0), (2, 1), (3, 2)])
@pytest.mark.parametrize("length", [0, 7, 64])
def test_auto_dataloader_renamed_from_ignite_gives_ignite_batches(
    monkeypatch: pytest.MonkeyPatch, world: int, rank: int, length: int
) -> None:
    import ignite.distributed as idist
    from ignite.distributed import utils

    # Ignite's auto_dataloader asks idist for the topology; no process group is needed for it.
    monkeypatch.setattr(utils, "get_world_size", lambda: world)
    monkeypatch.setattr(utils, "get_rank", lambda: rank)
    monkeypatch.setattr(utils, "get_nproc_per_node", lambda: world)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    _state.reset()
    epochs: list[int | None] = [None, None, 3, None, 0]
    for shuffle in (None, True, False):
        given = {} if shuffle is None else {"shuffle": shuffle}
        theirs = idist.auto_dataloader(
            range(length), batch_size=4 * world, num_workers=0, pin_memory=False, **given
        )
        ours = unidist.auto_dataloader(
            range(length), global_batch_size=4 * world, num_workers=0, pin_memory=False, **given
        )
        assert _batches(ours, epochs) == _batches(theirs, epochs)


@pytest.mark.parametrize("kind", ["DistributedSampler", "wrapper"])
def test_auto_epoch_is_the_explicit_way_to_advance_without_set_epoch(kind: str) -> None:
    if kind == "wrapper":
        inner = torch.utils.data.RandomSampler(range(30))
        sampler: Any = unidist.DistributedSamplerWrapper(inner, rank=0, world_size=1)
        advancing: Any = unidist.DistributedSamplerWrapper(
            inner, rank=0, world_size=1, auto_epoch=True
        )
    else:
        sampler = unidist.DistributedSampler(30, rank=0, world_size=1)
        advancing = unidist.DistributedSampler(30, rank=0, world_size=1, auto_epoch=True)
    first = list(sampler)
    assert list(sampler) == first
    assert list(advancing) == first
    assert list(advancing) != first
    assert advancing.epoch == 1
    assert list(itertools.islice(iter(sampler), 3)) == first[:3]


@pytest.mark.parametrize("extra", [{"order": "fast"}, {"auto_epoch": True}])
def test_a_native_sampler_refuses_unidists_own_choices(extra: dict[str, Any]) -> None:
    with pytest.raises(unidist.ConfigurationError, match="are unidist's"):
        unidist.get_sampler(range(8), native="torch", rank=0, num_replicas=1, **extra)
