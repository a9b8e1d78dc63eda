"""Small helpers shared by the benchmarks: timing statistics and table printing."""

from __future__ import annotations

import os
import socket
import statistics
from collections.abc import Sequence


def free_port() -> int:
    """A TCP port that is free now: Ignite's ``Parallel`` would take 2222, which another job on
    the machine may hold."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def no_framework_preload() -> None:
    """This benchmark's ``run_distributed`` ranks use no framework: its fork server imports
    torch and unidist only, not also Composer and Ignite where they are installed (about 4 s of
    CPU each time a benchmark starts one; the figures are per call, after the start). A value
    the caller gave ``UNIDIST_TESTING_PRELOAD`` stands."""
    os.environ.setdefault("UNIDIST_TESTING_PRELOAD", "")


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with right-aligned columns."""
    cells = [[str(h) for h in headers], *[[_fmt(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)
