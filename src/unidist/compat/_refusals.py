"""unidist's refusals with the owners' error types, for the shims' calls.

Under Ignite's and Composer's collectives torch refuses some inputs with a ``RuntimeError`` (a
``src`` that is not a rank, a bitwise reduction of floats) or a ``TypeError`` (a ``src`` that is
not an int, a dataset without ``len()``), and pickle refuses an object with its own type. unidist
refuses them before anything travels, with a :class:`~unidist.ConfigurationError` (a
``ValueError``); here that error is also the owner's type (:mod:`unidist.errors`:
``ConfigurationRuntimeError``, ``ConfigurationTypeError``, ``ConfigurationAttributeError``), so
a ported script's ``except RuntimeError`` keeps working, and ``except unidist.ConfigurationError``
catches it too.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from unidist.errors import (
    ConfigurationAttributeError,
    ConfigurationError,
    ConfigurationRuntimeError,
    ConfigurationTypeError,
)

__all__ = ["check_bitwise", "check_sized", "checked_src", "pickles_type"]

#: unidist's bitwise reductions, as torch names them.
_BITWISE = {"band": "BAND", "bor": "BOR"}


def checked_src(src: Any, world: int | None, what: str) -> int:
    """``src`` as an int, after torch's checks: an int (or anything with ``__index__``, as a
    numpy integer), and, when ``world`` is given (no ``group=``), one of its ranks.

    Raises:
        ConfigurationTypeError: ``src`` is not an integer (torch: TypeError).
        ConfigurationRuntimeError: ``src`` is not a rank of the world (torch's backend:
            RuntimeError, "invalid root rank").
    """
    try:
        rank = operator.index(src)
    except TypeError as exc:
        raise ConfigurationTypeError(
            f"{what}(src={src!r}): src is a global rank, an int, got {type(src).__name__} "
            "(torch raises TypeError here). HINT: src=0 for the first rank."
        ) from exc
    if world is not None and not 0 <= rank < world:
        raise ConfigurationRuntimeError(
            f"{what}(src={src!r}): invalid root rank: {src!r} is not a rank of the world of "
            f"{world} (torch raises RuntimeError here). HINT: src is a global rank in "
            f"0..{world - 1}."
        )
    return rank


def check_bitwise(op: str, value: Any, what: str) -> None:
    """torch's refusal of a bitwise reduction (``band``, ``bor``) of floating-point values.

    Raises:
        ConfigurationRuntimeError: ``value`` is a floating-point or complex tensor or number.
    """
    if op not in _BITWISE:
        return
    if isinstance(value, torch.Tensor):
        floating = value.is_floating_point() or value.is_complex()
    else:
        floating = isinstance(value, float | complex)
    if floating:
        raise ConfigurationRuntimeError(
            f"{what}: Cannot use ReduceOp.{_BITWISE[op]} with non-integral dtype (got "
            f"{getattr(value, 'dtype', type(value).__name__)}; torch raises RuntimeError here). "
            "HINT: reduce an integer or bool tensor, or use MIN/MAX for floats."
        )


def check_sized(dataset: Any, what: str) -> None:
    """torch's ``DistributedSampler`` reads ``len(dataset)``: a dataset without it is refused.

    Raises:
        ConfigurationTypeError: ``len(dataset)`` raises TypeError (``None``, an int, an
            iterator), as it does in torch's sampler.
    """
    try:
        len(dataset)
    except TypeError as exc:
        raise ConfigurationTypeError(
            f"{what}: {exc}; a distributed sampler shards a dataset with len(), got "
            f"{type(dataset).__name__} {dataset!r:.40}. HINT: pass the dataset itself (a "
            "torch Dataset, a list); an IterableDataset takes no sampler (unidist.shard_iterable "
            "shards a stream)."
        ) from exc


def pickles_type(exc: ConfigurationError) -> ConfigurationError:
    """``exc`` with pickle's type, when it is unidist's refusal of an object pickle cannot send
    (its ``__cause__`` is pickle's error); ``exc`` itself otherwise. Raise it ``from
    exc.__cause__``.

    pickle refuses a local function or class with an AttributeError and a lock or a socket with
    a TypeError; torch's object collectives let that error through. Its ``PicklingError`` (a
    lambda of a module) has no unidist twin: that refusal stays a plain ConfigurationError.
    """
    cause = exc.__cause__
    hint = " HINT: send plain data, or define the functions and classes sent at module level."
    if isinstance(cause, AttributeError):
        return ConfigurationAttributeError(f"{exc}{hint}")
    if isinstance(cause, TypeError):
        return ConfigurationTypeError(f"{exc}{hint}")
    return exc
