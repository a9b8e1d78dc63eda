"""``unidist smoke``: a tiny job through the launcher that checks every collective across ranks.

Run it before debugging a real job: if this fails, the problem is the machine, the network or the
installation, not the training script. Each rank runs the same checks in the same order, once
through every installed adapter (torch, then Composer and Ignite where installed, and any
third-party adapter); rank 0 prints a pass/fail table with the slowest rank's time for each
check, and one verdict per adapter.

    unidist smoke -n 2 --backend gloo
    python -m unidist.cli.smoke --backend gloo   # what each rank runs
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CHECKS", "main"]


def _check_all_reduce() -> str:
    import torch

    import unidist

    rank, world = unidist.get_rank(), unidist.get_world_size()
    total = unidist.all_reduce(torch.tensor([rank + 1.0])).item()
    mean = unidist.all_reduce(float(rank), "mean")
    biggest = unidist.all_reduce(2**40 + rank, "max")
    assert total == world * (world + 1) / 2, f"sum {total}"
    assert mean == (world - 1) / 2, f"mean {mean}"
    assert isinstance(biggest, int), f"max {biggest!r} is not an int"
    assert biggest == 2**40 + world - 1, f"max {biggest!r}"
    return "sum, mean, max; ints stay ints"


def _check_all_gather() -> str:
    import torch

    import unidist

    rank, world = unidist.get_rank(), unidist.get_world_size()
    rows = unidist.all_gather(torch.full((4,), float(rank)))
    uneven = unidist.all_gather_uneven(torch.ones(rank + 1, 2))
    assert [int(r[0]) for r in rows] == list(range(world)), "all_gather order"
    assert [u.shape[0] for u in uneven] == [r + 1 for r in range(world)], "uneven shapes"
    return "equal and uneven shapes"


def _check_objects() -> str:
    import unidist

    rank, world = unidist.get_rank(), unidist.get_world_size()
    gathered = unidist.all_gather_object({"rank": rank})
    sent = unidist.broadcast_object({"from": 0} if rank == 0 else None)
    assert gathered == [{"rank": r} for r in range(world)], f"gathered {gathered}"
    assert sent == {"from": 0}, f"broadcast {sent}"
    return "all_gather_object, broadcast_object"


def _check_broadcast() -> str:
    import torch

    import unidist

    t = unidist.broadcast(torch.full((1024,), float(unidist.get_rank())), src=0)
    assert bool((t == 0).all()), "broadcast values"
    return "tensor from rank 0"


def _check_barrier() -> str:
    import unidist

    unidist.barrier()
    unidist.barrier(timeout=30)
    return "plain and with a 30 s timeout"


def _check_groups() -> str:
    import unidist

    rank, world = unidist.get_rank(), unidist.get_world_size()
    members = list(range(0, world, 2))
    group = unidist.new_group(members)
    if rank in group:
        got = unidist.all_reduce(1, group=group)
        assert got == len(members), f"group sum {got}"
    unidist.barrier()
    return f"subgroup {members}"


def _check_one_rank_first() -> str:
    import unidist

    with unidist.one_rank_first(timeout=30):
        pass
    return "rank 0 first, then the others"


def _check_sampler() -> str:
    import unidist

    rank, world = unidist.get_rank(), unidist.get_world_size()
    train = unidist.DistributedSampler(1001, seed=3)
    evaluation = unidist.DistributedSampler(1001, mode="eval", shuffle=False)
    train_parts = unidist.all_gather_object(list(train))
    eval_parts = unidist.all_gather_object(list(evaluation))
    assert len({len(part) for part in train_parts}) == 1, "train shards differ in length"
    assert set().union(*map(set, train_parts)) == set(range(1001)), "train shards miss samples"
    assert sorted(i for part in eval_parts for i in part) == list(range(1001)), "eval not once"
    assert len(eval_parts[rank]) in (1001 // world, 1001 // world + 1), "eval shard size"
    return "train shards cover, eval shards exactly once"


CHECKS: dict[str, Callable[[], str]] = {
    "all_reduce": _check_all_reduce,
    "all_gather": _check_all_gather,
    "objects": _check_objects,
    "broadcast": _check_broadcast,
    "barrier": _check_barrier,
    "groups": _check_groups,
    "one_rank_first": _check_one_rank_first,
    "sampler": _check_sampler,
}


def _run(name: str, check: Callable[[], str]) -> tuple[bool, float, str]:
    started = time.perf_counter()
    try:
        detail = check()
        return True, time.perf_counter() - started, detail
    except Exception as exc:  # a failed check is a table row
        return False, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"[:200]


def adapters_to_check() -> list[str]:
    """The installed adapters that run across processes: the one in use first, then the rest."""
    import unidist
    from unidist.adapters import registry

    first = unidist.current_adapter().name
    others = [name for name in registry.available() if name not in (first, "serial")]
    return [first, *others]


def _check_adapter(
    name: str, started: tuple[bool, float, str] | None
) -> dict[str, tuple[bool, float, str]]:
    """Every check with collectives routed through the adapter ``name``.

    ``started`` is the ``initialize`` row of the adapter that started the process group; the
    other adapters adopt that group, and their first row says how long adopting took.
    """
    import unidist

    began = time.perf_counter()
    try:
        with unidist.use(name):
            first = started or (True, time.perf_counter() - began, "adopted the process group")
            return {"initialize": first, **{c: _run(c, check) for c, check in CHECKS.items()}}
    except Exception as exc:  # the adapter could not adopt the process group: one failed row
        return {"initialize": (False, time.perf_counter() - began, f"{type(exc).__name__}: {exc}")}


def main(argv: list[str] | None = None) -> int:
    """Run every check through every installed adapter on this rank; rank 0 prints the table.

    Exit status 1 if any check failed on any rank.
    """
    import unidist

    parser = argparse.ArgumentParser(description="unidist smoke check (one rank)")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    unidist.initialize(args.backend, timeout=args.timeout)
    init = (True, time.perf_counter() - started, f"backend {unidist.backend()}")
    names = adapters_to_check()
    mine = {name: _check_adapter(name, init if name == names[0] else None) for name in names}
    everyone: list[dict[str, Any]] = unidist.all_gather_object(mine)
    unidist.finalize()
    verdicts = {
        name: all(r[0] for results in everyone for r in results[name].values()) for name in names
    }
    if unidist.is_main_process():
        print(_table(everyone, names))
        summary = ", ".join(f"{n} {'ok' if ok else 'FAILED'}" for n, ok in verdicts.items())
        passed = "PASSED" if all(verdicts.values()) else "FAILED"
        print(f"smoke check {passed} on {len(everyone)} rank(s); adapters: {summary}")
    return 0 if all(verdicts.values()) else 1


def _table(everyone: list[dict[str, Any]], names: list[str]) -> str:
    lines = [f"{'adapter':<10} {'check':<16} {'result':<6} {'slowest ms':>10}  detail"]
    for adapter in names:
        for name in everyone[0][adapter]:
            results = [ranks[adapter][name] for ranks in everyone]
            failed = [r for r, result in enumerate(results) if not result[0]]
            slowest = max(result[1] for result in results) * 1000
            detail = results[failed[0]][2] if failed else results[0][2]
            status = "ok" if not failed else f"FAIL {failed}"
            lines.append(f"{adapter:<10} {name:<16} {status:<6} {slowest:>10.1f}  {detail}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
