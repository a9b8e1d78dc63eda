"""Automatic microbatching in a plain PyTorch loop, with a simulated memory limit.

    python examples/microbatch.py
    unidist launch -n 2 examples/microbatch.py          # rank 1 "runs out of memory" above 8

Each rank trains DDP on batches of 32 samples. ``--memory N`` makes rank 1 raise
``torch.OutOfMemoryError`` whenever a forward pass gets more than N samples
(``unidist.testing.OOMBudget``), as a small GPU would: every rank then drops the batch, halves
the microbatch and retries the same batch, until the size fits on every rank. The gradient is the
full batch's either way. ``--record DIR`` writes each rank's indices, losses and size history.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import unidist
from unidist.testing import OOMBudget


def synthetic_data(n: int = 2048, features: int = 16, classes: int = 4) -> TensorDataset:
    """(index, x, label): the label is the quadrant of two projections of x."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(n, features, generator=gen)
    w = torch.randn(features, 2, generator=gen)
    z = x @ w
    labels = (z[:, 0] > 0).long() * 2 + (z[:, 1] > 0).long()
    return TensorDataset(torch.arange(n), x, labels % classes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--per-rank-batch-size", type=int, default=32)
    parser.add_argument("--memory", type=int, default=8, help="rank 1's simulated limit")
    parser.add_argument("--record", help="write each rank's indices and losses here")
    args = parser.parse_args()

    unidist.initialize()
    unidist.setup_logging()
    log = logging.getLogger("microbatch")
    loader = unidist.auto_dataloader(
        synthetic_data(), per_rank_batch_size=args.per_rank_batch_size, num_workers=0
    )
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    model = unidist.auto_model(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    mb = unidist.MicroBatcher(model)  # sizes agreed by all ranks; step() zeroes the gradients

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch[0]), batch[1])

    limit = {1: args.memory} if unidist.get_world_size() > 1 else {0: args.memory}
    losses: list[float] = []
    seen: list[int] = []
    with OOMBudget(limit).attach(net) if args.memory else contextlib.nullcontext():
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)  # a fresh shuffle each epoch
            total, batches = 0.0, 0
            for ids, x, y in loader:
                if epoch == 0:
                    seen.extend(ids.tolist())
                loss = mb.step((x, y), loss_fn)  # forward + backward, in microbatches that fit
                optimizer.step()
                total, batches = total + float(loss), batches + 1
            losses.append(unidist.all_reduce(total / batches, "mean"))
            log.info("epoch %d  loss %.4f  microbatch size %s", epoch, losses[-1], mb.size)
    log.info("size history: %s", [(c.step, c.old, c.new) for c in mb.history])
    if args.record:
        Path(args.record, f"rank{unidist.get_rank()}.json").write_text(
            json.dumps({"indices": seen, "losses": losses, "size": mb.size})
        )
    unidist.finalize()
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
