"""What the checkpoint folder must do, wherever it lives: a local folder trusted by its handle
(:class:`unidist.resume._handle.Dir`) or a prefix of an object store
(:class:`unidist.resume._remote.Remote`)."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any, Protocol

from unidist.resume._handle import Dir
from unidist.resume._remote import Remote, is_url


class Folder(Protocol):
    """The checkpoint folder as :mod:`unidist.resume._folder` and :class:`unidist.ResumableState`
    use it, one job per member:

    * naming it in messages and telling two handles of one folder apart: :attr:`path`,
      :attr:`key`;
    * unidist's own small records (``latest.json``, ``progress.json``, the random states, read
      as untrusted input): :meth:`exists`, :meth:`read`, :meth:`write`;
    * the steps: :meth:`entries`, :meth:`open_dir` (``create=True`` for a new step),
      :meth:`remove` (a step, or one file);
    * trust: :meth:`check_tree` (every file this user's alone, before a load), :meth:`seal`
      (after torch wrote a step with the umask);
    * torch's checkpoint: :meth:`writer`, :meth:`reader` (reaching the folder through this
      handle, never by its path again);
    * the handle itself: :meth:`dup` (for a thread that outlives a ``with``), :meth:`close`.
    """

    @property
    def path(self) -> Any: ...  # what messages show: a Path, or a redacted URL

    @property
    def key(self) -> Hashable: ...  # which folder: the same for every handle of it

    def exists(self, name: str) -> bool: ...

    def read(self, name: str, *, limit: int, what: str) -> bytes: ...

    def write(self, name: str, data: bytes) -> None: ...

    def entries(self) -> list[str]: ...

    def open_dir(self, name: str, *, create: bool = False) -> Folder: ...

    def remove(self, name: str) -> None: ...

    def check_tree(self) -> None: ...

    def seal(self) -> None: ...

    def writer(self) -> Any: ...

    def reader(self) -> Any: ...

    def dup(self) -> Folder: ...

    def close(self) -> None: ...

    def __enter__(self) -> Folder: ...

    def __exit__(self, *exc: object) -> None: ...


def open_root(
    folder: str | os.PathLike[str],
    options: Mapping[str, Any],
    *,
    create: bool,
    timeout: float | None = None,
) -> Folder:
    """The checkpoint folder ``folder`` names: an object store's prefix for a URL (each of its
    operations bounded by ``timeout`` seconds), else a local folder opened from ``/`` and
    checked (``file://`` URLs are local folders)."""
    if is_url(folder):
        return Remote.open_root(str(folder), options, timeout)
    path = (
        Path(str(folder)[len("file://") :]) if str(folder).startswith("file://") else Path(folder)
    )
    return Dir.open_root(path, create=create)
