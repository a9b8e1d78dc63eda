"""``unidist.spawn``: run a function on N processes with the launcher's machinery."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from unidist.errors import ConfigurationError, LaunchError
from unidist.launch.plan import LaunchPlan

__all__ = ["spawn"]

R = TypeVar("R")


def spawn(
    fn: Callable[..., R],
    *args: Any,
    nproc: int = 2,
    backend: str | None = None,
    timeout: float | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    console: bool = True,
) -> list[R]:
    """Run ``fn(*args)`` on ``nproc`` local processes, each with an initialized unidist session.

    The same machinery as ``unidist launch`` (torch's elastic agent, per-rank logs, fast stop of
    the other ranks when one fails), from Python: the replacement for Ignite's ``Parallel`` and
    ``idist.spawn``, except that it returns every rank's result.

    Args:
        fn: a module-level function (processes are started with ``spawn``, so it is pickled).
        *args: its arguments (picklable).
        nproc: number of processes.
        backend: process-group backend (``None``: unidist's default for the device).
        timeout: collective timeout in the ranks, seconds.
        log_dir: where per-rank logs go (default: a new folder under the temp dir).
        console: copy the ranks' output to this console, prefixed by rank.

    Returns:
        ``fn``'s return value from every rank, in rank order.

    Raises:
        LaunchError: a rank failed; the message names the culprit and shows its log.
    """
    from unidist.launch import runner

    if not isinstance(nproc, int) or nproc < 1:
        raise ConfigurationError(f"spawn(nproc={nproc!r}) needs at least one process.")
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    folder = (
        Path(log_dir) if log_dir is not None else Path(tempfile.gettempdir(), "unidist", run_id)
    )
    plan = LaunchPlan(
        target=None,
        nproc=nproc,
        log_dir=folder,
        stdout=str(folder / "rank{rank}.stdout.log"),
        stderr=str(folder / "rank{rank}.stderr.log"),
        console=console,
        timeout=timeout,
        run_id=run_id,
    )
    report, results = runner.run(plan, _rank_main, [fn, args, backend])
    if report.failed:
        culprit = report.culprit.rank if report.culprit is not None else None
        raise LaunchError(report.format(), exit_code=report.exit_code, culprit=culprit)
    return [results[rank] for rank in range(nproc)]


def _rank_main(fn: Callable[..., R], args: tuple[Any, ...], backend: str | None) -> R:
    import unidist
    from unidist.launch._rank import prepare_rank, record_done, record_error

    os.setpgrp()  # lead a process group, as script ranks do, so stopping takes children along
    prepare_rank()
    try:
        unidist.initialize(backend)
        value = fn(*args)
    except BaseException as exc:
        record_error(exc)
        raise
    finally:
        unidist.finalize()
    record_done()
    return value
