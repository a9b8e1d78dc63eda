"""A job for the launcher tests: ``python job.py MODE`` on every rank.

Modes: ok, raise, exit7, sigkill, hang, orphan, wait (sleep until stopped), linger (rank 0
keeps running after the job is done), flaky (rank 1 raises on the first attempt only), exit0
(rank 1 leaves with os._exit(0) while rank 0 still saves a checkpoint to $CHECKPOINT),
closedout (rank 1 closes its stdout, then exits with code 5), grow (a world of one waits to be
restarted by torch's agent when a second node joins), flood (rank 1 prints until its log's disk
is full), storewait (rank 0 waits in a store barrier for rank 1, which sleeps), segfault (rank 1
reads address 0 in native code, in ``crash_in_native_code``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import unidist


def crash_in_native_code() -> None:
    ctypes.string_at(0)  # SIGSEGV, as a bug in a C extension would


mode = sys.argv[1]
unidist.initialize()
rank = unidist.get_rank()
print(
    f"rank {rank} of {unidist.get_world_size()} on node {unidist.get_node_rank()} "
    f"NODE_RANK={os.environ.get('NODE_RANK')}",
    flush=True,
)
print(f"rank {rank} says hello on stderr", file=sys.stderr, flush=True)
if mode == "flood":
    # Every rank's first lines are on the disk before rank 1 fills it; without this, rank 0
    # could be the first to find the disk full and be named the culprit.
    unidist.barrier()
if rank == 1:
    if mode == "raise":
        raise ValueError("rank 1 is broken")
    if mode == "exit7":
        sys.exit(7)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "segfault":
        crash_in_native_code()
    if mode == "flaky" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        raise ValueError("rank 1 fails on the first attempt")
    if mode == "flood":
        while True:  # until the disk of its log is full: print raises OSError (ENOSPC)
            print("x" * 1000)
    if mode == "closedout":
        sys.stdout.close()
        sys.exit(5)
    if mode == "orphan":
        child = subprocess.Popen(["sleep", "300"])  # stands for a DataLoader worker
        Path(os.environ["ORPHAN_PID_FILE"]).write_text(str(child.pid))
        raise RuntimeError("rank 1 died and left a child behind")
if mode == "grow" and unidist.get_world_size() == 1:
    time.sleep(300)  # until a second node joins and torch's agent restarts this one
if mode == "hang" and rank == 0:
    time.sleep(300)  # never reaches the all_reduce below
if mode == "wait" or (mode == "storewait" and rank == 1):
    time.sleep(300)
if mode == "storewait" and rank == 0:
    unidist.barrier(timeout=300)  # through the store: no peer's socket closes to end it
total = unidist.all_reduce(torch.tensor([rank + 1.0])).item()
print(f"rank {rank} total {total}", flush=True)
unidist.finalize()
if mode == "exit0" and rank == 1:
    os._exit(0)  # done, and gone without any teardown (some frameworks leave this way)
if mode == "exit0" and rank == 0:
    time.sleep(2)  # a checkpoint that takes a while to save, after rank 1 has gone
    Path(os.environ["CHECKPOINT"]).write_text("saved")
if mode == "linger" and rank == 0:
    time.sleep(300)
