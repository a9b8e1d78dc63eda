"""Per-call cost of unidist's collectives against raw torch.distributed, 2 gloo ranks.

    python bench/collectives.py [--rounds 15]
    python bench/collectives.py --quick    # 3 rounds: checks that it runs (the test command)

Both sides run in the same two processes, interleaved in alternating blocks (raw, unidist, raw
again, ...) so drift on a shared machine hits both alike. Each block is preceded by a barrier; the
table shows the median per-call time of each side, the ratio unidist / raw (goal: within 1.05)
and, as the noise floor, the ratio of raw torch to itself (its second block of each round
against its first): a ratio of unidist's inside that spread is not a cost that this machine
can measure. On a 2-core machine the ranks wake each other for every small call, and a
microsecond of Python moves that phase: 1 element costs 200-500 us a call here, and torch's
A/A ratio alone strays by 5-20 %.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import median, table

SIZES = {"1 element": 1, "1 MiB": 262_144}  # float32


def _time_block(call, calls: int) -> float:  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls


def _cases(x):  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed as dist

    import unidist

    def raw_gather() -> None:
        # unidist.all_gather returns new tensors, so the raw call allocates its outputs too,
        # as torch code (and Composer's and Ignite's all_gather) does on every call.
        dist.all_gather([torch.empty_like(x) for _ in range(dist.get_world_size())], x)

    return {
        "all_reduce": (lambda: dist.all_reduce(x), lambda: unidist.all_reduce(x)),
        "broadcast": (lambda: dist.broadcast(x, 0), lambda: unidist.broadcast(x, 0)),
        "all_gather": (raw_gather, lambda: unidist.all_gather(x)),
    }


def measure(rounds: int) -> list[tuple[str, str, float, float, float]]:
    import torch

    rows = []
    for size_name, numel in SIZES.items():
        calls = 400 if numel == 1 else 20
        for op, (raw, ours) in _cases(torch.ones(numel)).items():
            _time_block(raw, calls)  # warm-up both paths
            _time_block(ours, calls)
            raw_times, our_times, again_times = [], [], []
            for _ in range(rounds):
                raw_times.append(_time_block(raw, calls))
                our_times.append(_time_block(ours, calls))
                again_times.append(_time_block(raw, calls))
            rows.append((op, size_name, median(raw_times), median(our_times), median(again_times)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="3 rounds (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 3
    from unidist.testing import run_distributed

    per_rank = run_distributed(measure, args.rounds, world_size=2, timeout=900, adapter="torch")
    rows = []
    for i, (op, size, raw0, ours0, again0) in enumerate(per_rank[0]):
        raw = max(raw0, per_rank[1][i][2])
        ours = max(ours0, per_rank[1][i][3])
        again = max(again0, per_rank[1][i][4])
        rows.append((op, size, raw * 1e6, ours * 1e6, ours / raw, again / raw))
    print("2 gloo ranks on one machine; microseconds per call (slower rank's median)")
    headers = ["op", "tensor", "torch us", "unidist us", "ratio", "torch A/A (noise)"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
