"""Test tools that ship with unidist: a multi-process harness and the adapter conformance suite.

* :func:`run_distributed` runs a function on N fresh processes over gloo and returns each rank's
  result, raising with every rank's traceback if one fails and killing everything on timeout.
* :func:`check_adapter` runs every clause of the adapter contract against an adapter over real
  processes, for adapter authors: ``unidist.testing.check_adapter("mypkg.adapter:MyAdapter")``;
  :func:`check_environment` checks an environment (:mod:`unidist.environments`) on its variables.
* :func:`requires` builds one pytest skip marker whose reason lists everything missing.
* :class:`OOMBudget` raises simulated out-of-memory errors above a per-rank sample budget, to
  test microbatching on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.util import find_spec
from typing import Any

from unidist.testing._harness import (
    DistributedTestError,
    DistributedTestHang,
    DistributedTestTimeout,
    run_distributed,
)
from unidist.testing.conformance import CLAUSES, ConformanceError, check_environment
from unidist.testing.oom import OOMBudget

__all__ = [
    "CLAUSES",
    "ConformanceError",
    "DistributedTestError",
    "DistributedTestHang",
    "DistributedTestTimeout",
    "OOMBudget",
    "check_adapter",
    "check_environment",
    "requires",
    "run_distributed",
]


def check_adapter(
    adapter: str | type,
    world_size: int = 2,
    *,
    backend: str = "gloo",
    clauses: Sequence[str] | None = None,
    timeout: float = 120.0,
) -> dict[str, dict[int, str | None]]:
    """Run the conformance suite against ``adapter`` over ``world_size`` real processes.

    Args:
        adapter: a registered adapter name (``"torch"``), ``"package.module:Class"``, or the
            adapter class (it must be importable by name in a new process).
        world_size: number of processes.
        backend: process-group backend.
        clauses: clause names to run (default: all of :data:`CLAUSES`).
        timeout: seconds for the whole run.

    Returns:
        clause -> {rank: None}: every clause passed on every rank.

    Raises:
        ConformanceError: a clause failed; ``report`` says which, on which rank, and why.
    """
    names = list(clauses) if clauses is not None else list(CLAUSES)
    unknown = [name for name in names if name not in CLAUSES]
    if unknown:
        raise ValueError(f"unknown conformance clauses {unknown}; known: {list(CLAUSES)}")
    if isinstance(adapter, type):
        target = f"{adapter.__module__}:{adapter.__qualname__}"
    else:
        target = adapter
    per_rank = run_distributed(
        _conformance_job,
        target,
        names,
        backend,
        world_size=world_size,
        timeout=timeout,
        init=False,
    )
    report = {name: {rank: per_rank[rank][name] for rank in range(world_size)} for name in names}
    failing = {
        name: {r: m for r, m in ranks.items() if m}
        for name, ranks in report.items()
        if any(ranks.values())
    }
    if failing:
        lines = [
            f"adapter {target!r} failed {len(failing)} of {len(names)} conformance clauses "
            f"over {world_size} processes ({backend}):"
        ]
        for name, ranks in failing.items():
            lines.append(f"  {name}: {CLAUSES[name].__doc__}")
            lines.extend(f"    rank {rank}: {message}" for rank, message in sorted(ranks.items()))
        raise ConformanceError("\n".join(lines), failing)
    return report


def _conformance_job(target: str, names: list[str], backend: str) -> dict[str, str | None]:
    import unidist
    from unidist.adapters import registry
    from unidist.testing.conformance import run_clauses

    name = target
    if ":" in target:
        name = "under-test"
        registry.register(name, target, override=True)
    unidist.initialize(backend, adapter=name, timeout=60)
    return run_clauses(names)


def requires(*, modules: Sequence[str] = (), min_gpus: int = 0) -> Any:
    """One ``pytest.mark.skipif`` whose reason lists every missing requirement.

    Args:
        modules: importable modules needed (``"composer"``, ``"ignite"``).
        min_gpus: CUDA devices needed.
    """
    import pytest

    missing = [f"module {m!r}" for m in modules if find_spec(m) is None]
    if min_gpus:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count < min_gpus:
            missing.append(f"{min_gpus} CUDA device(s) (found {count})")
    return pytest.mark.skipif(bool(missing), reason="needs " + ", ".join(missing))
