"""Launchers side by side: wall time of a trivial 2-rank job, and time from a failure to exit.

    python bench/launch.py [--repeat 5]

Each launcher runs bench/scripts/trivial.py (init, barrier, all_reduce, exit) with 2 processes
on this machine, interleaved round by round so drift hits all alike; the table shows the median
wall time and the ratio to torchrun. Then rank 1 raises right after init: the second table shows
the median time from the failure to the launcher's exit, and the exit code each launcher returns
(the culprit's code is 1).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import median, table

SCRIPT = str(Path(__file__).parent / "scripts" / "trivial.py")
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
    "ignite Parallel": [sys.executable, SCRIPT, "--ignite-parallel"],
}


def once(command: list[str], fail: str | None) -> tuple[float, int, float | None]:
    args = [*command, "--fail", fail] if fail else command
    started = time.time()
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    ended = time.time()
    failed_at = float(Path(fail).read_text()) if fail and Path(fail).exists() else None
    return ended - started, done.returncode, (ended - failed_at) if failed_at else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {name: [] for name in LAUNCHERS}
    to_exit: dict[str, list[float]] = {name: [] for name in LAUNCHERS}
    codes: dict[str, set[int]] = {name: set() for name in LAUNCHERS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            for name, command in LAUNCHERS.items():
                wall, code, _ = once(command, None)
                assert code == 0, f"{name} failed on the trivial job"
                walls[name].append(wall)
                marker = str(Path(tmp, f"fail-{round_}-{len(to_exit[name])}"))
                _, code, delay = once(command, marker)
                codes[name].add(code)
                if delay is not None:
                    to_exit[name].append(delay)
    base = median(walls["torchrun"])
    print(f"trivial 2-rank job, median of {args.repeat} runs")
    print(
        table(
            ["launcher", "wall s", "x torchrun"],
            [(name, median(w), median(w) / base) for name, w in walls.items()],
        )
    )
    base_exit = median(to_exit["torchrun"])
    print("\nrank 1 raises ValueError (exit code 1) after init")
    print(
        table(
            ["launcher", "failure -> exit s", "x torchrun", "exit code(s)"],
            [
                (name, median(d), median(d) / base_exit, sorted(codes[name]))
                for name, d in to_exit.items()
                if d
            ],
        )
    )


if __name__ == "__main__":
    main()
