"""``unidist.spawn``: run a function on N processes with the launcher's machinery."""

from __future__ import annotations

import inspect
import os
import traceback
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from unidist._base.checks import YEAR, check_seconds
from unidist._base.migration import foreign_keywords
from unidist.errors import ConfigurationError, LaunchError
from unidist.launch.plan.job import LaunchPlan
from unidist.launch.plan.output import ConsoleSpec
from unidist.launch.plan.rendezvous import Rendezvous

__all__ = ["spawn"]

R = TypeVar("R")

_IGNITE_SPAWN = "ignite.distributed.spawn and Parallel"
_ONE_HOST = (
    "unidist.spawn runs its ranks on this host and picks a free loopback port itself; for "
    "several nodes or a fixed address run the script with `unidist launch --nnodes N "
    "--node-rank R --master-addr HOST --master-port PORT` (torchrun's options)"
)
_WAITS = (
    "unidist.spawn always waits for every rank (it returns their results) and starts them "
    "with torch's elastic agent; drop it"
)
#: Ignite's spellings for spawn (idist.spawn, Parallel and the native model's spawn kwargs).
IGNITE_SPAWN_KEYWORDS: dict[str, tuple[str, str]] = {
    "args": (
        _IGNITE_SPAWN,
        "pass fn's arguments positionally after it: unidist.spawn(fn, *args, nproc=N)",
    ),
    "kwargs_dict": (
        _IGNITE_SPAWN,
        "bind keyword arguments first: unidist.spawn(functools.partial(fn, **kwargs_dict), "
        "*args, nproc=N) (fn must be a module-level function)",
    ),
    "nproc_per_node": (_IGNITE_SPAWN, "use nproc=N (processes on this host)"),
    "nnodes": (_IGNITE_SPAWN, _ONE_HOST),
    "node_rank": (_IGNITE_SPAWN, _ONE_HOST),
    "master_addr": (_IGNITE_SPAWN, _ONE_HOST),
    "master_port": (_IGNITE_SPAWN, _ONE_HOST),
    "init_method": (_IGNITE_SPAWN, _ONE_HOST),
    "join": (_IGNITE_SPAWN, _WAITS),
    "daemon": (_IGNITE_SPAWN, _WAITS),
    "start_method": (_IGNITE_SPAWN, _WAITS),
}


@foreign_keywords(IGNITE_SPAWN_KEYWORDS)
def spawn(
    fn: Callable[..., R],
    *args: Any,
    nproc: int = 2,
    backend: str | None = None,
    timeout: float | timedelta | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    console: bool = True,
    pass_local_rank: bool = False,
    keep_logs: bool | None = None,
) -> list[R]:
    """Run ``fn(*args)`` on ``nproc`` local processes, each with an initialized unidist session.

    The same machinery as ``unidist launch`` (torch's elastic agent, per-rank logs, fast stop of
    the other ranks when one fails), from Python: the replacement for Ignite's ``Parallel`` and
    ``idist.spawn``, except that it returns every rank's result. Inside each process,
    multiprocessing's default start method is the platform's (``fork`` on Linux), as in a
    script, so DataLoader workers start in milliseconds rather than importing torch again.

    Args:
        fn: a module-level function (processes are started with ``spawn``, so it is pickled).
        *args: its arguments (picklable).
        nproc: number of processes.
        backend: process-group backend (``None``: unidist's default for the device).
        timeout: collective timeout in the ranks, seconds or a ``timedelta`` (Ignite passes
            its ``timeout`` to ``init_process_group``: the same timeout).
        log_dir: where each call's log folder goes (default: a per-user folder in the temp dir).
        console: copy the ranks' output to this console, prefixed by rank.
        pass_local_rank: call ``fn(local_rank, *args)``, as Ignite's ``Parallel.run`` does.
            A function whose first parameter is named ``local_rank`` must be called that way:
            without it, ``spawn`` refuses to start rather than pass ``args[0]`` as the rank.
        keep_logs: keep the log folder of a successful call (default: only if ``log_dir`` is
            given). A failed call's logs are always kept; the error names them.

    Returns:
        ``fn``'s return value from every rank, in rank order.

    Ignite's keywords (``nproc_per_node``, ``master_port``, ``kwargs_dict``, ...) raise a
    ``TypeError`` that names unidist's spelling, as does Ignite's call shape
    ``spawn(backend, fn, args)``.

    Raises:
        ConfigurationError: ``fn`` is not callable or cannot be called with these arguments.
        TypeError: an Ignite keyword, with unidist's spelling.
        LaunchError: a rank failed; the message names the culprit and shows its log.
    """
    from unidist.launch.plan import checks, rundir
    from unidist.launch.supervise import runner

    _check_callable(fn, args)
    if not isinstance(nproc, int) or nproc < 1:
        raise ConfigurationError(f"spawn(nproc={nproc!r}) needs at least one process.")
    checks.check_capacity(nproc, console=console, option="spawn nproc")
    if timeout is not None:
        timeout = check_seconds(timeout, "spawn timeout", maximum=YEAR)
    _check_call(fn, args, pass_local_rank)
    plan = LaunchPlan(
        target=None,
        nproc=nproc,
        rdzv=Rendezvous(run_id=uuid.uuid4().hex[:12]),
        log_root=Path(log_dir) if log_dir is not None else None,
        console=ConsoleSpec(enabled=console),
        timeout=timeout,
    )
    report, results, folder = runner.run(plan, _rank_main, [fn, args, backend, pass_local_rank])
    if report.failed:
        culprit = report.culprit.rank if report.culprit is not None else None
        raise LaunchError(report.format(), exit_code=report.exit_code, culprit=culprit)
    if not (keep_logs if keep_logs is not None else log_dir is not None):
        rundir.remove_through(report.handle.fd, folder)  # what this run made, not the name
    return [results[rank] for rank in range(nproc)]


def _check_callable(fn: object, args: tuple[Any, ...]) -> None:
    """Refuse a ``fn`` that is not callable, naming Ignite's call shape when it looks like it."""
    if callable(fn):
        return
    if isinstance(fn, str) and args and callable(args[0]):
        name = getattr(args[0], "__qualname__", "fn")
        raise ConfigurationError(
            f"spawn({fn!r}, {name}, ...) is Ignite's call shape, spawn(backend, fn, args): "
            f"unidist's takes the function first. HINT: unidist.spawn({name}, *args, "
            f"nproc=N, backend={fn!r})."
        )
    raise ConfigurationError(
        f"spawn's first argument must be the function to run, got {type(fn).__name__} "
        f"{fn!r:.80}. HINT: unidist.spawn(fn, *args, nproc=N)."
    )


def _check_call(fn: Callable[..., Any], args: tuple[Any, ...], pass_local_rank: bool) -> None:
    """Refuse, before any process starts, a call that would fail or pass the wrong values."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function: nothing to check
    name = getattr(fn, "__qualname__", repr(fn))
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    wants_rank = bool(positional) and positional[0].name == "local_rank"
    if wants_rank and not pass_local_rank:
        got = f"args[0]={args[0]!r}" if args else "nothing"
        raise ConfigurationError(
            f"{name}(local_rank, ...) takes the local rank first, as Ignite's Parallel.run "
            f"passes it, but spawn would pass {got} there. HINT: spawn({name}, ..., "
            "pass_local_rank=True)."
        )
    call = (0, *args) if pass_local_rank else args
    try:
        signature.bind(*call)
    except TypeError as exc:
        shown = "local_rank, " * pass_local_rank + ", ".join(repr(a) for a in args)
        raise ConfigurationError(
            f"spawn cannot call {name}{signature} with ({shown}): {exc}. HINT: pass the "
            "arguments it takes" + (", or drop pass_local_rank=True." if pass_local_rank else ".")
        ) from None


def _rank_main(
    fn: Callable[..., R], args: tuple[Any, ...], backend: str | None, pass_local_rank: bool
) -> R:
    import multiprocessing

    from unidist.launch import records
    from unidist.launch.rank.runtime import (
        default_start_method,
        prepare_rank,
        record_done,
        record_error,
    )
    from unidist.ranks import get_local_rank
    from unidist.session.lifecycle import finalize, initialize

    os.setpgrp()  # lead a process group, as script ranks do, so stopping takes children along
    # This process was started by the spawn method and would hand it down to its DataLoader
    # workers (each a new interpreter importing torch: seconds instead of milliseconds).
    multiprocessing.set_start_method(default_start_method(), force=True)
    prepare_rank()
    try:
        initialize(backend)
        call = (get_local_rank(), *args) if pass_local_rank else args
        value = fn(*call)
    except BaseException as exc:
        record_error(exc)
        # torch wraps a function entrypoint in its own @record (elastic/multiprocessing/api.py
        # ``_wrap``, torch 2.7 to 2.14), which would write the same exception to the same error
        # file again, without unidist's classification: keep the file as it is.
        os.environ[records.ERROR_FILE] = os.devnull
        traceback.print_exc()  # into this rank's log, as a script rank's traceback goes
        raise
    finally:
        finalize()
    record_done()
    return value
