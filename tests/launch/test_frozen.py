"""A rank frozen by SIGSTOP under ``unidist launch``: the job still ends, and the report says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.launch.helpers import SCRIPTS, assert_nothing_left, launch

pytestmark = pytest.mark.multiprocess


def failed_job(tmp_path: Path, mode: str) -> tuple[str, str]:
    """Run ``failing_job.py MODE`` on 2 ranks; (the report after its first line, the culprit
    line), once the launcher has exited 1 within 40 s."""
    began = time.monotonic()
    done = launch(
        "-n", "2", "--log-dir", str(tmp_path), str(SCRIPTS / "failing_job.py"), mode, timeout=60
    )
    took = time.monotonic() - began
    assert done.returncode == 1, done.stderr
    assert took < 40, f"the launcher took {took:.0f} s"
    summary = done.stderr.split("unidist launch: the job failed", 1)[1]
    culprit = next(line for line in summary.splitlines() if "culprit:" in line)
    return summary, culprit


def test_a_frozen_rank_is_killed_and_named(tmp_path: Path) -> None:
    # Rank 1 stops itself with SIGSTOP; rank 0 gives up on it in barrier(timeout=3). A stopped
    # process ignores SIGTERM until it is continued: the launcher must still end it and leave.
    summary, culprit = failed_job(tmp_path, "freeze")
    assert "rank 1 (local rank 1)" in culprit
    assert "frozen (stopped by SIGSTOP or a debugger) when rank 0 gave up waiting" in culprit
    # Continued after SIGTERM, it dumped the stack it was frozen in.
    excerpt = summary.split("culprit:", 1)[1].split("full logs:", 1)[0]
    assert 'failing_job.py", line' in excerpt
    assert "rank 0 (local rank 0)" in summary.split("culprit:", 1)[1]  # the one that timed out
    assert "timed out waiting for another rank: DistributedTimeoutError" in summary
    assert_nothing_left(tmp_path)


def test_a_frozen_store_host_is_named_by_the_others_and_the_launcher(tmp_path: Path) -> None:
    # Rank 0 hosts unidist's control store and stops; rank 1's round trips to it get no answer.
    # Before, rank 1 waited inside the store's add for ever, and the launcher never reported.
    summary, culprit = failed_job(tmp_path, "freeze-host")
    assert "rank 0 (local rank 0)" in culprit
    assert "frozen" in culprit
    assert "which hosts unidist's control store, did not answer" in summary
    assert_nothing_left(tmp_path)
