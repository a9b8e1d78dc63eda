"""``unidist launch`` with real processes: success, failures, hangs, Ctrl-C, two nodes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

JOB = str(Path(__file__).parents[1] / "scripts" / "job.py")


def launch(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unidist", "launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def pids_of(log_dir: Path) -> list[int]:
    """Every rank process the launcher started (from the ranks' start records)."""
    return [json.loads(p.read_text())["pid"] for p in log_dir.glob(".events-*/start-*.json")]


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def assert_nothing_left(log_dir: Path, *extra: int) -> None:
    pids = [*pids_of(log_dir), *extra]
    assert pids
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], "processes of the job survived"


def test_two_ranks_on_one_node(tmp_path: Path) -> None:
    done = launch("-n", "2", "--log-dir", str(tmp_path), JOB, "ok")
    assert done.returncode == 0, done.stderr
    assert "[rank0]: rank 0 total 3.0" in done.stdout
    assert "[rank1]: rank 1 total 3.0" in done.stdout
    assert "[rank1]: rank 1 says hello on stderr" in done.stderr
    assert "NODE_RANK=0" in (tmp_path / "rank1.stdout.log").read_text()
    assert "hello on stderr" in (tmp_path / "rank0.stderr.log").read_text()
    assert_nothing_left(tmp_path)


def test_custom_log_templates(tmp_path: Path) -> None:
    done = launch(
        "-n",
        "2",
        "--no-console",
        "--stdout",
        "out/{node_rank}-{rank}.txt",
        "--stderr",
        "err/{local_rank}.txt",
        JOB,
        "ok",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "total 3.0" in (tmp_path / "out" / "0-1.txt").read_text()
    assert "hello on stderr" in (tmp_path / "err" / "0.txt").read_text()
    assert "[rank0]" not in done.stdout


@pytest.mark.parametrize(
    ("mode", "code", "culprit"),
    [
        ("raise", 1, "rank 1 (local rank 1) on"),
        ("exit7", 7, "rank 1 (local rank 1) on"),
        ("sigkill", 128 + 9, "killed by SIGKILL (not by the launcher)"),
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
    assert f"full logs: {tmp_path / 'rank1.stderr.log'}" in summary
    assert "rank 0 (local rank 0)" in summary.split("culprit:", 1)[1]  # listed as collateral
    assert (tmp_path / "rank0.stdout.log").exists()
    if mode == "raise":
        assert "ValueError: rank 1 is broken" in culprit_line
        assert "job.py" in summary  # the culprit's traceback excerpt
    assert_nothing_left(tmp_path)


def test_a_hanging_rank_is_named_with_its_stack(tmp_path: Path) -> None:
    done = launch("-n", "2", "--timeout", "3", "--log-dir", str(tmp_path), JOB, "hang")
    assert done.returncode == 1, done.stderr
    summary = done.stderr.split("unidist launch: the job failed", 1)[1]
    culprit = next(line for line in summary.splitlines() if "culprit:" in line)
    assert "rank 0" in culprit
    assert "still running when rank 1 gave up waiting" in culprit
    assert "time.sleep" in summary or "job.py" in summary  # the stack it was stopped in
    assert "timed out waiting for another rank" in summary
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
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "unidist",
            "launch",
            "-n",
            "2",
            "--log-dir",
            str(tmp_path),
            JOB,
            "wait",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while len(pids_of(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    launcher.send_signal(signal.SIGINT)
    try:
        _, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, err
    assert "interrupted by SIGINT" in err
    assert_nothing_left(tmp_path)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_nodes_on_loopback(tmp_path: Path) -> None:
    port = str(_free_port())
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "unidist",
                "launch",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                "--log-dir",
                str(tmp_path / f"node{node}"),
                JOB,
                "ok",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in range(2)
    ]
    try:
        outputs = [node.communicate(timeout=180) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert "rank 1 of 2 on node 1 NODE_RANK=1" in outputs[1][0]
    assert "rank 0 total 3.0" in outputs[0][0]
    assert_nothing_left(tmp_path / "node0")
    assert_nothing_left(tmp_path / "node1")
