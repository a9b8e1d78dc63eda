"""Checks behind :mod:`unidist.parallel`: values, degrees against the world, the model."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any

from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist.parallel.config import ParallelismConfig
    from unidist.parallel.strategies import Degrees

__all__ = [
    "check_bool",
    "check_choice",
    "check_degree",
    "check_model",
    "check_wrap",
    "did_you_mean",
    "matching_modules",
    "mixed_precision_dtypes",
    "resolve_degrees",
    "wrap_classes",
]

_DTYPE_NAMES = {
    "float32": ("fp32", "float32", "float", "torch.float32"),
    "bfloat16": ("bf16", "bfloat16", "torch.bfloat16"),
    "float16": ("fp16", "float16", "half", "torch.float16"),
}
_DTYPE_ROLES = ("param_dtype", "reduce_dtype", "buffer_dtype")


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _owner(obj: object) -> str:
    return type(obj).__name__


def check_bool(obj: object, name: str) -> None:
    """Raise unless ``obj.name`` is a bool."""
    value = getattr(obj, name)
    if not isinstance(value, bool):
        raise ConfigurationError(f"{_owner(obj)}.{name}={value!r} must be True or False.")


def check_degree(obj: object, name: str) -> None:
    """Raise unless ``obj.name`` is a positive int or -1 (inferred from the world size)."""
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise ConfigurationError(
            f"{_owner(obj)}.{name}={value!r} must be a positive integer, or -1 to infer it "
            "from the world size."
        )


def check_choice(obj: object, name: str, choices: tuple[str, ...], *, upper: bool = False) -> None:
    """Raise unless ``obj.name`` is one of ``choices`` (case-insensitive); store it normalised."""
    value = getattr(obj, name)
    normal = (value.upper() if upper else value.lower()) if isinstance(value, str) else value
    if normal not in choices:
        raise ConfigurationError(
            f"{_owner(obj)}.{name}={value!r} is not valid{did_you_mean(normal, choices)}; "
            f"expected one of {', '.join(choices)}."
        )
    object.__setattr__(obj, name, normal)


def check_wrap(wrap: Any, owner: str) -> tuple[str | type, ...]:
    """``wrap`` as a tuple of module classes or class names."""
    items = (wrap,) if isinstance(wrap, str | type) else tuple(wrap)
    bad = [item for item in items if not isinstance(item, str | type)]
    if bad:
        raise ConfigurationError(
            f"{owner}.wrap={wrap!r}: entries must be module classes or class names, got {bad!r}."
        )
    return items


def mixed_precision_dtypes(value: Any, owner: str) -> dict[str, str]:
    """``{"param_dtype": "bfloat16", ...}`` for a mixed-precision setting; ``{}`` for ``full``."""
    if isinstance(value, str):
        if value.lower() == "full":
            return {}
        raise ConfigurationError(
            f"{owner}.mixed_precision={value!r}: only 'full' (no casts) or explicit dtypes are "
            "accepted. Composer's 'DEFAULT'/'PURE' depend on the Trainer's precision, which a "
            "plain loop does not have. HINT: write the dtypes, e.g. {'param_dtype': 'bf16', "
            "'reduce_dtype': 'fp32'} for DEFAULT with bf16."
        )
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{owner}.mixed_precision={value!r} must be 'full' or a mapping of dtypes."
        )
    dtypes: dict[str, str] = {}
    for role, name in value.items():
        if role not in _DTYPE_ROLES:
            raise ConfigurationError(
                f"{owner}.mixed_precision key {role!r} is unknown{did_you_mean(role, _DTYPE_ROLES)}"
                f"; expected {', '.join(_DTYPE_ROLES)}."
            )
        canonical = next(
            (full for full, names in _DTYPE_NAMES.items() if str(name).lower() in names), None
        )
        if canonical is None:
            raise ConfigurationError(
                f"{owner}.mixed_precision[{role!r}]={name!r} is not a dtype; expected fp32, bf16 "
                "or fp16."
            )
        dtypes[role] = canonical
    return dtypes


def resolve_degrees(
    entries: list[tuple[str | None, int]], world_size: int, *, tp_alone: bool
) -> tuple[int, int, int]:
    """Fill the one -1 of (replicate, shard, tensor) so that they multiply to ``world_size``.

    Args:
        entries: (label, degree) for replicate, shard, tensor; label None for implicit degrees
            (DDP replicates over all ranks; TP alone has no data-parallel dimension).
        world_size: the number of ranks.
        tp_alone: tensor parallelism without a data-parallel strategy.

    Returns:
        The (replicate, shard, tensor) degrees.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigurationError(f"world_size={world_size!r} must be a positive integer.")
    named = [(label, value) for label, value in entries if label is not None]
    shown = " * ".join(f"{label}={value}" for label, value in named if value != -1) or "1"
    unknown = [label or "the data-parallel degree" for label, value in entries if value == -1]
    known = math.prod(value for _, value in entries if value != -1)
    if len(unknown) > 1:
        raise ConfigurationError(
            f"{' and '.join(unknown)} are -1, but only one degree can be inferred from the "
            f"world size ({world_size}). HINT: set all but one of them."
        )
    if unknown and world_size % known:
        raise ConfigurationError(
            f"{shown} = {known} does not divide the world size {world_size}, so {unknown[0]}=-1 "
            f"cannot be inferred. HINT: pick degrees whose product divides {world_size}."
        )
    values = [value if value != -1 else world_size // known for _, value in entries]
    if math.prod(values) != world_size:
        if tp_alone:
            raise _tp_alone_error(values[2], world_size)
        raise ConfigurationError(
            f"{shown} = {known}, but the world size is {world_size}: the degrees must multiply "
            "to the world size. HINT: set one of them to -1 to infer it, or run with "
            f"{known} ranks."
        )
    return values[0], values[1], values[2]


def _tp_alone_error(tensor: int, world_size: int) -> ConfigurationError:
    if tensor > world_size:
        return ConfigurationError(
            f"tp.degree={tensor} needs {tensor} ranks, but the world size is {world_size}: "
            f"tensor parallelism alone needs tp.degree == world size. HINT: set tp.degree="
            f"{world_size} (or -1), or run with {tensor} ranks."
        )
    return ConfigurationError(
        f"tp.degree={tensor} with world size {world_size}: tensor parallelism alone needs "
        "tp.degree == world size (the other ranks would have nothing to do). HINT: add "
        f"fsdp2=FSDP2Config() to shard over the rest, or set tp.degree={world_size} (or -1)."
    )


def matching_modules(model: torch.nn.Module, pattern: str) -> list[str]:
    """Module names matching ``pattern`` as ``parallelize_module`` matches (per dotted part)."""
    parts = pattern.split(".")
    found = []
    for name, _ in model.named_modules():
        pieces = name.split(".") if name else []
        if len(pieces) == len(parts) and all(map(fnmatch, pieces, parts)):
            found.append(name)
    return found


def wrap_classes(wrap: tuple[str | type, ...], model: torch.nn.Module) -> tuple[type, ...]:
    """The module classes ``wrap`` names, each checked to occur in ``model``."""
    present = {type(m) for m in model.modules()}
    by_name = {cls.__name__: cls for cls in present} | {cls.__qualname__: cls for cls in present}
    classes: list[type] = []
    for item in wrap:
        cls = by_name.get(item) if isinstance(item, str) else item
        if cls is None or cls not in present:
            names = sorted({c.__name__ for c in present})
            label = item if isinstance(item, str) else item.__name__
            raise ConfigurationError(
                f"wrap names {label!r}{did_you_mean(label, names)}, but the model has no module "
                f"of that class; it has {', '.join(names)}."
            )
        classes.append(cls)
    return tuple(classes)


def check_model(config: ParallelismConfig, degrees: Degrees, model: torch.nn.Module) -> None:
    """Check what ``config`` says about ``model``: wrap classes, TP plan names and shapes."""
    if config.strategy == "ddp" and not any(p.requires_grad for p in model.parameters()):
        raise ConfigurationError(
            "DDP needs a model with trainable parameters; this one has none. HINT: do not wrap "
            "a frozen model; call it directly on every rank."
        )
    data = config.fsdp or config.fsdp2
    if data is not None:
        wrap_classes(data.wrap, model)
    if config.tp is not None:
        for pattern, style in config.tp.plan.items():
            names = matching_modules(model, pattern)
            if not names:
                every = [name for name, _ in model.named_modules() if name]
                raise ConfigurationError(
                    f"tp.plan names {pattern!r}{did_you_mean(pattern, every)}, but no module of "
                    "the model matches it (parallelize_module would silently skip it). Modules: "
                    f"{', '.join(every[:20])}{' ...' if len(every) > 20 else ''}."
                )
            if isinstance(style, str):
                for name in names:
                    _check_split(name, model.get_submodule(name), style.lower(), degrees.tensor)


def _check_split(name: str, module: torch.nn.Module, style: str, degree: int) -> None:
    import torch

    if style == "sequence":
        return
    if isinstance(module, torch.nn.Linear):
        size, what = (
            (module.out_features, "out_features")
            if style == "colwise"
            else (module.in_features, "in_features")
        )
    elif isinstance(module, torch.nn.Embedding):
        size, what = (
            (module.embedding_dim, "embedding_dim")
            if style == "colwise"
            else (module.num_embeddings, "num_embeddings")
        )
    else:
        raise ConfigurationError(
            f"tp.plan[{name!r}]={style!r}: {style} splits nn.Linear or nn.Embedding, but "
            f"{name!r} is {type(module).__name__}. HINT: name the Linear layers inside it, or "
            "pass a torch ParallelStyle object."
        )
    if size % degree:
        raise ConfigurationError(
            f"tp.degree={degree} does not divide {name}.{what}={size}, which {style} splits. "
            f"HINT: pick a tp.degree that divides {size}."
        )
