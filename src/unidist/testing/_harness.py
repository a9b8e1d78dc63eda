"""``run_distributed``: run a function on N fresh processes and bring back every rank's result.

Processes come from a fork server that has already imported torch, unidist and the installed
frameworks, so a 2-rank run starts in a fraction of a second instead of paying torch's import
once per process. Each rank runs in its own process group (its DataLoader workers included), writes
its output to files that are replayed in the parent tagged by rank, and leaves through
``os._exit`` after a bounded :func:`unidist.finalize`, so no exit path can hang.

Nothing outlives the caller: each rank watches a pipe whose only writer is the caller, and when
the caller dies (even by SIGKILL) the ranks remove the run's temp folder and kill their process
groups; the fork server, which stays up while any of its children holds its liveness pipe, then
sees its caller gone and exits too.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from unidist._base.checks import check_int, check_seconds
from unidist.environments import variables as _env
from unidist.errors import ConfigurationError, DistributedTimeoutError, UnidistError
from unidist.hangs import page, stacks
from unidist.hangs.verdict import Deadline, stopped
from unidist.launch.leaving import leave_now
from unidist.launch.rank.runtime import STACK_SIGNAL, default_start_method, die_with_parent

__all__ = [
    "DistributedTestError",
    "DistributedTestHang",
    "DistributedTestTimeout",
    "run_distributed",
]

#: Seconds the other ranks get to fail on their own after one rank failed, before being killed.
_FAILURE_GRACE = 15.0
_PORT_RETRIES = 3
_OUTPUT_TAIL_LINES = 40


class DistributedTestError(UnidistError, AssertionError):
    """One or more ranks of :func:`run_distributed` failed.

    Attributes:
        failures: rank -> that rank's formatted traceback.
        outputs: rank -> (stdout, stderr) of every rank.
        results: rank -> return value, for the ranks that succeeded.
    """

    def __init__(
        self,
        message: str,
        *,
        failures: Mapping[int, str],
        outputs: Mapping[int, tuple[str, str]],
        results: Mapping[int, Any],
    ) -> None:
        super().__init__(message)
        self.failures = dict(failures)
        self.outputs = dict(outputs)
        self.results = dict(results)


class DistributedTestTimeout(DistributedTestError, DistributedTimeoutError):
    """:func:`run_distributed` ran past its timeout; every rank was killed.

    Attributes:
        unfinished: the ranks that had not finished.
    """

    def __init__(self, message: str, *, unfinished: Sequence[int], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.unfinished = list(unfinished)


class DistributedTestHang(DistributedTestTimeout):
    """:func:`run_distributed` saw no rank make progress for ``hang_timeout`` seconds; every
    rank was killed.

    Attributes:
        verdict: one line that names the stuck rank and what the others wait in.
        facts: what was known of each rank (``unidist.hangs.verdict.RankFacts``).
    """

    def __init__(self, message: str, *, verdict: str, facts: list[Any], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.verdict = verdict
        self.facts = facts


class _Lifeline:
    """The read end of a pipe only the caller writes to: EOF means the caller is gone.

    Pickled into each rank with multiprocessing's fd passing (``DupFd``), which works for the
    fork server and spawn start methods alike.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        from multiprocessing.reduction import DupFd

        return (_Lifeline._rebuild, (DupFd(self.fd),))

    @staticmethod
    def _rebuild(dup: Any) -> _Lifeline:
        return _Lifeline(dup.detach())

    def watch(self, workdir: str) -> None:
        """In a rank: when the caller goes away, clean up and kill this rank's process group."""

        def wait() -> None:
            with contextlib.suppress(OSError):
                while os.read(self.fd, 1):
                    pass
            shutil.rmtree(workdir, ignore_errors=True)
            os.killpg(os.getpgrp(), signal.SIGKILL)

        threading.Thread(target=wait, name="unidist-lifeline", daemon=True).start()


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    rank: int
    env: dict[str, str]
    workdir: str
    init: bool
    backend: str | None
    adapter: str | None
    collective_timeout: float
    lifeline: _Lifeline


@dataclass
class _Outcome:
    ok: bool
    value: Any = None
    error: str = ""
    port_in_use: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def run_distributed(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    backend: str | None = "gloo",
    adapter: str | None = None,
    timeout: float = 60.0,
    init: bool = True,
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str | None] | None = None,
    collective_timeout: float | None = None,
    hang_timeout: float | None = None,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh processes; return results in rank order.

    Each process gets the variables of a single-node torch launcher (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` on a free
    port) and, with ``init=True``, an initialized unidist session that is finalized afterwards.

    Args:
        fn: a module-level function (it is pickled by name into the processes).
        *args: positional arguments for ``fn``; must be picklable.
        world_size: number of processes.
        backend: process-group backend for :func:`unidist.initialize`.
        adapter: unidist adapter name (``None``: unidist's usual choice).
        timeout: seconds for the whole run. On timeout every rank is killed and the error says
            which ranks had not finished, with their Python stacks.
        init: call :func:`unidist.initialize` before ``fn`` (and finalize after).
        kwargs: keyword arguments for ``fn``.
        env: extra environment variables for every rank; ``None`` values unset a variable
            (for example ``{"LOCAL_WORLD_SIZE": None}`` to imitate a launcher that omits it).
        collective_timeout: timeout given to :func:`unidist.initialize`; default half of
            ``timeout``, so a stuck collective fails with a traceback before the run is killed.
        hang_timeout: seconds without progress (no collective issued, no step counted, no
            rank moving in its own code) after which every rank is killed and
            :class:`DistributedTestHang` names the stuck rank, its frame and the collective the
            others wait in, as ``unidist launch --hang-timeout`` does. Default: three quarters
            of ``timeout``; 0 turns it off. A plain timeout names them too.

    Returns:
        ``fn``'s return value from every rank, in rank order.

    Raises:
        ConfigurationError: called at the top level of a script that its new processes import
            again (put the call under ``if __name__ == "__main__":``), or ``fn`` cannot be
            pickled.
        DistributedTestError: a rank raised; the message holds every failing rank's traceback,
            tagged by rank, and the output of every rank.
        DistributedTestTimeout: the run did not finish in ``timeout`` seconds.
        DistributedTestHang: no rank made progress for ``hang_timeout`` seconds.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ConfigurationError(
            "run_distributed was called while a process it started was importing the main "
            "script: the call is at the script's top level, so each new process would start "
            "processes of its own. HINT: put the call (and check_adapter's) under "
            '`if __name__ == "__main__":`, as Python\'s multiprocessing asks of every script '
            "that starts processes."
        )
    check_int(world_size, "world_size", minimum=1)
    if hang_timeout is not None:
        check_seconds(
            hang_timeout,
            "hang_timeout",
            timedelta_ok=False,
            zero="turns it off",
            hint="None (the default) gives three quarters of timeout.",
        )
    try:
        pickle.dumps((fn, args, dict(kwargs or {})))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ConfigurationError(
            f"run_distributed pickles the function and its arguments into the new processes, "
            f"and {getattr(fn, '__qualname__', fn)!r} cannot be pickled ({exc}). HINT: define the "
            "function at module level (not inside a test or a lambda)."
        ) from exc
    for attempt in range(_PORT_RETRIES):
        try:
            return _run_once(
                fn,
                args,
                dict(kwargs or {}),
                world_size,
                backend,
                adapter,
                timeout,
                init,
                dict(env or {}),
                collective_timeout or max(timeout / 2, 5.0),
                timeout * 0.75 if hang_timeout is None else hang_timeout,
            )
        except _PortTaken:
            if attempt == _PORT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


class _PortTaken(DistributedTestError):
    """Another program took the chosen port between choosing and binding it; retried."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_once(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    world_size: int,
    backend: str | None,
    adapter: str | None,
    timeout: float,
    init: bool,
    env: dict[str, str | None],
    collective_timeout: float,
    hang_timeout: float,
) -> list[Any]:
    context = _context()
    workdir = tempfile.mkdtemp(prefix="unidist-run-")
    port = _free_port()
    processes: list[multiprocessing.process.BaseProcess] = []
    lifeline, caller_end = os.pipe()  # this process holds the only write end
    try:
        for rank in range(world_size):
            launcher = {
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world_size),
                "NODE_RANK": "0",
                "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "UNIDIST_LAUNCHER": "testing",
                "OMP_NUM_THREADS": "1",
                _env.HANG_PAGE: str(page.path_for(Path(workdir), rank)),
            }
            merged: dict[str, str | None] = {**_env.environ_copy(), **launcher, **env}
            rank_env = {k: v for k, v in merged.items() if v is not None}
            job = _Job(
                fn,
                args,
                kwargs,
                rank,
                rank_env,
                workdir,
                init,
                backend,
                adapter,
                collective_timeout,
                _Lifeline(lifeline),
            )
            process = context.Process(target=_worker, args=(job,), name=f"unidist-rank{rank}")
            process.start()
            processes.append(process)
        watch = _PageWatch(Path(workdir), world_size, hang_timeout)
        unfinished = _wait(processes, timeout, watch)
        if unfinished:
            _dump_stacks([processes[r] for r in unfinished], watch)
        return _collect(fn, processes, workdir, unfinished, timeout, world_size, watch)
    finally:
        _kill(processes)
        shutil.rmtree(workdir, ignore_errors=True)
        os.close(lifeline)
        os.close(caller_end)


class _PageWatch:
    """The ranks' pages, read in the parent; when silence becomes a hang (the rules are
    :mod:`unidist.hangs.verdict`'s, as ``unidist launch``'s are)."""

    def __init__(self, folder: Path, world_size: int, hang_timeout: float) -> None:
        self.folder = folder
        self.world_size = world_size
        self.deadline = Deadline(hang_timeout, time.monotonic())
        self.snapshots: dict[int, Any] = {}
        self.called: tuple[str, list[Any], float] | None = None  # (verdict, facts, silence)

    def look(self, processes: list[multiprocessing.process.BaseProcess]) -> bool:
        """Read the records; True when nothing moved for the hang timeout."""

        for rank in range(self.world_size):
            snap = page.read(page.path_for(self.folder, rank))
            if snap is not None:
                self.snapshots[rank] = snap
        gone = tuple(rank for rank, p in enumerate(processes) if p.exitcode is not None)
        token = (tuple((r, s.progress) for r, s in sorted(self.snapshots.items())), gone)
        now = time.monotonic()
        self.deadline.observe(token, now)
        return self.deadline.fixed != 0 and self.deadline.expired(now)

    def facts(self, processes: list[multiprocessing.process.BaseProcess]) -> list[Any]:
        from unidist.hangs.verdict import RankFacts

        now_ns = time.monotonic_ns()
        host = socket.gethostname()
        found = []
        for rank, process in enumerate(processes):
            code = process.exitcode
            found.append(
                RankFacts.of(
                    rank,
                    0,
                    host,
                    self.snapshots.get(rank),
                    exited=False if code is None else (128 - code if code < 0 else code),
                    frozen=process.pid is not None and code is None and stopped(process.pid),
                    now_ns=now_ns,
                )
            )
        return found

    def call(self, processes: list[multiprocessing.process.BaseProcess]) -> None:
        from unidist.hangs.verdict import verdict

        facts = self.facts(processes)
        self.called = (verdict(facts), facts, self.deadline.silence(time.monotonic()))

    def describe(self, processes: list[multiprocessing.process.BaseProcess]) -> str:
        """The verdict of the last look (for a run that timed out without a hang called)."""
        from unidist.hangs.verdict import verdict

        if self.called is not None:
            return self.called[0]
        return verdict(self.facts(processes))


#: Seconds between two looks at the ranks' progress records.
_LOOK = 0.25


def _wait(
    processes: list[multiprocessing.process.BaseProcess], timeout: float, watch: _PageWatch
) -> list[int]:
    """Wait for every rank; after a failure give the rest a grace period; stop at a hang.
    Returns the unfinished ranks."""
    deadline = time.monotonic() + timeout
    pending = {p.sentinel: rank for rank, p in enumerate(processes)}
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready = multiprocessing.connection.wait(list(pending), timeout=min(remaining, _LOOK))
        for sentinel in ready:
            rank = pending.pop(sentinel)  # type: ignore[arg-type]
            failed = processes[rank].exitcode != 0
            if failed and pending:
                # The survivors usually fail fast (their peer's sockets closed); don't wait long.
                deadline = min(deadline, time.monotonic() + _FAILURE_GRACE)
        if pending and watch.look(processes):
            watch.call(processes)
            break
    return sorted(pending.values())


def _dump_stacks(
    processes: list[multiprocessing.process.BaseProcess], watch: _PageWatch | None = None
) -> None:
    for process in processes:
        if process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                if stopped(process.pid):
                    os.kill(process.pid, signal.SIGCONT)  # so that it can dump its stack
                os.kill(process.pid, STACK_SIGNAL)  # faulthandler writes every thread's stack
    time.sleep(0.5)


def _kill(processes: list[multiprocessing.process.BaseProcess]) -> None:
    for process in processes:
        if process.pid is None:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # the rank and its DataLoader workers
        process.join(timeout=5)


def _collect(
    fn: Callable[..., Any],
    processes: list[multiprocessing.process.BaseProcess],
    workdir: str,
    unfinished: list[int],
    timeout: float,
    world_size: int,
    watch: _PageWatch | None = None,
) -> list[Any]:
    outputs: dict[int, tuple[str, str]] = {}
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    port_in_use = False
    for rank, process in enumerate(processes):
        outputs[rank] = (_read(workdir, f"rank{rank}.out"), _read(workdir, f"rank{rank}.err"))
        _replay(rank, *outputs[rank])
        if rank in unfinished:
            continue
        outcome = _load(workdir, rank, process.exitcode)
        port_in_use |= outcome.port_in_use
        if outcome.ok:
            results[rank] = outcome.value
        else:
            failures[rank] = outcome.error
    name = getattr(fn, "__qualname__", repr(fn))
    if unfinished:
        stacks = "\n".join(
            f"--- rank {r} (stack when killed, and its last output) ---\n{_tail(outputs[r][1])}"
            for r in unfinished
        )
        if watch is not None and watch.called is not None:
            line, facts, silence = watch.called
            raise DistributedTestHang(
                f"run_distributed({name}): no rank made progress for {silence:.0f} s "
                f"(hang_timeout={watch.deadline.fixed:g}): {line}; rank(s) {unfinished} of "
                f"{world_size} had not finished and were killed.\n"
                f"{_describe_failures(failures)}{stacks}",
                verdict=line,
                facts=facts,
                unfinished=unfinished,
                failures=failures,
                outputs=outputs,
                results=results,
            )
        where = f"; {watch.describe(processes)}" if watch is not None else ""
        raise DistributedTestTimeout(
            f"run_distributed({name}) did not finish in {timeout:g} s: rank(s) "
            f"{unfinished} of {world_size} had not finished and were killed{where}.\n"
            f"{_describe_failures(failures)}{stacks}",
            unfinished=unfinished,
            failures=failures,
            outputs=outputs,
            results=results,
        )
    if failures:
        kind = _PortTaken if port_in_use else DistributedTestError
        raise kind(
            f"run_distributed({name}): {len(failures)} of {world_size} rank(s) failed.\n"
            f"{_describe_failures(failures)}"
            + "".join(
                f"--- rank {r} stderr (last lines) ---\n{_tail(outputs[r][1])}\n"
                for r in sorted(failures)
                if outputs[r][1].strip()
            ),
            failures=failures,
            outputs=outputs,
            results=results,
        )
    return [results[rank] for rank in range(world_size)]


def _describe_failures(failures: Mapping[int, str]) -> str:
    return "".join(f"--- rank {r} raised ---\n{failures[r]}\n" for r in sorted(failures))


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-_OUTPUT_TAIL_LINES:])


def _read(workdir: str, name: str) -> str:
    path = Path(workdir, name)
    return path.read_text(errors="replace") if path.exists() else ""


def _replay(rank: int, out: str, err: str) -> None:
    for stream, text in ((sys.stdout, out), (sys.stderr, err)):
        for line in text.splitlines():
            stream.write(f"[rank {rank}] {line}\n")


def _load(workdir: str, rank: int, exitcode: int | None) -> _Outcome:
    path = Path(workdir, f"rank{rank}.result")
    if not path.exists():
        return _Outcome(
            False,
            error=f"exited with code {exitcode} before reporting a result "
            "(killed, or os._exit / a crash in native code)",
        )
    try:
        outcome: _Outcome = pickle.loads(path.read_bytes())
    except Exception as exc:
        return _Outcome(False, error=f"its return value could not be unpickled here: {exc!r}")
    return outcome


# -- inside each rank --------------------------------------------------------------------------


def _worker(job: _Job) -> None:
    """Entry point of each rank's process."""
    # Everything the fork server imported (torch, the frameworks) is long-lived: keep it out of
    # the collector, so a rank's gc.collect() (finalize calls one on torch < 2.8) scans only what
    # the test made, and does not copy the server's pages by touching them.
    gc.freeze()
    os.setpgrp()  # own process group: killing it takes DataLoader workers along
    die_with_parent()  # if the fork server (its parent) dies
    job.lifeline.watch(job.workdir)  # if the caller dies
    out = open(Path(job.workdir, f"rank{job.rank}.out"), "w")  # noqa: SIM115 - fd for dup2
    err = open(Path(job.workdir, f"rank{job.rank}.err"), "w")  # noqa: SIM115
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    # A crash dumps the crashing thread's stack only: dumping every thread walks the thread
    # states without a lock, while gloo's threads make and free one each time they release a
    # finished collective, so an all-threads dump can itself crash and show nothing.
    faulthandler.enable(file=err, all_threads=False)
    faulthandler.register(STACK_SIGNAL, file=err, all_threads=True)
    _env.replace_all(job.env)
    progress = _env.hang_page_file()
    if progress:
        stacks.start(progress)  # where this rank is, for the parent's hang report
    # The fork server passed its start method on; the rank's own DataLoader workers should start
    # the way they would in a normal script (fork on Linux), not as fresh interpreters.
    multiprocessing.set_start_method(default_start_method(), force=True)
    import torch

    torch.set_num_threads(int(job.env.get("OMP_NUM_THREADS", "1")))
    import unidist
    from unidist.session import state as _state

    _state.reset()
    outcome = _run_job(job, unidist)
    try:
        unidist.finalize()
    except BaseException:
        if outcome.ok:
            outcome = _Outcome(False, error="unidist.finalize() failed:\n" + traceback.format_exc())
    _write_outcome(job, outcome)
    leave_now(0 if outcome.ok else 1)


def _run_job(job: _Job, unidist: Any) -> _Outcome:
    try:
        if job.init:
            unidist.initialize(job.backend, adapter=job.adapter, timeout=job.collective_timeout)
        return _Outcome(True, job.fn(*job.args, **job.kwargs))
    except BaseException as exc:
        text = "".join(traceback.format_exception(exc))
        in_use = "address already in use" in text.lower() or "eaddrinuse" in text.lower()
        return _Outcome(False, error=text, port_in_use=in_use)


def _write_outcome(job: _Job, outcome: _Outcome) -> None:
    path = Path(job.workdir, f"rank{job.rank}.result")
    try:
        data = pickle.dumps(outcome)
    except Exception as exc:
        data = pickle.dumps(_Outcome(False, error=f"the return value cannot be pickled: {exc!r}"))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


# -- the fork server ---------------------------------------------------------------------------

_FRAMEWORKS = ("composer.utils.dist", "ignite.distributed")
_context_cache: Any = None


def _context() -> Any:
    """A fork-server context whose server has imported torch, unidist and installed frameworks.

    ``UNIDIST_TESTING_PRELOAD`` (comma-separated module names) replaces the framework list.
    """
    global _context_cache
    if _context_cache is None:
        if "forkserver" not in multiprocessing.get_all_start_methods():
            _context_cache = multiprocessing.get_context("spawn")
            return _context_cache
        context = multiprocessing.get_context("forkserver")
        chosen = _env.read_settings().testing_preload
        extra = (
            list(chosen)
            if chosen is not None
            else [name for name in _FRAMEWORKS if find_spec(name.partition(".")[0]) is not None]
        )
        context.set_forkserver_preload(
            ["torch", "torch.distributed", "unidist", "unidist.testing._harness", *extra]
        )
        _context_cache = context
    return _context_cache
