"""One DataLoader epoch with one worker on each rank of a launched job; prints ``epoch SECONDS``.

Timed as ``bench/launch.py``'s ``one_epoch`` times it in ``unidist.spawn`` ranks, after a first
epoch that warms the imports, with the same loader (unidist's: it watches the workers it forks,
see ``one_epoch``).
"""

from __future__ import annotations

import time

import unidist


def one_epoch() -> float:
    started = time.perf_counter()
    loader = unidist.StatefulDataLoader(list(range(64)), batch_size=8, num_workers=1)
    assert sum(len(batch) for batch in loader) == 64
    return time.perf_counter() - started


if __name__ == "__main__":
    one_epoch()
    print(f"epoch {one_epoch()!r}", flush=True)
