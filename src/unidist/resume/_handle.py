"""The checkpoint folder, trusted by its handle and never again by its path.

torch's checkpoint metadata is a pickle: loading it runs code. Checking a folder by its path and
then handing torch the same path leaves a gap between the check and the read, in which anyone
who can rename the folder (or any folder above it) can swap in their own (``renameat2`` with
``RENAME_EXCHANGE`` does it atomically). So unidist opens the folder once, one component at a
time from ``/`` with ``O_NOFOLLOW``, checks each *opened* directory, and from then on reaches
every file relative to that handle: its own records with ``openat``, and torch's reader and
writer through ``/proc/self/fd/<handle>``, which names the opened directory itself, not a path
that could be resolved again.

What is refused, as ssh's ``StrictModes`` refuses a home folder:

* an ancestor that another user owns (root excepted): its owner can rename the folder away;
* an ancestor that others can write to (group or world) without the sticky bit: they can too
  (``/tmp``, mode 1777, is fine: the sticky bit keeps others from renaming what is not theirs);
* a checkpoint folder (or a folder inside it) that is not this user's, or that others can write;
* a file that is not a regular file, is not this user's, is writable by others, or has more
  than one link (a hard link elsewhere is a second door to its contents).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from pathlib import Path
from typing import Any

from unidist.errors import CheckpointError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Regular files only: O_NONBLOCK so that a FIFO planted in the folder cannot block the open.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: ``/proc/self/fd`` names an open file itself (Linux); elsewhere the path is handed to torch.
_PROC_FD = Path("/proc/self/fd")

#: Folders made on the way to a missing checkpoint folder: never writable by others.
_ANCESTOR_MODE = 0o755


def _fix(path: Path | str) -> str:
    return (
        f"HINT: use a folder under one you own, or make {path} safe: chmod go-w {path} (or "
        f"chmod +t {path}, as /tmp is, if others must write there)."
    )


def check_ancestor(info: os.stat_result, path: Path | str, root: Path) -> None:
    """Refuse a folder above ``root`` in which another user could rename ``root`` away."""
    if info.st_uid not in (0, os.geteuid()):
        raise CheckpointError(
            f"{path}, a folder above the checkpoint folder {root}, belongs to user id "
            f"{info.st_uid}: that user can rename {root} away and put a folder of their own in "
            "its place, whose checkpoint (a pickle) would run as this job. HINT: keep "
            "checkpoints under folders that you or root own."
        )
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        who = "everyone" if info.st_mode & 0o002 else "its group"
        raise CheckpointError(
            f"{path}, a folder above the checkpoint folder {root}, is writable by {who} (mode "
            f"{stat.S_IMODE(info.st_mode):04o}) without the sticky bit, so another user can "
            f"swap {root} for a folder of their own between unidist's checks and torch's reads "
            f"(its checkpoint metadata is a pickle). {_fix(path)}"
        )


def check_private(info: os.stat_result, path: Path | str) -> None:
    """Refuse a folder or file of the checkpoint that is not this user's alone."""
    mode = info.st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise CheckpointError(
            f"{path} is a symbolic link or a special file (mode {stat.filemode(mode)}), not a "
            "checkpoint's file or folder. unidist reads checkpoints only from real files it can "
            "trust (torch's checkpoint metadata is a pickle). HINT: point ResumableState at a "
            "folder of your own, or remove it."
        )
    kind = "folder" if stat.S_ISDIR(mode) else "file"
    if info.st_uid != os.geteuid():
        raise CheckpointError(
            f"the checkpoint {kind} {path} belongs to user id {info.st_uid}, not to this user "
            f"({os.geteuid()}); loading it would run whatever that user put there (torch's "
            "checkpoint metadata is a pickle). HINT: use a checkpoint folder of your own."
        )
    if mode & 0o022:
        raise CheckpointError(
            f"the checkpoint {kind} {path} is writable by other users (mode "
            f"{stat.S_IMODE(mode):04o}), so its contents cannot be trusted. HINT: "
            f"chmod go-w {path} if you are sure nobody else changed it, or start a new folder."
        )
    if kind == "file" and info.st_nlink != 1:
        raise CheckpointError(
            f"the checkpoint file {path} has {info.st_nlink} links: whoever holds another can "
            "change what it holds. HINT: copy the checkpoint (cp -r) instead of linking it."
        )


class Dir:
    """An open, checked directory of the checkpoint; every file is reached through it."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open_root(cls, path: Path, *, create: bool) -> Dir:
        """Open the checkpoint folder from ``/`` down, checking every folder on the way.

        Symbolic links in ``path`` are resolved first (the folders they lead to are what is
        checked); a component that turns into a link or a file while it is being opened is
        refused, since it was changed between the resolution and the open.
        """
        real = Path(os.path.realpath(path))
        fd = os.open("/", _DIR)
        try:
            check_ancestor(os.fstat(fd), "/", path)
            here = Path("/")
            names = real.parts[1:]
            for i, name in enumerate(names):
                here = here / name
                last = i == len(names) - 1
                child = _open_or_make(fd, name, here, path, create=create, last=last)
                os.close(fd)
                fd = child
                info = os.fstat(fd)
                if last:
                    check_private(info, here if here == path else f"{path} (= {here})")
                else:
                    check_ancestor(info, here, path)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path)

    def open_dir(self, name: str, *, create: bool = False) -> Dir:
        """A checked folder inside this one (``create``: a private one, made unless it is
        there)."""
        where = self.path / name
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=self.fd)
        try:
            fd = os.open(name, _DIR, dir_fd=self.fd)
        except FileNotFoundError:
            raise CheckpointError(f"{where} is missing from the checkpoint folder.") from None
        except OSError as exc:
            raise _not_a_folder(where, exc) from exc
        try:
            check_private(os.fstat(fd), where)
        except BaseException:
            os.close(fd)
            raise
        return Dir(fd, where)

    # -- what torch reads and writes -----------------------------------------------------------

    @property
    def torch_path(self) -> str:
        """A path for torch's checkpoint reader and writer that names this very directory."""
        if sys.platform.startswith("linux") and _PROC_FD.is_dir():
            return str(_PROC_FD / str(self.fd))
        return str(self.path)  # pragma: no cover - unidist's launcher and tests run on Linux

    def writer(self) -> Any:
        """torch's checkpoint writer for this folder, through the handle."""
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(self.torch_path)

    def reader(self) -> Any:
        """torch's checkpoint reader for this folder, through the handle."""
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(self.torch_path)

    @property
    def key(self) -> tuple[int, int]:
        """Which folder this is (device, inode): the same for every handle of it."""
        info = os.fstat(self.fd)
        return (info.st_dev, info.st_ino)

    def dup(self) -> Dir:
        """A second handle of this folder, for a thread that outlives this one's ``with``."""
        return Dir(os.dup(self.fd), self.path)

    # -- files ---------------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def read(self, name: str, *, limit: int, what: str) -> bytes:
        """The bytes of a trusted regular file of this folder, at most ``limit`` of them."""
        where = self.path / name
        try:
            fd = os.open(name, _FILE, dir_fd=self.fd)
        except FileNotFoundError:
            raise CheckpointError(f"the {what} {where} is missing.") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise CheckpointError(
                    f"the {what} {where} is a symbolic link, a socket or a folder, not a file "
                    "unidist wrote. HINT: remove it."
                ) from exc
            raise CheckpointError(f"the {what} {where} cannot be opened: {exc}") from exc
        with os.fdopen(fd, "rb") as stream:
            info = os.fstat(fd)
            check_private(info, where)
            if info.st_size > limit:
                raise CheckpointError(
                    f"the {what} {where} holds {info.st_size} bytes, more than the {limit} of "
                    "any file unidist writes: it is not unidist's. HINT: remove it."
                )
            data = stream.read(limit + 1)
        if len(data) > limit:
            raise CheckpointError(f"the {what} {where} grew past {limit} bytes while being read.")
        return data

    def write(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data`` atomically: a private new file, fsync, rename, and an
        fsync of this folder, which makes the new name (and every name made before it) last."""
        tmp = f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=self.fd,
        )
        try:
            with os.fdopen(fd, "wb", closefd=False) as stream:
                stream.write(data)
                stream.flush()
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise
        os.close(fd)
        os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        os.fsync(self.fd)

    def entries(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def check_tree(self) -> None:
        """Every file and folder in this one is this user's alone (see :func:`check_private`)."""
        for name in self.entries():
            info = self.lstat(name)
            if stat.S_ISDIR(info.st_mode):
                with self.open_dir(name) as inner:
                    inner.check_tree()
            else:
                check_private(info, self.path / name)

    def seal(self) -> None:
        """Make every file of this folder this user's alone (torch writes with the umask)."""
        for name in self.entries():
            info = self.lstat(name)
            if stat.S_ISDIR(info.st_mode):
                with self.open_dir(name) as inner:
                    inner.seal()
            elif stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
                fd = os.open(name, _FILE, dir_fd=self.fd)
                try:
                    os.fchmod(fd, 0o600)
                finally:
                    os.close(fd)

    def remove(self, name: str) -> None:
        """Remove ``name`` (a folder with everything in it, or a file), never following links."""
        info = self.lstat(name)
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(name, dir_fd=self.fd)
            return
        for top, folders, files, top_fd in os.fwalk(name, topdown=False, dir_fd=self.fd):
            del top
            for entry in files:
                os.unlink(entry, dir_fd=top_fd)
            for entry in folders:  # links to folders are listed here too, and never followed
                try:
                    os.rmdir(entry, dir_fd=top_fd)
                except NotADirectoryError:
                    os.unlink(entry, dir_fd=top_fd)
        os.rmdir(name, dir_fd=self.fd)

    # -- the end -------------------------------------------------------------------------------

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _open_or_make(fd: int, name: str, here: Path, root: Path, *, create: bool, last: bool) -> int:
    for _ in range(2):  # made by someone else between our two calls: open what is there
        try:
            return os.open(name, _DIR, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise CheckpointError(f"the checkpoint folder {root} does not exist.") from None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700 if last else _ANCESTOR_MODE, dir_fd=fd)
        except OSError as exc:
            raise _not_a_folder(here, exc, root) from exc
    return os.open(name, _DIR, dir_fd=fd)


def _not_a_folder(where: Path, exc: OSError, root: Path | None = None) -> CheckpointError:
    changed = exc.errno in (errno.ELOOP, errno.ENOTDIR)
    what = "is not a folder (a symbolic link or a file)" if changed else f"cannot be opened: {exc}"
    note = (
        f" It changed while unidist was opening {root}, or it was never a folder."
        if changed and root is not None
        else ""
    )
    return CheckpointError(
        f"{where} {what}.{note} unidist opens checkpoint folders only through real folders it "
        "has checked (torch's checkpoint metadata is a pickle). HINT: point ResumableState at a "
        "folder of your own."
    )
