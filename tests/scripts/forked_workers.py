"""Epochs of a loader whose workers may be stuck in their fork; prints a JSON summary.

    python forked_workers.py {unidist|torch} {block|block-all|threads} EPOCHS [persistent]

``block``: the first worker forked blocks forever in an after-fork hook, before any of the
worker's code runs (as a child forked while another thread held one of Python's locks does).
``block-all``: every worker forked blocks so, the ones started in their place too.
``threads``: native threads keep entering Python for the first time (each takes CPython's
``HEAD_LOCK`` without the GIL, as gloo's threads do), so a fork now and then copies that lock
held: on a Python with CPython gh-112275 (3.10 < 3.10.15, 3.11 < 3.11.10) the child then never
runs, and unidist watches its workers; on the others it always runs, and nothing is watched.
``block`` and ``block-all`` stand in for the bug on any Python, so they run as on one that has it.

The summary: ``right`` (every epoch gave the batches a loader without workers gives),
``epochs``, ``replaced`` (unidist's record of stuck workers: worker id, stuck pid, new pid) and
``left`` (stuck pids still alive at the end). torch's loader gets ``timeout=5``: where a worker
is stuck it fails ("DataLoader timed out after 5 seconds") instead of waiting forever.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import torch
from _native import Chains  # tests/scripts, this script's folder
from torch.utils.data import DataLoader, RandomSampler

from unidist._base import workarounds as _workarounds
from unidist.data import StatefulDataLoader, _forks as forks

kind, how, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
persistent = sys.argv[4:] == ["persistent"]

forked = 0


def _count() -> None:
    global forked
    forked += 1


def _block_the_first() -> None:
    if forked == 1 or how == "block-all":  # this child's copy: the first fork made it 1
        threading.Event().wait()


if how in ("block", "block-all"):
    os.register_at_fork(before=_count, after_in_child=_block_the_first)
    _workarounds.python_version = lambda: (3, 11, 9)  # type: ignore[assignment]

chains = Chains(1) if how == "threads" else None


def batches(loader: DataLoader[int], epoch: int) -> list[list[int]]:
    loader.sampler.generator.manual_seed(epoch)  # type: ignore[attr-defined]
    return [batch.tolist() for batch in loader]


def make(workers: int) -> DataLoader[int]:
    cls = StatefulDataLoader if kind == "unidist" and workers else DataLoader
    return cls(  # type: ignore[no-any-return]
        range(24),
        batch_size=4,
        # A generator of the sampler's own: the order does not hang on how many draws the
        # loader makes from its generator (a persistent loader's later epochs make none).
        sampler=RandomSampler(range(24), generator=torch.Generator()),
        num_workers=workers,
        persistent_workers=persistent and workers > 0,
        timeout=5 if kind == "torch" and workers else 0,  # torch's: fail, rather than hang
    )


expected = [batches(make(0), epoch) for epoch in range(epochs)]
loader = make(2)
got = [batches(loader, epoch) for epoch in range(epochs)]
if chains is not None:
    chains.stop(30)
del loader


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


left = [pid for _, pid, _ in forks.replaced if _state(pid) not in ("gone", "Z")]
print(
    json.dumps(
        {
            "right": got == expected,
            "epochs": epochs,
            "replaced": list(forks.replaced),
            "left": left,
        }
    ),
    flush=True,
)
