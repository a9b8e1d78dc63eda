"""unidist.BatchSampler: torch's batches, cut a chunk at a time, resumable like the sampler."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

import unidist
from unidist.samplers import CHUNK


def torch_batches(sampler: object, size: int, drop_last: bool) -> list[list[int]]:
    return list(torch.utils.data.BatchSampler(sampler, size, drop_last))  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ["fast", "torch"])
@pytest.mark.parametrize("length", [0, 1, 7, 1000, 3 * CHUNK + 17])
@pytest.mark.parametrize("size", [1, 3, 256, CHUNK + 1])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_same_batches_as_torchs_batch_sampler_over_the_same_sampler(
    order: str, length: int, size: int, drop_last: bool
) -> None:
    ours = unidist.DistributedSampler(length, world_size=3, rank=1, order=order, seed=5)
    twin = unidist.DistributedSampler(length, world_size=3, rank=1, order=order, seed=5)
    batches = list(unidist.BatchSampler(ours, size, drop_last))
    assert batches == torch_batches(twin, size, drop_last)
    assert len(unidist.BatchSampler(ours, size, drop_last)) == len(batches)
    assert all(type(i) is int for batch in batches for i in batch)


def test_over_torchs_own_sampler_it_is_torchs_iteration() -> None:
    torch.manual_seed(0)
    ours = list(unidist.BatchSampler(RandomSampler(range(100)), 8, False))
    torch.manual_seed(0)
    assert ours == torch_batches(RandomSampler(range(100)), 8, False)
    assert list(unidist.BatchSampler(SequentialSampler(range(5)), 2, True)) == [[0, 1], [2, 3]]


@pytest.mark.parametrize(
    "bad", [{"batch_size": 0, "drop_last": False}, {"batch_size": 2, "drop_last": "no"}]
)
def test_it_checks_its_arguments_as_torch_does(bad: dict[str, object]) -> None:
    sampler = unidist.DistributedSampler(10, world_size=1, rank=0)
    with pytest.raises(ValueError, match="should be") as ours:
        unidist.BatchSampler(sampler, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="should be") as theirs:
        torch.utils.data.BatchSampler(sampler, **bad)  # type: ignore[arg-type]
    assert str(ours.value) == str(theirs.value)


# 32,818 reads per rank. 64 divides a chunk: 300 batches end inside chunk 2. 100 does not, so
# batches straddle chunks; 165 of them end inside chunk 2, and 329 end in the last, short batch.
@pytest.mark.parametrize(("size", "taken_batches"), [(64, 300), (100, 165), (100, 329)])
def test_a_state_saved_between_batches_resumes_at_the_next_batch(
    size: int, taken_batches: int
) -> None:
    length = 4 * CHUNK + 100
    whole = unidist.DistributedSampler(length, world_size=2, rank=0, order="fast", seed=3)
    expected = list(itertools.chain.from_iterable(unidist.BatchSampler(whole, size, False)))
    sampler = unidist.DistributedSampler(length, world_size=2, rank=0, order="fast", seed=3)
    batches = iter(unidist.BatchSampler(sampler, size, False))
    taken = list(itertools.chain.from_iterable(itertools.islice(batches, taken_batches)))
    state = sampler.state_dict()
    resumed = unidist.DistributedSampler(length, world_size=2, rank=0, order="fast", seed=3)
    resumed.load_state_dict(state)
    rest = list(itertools.chain.from_iterable(unidist.BatchSampler(resumed, size, False)))
    assert taken + rest == expected


def test_a_data_loader_takes_it_as_its_batch_sampler() -> None:
    data = torch.arange(1000)
    sampler = unidist.DistributedSampler(data, world_size=2, rank=1, order="fast")
    loader = DataLoader(data, batch_sampler=unidist.BatchSampler(sampler, 32, drop_last=False))
    got = torch.cat(list(loader)).tolist()
    assert got == sampler.pass_indices().tolist()
    assert len(got) == 500


@pytest.mark.parametrize("drop_last", [False, True])
def test_over_the_wrapper_the_same_batches_too(drop_last: bool) -> None:
    def wrapper() -> unidist.DistributedSamplerWrapper:
        return unidist.DistributedSamplerWrapper(
            RandomSampler(range(CHUNK + 999), generator=torch.Generator().manual_seed(4)),
            world_size=2,
            rank=1,
        )

    assert list(unidist.BatchSampler(wrapper(), 100, drop_last)) == torch_batches(
        wrapper(), 100, drop_last
    )
