"""The plain ``torch.distributed`` adapter: the reference implementation of the contract."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from unidist.adapters._torchdist import gather
from unidist.adapters.base import NamedAdapter
from unidist.environments.places import TorchVariables
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist.adapters.base import PrimitiveOp
    from unidist.environments.variables import EnvReading, Topology

__all__ = ["DEFAULT_MASTER_ADDR", "DEFAULT_MASTER_PORT", "TorchAdapter", "init_method_for"]

#: Where the ranks meet when MASTER_ADDR is not set: Ignite's default (its native computation
#: model's ``setup_env_vars``), so ``initialize("gloo")`` in a renamed Ignite script meets at
#: the same address. One host only: ranks on other hosts need MASTER_ADDR.
DEFAULT_MASTER_ADDR = "127.0.0.1"
#: The port when MASTER_PORT is not set: Ignite's default, for the same reason.
DEFAULT_MASTER_PORT = 15000


def init_method_for(env: EnvReading) -> str:
    """The ``tcp://`` rendezvous address of ``env`` (Ignite's defaults for what is not set)."""
    addr = env.master_addr if env.master_addr is not None else DEFAULT_MASTER_ADDR
    port = env.master_port if env.master_port is not None else DEFAULT_MASTER_PORT
    host = f"[{addr}]" if ":" in addr else addr
    return f"tcp://{host}:{port}"


class TorchAdapter(NamedAdapter):
    """Delegates to ``torch.distributed`` directly.

    The rendezvous store is created once per process and address and kept across
    ``finalize``/``initialize`` cycles; each cycle uses its own key prefix. Re-creating the store
    on the same port races: a fast rank can join the previous cycle's server before the slow
    rank 0 has shut it down.
    """

    name = "torch"
    #: torchrun's and ``unidist launch``'s variables (unidist reads them first anyway).
    environment = TorchVariables()

    def __init__(self) -> None:
        self._owns = False
        self._timeout: timedelta | None = None
        self._stores: dict[tuple[str, int, int], Any] = {}
        self._generation = 0

    def detect(self, env: EnvReading) -> str | None:
        return "plain torch.distributed fits every process (the fallback)"

    def initialize(self, backend: str | None, *, timeout: timedelta, env: EnvReading) -> bool:
        import torch.distributed as dist

        self._timeout = timeout
        if dist.is_initialized():
            return False
        if backend is None:
            raise ConfigurationError("the torch adapter needs a backend name, got None.")
        store: Any
        if env.world_size == 1 and (env.master_addr is None or env.master_port is None):
            # One process needs no rendezvous: an in-memory store, no port to collide on.
            store = dist.HashStore()
        else:
            self._generation += 1
            store = dist.PrefixStore(f"unidist/{self._generation}", self._store(env, timeout))
        dist.init_process_group(
            backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout
        )
        self._owns = True
        return True

    def _store(self, env: EnvReading, timeout: timedelta) -> Any:
        import torch.distributed as dist

        key = (init_method_for(env), env.rank, env.world_size)
        store = self._stores.get(key)
        if store is None:
            # torch's own rendezvous: it also knows torchrun's agent-hosted store.
            store, _, _ = next(
                dist.rendezvous(key[0], rank=env.rank, world_size=env.world_size, timeout=timeout)
            )
            self._stores[key] = store
        return store

    def finalize(self) -> None:
        import torch.distributed as dist

        if self._owns and dist.is_initialized():
            dist.destroy_process_group()
        self._owns = False

    def topology(self, env: Topology) -> Topology:
        import torch.distributed as dist

        if not dist.is_initialized():
            return env
        return replace(env, rank=dist.get_rank(), world_size=dist.get_world_size())

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(tensor, op=_reduce_op(op), group=group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        return gather(tensor, group)

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        dist.broadcast(tensor, src=src, group=group)
        return tensor

    def barrier(self, group: Any) -> None:
        import torch.distributed as dist

        dist.barrier(group=group)

    def new_group(self, ranks: Sequence[int]) -> Any:
        import torch.distributed as dist

        return dist.new_group(ranks=list(ranks), timeout=self._timeout)


@functools.cache
def _reduce_ops() -> dict[str, Any]:
    import torch.distributed as dist

    return {
        "sum": dist.ReduceOp.SUM,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "product": dist.ReduceOp.PRODUCT,
        "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR,
    }


def _reduce_op(op: PrimitiveOp) -> Any:
    return _reduce_ops()[op]
