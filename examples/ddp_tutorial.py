"""The shape of PyTorch's DDP tutorial (multigpu_torchrun.py), on unidist's names, on the CPU.

    torchrun --standalone --nproc-per-node 2 examples/ddp_tutorial.py 6 2
    unidist launch -n 2 examples/ddp_tutorial.py 6 2
    python examples/ddp_tutorial.py 6 2                  # one process: no launcher needed

A ``Trainer`` trains a linear model on a synthetic dataset sharded by ``DistributedSampler``,
saves a snapshot every ``save_every`` epochs and resumes from it when one exists. Above each line
that plain ``torch.distributed`` spells otherwise, ``# torch: ...`` comments give torch's
spelling (one or more lines that replace it). tests/test_examples.py turns the script back into
plain torch by those comments and checks that both read the same samples and end with the same
losses and weights, bit for bit, under torchrun and under unidist launch.

``--record DIR`` writes each rank's indices, losses and final weights to ``DIR/rank<N>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

# torch: import os
# torch: import torch.distributed as dist
# torch: from torch.nn.parallel import DistributedDataParallel as DDP
# torch: from torch.utils.data.distributed import DistributedSampler
import unidist

FEATURES = 20


class RegressionData(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """``size`` samples ``(index, x, y)`` with ``y = x @ w + noise``, the same on every rank."""

    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(2024)
        self.x = torch.randn(size, FEATURES, generator=generator)
        w = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
        self.y = self.x @ w + 0.1 * torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.tensor(index), self.x[index], self.y[index]


class Trainer:
    """Trains ``model`` on ``train_data``; rank 0 saves a snapshot every ``save_every`` epochs."""

    def __init__(
        self,
        model: nn.Module,
        train_data: DataLoader[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: Path,
    ) -> None:
        # torch: self.local_rank = int(os.environ["LOCAL_RANK"])
        self.local_rank = unidist.get_local_rank()
        self.device = torch.device("cpu")  # gloo on the CPU; on GPUs: cuda:<local rank>
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        self.model = model.to(self.device)
        if snapshot_path.exists():
            self._load_snapshot()
        # torch: self.model = DDP(self.model)
        self.model = unidist.auto_model(self.model, device=self.device)
        self.seen: list[list[int]] = []
        self.losses: list[float] = []

    def _load_snapshot(self) -> None:
        snapshot = torch.load(self.snapshot_path, map_location=self.device)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        # torch: print(f"[rank {dist.get_rank()}] resuming from epoch {self.epochs_run}")
        print(f"[rank {unidist.get_rank()}] resuming from epoch {self.epochs_run}")

    def _run_batch(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch: int) -> None:
        sampler = self.train_data.sampler
        # torch: assert isinstance(sampler, DistributedSampler)
        assert isinstance(sampler, unidist.DistributedSampler)
        sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's order (torch's too)
        indices: list[int] = []
        totals = torch.zeros(2, dtype=torch.float64)  # summed loss, batches
        for ids, x, y in self.train_data:
            indices.extend(ids.tolist())
            totals += torch.tensor([self._run_batch(x.to(self.device), y.to(self.device)), 1.0])
        # torch: dist.all_reduce(totals)
        unidist.all_reduce(totals)
        self.seen.append(indices)
        self.losses.append((totals[0] / totals[1]).item())
        # torch: if dist.get_rank() == 0:
        if unidist.get_rank() == 0:
            print(f"epoch {epoch} | {len(indices)} samples per rank | loss {self.losses[-1]:.5f}")

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {
            # torch: "MODEL_STATE": self.model.module.state_dict(),
            "MODEL_STATE": unidist.unwrap_model(self.model).state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch + 1,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"epoch {epoch} | snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if (epoch + 1) % self.save_every == 0:
                # torch: if dist.get_rank() == 0:
                if unidist.get_rank() == 0:
                    self._save_snapshot(epoch)
                # torch: dist.barrier()
                unidist.barrier()  # the snapshot is whole before any rank trains on


def load_train_objs(size: int) -> tuple[Dataset[Any], nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = nn.Linear(FEATURES, 1)
    return RegressionData(size), model, torch.optim.SGD(model.parameters(), lr=0.05)


def prepare_dataloader(dataset: Dataset[Any], batch_size: int) -> DataLoader[Any]:
    # No shuffle= beside a sampler: DataLoader ignores shuffle=False there (and refuses True);
    # the sampler shuffles, with a new order for each set_epoch.
    # torch: return DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset))
    return DataLoader(dataset, batch_size=batch_size, sampler=unidist.DistributedSampler(dataset))


def record(folder: str | None, trainer: Trainer) -> None:
    """Write what this rank read, the losses and the final weights (as exact hex floats)."""
    # torch: weights = trainer.model.module.state_dict()
    weights = unidist.unwrap_model(trainer.model).state_dict()
    if folder:
        # torch: rank = dist.get_rank()
        rank = unidist.get_rank()
        Path(folder, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "indices": trainer.seen[0] if trainer.seen else [],
                    "epochs": trainer.seen,
                    "losses": trainer.losses,
                    "weights": [v.item().hex() for t in weights.values() for v in t.flatten()],
                }
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, nargs="?", default=6)
    parser.add_argument("save_every", type=int, nargs="?", default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--size", type=int, default=1024, help="samples in the dataset")
    parser.add_argument("--snapshot-path", type=Path, default=Path("snapshot.pt"))
    parser.add_argument("--record", help="write each rank's indices, losses and weights here")
    args = parser.parse_args()

    # torch: dist.init_process_group(backend="gloo")
    unidist.initialize("gloo")
    dataset, model, optimizer = load_train_objs(args.size)
    train_data = prepare_dataloader(dataset, args.batch_size)
    trainer = Trainer(model, train_data, optimizer, args.save_every, args.snapshot_path)
    trainer.train(args.total_epochs)
    record(args.record, trainer)
    # torch: dist.destroy_process_group()
    unidist.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
