"""The MosaicML Composer adapter: delegates to ``composer.utils.dist``.

Beyond the adapter contract, :func:`to_composer_device` and :func:`to_composer_parallelism` turn
unidist's device and :class:`~unidist.parallel.ParallelismConfig` into Composer's ``Device`` and
``ParallelismConfig`` for a ``Trainer`` (also as ``ParallelismConfig.to_composer()``).

Quirks of Composer 0.32 that this adapter normalises, so it answers exactly like the others:

* ``get_node_rank`` raises ``MissingEnvironmentError`` under torchrun, which sets ``GROUP_RANK``
  but not ``NODE_RANK``. Before ``initialize_dist`` the adapter exports the torch variables
  that unidist has worked out and the launcher did not set (``NODE_RANK`` here, all of them under
  SLURM or MPI), and removes exactly those again at ``finalize``.
* ``all_gather`` sizes its output by the *global* world size even for a subgroup; for subgroups
  the adapter gathers with ``torch.distributed`` directly. Composer has no ``new_group``, so
  groups come from ``torch.distributed.new_group``.
* ``initialize_dist`` writes single-rank defaults into the environment; they are removed again at
  ``finalize``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from unidist import _env
from unidist.adapters._rendezvous import rank_zero_store_closes_first
from unidist.adapters.torch import gather
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist._env import EnvReading, Topology
    from unidist.adapters.base import PrimitiveOp
    from unidist.parallel.config import ParallelismConfig

__all__ = ["ComposerAdapter", "to_composer_device", "to_composer_parallelism"]

#: Composer picks the process-group backend from a device name.
_DEVICE_FOR_BACKEND = {"gloo": "cpu", "nccl": "gpu", "hccl": "hpu", "xla": "tpu"}
_WRITTEN_BY_COMPOSER = ("NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK")


class ComposerAdapter:
    """Delegates to ``composer.utils.dist``."""

    name = "composer"

    def __init__(self) -> None:
        self._owns = False
        self._saved_env: dict[str, str | None] = {}
        self._env: EnvReading | None = None

    def detect(self, env: EnvReading) -> str | None:
        if env.launcher == "composer":
            return "started by Composer's launcher (composer -n)"
        return None

    def initialize(self, backend: str | None, *, timeout: timedelta, env: EnvReading) -> bool:
        import torch.distributed as tdist
        from composer.utils import dist

        if tdist.is_initialized():
            return False
        device = _DEVICE_FOR_BACKEND.get(backend or "")
        if device is None:
            choices = ", ".join(f"{b} (device {d!r})" for b, d in _DEVICE_FOR_BACKEND.items())
            raise ConfigurationError(
                f"the composer adapter cannot start backend {backend!r}: Composer derives the "
                f"backend from its device: {choices}. HINT: pick one of those backends, or use "
                "adapter='torch'."
            )
        self._env = env
        exports = _exports(env)
        self._saved_env = _env.snapshot((*_WRITTEN_BY_COMPOSER, *exports))
        _env.set_variables(exports)
        try:
            dist.initialize_dist(device, timeout=timeout.total_seconds())
        except BaseException:
            _env.restore(self._saved_env)
            raise
        self._owns = True
        return True

    def finalize(self) -> None:
        import torch.distributed as tdist

        if self._owns and tdist.is_initialized() and self._env is not None:
            from composer.utils import dist

            with rank_zero_store_closes_first(self._env, dist.barrier):
                tdist.destroy_process_group()
        if self._owns:
            _env.restore(self._saved_env)
        self._owns = False
        self._saved_env = {}

    def topology(self, env: Topology) -> Topology:
        from composer.utils import dist

        try:
            node_rank = dist.get_node_rank()
        except dist.MissingEnvironmentError:
            node_rank = env.node_rank  # torchrun: GROUP_RANK only (see module docstring)
        try:
            local_rank, local_world_size = dist.get_local_rank(), dist.get_local_world_size()
        except dist.MissingEnvironmentError:
            local_rank, local_world_size = env.local_rank, env.local_world_size
        return replace(
            env,
            rank=dist.get_global_rank(),
            world_size=dist.get_world_size(),
            local_rank=local_rank,
            local_world_size=local_world_size,
            node_rank=node_rank,
        )

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, group: Any) -> torch.Tensor:
        from composer.utils import dist

        dist.all_reduce(tensor, reduce_operation=op.upper(), group=group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        from composer.utils import dist

        if group is None:
            return list(dist.all_gather(tensor))
        # Composer sizes the output by the global world size, which is wrong for a subgroup.
        return gather(tensor, group)

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        from composer.utils import dist

        dist.broadcast(tensor, src=src, group=group)
        return tensor

    def barrier(self, group: Any) -> None:
        from composer.utils import dist

        dist.barrier(group=group)

    def new_group(self, ranks: Sequence[int]) -> Any:
        import torch.distributed as tdist

        return tdist.new_group(ranks=list(ranks))


def _exports(env: EnvReading) -> dict[str, str]:
    """The torch variables Composer reads that the launcher did not set."""
    known = {
        "RANK": env.rank,
        "WORLD_SIZE": env.world_size,
        "LOCAL_RANK": env.local_rank,
        "LOCAL_WORLD_SIZE": env.local_world_size,
        "NODE_RANK": env.node_rank,
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": env.master_port,
    }
    if env.world_size == 1:
        known = {"MASTER_ADDR": env.master_addr, "MASTER_PORT": env.master_port}
    return {
        name: str(value)
        for name, value in known.items()
        if value is not None and not _env.is_set(name)
    }


# --- Beyond the adapter contract: unidist devices and parallelism as Composer objects ---------


def to_composer_device(device: torch.device | str | None = None, *, allow_tf32: bool = True) -> Any:
    """Composer's ``Device`` for a unidist device (``Trainer(device=...)``).

    Args:
        device: a ``torch.device`` or a kind :func:`unidist.device` accepts (``"gpu"``,
            ``"neuron"``, ...); ``None`` means ``unidist.device()``. The runtime is checked
            first, so a missing driver is reported by unidist, not deep inside Composer.
        allow_tf32: passed to ``DeviceGPU`` (Composer sets the TF32 flags globally).

    Returns:
        ``DeviceCPU``, ``DeviceGPU(device_id=<index>)``, ``DeviceMPS``, ``DeviceTPU``,
        ``DeviceNeuron`` (which, in Composer, exports ``PJRT_DEVICE=NEURON``) or ``DeviceHPU``.

    Raises:
        DeviceUnavailableError: the device's runtime is missing.
        ConfigurationError: a device Composer has no class for (``xpu``).
    """
    from unidist import devices

    neuron = isinstance(device, str) and device.strip().lower() == "neuron"
    where = devices.device(device or "auto") if isinstance(device, str | None) else device
    from composer import devices as composer_devices

    kind = "neuron" if neuron else where.type
    if kind == "cuda":
        return composer_devices.DeviceGPU(device_id=where.index, allow_tf32=allow_tf32)
    classes: dict[str, Any] = {
        "cpu": composer_devices.DeviceCPU,
        "mps": composer_devices.DeviceMPS,
        "xla": composer_devices.DeviceTPU,
        "neuron": composer_devices.DeviceNeuron,
        "hpu": composer_devices.DeviceHPU,
    }
    if kind not in classes:
        raise ConfigurationError(
            f"Composer has no Device class for {where.type!r} devices; it knows "
            f"{', '.join(['cuda', *classes])}. HINT: use the torch adapter and a plain loop."
        )
    return classes[kind]()


class _WrapBy:
    """``fsdp_wrap_fn`` for Composer: wrap modules of the given classes (picklable)."""

    def __init__(self, classes: tuple[type, ...]) -> None:
        self.classes = classes

    def __call__(self, module: torch.nn.Module) -> bool:
        return isinstance(module, self.classes)


def to_composer_parallelism(config: ParallelismConfig, model: torch.nn.Module | None = None) -> Any:
    """Composer's ``ParallelismConfig`` for a unidist one (``Trainer(parallelism_config=...)``).

    The degrees are validated against unidist's world size (and ``model``) first, and the
    values go over as given (a -1 stays -1: Composer fills it in the same way). ``wrap`` is
    carried by setting Composer's ``fsdp_wrap_fn`` on ``model`` (and, for a ``ComposerModel``,
    on its direct children, where Composer looks for it). With FSDP2 a one-shot forward
    pre-hook on ``model`` corrects torch 2.7's gloo averaging once the Trainer has sharded it
    (see :mod:`unidist.parallel._gloo`). Composer's FSDP v1 needs CUDA (it passes
    ``torch.cuda.current_device()``); unidist's ``apply()`` runs FSDP v1 on the CPU too.

    Returns:
        ``composer.utils.ParallelismConfig``, or None for DDP (Composer's Trainer wraps in DDP by
        itself whenever several processes train).

    Raises:
        ConfigurationError: a setting Composer 0.32's Trainer cannot carry: DDP options (it only
            derives ``find_unused_parameters`` from algorithms), TP without FSDP, FSDP2 with
            replicate_degree > 1 (its Trainer builds a 1-D FSDP2 mesh), or ``wrap`` without the
            model.
    """
    from composer.utils import FSDP2Config, FSDPConfig, TPConfig
    from composer.utils import ParallelismConfig as ComposerParallelism

    from unidist.parallel.config import DDPConfig

    config.validate(model=model)
    if config.strategy == "ddp":
        ddp = config.ddp or DDPConfig()
        changed = [f"{k}={v!r}" for k, v in vars(ddp).items() if v != getattr(DDPConfig(), k)]
        if changed:
            raise ConfigurationError(
                f"Composer's Trainer wraps DDP itself and takes none of {', '.join(changed)}. "
                "HINT: drop them, convert BatchNorm with torch.nn.SyncBatchNorm."
                "convert_sync_batchnorm(model) yourself, or train in a plain loop with apply()."
            )
        return None
    if config.strategy == "tp":
        raise ConfigurationError(
            "Composer's Trainer runs tensor parallelism only together with FSDP. HINT: add "
            "fsdp2=FSDP2Config() (or fsdp=FSDPConfig()) to the config."
        )
    data = config.fsdp or config.fsdp2
    assert data is not None
    if data.wrap:
        _set_wrap_fn(data.wrap, model)
    precision = _composer_precision(data.mixed_precision)
    fsdp: Any = None
    fsdp2: Any = None
    if config.fsdp is not None:
        fsdp = cast("Any", FSDPConfig)(  # its __init__(**kwargs) is untyped
            data_parallel_shard_degree=data.shard_degree,
            data_parallel_replicate_degree=(
                None if data.replicate_degree == 1 else data.replicate_degree
            ),
            sharding_strategy=config.fsdp.sharding_strategy,
            mixed_precision=precision,
            backward_prefetch=config.fsdp.backward_prefetch,
            forward_prefetch=config.fsdp.forward_prefetch,
            limit_all_gathers=config.fsdp.limit_all_gathers,
            sync_module_states=config.fsdp.sync_module_states,
            use_orig_params=config.fsdp.use_orig_params,
            state_dict_type=config.fsdp.state_dict_type,
        )
    else:
        assert config.fsdp2 is not None
        if config.fsdp2.replicate_degree != 1:
            raise ConfigurationError(
                f"fsdp2.replicate_degree={config.fsdp2.replicate_degree}: Composer 0.32's "
                "Trainer builds a 1-D mesh for FSDP2 (no HSDP). HINT: use fsdp=FSDPConfig("
                "sharding_strategy='HYBRID_SHARD', replicate_degree=...) with Composer, or "
                "FSDP2 HSDP in a plain loop with apply()."
            )
        fsdp2 = FSDP2Config(
            reshard_after_forward=config.fsdp2.reshard_after_forward,
            mixed_precision=precision,
            state_dict_type=config.fsdp2.state_dict_type,
        )
        _correct_gloo_averaging_later(model)
    tp = None
    if config.tp is not None:
        from unidist.parallel._apply import tp_plan

        tp = TPConfig(tensor_parallel_degree=config.tp.degree, layer_plan=tp_plan(config.tp))
    return ComposerParallelism(fsdp=fsdp, fsdp2=fsdp2, tp=tp)


def _correct_gloo_averaging_later(model: torch.nn.Module | None) -> None:
    """Composer's FSDP2 over gloo inherits torch 2.7's summed averages (pytorch#162338)."""
    from unidist.parallel._gloo import GlooAverageFix

    if model is not None:
        GlooAverageFix(model)  # corrects once the Trainer has sharded the model
        return
    from unidist import devices
    from unidist.ranks import get_world_size

    if get_world_size() > 1 and devices.device_kind() != "cuda":
        raise ConfigurationError(
            "FSDP2 over gloo (no CUDA device here) gets gradients summed instead of averaged in "
            "torch 2.7 (pytorch#162338); unidist corrects that through the model, which "
            "to_composer() was not given. HINT: config.to_composer(model)."
        )


def _composer_precision(setting: Any) -> Any:
    from unidist.parallel._checks import mixed_precision_dtypes

    dtypes = mixed_precision_dtypes(setting, "mixed_precision")
    return dict(dtypes) if dtypes else "FULL"


def _set_wrap_fn(wrap: tuple[str | type, ...], model: torch.nn.Module | None) -> None:
    if model is None:
        raise ConfigurationError(
            f"wrap={wrap!r} reaches Composer through the model's fsdp_wrap_fn, so "
            "to_composer() needs the model. HINT: config.to_composer(model)."
        )
    from composer.models import ComposerModel

    from unidist.parallel._checks import wrap_classes

    targets = [model]
    if isinstance(model, ComposerModel):  # Composer reads fsdp_wrap_fn on the direct children
        targets.extend(model.children())
    function = _WrapBy(wrap_classes(wrap, model))
    for target in targets:
        existing = getattr(target, "fsdp_wrap_fn", None)
        if existing is not None and not isinstance(existing, _WrapBy):
            raise ConfigurationError(
                f"{type(target).__name__} already defines fsdp_wrap_fn; unidist will not replace "
                "it. HINT: drop wrap from the config and let fsdp_wrap_fn decide."
            )
        cast("Any", target).fsdp_wrap_fn = function
