"""DistributedSamplerWrapper and the frameworks' native samplers (get_sampler(native=...))."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st
from torch.utils.data import RandomSampler, SequentialSampler, WeightedRandomSampler

from unidist import (
    ConfigurationError,
    DistributedSampler,
    DistributedSamplerWrapper,
    get_sampler,
)


def _wrapped(inner: Any, world: int, **kw: Any) -> list[list[Any]]:
    return [
        list(DistributedSamplerWrapper(inner, rank=r, world_size=world, **kw)) for r in range(world)
    ]


class Reversed(torch.utils.data.Sampler[int]):
    """A custom deterministic sampler that remembers the epochs it was given."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))

    def __len__(self) -> int:
        return 3


class Liar(torch.utils.data.Sampler[int]):
    def __init__(self, n: int, claims: int) -> None:
        self.n, self.claims = n, claims

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.claims


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 16), st.booleans(), st.sampled_from(["train", "eval"]))
def test_wrapper_shards_the_global_order(
    length: int, world: int, drop_last: bool, mode: str
) -> None:
    assume(not (mode == "eval" and drop_last))
    inner = RandomSampler(range(length))  # draws from the (private) global generator
    whole = _wrapped(inner, 1, seed=4, mode="eval")[0]  # one rank sees the epoch's order
    assert sorted(whole) == list(range(length))
    shards = _wrapped(inner, world, seed=4, mode=mode, drop_last=drop_last)
    for rank, shard in enumerate(shards):
        if mode == "eval":
            expected = whole[rank::world]
        elif drop_last:
            expected = whole[rank : length // world * world : world]
        else:
            count = -(-length // world)
            expected = [whole[(rank + j * world) % length] for j in range(count)]
        assert shard == expected


@pytest.mark.ignite
def test_wrapper_matches_ignite_proxy_index_for_index() -> None:
    from ignite.distributed.auto import DistributedProxySampler

    for length, world in itertools.product([1, 5, 23], [1, 3, 16]):
        for rank in range(world):
            inner = Reversed(length)
            theirs = list(DistributedProxySampler(inner, num_replicas=world, rank=rank))
            ours = list(DistributedSamplerWrapper(inner, rank=rank, world_size=world))
            assert ours == theirs, (length, world, rank)


def test_wrapper_leaves_the_global_generators_alone() -> None:
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    sampler = DistributedSamplerWrapper(RandomSampler(range(50_000)), rank=0, world_size=2)
    it = iter(sampler)
    next(it)
    assert torch.equal(torch.get_rng_state(), before[0])  # also between two draws
    list(it)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])


def test_wrapped_random_samplers_agree_across_ranks_and_vary_by_epoch() -> None:
    inner = WeightedRandomSampler([0.1] * 20 + [5.0] * 20, num_samples=40, replacement=True)
    shards = _wrapped(inner, 4, mode="eval")
    again = _wrapped(inner, 4, mode="eval")
    assert shards == again  # deterministic per (seed, epoch), whatever the global state
    sampler = DistributedSamplerWrapper(inner, rank=0, world_size=4, mode="eval")
    assert list(sampler) == list(sampler) == shards[0]  # no set_epoch: the epoch repeats
    sampler.set_epoch(1)
    assert list(sampler) != shards[0]  # the next epoch draws again
    assert sum(i >= 20 for s in shards for i in s) > 30  # the weights still apply


def test_wrapper_passes_the_epoch_to_the_wrapped_sampler() -> None:
    inner = Reversed(6)
    sampler = DistributedSamplerWrapper(inner, rank=1, world_size=2)
    list(sampler)
    sampler.set_epoch(5)
    list(sampler)
    list(sampler)
    assert inner.epochs == [0, 5, 5]
    inner = Reversed(6)
    advancing = DistributedSamplerWrapper(inner, rank=1, world_size=2, auto_epoch=True)
    list(advancing)
    list(advancing)
    assert inner.epochs == [0, 1]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 200),
    st.integers(1, 8),
    st.integers(1, 8),
    st.sampled_from(["train", "eval"]),
    st.data(),
)
def test_wrapper_resumes_on_another_world_size(
    length: int, world: int, new_world: int, mode: str, data: st.DataObject
) -> None:
    inner = RandomSampler(range(length))
    before = [
        DistributedSamplerWrapper(inner, rank=r, world_size=world, mode=mode) for r in range(world)
    ]
    reads = data.draw(st.integers(0, len(before[0])))
    seen = [x for s in before for x in itertools.islice(iter(s), reads)]
    state = before[0].state_dict(consumed=reads)
    after = [
        DistributedSamplerWrapper(inner, rank=r, world_size=new_world, mode=mode)
        for r in range(new_world)
    ]
    for sampler in after:
        sampler.load_state_dict(state)
    rest = [x for s in after for x in s]
    if mode == "eval":
        assert sorted(seen + rest) == list(range(length))
    else:
        assert set(seen + rest) == set(range(length))


@pytest.mark.parametrize(
    ("sampler", "fragment"),
    [
        (Liar(5, claims=6), "yielded only 5"),
        (Liar(5, claims=4), "yielded more"),
    ],
)
def test_wrapper_catches_samplers_whose_len_lies(sampler: Any, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        list(DistributedSamplerWrapper(sampler, rank=0, world_size=2))


def test_wrapper_refuses_what_it_cannot_wrap() -> None:
    with pytest.raises(ConfigurationError, match="shard twice"):
        DistributedSamplerWrapper(DistributedSampler(5))
    with pytest.raises(ConfigurationError, match="shard_iterable"):
        DistributedSamplerWrapper(Stream())
    with pytest.raises(ConfigurationError, match="needs a sampler with len"):
        DistributedSamplerWrapper(iter([1, 2]))  # type: ignore[arg-type]
    state = DistributedSamplerWrapper(Reversed(4)).state_dict()
    with pytest.raises(
        ConfigurationError, match="sampler: saved 'Reversed', now 'SequentialSampler'"
    ):
        DistributedSamplerWrapper(SequentialSampler(range(4))).load_state_dict(state)


def test_get_sampler_wraps_a_sampler() -> None:
    sampler = get_sampler(None, sampler=Reversed(4), rank=0, world_size=2)
    assert isinstance(sampler, DistributedSamplerWrapper)
    assert list(sampler) == [3, 1]
    with pytest.raises(ConfigurationError, match="shuffle cannot be combined"):
        get_sampler(None, sampler=Reversed(4), shuffle=True)


# -- native samplers ---------------------------------------------------------------------------


def _ours_torch_order(length: int, world: int, rank: int, **kw: Any) -> list[int]:
    return list(DistributedSampler(length, rank=rank, world_size=world, order="torch", **kw))


@pytest.mark.parametrize(
    ("length", "world", "drop_last"), [(10, 3, False), (10, 3, True), (7, 8, False)]
)
def test_native_torch_sampler_matches_torch_order(length: int, world: int, drop_last: bool) -> None:
    for rank in range(world):
        native = get_sampler(
            range(length),
            native="torch",
            shuffle=True,
            rank=rank,
            world_size=world,
            seed=3,
            drop_last=drop_last,
        )
        assert type(native) is torch.utils.data.DistributedSampler
        native.set_epoch(2)
        ours = DistributedSampler(
            length, rank=rank, world_size=world, order="torch", seed=3, drop_last=drop_last
        )
        ours.set_epoch(2)
        assert list(ours) == list(native)


@pytest.mark.composer
@pytest.mark.parametrize("shuffle", [True, False])
def test_native_composer_sampler_matches_torch_order(shuffle: bool) -> None:
    from composer.utils import dist as composer_dist

    for rank in range(4):
        native = get_sampler(
            range(11), native="composer", shuffle=shuffle, rank=rank, world_size=4, seed=9
        )
        direct = composer_dist.get_sampler(
            range(11), shuffle=shuffle, num_replicas=4, rank=rank, seed=9
        )
        assert list(native) == list(direct)
        assert _ours_torch_order(11, 4, rank, seed=9, shuffle=shuffle) == list(native)


@pytest.mark.ignite
def test_native_ignite_samplers() -> None:
    from ignite.distributed.auto import DistributedProxySampler

    proxy = get_sampler(None, sampler=Reversed(9), native="ignite", rank=1, world_size=4)
    assert isinstance(proxy, DistributedProxySampler)
    assert list(proxy) == list(DistributedSamplerWrapper(Reversed(9), rank=1, world_size=4))
    plain = get_sampler(range(9), native="ignite", shuffle=True, rank=1, world_size=4)
    assert type(plain) is torch.utils.data.DistributedSampler
    assert list(plain) == _ours_torch_order(9, 4, 1)
    with pytest.raises(ConfigurationError, match="no drop_last"):
        get_sampler(
            None, sampler=Reversed(9), native="ignite", drop_last=True, world_size=4, rank=0
        )


def test_native_true_follows_the_running_adapter() -> None:
    assert type(get_sampler(range(5), native=True)) is torch.utils.data.DistributedSampler


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(native="torch", mode="eval"), "mode='eval' is unidist's"),
        (dict(native="torch", sampler=Reversed(3)), "no sampler wrapper"),
        (dict(native="mxnet"), "native='mxnet' is not one of"),
    ],
)
def test_native_refuses_what_the_framework_cannot_do(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=None) as info:
        get_sampler(None if "sampler" in kwargs else range(3), **kwargs)
    assert fragment in str(info.value)
