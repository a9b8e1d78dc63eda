"""auto_dataloader, StatefulDataLoader, shard_iterable and gather_in_order in one process."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, SequentialSampler, TensorDataset

import unidist
from unidist import (
    ConfigurationError,
    DistributedSampler,
    DistributedSamplerWrapper,
    StatefulDataLoader,
    auto_dataloader,
    data,
    gather_in_order,
    shard_iterable,
)
from unidist.session import state as _state


@pytest.fixture
def rank_one_of_four(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process looks like rank 1 of a 4-rank job (no process group is needed here)."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    _state.reset()


class Stream(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def _flat(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch]


# -- auto_dataloader ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "fragment"),
    [
        (dict(per_rank_batch_size=2, global_batch_size=8), "give one of per_rank_batch_size"),
        (dict(global_batch_size=10), "use global_batch_size=8 or 12"),
        (dict(global_batch_size=3), "use global_batch_size=4"),
        (dict(per_rank_batch_size=0), "per_rank_batch_size must be at least 1"),
        # Ignite's batch_size is the whole job's, DataLoader's one rank's: refused, both named.
        (dict(batch_size=128), "32 per rank on these 4 ranks"),
        (dict(batch_size=128), "pass global_batch_size=128 for Ignite's meaning"),
        (dict(batch_size=128), "per_rank_batch_size=128 for DataLoader's"),
        # A misspelt keyword is named, with what was probably meant.
        (dict(batchsize=4), "got batchsize=4"),
        (dict(batchsize=4), "batchsize= -> per_rank_batch_size= or global_batch_size="),
        (dict(per_rank_batch_size=2, num_worker=2), "num_worker= -> num_workers="),
        (dict(per_rank_batch_size=2, sead=1), "sead= -> seed="),
    ],
)
@pytest.mark.usefixtures("rank_one_of_four")
def test_batch_sizes_are_explicit(sizes: dict[str, int], fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        auto_dataloader(range(40), **sizes)
    assert fragment in str(info.value)


@pytest.mark.usefixtures("rank_one_of_four")
def test_global_batch_size_is_split_and_the_sampler_injected() -> None:
    loader = auto_dataloader(range(40), global_batch_size=8, num_workers=0, seed=3)
    assert isinstance(loader, StatefulDataLoader)
    assert loader.batch_size == 2
    sampler = loader.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.rank, sampler.num_replicas, sampler.seed, sampler.shuffle) == (1, 4, 3, True)
    assert sorted(_flat(loader)) == sorted(DistributedSampler(40, rank=1, world_size=4, seed=3))


@pytest.mark.usefixtures("rank_one_of_four")
def test_a_user_sampler_is_wrapped_and_a_distributed_one_kept() -> None:
    wrapped = auto_dataloader(range(8), per_rank_batch_size=2, sampler=SequentialSampler(range(8)))
    assert isinstance(wrapped.sampler, DistributedSamplerWrapper)
    assert _flat(wrapped) == [1, 5]
    mine = DistributedSampler(8, mode="eval")
    assert auto_dataloader(range(8), per_rank_batch_size=2, sampler=mine).sampler is mine
    other = DistributedSampler(8, rank=0, world_size=2)
    with pytest.raises(ConfigurationError, match="built for rank 0 of 2, but this is rank 1 of 4"):
        auto_dataloader(range(8), per_rank_batch_size=2, sampler=other)
    with pytest.raises(ConfigurationError, match="shuffle=True cannot be combined"):
        auto_dataloader(range(8), per_rank_batch_size=2, sampler=mine, shuffle=True)


@pytest.mark.usefixtures("rank_one_of_four")
def test_drop_last_reaches_the_sampler_and_eval_mode_is_exact() -> None:
    train = auto_dataloader(range(10), per_rank_batch_size=2, drop_last=True, shuffle=False)
    assert _flat(train) == [1, 5]  # no padding: 10 // 4 = 2 each
    evaluation = auto_dataloader(range(10), per_rank_batch_size=2, mode="eval", shuffle=False)
    assert _flat(evaluation) == [1, 5, 9]


@pytest.mark.usefixtures("rank_one_of_four")
def test_streams_are_sharded_or_declared_in_a_job_of_several_ranks() -> None:
    with pytest.raises(ConfigurationError, match="no indices to sample or shuffle"):
        auto_dataloader(Stream(8), per_rank_batch_size=2, shuffle=True)
    assert _flat(
        auto_dataloader(shard_iterable(Stream(8)), per_rank_batch_size=2, num_workers=0)
    ) == [1, 5]
    assert len(_flat(auto_dataloader(Stream(8), per_rank_batch_size=2, already_sharded=True))) == 8


def test_one_process_takes_streams_as_they_are() -> None:
    assert _flat(auto_dataloader(Stream(5), per_rank_batch_size=2, num_workers=0)) == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_per_rank_defaults_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("NODE_RANK", "0")
    _state.reset()
    assert data.default_num_workers() == 3  # 16 CPUs over 4 local ranks, one for the trainer
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    loader = auto_dataloader(range(8), per_rank_batch_size=2)
    assert (loader.num_workers, loader.pin_memory) == (3, True)
    loader = auto_dataloader(range(8), per_rank_batch_size=2, num_workers=0, pin_memory=False)
    assert (loader.num_workers, loader.pin_memory) == (0, False)
    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert data.default_num_workers() == 0
    loader = auto_dataloader(
        range(8), per_rank_batch_size=2, persistent_workers=True, pin_memory=False
    )
    assert loader.num_workers == 1  # persistent workers need at least one


def test_the_chosen_settings_are_logged_once_on_the_main_rank(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _state.reset()
    with caplog.at_level(logging.INFO, logger="unidist.data"):
        auto_dataloader(range(10), global_batch_size=4, pin_memory=False)
    [record] = caplog.records
    message = record.getMessage()
    assert "range of 10 over 2 rank(s): 2 per rank (global batch 4)" in message
    assert "order='torch'" in message
    assert "shuffle=True" in message
    assert f"num_workers={data.default_num_workers()} per rank" in message
    assert "(defaults: num_workers)" in message
    caplog.clear()
    monkeypatch.setenv("RANK", "1")
    _state.reset()
    with caplog.at_level(logging.INFO, logger="unidist.data"):
        auto_dataloader(range(10), global_batch_size=4)
    assert caplog.records == []  # not on the other ranks


# -- StatefulDataLoader ------------------------------------------------------------------------


def _loader(workers: int, auto_epoch: bool = False, **kw: Any) -> StatefulDataLoader:
    dataset = TensorDataset(torch.arange(50))
    sampler = DistributedSampler(dataset, rank=0, world_size=1, seed=1, auto_epoch=auto_epoch)
    return StatefulDataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers, **kw)


def _ids(batches: Any) -> list[int]:
    return [int(i) for (batch,) in batches for i in batch]


def test_loader_state_counts_what_the_loop_received_not_what_workers_prefetched() -> None:
    whole = _ids(_loader(0))
    loader = _loader(2, prefetch_factor=4)
    it = iter(loader)
    taken = _ids(itertools.islice(it, 3))
    state = loader.state_dict()
    assert state["sampler"]["consumed"] == 12
    assert loader.sampler._pass.yielded() > 12  # type: ignore[attr-defined]  # prefetched
    del it
    resumed = _loader(2)
    resumed.load_state_dict(state)
    assert taken + _ids(resumed) == whole
    assert resumed.state_dict()["sampler"]["epoch"] == 1  # finished: the next epoch is due


def test_loader_over_workers_repeats_the_epoch_without_set_epoch() -> None:
    loader = _loader(2, persistent_workers=True)
    first, second = _ids(loader), _ids(loader)
    assert first == second  # as torch's sampler: only set_epoch changes the order
    assert sorted(first) == list(range(50))


def test_loader_over_workers_advances_one_epoch_per_iteration_with_auto_epoch() -> None:
    loader = _loader(2, persistent_workers=True, auto_epoch=True)
    first, second = _ids(loader), _ids(loader)
    assert first != second
    assert sorted(first) == sorted(second) == list(range(50))
    expected = DistributedSampler(50, rank=0, world_size=1, seed=1)
    expected.set_epoch(1)
    assert second == list(expected)


def test_loader_drop_last_batch_and_set_epoch() -> None:
    loader = _loader(0, drop_last=True)
    loader.set_epoch(4)
    assert len(_ids(loader)) == 48
    assert loader.state_dict()["sampler"]["epoch"] == 5


def test_plain_dataloader_with_no_workers_is_exact_through_the_sampler() -> None:
    sampler = DistributedSampler(30, rank=0, world_size=1)
    loader = DataLoader(range(30), batch_size=4, sampler=sampler)
    it = iter(loader)
    next(it), next(it)
    assert sampler.state_dict()["consumed"] == 8


def test_loader_without_a_unidist_sampler_cannot_be_saved() -> None:
    loader = StatefulDataLoader(range(10), batch_size=2)
    assert _flat(loader) == list(range(10))
    with pytest.raises(ConfigurationError, match="cannot record where an epoch stopped"):
        loader.state_dict()
    # A loader over a stream, built by auto_dataloader, says why it has no state (not "build
    # it with auto_dataloader", which is how it was built).
    stream = auto_dataloader(Stream(4), per_rank_batch_size=2, num_workers=0)
    with pytest.raises(ConfigurationError, match="reads a stream") as info:
        stream.state_dict()
    assert "auto_dataloader" not in str(info.value)
    with pytest.raises(ConfigurationError, match="not a StatefulDataLoader state"):
        _loader(0).load_state_dict({"epoch": 1})


# -- gather_in_order (one process; the distributed path is in test_data_distributed) -----------


def test_gather_in_order_sorts_by_dataset_index_and_drops_duplicates() -> None:
    values = torch.tensor([[30.0], [10.0], [20.0], [30.0]])
    out, kept = gather_in_order(values, indices=[3, 1, 2, 3], return_indices=True)
    assert out.tolist() == [[10.0], [20.0], [30.0]]
    assert kept == [1, 2, 3]
    assert gather_in_order(["c", "a"], indices=torch.tensor([2, 0])) == ["a", "c"]


def test_gather_in_order_reads_indices_from_the_sampler() -> None:
    sampler = DistributedSampler(6, rank=0, world_size=1)
    order = list(sampler)
    squares = torch.tensor([i * i for i in order])
    assert gather_in_order(squares, sampler=sampler).tolist() == [0, 1, 4, 9, 16, 25]
    assert gather_in_order(squares[:2], sampler=sampler, return_indices=True)[1] == sorted(
        order[:2]
    )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(values=torch.ones(2)), "exactly one of sampler="),
        (dict(values=torch.ones(2), indices=[0]), "2 values but 1 indices"),
        (dict(values=torch.tensor(1.0), indices=[0]), "0-d tensor"),
        (dict(values=5, indices=[0]), "takes a tensor or a sequence"),
        (dict(values=[1], sampler=object()), "must be a unidist.DistributedSampler"),
        (dict(values=[1], sampler=DistributedSampler(3)), "has not been iterated"),
    ],
)
def test_gather_in_order_refuses_mismatched_input(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        gather_in_order(**kwargs)
    assert fragment in str(info.value)


def test_lazy_names_resolve() -> None:
    assert unidist.auto_dataloader is auto_dataloader
    assert unidist.get_sampler is not None
