"""The epoch orders: bijections, shuffle quality, and the shares of a pass."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter

import numpy as np
import pytest

from unidist._sampling.permute import SMALL, FeistelOrder, Share, round_keys, shuffled_order


def _whole(order_length: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    return shuffled_order(order_length, seed, epoch)(np.arange(order_length, dtype=np.uint64))


def _chi2_bound(dof: int) -> float:
    """A bound a fair chi-square statistic exceeds with probability ~1e-9 (normal approx.)."""
    return dof + 8.5 * math.sqrt(2 * dof)


@pytest.mark.parametrize("length", [1, 2, 3, 10, 97, 1000, SMALL, SMALL + 1, 250_001, 1 << 20])
def test_orders_are_permutations(length: int) -> None:
    out = _whole(length, seed=5, epoch=2)
    assert out.dtype == np.int64
    assert np.array_equal(np.sort(out), np.arange(length))


@pytest.mark.parametrize("length", [2, 5, 17, 1000, 65_537])
def test_feistel_network_alone_is_a_bijection(length: int) -> None:
    # The network itself (used above SMALL) on small domains too: cycle-walking must be right.
    out = FeistelOrder(length, round_keys(1, 0))(np.arange(length, dtype=np.uint64))
    assert np.array_equal(np.sort(out), np.arange(length))


@pytest.mark.parametrize(
    ("length", "seed", "epoch", "first", "digest"),
    [
        (10**8, 0, 0, [60215789, 36742771, 95213461, 40512245, 56929562], "b7b18088b1a5169a"),
        (70_000, -5, 3, [60058, 20931, 54157, 56138, 5721], "7113c21a2ced5cc5"),
        (2**40 + 7, 123, 9, [965033122694, 243996223657, 877233159622], "70124ac686c37d67"),
    ],
)
def test_feistel_orders_are_pinned(
    length: int, seed: int, epoch: int, first: list[int], digest: str
) -> None:
    # A checkpoint made by one release resumes on another: the order of (seed, epoch) must never
    # change. Values printed before the network was first sped up (0.1.0.dev0).
    positions = np.arange(min(length, 1 << 20), dtype=np.uint64)
    out = FeistelOrder(length, round_keys(seed, epoch))(positions)
    assert out[: len(first)].tolist() == first
    assert hashlib.sha256(out.tobytes()).hexdigest()[:16] == digest


def test_order_is_computed_per_position() -> None:
    order = shuffled_order(SMALL * 4, 9, 1)
    everything = order(np.arange(SMALL * 4, dtype=np.uint64))
    picked = np.array([5, 1, 123_456, SMALL * 4 - 1, 5], dtype=np.uint64)
    assert order(picked).tolist() == everything[picked.astype(np.int64)].tolist()


def test_any_int_seed_works_and_seeds_differ() -> None:
    orders = {tuple(_whole(50, seed=s).tolist()) for s in (0, 1, -1, 2**70, -(2**40))}
    assert len(orders) == 5


@pytest.mark.parametrize("length", [3, 4, 5])
def test_small_shuffles_are_uniform_over_all_permutations(length: int) -> None:
    epochs = 6000
    counts = Counter(tuple(_whole(length, seed=3, epoch=e).tolist()) for e in range(epochs))
    perms = list(itertools.permutations(range(length)))
    expected = epochs / len(perms)
    chi2 = sum((counts.get(p, 0) - expected) ** 2 / expected for p in perms)
    assert chi2 < _chi2_bound(len(perms) - 1), (chi2, len(counts))


@pytest.mark.parametrize("length", [SMALL + 1, 100_003])
def test_feistel_positions_are_spread_uniformly(length: int) -> None:
    # Where do the first 64 dataset indices land? Over 150 epochs, 20 equal position bins each.
    bins, epochs, tracked = 20, 150, 64
    counts = np.zeros((tracked, bins))
    positions = np.arange(length, dtype=np.uint64)
    for epoch in range(epochs):
        where = np.argsort(shuffled_order(length, 11, epoch)(positions))[:tracked]
        counts[np.arange(tracked), where * bins // length] += 1
    expected = epochs / bins
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < _chi2_bound(tracked * (bins - 1)), chi2


def test_feistel_orders_look_random() -> None:
    length = 1_000_003
    positions = np.arange(length, dtype=np.uint64)
    a = shuffled_order(length, 0, 0)(positions).astype(np.float64)
    b = shuffled_order(length, 0, 1)(positions).astype(np.float64)
    c = shuffled_order(length, 1, 0)(positions).astype(np.float64)
    limit = 6 / math.sqrt(length)  # a correlation of independent orders is ~N(0, 1/N)
    for x, y in ((a, b), (a, c), (b, c), (a, positions.astype(np.float64))):
        assert abs(np.corrcoef(x, y)[0, 1]) < limit
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < limit  # neighbours are unrelated
    assert abs(float((np.diff(a) > 0).mean()) - 0.5) < 0.005  # as many rises as falls
    assert abs(float(np.abs(a - np.arange(length)).mean()) / length - 1 / 3) < 0.005
    fixed = [int((shuffled_order(length, 2, e)(positions) == positions).sum()) for e in range(8)]
    assert sum(fixed) < 30  # ~1 fixed point per uniform permutation


@pytest.mark.parametrize(
    ("policy", "length", "world", "start", "counts"),
    [
        ("pad", 10, 4, 0, [3, 3, 3, 3]),
        ("drop", 10, 4, 0, [2, 2, 2, 2]),
        ("exact", 10, 4, 0, [3, 3, 2, 2]),
        ("exact", 3, 5, 0, [1, 1, 1, 0, 0]),
        ("pad", 0, 3, 0, [0, 0, 0]),
        ("pad", 10, 3, 7, [1, 1, 1]),
        ("drop", 10, 4, 7, [0, 0, 0, 0]),
        ("exact", 10, 4, 10, [0, 0, 0, 0]),
    ],
)
def test_share_counts(policy: str, length: int, world: int, start: int, counts: list[int]) -> None:
    shares = [Share(length, world, r, start, policy) for r in range(world)]
    assert [s.count for s in shares] == counts


def test_share_positions_wrap_only_when_padding() -> None:
    share = Share(10, 4, 3, 0, "pad")
    assert share.positions(0, 3).tolist() == [3, 7, 1]  # 11 wraps to 1, as in torch
    assert Share(10, 4, 1, 6, "exact").positions(0, 1).tolist() == [7]


def test_consumed_after_counts_global_positions() -> None:
    share = Share(10, 4, 0, 0, "pad")
    assert [share.consumed_after(k) for k in range(4)] == [0, 4, 8, 10]
    assert Share(10, 3, 0, 4, "exact").consumed_after(1) == 7
