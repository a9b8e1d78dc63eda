"""An Ignite job without Parallel, for ``unidist launch -n 2``: idist + Engine on synthetic data."""

from __future__ import annotations

import ignite.distributed as idist
import torch
from ignite.engine import create_supervised_trainer
from torch.utils.data import TensorDataset

import unidist


def main() -> None:
    idist.initialize("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = idist.auto_dataloader(data, batch_size=32, shuffle=True)
    model = idist.auto_model(torch.nn.Linear(8, 1))
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.05))
    trainer = create_supervised_trainer(model, optimizer, torch.nn.MSELoss())
    state = trainer.run(loader, max_epochs=2)
    loss = idist.all_reduce(float(state.output)) / idist.get_world_size()
    with unidist.use("ignite"):  # unidist adopts Ignite's group
        topo = unidist.topology()
    print(
        f"ignite engine done on rank {idist.get_rank()} of {idist.get_world_size()}, "
        f"mean loss {loss:.4f}; unidist says rank {topo.rank} of {topo.world_size}",
        flush=True,
    )
    idist.finalize()


if __name__ == "__main__":
    main()
