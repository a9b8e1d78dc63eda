"""The culprit analysis on its own: records in, verdict out (no processes)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from unidist.launch.plan.job import LaunchPlan
from unidist.launch.records import Slot, Start
from unidist.launch.supervise.excerpts import (
    check_logs,
    crash_excerpt,
    stack_excerpt,
    storage_problem,
)
from unidist.launch.supervise.outcome import RankOutcome
from unidist.launch.supervise.report import analyse, exit_code_of
from unidist.launch.supervise.watch import Observed, advance

PLAN = LaunchPlan(target="job.py", nproc=2)


def observed(
    *,
    gone: dict[int, int] | None = None,
    status: dict[int, int | None] | None = None,
    failed: set[int] | frozenset[int] = frozenset(),
    stopped: dict[int, int] | None = None,
    alive: dict[int, int] | None = None,
) -> Observed:
    """What the watchdog would hold after seeing these facts, replayed as its events in time."""
    status = status or {}
    events: list[tuple[int, int, str]] = [
        *((t, rank, "running") for rank, t in (alive or {}).items()),
        *((t, rank, "stop") for rank, t in (stopped or {}).items()),
        *((t, rank, "exited") for rank, t in (gone or {}).items()),
    ]
    seen = Observed()
    for at, rank, event in sorted(events):
        code = status.get(rank)
        advance(seen.watch(rank), event, at, status=code, failed=rank in failed, finished=code == 0)
    return seen


def start_with(tmp_path: Path, records: dict[str, dict[str, object]], index: int = 0) -> Start:
    events = tmp_path / ".events"
    events.mkdir(exist_ok=True)
    for name, data in records.items():
        kind, rank = name.split(":")
        record = {"rank": int(rank), "host": "h", "pid": 1, "time_ns": 0, "start": index, **data}
        if kind == "error":  # torch's error-file format, unidist's classification inside
            message = record.pop("message")
            text = {"message": f"{record['type']}: {message}", "extraInfo": {"unidist": record}}
            record = {"message": text}
        (events / f"{kind}-s{index}-r{rank}.json").write_text(json.dumps(record))
    slots = {
        r: Slot(r, r, 0, 2, tmp_path / f"rank{r}.out", tmp_path / f"rank{r}.err") for r in (0, 1)
    }
    return Start(index, slots)


def error(kind: str, at: int, message: str = "boom") -> dict[str, object]:
    return {"kind": kind, "type": "ValueError", "message": message, "time_ns": at}


def test_the_earliest_own_failure_is_the_culprit(tmp_path: Path) -> None:
    start = start_with(
        tmp_path,
        {
            "start:0": {},
            "start:1": {},
            "error:1": error("raised", 5),
            "error:0": error("collateral", 9, "peer went away"),
        },
    )
    seen = observed(gone={0: 10, 1: 6}, status={0: 1, 1: 3}, failed={0, 1})
    report = analyse(start, tmp_path / ".events", {0: 1, 1: 3}, seen, PLAN)
    assert report.culprit is not None
    assert (report.culprit.rank, report.exit_code) == (1, 3)
    assert "failed because of another rank" in report.format()


def test_a_rank_stopped_by_the_agent_while_others_waited_for_it(tmp_path: Path) -> None:
    # rank 1 timed out waiting; torch's agent stopped rank 0 before the watchdog could read its
    # exit status (reaped: unknown)
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}, "error:1": error("timeout", 5)})
    seen = observed(gone={0: 8, 1: 6}, status={0: None, 1: 1}, failed={1})
    report = analyse(start, tmp_path / ".events", {1: 1}, seen, PLAN)
    assert report.culprit is not None
    assert report.culprit.rank == 0
    assert "still running when rank 1 gave up waiting" in report.culprit.detail
    assert report.exit_code == 1


def test_a_signal_is_reported_as_the_shell_does(tmp_path: Path) -> None:
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}})
    seen = observed(stopped={0: 7}, gone={1: 5, 0: 8}, status={1: -9, 0: -15}, failed={0, 1})
    report = analyse(start, tmp_path / ".events", {1: -9}, seen, PLAN)
    assert report.culprit is not None
    assert report.culprit.detail == "killed by SIGKILL (not by the launcher)"
    assert report.exit_code == 137 == exit_code_of(-9)
    assert "stopped by the launcher" in report.format()


def test_a_rank_sigtermed_by_torchs_agent_after_a_crash_is_not_a_culprit(tmp_path: Path) -> None:
    # torch's agent reaped the crashed rank 1 first (status unknown here) and SIGTERMed rank 0.
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}})
    seen = observed(gone={1: 5, 0: 8}, status={1: None, 0: -15}, failed={0})
    report = analyse(start, tmp_path / ".events", {1: -11}, seen, PLAN)
    assert report.culprit is not None
    assert report.culprit.rank == 1
    assert report.exit_code == 128 + 11
    assert "stopped by torch's agent after another rank failed" in report.format()


def test_ranks_found_gone_in_one_sweep_could_have_died_in_either_order(tmp_path: Path) -> None:
    # rank 1 SIGKILLed itself; torch's agent SIGTERMed rank 0; the watchdog's next sweep found
    # both gone, checking rank 0 first (seen gone at 8, before rank 1 at 9). Both were last seen
    # running at 4, so rank 1's crash may have come first: rank 0 is collateral.
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}})
    seen = observed(gone={0: 8, 1: 9}, alive={0: 4, 1: 4}, status={0: -15, 1: -9}, failed={0, 1})
    report = analyse(start, tmp_path / ".events", {1: -9}, seen, PLAN)
    assert report.culprit is not None
    assert (report.culprit.rank, report.exit_code) == (1, 137)
    assert "stopped by torch's agent after another rank failed" in report.format()


def test_a_rank_no_sweep_saw_running_may_have_died_first(tmp_path: Path) -> None:
    # `--no-python sh -c "exit 3"`: rank 1 exited 3 before any sweep saw it running, torch's
    # agent SIGTERMed rank 0, and the sweep found rank 0 gone first (at 8, rank 1 at 9).
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}})
    seen = observed(gone={0: 8, 1: 9}, status={0: -15, 1: 3}, failed={0, 1})
    report = analyse(start, tmp_path / ".events", {1: 3, 0: -15}, seen, PLAN)
    assert report.culprit is not None
    assert (report.culprit.rank, report.exit_code) == (1, 3)
    assert "stopped by torch's agent after another rank failed" in report.format()


def test_a_sigterm_seen_before_the_other_rank_was_last_seen_running_is_the_culprit(
    tmp_path: Path,
) -> None:
    # rank 0 was SIGTERMed (by someone else) while rank 1 was still seen running after it
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}})
    seen = observed(gone={0: 5, 1: 9}, alive={0: 4, 1: 6}, status={0: -15, 1: -9}, failed={0, 1})
    report = analyse(start, tmp_path / ".events", {0: -15}, seen, PLAN)
    assert report.culprit is not None
    assert (report.culprit.rank, report.exit_code) == (0, 143)


def test_success_and_interruption(tmp_path: Path) -> None:
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}, "done:1": {}})
    events = tmp_path / ".events"
    seen = observed(gone={0: 1, 1: 2}, status={0: 0, 1: 0})
    assert analyse(start, events, {}, seen, PLAN).exit_code == 0
    interrupted = analyse(start, events, {}, seen, PLAN, interrupted="SIGINT")
    assert interrupted.exit_code == 130
    assert "interrupted by SIGINT" in interrupted.format()


def test_only_the_last_start_counts(tmp_path: Path) -> None:
    # The first start failed (rank 1 raised); the restart succeeded: a success.
    start_with(tmp_path, {"start:0": {}, "start:1": {}, "error:1": error("raised", 5)}, 0)
    last = start_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}, "done:1": {}}, index=1)
    seen = observed(gone={0: 9, 1: 9}, status={0: 0, 1: 0})
    assert analyse(last, tmp_path / ".events", {}, seen, PLAN).exit_code == 0


def test_exit_0_without_a_record_is_a_success(tmp_path: Path) -> None:
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}})
    seen = observed(gone={0: 9, 1: 5}, status={0: 0, 1: 0})  # rank 1: os._exit(0)
    assert analyse(start, tmp_path / ".events", {}, seen, PLAN).exit_code == 0


def _as_a_rank(script: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run by a rank's bootstrap, as ``unidist launch`` runs it; output captured."""
    return subprocess.run(
        [sys.executable, "-m", "unidist.launch.rank.bootstrap", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_stopped_ranks_excerpt_shows_the_users_frames_last(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import faulthandler, os, signal, threading, time\n"
        "def save_checkpoint():\n"
        "    faulthandler.dump_traceback(all_threads=True)\n"
        "def main():\n"
        "    save_checkpoint()\n"
        "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "main()\n"
    )
    dumped = _as_a_rank(script)
    lines = stack_excerpt(dumped.stderr, 6)
    assert lines[0] == "stack when stopped (most recent call last):"
    assert [line.split(" in ")[-1] for line in lines[1:]] == [
        "<module>",
        "main",
        "save_checkpoint",
    ]
    assert not [line for line in lines if "runpy" in line or "_bootstrap" in line]


def test_a_crash_in_a_thread_shows_that_thread_and_the_main_thread(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        "import ctypes, sys, threading, time\n"
        "def crash_in_native_code():\n"
        "    main = threading.main_thread().ident\n"
        "    while sys._current_frames()[main].f_code.co_name != 'train':\n"
        "        time.sleep(0.01)  # until the main thread is in train()\n"
        "    ctypes.string_at(0)\n"
        "def train():\n"
        "    time.sleep(60)\n"
        "threading.Thread(target=crash_in_native_code, daemon=True).start()\n"
        "train()\n"
    )
    crashed = _as_a_rank(script)
    assert crashed.returncode == -11, crashed.stderr  # SIGSEGV
    lines = crash_excerpt(crashed.stderr, 6)
    assert lines[0] == "Fatal Python error: Segmentation fault"
    heads = [line for line in lines if not line.startswith("  ")]
    assert heads[1:] == [
        "crashing thread (most recent call last):",
        "main thread (most recent call last):",
    ]
    crashing = lines[heads.index(heads[1]) + 1 : lines.index(heads[2])]
    functions = [line.rsplit(" in ", 1)[1] for line in crashing]
    assert functions[-2:] == ["crash_in_native_code", "string_at"], lines  # ctypes' frame
    assert lines[-1].endswith("in train"), lines
    assert not [line for line in lines if "runpy" in line or "rank/bootstrap" in line]


def test_a_crash_in_a_native_thread_says_so_and_shows_the_main_thread() -> None:
    dump = """rank 1 says hello
Fatal Python error: Segmentation fault

Current thread 0x00007f0000000001 (most recent call first):
  <no Python frame>

Thread 0x00007f0000000002 (most recent call first):
  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 4151 in scatter
  File "/job/train.py", line 12 in save
  File "/job/train.py", line 30 in <module>
  File "<frozen runpy>", line 88 in _run_code

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)
"""
    assert crash_excerpt(dump, 6) == [
        "Fatal Python error: Segmentation fault",
        "crashing thread (most recent call last):",
        "  (no Python frame: in native code)",
        "main thread (most recent call last):",
        '  File "/job/train.py", line 30 in <module>',
        '  File "/job/train.py", line 12 in save',
        '  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 4151 in scatter',
    ]
    assert crash_excerpt("Traceback (most recent call last):\n  ValueError: no\n", 6) == []


# -- a log that could not be written, and a success after restarts ------------------------------


def _failing(errno_: int, where: str) -> Callable[..., Any]:
    def fail(*args: object) -> None:
        raise OSError(errno_, os.strerror(errno_))

    return fail


@pytest.mark.parametrize(
    ("call", "code", "words"),
    [
        ("write", errno.ENOSPC, "No space left on device (ENOSPC)"),
        ("write", errno.EDQUOT, "Disk quota exceeded (EDQUOT)"),
        ("fsync", errno.EIO, "Input/output error (EIO)"),
        ("write", errno.EACCES, None),  # not the storage's fault: no claim
    ],
)
def test_storage_problems_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, code: int, words: str | None
) -> None:
    assert storage_problem(tmp_path) is None
    monkeypatch.setattr(os, call, _failing(code, call))
    assert storage_problem(tmp_path) == words
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind


def test_a_rank_whose_log_disk_is_full_is_reported_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full log disk ended with "exited with code 1 without a Python exception": the rank
    # could not even write its traceback or its record.
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}})
    seen = observed(stopped={0: 7}, gone={1: 5, 0: 8}, status={1: 1, 0: -15}, failed={1})
    report = analyse(start, tmp_path / ".events", {1: 1}, seen, PLAN)
    monkeypatch.setattr(os, "write", _failing(errno.ENOSPC, "write"))
    check_logs(report.outcomes)
    monkeypatch.undo()
    text = report.format()
    culprit = next(line for line in text.splitlines() if "culprit:" in line)
    assert "rank 1 (local rank 1) on h: exited with code 1 when its log could not be written" in (
        culprit
    )
    assert "without a Python exception" not in text
    logs = f"{tmp_path / 'rank1.out'}, {tmp_path / 'rank1.err'}"
    assert f"rank 1's log {logs}: No space left on device (ENOSPC)" in text
    assert "rank 0's log" not in text  # stopped by the launcher: its log is not the story


def test_a_success_after_restarts_says_so(tmp_path: Path) -> None:
    first = start_with(tmp_path, {"start:0": {}, "start:1": {}, "error:1": error("raised", 5)}, 0)
    seen = observed(gone={1: 5}, status={1: 1}, failed={1})
    earlier = analyse(first, tmp_path / ".events", {}, seen, PLAN)
    last = start_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}, "done:1": {}}, 1)
    report = analyse(
        last, tmp_path / ".events", {}, observed(gone={0: 1, 1: 1}, status={0: 0, 1: 0}), PLAN
    )
    assert report.format() == ""  # a success at once prints nothing
    report.earlier = [earlier]
    assert report.exit_code == 0
    assert report.format() == (
        "unidist launch: all 2 ranks succeeded after 1 restart(s); attempt 0 failed: rank 1 "
        "(local rank 1) on h: raised ValueError: boom, exit code 1 "
        f"(log: {tmp_path / 'rank1.err'}).\n"
    )
    report.several_nodes = True
    assert report.format().startswith("unidist launch: all 2 ranks on this node succeeded")
    failed = analyse(first, tmp_path / ".events", {1: 1}, seen, PLAN)
    failed.earlier = [earlier]
    assert "  after 1 restart(s): attempt 0 failed: rank 1" in failed.format()


@pytest.mark.parametrize("exit_seen", [True, False], ids=["sigterm-seen", "reaped-unseen"])
def test_a_start_stopped_for_new_members_is_not_called_a_failure(
    tmp_path: Path, exit_seen: bool
) -> None:
    # torch's agent SIGTERMs every rank when a node joins; the watchdog may see the signal's
    # exit status, or the agent may reap the rank first. Either way the next start is bigger.
    first = start_with(tmp_path, {"start:0": {}, "start:1": {}}, 0)
    seen = observed(gone={0: 5}, status={0: -15}, failed={0}) if exit_seen else observed()
    earlier = analyse(first, tmp_path / ".events", {}, seen, PLAN)
    earlier.resized = (2, 4)
    last = start_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}, "done:1": {}}, 1)
    report = analyse(
        last, tmp_path / ".events", {}, observed(gone={0: 1, 1: 1}, status={0: 0, 1: 0}), PLAN
    )
    report.earlier = [earlier]
    assert report.format() == (
        "unidist launch: all 2 ranks succeeded after 1 restart(s); attempt 0 was stopped by "
        "torch's agent when the nodes changed (world size 2 -> 4).\n"
    )
    earlier.resized = None  # the same world size: a SIGTERM from elsewhere stays a failure
    if exit_seen:
        assert "attempt 0 failed: rank 0 (local rank 0) on h: killed by SIGTERM" in report.format()


def test_a_lost_node_is_the_culprit_and_its_logs_are_not_here(tmp_path: Path) -> None:
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}})
    seen = observed(stopped={0: 5, 1: 5}, gone={0: 6, 1: 6}, status={0: -15, 1: -15})
    went = "node 1 went away: its launcher stopped answering"
    seen.remote = RankOutcome(2, 0, "node 1", "lost", went, None, 4, Path(), Path(), remote=True)
    report = analyse(start, tmp_path / ".events", {}, seen, PLAN)
    assert (report.culprit, report.exit_code) == (seen.remote, 1)
    text = report.format()
    assert f"  culprit: rank 2 and the other ranks of node 1: {went}\n" in text
    assert "      its ranks' logs are on its host, in its launcher's log folder\n" in text
    last = start_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}, "done:1": {}}, 1)
    later = analyse(
        last, tmp_path / ".events", {}, observed(gone={0: 1, 1: 1}, status={0: 0, 1: 0}), PLAN
    )
    later.earlier = [report]
    assert later.format() == (
        "unidist launch: all 2 ranks succeeded after 1 restart(s); attempt 0 failed: rank 2 "
        f"and the other ranks of node 1: {went}.\n"
    )
