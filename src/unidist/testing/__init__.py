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

from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from typing import Any

from unidist._env.topology import EnvReading
from unidist.testing._harness import (
    DistributedTestError,
    DistributedTestHang,
    DistributedTestTimeout,
    run_distributed,
)
from unidist.testing.conformance import CLAUSES, ConformanceError
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


def check_environment(environment: Any, variables: Mapping[str, str]) -> EnvReading:
    """Check an environment (the other half of an adapter) on one set of its variables.

    No process is started: an environment reads variables only. The checks: it has the
    attributes of :class:`unidist.environments.Environment`; ``detect`` is True for
    ``variables`` and False for an empty environment (otherwise it would claim every single
    process); neither method changes ``variables`` or this process's environment; ``read``
    returns an :class:`~unidist.environments.EnvReading` whose rank is in range, the same twice
    (it depends on ``variables`` only).

    Args:
        environment: an environment object or class (a class is instantiated without arguments).
        variables: what the environment sets in one process of a job.

    Returns:
        What it read.

    Raises:
        ConformanceError: every failed check, under ``report["environment"][0]``.
    """
    from unidist import _env

    if isinstance(environment, type):
        environment = environment()
    name = getattr(environment, "name", repr(environment))
    missing = [
        attribute
        for attribute in ("name", "creates_processes", "detect", "read")
        if not hasattr(environment, attribute)
    ]
    before, given, probe = _env.environ_copy(), dict(variables), dict(variables)
    failures = [f"it has no {', '.join(missing)}"] if missing else []
    reading = None if missing else _read_checked(environment, probe, failures)
    if probe != given:
        failures.append("it changed the variables it was given")
    if _env.environ_copy() != before:
        failures.append("it changed this process's environment (os.environ)")
    if failures or reading is None:
        raise ConformanceError(
            f"environment {name!r} breaks the contract: {'; '.join(failures)}.",
            {"environment": {0: "; ".join(failures)}},
        )
    return reading


def _read_checked(
    environment: Any, probe: dict[str, str], failures: list[str]
) -> EnvReading | None:
    """``environment``'s reading of ``probe``, adding what breaks the contract to ``failures``."""
    try:
        if environment.detect(probe) is not True:
            failures.append("detect(variables) is not True for its own variables")
        if environment.detect({}) is not False:
            failures.append("detect({}) is not False: it would claim every single process")
        reading = environment.read(probe)
        again = environment.read(probe)
    except Exception as exc:
        failures.append(f"detect or read raised {type(exc).__name__}: {exc}")
        return None
    if not isinstance(reading, EnvReading):
        failures.append(
            f"read returned {type(reading).__name__}, not an EnvReading (build it with "
            "unidist.environments.reading)"
        )
        return None
    if reading != again:
        failures.append("read gave two different readings of the same variables")
    if not 0 <= reading.rank < reading.world_size:
        failures.append(f"rank {reading.rank} is not in 0..{reading.world_size - 1}")
    return reading


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
