"""Writing the environment: setting, restoring and replacing this process's variables.

The only code that writes ``os.environ`` (a framework that reads only the environment, a
freshly started rank, the test harness's children).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

__all__ = [
    "environ_copy",
    "is_set",
    "patched",
    "rendezvous_store_shared",
    "replace_all",
    "restore",
    "set_variables",
    "snapshot",
]


@contextlib.contextmanager
def patched(updates: Mapping[str, str], *, only_missing: bool = True) -> Iterator[dict[str, str]]:
    """Set variables for the duration of the block, then restore exactly those (nothing else).

    Args:
        updates: the variables to set.
        only_missing: leave variables that are already set alone.

    Yields:
        The variables that were actually set.
    """
    applied = {k: v for k, v in updates.items() if not (only_missing and k in os.environ)}
    previous = {k: os.environ.get(k) for k in applied}
    os.environ.update(applied)
    try:
        yield applied
    finally:
        restore(previous)


def is_set(name: str) -> bool:
    """Whether the variable ``name`` is set in this process."""
    return name in os.environ


def rendezvous_store_shared() -> bool:
    """Whether torch's agent lends its rendezvous store to the ranks: unless
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (torch's opt-out, read as its handlers read it)."""
    return os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") != "1"


def set_variables(updates: Mapping[str, str]) -> None:
    """Set variables for a framework that only reads the environment (undo with :func:`restore`)."""
    os.environ.update(updates)


def snapshot(names: tuple[str, ...]) -> dict[str, str | None]:
    """The current values of ``names`` (``None`` for unset), for :func:`restore`."""
    return {name: os.environ.get(name) for name in names}


def restore(previous: Mapping[str, str | None]) -> None:
    """Put back the values recorded by :func:`snapshot`."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def environ_copy() -> dict[str, str]:
    """A copy of this process's whole environment (for a child process built from it)."""
    return dict(os.environ)


def replace_all(values: Mapping[str, str]) -> None:
    """Make ``values`` this process's whole environment (a freshly started rank only)."""
    os.environ.clear()
    os.environ.update(values)
