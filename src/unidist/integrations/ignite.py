"""Ignite integration: model and optimizer wrapping, microbatching trainers and samplers for Ignite.

* :func:`auto_model` and :func:`auto_optim` hand model and optimizer wrapping to Ignite's own
  ``idist.auto_model``/``auto_optim`` inside the unidist session (``unidist.auto_model(...,
  via="ignite")``).
* :func:`microbatch_training_step` and :func:`create_microbatch_trainer`: automatic
  microbatching, a drop-in for ``create_supervised_trainer`` (below).
* :func:`native_sampler`: what Ignite's ``auto_dataloader`` injects, for
  ``unidist.get_sampler(native="ignite")``.
* :func:`attach_resumable`: an ``Engine`` that resumes where it stopped, exactly once, on any
  number of ranks, with :class:`unidist.ResumableState` (handlers: no change to the loop).

The adapter (:mod:`unidist.adapters.ignite`) only runs collectives through ``idist``; everything
here is built on unidist's neutral modules. Ignite is imported when these functions are called,
never when unidist is imported.

Microbatching: :func:`microbatch_training_step` builds an ``Engine`` update function with the
arguments of ``ignite.engine.supervised_training_step`` (plus AMP);
:func:`create_microbatch_trainer` builds the ``Engine`` with the arguments of
``create_supervised_trainer``. Each iteration's batch is split by a :class:`unidist.MicroBatcher`,
so an out-of-memory error on any rank makes every rank retry the batch with smaller microbatches;
``engine.state.microbatch_size`` holds the current size.

``prepare_batch`` runs per microbatch, so only one microbatch at a time is moved to the device.
``output_transform`` receives the whole batch: ``x``, ``y`` and ``y_pred`` are the microbatches'
values concatenated along dim 0 (``y_pred`` detached), and ``loss`` is the batch loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from unidist._sampling.native import SamplerRequest, torch_sampler
from unidist.errors import AdapterUnavailableError, ConfigurationError
from unidist.integrations import import_framework
from unidist.microbatch import MicroBatcher, SizePolicy
from unidist.parallel._apply import refuse_cpu_sync_batchnorm
from unidist.ranks import get_world_size
from unidist.session import devices, lifecycle

if TYPE_CHECKING:
    import torch

    from unidist.resume import ResumableState

__all__ = [
    "attach_resumable",
    "auto_model",
    "auto_optim",
    "create_microbatch_trainer",
    "microbatch_training_step",
    "native_sampler",
]

#: What neutral code may ask this integration for, through :mod:`unidist._base.frameworks`.
PROVIDES = frozenset({"auto_model", "auto_optim", "native_sampler"})

OptimizerT = TypeVar("OptimizerT", bound="torch.optim.Optimizer")


# -- model and optimizer -----------------------------------------------------------------------


def auto_model(
    model: torch.nn.Module,
    *,
    sync_bn: bool = False,
    device: torch.device | str | None = None,
    **kwargs: Any,
) -> torch.nn.Module:
    """``ignite.distributed.auto_model`` inside the unidist session (``unidist.auto_model(via=
    "ignite")``). Call it on every rank.

    With several processes Ignite wraps the model (DDP with native backends, a parameter
    broadcast with Horovod); the process group is adopted by Ignite first (collective). In a
    single process the model is only moved to :func:`unidist.device`: Ignite would wrap it in
    ``DataParallel`` on a multi-GPU host (pytorch/ignite#2447).

    Args:
        model: an unwrapped module.
        sync_bn: convert BatchNorm to SyncBatchNorm (native backends, several processes).
        device: must be None or Ignite's own ``idist.device()``: Ignite places the model there.
        **kwargs: passed to ``DistributedDataParallel`` by Ignite.
    """
    if get_world_size() == 1:
        return model.to(
            devices.device(device or "auto") if isinstance(device, str | None) else device
        )
    import ignite.distributed as idist
    import torch

    with lifecycle.use("ignite"):
        wanted = devices.device(device) if isinstance(device, str) else device
        if sync_bn:
            refuse_cpu_sync_batchnorm(idist.device())
        if wanted is not None and torch.device(wanted) != idist.device():
            raise ConfigurationError(
                f"auto_model(via='ignite', device={device!r}): Ignite places the model on "
                f"idist.device() = {idist.device()}. HINT: drop device=, or drop via='ignite'."
            )
        return idist.auto_model(model, sync_bn=sync_bn, **kwargs)


def auto_optim(optimizer: OptimizerT, **kwargs: Any) -> OptimizerT:
    """``ignite.distributed.auto_optim`` inside the unidist session (``via="ignite"``).

    Native backends get the optimizer back unchanged; XLA gets Ignite's subclass whose
    ``step()`` calls ``xm.optimizer_step``; Horovod gets ``hvd.DistributedOptimizer``.
    """
    import ignite.distributed as idist

    with lifecycle.use("ignite"):
        return cast("OptimizerT", idist.auto_optim(optimizer, **kwargs))


# -- microbatching -----------------------------------------------------------------------------


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


# -- samplers ----------------------------------------------------------------------------------


def attach_resumable(engine: Any, state: ResumableState) -> None:
    """Make ``engine`` resume where it stopped, exactly once, with ``state``.

    ``state`` saves the model, optimizer, stateful objects and the data position (its loader:
    the one ``engine.run`` iterates, built with :func:`unidist.auto_dataloader`), and stops the
    job when told to (SIGTERM, SIGUSR1), as in a plain loop. The handlers:

    * ``STARTED``: restore the latest checkpoint and set the engine's ``epoch`` and
      ``iteration`` from it, so Ignite runs the rest of the interrupted epoch (the loader yields
      exactly the batches not yet trained, on however many ranks the restart has) and then the
      epochs left of ``max_epochs``. A checkpoint of an epoch's last iteration (a stop there, or
      a ``save_every`` that divides the epoch) leaves no batch of its epoch: Ignite begins the
      next epoch;
    * ``EPOCH_STARTED``: the loader's ``set_epoch`` (Ignite never calls it);
    * ``ITERATION_COMPLETED``: :meth:`~unidist.ResumableState.step` (saves when due; on a stop,
      every rank saves that step and leaves by the signal);
    * ``EPOCH_COMPLETED``: :meth:`~unidist.ResumableState.end_epoch`;
    * ``COMPLETED`` and ``TERMINATE``: :meth:`~unidist.ResumableState.close` (no handler for
      ``EXCEPTION_RAISED``: Ignite would swallow the exception).

    ``engine.run(loader, max_epochs=N)`` is the same call on every start; ``epoch_length`` is
    the loader's full epoch (``len(loader)`` before the restore, as Ignite reads it).

    Raises:
        ConfigurationError: ``state`` has no loader, or ``engine`` is not an Ignite ``Engine``.
    """
    _require_ignite()
    from ignite.engine import Engine, Events

    if not isinstance(engine, Engine):
        raise ConfigurationError(
            f"attach_resumable(engine={type(engine).__name__}): expected an Ignite Engine "
            "(ignite.engine.Engine or a trainer made by create_supervised_trainer)."
        )
    if state.loader is None:
        raise ConfigurationError(
            "attach_resumable needs a ResumableState with loader=: the data position is what "
            "lets the engine resume mid-epoch. HINT: ResumableState(..., loader=train_loader), "
            "the loader engine.run iterates."
        )

    def started(engine: Any) -> None:
        state.restore()
        if state.steps:
            # Ignite's epoch counts the epochs done (it adds one as each begins); its iteration
            # counts every batch trained, from which it finds where in the epoch it is.
            engine.state.iteration = state.steps
            engine.state.epoch = state.epoch + _epoch_done(engine.state.dataloader, state.loader)

    def epoch_started(engine: Any) -> None:
        state.epoch = engine.state.epoch - 1
        state.begin_epoch()

    def closed(engine: Any, *args: Any) -> None:
        state.close()

    engine.add_event_handler(Events.STARTED, started)
    engine.add_event_handler(Events.EPOCH_STARTED, epoch_started)
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda _: state.step())
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda _: state.end_epoch())
    engine.add_event_handler(Events.COMPLETED, closed)
    engine.add_event_handler(Events.TERMINATE, closed)


def _epoch_done(data: Any, loader: Any) -> int:
    """1 when the restored data has no batch left of its epoch, else 0.

    A checkpoint of an epoch's last iteration is at the end of that epoch, not inside it: the
    engine must begin the next one. Told it is inside, Ignite would find the data empty before
    the epoch's length and iterate it again, which reads the same epoch from its start (the
    sampler's epoch changes only through ``set_epoch``). ``data`` is what ``engine.run``
    iterates; ``loader`` (the state's) answers when ``data`` has no ``len()``.
    """
    for candidate in (data, loader):
        with contextlib.suppress(TypeError):  # no len(): ask the next one
            return int(len(candidate) == 0)
    return 0


def native_sampler(request: SamplerRequest) -> torch.utils.data.DistributedSampler[Any]:
    """What Ignite's ``auto_dataloader`` injects (``unidist.get_sampler(native="ignite")``).

    torch's ``DistributedSampler`` for a dataset; ``DistributedProxySampler`` around ``sampler``.

    Raises:
        ConfigurationError: ``drop_last`` with ``sampler``: Ignite's proxy always pads.
        AdapterUnavailableError: Ignite is not installed (only needed with ``sampler``).
    """
    if request.sampler is None:  # Ignite's auto_dataloader injects torch's sampler for datasets
        return torch_sampler(request)
    if request.drop_last:
        raise ConfigurationError(
            "Ignite's DistributedProxySampler always pads; it has no drop_last. "
            "HINT: use native=False (unidist's DistributedSamplerWrapper) to drop the tail."
        )
    auto = import_framework("ignite.distributed.auto", "ignite", "native='ignite'")
    return auto.DistributedProxySampler(  # type: ignore[no-any-return]
        request.sampler, num_replicas=request.world, rank=request.rank
    )
