"""While a single-node ``unidist launch`` job runs, its ranks listen on no wildcard address."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.multiprocess

#: Each rank initializes (process group, control store), records its pid, and waits for ``go``.
JOB = """
import os, sys, time
from pathlib import Path
import unidist

folder = Path(sys.argv[1])
unidist.initialize("gloo")
unidist.barrier(timeout=30)
# Written aside, then renamed: the test globs for pid* while the ranks run, and must never
# read a file that is created but not yet written.
aside = folder / f".pid{unidist.get_rank()}"
aside.write_text(str(os.getpid()))
aside.replace(folder / f"pid{unidist.get_rank()}")
deadline = time.monotonic() + 60
while not (folder / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
unidist.barrier(timeout=30)
unidist.finalize()
"""
WILDCARDS = {"0.0.0.0", "::", ""}


def test_the_ranks_of_a_one_node_job_listen_on_no_wildcard_address(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "unidist",
            "launch",
            "-n",
            "2",
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
            str(folder),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 90
        while len(list(folder.glob("pid*"))) < 2 and job.poll() is None:
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        assert job.poll() is None, job.communicate()[0]
        listening: dict[int, list[tuple[str, int]]] = {}
        for path in folder.glob("pid*"):
            pid = int(path.read_text())
            listening[pid] = [
                (c.laddr.ip, c.laddr.port)
                for c in psutil.Process(pid).net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            ]
        (folder / "go").touch()
        out, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    print("listening:", listening)
    assert job.returncode == 0, out
    # Rank 0 hosts the control store (and gloo listens in every rank): something listens.
    assert any(listening.values()), listening
    wild = {pid: addrs for pid, addrs in listening.items() if WILDCARDS & {ip for ip, _ in addrs}}
    assert not wild, f"ranks listening on a wildcard address: {wild} (all: {listening})"
