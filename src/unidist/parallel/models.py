"""Ready a model and its optimizer for this rank: ``auto_model``, ``auto_optim``, ``unwrap_model``.

Unlike Ignite's ``idist.auto_model``, a single process never gets ``DataParallel`` behind its
back (pytorch/ignite#2447): with one process the model is only moved to :func:`unidist.device`;
with several it is wrapped in ``DistributedDataParallel`` (or as a
:class:`~unidist.parallel.ParallelismConfig` says). ``via="ignite"`` hands the wrapping to
Ignite's own ``idist.auto_model``/``auto_optim`` instead (Horovod, XLA). ``unwrap_model`` undoes
the wrapping, for the ``model.module`` of scripts written for several processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from unidist._base import frameworks as _frameworks
from unidist._base.loaded import loaded_classes
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist.parallel.config import ParallelismConfig

__all__ = ["auto_model", "auto_optim", "unwrap_model"]

_VIAS = (None, "ignite")
OptimizerT = TypeVar("OptimizerT", bound="torch.optim.Optimizer")


def auto_model(
    model: torch.nn.Module,
    parallelism: ParallelismConfig | Mapping[str, Any] | None = None,
    *,
    device: torch.device | str | None = None,
    sync_batchnorm: bool = False,
    via: str | None = None,
    **ddp_kwargs: Any,
) -> torch.nn.Module:
    """Move ``model`` to this rank's device and wrap it for data parallelism. Call on every rank.

    As with Ignite's ``idist.auto_model(model, **kwargs)``, other keywords go to
    ``DistributedDataParallel`` (``find_unused_parameters=True``, ``broadcast_buffers=False``,
    ...) when several processes train; a keyword DDP does not take is refused at once, in one
    process too. Ignite's ``sync_bn=`` is ``sync_batchnorm=`` here.

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
        **ddp_kwargs: keywords of ``DistributedDataParallel`` (not ``module`` or
            ``device_ids``, which unidist sets from ``device``); they override the
            ``DDPConfig``'s settings of the same name.

    Returns:
        The model on its device: itself in one process; ``DistributedDataParallel``, FSDP or the
        sharded module itself with several.

    Raises:
        ConfigurationError: an unknown ``via``, a keyword ``DistributedDataParallel`` does not
            take, DDP keywords with an FSDP or TP config, or a config of another type (a bool
            second, Ignite's positional ``sync_bn``, is refused with a pointer to
            ``sync_batchnorm=``).
    """
    _check_ddp_keywords(ddp_kwargs)
    if isinstance(parallelism, bool):
        raise ConfigurationError(
            f"auto_model(model, {parallelism!r}): the second argument is a parallelism config, "
            "where Ignite's auto_model takes sync_bn. HINT: pass "
            f"sync_batchnorm={parallelism!r} by keyword."
        )
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
        return _frameworks.integration("ignite", "auto_model")(  # type: ignore[no-any-return]
            model, sync_bn=sync_batchnorm, device=device, **ddp_kwargs
        )
    config = parallelism if parallelism is not None else ParallelismConfig()
    if not isinstance(config, ParallelismConfig):
        raise ConfigurationError(
            f"auto_model(parallelism=...) takes a unidist ParallelismConfig or a dict, got "
            f"{type(config).__name__}. HINT: Composer's config goes to its Trainer; build "
            "unidist's with ParallelismConfig.from_dict(...)."
        )
    if ddp_kwargs and config.strategy != "ddp":
        raise ConfigurationError(
            f"auto_model got DistributedDataParallel keywords ({', '.join(sorted(ddp_kwargs))}) "
            f"but the parallelism config asks for {config.strategy!r}, which does not use DDP. "
            "HINT: put the settings in that strategy's config, or drop them."
        )
    if sync_batchnorm:
        if config.strategy == "ddp":
            config = replace(config, ddp=replace(config.ddp or DDPConfig(), sync_batchnorm=True))
        else:
            model = _sync_batchnorm(model, device)
    from unidist.parallel import _apply

    return _apply.wrap(config, model, device=device, ddp_options=ddp_kwargs)


#: Keywords of ``auto_model``'s owners with another spelling here: name -> (owner, ours).
_RENAMED = {"sync_bn": ("Ignite's idist.auto_model", "sync_batchnorm")}


def _check_ddp_keywords(ddp_kwargs: Mapping[str, Any]) -> None:
    """Refuse keywords ``DistributedDataParallel`` does not take, naming those it does."""
    for name, (owner, ours) in _RENAMED.items():
        if name in ddp_kwargs:
            raise ConfigurationError(
                f"auto_model({name}={ddp_kwargs[name]!r}) is {owner}'s spelling. "
                f"HINT: use {ours}={ddp_kwargs[name]!r}."
            )
    if "device_ids" in ddp_kwargs:
        raise ConfigurationError(
            f"auto_model(device_ids={ddp_kwargs['device_ids']!r}): unidist sets DDP's "
            "device_ids from the device it trains on (as Ignite's auto_model refuses it too). "
            "HINT: drop device_ids, and pass device='cuda:N' if the default device is wrong."
        )
    if not ddp_kwargs:
        return
    accepted = ddp_keywords()
    unknown = sorted(set(ddp_kwargs) - accepted)
    if unknown:
        from unidist._base.checks import did_you_mean

        hints = "".join(did_you_mean(name, accepted) for name in unknown)
        raise ConfigurationError(
            f"auto_model got {', '.join(f'{n}={ddp_kwargs[n]!r}' for n in unknown)}, which "
            f"torch's DistributedDataParallel does not take{hints}. It takes: "
            f"{', '.join(sorted(accepted))}; auto_model itself takes parallelism, device, "
            "sync_batchnorm and via. HINT: fix the keyword's name, or drop it."
        )


def ddp_keywords() -> set[str]:
    """The keywords of this torch's ``DistributedDataParallel`` that ``auto_model`` passes on."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    return set(parameters) - {"self", "module", "device_ids"}


def _sync_batchnorm(model: torch.nn.Module, device: torch.device | str | None) -> torch.nn.Module:
    import torch

    from unidist.parallel._apply import refuse_cpu_sync_batchnorm
    from unidist.ranks import get_world_size
    from unidist.session import devices

    if get_world_size() == 1:
        return model
    refuse_cpu_sync_batchnorm(
        devices.device(device or "auto") if isinstance(device, str | None) else device
    )
    converted: torch.nn.Module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(  # type: ignore[no-untyped-call]
        model
    )
    return converted


def auto_optim(optimizer: OptimizerT, *, via: str | None = None, **kwargs: Any) -> OptimizerT:
    """Make ``optimizer`` ready for distributed training: nothing to do with native backends.

    DDP and FSDP average gradients during ``backward``, so with gloo, nccl, mpi and the others
    the optimizer is returned unchanged. XLA needs ``xm.optimizer_step``, which unidist does not
    do: with the ``xla`` backend this raises unless ``via="ignite"`` hands the optimizer to
    ``ignite.distributed.auto_optim`` (which also covers Horovod).

    Args:
        optimizer: the optimizer.
        via: ``"ignite"`` hands it to ``ignite.distributed.auto_optim``.
        **kwargs: with ``via="ignite"``, passed on as Ignite does (to Horovod's
            ``DistributedOptimizer``); refused otherwise, since native backends need none.

    Raises:
        ConfigurationError: an unknown ``via``, keywords without ``via="ignite"``, or the
            ``xla`` backend without ``via="ignite"``.
    """
    if via not in _VIAS:
        raise ConfigurationError(
            f"auto_optim(via={via!r}): expected None (unidist's own handling) or 'ignite'."
        )
    if via == "ignite":
        return _frameworks.integration("ignite", "auto_optim")(  # type: ignore[no-any-return]
            optimizer, **kwargs
        )
    if kwargs:
        raise ConfigurationError(
            f"auto_optim got {', '.join(f'{k}={v!r}' for k, v in kwargs.items())}: Ignite "
            "passes such keywords to Horovod's DistributedOptimizer, and unidist's own "
            "handling (native backends) takes none. HINT: pass via='ignite' to hand them to "
            "Ignite, or drop them."
        )
    from unidist.ranks import get_world_size
    from unidist.session.lifecycle import backend

    if backend() == "xla" and get_world_size() > 1:
        raise ConfigurationError(
            "auto_optim: with the xla backend the gradients are reduced by xm.optimizer_step, "
            "which a plain optimizer.step() skips (the replicas would drift apart). HINT: use "
            "auto_optim(optimizer, via='ignite'), or call torch_xla's xm.optimizer_step."
        )
    return optimizer


#: The wrappers ``unwrap_model`` sees through: (module, class, attribute holding the wrapped one).
#: Ignite's ``auto_model`` and Composer's Trainer wrap in torch's own DDP (or DataParallel), so
#: torch's classes cover them; FSDP2's ``fully_shard`` and tensor parallelism change the module in
#: place and leave nothing to unwrap.
_WRAPPERS = (
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "module"),
    ("torch.nn.parallel.data_parallel", "DataParallel", "module"),
    ("torch.distributed.fsdp.fully_sharded_data_parallel", "FullyShardedDataParallel", "module"),
    ("torch._dynamo.eval_frame", "OptimizedModule", "_orig_mod"),
)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module you wrote, from what ``auto_model``, DDP, FSDP or ``torch.compile`` made of it.

    The same call works in one process (where ``auto_model`` does not wrap, and a script's
    ``model.module`` would raise ``AttributeError``) and in several: it peels
    ``DistributedDataParallel``, ``DataParallel`` and FSDP v1's ``FullyShardedDataParallel``
    (their ``.module``) and ``torch.compile``'s ``OptimizedModule`` (its ``_orig_mod``), in any
    nesting, and returns anything else unchanged: a plain module, one sharded in place by FSDP2's
    ``fully_shard`` or tensor parallelism, a ``ComposerModel`` (whose own ``.module`` is part of
    your model, so it is not peeled). Nothing is copied or moved: the result shares its
    parameters with the wrapper. Use it for attributes, saving and loading; train through the
    wrapper, since calling the unwrapped module skips DDP's gradient averaging.

    With FSDP v1 the unwrapped module holds only this rank's flattened shard of the parameters;
    take a full ``state_dict`` from the wrapper (``torch.distributed.checkpoint``) instead.

    Args:
        model: a module, wrapped or not.

    Returns:
        The innermost module: ``model`` itself when it is no wrapper.
    """
    while True:
        inner = _wrapped(model)
        if inner is None:
            return model
        model = inner


def _wrapped(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module ``model`` wraps, or None when it is not one of ``_WRAPPERS``."""
    for module_name, class_name, attribute in _WRAPPERS:
        # Unwrapping imports nothing (torch.distributed and torch._dynamo cost seconds to
        # import, and are missing from some builds): see unidist._base.loaded.
        if isinstance(model, loaded_classes(module_name, class_name)):
            inner: torch.nn.Module = getattr(model, attribute)
            return inner
    return None
