"""Elastic training: nodes join and leave mid-epoch, and every sample is still read once per epoch.

    # node A (hosts the rendezvous store: it must stay), then node B, which may come and go
    unidist launch --nnodes 1:2 --rdzv-backend c10d --rdzv-endpoint HOST_A:29400 \\
        --rdzv-id demo --max-restarts 3 -n 1 examples/elastic.py --checkpoint /shared/ckpt
    python examples/elastic.py --checkpoint /tmp/ckpt     # one process; rerun it to resume

torch's elastic agent restarts every rank when the membership changes: it sends SIGTERM, and
:class:`unidist.ResumableState` lets each rank finish its step, saves the model, optimizer,
learning-rate schedule, data position and random states, and leaves. A node that dies without
warning costs the steps since the last save (``--save-every``): the restart reads them again
from that checkpoint. The global batch stays the same on any number of ranks
(``--global-batch-size``), so each step trains on the same samples whatever the world size.

If node A leaves, node B's launcher ends with one line that names the lost store (the guide's
"Limits": host the store on a machine that stays). ``--workers N`` sets the DataLoader workers
per rank (default: ``auto_dataloader``'s); they live until the agreed save however the stop
comes (a node joining, SIGTERM to the launcher or to one rank).

``--record DIR`` writes what each rank read (``DIR/reads-r<rank>-p<pid>.jsonl``, one line per
step) and ``DIR/rank<N>.json`` (first-epoch indices and losses); ``--weights FILE`` has rank 0
write the final weights. The test suite checks both.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import unidist


def synthetic_data(n: int, features: int = 8) -> TensorDataset:
    """The same data on every rank: (index, x, y) with y = sin(x @ w) + noise."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=gen)
    w = torch.randn(features, 1, generator=gen) / features**0.5
    y = torch.sin(x @ w) + 0.01 * torch.randn(n, 1, generator=gen)
    return TensorDataset(torch.arange(n), x, y)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder (shared by nodes)")
    parser.add_argument("--job", default="elastic-example", help="the run's name")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=480)
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers per rank (default: auto_dataloader's, as the guide's loader)",
    )
    parser.add_argument(
        "--persistent-workers", action="store_true", help="keep the workers between epochs"
    )
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds of work per step")
    parser.add_argument("--record", help="write what each rank read here")
    parser.add_argument("--weights", help="rank 0 writes the final weights here (JSON)")
    args = parser.parse_args()

    unidist.initialize()
    unidist.setup_logging()
    log = logging.getLogger("elastic")
    workers: dict[str, object] = {} if args.workers is None else {"num_workers": args.workers}
    if args.persistent_workers:
        workers["persistent_workers"] = True
    loader = unidist.auto_dataloader(
        synthetic_data(args.samples), global_batch_size=args.global_batch_size, **workers
    )
    torch.manual_seed(0)  # identical initial weights on every rank (and in every restart)
    model = unidist.auto_model(nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # The learning rate decays with the steps: a restart must resume it where it stopped.
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.8)
    state = unidist.ResumableState(
        args.checkpoint,
        job=args.job,
        model=model,
        optimizer=optimizer,
        stateful={"scheduler": scheduler},
        loader=loader,
        save_every=args.save_every,
    )
    if state.restore():
        log.info("resumed at epoch %d, step %d", state.epoch, state.steps)
    reads = _reads_log(args.record, state)

    losses: list[float] = []
    first_epoch: list[int] = []
    for epoch in state.epochs(args.epochs):
        total, batches = 0.0, 0
        for ids, x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            total, batches = total + loss.item(), batches + 1
            first_epoch += ids.tolist() if epoch == 0 else []
            reads(epoch, ids.tolist())
            time.sleep(args.step_delay)
            state.step()  # saves every --save-every steps; on SIGTERM saves and leaves
        losses.append(unidist.all_reduce(total / max(batches, 1), "mean"))
        log.info("epoch %d  %d steps in all  loss %.4f", epoch, state.steps, losses[-1])

    if args.record:
        path = Path(args.record, f"rank{unidist.get_rank()}.json")
        path.write_text(json.dumps({"indices": first_epoch, "losses": losses}))
    if args.weights and unidist.get_rank() == 0:
        weights = [p.detach().flatten().tolist() for p in unidist.unwrap_model(model).parameters()]
        Path(args.weights).write_text(json.dumps(weights))
    unidist.finalize()
    return 0


def _reads_log(
    folder: str | None, state: unidist.ResumableState
) -> Callable[[int, list[int]], None]:
    """A function that appends one line per step: which samples this rank read, and when."""
    if not folder:
        return lambda epoch, ids: None
    path = Path(folder, f"reads-r{unidist.get_rank()}-p{os.getpid()}.jsonl")
    start = {
        "start": int(os.environ.get("UNIDIST_START", "0")),
        "node": unidist.get_node_rank(),
        "world": unidist.get_world_size(),
        "resumed_from": state.resumed_from or 0,
    }
    stream = path.open("a", buffering=1)

    def write(epoch: int, ids: list[int]) -> None:
        line = {**start, "epoch": epoch, "step": state.steps + 1, "ids": ids, "t": time.time()}
        stream.write(json.dumps(line))
        stream.write("\n")

    return write


if __name__ == "__main__":
    sys.exit(main())
