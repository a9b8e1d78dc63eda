"""A save of torch's distributed checkpoint in flight (``async_save=True``).

``torch.distributed.checkpoint.async_save`` copies the state to host memory, returns, and writes
it on a thread of its own, whose collectives run on a gloo group that unidist gives it alone (a
group runs one collective at a time, in the order the ranks call them: sharing it with the stop
vote's background all-reduces would interleave two sequences). The folder it writes through is
the checked handle (``/proc/self/fd/N``), kept open until the write is done.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from unidist._resume.store import Folder
from unidist.errors import CheckpointError


class Staged:
    """One rank's save in flight: wait for it once from any thread (:meth:`wait`)."""

    def __init__(self, future: Future[Any], folder: Folder, started: float) -> None:
        self.future = future
        self.folder = folder
        self.started = started
        self.seconds: float | None = None  # how long the whole save took, once done
        self._lock = threading.Lock()
        future.add_done_callback(self._done)

    def _done(self, future: Future[Any]) -> None:
        self.seconds = time.monotonic() - self.started

    def wait(self) -> None:
        """Until this rank's files are written; a failure is a CheckpointError."""
        try:
            self.future.result()
        except BaseException as exc:  # torch's CheckpointException is a BaseException
            raise CheckpointError(
                f"saving {self.folder.path} in the background failed: {exc!r:.400}. The "
                "checkpoint in force is still the one latest.json names."
            ) from exc
        finally:
            with self._lock:
                self.folder.close()
