"""Gradient and buffer bookkeeping for :class:`unidist.MicroBatcher`.

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
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

__all__ = ["GradientAverager", "ModelView", "inspect_model"]

T = TypeVar("T", bound="torch.Tensor")


class ModelView:
    """What the microbatcher needs to know about a model, DDP-wrapped or not."""

    def __init__(self, model: torch.nn.Module, ddp: Any) -> None:
        self.model = model
        #: The DistributedDataParallel wrapper, or None for a plain module.
        self.ddp = ddp
        #: Every parameter that takes a gradient (its ``.grad`` is managed per step).
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device_types = tuple({p.device.type for p in self.params})

    def reduced_params(self) -> list[torch.nn.Parameter]:
        """The parameters DDP would all-reduce: trainable, not in ``parameters_to_ignore``."""
        if self.ddp is None:
            return self.params
        ignored: set[str] = getattr(self.ddp, "parameters_to_ignore", set())
        return [
            p
            for name, p in self.ddp.module.named_parameters()
            if p.requires_grad and name not in ignored
        ]

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's ``no_sync()`` (nothing for a plain module)."""
        with self.ddp.no_sync() if self.ddp is not None else nullcontext():
            yield

    @contextmanager
    def buffer_sync_off(self) -> Iterator[None]:
        """Stop DDP from broadcasting buffers inside forward (a collective one rank may miss).

        :meth:`broadcast_buffers` does it once per step instead, where every rank gets to.
        """
        if self.ddp is None:
            yield
            return
        before = self.ddp.require_forward_param_sync
        self.ddp.require_forward_param_sync = False
        try:
            yield
        finally:
            self.ddp.require_forward_param_sync = before

    def broadcast_buffers(self) -> None:
        """Copy the group's first rank's buffers to every rank, as DDP does before each batch."""
        import torch
        import torch.distributed as dist

        ddp = self.ddp
        if ddp is None or not ddp.broadcast_buffers:
            return
        ignored: set[str] = getattr(ddp, "parameters_to_ignore", set())
        buffers = [b for name, b in ddp.module.named_buffers() if name not in ignored]
        group = ddp.process_group
        if not buffers or dist.get_world_size(group) == 1:
            return
        with torch.no_grad():
            for same in _by_kind(buffers):
                flat = torch.cat([b.reshape(-1) for b in same])
                dist.broadcast(flat, group=group, group_src=0)
                _unflatten_into(flat, same)

    def snapshot_buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(buffer, copy) pairs, to undo what a failed attempt's forwards did to them."""
        return [(b, b.detach().clone()) for b in self.model.buffers()]

    def restore_buffers(self, snapshot: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy :meth:`snapshot_buffers`'s copies back."""
        import torch

        with torch.no_grad():
            for buffer, copy in snapshot:
                buffer.copy_(copy)

    def take_grads(self, keep: bool) -> list[torch.Tensor | None] | None:
        """Clear every ``.grad`` for the step; with ``keep``, return them to add back later.

        Nothing is copied: the tensors are only set aside.
        """
        saved = [p.grad for p in self.params] if keep else None
        self.drop_grads()
        return saved

    def give_back_grads(self, saved: list[torch.Tensor | None] | None) -> None:
        """Add the gradients :meth:`take_grads` set aside to the current ones."""
        if saved is None:
            return
        for p, old in zip(self.params, saved, strict=True):
            if old is None:
                continue
            if p.grad is not None:
                old.add_(p.grad)
            p.grad = old

    def drop_grads(self) -> None:
        """Set every gradient to None (the partial gradients of a failed attempt)."""
        for p in self.params:
            p.grad = None


def inspect_model(model: object) -> ModelView:
    """Check that ``model`` is something the microbatcher supports, and describe it.

    Raises:
        ConfigurationError: not a module, or an FSDP model (its forward runs collectives).
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ConfigurationError(
            f"MicroBatcher needs the torch.nn.Module that loss_fn calls, got "
            f"{type(model).__name__}. HINT: pass the model (the DDP wrapper if you use one)."
        )
    if _is_fsdp(model):
        raise ConfigurationError(
            "MicroBatcher does not support FSDP models: their forward and backward run "
            "all-gathers and reduce-scatters, so a rank that runs out of memory in the middle "
            "leaves the others stuck in a collective. HINT: use a fixed microbatch size with "
            "FSDP, or DistributedDataParallel."
        )
    # The DDP wrapper may itself be wrapped (torch.compile's OptimizedModule, a user container).
    found = [m for m in model.modules() if isinstance(m, torch.nn.parallel.DistributedDataParallel)]
    if len(found) > 1:
        raise ConfigurationError(
            f"the model holds {len(found)} DistributedDataParallel wrappers; MicroBatcher "
            "manages one. HINT: wrap the whole model in a single DDP."
        )
    return ModelView(model, found[0] if found else None)


def _is_fsdp(model: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch without distributed support
        return False
    return any(isinstance(m, FSDPModule | FullyShardedDataParallel) for m in model.modules())


def _by_kind(tensors: Sequence[T]) -> list[list[T]]:
    """Tensors grouped by (device, dtype), groups in first-seen order."""
    groups: dict[tuple[Any, Any], list[T]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


def _unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
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
        for same in _by_kind(self.params):
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
