"""A job for the launcher tests: ``python job.py MODE`` on every rank.

Modes: ok, raise, exit7, sigkill, hang, orphan, wait (sleep until stopped), linger (rank 0
keeps running after the job is done).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import unidist

mode = sys.argv[1]
unidist.initialize()
rank = unidist.get_rank()
print(
    f"rank {rank} of {unidist.get_world_size()} on node {unidist.get_node_rank()} "
    f"NODE_RANK={os.environ.get('NODE_RANK')}",
    flush=True,
)
print(f"rank {rank} says hello on stderr", file=sys.stderr, flush=True)
if rank == 1:
    if mode == "raise":
        raise ValueError("rank 1 is broken")
    if mode == "exit7":
        sys.exit(7)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "orphan":
        child = subprocess.Popen(["sleep", "300"])  # stands for a DataLoader worker
        Path(os.environ["ORPHAN_PID_FILE"]).write_text(str(child.pid))
        raise RuntimeError("rank 1 died and left a child behind")
if mode == "hang" and rank == 0:
    time.sleep(300)  # never reaches the all_reduce below
if mode == "wait":
    time.sleep(300)
total = unidist.all_reduce(torch.tensor([rank + 1.0])).item()
print(f"rank {rank} total {total}", flush=True)
unidist.finalize()
if mode == "linger" and rank == 0:
    time.sleep(300)
