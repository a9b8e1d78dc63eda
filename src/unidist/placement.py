"""``auto_model`` and ``auto_optim``: put a model and its optimizer where this rank trains.

Unlike Ignite's ``idist.auto_model``, a single process never gets ``DataParallel`` behind its
back (pytorch/ignite#2447): with one process the model is only moved to :func:`unidist.device`;
with several it is wrapped in ``DistributedDataParallel`` (or as a
:class:`~unidist.parallel.ParallelismConfig` says). ``via="ignite"`` hands the wrapping to
Ignite's own ``idist.auto_model``/``auto_optim`` instead (Horovod, XLA).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist.parallel.config import ParallelismConfig

__all__ = ["auto_model", "auto_optim"]

_VIAS = (None, "ignite")
OptimizerT = TypeVar("OptimizerT", bound="torch.optim.Optimizer")


def auto_model(
    model: torch.nn.Module,
    parallelism: ParallelismConfig | Mapping[str, Any] | None = None,
    *,
    device: torch.device | str | None = None,
    sync_batchnorm: bool = False,
    via: str | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this rank's device and wrap it for data parallelism. Call on every rank.

    Args:
        model: an unwrapped module.
        parallelism: a :class:`~unidist.parallel.ParallelismConfig` (or its dict form) for
            FSDP, FSDP2 or tensor parallelism; ``None`` means DDP with defaults.
        device: where to train (default :func:`unidist.device`, e.g. ``cuda:<local rank>``).
        sync_batchnorm: convert BatchNorm layers to ``SyncBatchNorm`` when several processes
            train (a single process keeps plain BatchNorm, which needs no process group).
        via: ``"ignite"`` delegates to ``ignite.distributed.auto_model`` when several processes
            train (in one process unidist only moves the model, skipping Ignite's
            ``DataParallel``).

    Returns:
        The model on its device: itself in one process; ``DistributedDataParallel``, FSDP or the
        sharded module itself with several.
    """
    if via not in _VIAS:
        raise ConfigurationError(
            f"auto_model(via={via!r}): expected None (unidist's own wrapping) or 'ignite'."
        )
    from unidist.parallel.config import ParallelismConfig
    from unidist.parallel.strategies import DDPConfig

    if isinstance(parallelism, Mapping):
        parallelism = ParallelismConfig.from_dict(parallelism)
    if via == "ignite":
        if parallelism is not None:
            raise ConfigurationError(
                "auto_model(via='ignite') takes no parallelism config: Ignite only wraps in DDP. "
                "HINT: drop via='ignite' to use FSDP or TP."
            )
        return _ignite().auto_model(model, sync_bn=sync_batchnorm, device=device)  # type: ignore[no-any-return]
    config = parallelism if parallelism is not None else ParallelismConfig()
    if not isinstance(config, ParallelismConfig):
        raise ConfigurationError(
            f"auto_model(parallelism=...) takes a unidist ParallelismConfig or a dict, got "
            f"{type(config).__name__}. HINT: Composer's config goes to its Trainer; build "
            "unidist's with ParallelismConfig.from_dict(...)."
        )
    if sync_batchnorm:
        if config.strategy == "ddp":
            config = replace(config, ddp=replace(config.ddp or DDPConfig(), sync_batchnorm=True))
        else:
            model = _sync_batchnorm(model, device)
    return config.apply(model, device=device)


def _sync_batchnorm(model: torch.nn.Module, device: torch.device | str | None) -> torch.nn.Module:
    import torch

    from unidist import devices
    from unidist.parallel._apply import refuse_cpu_sync_batchnorm
    from unidist.ranks import get_world_size

    if get_world_size() == 1:
        return model
    refuse_cpu_sync_batchnorm(
        devices.device(device or "auto") if isinstance(device, str | None) else device
    )
    converted: torch.nn.Module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(  # type: ignore[no-untyped-call]
        model
    )
    return converted


def auto_optim(optimizer: OptimizerT, *, via: str | None = None) -> OptimizerT:
    """Make ``optimizer`` ready for distributed training: nothing to do with native backends.

    DDP and FSDP average gradients during ``backward``, so with gloo, nccl, mpi and the others
    the optimizer is returned unchanged. XLA needs ``xm.optimizer_step``, which unidist does not
    do: with the ``xla`` backend this raises unless ``via="ignite"`` hands the optimizer to
    ``ignite.distributed.auto_optim`` (which also covers Horovod).

    Raises:
        ConfigurationError: an unknown ``via``, or the ``xla`` backend without ``via="ignite"``.
    """
    if via not in _VIAS:
        raise ConfigurationError(
            f"auto_optim(via={via!r}): expected None (unidist's own handling) or 'ignite'."
        )
    if via == "ignite":
        return _ignite().auto_optim(optimizer)  # type: ignore[no-any-return]
    from unidist.lifecycle import backend
    from unidist.ranks import get_world_size

    if backend() == "xla" and get_world_size() > 1:
        raise ConfigurationError(
            "auto_optim: with the xla backend the gradients are reduced by xm.optimizer_step, "
            "which a plain optimizer.step() skips (the replicas would drift apart). HINT: use "
            "auto_optim(optimizer, via='ignite'), or call torch_xla's xm.optimizer_step."
        )
    return optimizer


def _ignite() -> ModuleType:
    """:mod:`unidist.integrations.ignite`, loaded by name: neutral modules import no integration."""
    return importlib.import_module("unidist.integrations.ignite")
