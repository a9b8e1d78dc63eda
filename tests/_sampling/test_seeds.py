"""The round keys' seed state: numpy's SeedSequence, without importing numpy.random."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from unidist._sampling.seeds import state


def _cases() -> list[tuple[int, tuple[int, ...], int]]:
    draw = random.Random(20261203)
    cases = [(0, (), 1), (0, (0, 0), 6), (1, (0, 1), 6), ((1 << 64) - 1, (1 << 63, 0), 6)]
    for _ in range(2000):
        entropy = draw.choice([0, draw.getrandbits(draw.randint(1, 300))])
        key = tuple(draw.getrandbits(draw.randint(1, 80)) for _ in range(draw.randint(0, 5)))
        cases.append((entropy, key, draw.randint(1, 9)))
    return cases


def test_state_is_numpys_seed_sequence_for_every_kind_of_input() -> None:
    # Entropy of 1 to 10 words, spawn keys of 0 to 5 entries of up to 3 words each: the pool's
    # padding, its extra-entropy rounds and the output cycle are all reached.
    for entropy, key, count in _cases():
        want = np.random.SeedSequence(entropy, spawn_key=key).generate_state(count, np.uint64)
        assert state(entropy, key, count) == want.tolist(), (entropy, key, count)


@pytest.mark.parametrize(("entropy", "key"), [(-1, (0,)), (1, (0, -3))])
def test_negative_seed_material_is_refused_as_numpy_refuses_it(
    entropy: int, key: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError, match="natural number"):
        state(entropy, key, 6)
    with pytest.raises(ValueError, match="non-negative"):
        np.random.SeedSequence(entropy, spawn_key=key)


def test_the_first_batch_of_a_large_shuffled_epoch_does_not_import_numpy_random() -> None:
    # numpy.random's import cost 7-10 ms, all of it on the first batch (torch does not import it).
    # numpy 1.x imports it with numpy itself: then there is no import for unidist to avoid.
    code = (
        "import sys, numpy, unidist\n"
        "before = 'numpy.random' in sys.modules\n"
        "s = unidist.DistributedSampler(range(10**9), num_replicas=8, rank=0, order='fast')\n"
        "first = next(iter(unidist.BatchSampler(s, 256, drop_last=False)))\n"
        "print(len(first), before, 'numpy.random' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    size, before, after = done.stdout.split()
    assert size == "256"
    assert after == before
    if int(np.__version__.split(".")[0]) >= 2:  # numpy 2 loads numpy.random on first use only
        assert after == "False"
