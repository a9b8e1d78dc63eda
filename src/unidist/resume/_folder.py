"""The checkpoint folder's layout: what is in it, what counts, what is removed.

Layout (``root`` is the folder given to :class:`unidist.ResumableState`)::

    root/                      owned by this user, writable by nobody else
      .lock                    held by the run's rank 0 while it runs (see lock.py)
      latest.json              {"format", "job", "step", "folder"}: the last complete checkpoint
      step-000000040/          one checkpoint
        .metadata, *.distcp    torch.distributed.checkpoint's files (model, optimizer)
        progress.json          epoch, step, world size, the data loader's position, user extras
        rng-r<rank>.json       each rank's random states

A checkpoint counts only once ``latest.json`` names it, and ``latest.json`` is replaced (write,
fsync, rename) by rank 0 after every rank has written its part, so a crash mid-save leaves the
previous checkpoint in force. Every file is reached through the folder's checked handle
(handle.py), and every record is parsed as untrusted input (records.py).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, ClassVar

from unidist.errors import CheckpointError
from unidist.resume import _manifest as records
from unidist.resume._staged import Staged
from unidist.resume._storage import Folder

log = logging.getLogger("unidist.resume")

LATEST = "latest.json"
PROGRESS = "progress.json"
_STEP = re.compile(r"step-(\d{9,})\Z")


def step_name(step: int) -> str:
    """The name of the folder of the checkpoint taken after ``step`` steps."""
    return f"step-{step:09d}"


def rng_name(rank: int) -> str:
    return f"rng-r{rank}.json"


def read_record(folder: Folder, name: str, what: str) -> dict[str, Any]:
    """A record of ``folder``, checked (owner, mode, links, size) and parsed."""
    data = folder.read(name, limit=records.MAX_BYTES, what=what)
    return records.decode(data, folder.path / name, what)


def write_record(
    folder: Folder,
    name: str,
    value: dict[str, Any],
    *,
    compact: bool = False,
) -> None:
    """Replace a record atomically (``compact``: one line, for the large random states)."""
    folder.write(name, records.encode(value, compact=compact))


def latest(root: Folder, job: str) -> int:
    """The step that ``latest.json`` names, -1 when there is none; checked against ``job``."""
    if not root.exists(LATEST):
        return -1
    where = root.path / LATEST
    record = read_record(root, LATEST, "pointer to the latest checkpoint")
    check_job(record, where, job)
    step = records.count(record, "step", where)
    folder = records.text(record, "folder", where)
    if folder != step_name(step):
        raise CheckpointError(
            f'{where}: field "folder" is {folder[:80]!r}, but the step it names ({step}) is '
            f"kept in {step_name(step)!r}: the pointer is damaged. HINT: delete {where} to "
            "start afresh, or fix it to name one of the step-* folders."
        )
    return step


def check_job(record: dict[str, Any], where: Path, job: str) -> None:
    found = records.text(record, "job", where)
    if found != job:
        raise CheckpointError(
            f"{where} was written by job {found!r}, and this is job {job!r}: unidist does not "
            f"resume another run's checkpoint. HINT: pass job={found!r} to continue that run, "
            "or give this one a folder of its own."
        )


def drop_newer(root: Folder, step: int) -> None:
    """Remove the step folders newer than ``step`` (the one in force): saves that never
    counted, which a new save of the same step must not find half written."""
    for name in root.entries():
        found = _STEP.match(name)
        if found and int(found.group(1)) > step:
            with contextlib.suppress(FileNotFoundError):
                root.remove(name)


def prune(root: Folder, keep: int, newest: str) -> None:
    """Remove all but the newest ``keep`` complete checkpoints (never ``newest``), and every
    partial one older than ``newest`` (a save that crashed)."""
    steps = sorted(name for name in root.entries() if _STEP.match(name))
    complete = []
    for name in steps:
        with contextlib.suppress(CheckpointError, OSError), root.open_dir(name) as folder:
            if folder.exists(PROGRESS):
                complete.append(name)
    doomed = [name for name in complete[: max(0, len(complete) - keep)] if name != newest]
    doomed += [name for name in steps if name not in complete and name < newest]
    for name in doomed:
        with contextlib.suppress(OSError):
            with root.open_dir(name) as folder:  # no longer complete from its first removal
                if folder.exists(PROGRESS):
                    folder.remove(PROGRESS)
            root.remove(name)


class Commit:
    """Rank 0's last part of a save, on a thread of its own: training goes on meanwhile.

    Once every rank's files are on disk (torch's save returns on every rank only after rank 0
    gathered every rank's result), what remains is rank 0's: the files made private, the
    progress record, the step folder's names made durable, the pointer replaced (the moment the
    checkpoint counts) and old checkpoints removed. A crash before the pointer leaves the
    previous checkpoint in force, as any crash mid-save does. Whoever needs the pointer
    waits: ``save()`` until it counts (:meth:`wait_counted`), the next save, a stop,
    ``close()`` and a restore in this process for the whole commit (:meth:`join`); a failure
    is raised there. The thread is not a daemon: a script that ends right after a save still
    makes it count.
    """

    _pending: ClassVar[dict[Hashable, Commit]] = {}

    def __init__(self, redact: Callable[[str], str] = str) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._key: Hashable | None = None
        self._counted = threading.Event()
        self._redact = redact  # a text as a message may show it (no credentials)

    def start(
        self,
        root: Folder,
        folder: Folder,
        progress: dict[str, Any],
        latest: dict[str, Any],
        keep: int,
        after: Staged | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Commit the checkpoint in ``folder`` (a handle the commit owns and closes), once
        ``after`` (a save of torch's in flight) has written it; ``then()`` once it counts."""
        self.join()
        self._key = root.key
        Commit._pending[self._key] = self
        self._counted.clear()
        self._thread = threading.Thread(
            target=self._run,
            args=(root, folder, progress, latest, keep, after, then),
            name="unidist-resume-commit",
        )
        self._thread.start()

    def _run(
        self,
        root: Folder,
        folder: Folder,
        progress: dict[str, Any],
        latest: dict[str, Any],
        keep: int,
        after: Staged | None,
        then: Callable[[], None] | None,
    ) -> None:
        try:
            with folder:  # closed however the commit ends
                if after is not None:
                    after.wait()  # every rank's files are written when rank 0's future is done
                folder.seal()
                # Synced with the folder: the names of every file of the step, progress.json's too.
                write_record(folder, PROGRESS, progress)
            write_record(root, LATEST, latest)
        except BaseException as exc:  # raised by join(), in the training thread
            self._error = exc
            return
        finally:
            self._counted.set()
        if then is not None:
            then()
        try:
            prune(root, keep, folder.path.name)
        except Exception:  # an old checkpoint left behind is removed by the next save
            log.warning("could not remove old checkpoints from %s", root.path, exc_info=True)

    def wait_counted(self) -> None:
        """Wait until the checkpoint in flight counts (its removals may go on); raise what it
        failed with."""
        if self._thread is not None:
            self._counted.wait()
            if self._error is not None:
                self.join()

    def join(self) -> None:
        """Wait for the commit in flight; raise what it failed with."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        if self._key is not None and Commit._pending.get(self._key) is self:
            del Commit._pending[self._key]
        error, self._error = self._error, None
        if error is not None:
            if isinstance(error, CheckpointError):
                raise error  # its save's own error (Staged.wait), already worded
            raise CheckpointError(
                f"the checkpoint could not be made to count ({self._redact(repr(error))[:300]}); "
                "the one latest.json names is still in force."
            ) from None

    @classmethod
    def wait_for(cls, root: Folder) -> None:
        """Wait for a commit to ``root`` that another state of this process has in flight."""
        pending = cls._pending.get(root.key)
        if pending is not None:
            pending.join()
