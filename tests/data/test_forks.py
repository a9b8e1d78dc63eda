"""A DataLoader worker stuck in its fork is started again; the loop gets the same batches.

A worker forked while another thread of the rank held one of Python's locks never runs a line
(CPython gh-112275 on Python 3.10 < 3.10.15 and 3.11 < 3.11.10: gloo's threads take that lock
after each collective), and torch's DataLoader waits for it forever. The elastic tests met it once
under load. The watch runs only on those Pythons; on the others nothing is watched."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch.utils.data import DataLoader

from unidist._base import workarounds as _workarounds
from unidist._base.workarounds import FORK_HEAD_LOCK
from unidist.data import _forks as forks
from unidist.data.workers import WorkerInit, starting_workers
from unidist.environments.parse import worker_start_timeout
from unidist.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "forked_workers.py"


def _run(*args: str, timeout: str = "1") -> tuple[subprocess.CompletedProcess[str], Any]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "UNIDIST_WORKER_START_TIMEOUT": timeout,
        },
    )
    lines = done.stdout.strip().splitlines()
    return done, json.loads(lines[-1]) if done.returncode == 0 and lines else None


@pytest.mark.parametrize("workers", ["fresh", "persistent"])
@pytest.mark.multiprocess
def test_a_worker_stuck_before_its_first_line_is_started_again(workers: str) -> None:
    extra = ["persistent"] if workers == "persistent" else []
    done, summary = _run("unidist", "block", "3", *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary["right"], summary  # every epoch: the batches a loader without workers gives
    [(worker_id, stuck, fresh)] = summary["replaced"]
    assert worker_id == 0
    assert fresh not in (None, stuck)
    assert summary["left"] == []  # the stuck one was killed and reaped, not left behind
    assert f"DataLoader worker 0 (pid {stuck}) did not start in 1 s" in done.stderr
    assert "gh-112275" in done.stderr


@pytest.mark.multiprocess
def test_a_worker_that_never_starts_fails_the_loader_rather_than_hang_it() -> None:
    # Every fork stuck, the replacements too: after 4 of them (deadlines 0.5, 1, 2, 4 and 8 s)
    # the worker is killed, and torch's DataLoader raises its own error for it.
    done, _ = _run("unidist", "block-all", "1", timeout="0.5")
    assert done.returncode != 0, done.stdout
    assert "did not start in 8 s, and 4 started in its place did not either" in done.stderr
    assert "is killed by signal: Killed" in done.stderr, done.stderr[-3000:]


@pytest.mark.multiprocess
def test_torchs_own_loader_waits_on_the_same_worker() -> None:
    # The control: torch's DataLoader gets nothing from the stuck worker. Given timeout=5 it
    # fails at the deadline (with torch's default, 0, it would wait forever).
    done, _ = _run("torch", "block", "2")
    assert done.returncode != 0, done.stdout
    assert "DataLoader timed out after 5 seconds" in done.stderr, done.stderr[-3000:]


@pytest.mark.multiprocess
def test_forks_beside_threads_that_enter_python_never_hang() -> None:
    # The real thing, no hook: native threads enter Python for the first time in a loop, as gloo's
    # do after each collective. On a Python with gh-112275 one fork in a few hundred copies
    # CPython's HEAD_LOCK held, and that worker is started again; on the others none is stuck,
    # and none is watched.
    done, summary = _run("unidist", "threads", "100", timeout="2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary["right"], summary
    assert summary["left"] == []
    assert all(fresh is not None for _, _, fresh in summary["replaced"])
    if not FORK_HEAD_LOCK.present():
        assert summary["replaced"] == []


@pytest.mark.parametrize(
    ("version", "watched"),
    [((3, 10, 14), True), ((3, 11, 9), True), ((3, 11, 10), False), ((3, 12, 0), False)],
)
def test_forked_workers_are_watched_only_on_a_python_with_the_bug(
    monkeypatch: pytest.MonkeyPatch, version: tuple[int, int, int], watched: bool
) -> None:
    monkeypatch.delenv("UNIDIST_WORKER_START_TIMEOUT", raising=False)
    monkeypatch.setattr(_workarounds, "python_version", lambda: version)
    loader = DataLoader(range(4), num_workers=1, multiprocessing_context="fork")
    context = loader.multiprocessing_context
    with starting_workers(loader):  # no iterator made: what a loader's __iter__ is given
        init = loader.worker_init_fn
        assert isinstance(init, WorkerInit)
        assert (init.report_to is not None) is watched  # the worker reports that it runs
        assert (loader.multiprocessing_context is not context) is watched  # each fork recorded
    assert loader.multiprocessing_context is context


def test_the_record_of_stuck_workers_keeps_only_the_latest(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # One entry per stuck worker, in a process that may run for weeks: bounded.
    record = copy.copy(forks.replaced)
    record.clear()
    monkeypatch.setattr(forks, "replaced", record)
    monkeypatch.setattr(forks, "_signal", lambda process, signum: False)  # no process to signal
    caplog.set_level(logging.CRITICAL, logger="unidist.data")
    watcher = forks._Watcher()
    for pid in range(1, 1001):
        slot = forks._Slot(0, SimpleNamespace(pid=pid), ((), {}), 1.0, 0.0, ())
        watch = forks._Watch(lambda: None, -1, -1, {0: slot})  # type: ignore[arg-type]
        watcher._give_up(watch, slot, "a test gives up on it")
    assert len(forks.replaced) <= 64, len(forks.replaced)
    assert forks.replaced[-1] == (0, 1000, None)  # the latest is kept


class _Stop(BaseException):
    """Ends the watching thread's loop in a test (the loop catches Exception only)."""


def test_a_watching_thread_that_keeps_failing_backs_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Each failed round is followed by a pause twice the last, up to a cap; a round that
    # succeeds starts the pauses over. The pauses are recorded, not slept.
    outcomes = iter([OSError("select failed")] * 12 + [None] + [OSError("select failed")] * 2)

    def round_(selector: object, wake: int) -> None:
        outcome = next(outcomes, _Stop())
        if outcome is not None:
            raise outcome

    pauses: list[float] = []
    watcher = forks._Watcher()
    monkeypatch.setattr(watcher, "_round", round_)
    monkeypatch.setattr(watcher, "_pause", pauses.append)
    read_fd, write_fd = forks.report_fds()
    try:
        with pytest.raises(_Stop):
            watcher._run(read_fd)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    doubling = [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0]
    assert pauses == pytest.approx([*doubling, 0.1, 0.2])
    assert "start failed; trying again in 30 s" in caplog.text


def test_only_workers_started_by_fork_are_watched() -> None:
    # spawn and forkserver start workers that inherit none of the rank's threads, nor their locks.
    def loader(context: str | None) -> DataLoader[int]:
        return DataLoader(range(4), num_workers=1, multiprocessing_context=context)

    assert forks.forks(loader("fork"))
    assert not forks.forks(loader("spawn"))
    assert not forks.forks(loader("forkserver"))
    import multiprocessing

    default = multiprocessing.get_start_method(allow_none=True)
    assert forks.forks(loader(None)) == (
        (default or multiprocessing.get_all_start_methods()[0]) == "fork"
    )


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 10.0), ("", 10.0), ("2.5", 2.5), ("30", 30.0), ("0", None)]
)
def test_the_deadline_is_the_users_to_set(value: str | None, seconds: float | None) -> None:
    environ = {} if value is None else {"UNIDIST_WORKER_START_TIMEOUT": value}
    assert worker_start_timeout(environ) == seconds


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_a_deadline_that_is_not_seconds_is_refused(value: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        worker_start_timeout({"UNIDIST_WORKER_START_TIMEOUT": value})
    message = str(caught.value)
    assert message.startswith(
        "UNIDIST_WORKER_START_TIMEOUT must be a positive number of seconds, or 0 (waits as long "
        "as torch does: for ever), got "
    )
    shown = repr(value) if value == "soon" else repr(float(value))  # as read: a float, or text
    assert f"got {shown}. HINT: set it to the seconds" in message
    assert "(default 10)" in message
