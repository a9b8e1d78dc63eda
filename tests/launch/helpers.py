"""Shared by the launcher tests: run the command, find a run's folder, check for leftovers."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parents[1] / "scripts"
JOB = str(SCRIPTS / "job.py")


def launch(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 180,
    limits: dict[int, int] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``unidist launch ARGS`` in a new process; its output captured.

    ``limits``: resource limits (``resource.RLIMIT_*`` -> soft value) for the new process.
    """

    def bound() -> None:
        for which, soft in (limits or {}).items():
            _, hard = resource.getrlimit(which)
            resource.setrlimit(which, (soft, hard))

    return subprocess.run(
        [sys.executable, "-m", "unidist", "launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        preexec_fn=bound if limits else None,
    )


def run_in_process(capsys: Any, *args: str) -> tuple[int, str, str]:
    """``unidist launch ARGS`` in this process: (exit code, stdout, stderr); argparse's exits
    count as codes."""
    from unidist.cli import main

    try:
        code = main(["launch", *args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def start_launch(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``unidist launch ARGS`` started in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "unidist", "launch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def run_folders(log_dir: Path) -> list[Path]:
    """The run folders ``unidist launch --log-dir log_dir`` created, oldest first."""
    return sorted(p for p in log_dir.iterdir() if p.is_dir()) if log_dir.is_dir() else []


def run_folder(log_dir: Path) -> Path:
    """The one run folder in ``log_dir``."""
    folders = run_folders(log_dir)
    assert len(folders) == 1, folders
    return folders[0]


def pids_of(log_dir: Path) -> list[int]:
    """Every rank process the launcher started (from the ranks' start records)."""
    return [json.loads(p.read_text())["pid"] for p in log_dir.glob("*/.events/start-*.json")]


def printed(log_dir: Path, rank: int) -> bool:
    """Whether rank ``rank`` of tests/scripts/job.py printed its first line (it is initialised)."""
    logs = log_dir.glob(f"*/rank{rank}.stdout.log")
    return any(f"rank {rank} of " in log.read_text() for log in logs)


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def on_a_free_port(
    run: Callable[[str], subprocess.CompletedProcess[str]], tries: int = 3
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """``run(port)`` with a port that was free when chosen, and again with another when some
    other process bound it first (the launcher says EADDRINUSE for that port): the race between
    choosing a port and the job binding it is the test's, not the launcher's. Returns the port
    of the last try and its result."""
    for _ in range(tries):
        port = str(free_port())
        done = run(port)
        said = done.stdout + done.stderr
        if done.returncode == 0 or "EADDRINUSE" not in said or port not in said:
            break
    return port, done


def c10d(port: int, nnodes: str, log_dir: Path, *extra: str) -> list[str]:
    """Options of a job whose launchers meet at a c10d store on this machine's ``port``."""
    return [
        "--nnodes",
        nnodes,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "unidist-test",
        "--log-dir",
        str(log_dir),
        *extra,
    ]


_STORE_HOST = """
import sys
import torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(server.port, flush=True)
sys.stdin.read()
"""


def start_store_host() -> subprocess.Popen[str]:
    """A process that hosts a TCPStore on a free port (its first line) until its stdin closes."""
    return subprocess.Popen(
        [sys.executable, "-c", _STORE_HOST],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


#: A ``torchrun.logs_specs`` plugin: torch's default placement, marked in the ranks'
#: environment (``CHOSEN_BY``) so a test knows it ran.
LOGS_SPECS = """
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs


class NamedLogsSpecs(DefaultLogsSpecs):
    '''torch's default placement, marked in the ranks' environment.'''

    def reify(self, envs):
        dest = super().reify(envs)
        for local in envs:
            envs[local]["CHOSEN_BY"] = "named-logs"
        return dest
"""
