"""A Composer ``Trainer`` job with unidist's samplers, on synthetic data.

    unidist launch -n 2 examples/composer_trainer.py    # or: composer -n 2 examples/...
    python examples/composer_trainer.py                 # one process

Composer keeps doing what it does (the training loop, DDP, metrics, logging); unidist gives it
the samplers: a shuffled, resumable ``DistributedSampler`` for training (the indices of
``dist.get_sampler(shuffle=True)``, exactly) and an exact-once one for evaluation, which
inside ``Trainer.eval()`` pads the way Composer expects so that every validation sample counts
once. ``--record DIR`` writes what each rank trained on and the mean loss per epoch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from composer import Callback, Event, Logger, State, Trainer
from composer.models import ComposerClassifier
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import unidist


class Recorded(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A dataset that remembers which indices this process read (num_workers=0)."""

    def __init__(self, data: TensorDataset) -> None:
        self.data = data
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.read.append(int(index))
        return self.data[index]  # type: ignore[no-any-return]


class EpochLoss(Callback):
    """The mean training loss of each epoch, averaged over the ranks with unidist."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self._batch: list[float] = []

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BATCH_END:
            self._batch.append(float(state.loss))  # type: ignore[arg-type]
        elif event == Event.EPOCH_END:
            self.losses.append(unidist.all_reduce(sum(self._batch) / len(self._batch), "mean"))
            self._batch.clear()


def synthetic(n: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=gen)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--record", help="write each rank's indices and losses here")
    args = parser.parse_args()

    unidist.initialize()  # under composer -n, Composer's adapter; under unidist launch, torch's
    train = Recorded(synthetic(512, 0))
    val = synthetic(101, 1)  # 101 samples: the shards of 2 ranks are 51 and 50
    train_loader = DataLoader(
        train, batch_size=16, sampler=unidist.DistributedSampler(train, seed=17)
    )
    val_loader = DataLoader(
        val, batch_size=8, sampler=unidist.DistributedSampler(val, mode="eval", shuffle=False)
    )
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    epoch_loss = EpochLoss()
    trainer = Trainer(
        model=ComposerClassifier(net, num_classes=2),
        train_dataloader=train_loader,
        eval_dataloader=val_loader,
        optimizers=torch.optim.SGD(net.parameters(), lr=0.1),
        max_duration=f"{args.epochs}ep",
        device="cpu" if not torch.cuda.is_available() else "gpu",
        callbacks=[epoch_loss],
        progress_bar=False,
        log_to_console=False,
        loggers=[],
    )
    trainer.fit()
    first_epoch = train.read[: len(train.read) // args.epochs]
    accuracy = trainer.state.eval_metrics["eval"]["MulticlassAccuracy"].compute()
    if unidist.is_main_process():
        print(f"loss per epoch {epoch_loss.losses}, validation accuracy {accuracy:.3f}")
    if args.record:
        record: dict[str, Any] = {"indices": first_epoch, "losses": epoch_loss.losses}
        Path(args.record, f"rank{unidist.get_rank()}.json").write_text(json.dumps(record))
    trainer.close()
    unidist.finalize()
    losses = epoch_loss.losses
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
