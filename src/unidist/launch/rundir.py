"""Run folders: private to the user (0700, files 0600), a new one for every run, never reused.

A run's folder holds its ranks' logs and the records the launcher reads to name the culprit, so
it must be (a) unique, or an earlier run's records would be read back (a healthy run reported
with an old culprit, or an old run's PIDs signalled) and (b) private, since logs hold output and
tracebacks. The default parent is ``<temp dir>/unidist-<uid>``, created 0700; if another user
owns that name (anyone can create it first in a shared ``/tmp``), a fresh private folder is used
instead. With ``--log-dir DIR`` each run gets a new folder inside DIR, as torchrun does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
import uuid
from pathlib import Path

from unidist.errors import ConfigurationError

__all__ = [
    "RUN_NAME_HINT",
    "create_run_folder",
    "default_root",
    "private_file",
    "remove",
    "why",
]

#: How ``--dry-run`` names the folder a run will create.
RUN_NAME_HINT = "<run>"


def default_root() -> Path:
    """``<temp dir>/unidist-<uid>``: this user's parent of run folders (not created here)."""
    return Path(tempfile.gettempdir(), f"unidist-{os.getuid()}")


def _private_dir(path: Path) -> bool:
    """Create ``path`` 0700 if missing; whether it is a real folder only this user can use."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return False
    if info.st_mode & 0o077:
        path.chmod(0o700)  # ours, but too open (an older unidist, or a umask): close it
    return True


def create_run_folder(root: Path | None) -> Path:
    """A new, empty, private folder for one run, inside ``root`` (default: :func:`default_root`).

    Raises:
        ConfigurationError: ``root`` cannot be created or written to, with the reason.
    """
    parent = root if root is not None else default_root()
    try:
        if root is None:
            if not _private_dir(parent):
                # Another user holds our name in the shared temp dir: never write into it.
                parent = Path(tempfile.mkdtemp(prefix=f"unidist-{os.getuid()}-"))
        else:
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for _ in range(100):
            folder = parent / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
                return folder
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create a run folder in {str(parent)!r} ({why(parent, exc)}). HINT: pass "
            "--log-dir with a folder you can write to."
        ) from None
    raise ConfigurationError(f"could not find a new folder name in {str(parent)!r}.")


def why(path: Path, exc: OSError) -> str:
    """Why ``path`` could not be created, in words (a file in the way says which)."""
    for above in (path, *path.parents):
        if above.exists():
            if not above.is_dir():
                return f"{str(above)!r} is a file, not a folder"
            break
    return str(exc.strerror or exc)


def private_file(path: Path) -> None:
    """Create (or empty) ``path`` with mode 0600, creating missing folders 0700.

    Raises:
        ConfigurationError: the file cannot be created, with the reason and the fix.
    """
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write the log file {str(path)!r} ({why(path.parent, exc)}). HINT: choose a "
            "writable place with --log-dir, --stdout or --stderr."
        ) from None


def remove(folder: Path) -> None:
    """Delete a run folder and everything in it (errors ignored: it is only logs)."""
    shutil.rmtree(folder, ignore_errors=True)
