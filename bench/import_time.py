"""Import time of unidist against torch and the frameworks it adapts, each in a fresh process.

    python bench/import_time.py [--repeat 7]
    python bench/import_time.py --quick    # one cold run each: checks that it runs (test command)

Each statement runs in a new interpreter `--repeat` times (after one warm-up run that fills the
OS file cache), the statements taking turns in every round so that a machine's drift hits them
alike; the table shows the median wall time and the ratio to `import unidist`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import median, table

STATEMENTS = {
    "import unidist": "import unidist",
    "unidist.get_rank()": "import unidist; unidist.get_rank()",
    "import torch": "import torch",
    "import torch.distributed": "import torch.distributed",
    "from composer.utils import dist": "from composer.utils import dist",
    "import ignite.distributed": "import ignite.distributed",
}


def _run(statement: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - started


def measure(statements: dict[str, str], repeat: int, warm: bool = True) -> dict[str, float]:
    """Median wall time of each statement, the statements taking turns in every round."""
    if warm:
        for statement in statements.values():
            _run(statement)  # warm the file cache
    times: dict[str, list[float]] = {name: [] for name in statements}
    for _ in range(repeat):
        for name, statement in statements.items():
            times[name].append(_run(statement))
    return {name: median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="one run each (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1
    warm = not args.quick
    results = measure({"python": "pass", **STATEMENTS}, args.repeat, warm)
    baseline = results.pop("python")
    unidist_cost = results["import unidist"] - baseline
    rows = [
        (name, seconds, seconds - baseline, (seconds - baseline) / unidist_cost)
        for name, seconds in results.items()
    ]
    print(f"python startup alone: {baseline:.3f} s (subtracted in 'import cost')")
    print(table(["statement", "wall s", "import cost s", "x unidist"], rows))


if __name__ == "__main__":
    main()
