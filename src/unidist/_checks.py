"""The one place for argument checks: ints, flags, choices with a suggestion, seconds.

One wording everywhere: ``{name} must be {what}, got {value!r}.``, where ``name`` is what the
user wrote (``seed``, ``DDPConfig.static_graph``, ``--timeout``), followed by a HINT where one
helps. Checks raise :class:`~unidist.errors.ConfigurationError` (a ``ValueError``) and return
the value normalised (an ``int`` from a numpy integer, a choice in its canonical case, seconds
as a ``float``). On the ground floor: it imports only the errors, so every layer can use it.
"""

from __future__ import annotations

import difflib
import math
import operator
from collections.abc import Iterable
from datetime import timedelta

from unidist.errors import ConfigurationError

__all__ = [
    "INT64_LIMIT",
    "check_choice",
    "check_flag",
    "check_int",
    "check_seconds",
    "did_you_mean",
]

#: Lengths, epochs and seeds stay below this: torch and numpy index with signed 64-bit integers.
INT64_LIMIT = 1 << 63


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_int(
    value: object, name: str, *, minimum: int | None = None, below: int | None = None
) -> int:
    """``value`` as an int (numpy integers too; bools refused), in ``[minimum, below)``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ConfigurationError(f"{name} must be an int, got {value!r}.")
    number = operator.index(value)  # type: ignore[arg-type]
    if minimum is not None and number < minimum:
        raise ConfigurationError(f"{name} must be at least {minimum}, got {number}.")
    if below is not None and number >= below:
        limit = "2**63 (a signed 64-bit integer)" if below == INT64_LIMIT else str(below)
        raise ConfigurationError(f"{name} must be below {limit}, got {number}.")
    return number


def check_flag(value: object, name: str) -> bool:
    """``value`` if it is a bool (``1`` and ``"yes"`` are refused: they hide mistakes)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}.")
    return value


def check_choice(value: object, name: str, choices: Iterable[str], *, upper: bool = False) -> str:
    """``value`` in the case of ``choices`` (matched case-insensitively), or an error that lists
    them and suggests the closest."""
    allowed = tuple(choices)
    normal = (value.upper() if upper else value.lower()) if isinstance(value, str) else value
    if normal not in allowed:
        raise ConfigurationError(
            f"{name} must be one of {', '.join(allowed)}, got {value!r}"
            f"{did_you_mean(normal, allowed)}."
        )
    return str(normal)


def check_seconds(value: float | timedelta, name: str = "timeout") -> float:
    """Seconds in a ``timeout=``-like argument: a positive, finite number or a timedelta."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not seconds > 0
    ):
        raise ConfigurationError(
            f"{name} must be a positive number of seconds or a timedelta, got {value!r}."
        )
    return float(seconds)
