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
    """The operations :mod:`unidist.resume._folder` and :class:`unidist.ResumableState` use."""

    @property
    def path(self) -> Any: ...  # what messages show: a Path, or a redacted URL

    @property
    def key(self) -> Hashable: ...  # which folder: the same for every handle of it

    @property
    def local(self) -> bool: ...

    def exists(self, name: str) -> bool: ...

    def read(self, name: str, *, limit: int, what: str) -> bytes: ...

    def write(self, name: str, data: bytes, *, sync_folder: bool = True) -> None: ...

    def sync(self) -> None: ...

    def entries(self) -> list[str]: ...

    def open_dir(self, name: str) -> Folder: ...

    def open_or_make_dir(self, name: str) -> Folder: ...

    def check_tree(self) -> None: ...

    def seal(self) -> None: ...

    def unlink(self, name: str) -> None: ...

    def remove(self, name: str) -> None: ...

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
