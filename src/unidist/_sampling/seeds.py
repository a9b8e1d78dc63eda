"""numpy's ``SeedSequence(entropy, spawn_key=...).generate_state(n, uint64)``, in Python ints.

The shuffled order's round keys are numpy's ``SeedSequence`` state (its hash and mixing
constants follow Melissa O'Neill's ``seed_seq`` design; the algorithm is the one numpy 1.17
introduced). Asking numpy for it imports ``numpy.random``: 7-10 ms in a process that has not
imported it yet (torch does not), all of it spent on the first batch of a run. Four pool words
and a few dozen 32-bit operations here take about 30 us, and give the same keys, so every order
and every checkpoint stays as it was.

``tests/_sampling/test_seeds.py`` compares :func:`state` with the installed numpy's
``SeedSequence`` over two thousand inputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import cycle

__all__ = ["state"]

_MASK32 = 0xFFFFFFFF
_POOL = 4  # numpy's default pool size, in 32-bit words
_SHIFT = 16  # half a 32-bit word
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875  # hashes that mix the entropy into the pool
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED  # hashes that draw the output from the pool
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715  # combines two pool words


def _words(value: int) -> list[int]:
    """A natural number as 32-bit words, least significant first (0 is one word)."""
    if value < 0:
        raise ValueError(f"seed material must be a natural number, got {value}")
    words = [value & _MASK32]
    value >>= 32
    while value:
        words.append(value & _MASK32)
        value >>= 32
    return words


class _Hash:
    """The running multiplier of one hashing pass (each call moves it on)."""

    def __init__(self, start: int, multiplier: int) -> None:
        self.constant, self.multiplier = start, multiplier

    def __call__(self, value: int) -> int:
        value ^= self.constant
        self.constant = (self.constant * self.multiplier) & _MASK32
        value = (value * self.constant) & _MASK32
        return value ^ (value >> _SHIFT)


def _mix(x: int, y: int) -> int:
    result = (_MIX_L * x - _MIX_R * y) & _MASK32
    return result ^ (result >> _SHIFT)


def _pool(entropy: list[int]) -> list[int]:
    hashed = _Hash(_INIT_A, _MULT_A)
    pool = [hashed(entropy[i] if i < len(entropy) else 0) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = _mix(pool[dst], hashed(pool[src]))
    for extra in entropy[_POOL:]:
        for dst in range(_POOL):
            pool[dst] = _mix(pool[dst], hashed(extra))
    return pool


def state(entropy: int, spawn_key: Sequence[int], count: int) -> list[int]:
    """``count`` 64-bit words, as ``SeedSequence(entropy, spawn_key).generate_state(count,
    np.uint64)`` gives them (natural-number ``entropy`` and ``spawn_key`` entries only)."""
    run = _words(entropy)
    spawned = [word for part in spawn_key for word in _words(part)]
    if spawned and len(run) < _POOL:
        run += [0] * (_POOL - len(run))
    source: Iterator[int] = cycle(_pool(run + spawned))
    drawn = _Hash(_INIT_B, _MULT_B)
    words = [drawn(next(source)) for _ in range(2 * count)]
    return [low | (high << 32) for low, high in zip(words[::2], words[1::2], strict=True)]
