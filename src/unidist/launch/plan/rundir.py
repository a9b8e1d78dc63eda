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
import errno
import os
import shutil
import stat
import tempfile
import time
import uuid
from pathlib import Path

from unidist.errors import ConfigurationError
from unidist.launch.plan.checks import existing_problem

__all__ = [
    "RUN_NAME_HINT",
    "create_run_folder",
    "default_root",
    "open_private",
    "private_file",
    "remove",
    "remove_through",
    "swappable",
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


def open_private(path: Path, shown: Path | None = None) -> int:
    """Create (or empty) the log file ``path``, mode 0600, and return a descriptor open for
    writing; missing folders are created 0700.

    Safe in a folder other users can write to (``/tmp``, a team's scratch space): the last
    component is never followed if it is a symbolic link (``O_NOFOLLOW``), a new file is created
    with ``O_EXCL``, and an existing file is used only if it is a regular file of this user's
    with no other hard link (an earlier run's log); it is emptied only after that check.
    ``shown``: the file's name in messages, when ``path`` reaches it through a folder's handle.

    Raises:
        ConfigurationError: the file cannot be created or must not be written, with the reason
            and the fix.
    """
    name = str(shown if shown is not None else path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, flags | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENXIO and path.is_fifo()):
            with contextlib.suppress(OSError):
                problem = existing_problem(path.lstat())
                if problem is not None:
                    raise ConfigurationError(f"the log file {name!r} {problem}") from None
        raise ConfigurationError(
            f"cannot write the log file {name!r} ({why(path.parent, exc)}). HINT: choose a "
            "writable place with --log-dir, --stdout or --stderr."
        ) from None
    try:
        problem = existing_problem(os.fstat(fd))
        if problem is not None:
            raise ConfigurationError(f"the log file {name!r} {problem}")
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        os.fchmod(fd, 0o600)
    except OSError as exc:
        os.close(fd)
        raise ConfigurationError(
            f"cannot write the log file {name!r} ({exc.strerror or exc}). HINT: choose a "
            "writable place with --log-dir, --stdout or --stderr."
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_file(path: Path) -> None:
    """Create (or empty) ``path`` with mode 0600, creating missing folders 0700 (see
    :func:`open_private`, which keeps the file open).

    Raises:
        ConfigurationError: the file cannot be created, or must not be written, with the reason.
    """
    os.close(open_private(path))


def swappable(folder: Path) -> bool:
    """Whether another user could replace a file of this user's in ``folder`` (rename it, put
    a link in its place): a folder others may write to without the sticky bit, or another
    user's folder (root aside)."""
    try:
        info = folder.stat()
    except OSError:
        return True
    if info.st_uid not in (0, os.geteuid()):
        return True
    return bool(info.st_mode & 0o022) and not info.st_mode & stat.S_ISVTX


def remove(folder: Path) -> None:
    """Delete a run folder and everything in it (errors ignored: it is only logs)."""
    shutil.rmtree(folder, ignore_errors=True)


def remove_through(fd: int, folder: Path) -> None:
    """Delete the run folder open as ``fd`` (named ``folder``): its contents through the
    handle, then the name, only while it still names that folder (errors ignored).

    Another user who renamed the run folder in a shared parent never gets theirs emptied: what
    is removed is what the handle holds, and ``rmdir`` removes an empty folder only.
    """
    with contextlib.suppress(OSError):
        for _, dirs, files, here in os.fwalk(".", topdown=False, dir_fd=fd):
            for name in files:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=here)
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=here)  # a link to a folder: unlinked below
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=here)
    with contextlib.suppress(OSError):
        if os.path.samestat(os.lstat(folder), os.fstat(fd)):
            os.rmdir(folder)
