"""Launchers side by side: wall time of a trivial 2-rank job, and time from a failure to exit.

    python bench/launch.py [--repeat 5]
    python bench/launch.py --quick     # a smoke run: checks that it runs (the test command)

Each launcher runs bench/scripts/trivial.py (init, barrier, all_reduce, exit) with 2 processes
on this machine, interleaved round by round so drift hits all alike; the table shows the median
wall time and the ratio to torchrun. Then rank 1 raises right after init: the second table shows
the median time from the failure to the launcher's exit, and the exit code each launcher returns
(the culprit's code is 1). Between them, the same for a program that never imports torch
(bench/scripts/no_torch.py) under ``unidist launch`` and torchrun: a rank of ``unidist launch``
must not import torch for it (goal: no slower than torchrun). A run that has not finished after
60 s is counted as hung and its whole process group is killed (torch 2.7's gloo destructor can
deadlock at exit, pytorch PR #154976).
The third table times one epoch of ``unidist.StatefulDataLoader`` (torch's DataLoader, its
workers watched) with one worker in this process, inside a rank of
``unidist launch`` (bench/scripts/epoch.py), of ``unidist.spawn``, and of ``unidist.spawn`` with
workers started by the spawn method (what ``unidist.spawn`` gave before issue 12, and what the
ranks of Ignite's ``Parallel`` give).

``--quick`` runs one round, and it runs each code path once rather than each row: the trivial
job and the failure run only under ``unidist launch`` and torchrun (the base of the ratios;
Composer's launcher and Ignite's ``Parallel`` run the same ``once`` on the same script, and
tests/test_launchers.py runs a job under each of them), and no spawn-method row (the same
``unidist.spawn`` call with another start method). The test command runs it on every change,
where a launch costs seconds of CPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import free_port, median, table

SCRIPT = str(Path(__file__).parent / "scripts" / "trivial.py")
EPOCH = str(Path(__file__).parent / "scripts" / "epoch.py")
HANG_SECONDS = 60
BIN = Path(sys.executable).parent

LAUNCHERS = {
    "unidist launch": [sys.executable, "-m", "unidist", "launch", "-n", "2", SCRIPT],
    "torchrun": [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        SCRIPT,
    ],
    "composer -n 2": [str(BIN / "composer"), "-n", "2", SCRIPT],
    "ignite Parallel": [sys.executable, SCRIPT, "--ignite-parallel", "{free port}"],
}
#: A program that never imports torch, under the two launchers that run any program.
NO_TORCH_SCRIPT = str(Path(__file__).parent / "scripts" / "no_torch.py")
NO_TORCH = {
    name: [*LAUNCHERS[name][:-1], NO_TORCH_SCRIPT] for name in ("unidist launch", "torchrun")
}


def once(command: list[str], fail: str | None) -> tuple[float | None, int, float | None]:
    """(wall seconds or None if hung, exit code, failure-to-exit seconds)."""
    args = [str(free_port()) if a == "{free port}" else a for a in command]
    args = [*args, "--fail", fail] if fail else args
    started = time.time()
    process = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        start_new_session=True,
    )
    try:
        code = process.wait(timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None, -1, None
    ended = time.time()
    failed_at = float(Path(fail).read_text()) if fail and Path(fail).exists() else None
    return ended - started, code, (ended - failed_at) if failed_at else None


def one_epoch(context: str | None = None) -> float:
    """Seconds for one epoch of a tiny dataset through a DataLoader with one worker.

    unidist's loader, in every row: a plain DataLoader's worker forked in a rank beside gloo's
    threads can wait forever before its first line (CPython gh-112275, Python <= 3.11.9; once in
    95 forks just after initialize), and the test command runs this in ``unidist.spawn`` ranks.
    unidist's watches the workers it forks (unidist.data._forks) and starts such one again.
    """
    import unidist

    started = time.perf_counter()
    loader = unidist.StatefulDataLoader(
        list(range(64)), batch_size=8, num_workers=1, multiprocessing_context=context
    )
    assert sum(len(batch) for batch in loader) == 64
    return time.perf_counter() - started


def ignite_epoch(local_rank: int, out: str) -> None:
    Path(out, f"{local_rank}").write_text(repr(one_epoch()))


def dataloader_rows(repeat: int, quick: bool) -> list[tuple[str, float, float]]:
    """(where, median epoch seconds, ratio to this process) for the DataLoader table."""
    import unidist

    one_epoch()  # warm the imports, as a training script has them
    epochs: dict[str, list[float]] = {
        "this process (fork)": [],
        "unidist launch rank": [],
        "unidist.spawn rank": [],
    }
    if not quick:
        epochs["rank, spawn-method workers"] = []
    for _ in range(repeat):
        epochs["this process (fork)"].append(one_epoch())
        launched = subprocess.run(
            [sys.executable, "-m", "unidist", "launch", "-n", "2", EPOCH],
            capture_output=True,
            text=True,
            timeout=HANG_SECONDS,
            check=True,
        )
        epochs["unidist launch rank"] += [
            float(line.rsplit(" ", 1)[1])
            for line in launched.stdout.splitlines()
            if " epoch " in line
        ]
        epochs["unidist.spawn rank"] += unidist.spawn(one_epoch, nproc=2, console=False)
        if not quick:
            epochs["rank, spawn-method workers"] += unidist.spawn(
                one_epoch, "spawn", nproc=2, console=False
            )
    try:
        import ignite.distributed as idist
    except ImportError:
        pass
    else:
        # Parallel logs its settings at INFO on every call: not part of the table.
        logging.getLogger("ignite.distributed.launcher.Parallel").setLevel(logging.WARNING)
        epochs["ignite Parallel rank"] = []
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as out:
                port = free_port()  # not Ignite's 2222, which another job may hold
                with idist.Parallel(backend="gloo", nproc_per_node=2, master_port=port) as parallel:
                    parallel.run(ignite_epoch, out)
                epochs["ignite Parallel rank"] += [
                    float(f.read_text()) for f in Path(out).iterdir()
                ]
    base = median(epochs["this process (fork)"])
    return [(where, median(e), median(e) / base) for where, e in epochs.items()]


def _base(values: list[float]) -> float:
    """torchrun's median, the base of a table's ratios; nan when every torchrun run hung."""
    return median(values) if values else float("nan")


def _median_and_ratio(values: list[float], base: float) -> tuple[float | str, float | str]:
    """(median, median / base), or dashes when no run finished."""
    return (median(values), median(values) / base) if values else ("-", "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one round (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1
    running = ("unidist launch", "torchrun") if args.quick else tuple(LAUNCHERS)
    walls: dict[str, list[float]] = {name: [] for name in running}
    to_exit: dict[str, list[float]] = {name: [] for name in running}
    codes: dict[str, set[int]] = {name: set() for name in running}
    hangs: dict[str, int] = dict.fromkeys(running, 0)
    plain: dict[str, list[float]] = {name: [] for name in NO_TORCH}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            for name, command in NO_TORCH.items():
                wall, code, _ = once(command, None)
                assert wall is not None, f"{name} hung on {NO_TORCH_SCRIPT}"
                assert code == 0, f"{name} failed on {NO_TORCH_SCRIPT} (exit code {code})"
                plain[name].append(wall)
            for name in running:
                command = LAUNCHERS[name]
                wall, code, _ = once(command, None)
                if wall is None:
                    hangs[name] += 1
                else:
                    assert code == 0, f"{name} failed on the trivial job (exit code {code})"
                    walls[name].append(wall)
                marker = str(Path(tmp, f"fail-{round_}-{name.split()[0]}"))
                wall, code, delay = once(command, marker)
                if wall is None:
                    hangs[name] += 1
                    continue
                codes[name].add(code)
                if delay is not None:
                    to_exit[name].append(delay)
    base = _base(walls["torchrun"])
    runs = args.repeat * 2  # of each launcher: the trivial job and the failure
    print(
        f"trivial 2-rank job, median of up to {args.repeat} runs (hung: of all the runs of "
        f"a launcher, killed after {HANG_SECONDS} s)"
    )
    print(
        table(
            ["launcher", "wall s", "x torchrun", "hung"],
            [  # a launcher that hung in every run keeps its row: the hangs are the finding
                (name, *_median_and_ratio(w, base), f"{hangs[name]}/{runs}")
                for name, w in walls.items()
            ],
        )
    )
    print(f"\na program that does not import torch ({Path(NO_TORCH_SCRIPT).name}), 2 ranks")
    base_plain = median(plain["torchrun"])
    print(
        table(
            ["launcher", "wall s", "x torchrun"],
            [(name, median(w), median(w) / base_plain) for name, w in plain.items()],
        )
    )
    base_exit = _base(to_exit["torchrun"])
    print("\nrank 1 raises ValueError (exit code 1) after init")
    print(
        table(
            ["launcher", "failure -> exit s", "x torchrun", "exit code(s)"],
            [
                (name, *_median_and_ratio(d, base_exit), sorted(codes[name]) or "hung")
                for name, d in to_exit.items()
            ],
        )
    )
    print("\none DataLoader epoch (64 items, batch 8, 1 worker), median over ranks and runs")
    print(table(["where", "epoch s", "x this process"], dataloader_rows(args.repeat, args.quick)))


if __name__ == "__main__":
    main()
