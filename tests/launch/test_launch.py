"""``unidist launch`` with real processes: success, failures, hangs, Ctrl-C, restarts, exits."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from tests._waiting import wait_for
from tests.launch.helpers import (
    JOB,
    assert_nothing_left,
    launch,
    on_a_free_port,
    printed,
    run_folder,
    run_folders,
    start_launch,
)

pytestmark = pytest.mark.multiprocess


def test_two_ranks_on_one_node(tmp_path: Path) -> None:
    done = launch("-n", "2", "--log-dir", str(tmp_path), JOB, "ok")
    assert done.returncode == 0, done.stderr
    assert "[rank0]: rank 0 total 3.0" in done.stdout
    assert "[rank1]: rank 1 total 3.0" in done.stdout
    assert "[rank1]: rank 1 says hello on stderr" in done.stderr
    folder = run_folder(tmp_path)
    assert "NODE_RANK=0" in (folder / "rank1.stdout.log").read_text()
    assert "hello on stderr" in (folder / "rank0.stderr.log").read_text()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    private = [folder / "rank0.stdout.log", *folder.glob(".events/*.json")]
    assert {stat.S_IMODE(p.stat().st_mode) for p in private} == {0o600}
    assert_nothing_left(tmp_path)


def test_custom_log_templates(tmp_path: Path) -> None:
    done = launch(
        "-n",
        "2",
        "--no-console",
        "--stdout",
        "out/{node_rank}-{rank}-of-{world_size}.txt",
        "--stderr",
        "err/{local_rank}.txt",
        JOB,
        "ok",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "total 3.0" in (tmp_path / "out" / "0-1-of-2.txt").read_text()
    assert "hello on stderr" in (tmp_path / "err" / "0.txt").read_text()
    assert "[rank0]" not in done.stdout


@pytest.mark.parametrize(
    ("mode", "code", "culprit"),
    [
        ("raise", 1, "rank 1 (local rank 1) on"),
        ("exit7", 7, "rank 1 (local rank 1) on"),
        ("sigkill", 128 + 9, "killed by SIGKILL (not by the launcher)"),
        ("segfault", 128 + 11, "killed by SIGSEGV (not by the launcher)"),
    ],
)
def test_the_culprits_exit_code_and_report(
    tmp_path: Path, mode: str, code: int, culprit: str
) -> None:
    done = launch("-n", "2", "--log-dir", str(tmp_path), JOB, mode)
    assert done.returncode == code, done.stderr
    summary = done.stderr.split("unidist launch: the job failed", 1)[1]
    culprit_line = next(line for line in summary.splitlines() if "culprit:" in line)
    assert culprit in culprit_line
    assert "rank 1" in culprit_line
    folder = run_folder(tmp_path)
    assert f"full logs: {folder / 'rank1.stderr.log'}" in summary
    assert "rank 0 (local rank 0)" in summary.split("culprit:", 1)[1]  # listed as collateral
    assert (folder / "rank0.stdout.log").exists()
    if mode == "raise":
        assert "ValueError: rank 1 is broken" in culprit_line
        assert "job.py" in summary  # the culprit's traceback excerpt
    if mode == "segfault":  # faulthandler wrote where the rank was when it crashed
        crash = summary.split("culprit:", 1)[1].split("rank 0 (local rank 0)", 1)[0]
        assert "Fatal Python error: Segmentation fault" in crash, summary
        assert "in crash_in_native_code" in crash, summary
    assert_nothing_left(tmp_path)


def test_a_hanging_rank_is_named_with_its_stack(tmp_path: Path) -> None:
    done = launch("-n", "2", "--timeout", "3", "--log-dir", str(tmp_path), JOB, "hang")
    assert done.returncode == 1, done.stderr
    summary = done.stderr.split("unidist launch: the job failed", 1)[1]
    culprit = next(line for line in summary.splitlines() if "culprit:" in line)
    assert "rank 0" in culprit
    assert "still running when rank 1 gave up waiting" in culprit
    assert "timed out waiting for another rank" in summary
    # The stack it was stopped in, the user's line included (not runpy's or the bootstrap's).
    excerpt = summary.split("culprit:", 1)[1].split("full logs:", 1)[0]
    assert "stack when stopped (most recent call last):" in excerpt
    assert 'job.py", line' in excerpt
    assert "runpy" not in excerpt
    assert "_bootstrap" not in excerpt
    assert_nothing_left(tmp_path)


def test_a_rank_that_never_exits_is_reported_and_killed(tmp_path: Path) -> None:
    done = launch("-n", "2", "--exit-timeout", "3", "--log-dir", str(tmp_path), JOB, "linger")
    assert done.returncode == 124, done.stderr
    culprit = next(line for line in done.stderr.splitlines() if "culprit:" in line)
    assert "rank 0" in culprit
    assert "had not finished 3 s after another rank did" in culprit
    assert "job.py" in done.stderr  # its stack, dumped before the kill
    assert_nothing_left(tmp_path)


def test_a_crashed_ranks_children_are_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "orphan.pid"
    done = launch(
        "-n", "2", "--log-dir", str(tmp_path), JOB, "orphan", env={"ORPHAN_PID_FILE": str(pid_file)}
    )
    assert done.returncode == 1
    assert_nothing_left(tmp_path, int(pid_file.read_text()))


def test_ctrl_c_tears_everything_down(tmp_path: Path) -> None:
    launcher = start_launch("-n", "2", "--log-dir", str(tmp_path), JOB, "wait")
    # Both ranks past initialize() and in the job's sleep: each printed its first line.
    wait_for(lambda: printed(tmp_path, 0) and printed(tmp_path, 1), 60, "both ranks' first line")
    launcher.send_signal(signal.SIGINT)
    try:
        _, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, err
    assert "interrupted by SIGINT" in err
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("rendezvous", ["c10d", "static"])
def test_a_restart_that_succeeds_is_a_success(tmp_path: Path, rendezvous: str) -> None:
    # Rank 1 fails on the first attempt and succeeds on the second: the job succeeded. (torch's
    # agent reuses one store across restarts: gloo must not read the first attempt's keys.)

    def attempt(port: str) -> subprocess.CompletedProcess[str]:
        nodes = ["--nnodes", "1", "--node-rank", "0", "--master-port", port]
        form = nodes if rendezvous == "static" else []
        logs = str(tmp_path / f"port-{port}")
        return launch("-n", "2", *form, "--max-restarts", "1", "--log-dir", logs, JOB, "flaky")

    port, done = on_a_free_port(attempt)
    assert done.returncode == 0, done.stderr
    assert "the job failed" not in done.stderr
    folder = run_folder(tmp_path / f"port-{port}")
    assert "fails on the first attempt" in (folder / "attempt0" / "rank1.stderr.log").read_text()
    assert "rank 1 total 3.0" in (folder / "attempt1" / "rank1.stdout.log").read_text()
    # One line says so, and what the replaced attempt died of (there was none).
    summary = next(line for line in done.stderr.splitlines() if "succeeded" in line)
    assert summary.startswith("unidist launch: all 2 ranks succeeded after 1 restart(s); ")
    assert "attempt 0 failed: rank 1 (local rank 1) on " in summary
    assert "raised ValueError: rank 1 fails on the first attempt" in summary
    assert f"(log: {folder / 'attempt0' / 'rank1.stderr.log'})" in summary


def test_a_reused_log_dir_never_reads_an_earlier_run(tmp_path: Path) -> None:
    failed = launch("-n", "2", "--log-dir", str(tmp_path), JOB, "raise")
    assert failed.returncode == 1
    # What a stale run's records may name after PID reuse: an unrelated process group.
    bystander = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        for record in tmp_path.glob("**/start-*.json"):
            data = json.loads(record.read_text())
            record.write_text(json.dumps({**data, "pid": bystander.pid, "pid_start": None}))
        healthy = launch("-n", "2", "--log-dir", str(tmp_path), JOB, "ok")
        assert healthy.returncode == 0, healthy.stderr
        assert "culprit" not in healthy.stderr
        assert bystander.poll() is None, "the launcher signalled a PID from an earlier run"
    finally:
        bystander.kill()
        bystander.wait()
    assert len(run_folders(tmp_path)) == 2  # each run its own folder


def test_a_rank_that_leaves_with_os_exit_0_is_not_a_failure(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    done = launch(
        "-n",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
        JOB,
        "exit0",
        env={"CHECKPOINT": str(checkpoint)},
    )
    assert done.returncode == 0, done.stderr
    assert checkpoint.read_text() == "saved"  # rank 0 was not stopped while saving


def test_a_rank_that_closed_its_stdout_still_exits_with_its_code(tmp_path: Path) -> None:
    done = launch("-n", "2", "--log-dir", str(tmp_path), JOB, "closedout")
    assert done.returncode == 5, done.stderr
    log = (run_folder(tmp_path) / "rank1.stderr.log").read_text()
    assert "I/O operation on closed file" not in log + done.stderr
    assert "culprit: rank 1" in done.stderr


def test_a_folder_with_main_runs_as_python_runs_it(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "helper.py").write_text("WHO = 'helper'\n")
    (app / "__main__.py").write_text(
        "import os, sys\nfrom helper import WHO\n"
        "print(f'{WHO} rank {os.environ[\"RANK\"]} argv {sys.argv[1:]}')\n"
    )
    done = launch("-n", "2", "--log-dir", str(tmp_path / "logs"), str(app), "--flag")
    assert done.returncode == 0, done.stderr
    assert "[rank1]: helper rank 1 argv ['--flag']" in done.stdout


def test_no_python_runs_a_program(tmp_path: Path) -> None:
    done = launch(
        "-n", "2", "--no-python", "--log-dir", str(tmp_path), "sh", "-c", 'echo "rank $RANK"'
    )
    assert done.returncode == 0, done.stderr
    assert "[rank1]: rank 1" in done.stdout
    failed = launch("-n", "2", "--no-python", "--log-dir", str(tmp_path), "sh", "-c", "exit 3")
    assert failed.returncode == 3, failed.stderr
    assert "exited with code 3" in failed.stderr


def test_a_full_log_disk_is_named_in_the_report(tiny_disk: Path) -> None:
    # It ended with "exited with code 1 without a Python exception": the rank could write
    # neither its traceback nor its record. Later, with no rank able to write a record, the
    # order of their exits decided, and rank 0 (collateral) was named when it left first.
    done = launch("-n", "2", "--no-console", "--log-dir", str(tiny_disk), JOB, "flood")
    assert done.returncode == 1, done.stderr
    culprit = next(line for line in done.stderr.splitlines() if "culprit:" in line)
    assert "rank 1 (local rank 1)" in culprit
    assert "raised OSError: [Errno 28] No space left on device" in culprit
    assert "without a Python exception" not in done.stderr
    folder = run_folder(tiny_disk)
    assert f"rank 1's log {folder / 'rank1.stdout.log'}" in done.stderr
    assert ": No space left on device (ENOSPC)" in done.stderr
    assert not list((folder / ".events").glob(".*.reserve")), "the ranks' rooms were left"
    assert_nothing_left(tiny_disk)
