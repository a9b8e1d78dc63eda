"""The one place for argument checks: ints, flags, choices with a suggestion, seconds.

One wording everywhere: ``{name} must be {what}, got {value!r}.``, where ``name`` is what the
user wrote (``seed``, ``DDPConfig.static_graph``, ``--timeout``, ``UNIDIST_TIMEOUT``), followed
by a HINT where one helps. The Python API's arguments, ``unidist launch``'s number options and
unidist's environment variables are all checked here. Checks raise
:class:`~unidist.errors.ConfigurationError` (a ``ValueError``) and return the value normalised
(an ``int`` from a numpy integer, a choice in its canonical case, seconds as a ``float``). On
the ground floor: it imports only the errors, so every layer can use it.
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
    "YEAR",
    "check_choice",
    "check_flag",
    "check_int",
    "check_seconds",
    "did_you_mean",
]

#: Lengths, epochs and seeds stay below this: torch and numpy index with signed 64-bit integers.
INT64_LIMIT = 1 << 63
#: Seconds in a year: the longest duration a check with this cap takes (a longer one is a
#: mistake of units, and threading's waits refuse more than ``threading.TIMEOUT_MAX``).
YEAR = 365 * 24 * 3600


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_int(
    value: object,
    name: str,
    *,
    minimum: int | None = None,
    below: int | None = None,
    maximum: int | None = None,
) -> int:
    """``value`` as an int (numpy integers too; bools refused), in ``[minimum, below)`` or
    ``[minimum, maximum]``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ConfigurationError(f"{name} must be an int, got {value!r}.")
    number = operator.index(value)  # type: ignore[arg-type]
    if minimum is not None and maximum is not None and not minimum <= number <= maximum:
        raise ConfigurationError(f"{name} must be from {minimum} to {maximum}, got {number}.")
    if minimum is not None and number < minimum:
        raise ConfigurationError(f"{name} must be at least {minimum}, got {number}.")
    if maximum is not None and number > maximum:
        raise ConfigurationError(f"{name} must be at most {maximum}, got {number}.")
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


def check_seconds(
    value: object,
    name: str = "timeout",
    *,
    timedelta_ok: bool = True,
    zero: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    hint: str = "",
) -> float:
    """Seconds: a finite number above 0 (or a ``timedelta``, unless ``timedelta_ok`` is False),
    at least ``minimum`` and at most ``maximum`` where given, or 0 where ``zero`` says what 0
    means ("waits for ever", "turns it off"). ``hint`` ends the message (the fix, in the
    caller's words: an option's or a variable's example)."""
    seconds = value.total_seconds() if timedelta_ok and isinstance(value, timedelta) else value
    if (
        not isinstance(seconds, bool)
        and isinstance(seconds, int | float)
        and (
            (zero is not None and seconds == 0)
            or (
                seconds > 0
                and math.isfinite(seconds)
                and (minimum is None or seconds >= minimum)
                and (maximum is None or seconds <= maximum)
            )
        )
    ):
        return float(seconds)
    what = (
        f"a number of seconds of at least {_limit(minimum)}"
        if minimum is not None
        else "a positive number of seconds"
    )
    if maximum is not None:
        what += f" and at most {_limit(maximum)}" + (" (a year)" if maximum == YEAR else "")
    if timedelta_ok:
        what += " or a timedelta"
    if zero is not None:
        what += f", or 0 ({zero})"
    raise ConfigurationError(
        f"{name} must be {what}, got {value!r}." + (f" HINT: {hint}" if hint else "")
    )


def _limit(value: float) -> str:
    """A limit as written: ``31536000``, not ``3.1536e+07``; ``0.001``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
