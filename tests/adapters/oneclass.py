"""An adapter that lacks ``environment`` (refused), and a third-party adapter that brings the
place its jobs run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch

from unidist.adapters.torch import TorchAdapter
from unidist.environments import reading
from unidist.environments.variables import EnvReading, Topology


class OneClassAdapter:
    """Plain torch.distributed, every member but ``environment``, and a count of its calls."""

    name = "oneclass"

    def __init__(self) -> None:
        self._torch = TorchAdapter()
        self.calls = 0

    def detect(self, env: EnvReading) -> str | None:
        return None

    def initialize(self, backend: str | None, *, timeout: timedelta, env: EnvReading) -> bool:
        return self._torch.initialize(backend, timeout=timeout, env=env)

    def finalize(self) -> None:
        self._torch.finalize()

    def topology(self, env: Topology) -> Topology:
        return self._torch.topology(env)

    def all_reduce(self, tensor: torch.Tensor, op: Any, group: Any) -> torch.Tensor:
        self.calls += 1
        return self._torch.all_reduce(tensor, op, group)

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        self.calls += 1
        return self._torch.all_gather(tensor, group)

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        self.calls += 1
        return self._torch.broadcast(tensor, src, group)

    def barrier(self, group: Any) -> None:
        self._torch.barrier(group)

    def new_group(self, ranks: Sequence[int]) -> Any:
        return self._torch.new_group(ranks)


class Racks:
    """A scheduler unidist does not know: ``RACK_RANK``, ``RACK_SIZE``, ``RACK_HEAD``
    (``host:port`` of rank 0)."""

    name = "racks"
    creates_processes = True

    def detect(self, env: Mapping[str, str]) -> bool:
        return "RACK_RANK" in env

    def read(self, env: Mapping[str, str]) -> EnvReading:
        host, _, port = env.get("RACK_HEAD", "127.0.0.1:0").rpartition(":")
        return reading(
            launcher="racks",
            rank=int(env["RACK_RANK"]),
            world_size=int(env["RACK_SIZE"]),
            master_addr=host,
            master_port=int(port),
            sources={"rank": "RACK_RANK", "world_size": "RACK_SIZE"},
        )


class RackAdapter(TorchAdapter):
    """torch.distributed on the racks scheduler: the pair (its environment and its methods)."""

    name = "racks"
    environment = Racks()  # type: ignore[assignment]
