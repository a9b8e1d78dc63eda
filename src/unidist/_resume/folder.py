"""The checkpoint folder: what is in it, written atomically, read only once it is trusted.

Layout (``root`` is the folder given to :class:`unidist.ResumableState`)::

    root/                      owned by this user, writable by nobody else
      latest.json              {"format", "job", "step", "folder"}: the last complete checkpoint
      step-000000040/          one checkpoint
        .metadata, *.distcp    torch.distributed.checkpoint's files (model, optimizer)
        progress.json          epoch, step, world size, the data loader's position, user extras
        rng-r<rank>.json       each rank's random states

A checkpoint counts only once ``latest.json`` names it, and ``latest.json`` is replaced (write,
fsync, rename) by rank 0 after every rank has written its part, so a crash mid-save leaves the
previous checkpoint in force. torch's ``.metadata`` is a pickle, and loading it runs code, so
nothing in the folder is read before :func:`check_private` has found it to be this user's and
writable by nobody else: another local user cannot plant a checkpoint for the job to load.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from unidist.errors import CheckpointError

FORMAT = "unidist.resume/1"
LATEST = "latest.json"
PROGRESS = "progress.json"
#: Largest JSON file read from the folder; a bigger one is not something unidist wrote.
MAX_JSON_BYTES = 64 << 20


def step_folder(root: Path, step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` steps."""
    return root / f"step-{step:09d}"


def rng_file(folder: Path, rank: int) -> Path:
    return folder / f"rng-r{rank}.json"


def prepare(root: Path) -> None:
    """Create ``root`` (mode 0700) if it is missing; refuse one that others could write to."""
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700, parents=True)
    check_private(root)


def check_private(path: Path) -> None:
    """Refuse ``path`` unless it is this user's own, a real file or folder, and only we write it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing from the checkpoint folder.") from None
    kind = "folder" if stat.S_ISDIR(info.st_mode) else "file"
    if stat.S_ISLNK(info.st_mode) or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        raise CheckpointError(
            f"{path} is a symbolic link or a special file, not a checkpoint's file or folder. "
            "unidist reads checkpoints only from real files it can trust (torch's checkpoint "
            "metadata is a pickle). HINT: point ResumableState at a folder of your own."
        )
    if info.st_uid != os.geteuid():
        raise CheckpointError(
            f"the checkpoint {kind} {path} belongs to user id {info.st_uid}, not to this user "
            f"({os.geteuid()}); loading it would run whatever that user put there (torch's "
            "checkpoint metadata is a pickle). HINT: use a checkpoint folder of your own."
        )
    if info.st_mode & 0o022:
        raise CheckpointError(
            f"the checkpoint {kind} {path} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):04o}), so its contents cannot be trusted. HINT: "
            f"chmod go-w {path} if you are sure nobody else changed it, or start a new folder."
        )


def check_tree(folder: Path) -> None:
    """:func:`check_private` for a checkpoint's folder and everything in it."""
    check_private(folder)
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            check_tree(entry)
        else:
            check_private(entry)


def seal(folder: Path) -> None:
    """Make every file of a checkpoint this user's alone (torch writes them with the umask)."""
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            seal(entry)
        os.chmod(entry, 0o700 if entry.is_dir() else 0o600, follow_symlinks=False)


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from a trusted file of the folder, or a CheckpointError that shows it."""
    check_private(path)
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise CheckpointError(f"{path} ({what}) is {path.stat().st_size} bytes: not unidist's.")
        text = path.read_text(encoding="utf-8")
        value = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(
            f"the {what} {path} cannot be read ({exc}). HINT: if the checkpoint is damaged, "
            f"delete {path.parent / LATEST} to start afresh, or point it at an older step-* folder."
        ) from exc
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        raise CheckpointError(
            f"the {what} {path} is not a unidist checkpoint file (expected a JSON object with "
            f'"format": "{FORMAT}", found {text[:200]!r}).'
        )
    return value


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Replace ``path`` with ``value`` atomically: a private temporary file, fsync, rename."""
    data = json.dumps({"format": FORMAT, **value}, indent=1, sort_keys=True).encode()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fresh_folder(folder: Path) -> None:
    """An empty, private folder for a new checkpoint (a partial one from a crash is removed)."""
    if os.path.lexists(folder):
        check_private(folder)
        shutil.rmtree(folder)
    folder.mkdir(mode=0o700)


def prune(root: Path, keep: int, latest: Path) -> None:
    """Remove all but the newest ``keep`` complete checkpoints (never ``latest``)."""
    steps = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.is_symlink())
    complete = [p for p in steps if (p / PROGRESS).exists()]
    for folder in complete[: max(0, len(complete) - keep)]:
        if folder != latest:
            shutil.rmtree(folder, ignore_errors=True)
    for folder in steps:  # partial ones, older than the latest: a save that crashed
        if folder not in complete and folder.name < latest.name:
            shutil.rmtree(folder, ignore_errors=True)
