"""run_distributed against the usual ways to run a test function on 2 fresh gloo processes.

    python bench/harness.py [--rounds 5]
    python bench/harness.py --quick    # one round: checks that it runs (the test command)

Every contender runs the same function on 2 new processes: join a gloo process group, all-reduce
one element, leave the group. Contenders, interleaved round by round so that drift on a shared
machine hits all alike:

* ``unidist.testing.run_distributed(fn)``: ranks forked from a fork server that has imported
  torch (started by the first call, which is shown apart), an initialized unidist session, every
  rank's result back in the caller.
* ``torch.multiprocessing.spawn(fn, nprocs=2)``: what torch's own tests and many projects' use;
  each rank starts a fresh interpreter and calls ``init_process_group``/``destroy_process_group``
  itself (no results come back, which favours it).
* Ignite's ``idist.Parallel(backend="gloo", nproc_per_node=2)``: spawned ranks as well.

A call that has not finished after 60 s is counted as hung and its processes are killed: torch
2.7's gloo destructor can deadlock in ``destroy_process_group`` (pytorch PR #154976), which the
peers call as they leave (``run_distributed`` bounds its ranks' teardown itself). The peers' ranks
drop a file when their work is done, so a call whose every rank is done and that has still not
returned 10 s later is counted as hung then, at its exit, without waiting out the 60 s.

Goal (issue 19): at most 0.3 s per 2-rank call of ``run_distributed``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import free_port, median, table

GOAL_SECONDS = 0.3
HANG_SECONDS = 60.0
#: Seconds a peer's call may take to leave once every rank has done its work.
EXIT_SECONDS = 10.0
WARM_CALLS = 3  # run_distributed calls per round, after the first one of the run


def with_unidist() -> float:
    """A rank of run_distributed: unidist is initialized already."""
    import torch

    import unidist

    return float(unidist.all_reduce(torch.ones(1)).item())


def with_torch(index: int, port: int, done: str) -> None:
    """A rank of torch.multiprocessing.spawn: it joins and leaves the group itself."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=index,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    assert tensor.item() == 2.0
    Path(done, str(index)).touch()
    dist.destroy_process_group()


def with_ignite(local_rank: int, done: str) -> None:
    """A rank of Ignite's Parallel: Ignite joins and leaves the group."""
    import ignite.distributed as idist
    import torch

    assert idist.all_reduce(torch.ones(1)).item() == 2.0
    Path(done, str(local_rank)).touch()


def call_unidist(done: str) -> None:
    from unidist.testing import run_distributed

    assert run_distributed(with_unidist, world_size=2, timeout=120) == [2.0, 2.0]


def call_torch(done: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(with_torch, args=(free_port(), done), nprocs=2, join=True)


def call_ignite(done: str) -> None:
    import ignite.distributed as idist

    with idist.Parallel(backend="gloo", nproc_per_node=2, master_port=free_port()) as parallel:
        parallel.run(with_ignite, done)


def timed(call: Callable[[str], None]) -> float | None:
    """Seconds the call took; None if it hung (its processes are then killed)."""
    import psutil

    hung = threading.Event()
    returned = threading.Event()

    def watch(done: Path) -> None:
        """Kill the call's processes after HANG_SECONDS, or EXIT_SECONDS after both ranks'
        work is done (a hang in the peer's teardown)."""
        deadline = time.monotonic() + HANG_SECONDS
        while not returned.wait(0.05):
            now = time.monotonic()
            if len(list(done.iterdir())) == 2:
                deadline = min(deadline, now + EXIT_SECONDS)
            if now < deadline:
                continue
            hung.set()
            for child in psutil.Process().children(recursive=True):
                if child.pid != forkserver:  # run_distributed's fork server serves the next call
                    with contextlib.suppress(OSError):
                        os.kill(child.pid, signal.SIGKILL)
            return

    forkserver = _forkserver_pid()
    with tempfile.TemporaryDirectory() as done:
        watchdog = threading.Thread(target=watch, args=(Path(done),), daemon=True)
        watchdog.start()
        start = time.perf_counter()
        try:
            call(done)
        except Exception:
            if not hung.is_set():
                raise  # a real failure, not a hang
            return None
        finally:
            returned.set()
            watchdog.join()
        return None if hung.is_set() else time.perf_counter() - start


def _forkserver_pid() -> int | None:
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one round (a smoke run)")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    logging.getLogger("ignite.distributed.launcher.Parallel").setLevel(logging.WARNING)
    peers = {"torch.multiprocessing.spawn": call_torch}
    if find_spec("ignite") is not None:
        peers["ignite idist.Parallel"] = call_ignite
    first = timed(call_unidist)  # starts the fork server: a cost paid once per test session
    names = ["unidist run_distributed", *peers]
    times: dict[str, list[float | None]] = {name: [] for name in names}
    for _ in range(rounds):
        for _ in range(WARM_CALLS):
            times[names[0]].append(timed(call_unidist))
        for name, call in peers.items():
            times[name].append(timed(call))
    done = {name: [t for t in values if t is not None] for name, values in times.items()}
    ours = median(done[names[0]])
    rows = [
        [
            name,
            f"{median(done[name]):.3f}" if done[name] else "-",
            f"{median(done[name]) / ours:.1f}x" if done[name] else "-",
            len(times[name]),
            len(times[name]) - len(done[name]),
        ]
        for name in names
    ]
    print(f"2 gloo ranks per call; {rounds} round(s), contenders interleaved")
    print(table(["contender", "s per call", "x run_distributed", "calls", "hung"], rows))
    print(f"run_distributed's first call (starts its fork server): {first or 0:.2f} s")
    verdict = "met" if ours <= GOAL_SECONDS else "NOT met"
    print(f"goal: run_distributed at most {GOAL_SECONDS} s per call: {ours:.3f} s ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
