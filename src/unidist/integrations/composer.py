"""Composer integration: unidist's devices, parallelism, microbatching and samplers for Composer.

* :func:`to_composer_device`: unidist's device as Composer's ``Device`` (``Trainer(device=...)``).
* :func:`to_composer_parallelism` (also :meth:`unidist.ParallelismConfig.to_composer`): FSDP,
  FSDP2 and TP settings as Composer's ``ParallelismConfig`` (``Trainer(parallelism_config=...)``).
* :func:`composer_microbatch_size`: unidist's microbatch setting as Composer's
  ``device_train_microbatch_size``.
* :func:`native_sampler`: Composer's own sampler, for ``unidist.get_sampler(native="composer")``.
* :class:`ResumableCallback`: a ``Trainer`` that resumes where it stopped, exactly once, on any
  number of ranks, with :class:`unidist.ResumableState` (the agreed stop, the data position).

The adapter (:mod:`unidist.adapters.composer`) only runs collectives through Composer; everything
here is built on unidist's neutral modules. Composer is imported when these functions are called,
never when unidist is imported.

Microbatching: Composer's ``Trainer`` does its own, so unidist does not wrap its loop; it
translates the same setting, and says clearly where Composer refuses it::

    from unidist.integrations.composer import composer_microbatch_size

    trainer = Trainer(..., device="gpu",
                      device_train_microbatch_size=composer_microbatch_size("auto", device="gpu"))

What Composer 0.32.1 does with ``"auto"`` (and unidist therefore checks or documents):

* only on a GPU device (``DeviceGPU``); on any other device it raises ``ValueError("Can only use
  adaptive device_train_microbatch_size on GPU. ...")`` — checked here, with a hint;
* it starts at the train dataloader's ``batch_size`` and halves on CUDA OOM, never grows, and
  raises at size 1 — a :class:`~unidist.SizePolicy` with other rules cannot be translated;
* it refuses FSDP2, tensor-parallel-only configs, a profiler and sequence parallelism; with DDP
  an OOM during backward on only some ranks can still deadlock (mosaicml/composer PR #2117).
  :class:`unidist.MicroBatcher` in your own loop (or Ignite) has none of these limits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from unidist._base.workarounds import GLOO_AVG_SUMS
from unidist._sampling.native import SamplerRequest, no_sampler_wrapper
from unidist.errors import ConfigurationError
from unidist.integrations import import_framework
from unidist.microbatch import MicroBatcher, SizePolicy
from unidist.parallel._apply import tp_plan
from unidist.parallel._checks import wrap_classes
from unidist.parallel._fields import mixed_precision_dtypes
from unidist.parallel._gloo import GlooAverageFix
from unidist.parallel.strategies import DDPConfig
from unidist.ranks import get_world_size
from unidist.session import devices

if TYPE_CHECKING:
    import torch

    from unidist.parallel.config import ParallelismConfig
    from unidist.resume import ResumableState

__all__ = [
    "COMPOSER_REFUSAL",
    "ResumableCallback",
    "composer_microbatch_size",
    "native_sampler",
    "to_composer_device",
    "to_composer_parallelism",
]

#: What neutral code may ask this integration for, through :mod:`unidist._base.frameworks`.
PROVIDES = frozenset({"native_sampler", "to_composer_parallelism"})

#: The start of Composer 0.32.1's error for ``"auto"`` off GPU (tests keep this in sync).
COMPOSER_REFUSAL = "Can only use adaptive device_train_microbatch_size on GPU."

#: Device names Composer's ``get_device`` accepts.
_COMPOSER_DEVICES = ("cpu", "gpu", "mps", "tpu", "neuron", "hpu")


# -- devices -----------------------------------------------------------------------------------


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


# -- parallelism -------------------------------------------------------------------------------


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
    pre-hook on ``model`` corrects the gloo averaging of torch < 2.9 once the Trainer has sharded it
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
    from composer.utils import (
        FSDP2Config,
        FSDPConfig,
        ParallelismConfig as ComposerParallelism,
        TPConfig,
    )

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
        tp = TPConfig(tensor_parallel_degree=config.tp.degree, layer_plan=tp_plan(config.tp))
    return ComposerParallelism(fsdp=fsdp, fsdp2=fsdp2, tp=tp)


def _correct_gloo_averaging_later(model: torch.nn.Module | None) -> None:
    """Composer's FSDP2 over gloo inherits the summed averages of torch < 2.9 (pytorch#162338)."""
    if not GLOO_AVG_SUMS.present():
        return
    if model is not None:
        GlooAverageFix(model)  # corrects once the Trainer has sharded the model
        return
    if get_world_size() > 1 and devices.device_kind() != "cuda":
        raise ConfigurationError(
            "FSDP2 over gloo (no CUDA device here) gets gradients summed instead of averaged in "
            "torch < 2.9 (pytorch#162338); unidist corrects that through the model, which "
            "to_composer() was not given. HINT: config.to_composer(model)."
        )


def _composer_precision(setting: Any) -> Any:
    dtypes = mixed_precision_dtypes(setting, "mixed_precision")
    return dict(dtypes) if dtypes else "FULL"


def _set_wrap_fn(wrap: tuple[str | type, ...], model: torch.nn.Module | None) -> None:
    if model is None:
        raise ConfigurationError(
            f"wrap={wrap!r} reaches Composer through the model's fsdp_wrap_fn, so "
            "to_composer() needs the model. HINT: config.to_composer(model)."
        )
    from composer.models import ComposerModel

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


# -- microbatching -----------------------------------------------------------------------------


def composer_microbatch_size(
    setting: int | Literal["auto"] | MicroBatcher | SizePolicy | None = "auto",
    *,
    device: Any = None,
) -> int | Literal["auto"] | None:
    """The ``device_train_microbatch_size`` for Composer's ``Trainer`` that means ``setting``.

    Args:
        setting: ``"auto"`` (search on OOM), a fixed size, a :class:`~unidist.MicroBatcher`
            (its current size, e.g. one found by a probing run), a :class:`~unidist.SizePolicy`
            (its ``start``, or ``"auto"`` when it has none), or None (no microbatching).
        device: the ``device`` given to the Trainer: a name (``"gpu"``, ``"cpu"``, ...), a
            Composer ``Device``, or None (Composer's default: GPU when CUDA is available).

    Returns:
        An int, ``"auto"`` or None, to pass as ``device_train_microbatch_size``.

    Raises:
        ConfigurationError: ``"auto"`` on a device where Composer refuses it, a policy Composer
            cannot follow, or an invalid size.
    """
    if setting is None:
        return None
    if isinstance(setting, MicroBatcher):
        if setting.size is None:
            raise ConfigurationError(
                "the MicroBatcher has not run a step yet, so it has no size to give Composer. "
                "HINT: run a step first, or pass SizePolicy(start=...) or 'auto'."
            )
        return setting.size
    if isinstance(setting, SizePolicy):
        _check_translatable(setting)
        if setting.start is not None:
            return setting.start
        setting = "auto"
    if setting == "auto":
        _check_auto_device(device)
        return "auto"
    if isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1:
        return setting
    raise ConfigurationError(
        f"microbatch setting {setting!r} is not 'auto', a positive int, a MicroBatcher, a "
        "SizePolicy or None."
    )


def _check_translatable(policy: SizePolicy) -> None:
    custom = [
        name
        for name in ("shrink", "grow")
        if getattr(type(policy), name) is not getattr(SizePolicy, name)
    ]
    problems = []
    if custom:
        problems.append(f"a custom {' and '.join(custom)}()")
    if policy.grow_after is not None:
        problems.append(f"grow_after={policy.grow_after}")
    if policy.minimum != 1:
        problems.append(f"minimum={policy.minimum}")
    if problems:
        raise ConfigurationError(
            f"Composer's Trainer cannot follow this SizePolicy ({', '.join(problems)}): it only "
            "halves on OOM, never grows, and stops at 1. HINT: use the default SizePolicy with "
            "Composer, or unidist.MicroBatcher in your own loop for these rules."
        )


def _check_auto_device(device: Any) -> None:
    name = _device_name(device)
    if name == "gpu":
        return
    raise ConfigurationError(
        f"device_train_microbatch_size='auto' needs a GPU in Composer's Trainer, and the device "
        f'is {name!r}: Composer 0.32.1 refuses it with "{COMPOSER_REFUSAL} Please set '
        'device_train_microbatch_size >= 1." HINT: pass an int (for example the size a '
        "unidist.MicroBatcher settled on: composer_microbatch_size(microbatcher)), or train "
        "in your own loop or Ignite with unidist.MicroBatcher, which works on any device."
    )


def _device_name(device: Any) -> str:
    if device is None:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"  # what Composer's get_device does
    if isinstance(device, str):
        name = device.lower()
        if name not in _COMPOSER_DEVICES:
            raise ConfigurationError(
                f"device={device!r} is not a device name Composer's Trainer accepts "
                f"({', '.join(_COMPOSER_DEVICES)}). HINT: Composer calls CUDA 'gpu'."
            )
        return name
    try:
        from composer.devices import DeviceGPU
    except ImportError:  # no Composer, so no Composer device object either
        return type(device).__name__
    return "gpu" if isinstance(device, DeviceGPU) else type(device).__name__


# -- samplers ----------------------------------------------------------------------------------


def native_sampler(request: SamplerRequest) -> torch.utils.data.DistributedSampler[Any]:
    """Composer's ``dist.get_sampler`` (``unidist.get_sampler(native="composer")``).

    Raises:
        ConfigurationError: ``sampler`` is given: Composer has no sampler wrapper.
        AdapterUnavailableError: Composer is not installed.
    """
    if request.sampler is not None:
        raise no_sampler_wrapper("composer")
    cdist = import_framework("composer.utils.dist", "composer", "native='composer'")
    return cdist.get_sampler(  # type: ignore[no-any-return]
        request.dataset,
        drop_last=request.drop_last,
        shuffle=request.shuffle,
        num_replicas=request.world,
        rank=request.rank,
        seed=request.seed,
    )


# -- resuming a Trainer exactly once ------------------------------------------------------------


class ResumableCallback:
    """A Composer callback: the ``Trainer`` resumes where it stopped, exactly once.

    Composer's own autoresume spins the train dataloader forward by the batches of the epoch
    already trained, each rank its own batches: on another number of ranks those are other
    samples. This callback saves with :class:`unidist.ResumableState` instead: the model, the
    optimizer, the schedulers and Composer's ``Timestamp`` through torch's distributed
    checkpoint, and the position of the train dataloader (built with
    :func:`unidist.auto_dataloader`, whose position is global: any number of ranks continue it).
    At ``FIT_START`` it restores the latest checkpoint and tells Composer the dataloader resumes
    itself (``state.dataset_resumption["train"]``, what a stateful dataset sets), so Composer
    trains exactly the batches left. It counts a step at every ``BATCH_END``, where the ranks
    agree on a stop (SIGTERM; SIGUSR1 unless the script handles it): every rank saves the same
    batch and leaves by the signal.

        trainer = Trainer(model=model, train_dataloader=unidist.auto_dataloader(...),
                          max_duration="3ep",
                          callbacks=[ResumableCallback("/shared/ckpt", job="run-7",
                                                       save_every=100)])

    Args:
        folder: the checkpoint folder (or object store URL), as :class:`unidist.ResumableState`.
        job: the run's name.
        **options: any other :class:`unidist.ResumableState` keyword (``save_every``, ``keep``,
            ``grace``, ``async_save``, ``stateful`` for objects of your own, ...).
    """

    def __init__(self, folder: Any, *, job: str, **options: Any) -> None:
        for taken in ("model", "optimizer", "loader"):
            if taken in options:
                raise ConfigurationError(
                    f"ResumableCallback({taken}=...): the callback takes the {taken} from "
                    "Composer's Trainer (its state). HINT: leave it out."
                )
        self.folder = folder
        self.job = job
        self.options = options
        self.state: ResumableState | None = None

    def run_event(self, event: Any, state: Any, logger: Any) -> None:
        name = getattr(event, "value", event)
        if name == "fit_start":
            self._start(state)
        elif self.state is None:
            return
        elif name == "epoch_start":
            self.state.epoch = int(state.timestamp.epoch)
            self.state.begin_epoch()
        elif name == "batch_end":
            self.state.step()
        elif name == "epoch_end":
            self.state.end_epoch()
        elif name == "fit_end":
            self.state.close()

    def _start(self, state: Any) -> None:
        from unidist.resume import ResumableState

        optimizers = list(state.optimizers or [])
        if len(optimizers) > 1:
            raise ConfigurationError(
                f"ResumableCallback: the Trainer has {len(optimizers)} optimizers; it saves one. "
                "HINT: one optimizer, or ResumableState in a loop of your own."
            )
        stateful = dict(self.options.pop("stateful", None) or {})
        stateful["composer_timestamp"] = _ComposerTime(state)
        for i, scheduler in enumerate(state.schedulers or []):
            stateful[f"composer_scheduler{i}"] = scheduler
        self.state = ResumableState(
            self.folder,
            job=self.job,
            model=state.model,
            optimizer=optimizers[0] if optimizers else None,
            stateful=stateful,
            loader=state.dataloader,
            **self.options,
        )
        if self.state.restore():
            # The loader yields the rest of the epoch itself: Composer must not skip batches
            # (nor spin it through the epochs before, which it does to seed samplers).
            state.dataset_resumption["train"] = True

    def state_dict(self) -> dict[str, Any]:
        """Nothing for Composer's own checkpoints: the state lives in the callback's folder."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing: see :meth:`state_dict`."""

    def close(self, state: Any, logger: Any) -> None:
        if self.state is not None:
            self.state.close()

    def post_close(self) -> None:
        """Nothing left to do after Composer closed its loggers."""


class _ComposerTime:
    """Composer's ``Timestamp`` as a stateful object (Composer replaces it at every batch)."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state.timestamp.state_dict())

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        from composer.core import Timestamp

        timestamp = Timestamp()
        timestamp.load_state_dict(saved)
        self._state.timestamp = timestamp
