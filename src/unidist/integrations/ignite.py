"""Automatic microbatching for PyTorch-Ignite: a drop-in for ``create_supervised_trainer``.

:func:`microbatch_training_step` builds an ``Engine`` update function with the arguments of
``ignite.engine.supervised_training_step`` (plus AMP); :func:`create_microbatch_trainer` builds the
``Engine`` with the arguments of ``create_supervised_trainer``. Each iteration's batch is split
by a :class:`unidist.MicroBatcher`, so an out-of-memory error on any rank makes every rank retry
the batch with smaller microbatches; ``engine.state.microbatch_size`` holds the current size.

``prepare_batch`` runs per microbatch, so only one microbatch at a time is moved to the device.
``output_transform`` receives the whole batch: ``x``, ``y`` and ``y_pred`` are the microbatches'
values concatenated along dim 0 (``y_pred`` detached), and ``loss`` is the batch loss.

Ignite is imported when these functions are called, never when unidist is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from unidist.errors import AdapterUnavailableError, ConfigurationError
from unidist.microbatch import MicroBatcher, SizePolicy

if TYPE_CHECKING:
    import torch

__all__ = ["create_microbatch_trainer", "microbatch_training_step"]


def _prepare_batch(batch: Sequence[Any], device: Any = None, non_blocking: bool = False) -> Any:
    """Ignite's default: ``(x, y)`` moved to ``device``."""
    from ignite.utils import convert_tensor

    x, y = batch
    return (
        convert_tensor(x, device=device, non_blocking=non_blocking),
        convert_tensor(y, device=device, non_blocking=non_blocking),
    )


def _loss_only(x: Any, y: Any, y_pred: Any, loss: torch.Tensor) -> Any:
    return loss.item()


def _identity(output: Any) -> Any:
    return output


def _call(model: torch.nn.Module, x: Any) -> Any:
    return model(x)


def microbatch_training_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any, Any], torch.Tensor] | torch.nn.Module,
    device: str | torch.device | None = None,
    non_blocking: bool = False,
    prepare_batch: Callable[..., Any] = _prepare_batch,
    model_transform: Callable[[Any], Any] = _identity,
    output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] = _loss_only,
    gradient_accumulation_steps: int = 1,
    model_fn: Callable[[torch.nn.Module, Any], Any] = _call,
    *,
    amp_mode: str | None = None,
    scaler: Any = None,
    microbatcher: MicroBatcher | None = None,
    policy: SizePolicy | None = None,
) -> Callable[[Any, Any], Any]:
    """An Ignite update function that runs each batch in microbatches that fit in memory.

    The arguments before ``*`` are those of ``ignite.engine.supervised_training_step``.

    Args:
        amp_mode: ``"amp"`` runs the forward under ``torch.autocast`` for ``device``'s type.
        scaler: a ``torch.amp.GradScaler`` (or None): backward is scaled and the step goes
            through ``scaler.step`` / ``scaler.update``.
        microbatcher: a ready :class:`~unidist.MicroBatcher` for ``model`` (to share its state;
            build it with the same ``scaler``); by default one is made with ``policy``.
        policy: the size policy of the default microbatcher.

    Returns:
        ``update(engine, batch)``.
    """
    _require_ignite()
    if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
        raise ConfigurationError(
            f"gradient_accumulation_steps={gradient_accumulation_steps!r} must be an int >= 1."
        )
    if amp_mode not in (None, "amp"):
        raise ConfigurationError(
            f"amp_mode={amp_mode!r} is not supported with microbatching; use None or 'amp'. "
            "HINT: apex is deprecated upstream; torch.amp ('amp') does the same."
        )
    steps = gradient_accumulation_steps
    mb = microbatcher or MicroBatcher(model, policy=policy, zero_grad=steps == 1, scaler=scaler)
    if mb.scaler is not scaler:
        raise ConfigurationError(
            "the microbatcher was built with a different GradScaler than scaler=. HINT: pass "
            "the same scaler to MicroBatcher(scaler=...) and here."
        )
    if steps > 1 and microbatcher is not None and microbatcher.zero_grad:
        raise ConfigurationError(
            f"gradient_accumulation_steps={steps} needs a microbatcher with zero_grad=False "
            "(it must keep the gradients of earlier iterations). HINT: MicroBatcher(model, "
            "zero_grad=False)."
        )
    autocast = _autocast(amp_mode, device)

    def one_microbatch(part: Any) -> tuple[torch.Tensor, tuple[Any, Any, Any]]:
        x, y = prepare_batch(part, device=device, non_blocking=non_blocking)
        with autocast():
            y_pred = model_transform(model_fn(model, x))
            loss = loss_fn(y_pred, y)
        return loss / steps if steps > 1 else loss, (x, y, y_pred)

    def update(engine: Any, batch: Any) -> Any:
        if (engine.state.iteration - 1) % steps == 0:
            optimizer.zero_grad()
        model.train()
        loss = mb.step(batch, one_microbatch)
        if engine.state.iteration % steps == 0:
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        engine.state.microbatch_size = mb.size
        x = y = y_pred = None  # an empty batch has no microbatches
        if mb.outputs:
            x, y, y_pred = (_concat(list(parts)) for parts in zip(*mb.outputs, strict=True))
        return output_transform(x, y, y_pred, loss * steps)

    update.microbatcher = mb  # type: ignore[attr-defined]
    return update


def create_microbatch_trainer(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any, Any], torch.Tensor] | torch.nn.Module,
    device: str | torch.device | None = None,
    non_blocking: bool = False,
    prepare_batch: Callable[..., Any] = _prepare_batch,
    model_transform: Callable[[Any], Any] = _identity,
    output_transform: Callable[[Any, Any, Any, torch.Tensor], Any] = _loss_only,
    deterministic: bool = False,
    amp_mode: str | None = None,
    scaler: Any = False,
    gradient_accumulation_steps: int = 1,
    model_fn: Callable[[torch.nn.Module, Any], Any] = _call,
    *,
    microbatcher: MicroBatcher | None = None,
    policy: SizePolicy | None = None,
) -> Any:
    """``ignite.engine.create_supervised_trainer`` with automatic microbatching.

    Same arguments (``scaler=True`` makes a ``torch.amp.GradScaler``, stored as
    ``engine.state.scaler`` as Ignite does), plus ``microbatcher`` and ``policy`` as in
    :func:`microbatch_training_step`.

    Returns:
        An ``ignite.engine.Engine`` (``DeterministicEngine`` with ``deterministic=True``).
    """
    import torch
    from ignite.engine import DeterministicEngine, Engine
    from torch.amp.grad_scaler import GradScaler

    made_scaler = None
    if scaler is True:
        kind = torch.device(device).type if device is not None else "cuda"
        made_scaler = GradScaler(kind)
    the_scaler = made_scaler if made_scaler is not None else (scaler or None)
    update = microbatch_training_step(
        model,
        optimizer,
        loss_fn,
        device,
        non_blocking,
        prepare_batch,
        model_transform,
        output_transform,
        gradient_accumulation_steps,
        model_fn,
        amp_mode=amp_mode,
        scaler=the_scaler,
        microbatcher=microbatcher,
        policy=policy,
    )
    engine = DeterministicEngine(update) if deterministic else Engine(update)
    if made_scaler is not None:
        engine.state.scaler = made_scaler  # type: ignore[attr-defined]
    engine.state.microbatch_size = update.microbatcher.size  # type: ignore[attr-defined]
    return engine


def _require_ignite() -> None:
    try:
        import ignite.engine  # noqa: F401
    except ImportError as exc:
        raise AdapterUnavailableError(
            "unidist.integrations.ignite needs pytorch-ignite, which is not installed.",
            pip_hint="pip install 'pytorch-unidist[ignite]'",
        ) from exc


def _autocast(amp_mode: str | None, device: Any) -> Callable[[], Any]:
    if amp_mode != "amp":
        return contextlib.nullcontext
    import torch

    kind = torch.device(device).type if device is not None else "cuda"
    return lambda: torch.autocast(kind)


def _concat(parts: list[Any]) -> Any:
    """Join per-microbatch values along dim 0 (tensors), field by field (tuples, dicts)."""
    import torch

    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return torch.cat(parts)
    if isinstance(first, tuple | list) and all(len(p) == len(first) for p in parts):
        return type(first)(_concat([p[i] for p in parts]) for i in range(len(first)))
    if isinstance(first, dict):
        return {key: _concat([p[key] for p in parts]) for key in first}
    return parts
