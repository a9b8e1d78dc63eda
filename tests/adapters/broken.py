"""Adapters that each break one clause of the contract: the conformance suite must catch them."""

from __future__ import annotations

from typing import Any

import torch

from unidist.adapters.torch import TorchAdapter


class ReversedGatherAdapter(TorchAdapter):
    """Returns all_gather results in reverse rank order."""

    name = "reversed-gather"

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        return list(reversed(super().all_gather(tensor, group)))


class FloatBroadcastAdapter(TorchAdapter):
    """Broadcasts int64 through float32, as Ignite does for numbers: big ints lose precision."""

    name = "float-broadcast"

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        if tensor.dtype != torch.int64:
            return super().broadcast(tensor, src, group)
        wide = tensor.to(torch.float32)
        super().broadcast(wide, src, group)
        return wide.to(tensor.dtype)
