"""Typed, validated parallelism settings: DDP, FSDP (v1), FSDP2 and tensor parallelism.

Every value is checked when the object is built (unknown keys, misspelt strategies, bad dtypes);
:meth:`ParallelismConfig.validate` then checks the degrees against the world size and, given a
model, the names and shapes the settings refer to. Errors say which degree conflicts with what.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from unidist.errors import ConfigurationError
from unidist.parallel._checks import (
    check_bool,
    check_choice,
    check_degree,
    check_model,
    check_wrap,
    did_you_mean,
    mixed_precision_dtypes,
    resolve_degrees,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "DDPConfig",
    "Degrees",
    "FSDP2Config",
    "FSDPConfig",
    "MESH_DIM_NAMES",
    "ParallelismConfig",
    "TPConfig",
]

#: Device-mesh dimension names, the same as Composer's ``ParallelismType`` values.
MESH_DIM_NAMES = ("data_parallel_replicate", "data_parallel_shard", "tensor_parallel")
_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
_HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
_PREFETCH = ("BACKWARD_POST", "BACKWARD_PRE", "NONE")
_TP_STYLES = ("colwise", "rowwise", "sequence")
#: Composer's names for the same settings, accepted by :meth:`ParallelismConfig.from_dict`.
_COMPOSER_ALIASES = {
    "data_parallel_shard_degree": "shard_degree",
    "data_parallel_replicate_degree": "replicate_degree",
    "tensor_parallel_degree": "degree",
    "layer_plan": "plan",
}


@dataclass(frozen=True)
class DDPConfig:
    """``DistributedDataParallel``: every rank holds the whole model; gradients are averaged.

    Attributes:
        find_unused_parameters: let DDP tolerate parameters that get no gradient.
        broadcast_buffers: copy rank 0's buffers (BatchNorm statistics) each forward.
        gradient_as_bucket_view: let gradients alias the communication buckets (less memory).
        static_graph: promise the graph is the same every step (enables optimisations).
        bucket_cap_mb: gradient bucket size in MiB (None: torch's default, 25).
        sync_batchnorm: convert BatchNorm layers to ``SyncBatchNorm`` (statistics over ranks).
    """

    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    bucket_cap_mb: float | None = None
    sync_batchnorm: bool = False

    def __post_init__(self) -> None:
        for name in ("find_unused_parameters", "broadcast_buffers", "gradient_as_bucket_view"):
            check_bool(self, name)
        check_bool(self, "static_graph")
        check_bool(self, "sync_batchnorm")
        cap = self.bucket_cap_mb
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int | float) or cap <= 0
        ):
            raise ConfigurationError(
                f"DDPConfig.bucket_cap_mb={cap!r} must be a positive number of MiB or None."
            )


@dataclass(frozen=True)
class FSDPConfig:
    """FSDP v1 (``FullyShardedDataParallel``), the settings Composer's ``FSDPConfig`` knows.

    Attributes:
        shard_degree: ranks a parameter is sharded over (-1: what the other degrees leave).
        replicate_degree: copies of each shard (> 1 or -1 needs a ``HYBRID_*`` strategy).
        sharding_strategy: ``FULL_SHARD``, ``SHARD_GRAD_OP``, ``NO_SHARD``, ``HYBRID_SHARD``,
            ``_HYBRID_SHARD_ZERO2``.
        mixed_precision: ``"full"`` (no casts) or dtypes by role, e.g. ``{"param_dtype": "bf16",
            "reduce_dtype": "fp32"}`` (keys ``param_dtype``, ``reduce_dtype``, ``buffer_dtype``).
        wrap: module classes (or class names) that become their own FSDP unit, e.g. the
            transformer block; empty: one unit for the whole model.
        backward_prefetch: ``BACKWARD_POST``, ``BACKWARD_PRE`` or ``NONE``.
        forward_prefetch: prefetch the next all-gather in forward.
        limit_all_gathers: rate-limit all-gathers (bounds memory).
        sync_module_states: broadcast rank 0's weights when wrapping.
        use_orig_params: keep the original parameters visible (needed for TP, optimizers).
        state_dict_type: ``full`` or ``sharded`` (Composer's checkpoint format).
    """

    shard_degree: int = -1
    replicate_degree: int = 1
    sharding_strategy: str = "FULL_SHARD"
    mixed_precision: str | Mapping[str, str] = "full"
    wrap: tuple[str | type, ...] = ()
    backward_prefetch: str = "BACKWARD_POST"
    forward_prefetch: bool = False
    limit_all_gathers: bool = True
    sync_module_states: bool = False
    use_orig_params: bool = True
    state_dict_type: str = "full"

    def __post_init__(self) -> None:
        check_degree(self, "shard_degree")
        check_degree(self, "replicate_degree")
        check_choice(self, "sharding_strategy", _SHARDING, upper=True)
        check_choice(self, "backward_prefetch", _PREFETCH, upper=True)
        check_choice(self, "state_dict_type", ("full", "sharded"))
        for name in ("forward_prefetch", "limit_all_gathers", "sync_module_states"):
            check_bool(self, name)
        check_bool(self, "use_orig_params")
        mixed_precision_dtypes(self.mixed_precision, "FSDPConfig")
        object.__setattr__(self, "wrap", check_wrap(self.wrap, "FSDPConfig"))
        hybrid = self.sharding_strategy in _HYBRID
        if self.replicate_degree != 1 and not hybrid:
            raise ConfigurationError(
                f"FSDPConfig: replicate_degree={self.replicate_degree} replicates shards, but "
                f"sharding_strategy={self.sharding_strategy!r} does not. HINT: use "
                "sharding_strategy='HYBRID_SHARD', or replicate_degree=1."
            )
        if hybrid and self.replicate_degree == 1:
            raise ConfigurationError(
                f"FSDPConfig: sharding_strategy={self.sharding_strategy!r} needs replicate_degree "
                "> 1 (or -1), got 1 (that would be FULL_SHARD). HINT: set replicate_degree to the "
                "number of nodes, or use sharding_strategy='FULL_SHARD'."
            )


@dataclass(frozen=True)
class FSDP2Config:
    """FSDP2 (``torch.distributed.fsdp.fully_shard`` over a DeviceMesh).

    Attributes:
        shard_degree: ranks a parameter is sharded over (-1: what the other degrees leave).
        replicate_degree: copies of each shard (> 1 or -1: HSDP over a 2-D mesh).
        reshard_after_forward: free gathered parameters after forward (True), keep them
            (False), or reshard to this smaller group size (an int).
        mixed_precision: as :attr:`FSDPConfig.mixed_precision` (``buffer_dtype`` is refused:
            FSDP2 does not cast buffers).
        wrap: module classes (or class names) sharded as their own group, bottom-up.
        state_dict_type: ``sharded`` or ``full`` (Composer's checkpoint format).
    """

    shard_degree: int = -1
    replicate_degree: int = 1
    reshard_after_forward: bool | int = True
    mixed_precision: str | Mapping[str, str] = "full"
    wrap: tuple[str | type, ...] = ()
    state_dict_type: str = "sharded"

    def __post_init__(self) -> None:
        check_degree(self, "shard_degree")
        check_degree(self, "replicate_degree")
        check_choice(self, "state_dict_type", ("full", "sharded"))
        reshard = self.reshard_after_forward
        if not isinstance(reshard, bool) and not (isinstance(reshard, int) and reshard > 1):
            raise ConfigurationError(
                f"FSDP2Config.reshard_after_forward={reshard!r} must be True, False or a group "
                "size > 1."
            )
        dtypes = mixed_precision_dtypes(self.mixed_precision, "FSDP2Config")
        if "buffer_dtype" in dtypes:
            raise ConfigurationError(
                "FSDP2Config.mixed_precision: 'buffer_dtype' is an FSDP v1 setting; FSDP2 leaves "
                "buffers alone. HINT: cast buffers yourself, or drop the key."
            )
        object.__setattr__(self, "wrap", check_wrap(self.wrap, "FSDP2Config"))


@dataclass(frozen=True)
class TPConfig:
    """Tensor parallelism: split the listed layers over ``degree`` ranks.

    Attributes:
        degree: ranks each layer is split over (-1: what the data-parallel degrees leave).
        plan: module name (``fnmatch`` patterns per dotted part, e.g. ``"layers.*.fc1"``) ->
            ``"colwise"``, ``"rowwise"``, ``"sequence"`` or a torch ``ParallelStyle``.
    """

    degree: int
    plan: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_degree(self, "degree")
        if not isinstance(self.plan, Mapping) or not self.plan:
            raise ConfigurationError(
                f"TPConfig.plan={self.plan!r} must be a non-empty mapping of module name to "
                "'colwise', 'rowwise', 'sequence' or a ParallelStyle. HINT: {'fc1': 'colwise', "
                "'fc2': 'rowwise'} splits an MLP."
            )
        for name, style in self.plan.items():
            if isinstance(style, str) and style.lower() not in _TP_STYLES:
                raise ConfigurationError(
                    f"TPConfig.plan[{name!r}]={style!r} is not a style"
                    f"{did_you_mean(style, _TP_STYLES)}; expected one of "
                    f"{', '.join(_TP_STYLES)} or a torch ParallelStyle."
                )


@dataclass(frozen=True)
class Degrees:
    """Resolved sizes of the device-mesh dimensions; their product is the world size."""

    replicate: int
    shard: int
    tensor: int

    @property
    def world_size(self) -> int:
        """The number of ranks these degrees cover."""
        return self.replicate * self.shard * self.tensor


@dataclass(frozen=True)
class ParallelismConfig:
    """How a model is spread over the ranks: at most one of ``ddp``/``fsdp``/``fsdp2``, plus ``tp``.

    ``ParallelismConfig()`` means DDP with defaults. Build it from a dict with :meth:`from_dict`
    (Composer's ``parallelism_config`` dicts work too), check it with :meth:`validate`, use it
    with :meth:`apply` (plain loops) or :meth:`to_composer` (a Composer ``Trainer``).
    """

    ddp: DDPConfig | None = None
    fsdp: FSDPConfig | None = None
    fsdp2: FSDP2Config | None = None
    tp: TPConfig | None = None

    def __post_init__(self) -> None:
        kinds = {"ddp": DDPConfig, "fsdp": FSDPConfig, "fsdp2": FSDP2Config, "tp": TPConfig}
        for name, kind in kinds.items():
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigurationError(
                    f"ParallelismConfig.{name} must be a unidist {kind.__name__} or None, got "
                    f"{type(value).__module__}.{type(value).__name__}. HINT: ParallelismConfig."
                    "from_dict({...}) builds it from plain dicts."
                )
        chosen = [name for name in ("ddp", "fsdp", "fsdp2") if getattr(self, name) is not None]
        if len(chosen) > 1:
            raise ConfigurationError(
                f"ParallelismConfig sets {' and '.join(chosen)}; a model is wrapped by one "
                "data-parallel strategy. HINT: keep one of them."
            )
        if self.ddp is not None and self.tp is not None:
            raise ConfigurationError(
                "ParallelismConfig: DDP cannot wrap a tensor-parallel model (its parameters are "
                "DTensors). HINT: use fsdp2=FSDP2Config() with tp, which shards the rest."
            )

    @property
    def strategy(self) -> str:
        """``ddp``, ``fsdp``, ``fsdp2`` or ``tp`` (tensor parallelism alone)."""
        for name in ("fsdp", "fsdp2", "ddp"):
            if getattr(self, name) is not None:
                return name
        return "tp" if self.tp is not None else "ddp"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParallelismConfig:
        """Build from plain dicts: ``{"fsdp2": {"shard_degree": -1}, "tp": {"degree": 2, ...}}``.

        Composer's key names (``data_parallel_shard_degree``, ``tensor_parallel_degree``,
        ``layer_plan``, ...) are accepted too. Unknown keys are errors with a suggestion.
        Unlike Composer, ``FSDP_VERSION`` is not consulted: a ``fsdp`` section is FSDP v1,
        ``fsdp2`` is FSDP2. ``mixed_precision`` defaults to ``"full"`` (no casts), not
        Composer's ``DEFAULT``.
        """
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"parallelism config must be a mapping, got {data!r}.")
        sections = {"ddp": DDPConfig, "fsdp": FSDPConfig, "fsdp2": FSDP2Config, "tp": TPConfig}
        built: dict[str, Any] = {}
        for key, value in data.items():
            if key not in sections:
                raise ConfigurationError(
                    f"unknown parallelism section {key!r}{did_you_mean(key, sections)}; "
                    f"expected {', '.join(sections)}."
                )
            if value is None or isinstance(value, sections[key]):
                built[key] = value
                continue
            built[key] = _section(key, sections[key], value)
        return cls(**built)

    def degrees(self, world_size: int) -> Degrees:
        """Resolve the -1 degree against ``world_size``; errors name the conflicting degrees."""
        data = self.fsdp or self.fsdp2
        tensor = ("tp.degree", self.tp.degree) if self.tp is not None else (None, 1)
        if data is not None:
            prefix = "fsdp" if self.fsdp is not None else "fsdp2"
            entries: list[tuple[str | None, int]] = [
                (f"{prefix}.replicate_degree", data.replicate_degree),
                (f"{prefix}.shard_degree", data.shard_degree),
                tensor,
            ]
        elif self.tp is not None:
            entries = [(None, 1), (None, 1), tensor]
        else:
            entries = [(None, -1), (None, 1), tensor]  # DDP replicates over every rank
        return resolve_degrees(entries, world_size, tp_alone=self.strategy == "tp")

    def validate(
        self, world_size: int | None = None, model: torch.nn.Module | None = None
    ) -> Degrees:
        """Check the degrees against the world size and, given a model, the plan and wrap names.

        Args:
            world_size: ranks to plan for (default: :func:`unidist.get_world_size`).
            model: the model to be wrapped: TP plan names must exist and split evenly, ``wrap``
                classes must occur, DDP needs trainable parameters.

        Returns:
            The resolved :class:`Degrees`.
        """
        if world_size is None:
            from unidist.ranks import get_world_size

            world_size = get_world_size()
        degrees = self.degrees(world_size)
        if model is not None:
            check_model(self, degrees, model)
        return degrees

    def apply(
        self, model: torch.nn.Module, *, device: torch.device | str | None = None
    ) -> torch.nn.Module:
        """Wrap ``model`` for a plain training loop (see :func:`unidist.parallel.apply`)."""
        from unidist.parallel._apply import apply

        return apply(self, model, device=device)

    def to_composer(self, model: torch.nn.Module | None = None) -> Any:
        """Composer's ``ParallelismConfig`` for the same setting.

        See :func:`unidist.adapters.composer.to_composer_parallelism`.
        """
        from unidist.adapters.composer import to_composer_parallelism

        return to_composer_parallelism(self, model)


def _section(key: str, kind: type, value: Any) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"parallelism section {key!r} must be a mapping of settings, got {value!r}."
        )
    known = {f.name for f in fields(kind)}
    settings: dict[str, Any] = {}
    for name, setting in value.items():
        target = _COMPOSER_ALIASES.get(name, name)
        if target not in known:
            hint = did_you_mean(name, known | set(_COMPOSER_ALIASES))
            raise ConfigurationError(
                f"unknown {key} setting {name!r}{hint}; {kind.__name__} takes "
                f"{', '.join(sorted(known))}."
            )
        if target in settings:
            raise ConfigurationError(f"{key} sets {target!r} twice (directly and by alias).")
        if target == "replicate_degree" and setting is None:
            setting = 1  # Composer's None: no replicate dimension
        settings[target] = setting
    try:
        return kind(**settings)
    except TypeError as exc:  # a required setting is missing (TPConfig.degree)
        raise ConfigurationError(f"parallelism section {key!r}: {exc}.") from None
