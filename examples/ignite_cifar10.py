"""Ignite's ``examples/cifar10`` in its own shape, ported to unidist, on synthetic images.

    unidist launch -n 2 examples/ignite_cifar10.py      # was: python main.py run --nproc_per_node 2
    python examples/ignite_cifar10.py                   # one process

What changed from Ignite's script (each line marked ``# unidist:`` below):

* ``idist.Parallel(backend, nproc_per_node)`` -> ``unidist launch -n 2`` starts the processes,
  and ``unidist.initialize()`` joins them; ``training(local_rank, config)`` is called directly.
* ``idist.auto_dataloader(ds, batch_size=B, num_workers=W)`` ->
  ``unidist.auto_dataloader(ds, global_batch_size=B, num_workers=W // local ranks)``: Ignite's
  ``batch_size`` and ``num_workers`` are for the whole job and the node; the shuffle is
  Ignite's (torch's), so a run reproduces the original.
* ``setup_logger(distributed_rank=...)`` -> ``unidist.setup_logging()``.
* ``idist.auto_model``/``auto_optim``/``device``/``one_rank_first`` keep their names.

Everything else (the Engine, events, metrics, the evaluator) is Ignite's, unchanged.
``--record DIR`` writes what each rank trained on and the mean loss per epoch.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Engine, Events, create_supervised_evaluator
from ignite.metrics import Accuracy, Loss
from torch import nn
from torch.utils.data import TensorDataset

import unidist


def synthetic_cifar(n: int, seed: int) -> TensorDataset:
    """(index, image 3x8x8, label of 10): labels from fixed random prototypes, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(10, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 10, (n,), generator=gen)
    images = prototypes[labels] + 0.8 * torch.randn(n, 3, 8, 8, generator=gen)
    return TensorDataset(torch.arange(n), images, labels)


def get_dataflow(config: dict[str, Any]) -> tuple[Any, Any]:
    with unidist.one_rank_first(local=True):  # rank 0 of each node "downloads" first
        train_set, test_set = synthetic_cifar(1024, 1), synthetic_cifar(256, 2)
    workers = config["num_workers"] // unidist.get_local_world_size()  # unidist: per rank
    train_loader = unidist.auto_dataloader(  # unidist: global_batch_size is Ignite's batch_size
        train_set,
        global_batch_size=config["batch_size"],
        num_workers=workers,
        shuffle=True,
        drop_last=True,
    )
    test_loader = unidist.auto_dataloader(
        test_set,
        global_batch_size=2 * config["batch_size"],
        num_workers=workers,
        shuffle=False,
        mode="eval",  # unidist: each test image counted once, no padding
    )
    return train_loader, test_loader


def get_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip


def initialize(config: dict[str, Any]) -> tuple[nn.Module, Any, nn.Module]:
    model = unidist.auto_model(get_model())
    optimizer = unidist.auto_optim(
        torch.optim.SGD(model.parameters(), lr=config["learning_rate"], momentum=0.9)
    )
    return model, optimizer, nn.CrossEntropyLoss().to(unidist.device())


def create_trainer(
    model: nn.Module, optimizer: Any, criterion: nn.Module, seen: list[int]
) -> Engine:
    device = unidist.device()

    def train_step(engine: Engine, batch: Any) -> float:
        ids, x, y = batch
        if engine.state.epoch == 1:
            seen.extend(ids.tolist())
        model.train()
        loss = criterion(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    return Engine(train_step)


def training(local_rank: int, config: dict[str, Any]) -> list[float]:
    rank = unidist.get_rank()
    torch.manual_seed(config["seed"])  # the same initial weights on every rank
    log = logging.getLogger("CIFAR10-Training")  # unidist: setup_logging() below shows rank 0's
    train_loader, test_loader = get_dataflow(config)
    model, optimizer, criterion = initialize(config)
    seen: list[int] = []
    trainer = create_trainer(model, optimizer, criterion, seen)
    evaluator = create_supervised_evaluator(
        model,
        metrics={"accuracy": Accuracy(), "loss": Loss(criterion)},
        device=unidist.device(),
        prepare_batch=lambda batch, device, non_blocking: (
            batch[1].to(device),
            batch[2].to(device),
        ),
    )
    losses: list[float] = []
    epoch_losses: list[float] = []
    trainer.on(Events.ITERATION_COMPLETED)(lambda e: epoch_losses.append(e.state.output))

    @trainer.on(Events.EPOCH_COMPLETED)
    def run_validation(engine: Engine) -> None:
        losses.append(unidist.all_reduce(sum(epoch_losses) / len(epoch_losses), "mean"))
        epoch_losses.clear()
        metrics = evaluator.run(test_loader).metrics  # Ignite syncs its metrics across ranks
        log.info(
            "epoch %d: train loss %.4f, test accuracy %.3f (rank %d saw %d training samples)",
            engine.state.epoch, losses[-1], metrics["accuracy"], rank, len(seen),
        )  # fmt: skip

    trainer.run(train_loader, max_epochs=config["num_epochs"])
    if config["record"]:
        Path(config["record"], f"rank{rank}.json").write_text(
            json.dumps({"indices": seen, "losses": losses})
        )
    return losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64, help="for the whole job")
    parser.add_argument("--num-workers", type=int, default=0, help="for the whole node")
    parser.add_argument("--num-epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--record", help="write each rank's indices and losses here")
    config = vars(parser.parse_args()) | {"seed": 543}
    unidist.initialize()  # unidist: replaces idist.Parallel(backend=...) with the launcher's
    unidist.setup_logging()
    losses = training(unidist.get_local_rank(), config)
    unidist.finalize()
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
