"""The culprit analysis on its own: records in, verdict out (no processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from unidist.launch.plan import LaunchPlan
from unidist.launch.records import Slot, Start
from unidist.launch.report import Observed, analyse, exit_code_of, stack_excerpt

PLAN = LaunchPlan(target="job.py", nproc=2)


def start_with(tmp_path: Path, records: dict[str, dict[str, object]], index: int = 0) -> Start:
    events = tmp_path / ".events"
    events.mkdir(exist_ok=True)
    for name, data in records.items():
        kind, rank = name.split(":")
        record = {"rank": int(rank), "host": "h", "pid": 1, "time_ns": 0, "start": index, **data}
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
    seen = Observed(gone={0: 10, 1: 6}, status={0: 1, 1: 3}, failed={0, 1})
    report = analyse(start, tmp_path / ".events", {0: 1, 1: 3}, seen, PLAN)
    assert report.culprit is not None
    assert (report.culprit.rank, report.exit_code) == (1, 3)
    assert "failed because of another rank" in report.format()


def test_a_rank_stopped_by_the_agent_while_others_waited_for_it(tmp_path: Path) -> None:
    # rank 1 timed out waiting; torch's agent stopped rank 0 before the watchdog could read its
    # exit status (reaped: unknown)
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}, "error:1": error("timeout", 5)})
    seen = Observed(gone={0: 8, 1: 6}, status={0: None, 1: 1}, failed={1})
    report = analyse(start, tmp_path / ".events", {1: 1}, seen, PLAN)
    assert report.culprit is not None
    assert report.culprit.rank == 0
    assert "still running when rank 1 gave up waiting" in report.culprit.detail
    assert report.exit_code == 1


def test_a_signal_is_reported_as_the_shell_does(tmp_path: Path) -> None:
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}})
    seen = Observed(stopped={0: 7}, gone={1: 5, 0: 8}, status={1: -9, 0: -15}, failed={0, 1})
    report = analyse(start, tmp_path / ".events", {1: -9}, seen, PLAN)
    assert report.culprit is not None
    assert report.culprit.detail == "killed by SIGKILL (not by the launcher)"
    assert report.exit_code == 137 == exit_code_of(-9)
    assert "stopped by the launcher" in report.format()


def test_a_rank_sigtermed_by_torchs_agent_after_a_crash_is_not_a_culprit(tmp_path: Path) -> None:
    # torch's agent reaped the crashed rank 1 first (status unknown here) and SIGTERMed rank 0.
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}})
    seen = Observed(gone={1: 5, 0: 8}, status={1: None, 0: -15}, failed={0})
    report = analyse(start, tmp_path / ".events", {1: -11}, seen, PLAN)
    assert report.culprit is not None
    assert report.culprit.rank == 1
    assert report.exit_code == 128 + 11
    assert "stopped by torch's agent after another rank failed" in report.format()


def test_success_and_interruption(tmp_path: Path) -> None:
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}, "done:1": {}})
    events = tmp_path / ".events"
    seen = Observed(gone={0: 1, 1: 2}, status={0: 0, 1: 0})
    assert analyse(start, events, {}, seen, PLAN).exit_code == 0
    interrupted = analyse(start, events, {}, seen, PLAN, interrupted="SIGINT")
    assert interrupted.exit_code == 130
    assert "interrupted by SIGINT" in interrupted.format()


def test_only_the_last_start_counts(tmp_path: Path) -> None:
    # The first start failed (rank 1 raised); the restart succeeded: a success.
    start_with(tmp_path, {"start:0": {}, "start:1": {}, "error:1": error("raised", 5)}, 0)
    last = start_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}, "done:1": {}}, index=1)
    seen = Observed(gone={0: 9, 1: 9}, status={0: 0, 1: 0})
    assert analyse(last, tmp_path / ".events", {}, seen, PLAN).exit_code == 0


def test_exit_0_without_a_record_is_a_success(tmp_path: Path) -> None:
    start = start_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}})
    seen = Observed(gone={0: 9, 1: 5}, status={0: 0, 1: 0})  # rank 1: os._exit(0)
    assert analyse(start, tmp_path / ".events", {}, seen, PLAN).exit_code == 0


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
    dumped = subprocess.run(
        [sys.executable, "-m", "unidist.launch._bootstrap", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = stack_excerpt(dumped.stderr, 6)
    assert lines[0] == "stack when stopped (most recent call last):"
    assert [line.split(" in ")[-1] for line in lines[1:]] == [
        "<module>",
        "main",
        "save_checkpoint",
    ]
    assert not [line for line in lines if "runpy" in line or "_bootstrap" in line]
