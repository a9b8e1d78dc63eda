"""The settings of each parallelism strategy: DDP, FSDP (v1), FSDP2 and tensor parallelism.

Every value is checked when the object is built (misspelt strategies, bad dtypes, degrees that
are neither positive nor -1). :class:`~unidist.parallel.ParallelismConfig` combines them and
checks them against the world size and the model; :class:`Degrees` is what that check resolves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

from unidist._base.checks import did_you_mean
from unidist.errors import ConfigurationError
from unidist.parallel._fields import (
    check_bool,
    check_degree,
    check_wrap,
    mixed_precision_dtypes,
    normalise_choice,
)

__all__ = [
    "DDPConfig",
    "Degrees",
    "FSDP2Config",
    "FSDPConfig",
    "MESH_DIM_NAMES",
    "TPConfig",
]

#: Device-mesh dimension names, the same as Composer's ``ParallelismType`` values.
MESH_DIM_NAMES = ("data_parallel_replicate", "data_parallel_shard", "tensor_parallel")
_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
_HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
_PREFETCH = ("BACKWARD_POST", "BACKWARD_PRE", "NONE")
_TP_STYLES = ("colwise", "rowwise", "sequence")


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
        normalise_choice(self, "sharding_strategy", _SHARDING, upper=True)
        normalise_choice(self, "backward_prefetch", _PREFETCH, upper=True)
        normalise_choice(self, "state_dict_type", ("full", "sharded"))
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
        normalise_choice(self, "state_dict_type", ("full", "sharded"))
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


class Settings(Protocol):
    """A whole parallelism setting as the checks and :func:`unidist.parallel.apply` read it.

    :class:`unidist.parallel.ParallelismConfig` is one; the protocol lets the layers below it
    (``_checks``, ``_apply``) take it without importing it.
    """

    @property
    def ddp(self) -> DDPConfig | None: ...

    @property
    def fsdp(self) -> FSDPConfig | None: ...

    @property
    def fsdp2(self) -> FSDP2Config | None: ...

    @property
    def tp(self) -> TPConfig | None: ...

    @property
    def strategy(self) -> str: ...

    def validate(
        self, world_size: int | None = None, model: torch.nn.Module | None = None
    ) -> Degrees: ...
