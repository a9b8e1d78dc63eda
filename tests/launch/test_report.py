"""The culprit analysis on its own: records in, verdict out (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

from unidist.launch.plan import LaunchPlan
from unidist.launch.report import analyse, exit_code_of


def plan_with(tmp_path: Path, records: dict[str, dict[str, object]]) -> LaunchPlan:
    plan = LaunchPlan(
        target="job.py",
        nproc=2,
        log_dir=tmp_path,
        stdout=str(tmp_path / "rank{rank}.out"),
        stderr=str(tmp_path / "rank{rank}.err"),
    )
    plan.events.mkdir(parents=True)
    for name, data in records.items():
        kind, rank = name.split(":")
        record = {"rank": int(rank), "attempt": 0, "host": "h", "pid": 1, "time_ns": 0, **data}
        (plan.events / f"{kind}-a0-r{rank}.json").write_text(json.dumps(record))
    return plan


def error(kind: str, at: int, message: str = "boom") -> dict[str, object]:
    return {"kind": kind, "type": "ValueError", "message": message, "time_ns": at}


def test_the_earliest_own_failure_is_the_culprit(tmp_path: Path) -> None:
    plan = plan_with(
        tmp_path,
        {
            "start:0": {},
            "start:1": {},
            "error:1": error("raised", 5),
            "error:0": error("collateral", 9, "peer went away"),
        },
    )
    report = analyse(plan, exit_codes={0: 1, 1: 3}, stopped={}, died={0: 10, 1: 6})
    assert report.culprit is not None
    assert (report.culprit.rank, report.exit_code) == (1, 3)
    assert "failed because of another rank" in report.format()


def test_a_rank_stopped_by_the_agent_while_others_waited_for_it(tmp_path: Path) -> None:
    # rank 1 timed out waiting; torch's agent stopped rank 0 before the watchdog did
    plan = plan_with(tmp_path, {"start:0": {}, "start:1": {}, "error:1": error("timeout", 5)})
    report = analyse(plan, exit_codes={1: 1}, stopped={}, died={0: 8, 1: 6})
    assert report.culprit is not None
    assert report.culprit.rank == 0
    assert "still running when rank 1 gave up waiting" in report.culprit.detail
    assert report.exit_code == 1


def test_a_signal_is_reported_as_the_shell_does(tmp_path: Path) -> None:
    plan = plan_with(tmp_path, {"start:0": {}, "start:1": {}})
    report = analyse(plan, exit_codes={1: -9}, stopped={0: 7}, died={1: 5, 0: 8})
    assert report.culprit is not None
    assert report.culprit.detail == "killed by SIGKILL (not by the launcher)"
    assert report.exit_code == 137 == exit_code_of(-9)
    assert "stopped by the launcher" in report.format()


def test_success_and_interruption(tmp_path: Path) -> None:
    plan = plan_with(tmp_path, {"start:0": {}, "start:1": {}, "done:0": {}, "done:1": {}})
    assert analyse(plan, {}, {}, {}).exit_code == 0
    interrupted = analyse(plan, {}, {}, {}, interrupted="SIGINT")
    assert interrupted.exit_code == 130
    assert "interrupted by SIGINT" in interrupted.format()
