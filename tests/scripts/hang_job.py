"""Ways real jobs stop making progress, for the hang and straggler tests: ``hang_job.py MODE``.

Every rank loops over steps that end in a collective; rank 1 misbehaves at step 5 (or from the
start, for a straggler). Modes:

* ``sleep``: rank 1 sleeps in ``slow_step`` while rank 0 waits in all_reduce;
* ``lock``: rank 1 blocks on a lock no one releases (``take_lock``);
* ``diverge``: rank 0 calls all_reduce, rank 1 broadcast, at the same step;
* ``early``: rank 1 returns from its script after 5 steps (uneven data);
* ``sigstop``: rank 1 stops itself with SIGSTOP;
* ``ddp``: DDP training, rank 1 sleeps in its forward (``forward``) at step 5;
* ``straggler``: rank 1 is ten times slower than rank 0 in every step, and both finish;
* ``silence``: every rank sleeps 8 s at step 5 (a long checkpoint save), then finishes;
* ``busy``: rank 1 computes for 8 s at step 5 in a loop that sits on one line (``busy_loop``)
  while rank 0 waits in all_reduce, then both finish.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch

import unidist

STEPS = {"straggler": 30, "silence": 10, "busy": 10}


def slow_step() -> None:
    time.sleep(600)


def take_lock(lock: threading.Lock) -> None:
    lock.acquire()


def busy_loop(seconds: float) -> int:
    deadline, turns = time.monotonic() + seconds, 0
    while time.monotonic() < deadline: turns += 1  # fmt: skip  # noqa: E701
    return turns


def freeze_self() -> None:
    time.sleep(0.5)  # long enough for the progress sampler to see this frame
    os.kill(os.getpid(), signal.SIGSTOP)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if unidist.get_rank() == 1 and self.stall:
            slow_step()
        return self.layer(x)

    stall = False


def misbehave(mode: str, lock: threading.Lock) -> str:
    """What rank 1 does at step 5; "return" when it leaves its script."""
    if mode == "sleep":
        slow_step()
    if mode == "lock":
        take_lock(lock)
    if mode == "sigstop":
        freeze_self()
    if mode == "busy":
        busy_loop(8)
    return "return" if mode == "early" else ""


def main(mode: str) -> int:
    unidist.initialize()
    rank = unidist.get_rank()
    lock = threading.Lock()
    lock.acquire()
    model = unidist.auto_model(Net()) if mode == "ddp" else None
    steps = STEPS.get(mode, 1000)
    print(f"rank {rank} training", flush=True)
    for step in range(steps):
        if mode == "ddp":
            assert model is not None
            Net.stall = step == 5
            model(torch.ones(2, 4)).sum().backward()
            continue
        if rank == 1 and step == 5 and misbehave(mode, lock) == "return":
            return 0
        if mode == "silence" and step == 5:
            time.sleep(8)  # every rank: a long save, no collective, no step
        if mode == "straggler":
            # Ten times: what each rank spends beside the sleeps (CPU it waits for on a busy
            # machine) narrows the ratio the report measures (5x gave 2.4x on 2 busy cores).
            time.sleep(0.5 if rank == 1 else 0.05)
        tensor = torch.ones(4)
        if mode == "diverge" and step == 5:
            if rank == 0:
                unidist.all_reduce(tensor)
            else:
                unidist.broadcast(tensor, src=0)
        else:
            unidist.all_reduce(tensor)
        time.sleep(0.01)
    print(f"rank {rank} finished {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
