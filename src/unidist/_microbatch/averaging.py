"""Averaging gradients by hand, in buckets, once every rank voted success.

Why gradients are reduced by hand: DDP all-reduces inside ``backward``. If one rank runs out of
memory in its backward while another is already inside that all-reduce, the healthy rank waits in
a collective that never completes (Composer's known deadlock, mosaicml/composer PR #2117). So every
microbatch runs under ``no_sync()``, the ranks vote, and only when every rank has finished the
whole batch are the gradients averaged here, in buckets, over DDP's own process group. DDP's
reducer cannot be triggered after the fact, and re-running the last microbatch with sync enabled
would cost a forward and backward (and replay dropout); an explicit all-reduce costs what DDP's
costs, minus its overlap with the last backward. DDP communication hooks are not applied.

Everything the reduction allocates (its staging buffers) is allocated before the vote, inside
the attempt, so an OOM there is voted on like any other; the collectives then allocate nothing
except the gradients of parameters that this rank did not use but another rank did.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

__all__ = ["GradientAverager", "by_kind", "unflatten_into"]

T = TypeVar("T", bound="torch.Tensor")


def by_kind(tensors: Sequence[T]) -> list[list[T]]:
    """Tensors grouped by (device, dtype), groups in first-seen order."""
    groups: dict[tuple[Any, Any], list[T]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


class GradientAverager:
    """Averages gradients over a process group in buckets, after every rank voted success.

    Args:
        params: the parameters to average, in the same order on every rank.
        group: a ``torch.distributed`` process group (DDP's), or None for the unidist world.
        world_size: number of ranks in that group.
        bucket_bytes: largest staging buffer per (device, dtype).
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        group: Any,
        world_size: int,
        bucket_bytes: int,
    ) -> None:
        self.params = list(params)
        self.group = group
        self.world_size = world_size
        self._buckets: list[list[int]] = []
        for same in by_kind(self.params):
            self._buckets.extend(_buckets(same, self.params, bucket_bytes))
        self._staging: dict[tuple[Any, Any], torch.Tensor] = {}

    def missing(self) -> tuple[int, ...]:
        """Indices of the parameters without a gradient on this rank (voted on)."""
        return tuple(i for i, p in enumerate(self.params) if p.grad is None)

    def prepare(self) -> None:
        """Allocate the staging buffers (once); called inside the attempt, before the vote."""
        import torch

        for bucket in self._buckets:
            first = self.params[bucket[0]]
            key = (first.device, first.dtype)
            numel = sum(self.params[i].numel() for i in bucket)
            held = self._staging.get(key)
            if held is None or held.numel() < numel:
                self._staging[key] = torch.empty(numel, dtype=first.dtype, device=first.device)

    def reduce(self, missing_everywhere: set[int]) -> None:
        """Average every gradient over the group (in place); parameters unused on every rank
        keep ``grad=None``, as with DDP."""
        import torch

        with torch.no_grad():
            for bucket in self._buckets:
                self._reduce_bucket(bucket, missing_everywhere)

    def _reduce_bucket(self, bucket: list[int], missing_everywhere: set[int]) -> None:
        params = [self.params[i] for i in bucket]
        first = params[0]
        staging = self._staging[(first.device, first.dtype)]
        numel = sum(p.numel() for p in params)
        flat = staging[:numel]
        offset = 0
        for p in params:
            n = p.numel()
            if p.grad is None:
                flat[offset : offset + n].zero_()
            else:
                flat[offset : offset + n].view_as(p.grad).copy_(p.grad)
            offset += n
        flat.div_(self.world_size)  # divide first, like DDP: no overflow in half precision
        self._all_reduce(flat)
        offset = 0
        for i, p in zip(bucket, params, strict=True):
            n = p.numel()
            part = flat[offset : offset + n].view_as(p)
            offset += n
            if p.grad is not None:
                p.grad.copy_(part)
            elif i not in missing_everywhere:
                p.grad = part.clone()

    def _all_reduce(self, flat: torch.Tensor) -> None:
        if self.group is None:
            from unidist import collectives

            collectives.all_reduce(flat, "sum")
            return
        import torch.distributed as dist

        from unidist.errors import translate_errors

        with translate_errors(f"averaging gradients over {self.world_size} ranks"):
            dist.all_reduce(flat, group=self.group)


def _buckets(
    same: Sequence[torch.nn.Parameter], everything: Sequence[torch.nn.Parameter], cap: int
) -> Iterator[list[int]]:
    """Consecutive runs of parameter indices whose gradients fit in ``cap`` bytes (or one)."""
    index = {id(p): i for i, p in enumerate(everything)}
    bucket: list[int] = []
    size = 0
    for p in same:
        nbytes = p.numel() * p.element_size()
        if bucket and size + nbytes > cap:
            yield bucket
            bucket, size = [], 0
        bucket.append(index[id(p)])
        size += nbytes
    if bucket:
        yield bucket
