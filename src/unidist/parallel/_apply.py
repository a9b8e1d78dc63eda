"""Wrap a model for a plain training loop: DDP, FSDP v1, FSDP2 over a DeviceMesh, and TP.

Order follows torch's composable recipe (and Composer's Trainer): tensor parallelism first
(``parallelize_module`` over the mesh's ``tensor_parallel`` dimension), then data parallelism
over the rest of the mesh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unidist._base.loaded import loaded_classes
from unidist._base.workarounds import GLOO_NO_AVG_ALL_REDUCE
from unidist.errors import ConfigurationError
from unidist.parallel._checks import wrap_classes
from unidist.parallel._gloo import correct_gloo_averaging
from unidist.parallel.strategies import MESH_DIM_NAMES, DDPConfig

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from unidist.parallel.strategies import Degrees, FSDP2Config, FSDPConfig, Settings, TPConfig

__all__ = ["apply", "refuse_cpu_sync_batchnorm", "tp_plan"]

_REPLICATE, _SHARD, _TENSOR = MESH_DIM_NAMES


def apply(
    config: Settings,
    model: torch.nn.Module,
    *,
    device: torch.device | str | None = None,
) -> torch.nn.Module:
    """Move ``model`` to the device and wrap it as ``config`` says. Call it on every rank.

    Args:
        config: the parallelism settings; validated against the world size and the model.
        model: an unwrapped module (same initial weights on every rank, or FSDP v1's
            ``sync_module_states``; DDP and TP broadcast rank 0's weights themselves).
        device: where to train (default :func:`unidist.device`).

    Returns:
        ``DistributedDataParallel``, ``FullyShardedDataParallel``, or ``model`` itself sharded in
        place (FSDP2's ``fully_shard``, TP's ``parallelize_module``). In a single process the
        model is only moved to the device: a world of one has nothing to shard or average.

    Raises:
        ConfigurationError: degrees that do not fit the world size or the model, a model that
            is already wrapped, or a combination torch cannot run on this backend.
        NotInitializedError: several processes but no process group.
    """
    return wrap(config, model, device=device)


def wrap(
    config: Settings,
    model: torch.nn.Module,
    *,
    device: torch.device | str | None = None,
    ddp_options: Mapping[str, Any] | None = None,
) -> torch.nn.Module:
    """:func:`apply`, with keywords for ``DistributedDataParallel`` (``unidist.auto_model``'s).

    ``ddp_options`` override the ``DDPConfig``'s settings of the same name; the caller has
    checked them against DDP's signature.
    """
    from unidist.ranks import get_world_size
    from unidist.session import devices

    _refuse_wrapped(model)
    world = get_world_size()
    degrees = config.validate(world, model)
    where = devices.device(device or "auto") if isinstance(device, str | None) else device
    model.to(where)
    if world == 1:
        return model
    _require_torch_group()
    if config.strategy == "ddp":
        return _ddp(config.ddp or DDPConfig(), model, where, ddp_options or {})
    mesh = _mesh(config, degrees, where)
    if config.tp is not None:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, mesh[_TENSOR], tp_plan(config.tp))
    if config.fsdp is not None:
        return _fsdp(config.fsdp, model, where, mesh, degrees)
    if config.fsdp2 is not None:
        _fsdp2(config.fsdp2, model, where, mesh, degrees)
    return model


def _refuse_wrapped(model: Any) -> None:
    import torch

    wrappers = (
        torch.nn.parallel.DistributedDataParallel,
        torch.nn.DataParallel,
        # FSDP's classes only if it is imported: no model can be sharded by it otherwise.
        *loaded_classes("torch.distributed.fsdp", "FullyShardedDataParallel", "FSDPModule"),
    )
    if not isinstance(model, torch.nn.Module):
        raise ConfigurationError(f"expected a torch.nn.Module, got {type(model).__name__}.")
    if isinstance(model, wrappers):
        raise ConfigurationError(
            f"the model is already wrapped ({type(model).__name__}); wrapping it again would "
            "average or shard twice. HINT: pass the unwrapped module (``model.module`` for "
            "DDP/DataParallel)."
        )


def _require_torch_group() -> None:
    from unidist.session import lifecycle

    what = "wrapping the model for data parallelism"
    lifecycle.session_for(what).comm.require_torch(what)


def _mesh(config: Settings, degrees: Degrees, where: torch.device) -> DeviceMesh:
    from torch.distributed.device_mesh import init_device_mesh

    dims: list[tuple[str, int]] = []
    if config.fsdp is not None or config.fsdp2 is not None:
        if degrees.replicate > 1:
            dims.append((_REPLICATE, degrees.replicate))
        dims.append((_SHARD, degrees.shard))
    if config.tp is not None:
        dims.append((_TENSOR, degrees.tensor))
    return init_device_mesh(
        where.type,
        tuple(size for _, size in dims),
        mesh_dim_names=tuple(name for name, _ in dims),
    )


def _data_mesh(mesh: DeviceMesh, degrees: Degrees) -> DeviceMesh:
    return mesh[(_REPLICATE, _SHARD)] if degrees.replicate > 1 else mesh[_SHARD]


def _ddp(
    config: DDPConfig, model: torch.nn.Module, where: torch.device, extra: Mapping[str, Any]
) -> torch.nn.Module:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    if config.sync_batchnorm:
        refuse_cpu_sync_batchnorm(where)
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
    options: dict[str, Any] = {
        "find_unused_parameters": config.find_unused_parameters,
        "gradient_as_bucket_view": config.gradient_as_bucket_view,
        "static_graph": config.static_graph,
    }
    # Passed only when it is not DDP's default: torch 2.13 deprecated the keyword (for
    # forward_sync_buffers) and warns whenever it is given, True included; left out, every torch
    # broadcasts the buffers at init and each forward, as True asked. False keeps torch's own
    # meaning (and, from torch 2.13, its FutureWarning): no broadcast at init either.
    if not config.broadcast_buffers:
        options["broadcast_buffers"] = False
    if config.bucket_cap_mb is not None:
        options["bucket_cap_mb"] = config.bucket_cap_mb
    options.update(extra)
    # DDP's device_ids is for single-device CUDA modules; CPU (and others) must pass None.
    device_ids = [where.index] if where.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **options)


def refuse_cpu_sync_batchnorm(where: torch.device) -> None:
    """Raise before DDP does: torch's DDP rejects SyncBatchNorm in CPU modules."""
    if where.type == "cpu":
        raise ConfigurationError(
            "sync_batchnorm=True on the CPU: torch's DDP refuses SyncBatchNorm in CPU modules "
            "('SyncBatchNorm layers only work with GPU modules'). HINT: drop sync_batchnorm on "
            "CPU (each rank then normalises with its own batch statistics), or train on GPUs."
        )


def tp_plan(config: TPConfig) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel, "sequence": SequenceParallel}
    return {
        name: styles[style.lower()]() if isinstance(style, str) else style
        for name, style in config.plan.items()
    }


def _dtypes(setting: Any) -> dict[str, torch.dtype]:
    import torch

    from unidist.parallel._fields import mixed_precision_dtypes

    names = mixed_precision_dtypes(setting, "mixed_precision")
    return {role: getattr(torch, name) for role, name in names.items()}


def _fsdp(
    config: FSDPConfig,
    model: torch.nn.Module,
    where: torch.device,
    mesh: DeviceMesh,
    degrees: Degrees,
) -> torch.nn.Module:
    from torch.distributed.fsdp import (
        BackwardPrefetch,
        FullyShardedDataParallel,
        MixedPrecision,
        ShardingStrategy,
    )
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    classes = wrap_classes(config.wrap, model)
    dtypes = _dtypes(config.mixed_precision)
    prefetch = config.backward_prefetch
    return FullyShardedDataParallel(
        model,
        device_mesh=_data_mesh(mesh, degrees),
        sharding_strategy=ShardingStrategy[config.sharding_strategy],
        mixed_precision=MixedPrecision(
            param_dtype=dtypes.get("param_dtype"),
            reduce_dtype=dtypes.get("reduce_dtype"),
            buffer_dtype=dtypes.get("buffer_dtype"),
        )
        if dtypes
        else None,
        auto_wrap_policy=ModuleWrapPolicy(set(classes)) if classes else None,
        backward_prefetch=None if prefetch == "NONE" else BackwardPrefetch[prefetch],
        forward_prefetch=config.forward_prefetch,
        limit_all_gathers=config.limit_all_gathers,
        sync_module_states=config.sync_module_states,
        use_orig_params=config.use_orig_params,
        # Without device_id FSDP v1 looks for an accelerator and refuses to run on the CPU.
        device_id=where,
    )


def _fsdp2(
    config: FSDP2Config,
    model: torch.nn.Module,
    where: torch.device,
    mesh: DeviceMesh,
    degrees: Degrees,
) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if degrees.replicate > 1 and where.type == "cpu" and GLOO_NO_AVG_ALL_REDUCE.present():
        import torch
        import torch.distributed as dist

        if "gloo" in str(dist.get_backend()):
            raise ConfigurationError(
                f"FSDP2 with replicate_degree={degrees.replicate} (HSDP) cannot run over gloo "
                f"with torch {torch.__version__}: fully_shard averages the replicas with "
                "ReduceOp.AVG, which gloo implements from torch 2.8 on. HINT: use nccl on GPUs, "
                "replicate_degree=1 on the CPU, or torch >= 2.8."
            )
    classes = wrap_classes(config.wrap, model)
    dtypes = _dtypes(config.mixed_precision)
    options: dict[str, Any] = {
        "mesh": _data_mesh(mesh, degrees),
        "reshard_after_forward": config.reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=dtypes.get("param_dtype"), reduce_dtype=dtypes.get("reduce_dtype")
        ),
    }
    # Children before parents: reversed pre-order puts every module after its descendants.
    for module in reversed(list(model.modules())):
        if module is not model and classes and isinstance(module, classes):
            fully_shard(module, **options)
    fully_shard(model, **options)
    correct_gloo_averaging(model)  # gloo of torch < 2.9 sums FSDP2's averages (see _gloo.py)
