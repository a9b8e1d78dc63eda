"""A small real training job that runs unchanged as one process or under any launcher.

    python examples/train.py                           # one process
    unidist launch -n 2 examples/train.py              # two processes over gloo (the demo)
    torchrun --standalone --nproc_per_node 2 examples/train.py
    composer -n 2 examples/train.py

It fits a two-layer network to a synthetic regression task. unidist picks the device and backend,
shards the data (every sample once per epoch across ranks, a new order each epoch), wraps the
model in DistributedDataParallel when there are several processes, and rank 0 logs the loss
averaged over all ranks. ``--record DIR`` writes what each rank read and its losses to
``DIR/rank<N>.json`` (the test suite checks them).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import unidist


def synthetic_data(n: int = 4096, features: int = 16) -> TensorDataset:
    """The same data on every rank: (index, x, y) with y = sin(x @ w) + noise."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=gen)
    w = torch.randn(features, 1, generator=gen) / features**0.5
    y = torch.sin(x @ w) + 0.01 * torch.randn(n, 1, generator=gen)
    return TensorDataset(torch.arange(n), x, y)


def record(folder: str | None, indices: list[int], losses: list[float]) -> None:
    """Write what this rank read in the first epoch and the loss of each epoch."""
    if folder:
        path = Path(folder, f"rank{unidist.get_rank()}.json")
        path.write_text(json.dumps({"indices": indices, "losses": losses}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch-size", type=int, default=128)
    parser.add_argument("--record", help="write each rank's indices and losses here")
    args = parser.parse_args()

    unidist.initialize()  # gloo on CPU, nccl on GPUs; reads whatever launcher started us
    unidist.setup_logging()  # records tagged with the rank, from the main rank only
    log = logging.getLogger("train")
    log.info("%s on %s", unidist.topology(), unidist.device())

    loader = unidist.auto_dataloader(
        synthetic_data(), global_batch_size=args.global_batch_size, num_workers=0
    )
    torch.manual_seed(0)  # identical initial weights on every rank
    model = unidist.auto_model(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    losses: list[float] = []
    seen: list[int] = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)  # a fresh shuffle each epoch, as with torch's sampler
        total, batches = 0.0, 0
        for ids, x, y in unidist.progress(loader, desc=f"epoch {epoch}"):
            if epoch == 0:
                seen.extend(ids.tolist())
            x, y = x.to(unidist.device()), y.to(unidist.device())
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        losses.append(unidist.all_reduce(total / batches, "mean"))
        log.info("epoch %d  %d batches/rank  loss %.4f", epoch, batches, losses[-1])

    log.info("loss fell from %.4f to %.4f over %d epochs", losses[0], losses[-1], args.epochs)
    record(args.record, seen, losses)
    unidist.finalize()
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
