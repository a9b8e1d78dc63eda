"""Checks of a whole parallelism setting: degrees against the world size, names in the model.

One strategy's own values are checked as it is built (:mod:`unidist.parallel._fields`).
"""

from __future__ import annotations

import math
from fnmatch import fnmatch
from typing import TYPE_CHECKING

from unidist._base.checks import did_you_mean
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist.parallel.strategies import Degrees, Settings

__all__ = ["check_model", "matching_modules", "resolve_degrees", "wrap_classes"]


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


def check_model(config: Settings, degrees: Degrees, model: torch.nn.Module) -> None:
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
