"""A small real training job that runs unchanged as one process or under any launcher.

    python examples/train.py                           # one process
    unidist launch -n 2 examples/train.py              # two processes over gloo (the demo)
    torchrun --standalone --nproc_per_node 2 examples/train.py
    composer -n 2 examples/train.py

It fits a two-layer network to a synthetic regression task. unidist picks the device and backend,
shards the data (every sample once per epoch across ranks, a new order each epoch), wraps the
model in DistributedDataParallel when there are several processes, and rank 0 prints the loss
averaged over all ranks.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import unidist


def synthetic_data(n: int = 4096, features: int = 16) -> TensorDataset:
    """The same data on every rank: y = sin(x @ w) + noise."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=gen)
    w = torch.randn(features, 1, generator=gen) / features**0.5
    return TensorDataset(x, torch.sin(x @ w) + 0.01 * torch.randn(n, 1, generator=gen))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch-size", type=int, default=128)
    args = parser.parse_args()

    unidist.initialize()  # gloo on CPU, nccl on GPUs; reads whatever launcher started us
    topo = unidist.topology()
    print(f"{topo} on {unidist.device()}", flush=True)

    loader = unidist.auto_dataloader(
        synthetic_data(), global_batch_size=args.global_batch_size, num_workers=0
    )
    torch.manual_seed(0)  # identical initial weights on every rank
    model = unidist.auto_model(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    first = last = 0.0
    for epoch in range(args.epochs):
        total, batches = 0.0, 0
        for x, y in loader:  # each epoch a fresh shuffle, no set_epoch needed
            x, y = x.to(unidist.device()), y.to(unidist.device())
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        mean_loss = unidist.all_reduce(total / batches, "mean")
        first, last = (mean_loss if epoch == 0 else first), mean_loss
        if unidist.is_main_process():
            print(f"epoch {epoch}  {batches} batches/rank  loss {mean_loss:.4f}", flush=True)

    if unidist.is_main_process():
        print(f"loss fell from {first:.4f} to {last:.4f} over {args.epochs} epochs", flush=True)
    unidist.finalize()
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
