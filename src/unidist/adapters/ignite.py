"""The PyTorch-Ignite adapter: delegates to ``ignite.distributed`` (``idist``).

Quirks of Ignite 0.5 that this adapter normalises, so it answers exactly like the others:

* ``idist.all_gather`` concatenates along dim 0 (unsqueezing 0-d tensors); the adapter splits
  the result back into one tensor per rank.
* ``idist.broadcast`` and ``idist.barrier`` take no group; for a subgroup the adapter calls
  ``torch.distributed`` with Ignite's own process-group handle.
* Ignite names bitwise ops ``AND``/``OR``; unidist's ``band``/``bor`` map onto them.
* Numbers are never handed to Ignite (it broadcasts them as float32): unidist turns them into
  tensors of the right dtype above the adapter.

Inside ``idist.Parallel`` (or after ``idist.initialize``) the adapter adopts Ignite's live context
instead of creating a second one, and leaves its teardown to Ignite.

This file holds the adapter contract only. Ignite's own model and optimizer wrapping
(``unidist.auto_model(..., via="ignite")``) and its samplers are an integration:
:mod:`unidist.integrations.ignite`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from unidist.adapters._torchdist import rank_zero_store_closes_first
from unidist.adapters.base import NamedAdapter
from unidist.environments.places import TorchVariables
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist.adapters.base import PrimitiveOp
    from unidist.environments.variables import EnvReading, Topology

__all__ = ["IgniteAdapter"]

_OPS = {"sum": "SUM", "min": "MIN", "max": "MAX", "product": "PRODUCT", "band": "AND", "bor": "OR"}


class IgniteAdapter(NamedAdapter):
    """Delegates to ``ignite.distributed``."""

    name = "ignite"
    #: ``idist.Parallel`` and ``ignite.distributed.launcher`` set the torch variables.
    environment = TorchVariables()

    def __init__(self) -> None:
        self._owns = False
        self._adopted_ignite_context = False
        self._env: EnvReading | None = None

    def detect(self, env: EnvReading) -> str | None:
        if "ignite.distributed" in sys.modules and _ignite_context_is_live():
            return "running inside an Ignite context (idist.Parallel or idist.initialize)"
        return None

    def initialize(self, backend: str | None, *, timeout: timedelta, env: EnvReading) -> bool:
        import ignite.distributed as idist
        import torch.distributed as tdist

        if tdist.is_initialized():
            # Adopt: an idist.Parallel context, or a group made by the user or another adapter.
            # sync() is collective (Ignite counts the processes per node); every rank is here.
            self._adopted_ignite_context = _ignite_context_is_live()
            if not self._adopted_ignite_context:
                idist.sync()
            return False
        if backend is None:
            raise ConfigurationError("the ignite adapter needs a backend name, got None.")
        idist.initialize(backend, timeout=timeout)
        self._env = env
        self._owns = True
        return True

    def finalize(self) -> None:
        import ignite.distributed as idist

        if self._owns and self._env is not None:
            with rank_zero_store_closes_first(self._env, idist.barrier):
                idist.finalize()
        self._owns = False
        self._adopted_ignite_context = False

    def topology(self, env: Topology) -> Topology:
        import ignite.distributed as idist

        launcher = "ignite" if self._adopted_ignite_context and env.launcher == "env" else None
        return replace(
            env,
            rank=idist.get_rank(),
            world_size=idist.get_world_size(),
            local_rank=idist.get_local_rank(),
            local_world_size=idist.get_nproc_per_node(),
            node_rank=idist.get_node_rank(),
            num_nodes=idist.get_nnodes(),
            launcher=launcher or env.launcher,
        )

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, group: Any) -> torch.Tensor:
        import ignite.distributed as idist

        return cast("torch.Tensor", idist.all_reduce(tensor, op=_OPS[op], group=group))

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        import ignite.distributed as idist
        import torch
        import torch.distributed as tdist

        size = tdist.get_world_size(group)
        if tensor.numel() == 0:
            return [tensor.clone() for _ in range(size)]
        joined = cast("torch.Tensor", idist.all_gather(tensor, group=group))  # one dim-0 concat
        if tensor.dim() == 0:
            return [joined[i] for i in range(size)]
        return list(torch.split(joined, tensor.shape[0], dim=0))

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        import ignite.distributed as idist
        import torch.distributed as tdist

        if group is not None:  # idist.broadcast has no group argument
            tdist.broadcast(tensor, src=src, group=group)
            return tensor
        return cast("torch.Tensor", idist.broadcast(tensor, src=src))

    def barrier(self, group: Any) -> None:
        import ignite.distributed as idist
        import torch.distributed as tdist

        if group is not None:  # idist.barrier has no group argument
            tdist.barrier(group=group)
        else:
            idist.barrier()

    def new_group(self, ranks: Sequence[int]) -> Any:
        import ignite.distributed as idist

        return idist.new_group(list(ranks))


def _ignite_context_is_live() -> bool:
    """Whether Ignite already holds a distributed model (inside ``idist.Parallel``).

    Reads Ignite's private ``_model`` slot, read-only: the public ``idist.model_name()`` would run
    Ignite's collective auto-detection on a serial model, which must not happen on one rank only.
    """
    from ignite.distributed import utils

    model = getattr(utils, "_model", None)
    return getattr(model, "name", "serial") != "serial"
