"""The checkpoint's JSON records, read as untrusted input: every flaw is a CheckpointError.

A record is JSON that unidist wrote, but what reaches a restart may be damaged (a full disk, a
copy cut short) or edited by hand. Whatever it holds (nesting deeper than the parser's stack,
integers of a thousand digits, the wrong types, a field missing), reading it ends in a
:class:`~unidist.errors.CheckpointError` that names the file and the field, never in a
``RecursionError`` or a ``KeyError``, and never in a value that flows on to fail somewhere
else (a step too large for the all-reduce that compares the ranks' steps).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from unidist.errors import CheckpointError

FORMAT = "unidist.resume/1"
#: Largest step, epoch or world size a record may hold: far past any real run, and small
#: enough for every integer collective (int64) that carries it.
MAX_COUNT = 2**53
#: Largest JSON record read from the folder; a bigger one is not something unidist wrote.
MAX_BYTES = 64 << 20
#: Longest job name, host name and other strings of the records.
MAX_TEXT = 4096


def encode(value: Mapping[str, Any], *, compact: bool = False) -> bytes:
    """A record as written: ``value`` with the format tag, sorted keys; one line when
    ``compact`` (json's C encoder: ten times faster on the random states' 6,000 numbers)."""
    record = {"format": FORMAT, **value}
    if compact:
        return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps(record, indent=1, sort_keys=True).encode()


def decode(data: bytes, where: Path, what: str) -> dict[str, Any]:
    """Parse a record's bytes; the object, or a CheckpointError that shows what is wrong."""
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise _damaged(where, what, "its JSON is nested too deeply to be unidist's") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise _damaged(where, what, str(exc)) from exc
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        shown = data[:200].decode("utf-8", "replace")
        raise CheckpointError(
            f"the {what} {where} is not a unidist checkpoint file (expected a JSON object with "
            f'"format": "{FORMAT}", found {shown!r}).'
        )
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _damaged(where: Path, what: str, why: str) -> CheckpointError:
    return CheckpointError(
        f"the {what} {where} cannot be read ({why}). HINT: if the checkpoint is damaged, "
        f"delete {where.parent / 'latest.json'} to start afresh, or point it at an older step-* "
        "folder."
    )


def _field_error(where: Path, name: str, value: Any, expected: str) -> CheckpointError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return CheckpointError(
        f'{where}: field "{name}" is {shown}, expected {expected}. The record is damaged or '
        "not unidist's. HINT: delete it (or the step folder that holds it) to fall back to an "
        "older checkpoint, or start a new folder."
    )


def count(
    record: Mapping[str, Any], name: str, where: Path, *, minimum: int = 0, label: str = ""
) -> int:
    """``record[name]`` as a count in ``[minimum, MAX_COUNT]`` (``label``: the field's path)."""
    value = record.get(name)
    if type(value) is not int or not minimum <= value <= MAX_COUNT:
        raise _field_error(where, label or name, value, f"an integer from {minimum} to 2**53")
    return value


def text(record: Mapping[str, Any], name: str, where: Path) -> str:
    """``record[name]`` as a string of at most MAX_TEXT characters."""
    value = record.get(name)
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise _field_error(where, name, value, f"a string of at most {MAX_TEXT} characters")
    return value


def mapping(record: Mapping[str, Any], name: str, where: Path) -> dict[str, Any]:
    """``record[name]`` as a JSON object (absent or null: an empty one)."""
    value = record.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _field_error(where, name, value, "a JSON object")
    return value


def ints(
    value: Any, where: Path, name: str, *, length: int | None, low: int, high: int
) -> list[int]:
    """A list of integers in ``[low, high]`` (of ``length`` of them, when given)."""
    if (
        not isinstance(value, list)
        or (length is not None and len(value) != length)
        or not all(type(v) is int and low <= v <= high for v in value)
    ):
        size = f"{length} " if length is not None else ""
        raise _field_error(where, name, value, f"a list of {size}integers from {low} to {high}")
    return value


def number(value: Any, where: Path, name: str, *, optional: bool) -> float | None:
    """A finite float (or None when ``optional``)."""
    if value is None and optional:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _field_error(where, name, value, "a finite number")
    return float(value)


def pair(value: Any, where: Path, name: str, size: int) -> list[Any]:
    """A list of exactly ``size`` items (the tuples random states are made of)."""
    if not isinstance(value, list) or len(value) != size:
        raise _field_error(where, name, value, f"a list of {size} items")
    return value
