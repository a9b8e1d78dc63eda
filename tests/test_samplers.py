"""DistributedSampler: coverage, torch compatibility, epochs and resume, all ranks simulated."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from unidist import ConfigurationError, DistributedSampler, get_sampler
from unidist._sampling.permute import SMALL

LENGTHS = st.one_of(st.integers(0, 40), st.integers(0, 2000), st.sampled_from([SMALL + 1, 100_003]))
WORLDS = st.integers(1, 16)
SEEDS = st.integers(-(2**63), 2**63 - 1)
EPOCHS = st.integers(0, 10_000)
MODES = st.sampled_from(["train", "eval"])
ORDERS = st.sampled_from(["fast", "torch"])
SETTINGS = settings(max_examples=60, deadline=None)


class Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(3))

    def __len__(self) -> int:
        return 3


def _samplers(length: int, world: int, epoch: int | None = None, **kw: Any) -> list[Any]:
    out = [DistributedSampler(length, rank=r, world_size=world, **kw) for r in range(world)]
    if epoch is not None:
        for sampler in out:
            sampler.set_epoch(epoch)
    return out


def _shards(length: int, world: int, epoch: int, **kw: Any) -> list[list[int]]:
    return [list(s) for s in _samplers(length, world, epoch, **kw)]


@SETTINGS
@given(LENGTHS, WORLDS, SEEDS, EPOCHS, st.booleans(), MODES, ORDERS, st.booleans())
def test_shards_cover_the_dataset_as_specified(
    length: int,
    world: int,
    seed: int,
    epoch: int,
    drop_last: bool,
    mode: str,
    order: str,
    shuffle: bool,
) -> None:
    assume(not (mode == "eval" and drop_last))
    kw = dict(seed=seed, drop_last=drop_last, mode=mode, order=order, shuffle=shuffle)
    shards = _shards(length, world, epoch, **kw)
    flat = [i for shard in shards for i in shard]
    counts = [len(shard) for shard in shards]
    assert all(0 <= i < length for i in flat)
    if mode == "eval":  # every sample exactly once, counts within one of each other
        assert sorted(flat) == list(range(length))
        assert max(counts) - min(counts) <= 1
    elif drop_last:  # same count everywhere, nothing repeated, only the tail dropped
        assert counts == [length // world] * world
        assert len(set(flat)) == len(flat)
    else:  # same count everywhere, everything covered, padding only fills the last round
        assert counts == [math.ceil(length / world)] * world
        assert set(flat) == set(range(length))
    samplers = _samplers(length, world, epoch, **kw)
    assert [len(s) for s in samplers] == counts
    assert [list(s) for s in samplers] == shards  # same inputs, same indices
    if not shuffle:
        assert sorted(flat) == sorted(i % max(length, 1) for i in range(len(flat)))


@SETTINGS
@given(st.integers(0, 3000), WORLDS, SEEDS, EPOCHS, st.booleans(), st.booleans())
def test_torch_order_matches_torch_index_for_index(
    length: int, world: int, seed: int, epoch: int, drop_last: bool, shuffle: bool
) -> None:
    for rank in range(world):
        reference = torch.utils.data.DistributedSampler(
            range(length), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
            drop_last=drop_last,
        )  # fmt: skip
        reference.set_epoch(epoch)
        expected = list(reference)
        ours = DistributedSampler(
            length, rank=rank, world_size=world, shuffle=shuffle, seed=seed,
            drop_last=drop_last, order="torch",
        )  # fmt: skip
        ours.set_epoch(epoch)
        assert list(ours) == expected
        assert (len(ours), ours.num_samples, ours.total_size) == (
            len(reference),
            reference.num_samples,
            reference.total_size,
        )
        if not drop_last:  # eval mode is torch's shard without the padding at its end
            exact = DistributedSampler(
                length, rank=rank, world_size=world, shuffle=shuffle, seed=seed,
                mode="eval", order="torch",
            )  # fmt: skip
            exact.set_epoch(epoch)
            got = list(exact)
            assert got == expected[: len(got)]


@settings(max_examples=80, deadline=None)
@given(
    LENGTHS,
    WORLDS,
    WORLDS,
    SEEDS,
    EPOCHS,
    MODES,
    st.booleans(),
    ORDERS,
    st.sampled_from(["yielded", "consumed"]),
    st.data(),
)
def test_resume_reads_exactly_the_rest_on_any_world_size(
    length: int,
    world: int,
    new_world: int,
    seed: int,
    epoch: int,
    mode: str,
    drop_last: bool,
    order: str,
    via: str,
    data: st.DataObject,
) -> None:
    assume(not (mode == "eval" and drop_last))
    assume(length <= 3000 or order == "fast")
    kw = dict(seed=seed, drop_last=drop_last, mode=mode, order=order)
    before = _samplers(length, world, epoch, **kw)
    reads = data.draw(st.integers(0, len(before[0])), label="reads per rank before the stop")
    iterators = [iter(s) for s in before]
    seen = [list(itertools.islice(it, reads)) for it in iterators]  # ranks in lockstep
    state = before[0].state_dict() if via == "yielded" else before[0].state_dict(consumed=reads)
    assert state["epoch"] == epoch
    consumed = state["consumed"]
    if reads == 0:  # islice(it, 0) does not even start the iteration
        assert consumed == 0
    else:
        assert consumed == (reads * world if reads < len(before[0]) else length)
    if mode == "train":  # every rank describes the same global state
        assert all(s.state_dict()["consumed"] == consumed for s in before)

    after = _samplers(length, new_world, **{**kw, "seed": 12345})  # the state restores the seed
    for sampler in after:
        sampler.load_state_dict(state)
        sampler.set_epoch(epoch)  # a loop that calls set_epoch keeps the restored position
    rest = [list(s) for s in after]
    first, second = [i for s in seen for i in s], [i for s in rest for i in s]
    remaining = length - consumed
    if mode == "eval":
        assert sorted(first + second) == list(range(length))
    elif drop_last:
        assert len(set(first + second)) == len(first) + len(second)
        assert [len(r) for r in rest] == [remaining // new_world] * new_world
    else:
        padding = math.ceil(remaining / new_world) * new_world - remaining
        padding += max(0, reads * world - length)  # the first pass may have padded already
        assert set(first + second) == set(range(length))
        assert len(first) + len(second) == length + padding  # so only padding repeats
    if new_world == world:  # same world: each rank continues its own uninterrupted shard
        whole = _shards(length, world, epoch, **kw)
        assert [a + b for a, b in zip(seen, rest, strict=True)] == whole
    # The resumed pass is the restored epoch's; as in torch, the next iteration repeats that
    # epoch from its start, and set_epoch moves on.
    assert after[0].epoch == epoch
    assert list(after[0]) == _shards(length, new_world, epoch, **kw)[0]
    after[0].set_epoch(epoch + 1)
    assert list(after[0]) == _shards(length, new_world, epoch + 1, **kw)[0]


def test_without_set_epoch_every_iteration_repeats_the_epoch_as_in_torch() -> None:
    sampler = DistributedSampler(100, rank=0, world_size=2)
    reference = torch.utils.data.DistributedSampler(range(100), num_replicas=2, rank=0)
    peeked = next(iter(sampler))  # a script that peeks at a batch does not shift the order
    assert peeked == next(iter(reference))
    assert list(sampler) == list(sampler) == list(reference) == _shards(100, 2, 0)[0]
    assert sampler.epoch == 0
    sampler.set_epoch(3)
    reference.set_epoch(3)
    assert list(sampler) == list(sampler) == list(reference)


def test_auto_epoch_advances_the_epoch_without_set_epoch() -> None:
    sampler = DistributedSampler(100, rank=0, world_size=2, auto_epoch=True)
    first, second = list(sampler), list(sampler)
    assert first != second
    assert second == _shards(100, 2, 1)[0]
    assert sampler.epoch == 1
    sampler.set_epoch(7)
    assert list(sampler) == _shards(100, 2, 7)[0]
    assert list(sampler) == _shards(100, 2, 8)[0]
    assert sampler.epoch == 8
    sampler.set_epoch(8)  # set_epoch repeats an epoch on purpose, as in torch
    assert list(sampler) == _shards(100, 2, 8)[0]


def test_an_iterator_that_never_starts_does_not_advance_the_epoch() -> None:
    sampler = DistributedSampler(50, rank=1, world_size=2)
    unused = iter(sampler)  # DataLoader does this when it starts workers
    del unused
    assert list(sampler) == _shards(50, 2, 0)[1]
    sampler.epoch = 4  # the torch attribute still works
    assert list(sampler) == _shards(50, 2, 4)[1]


def test_state_after_a_finished_pass_points_at_the_next_epoch() -> None:
    sampler = DistributedSampler(10, rank=0, world_size=2, seed=3)
    assert sampler.state_dict()["epoch"] == 0
    list(sampler)
    state = sampler.state_dict()
    assert (state["epoch"], state["consumed"], state["seed"]) == (1, 0, 3)
    fresh = DistributedSampler(10, rank=0, world_size=2)
    fresh.load_state_dict(state)
    assert list(fresh) == _shards(10, 2, 1, seed=3)[0]


def test_state_at_the_last_batch_inside_the_loop_resumes_to_an_empty_pass() -> None:
    sampler = DistributedSampler(10, rank=0, world_size=2)
    it = iter(sampler)
    list(itertools.islice(it, 5))  # all five read, but the loop is still in its last step
    state = sampler.state_dict()
    assert (state["epoch"], state["consumed"]) == (0, 10)
    again = DistributedSampler(10, rank=0, world_size=2)
    again.load_state_dict(state)
    assert list(again) == []  # the rest of epoch 0
    assert list(again) == _shards(10, 2, 0)[0]  # then epoch 0 again, as torch repeats it


def test_set_epoch_of_another_epoch_drops_a_restored_position() -> None:
    state = DistributedSampler(20, rank=0, world_size=2).state_dict(consumed=0)
    state = {**state, "epoch": 2, "consumed": 8}
    sampler = DistributedSampler(20, rank=0, world_size=2)
    sampler.load_state_dict(state)
    assert len(sampler) == 6
    sampler.set_epoch(3)
    assert list(sampler) == _shards(20, 2, 3)[0]


def test_len_follows_the_pass_in_progress() -> None:
    sampler = DistributedSampler(10, rank=0, world_size=3, mode="eval")
    state = {**sampler.state_dict(), "consumed": 6}
    sampler.load_state_dict(state)
    assert (len(sampler), sampler.total_size) == (2, 4)
    assert list(sampler) == _shards(10, 3, 0, mode="eval")[0][2:]
    assert (len(sampler), sampler.total_size) == (4, 10)  # the next, full pass


def test_it_is_a_torch_distributed_sampler_with_torch_attributes() -> None:
    sampler = DistributedSampler(list(range(9)), rank=2, world_size=4, seed=5, drop_last=True)
    assert isinstance(sampler, torch.utils.data.DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.seed, sampler.drop_last) == (4, 2, 5, True)
    assert (sampler.num_samples, sampler.total_size, len(sampler.dataset)) == (2, 8, 9)
    assert len(DistributedSampler(7).dataset) == 7  # a length gets a range as its dataset


def test_defaults_come_from_unidist() -> None:
    sampler = DistributedSampler(10)
    assert (sampler.rank, sampler.num_replicas, sampler.shuffle) == (0, 1, True)
    assert sorted(sampler) == list(range(10))


def test_a_large_epoch_is_a_permutation_and_starts_at_once() -> None:
    length, world = 2_000_003, 3
    parts = [DistributedSampler(length, rank=r, world_size=world, mode="eval") for r in range(3)]
    first = [next(iter(p)) for p in parts]
    assert all(0 <= i < length for i in first)
    assert [p.pass_indices(1).tolist() for p in parts] == [[i] for i in first]
    everything = torch.cat([torch.from_numpy(p.pass_indices()) for p in parts])
    assert torch.equal(everything.sort().values, torch.arange(length))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(data=Stream()), "shard_iterable"),
        (dict(data=object()), "len()"),
        (dict(data=-1), "at least 0"),
        (dict(data=5, mode="test"), "mode='test'"),
        (dict(data=5, order="slow"), "order='slow'"),
        (dict(data=5, mode="eval", drop_last=True), "contradicts"),
        (dict(data=5, rank=2, world_size=2), "below world_size"),
        (dict(data=5, world_size=0), "world_size must be at least 1"),
        (dict(data=5, shuffle=1), "shuffle must be True or False"),
        (dict(data=5, order="torch", seed=2**64), "within 64 bits"),
        # 2**63 - 1 + epoch 1 would overflow torch's generator a whole epoch later.
        (dict(data=5, order="torch", seed=2**63), "[-2**63, 2**63)"),
        # Indices are signed 64-bit: a longer dataset would wrap into negative indices.
        (dict(data=2**64), "below 2**63"),
        (dict(data=2**63), "below 2**63"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs: dict[str, Any], fragment: str) -> None:
    data = kwargs.pop("data")
    with pytest.raises(ConfigurationError, match=None) as info:
        DistributedSampler(data, **kwargs)
    assert fragment in str(info.value)


def test_numpy_integers_are_ints() -> None:
    import numpy as np

    sampler = DistributedSampler(np.int64(12), seed=np.int64(3), rank=np.int32(1), world_size=2)
    sampler.set_epoch(np.int64(2))
    assert list(sampler) == _shards(12, 2, 2, seed=3)[1]
    with pytest.raises(ConfigurationError, match="seed must be an int"):
        DistributedSampler(5, seed=1.5)  # type: ignore[arg-type]


def test_set_epoch_refuses_negative_epochs() -> None:
    with pytest.raises(ConfigurationError, match="epoch must be at least 0"):
        DistributedSampler(5).set_epoch(-1)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (dict(length=11), "length: saved 11, now 10"),
        (dict(order="fast"), "order: saved 'fast', now 'torch'"),
        (dict(format="other"), "not a unidist sampler state"),
        (dict(consumed=11), "state['consumed']"),
        (dict(epoch=-1), "state['epoch']"),
    ],
)
def test_load_state_dict_refuses_states_it_cannot_continue(
    change: dict[str, Any], fragment: str
) -> None:
    state = {**DistributedSampler(10).state_dict(), **change}
    if "length" in change:
        state["consumed"] = 0
    with pytest.raises(ConfigurationError) as info:
        DistributedSampler(10).load_state_dict(state)
    assert fragment in str(info.value)


def test_unshuffled_states_load_across_orders() -> None:
    state = DistributedSampler(10, shuffle=False, order="torch").state_dict(consumed=0)
    DistributedSampler(10, shuffle=False, order="fast").load_state_dict(state)


def test_state_dict_checks_consumed() -> None:
    sampler = DistributedSampler(10, rank=0, world_size=2)
    with pytest.raises(ConfigurationError, match="no iteration"):
        sampler.state_dict(consumed=3)
    next(iter(sampler))
    with pytest.raises(ConfigurationError, match="more than the 5 samples"):
        sampler.state_dict(consumed=6)


def test_padding_counts_like_torch_for_tiny_datasets() -> None:
    shards = _shards(2, 5, 0)
    assert [len(s) for s in shards] == [1] * 5
    assert Counter(i for s in shards for i in s) in (Counter({0: 3, 1: 2}), Counter({1: 3, 0: 2}))
    assert _shards(0, 3, 0) == [[], [], []]
    assert _shards(1, 1, 0, mode="eval") == [[0]]


def test_get_sampler_defaults_to_composers_unshuffled_order() -> None:
    # Composer's dist.get_sampler, whose name it shares, defaults to shuffle=False.
    sampler = get_sampler(range(10), rank=0, world_size=2)
    assert isinstance(sampler, DistributedSampler)
    assert not sampler.shuffle
    assert list(sampler) == [0, 2, 4, 6, 8]
    assert get_sampler(10, shuffle=True).shuffle
    with pytest.raises(ConfigurationError, match="needs a dataset"):
        get_sampler(None)


def test_the_longest_dataset_and_the_extreme_seeds_still_work() -> None:
    # The largest length accepted yields valid, non-negative indices.
    longest = DistributedSampler(2**63 - 1, rank=0, world_size=2, order="fast")
    first = list(itertools.islice(iter(longest), 4))
    assert all(0 <= i < 2**63 - 1 for i in first)
    # The extreme torch seeds run for any epoch; epochs of 2**63 or more are refused.
    for seed in (2**63 - 1, -(2**63)):
        sampler = DistributedSampler(5, order="torch", seed=seed, rank=0, world_size=1)
        sampler.set_epoch(2**63 - 1)
        assert sorted(sampler) == [0, 1, 2, 3, 4]
    with pytest.raises(ConfigurationError, match=r"epoch must be below 2\*\*63"):
        sampler.set_epoch(2**63)
    sampler.set_epoch(3)
    state = {**sampler.state_dict(), "seed": 2**64 - 1}
    with pytest.raises(ConfigurationError, match=r"state\['seed'\]=18446744073709551615"):
        sampler.load_state_dict(state)
