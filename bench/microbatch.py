"""Benchmark: MicroBatcher against hand-written gradient accumulation, 1 and 2 gloo processes.

    PYTHONPATH=src python bench/microbatch.py            # about a minute on 2 CPU cores
    PYTHONPATH=src python bench/microbatch.py --quick    # a smoke run (batch 64, 6 rounds)

Three tables:

1. Per-step time at the same microbatch size (no OOM): hand-written accumulation (DDP ``no_sync``
   on all but the last microbatch, so DDP overlaps its all-reduce with the last backward) next to
   ``MicroBatcher`` (every microbatch under ``no_sync``, one vote per batch, a store lookup
   between microbatches at most every 50 ms, then a bucketed all-reduce), and
   ``MicroBatcher(abort_check_interval=None)`` (no lookups). Steps alternate between
   contenders (every order equally often). Ratios to hand-written: of the fastest steps ("min",
   the least disturbed by other processes), the median of per-round ratios ("paired", robust to
   load that changes during the run), and the same for this process's CPU time ("cpu", blind to
   other processes but also to time spent waiting for the network). Goal: within 3%.
1b. The same with one small layer, so that almost all of a step is the machinery: the extra
   microseconds per step, and what they are as a share of the MLP's step.
2. Retries until the size settles when one rank has a memory budget (OOMBudget), against
   ``ceil(log2(batch))``.
3. What the agreement costs by itself: a vote (one agreement on the store) and a flag lookup.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import math
import statistics
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from _util import no_framework_preload
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import unidist
from unidist._microbatch import tally
from unidist._microbatch.tally import Vote
from unidist.collectives import sync
from unidist.session import lifecycle
from unidist.testing import OOMBudget, run_distributed

WIDTH, FEATURES, CLASSES = 1024, 256, 10


def make_model(tiny: bool = False) -> nn.Module:
    """The benchmark MLP (1.3 M parameters), or a single small layer to expose overheads."""
    torch.manual_seed(0)
    if tiny:
        return nn.Linear(FEATURES, CLASSES)
    return nn.Sequential(
        nn.Linear(FEATURES, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, CLASSES),
    )  # fmt: skip


def batches(n: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(unidist.get_rank())
    return [
        (torch.randn(n, FEATURES, generator=gen), torch.randint(0, CLASSES, (n,), generator=gen))
        for _ in range(count)
    ]


def hand_written(model: nn.Module, opt: torch.optim.Optimizer, batch: Any, size: int) -> None:
    """The usual gradient accumulation: sync only on the last microbatch."""
    x, y = batch
    opt.zero_grad(set_to_none=True)
    parts = list(zip(x.split(size), y.split(size), strict=True))
    for i, (xs, ys) in enumerate(parts):
        last = i == len(parts) - 1
        sync = model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext()
        with sync:
            (F.cross_entropy(model(xs), ys) * (len(xs) / len(x))).backward()
    opt.step()


def with_microbatcher(mb: unidist.MicroBatcher, model: nn.Module, opt: Any, batch: Any) -> None:
    opt.zero_grad(set_to_none=True)
    mb.step(batch, lambda b: F.cross_entropy(model(b[0]), b[1]))
    opt.step()


def timing(batch_size: int, size: int, rounds: int, tiny: bool = False) -> dict[str, Any]:
    """Step times of each contender, steps interleaved round by round."""
    torch.set_num_threads(1)
    world = unidist.get_world_size()
    wrap = DDP if world > 1 else (lambda m: m)
    models = {name: wrap(make_model(tiny)) for name in ("hand", "unidist", "unidist-no-check")}
    opts = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in models.items()}
    policy = unidist.SizePolicy(start=size)
    mbs = {
        "unidist": unidist.MicroBatcher(models["unidist"], policy=policy),
        "unidist-no-check": unidist.MicroBatcher(
            models["unidist-no-check"], policy=policy, abort_check_interval=None
        ),
    }
    data = batches(batch_size, 4)
    wall: dict[str, list[float]] = {name: [] for name in models}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    orders = list(itertools.permutations(models))  # every contender in every position equally
    for r in range(rounds + 2):  # the first two rounds warm up
        for name in orders[r % len(orders)]:
            sync.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            if name == "hand":
                hand_written(models[name], opts[name], data[r % 4], size)
            else:
                with_microbatcher(mbs[name], models[name], opts[name], data[r % 4])
            if r >= 2:
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    drift = max(
        ((a - b).abs().max() / b.abs().max()).item()
        for a, b in zip(models["unidist"].parameters(), models["hand"].parameters(), strict=True)
    )
    return {
        "min_ms": {n: 1e3 * min(t) for n, t in wall.items()},
        "median_ms": {n: 1e3 * statistics.median(t) for n, t in wall.items()},
        "paired": _paired(wall),
        "cpu": _paired(cpu),
        "drift": drift,
    }


def _paired(times: dict[str, list[float]]) -> dict[str, float]:
    """Median over rounds of (contender's step / hand-written step of the same round)."""
    return {
        n: statistics.median(a / b for a, b in zip(t, times["hand"], strict=True))
        for n, t in times.items()
    }


def settling(batch_size: int, budgets: list[int]) -> list[dict[str, Any]]:
    """Retries until the size settles, with a budget on the last rank only."""
    torch.set_num_threads(1)
    world = unidist.get_world_size()
    rows = []
    for budget in budgets:
        model = DDP(make_model()) if world > 1 else make_model()
        mb = unidist.MicroBatcher(model)
        inner = model.module if world > 1 else model
        data = batches(batch_size, 3)
        with OOMBudget({world - 1: budget}).attach(inner):
            for batch in data:
                mb.step(batch, lambda b, m=model: F.cross_entropy(m(b[0]), b[1]))
        rows.append({"budget": budget, "size": mb.size, "retries": mb.retries})
    return rows


def agreement_costs(rounds: int) -> dict[str, float]:
    """Microseconds per vote (the MicroBatcher's agreement over every rank) and per flag lookup."""
    flag = sync.Flag(lifecycle.session_for("bench"), "bench", "never")
    vote = Vote("ok", 32, 256).to_json()
    sync.barrier()
    start = time.perf_counter()
    for _ in range(rounds):
        sync.agree(vote, tally.combine, 30, "bench vote")
    per_vote = (time.perf_counter() - start) / rounds
    lookup = 0.0
    if flag.usable:
        start = time.perf_counter()
        for _ in range(rounds):
            flag.is_raised()
        lookup = (time.perf_counter() - start) / rounds
    sync.barrier()
    return {"vote_us": 1e6 * per_vote, "lookup_us": 1e6 * lookup}


def job(batch_size: int, size: int, rounds: int, budgets: list[int]) -> dict[str, Any]:
    logging.getLogger("unidist.microbatch").setLevel(logging.ERROR)  # table 2 has the retries
    return {
        "timing": timing(batch_size, size, rounds),
        "machinery": timing(batch_size, size, 30 * rounds, tiny=True),
        "settling": settling(batch_size, budgets),
        "costs": agreement_costs(200),
    }


def single_process(batch_size: int, size: int, rounds: int, budgets: list[int]) -> dict[str, Any]:
    unidist.initialize()
    try:
        return job(batch_size, size, rounds, budgets)
    finally:
        unidist.finalize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch", type=int, default=None, help="per-rank batch size (256; 64 with --quick)"
    )
    parser.add_argument("--size", type=int, default=32, help="microbatch size for the timing")
    parser.add_argument("--rounds", type=int, default=48, help="timed steps per contender")
    parser.add_argument("--quick", action="store_true", help="a few steps only")
    args = parser.parse_args()
    no_framework_preload()
    rounds = 6 if args.quick else args.rounds
    batch = args.batch if args.batch is not None else 64 if args.quick else 256
    budgets = [budget for budget in (1, 7, 32, 100) if budget < batch - 1] + [batch - 1]
    results = {1: single_process(batch, args.size, rounds, budgets)}
    per_rank = run_distributed(job, batch, args.size, rounds, budgets, world_size=2, timeout=900)
    results[2] = per_rank[0]
    return report(results, batch, args.size)


def report(results: dict[int, dict[str, Any]], batch: int, size: int) -> int:
    ok = True
    print(f"\n1. Step time, batch {batch} per rank, microbatch {size} ({batch // size} per batch)")
    print(
        f"{'ranks':>5}  {'contender':<33}{'min ms':>8}{'median ms':>10}"
        f"{'min':>7}{'paired':>8}{'cpu':>7}   (ratios to hand-written)"
    )
    names = {
        "hand": "hand-written accumulation",
        "unidist": "MicroBatcher",
        "unidist-no-check": "MicroBatcher(no abort checks)",
    }
    for world, result in results.items():
        t = result["timing"]
        for key, label in names.items():
            print(
                f"{world:>5}  {label:<33}{t['min_ms'][key]:>8.2f}{t['median_ms'][key]:>10.2f}"
                f"{t['min_ms'][key] / t['min_ms']['hand']:>7.3f}{t['paired'][key]:>8.3f}"
                f"{t['cpu'][key]:>7.3f}"
            )
        print(f"{'':>5}  (parameters after the run differ by {t['drift']:.1e})")
    print("\n1b. The machinery alone: the same with one small layer (almost no compute)")
    print(f"{'ranks':>5}  {'contender':<33}{'min us':>8}{'extra us':>10}{'% of MLP step':>15}")
    for world, result in results.items():
        t, mlp = result["machinery"], result["timing"]["min_ms"]["hand"] * 1e3
        for key, label in names.items():
            extra = 1e3 * (t["min_ms"][key] - t["min_ms"]["hand"])
            print(
                f"{world:>5}  {label:<33}{1e3 * t['min_ms'][key]:>8.0f}{extra:>10.0f}"
                f"{100 * extra / mlp:>14.2f}%"
            )
    bound = math.ceil(math.log2(batch))
    print(f"\n2. Retries until the size settles (batch {batch}; bound ceil(log2 batch) = {bound})")
    print(f"{'ranks':>5}{'budget':>8}{'settled':>9}{'retries':>9}  ok")
    for world, result in results.items():
        for row in result["settling"]:
            good = row["retries"] <= bound and row["size"] <= row["budget"]
            ok &= good
            print(
                f"{world:>5}{row['budget']:>8}{row['size']:>9}{row['retries']:>9}  "
                f"{'yes' if good else 'NO'}"
            )
    print("\n3. Agreement costs")
    for world, result in results.items():
        costs = result["costs"]
        print(
            f"{world:>5} rank(s): vote {costs['vote_us']:.0f} us per batch, flag lookup "
            f"{costs['lookup_us']:.0f} us per microbatch"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
