"""The world-of-one adapter: a real backend with identity collectives.

It is what unidist uses when nothing is distributed, so user code runs unchanged without a
launcher, and it is the simplest complete example of the adapter contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from unidist.adapters.base import NamedAdapter
from unidist.environments.places import SingleProcess
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist.adapters.base import PrimitiveOp
    from unidist.environments.variables import EnvReading, Topology

__all__ = ["SerialAdapter"]


class SerialAdapter(NamedAdapter):
    """One process, no process group; every collective returns its input."""

    name = "serial"
    #: Nothing started it: one process (the fallback every chooser ends with).
    environment = SingleProcess()

    def detect(self, env: EnvReading) -> str | None:
        return None  # never chosen by detection: it is the no-launcher default

    def initialize(self, backend: str | None, *, timeout: timedelta, env: EnvReading) -> bool:
        if env.world_size != 1:
            raise ConfigurationError(
                f"the serial adapter runs one process, but the environment says world size "
                f"{env.world_size} ({env.launcher}). HINT: use adapter='torch' (or another "
                "distributed adapter) for multi-process jobs."
            )
        return False

    def finalize(self) -> None:
        return None

    def topology(self, env: Topology) -> Topology:
        return env

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, group: Any) -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        return [tensor]

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        return tensor

    def barrier(self, group: Any) -> None:
        return None

    def new_group(self, ranks: Sequence[int]) -> Any:
        return tuple(ranks)
