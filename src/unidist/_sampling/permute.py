"""Epoch orders computed per position, and the share of an epoch that one rank reads.

An epoch has a *global order*: position ``p`` of the epoch holds dataset index ``order(p)``. It
depends on the seed and the epoch only, never on the world size, so a run can stop after any
number of positions and resume on a different number of ranks. A rank's :class:`Share` of one
pass over the epoch is a strided run of positions, which both the random-access sampler and the
streaming wrapper turn into indices chunk by chunk.

:class:`FeistelOrder` is a bijection on ``[0, N)`` evaluated for a whole numpy array of positions
at once: a six-round Feistel network over a mixed-radix domain ``a * b`` (``a = ceil(sqrt N)``,
``b = ceil(N / a)``), so fewer than ``a`` values fall outside ``[0, N)`` and cycle-walking
(applying the network again to those few) almost never runs. Memory does not grow with ``N``.
Feistel networks over tiny domains are measurably non-uniform, so :func:`shuffled_order` uses an
exact Fisher-Yates table (numpy's PCG64) up to :data:`SMALL` samples, at most 512 KiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from unidist._sampling import seeds

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "MASK64",
    "SMALL",
    "FeistelOrder",
    "IdentityOrder",
    "Order",
    "Share",
    "TableOrder",
    "round_keys",
    "shuffled_order",
]

MASK64 = (1 << 64) - 1
ROUNDS = 6
#: Up to this many samples, the shuffle is a stored Fisher-Yates permutation.
SMALL = 1 << 16
_M1 = np.uint64(0xFF51AFD7ED558CCD)  # murmur3's 64-bit finaliser constants
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_S32 = np.uint64(32)


class Order(Protocol):
    """The global order of one epoch: dataset indices for an array of positions."""

    def __call__(self, positions: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]: ...


def round_keys(seed: int, epoch: int, salt: int = 0) -> npt.NDArray[np.uint64]:
    """Six 64-bit round keys drawn from ``(seed, epoch)``; any int seed (negative too) works."""
    entropy = 2 * seed if seed >= 0 else -2 * seed - 1  # every int to a distinct natural number
    # numpy's SeedSequence(entropy, spawn_key=(epoch, salt)), without importing numpy.random
    return np.array(seeds.state(entropy, (epoch, salt), ROUNDS), dtype=np.uint64)


def shuffled_order(length: int, seed: int, epoch: int) -> Order:
    """The shuffled order of ``[0, length)`` for ``(seed, epoch)``; same on every rank."""
    keys = round_keys(seed, epoch)
    if length <= SMALL:
        generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence(keys.tolist())))
        return TableOrder(generator.permutation(length).astype(np.int64))
    return FeistelOrder(length, keys)


def _fmix_top(x: npt.NDArray[np.uint64], scratch: npt.NDArray[np.uint64]) -> None:
    """Murmur3's 64-bit finaliser, in place, exact in the top 32 bits (all a round reads).

    The finaliser ends with ``x ^= x >> 33``, which leaves the top 32 bits as they are (``x >>
    33`` has its top 33 bits zero), so that last step is skipped: two numpy passes fewer per
    round, and the same permutation (``test_feistel_orders_are_pinned`` holds it).
    """
    for multiplier in (_M1, _M2):
        np.right_shift(x, _S33, out=scratch)
        x ^= scratch
        x *= multiplier


class IdentityOrder:
    """No shuffling: position ``p`` holds index ``p``."""

    def __call__(self, positions: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        return positions.view(np.int64)


class TableOrder:
    """An order stored as a table (torch's ``randperm``), looked up per position."""

    def __init__(self, table: npt.NDArray[np.int64]) -> None:
        self.table = table

    def __call__(self, positions: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        return self.table[positions]


class FeistelOrder:
    """A seeded pseudo-random permutation of ``[0, length)``, evaluated per position.

    Args:
        length: N, the size of the domain.
        keys: the round keys (:func:`round_keys`).
    """

    def __init__(self, length: int, keys: npt.NDArray[np.uint64]) -> None:
        self.length = length
        a = math.isqrt(length - 1) + 1 if length > 1 else 1
        self._a = np.uint64(a)
        self._b = np.uint64(max(1, -(-length // a)))
        self._keys = [np.uint64(k) for k in keys]

    def __call__(self, positions: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        out = self._network(positions)
        outside = np.flatnonzero(out >= self.length)
        while outside.size:  # cycle-walk the few values that land in [N, a*b)
            again = self._network(out[outside])
            out[outside] = again
            outside = outside[again >= self.length]
        return out.view(np.int64)  # every value is below N < 2**63

    def _network(self, x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        a, b = self._a, self._b
        left = x // b
        right = x - left * b
        f = np.empty_like(left)
        scratch = np.empty_like(left)
        for i, key in enumerate(self._keys):
            # Alternate which half is updated; each round adds a keyed hash of the other half,
            # modulo its own radix, so every round (and the network) is invertible.
            source, target, radix = (right, left, a) if i % 2 == 0 else (left, right, b)
            np.add(source, key, out=f)
            _fmix_top(f, scratch)
            f >>= _S32  # Lemire's multiply-shift: the top 32 bits scaled into [0, radix)
            f *= radix
            f >>= _S32
            target += f  # now below 2 * radix: subtract radix where it is not below radix
            np.subtract(target, radix, out=scratch)  # wraps around (huge) where target < radix
            np.minimum(target, scratch, out=target)
        left *= b
        left += right
        return left


@dataclass(frozen=True)
class Share:
    """The positions one rank reads in one pass over an epoch.

    A pass starts at global position ``start`` (0, or where a resumed run stopped) and hands
    rank ``r`` the positions ``start + r + j * world_size``:

    * ``policy="pad"`` (train, torch's default): every rank reads ``ceil(R / W)`` positions, where
      ``R = length - start``; positions past the end wrap to the start of the epoch's order,
      exactly like torch's ``DistributedSampler``.
    * ``policy="drop"`` (train, ``drop_last``): every rank reads ``R // W``; the tail is dropped.
    * ``policy="exact"`` (eval): every remaining position once; counts differ by at most one.
    """

    length: int
    world_size: int
    rank: int
    start: int
    policy: str

    @property
    def remaining(self) -> int:
        return max(0, self.length - self.start)

    @property
    def count(self) -> int:
        """How many positions this rank reads in the pass."""
        left, world = self.remaining, self.world_size
        if self.policy == "exact":
            return max(0, -(-(left - self.rank) // world))
        if self.policy == "drop":
            return left // world
        return -(-left // world)

    @property
    def total(self) -> int:
        """Positions read by all ranks together (torch's ``total_size`` for a fresh pass)."""
        if self.policy == "exact":
            return self.remaining
        return self.count * self.world_size

    def positions(self, lo: int, hi: int) -> npt.NDArray[np.uint64]:
        """Global positions of this rank's reads ``lo..hi-1``, wrapped into ``[0, length)``."""
        first = self.start + self.rank
        out = np.arange(lo, hi, dtype=np.uint64)
        out *= np.uint64(self.world_size)
        out += np.uint64(first)
        if (
            self.policy == "pad"
            and self.length
            and first + (hi - 1) * self.world_size >= self.length
        ):
            np.remainder(out, np.uint64(self.length), out=out)
        return out

    def consumed_after(self, reads: int) -> int:
        """Global positions consumed once every rank has made ``reads`` reads of the pass.

        Ranks read in lockstep in data-parallel training, so after ``reads`` reads each, the
        positions ``[start, start + reads * W)`` are done. A rank that has read its whole share
        reports the epoch complete (in eval the ranks after it read one position fewer).
        """
        if reads >= self.count:
            return self.length
        return min(self.length, self.start + reads * self.world_size)
