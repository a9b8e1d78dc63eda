"""shard_iterable: each element of a stream goes to exactly one worker of one rank."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader, IterableDataset

from unidist import ConfigurationError, ShardedIterable, shard_iterable


class Stream(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def _read(dataset: Any, workers: int) -> list[int]:
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    return [int(x) for x in loader]


@pytest.mark.parametrize("drop_last", [False, True])
def test_stream_elements_go_to_exactly_one_worker_of_one_rank(drop_last: bool) -> None:
    world, length = 3, 20
    parts = [
        _read(shard_iterable(Stream(length), rank=r, world_size=world, drop_last=drop_last), 2)
        for r in range(world)
    ]
    flat = [x for part in parts for x in part]
    assert len(flat) == len(set(flat))
    if drop_last:
        assert [len(p) for p in parts] == [6, 6, 6]
        assert set(flat) == set(range(18))
    else:
        assert sorted(flat) == list(range(length))


def test_ranks_may_run_different_numbers_of_workers() -> None:
    parts = [_read(shard_iterable(range(30), rank=r, world_size=2), r + 1) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(30))


def test_shards_are_opened_once_each() -> None:
    opened: list[str] = []

    def open_shard(name: str) -> list[str]:
        opened.append(name)
        return [f"{name}/{i}" for i in range(3)]

    names = [f"shard-{i}" for i in range(5)]
    parts = [
        list(shard_iterable(names, open_shard=open_shard, rank=r, world_size=2)) for r in range(2)
    ]
    assert sorted(opened) == names
    assert sorted(parts[0] + parts[1]) == sorted(f"{n}/{i}" for n in names for i in range(3))


def test_a_function_can_supply_fresh_streams() -> None:
    sharded = shard_iterable(lambda: iter(range(7)), rank=1, world_size=2)
    assert isinstance(sharded, ShardedIterable)
    assert list(sharded) == list(sharded) == [1, 3, 5]


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: shard_iterable(iter(range(3))), "can be read only once"),
        (lambda: shard_iterable(["a"], open_shard=list, world_size=2, rank=0), "1 shards cannot"),
        (lambda: shard_iterable(["a", "b"], open_shard=list, drop_last=True), "drop_last needs"),
        (lambda: shard_iterable(range(3), rank=2, world_size=2), "do not fit"),
        (lambda: shard_iterable(3), "needs an iterable"),
    ],
)
def test_shard_iterable_refuses_what_cannot_work(call: Any, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        call()
    assert fragment in str(info.value)
