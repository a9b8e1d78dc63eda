"""A custom adapter, worked out: plain torch.distributed that counts every primitive it runs.

    python -c "from unidist.testing import check_adapter; \\
               check_adapter('examples.custom_adapter:CountingAdapter', world_size=2)"
    unidist launch -n 2 examples/custom_adapter.py     # train through it, print the counts

An adapter is the pair it provides (``unidist.adapters.base.Adapter``): where its jobs run,
``environment`` (an ``unidist.environments.Environment``, or None when unidist's own
environments read its launcher's variables, as here: torchrun's and ``unidist launch``'s), and
how its ranks talk: a name, ``detect``, ``initialize``/``finalize``, ``topology``, and five
primitives (``all_reduce`` with the ops ``sum min max product band bor``, ``all_gather``,
``broadcast``, ``barrier``, ``new_group``), which unidist's communicator calls for every
collective. Everything users call — Python numbers, ``mean``, uneven and object gathers,
timeouts, ``one_rank_first``, samplers — is built once above them. This one delegates to
``torch.distributed`` and keeps a count per primitive, which shows how many collectives a loop
really issues. The training loop below averages gradients with ``unidist.all_reduce`` (no DDP),
so every step goes through the adapter. ``--record DIR`` writes what each rank read.

Register an adapter for ``initialize(adapter="counting")`` and ``UNIDIST_ADAPTER=counting`` with
the entry-point group ``unidist.adapters`` in your package's ``pyproject.toml``::

    [project.entry-points."unidist.adapters"]
    counting = "my_package.adapters:CountingAdapter"

or pass an instance, as ``main()`` does: ``unidist.initialize(adapter=CountingAdapter())``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

import unidist
from unidist.adapters.base import NamedAdapter

if TYPE_CHECKING:
    from unidist import Topology
    from unidist.adapters.base import PrimitiveOp
    from unidist.environments import EnvReading

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "product": dist.ReduceOp.PRODUCT,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
}


# --8<-- [start:adapter]
class CountingAdapter(NamedAdapter):
    """``torch.distributed`` with a count of every primitive call (``adapter.calls``)."""

    name = "counting"
    #: Where its jobs run: None, the torch variables that unidist reads anyway.
    environment = None

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._owns = False
        self._timeout: timedelta | None = None

    def detect(self, env: EnvReading) -> str | None:
        # Cheap, no import, no communication: this adapter is only ever chosen by name.
        return None

    def initialize(self, backend: str | None, *, timeout: timedelta, env: EnvReading) -> bool:
        self._timeout = timeout
        if dist.is_initialized():  # adopt a group someone else started; do not own it
            return False
        if env.master_addr is None or env.master_port is None:
            raise unidist.ConfigurationError(
                "the counting adapter needs MASTER_ADDR and MASTER_PORT. HINT: start the job "
                "with unidist launch or torchrun."
            )
        dist.init_process_group(
            backend or "gloo",
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
        )
        self._owns = True
        return True

    def finalize(self) -> None:
        if self._owns and dist.is_initialized():
            dist.destroy_process_group()
        self._owns = False

    def topology(self, env: Topology) -> Topology:
        if not dist.is_initialized():
            return env
        return replace(env, rank=dist.get_rank(), world_size=dist.get_world_size())

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, group: Any) -> torch.Tensor:
        self.calls["all_reduce"] += 1
        dist.all_reduce(tensor, op=_OPS[op], group=group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        self.calls["all_gather"] += 1
        size = dist.get_world_size(group)
        out = [torch.empty_like(tensor) for _ in range(size)]
        dist.all_gather(out, tensor, group=group)
        return out

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        self.calls["broadcast"] += 1
        dist.broadcast(tensor, src=src, group=group)  # src is a global rank, as torch wants
        return tensor

    def barrier(self, group: Any) -> None:
        self.calls["barrier"] += 1
        dist.barrier(group=group)

    def new_group(self, ranks: Sequence[int]) -> Any:
        self.calls["new_group"] += 1
        return dist.new_group(ranks=list(ranks), timeout=self._timeout)


# --8<-- [end:adapter]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--record", help="write each rank's indices and losses here")
    args = parser.parse_args()

    adapter = CountingAdapter()
    unidist.initialize(adapter=adapter)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1024, 8, generator=gen)
    data = TensorDataset(torch.arange(1024), x, x @ torch.randn(8, 1, generator=gen))
    loader = unidist.auto_dataloader(data, global_batch_size=64, num_workers=0)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    for p in model.parameters():  # the same start everywhere, through the adapter
        unidist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses: list[float] = []
    seen: list[int] = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)  # a fresh shuffle each epoch
        total, batches = 0.0, 0
        for ids, xb, yb in loader:
            if epoch == 0:
                seen.extend(ids.tolist())
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            for p in model.parameters():  # data parallelism by hand: average the gradients
                unidist.all_reduce(p.grad, "mean")
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        losses.append(unidist.all_reduce(total / batches, "mean"))
    if unidist.is_main_process():
        print(f"{unidist.current_adapter()!r} ran {dict(adapter.calls)}", flush=True)
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    if args.record:
        Path(args.record, f"rank{unidist.get_rank()}.json").write_text(
            json.dumps({"indices": seen, "losses": losses, "calls": dict(adapter.calls)})
        )
    unidist.finalize()
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
