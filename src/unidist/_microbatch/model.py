"""What :class:`unidist.MicroBatcher` needs to know of a model: DDP's group, ``no_sync``, buffers.

:func:`inspect_model` finds the DistributedDataParallel wrapper (if any) inside whatever the user
passed, refuses FSDP (which reduces inside ``backward``), and returns a :class:`ModelView`: the
parameters whose gradients the step averages, a ``no_sync()`` that covers every microbatch, and a
snapshot of the buffers (BatchNorm statistics) to restore before a retry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from unidist._base.loaded import loaded_classes
from unidist._microbatch.averaging import by_kind, unflatten_into
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

__all__ = ["ModelView", "inspect_model"]


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
            for same in by_kind(buffers):
                flat = torch.cat([b.reshape(-1) for b in same])
                dist.broadcast(flat, group=group, group_src=0)
                unflatten_into(flat, same)

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
    # FSDP's classes only if it is imported (no model can be sharded by it otherwise): importing
    # it costs a second of CPU, and torch builds without distributed support lack it.
    sharded = loaded_classes("torch.distributed.fsdp", "FSDPModule", "FullyShardedDataParallel")
    return any(isinstance(m, sharded) for m in model.modules())
