"""Parallelism settings checked against the world size and the model, applied or handed on.

:class:`ParallelismConfig` holds at most one data-parallel strategy and tensor parallelism (their
settings are in :mod:`unidist.parallel.strategies`). :meth:`ParallelismConfig.validate` then
checks the degrees against the world size and, given a model, the names and shapes the settings
refer to. Errors say which degree conflicts with what.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from unidist._base.checks import did_you_mean
from unidist.errors import ConfigurationError
from unidist.parallel import _apply
from unidist.parallel._checks import check_model, resolve_degrees
from unidist.parallel.strategies import DDPConfig, Degrees, FSDP2Config, FSDPConfig, TPConfig

if TYPE_CHECKING:
    import torch

__all__ = ["ParallelismConfig"]

#: Composer's names for the same settings, accepted by :meth:`ParallelismConfig.from_dict`.
_COMPOSER_ALIASES = {
    "data_parallel_shard_degree": "shard_degree",
    "data_parallel_replicate_degree": "replicate_degree",
    "tensor_parallel_degree": "degree",
    "layer_plan": "plan",
}


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
        resolved = resolve_degrees(entries, world_size, tp_alone=self.strategy == "tp")
        return Degrees(replicate=resolved[0], shard=resolved[1], tensor=resolved[2])

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
        return _apply.apply(self, model, device=device)

    def to_composer(self, model: torch.nn.Module | None = None) -> Any:
        """Composer's ``ParallelismConfig`` for the same setting.

        See :func:`unidist.integrations.composer.to_composer_parallelism`, which does the work
        (reached through :mod:`unidist._base.frameworks`, so importing unidist imports no Composer).
        """
        from unidist._base import frameworks as _frameworks

        return _frameworks.integration("composer", "to_composer_parallelism")(self, model)


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
