"""Checks of one strategy's own values, as its settings object is built (``__post_init__``).

Below :mod:`unidist.parallel.strategies`; the wording is :mod:`unidist._base.checks`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from unidist._base import checks as _checks
from unidist._base.checks import check_flag, did_you_mean
from unidist.errors import ConfigurationError

__all__ = [
    "check_bool",
    "check_degree",
    "check_wrap",
    "mixed_precision_dtypes",
    "normalise_choice",
]

_DTYPE_NAMES = {
    "float32": ("fp32", "float32", "float", "torch.float32"),
    "bfloat16": ("bf16", "bfloat16", "torch.bfloat16"),
    "float16": ("fp16", "float16", "half", "torch.float16"),
}
_DTYPE_ROLES = ("param_dtype", "reduce_dtype", "buffer_dtype")


def _owner(obj: object) -> str:
    return type(obj).__name__


def check_bool(obj: object, name: str) -> None:
    """Raise unless ``obj.name`` is a bool."""
    check_flag(getattr(obj, name), f"{_owner(obj)}.{name}")


def check_degree(obj: object, name: str) -> None:
    """Raise unless ``obj.name`` is a positive int or -1 (inferred from the world size)."""
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise ConfigurationError(
            f"{_owner(obj)}.{name}={value!r} must be a positive integer, or -1 to infer it "
            "from the world size."
        )


def normalise_choice(
    obj: object, name: str, choices: tuple[str, ...], *, upper: bool = False
) -> None:
    """Raise unless ``obj.name`` is one of ``choices`` (case-insensitive); store it normalised."""
    normal = _checks.check_choice(getattr(obj, name), f"{_owner(obj)}.{name}", choices, upper=upper)
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
