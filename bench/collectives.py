"""Per-call cost of unidist's collectives against raw torch.distributed, 2 gloo ranks.

    python bench/collectives.py [--rounds 31]
    python bench/collectives.py --quick    # 3 rounds: checks that it runs (the test command)

Both sides run in the same two processes, in blocks: raw, unidist, and raw again. The order of
the three turns round by round (raw-unidist-again, unidist-again-raw, again-raw-unidist), so
each holds each place in the round equally often; each block is preceded by a barrier. The
table shows the median per-call time of each side, the ratio unidist / raw (goal: within 1.05)
and, as the noise floor, the ratio of raw torch to itself (again / raw): a ratio of unidist's
inside that spread is not a cost that this machine can measure. On a 2-core machine the ranks
wake each other for every small call, and a microsecond of Python moves that phase: 1 element
costs 150-500 us a call here, and torch's A/A ratio alone strays by 5-25 %.

So the last two columns measure unidist's own cost without that noise: the same unidist call
with the adapter's primitive replaced by a stub that returns at once, less the stub's own
call (the CPU time of every check and conversion unidist makes around torch's call), and that
cost as a share of the raw call. A quiet machine cannot show more than that share.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import median, no_framework_preload, table

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


#: Block order per round, turning so that each side holds each place equally often.
ORDERS = (("raw", "ours", "again"), ("ours", "again", "raw"), ("again", "raw", "ours"))


def _own_cost(op: str, ours, x) -> float:  # type: ignore[no-untyped-def]
    """Seconds per call of unidist's code around the primitive ``op`` (stubbed out)."""
    import torch

    import unidist

    adapter = unidist.current_adapter()
    stubs = {
        "all_reduce": lambda tensor, *_: tensor,
        "broadcast": lambda tensor, *_: tensor,
        "all_gather": lambda tensor, *_: [torch.empty_like(tensor), torch.empty_like(tensor)],
    }
    stub = stubs[op]
    setattr(adapter, op, stub)  # on the instance: the class's method is back after delattr
    try:
        calls = 20_000
        ours()  # warm
        with_stub = min(_time_alone(ours, calls) for _ in range(3))
        stub_alone = min(_time_alone(lambda: stub(x, None, None), calls) for _ in range(3))
    finally:
        delattr(adapter, op)
    return max(0.0, with_stub - stub_alone)


def _time_alone(call, calls: int) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls


def measure(rounds: int) -> list[tuple[str, str, float, float, float, float]]:
    import torch

    rows = []
    for size_name, numel in SIZES.items():
        calls = 400 if numel == 1 else 20
        x = torch.ones(numel)
        for op, (raw, ours) in _cases(x).items():
            sides = {"raw": raw, "ours": ours, "again": raw}
            _time_block(raw, calls)  # warm-up both paths
            _time_block(ours, calls)
            times: dict[str, list[float]] = {side: [] for side in sides}
            for i in range(rounds):
                for side in ORDERS[i % len(ORDERS)]:
                    times[side].append(_time_block(sides[side], calls))
            own = _own_cost(op, ours, x)
            medians = [median(times[side]) for side in ("raw", "ours", "again")]
            rows.append((op, size_name, *medians, own))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="3 rounds (a smoke run)")
    args = parser.parse_args()
    no_framework_preload()
    if args.quick:
        args.rounds = 3
    from unidist.testing import run_distributed

    per_rank = run_distributed(measure, args.rounds, world_size=2, timeout=900, adapter="torch")
    rows = []
    for i, (op, size, raw0, ours0, again0, own0) in enumerate(per_rank[0]):
        other = per_rank[1][i]
        raw, ours, again = max(raw0, other[2]), max(ours0, other[3]), max(again0, other[4])
        own = max(own0, other[5])
        rows.append(
            (op, size, raw * 1e6, ours * 1e6, ours / raw, again / raw, own * 1e6, own / raw)
        )
    print("2 gloo ranks on one machine; microseconds per call (slower rank's median)")
    headers = ["op", "tensor", "torch us", "unidist us", "ratio", "torch A/A (noise)"]
    headers += ["unidist's own us", "own / torch"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
