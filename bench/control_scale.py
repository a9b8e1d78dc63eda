"""Benchmark: the control plane from 2 to 1,024 ranks, the old protocol beside the new one.

    PYTHONPATH=src python bench/control_scale.py            # a few minutes on 2 CPU cores
    PYTHONPATH=src python bench/control_scale.py --quick    # seconds

1. W simulated ranks: four worker processes with W/4 threads each, every rank with its own store
   client, all against one store server started the way each protocol starts it (the new one
   through ``unidist.session.listen``: on loopback, libuv from torch 2.8, torch's older server
   before; the old one as ``TCPStore(host, 0, ...)``, which listens on every interface). Each
   rank drives the real code: the new ``ControlPlane`` (``agree`` with the MicroBatcher's tally
   for the vote, ``barrier`` for a timed barrier, ``exchange`` as ``one_rank_first`` uses it),
   and a faithful copy of the old one (below; the library no longer has it), whose vote was an
   exchange in which every rank publishes and reads every other rank's key. Calls run back to
   back (the protocol itself keeps the ranks in step): milliseconds per call, and store calls
   per call (client operations over all ranks; ``get`` counts once though it is a wait and a
   read) and keys named by them, which shows the old O(W^2) against the new O(W).
   The old protocol runs up to ``--old-max`` ranks (256): beyond, one call takes seconds.
   The new vote passes the MicroBatcher's ``expected`` vote (a step like the last one: the last
   arrival combines without reading the arrivals); "vote read" is the same vote without it (the
   path of a step in which some rank's vote differs). "floor" is the store traffic of one vote
   with no unidist code at all (append, add, the last rank sets the outcome, the others get it):
   what the simulation itself costs, threads and store included, at each W.
   Goals: W = 256 at most 25 ms per vote and per barrier, W = 1024 at most 150 ms, time growing
   no faster than W from 128 to 1024.
2. Two real processes (``run_distributed``, gloo): microseconds per vote and per timed barrier,
   old against new, blocks alternating. Goal: the new vote no slower than the old one.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from _util import no_framework_preload

import unidist
from unidist._microbatch import tally
from unidist._microbatch.tally import Vote
from unidist.collectives import sync
from unidist.session import lifecycle, listen
from unidist.session.control import ControlPlane, ExpectedValues
from unidist.session.wire import new_secret
from unidist.testing import run_distributed

WORKERS = 4
OPS = ("vote", "barrier", "exchange")
NEW_OPS = (*OPS, "vote read", "floor")
OPERATIONS = {
    "set",
    "get",
    "add",
    "append",
    "check",
    "wait",
    "multi_get",
    "multi_set",
    "compare_set",
    "delete_key",
}
SECONDS = 120.0
VOTE = Vote("ok", 32, 256).to_json()
OLD_VOTE = ("ok", 32, 256, "", ())  # what the old vote pickled, field for field
EXPECTED = ExpectedValues(
    VOTE
)  # what the MicroBatcher declares after a step in which every rank voted VOTE


# -- the old protocol, as unidist had it before (faithful copy, for the comparison) ---------------


class OldPlane:
    """The old ControlPlane: one key per rank per call, every rank waits for all, pickled values."""

    def __init__(self, store: Any, rank: int) -> None:
        self._store = store
        self._rank = rank
        self._counters: dict[tuple[str, tuple[int, ...]], int] = {}
        self._published: dict[tuple[int, ...], list[str]] = {}

    def _next(self, kind: str, members: Sequence[int]) -> tuple[str, int]:
        key = (kind, tuple(members))
        count = self._counters.get(key, 0) + 1
        self._counters[key] = count
        return f"unidist/control/{kind}/{'-'.join(map(str, members))}", count

    def barrier(self, members: Sequence[int], seconds: float, what: str) -> None:
        base, count = self._next("barrier", members)
        self._store.set(f"{base}/{count}/{self._rank}", b"1")
        self._store.wait([f"{base}/{count}/{rank}" for rank in members], timedelta(seconds=seconds))
        if count > 1:
            self._store.delete_key(f"{base}/{count - 1}/{self._rank}")

    def exchange(
        self,
        members: Sequence[int],
        value: object,
        publish: bool,
        wait_for: Sequence[int],
        seconds: float,
        what: str,
    ) -> dict[int, object]:
        base, count = self._next("exchange", members)
        mine = f"{base}/{count}/{self._rank}"
        if publish:
            self._store.set(mine, pickle.dumps(value))
        keys = [f"{base}/{count}/{rank}" for rank in wait_for]
        self._store.wait(keys, timedelta(seconds=seconds))
        raw = self._store.multi_get(keys) if keys else []
        # The old code unpickled what the store gave it: the flaw this issue removes.
        values = {rank: pickle.loads(data) for rank, data in zip(wait_for, raw, strict=True)}
        stale = self._published.setdefault(tuple(members), [])
        if publish and set(wait_for) >= set(members):
            for key in stale:
                self._store.delete_key(key)
            stale.clear()
        if publish:
            stale.append(mine)
        return values


def old_server() -> Any:
    """The store as the old ControlPlane.start made it (listening on every interface)."""
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=SECONDS))


def old_client(port: int) -> Any:
    return dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=SECONDS))


class Floor:
    """The store traffic of one vote and nothing else: no seals, no JSON, no checks."""

    def __init__(self, store: Any, rank: int) -> None:
        self._store = store
        self._rank = rank
        self._generation = 0

    def vote(self, members: Sequence[int]) -> None:
        self._generation += 1
        base = f"floor/{self._generation}"
        self._store.append(f"{base}/arrivals", b"%d," % self._rank)
        if int(self._store.add(f"{base}/count", 1)) == len(members):
            self._store.multi_set([f"{base}/outcome"], [b"ok"])
        else:
            self._store.get(f"{base}/outcome")


# -- counting store operations ----------------------------------------------------------------


class Counting:
    """A store client that counts its operations and the keys they name."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls = 0
        self.keys = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name not in OPERATIONS:
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.keys += len(args[0]) if isinstance(args[0], list) else 1
            return method(*args, **kwargs)

        return counted


def drive(plane: Any, old: bool, op: str, rank: int, members: tuple[int, ...]) -> None:
    """One call of ``op`` on one simulated rank, through the real code of each protocol."""
    what = f"bench {op}"
    if op == "floor":
        plane.vote(members)
    elif op == "barrier":
        plane.barrier(members, SECONDS, what)
    elif op == "exchange":  # one_rank_first(rank=0): rank 0 publishes, everyone reads it
        plane.exchange(members, None, publish=rank == 0, wait_for=[0], seconds=SECONDS, what=what)
    elif old:
        plane.exchange(members, OLD_VOTE, True, members, SECONDS, what)
    elif op == "vote read":
        plane.agree(members, VOTE, tally.combine, SECONDS, what)
    else:
        plane.agree(members, VOTE, tally.combine, SECONDS, what, EXPECTED)


# -- simulated ranks: worker processes with many threads ----------------------------------------


def worker(inbox: Any, outbox: Any, sync_all: Any) -> None:
    """Runs jobs: connect this worker's ranks, then time each op over all workers."""
    while True:
        job = inbox.get()
        if job is None:
            os._exit(0)  # never run destructors of what fork copied
        try:
            outbox.put(run_job(sync_all, **job))
        except BaseException as exc:
            outbox.put({"error": repr(exc)})


def run_job(
    sync_all: Any,
    old: bool,
    port: int,
    address: str,
    secret: bytes,
    ranks: list[int],
    world: int,
    calls: int,
) -> dict[str, Any]:
    members = tuple(range(world))
    timeout = timedelta(seconds=SECONDS)
    links = [None if old else listen.connect(address, port, timeout) for _ in ranks]
    stores = [Counting(old_client(port) if link is None else link.store) for link in links]
    for link, store in zip(links, stores, strict=True):
        if link is not None:
            link.store = store  # the plane's round trips are counted too
    planes = [
        OldPlane(store, rank) if link is None else ControlPlane(link, rank, secret)
        for store, rank, link in zip(stores, ranks, links, strict=True)
    ]
    floors = [Floor(store, rank) for store, rank in zip(stores, ranks, strict=True)]
    go, done = threading.Barrier(len(ranks) + 1), threading.Barrier(len(ranks) + 1)
    ops = OPS if old else NEW_OPS
    phases = [(op, count) for op in ops for count in (1, calls)]  # a warm-up call, then timed

    def rank_thread(index: int) -> None:
        for op, count in phases:
            go.wait()
            plane = floors[index] if op == "floor" else planes[index]
            for _ in range(count):
                drive(plane, old, op, ranks[index], members)
            done.wait()

    threads = [
        threading.Thread(target=rank_thread, args=(i,), daemon=True) for i in range(len(ranks))
    ]
    for thread in threads:
        thread.start()
    results: dict[str, Any] = {}
    for op, count in phases:
        sync_all.wait()  # every worker is ready: the ranks start together
        before = sum(s.calls for s in stores), sum(s.keys for s in stores)
        start = time.perf_counter()
        go.wait()
        done.wait()
        elapsed = time.perf_counter() - start
        if count == calls:
            calls_made = sum(s.calls for s in stores) - before[0]
            keys = sum(s.keys for s in stores) - before[1]
            results[op] = (elapsed, calls_made, keys)
    for thread in threads:
        thread.join()
    return results


def simulate(pool: list[Any], sync_all: Any, old: bool, world: int, calls: int) -> dict[str, Any]:
    """Milliseconds and store calls per call of each op with ``world`` simulated ranks."""
    secret = new_secret()
    if old:
        server, address = old_server(), "127.0.0.1"
    else:
        served, address = listen.serve(listen.LOOPBACK, timedelta(seconds=SECONDS))
        server = served.store
    for index, (inbox, _) in enumerate(pool):
        ranks = list(range(index, world, WORKERS))
        job = {"old": old, "port": server.port, "address": address, "secret": secret}
        inbox.put({**job, "ranks": ranks, "world": world, "calls": calls})
    parts = [outbox.get(timeout=3600) for _, outbox in pool]
    for part in parts:
        if "error" in part:
            raise RuntimeError(f"a worker failed: {part['error']}")
    del server
    return {
        op: {
            "ms": 1e3 * max(part[op][0] for part in parts) / calls,
            "calls": sum(part[op][1] for part in parts) / calls,
            "keys": sum(part[op][2] for part in parts) / calls,
        }
        for op in (OPS if old else NEW_OPS)
    }


def start_pool() -> tuple[list[Any], Any]:
    """Worker processes, forked before any store exists (no server thread is copied)."""
    context = multiprocessing.get_context("fork")
    sync_all = context.Barrier(WORKERS)
    pool = []
    for _ in range(WORKERS):
        inbox, outbox = context.Queue(), context.Queue()
        context.Process(target=worker, args=(inbox, outbox, sync_all), daemon=True).start()
        pool.append((inbox, outbox))
    return pool, sync_all


# -- two real processes ---------------------------------------------------------------------------


def two_ranks(rounds: int, blocks: int) -> dict[str, list[float]]:
    """Microseconds per vote and per timed barrier, old and new, in alternating blocks."""
    session = lifecycle.session_for("bench")
    rank, members = unidist.get_rank(), (0, 1)
    server = old_server() if rank == 0 else None
    port = unidist.broadcast_object(server.port if server is not None else None)
    old = OldPlane(server if server is not None else old_client(port), rank)
    new = session.comm.plane
    assert new is not None
    contenders: dict[str, Callable[[], object]] = {
        "old vote": lambda: old.exchange(members, OLD_VOTE, True, members, SECONDS, "vote"),
        "new vote": lambda: sync.agree(VOTE, tally.combine, SECONDS, "vote", EXPECTED),
        "new vote read": lambda: sync.agree(VOTE, tally.combine, SECONDS, "vote read"),
        "old barrier": lambda: old.barrier(members, SECONDS, "barrier"),
        "new barrier": lambda: new.barrier(members, SECONDS, "barrier"),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for block in range(blocks):
        order = list(contenders) if block % 2 == 0 else list(reversed(contenders))
        for name in order:
            unidist.barrier()
            start = time.perf_counter()
            for _ in range(rounds):
                contenders[name]()
            times[name].append(1e6 * (time.perf_counter() - start) / rounds)
    unidist.barrier()
    return times


# -- report ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,8,32,128,256,512,1024", help="world sizes")
    parser.add_argument("--old-max", type=int, default=256, help="largest W for the old protocol")
    parser.add_argument("--quick", action="store_true", help="small worlds, few calls")
    args = parser.parse_args()
    no_framework_preload()
    worlds = [2, 8, 32] if args.quick else [int(w) for w in args.worlds.split(",")]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # three descriptors per client
    if max(worlds) * 3 + 64 > hard:
        print(f"RLIMIT_NOFILE is {hard}: too low for {max(worlds)} clients", file=sys.stderr)
        return 1
    pool, sync_all = start_pool()
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    for world in worlds:
        for old in (True, False):
            if old and world > args.old_max:
                continue
            budget = 300 if old else 2000  # calls times ranks, about the same time for each
            least = 2 if args.quick else 3 if old else 8  # a new call at W=1024 is ~0.2 s
            calls = max(least, min(10 if args.quick else 40, budget // world))
            rows[(world, "old" if old else "new")] = simulate(pool, sync_all, old, world, calls)
            print(f"  W={world} {'old' if old else 'new'}: {calls} calls", file=sys.stderr)
    for inbox, _ in pool:
        inbox.put(None)
    report_simulation(rows, worlds, args.old_max)
    rounds, blocks = (20, 2) if args.quick else (200, 6)
    times = run_distributed(two_ranks, rounds, blocks, timeout=600)[0]
    report_two(times)
    return 0


def report_simulation(
    rows: dict[tuple[int, str], dict[str, Any]], worlds: list[int], old_max: int
) -> None:
    print("\n1. Simulated ranks (threads in 4 processes, a store client each), per call")
    header = (
        f"{'W':>5}  {'protocol':<8}{'vote ms':>9}{'barrier ms':>12}{'exchange ms':>13}"
        f"{'vote read ms':>14}{'floor ms':>10}"
        f"{'vote: store calls':>19}{'per rank':>10}{'keys':>10}"
    )
    print(header)
    for (world, name), row in rows.items():
        extra = "".join(
            f"{row[op]['ms']:>{width}.2f}" if op in row else f"{'-':>{width}}"
            for op, width in (("vote read", 14), ("floor", 10))
        )
        print(
            f"{world:>5}  {name:<8}{row['vote']['ms']:>9.2f}{row['barrier']['ms']:>12.2f}"
            f"{row['exchange']['ms']:>13.2f}{extra}{row['vote']['calls']:>19.0f}"
            f"{row['vote']['calls'] / world:>10.2f}{row['vote']['keys']:>10.0f}"
        )
    skipped = [w for w in worlds if w > old_max]
    if skipped:
        print(f"  (old protocol not run at W = {skipped}: O(W^2), seconds per call)")
    goals = []
    for world, limit in ((256, 25.0), (1024, 150.0)):
        if (world, "new") in rows:
            row = rows[(world, "new")]
            for op in ("vote", "barrier"):
                ms = row[op]["ms"]
                goals.append(
                    f"W={world} {op} {ms:.1f} ms (goal <= {limit:g}): {_verdict(ms <= limit)}"
                )
    if (128, "new") in rows and (1024, "new") in rows:
        for op in ("vote", "barrier", "floor"):
            growth = rows[(1024, "new")][op]["ms"] / rows[(128, "new")][op]["ms"]
            goals.append(
                f"{op} time x{growth:.1f} from W=128 to 1024 (linear: x8): {_verdict(growth <= 8)}"
            )
        floor = rows[(1024, "new")]["floor"]["ms"]
        goals.append(
            f"(at W=1024 the floor, the simulation's own store traffic, takes {floor:.1f} ms: "
            f"{100 * floor / rows[(1024, 'new')]['vote']['ms']:.0f}% of the vote)"
        )
    if goals:
        print("goals: " + "\n       ".join(goals))


def report_two(times: dict[str, list[float]]) -> None:
    print(
        "\n2. Two real processes (gloo, run_distributed): microseconds per call, median of blocks"
    )
    print(f"{'call':<12}{'old us':>9}{'new us':>9}{'new/old':>9}")
    for call, old_call in (("vote", "vote"), ("vote read", "vote"), ("barrier", "barrier")):
        old = statistics.median(times[f"old {old_call}"])
        new = statistics.median(times[f"new {call}"])
        print(f"{call:<12}{old:>9.0f}{new:>9.0f}{new / old:>9.2f}")


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


if __name__ == "__main__":
    sys.exit(main())
