"""unidist's DataLoader workers leave stop signals to their rank and die with it.

torch's agent signals a rank's whole process group; torch's workers then died first and the rank
failed on "DataLoader worker (pid N) is killed by signal: Terminated" before it could save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

#: A rank with a stop handler, a loader with one worker; it prints each batch as it gets it and
#: waits on stdin after the third, so the test signals it mid-epoch. argv: "unidist"/"torch",
#: "persistent"/"fresh".
RANK = """
import os, signal, sys, torch
from torch.utils.data import DataLoader
import unidist
from unidist.data import StatefulDataLoader

got = []
signal.signal(signal.SIGTERM, lambda *_: got.append("TERM"))
kind = StatefulDataLoader if sys.argv[1] == "unidist" else DataLoader
loader = kind(range(8), batch_size=2, num_workers=1, persistent_workers=sys.argv[2] == "persistent")
for epoch in range(2):
    for i, batch in enumerate(loader):
        print("batch", epoch, batch.tolist(), flush=True)
        if epoch == 0 and i == 2:
            import multiprocessing
            print("workers", *[p.pid for p in multiprocessing.active_children()], flush=True)
            sys.stdin.readline()
print("done", got, flush=True)
"""


def _start(kind: str, workers: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", RANK, kind, workers],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        start_new_session=True,  # its own process group, as torch's agent starts a rank
    )


def _until_workers(rank: subprocess.Popen[str]) -> list[int]:
    assert rank.stdout is not None
    for line in rank.stdout:
        if line.startswith("workers"):
            return [int(pid) for pid in line.split()[1:]]
    raise AssertionError("the rank ended before its third batch")


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.parametrize("workers", ["fresh", "persistent"])
@pytest.mark.multiprocess
def test_a_signal_to_the_process_group_leaves_the_worker_serving(workers: str) -> None:
    rank = _start("unidist", workers)
    pids = _until_workers(rank)
    os.killpg(rank.pid, signal.SIGTERM)  # what torch's agent does to stop a rank
    out, err = rank.communicate("\n", timeout=60)
    assert rank.returncode == 0, err[-3000:]
    assert "done ['TERM']" in out  # the rank handled it, and read both epochs to the end
    assert out.count("batch 1") == 4
    assert all(_gone(pid) for pid in pids)


@pytest.mark.multiprocess
def test_torchs_own_loader_loses_its_worker_to_the_same_signal() -> None:
    # The control: torch's DataLoader in the same rank fails on the signal meant for the rank.
    rank = _start("torch", "fresh")
    _until_workers(rank)
    os.killpg(rank.pid, signal.SIGTERM)
    out, _ = rank.communicate("\n", timeout=60)
    # It fails, however the worker's death reaches it first (torch's SIGCHLD handler raises
    # "DataLoader worker (pid N) is killed by signal: Terminated", or the next batch does).
    assert rank.returncode != 0, out
    assert "done" not in out


@pytest.mark.multiprocess
def test_the_worker_dies_with_its_rank() -> None:
    rank = _start("unidist", "persistent")
    pids = _until_workers(rank)
    try:
        for pid in pids:  # stopped, torch's own watchdog (a look at its parent every 5 s) is
            os.kill(pid, signal.SIGSTOP)  # out of the game: only the kernel can end it now
        rank.kill()  # SIGKILL: the rank cannot end its worker itself
        rank.communicate(timeout=60)
        wait_for(lambda: all(_gone(pid) for pid in pids), 60, "the worker to die with its rank")
    finally:
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
