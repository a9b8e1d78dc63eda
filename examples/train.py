"""A small real training job that runs unchanged as one process or under any launcher.

    python examples/train.py                                   # one process
    torchrun --standalone --nproc_per_node 2 examples/train.py # two processes over gloo
    composer -n 2 examples/train.py

It fits a two-layer network to a synthetic regression task; every rank trains on its own shard
and DistributedDataParallel averages the gradients. Rank 0 prints the mean loss across ranks.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import unidist


def synthetic_data(n: int = 4096, features: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The same data on every rank: y = sin(x @ w) + noise."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=gen)
    w = torch.randn(features, 1, generator=gen) / features**0.5
    return x, torch.sin(x @ w) + 0.01 * torch.randn(n, 1, generator=gen)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    args = parser.parse_args()

    unidist.initialize()  # gloo on CPU; adopts the launcher's variables
    topo = unidist.topology()
    print(f"[rank {topo.rank}] {topo}", flush=True)

    torch.manual_seed(0)  # identical initial weights on every rank
    model: nn.Module = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    if topo.world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    x, y = synthetic_data()
    mine = torch.arange(topo.rank, len(x), topo.world_size)  # this rank's shard
    gen = torch.Generator().manual_seed(topo.rank)
    losses = []
    for step in range(args.steps):
        batch = mine[torch.randint(len(mine), (args.batch_size,), generator=gen)]
        loss = nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean_loss = unidist.all_reduce(loss.item(), "mean")
        losses.append(mean_loss)
        if unidist.is_main_process() and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {mean_loss:.4f}", flush=True)

    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    if unidist.is_main_process():
        print(f"loss fell from {first:.4f} to {last:.4f} over {args.steps} steps", flush=True)
    unidist.finalize()
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
