"""A job for the multi-host and frozen-rank launcher tests: ``python failing_job.py MODE``.

Modes:

* ``barrier``: the last rank raises once the group is up; the others wait in
  ``unidist.barrier(timeout=60)``, which no failure elsewhere ends early by itself.
* ``allreduce``: the same, the others waiting in an all_reduce the last rank never joins.
* ``freeze``: rank 1 stops itself with SIGSTOP (as a debugger or a stuck node would leave it);
  rank 0 gives up waiting for it in ``unidist.barrier(timeout=3)``.
* ``freeze-host``: the same with rank 0 frozen, which hosts unidist's control store: rank 1's
  round trips to it get no answer at all.
* ``steady``: nobody fails; every rank all-reduces five times a second for five minutes (a
  host cut off from the network meanwhile leaves the others stuck in gloo).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

import unidist

mode = sys.argv[1]
unidist.initialize()
rank, last = unidist.get_rank(), unidist.get_world_size() - 1
print(f"rank {rank} is up on {os.uname().nodename}", flush=True)
if mode == "freeze":
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(300)  # only reached if someone sends SIGCONT without stopping the job
    unidist.barrier(timeout=3)
elif mode == "freeze-host":
    unidist.barrier()  # every rank has connected to the control store
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(300)
    unidist.barrier(timeout=3)
elif mode == "steady":
    for _ in range(1500):
        unidist.all_reduce(torch.tensor([1.0]))
        time.sleep(0.2)
elif rank == last:
    time.sleep(0.5)  # let the others reach their wait first
    raise ValueError(f"rank {rank} is broken")
elif mode == "barrier":
    unidist.barrier(timeout=60)
else:
    unidist.all_reduce(torch.tensor([1.0]))
print(f"rank {rank} is done", flush=True)
unidist.finalize()
