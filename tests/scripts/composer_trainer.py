"""A Composer Trainer job on synthetic data, for ``unidist launch -n 2`` (CPU, gloo)."""

from __future__ import annotations

import torch
from composer import Trainer
from composer.models import ComposerClassifier
from composer.utils import dist
from torch.utils.data import DataLoader, TensorDataset

import unidist


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    sampler = dist.get_sampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    trainer = Trainer(
        model=ComposerClassifier(net, num_classes=2),
        train_dataloader=loader,
        max_duration="2ep",
        device="cpu",
        progress_bar=False,
    )
    trainer.fit()
    topo = unidist.topology()  # unidist answers from the group Composer started
    print(
        f"composer trainer done on rank {dist.get_global_rank()} of {dist.get_world_size()} "
        f"node {dist.get_node_rank()}; unidist says rank {topo.rank} of {topo.world_size}",
        flush=True,
    )
    trainer.close()


if __name__ == "__main__":
    main()
