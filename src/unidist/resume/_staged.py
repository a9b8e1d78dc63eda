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
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from unidist.errors import CheckpointError
from unidist.resume._storage import Folder


class Staged:
    """One rank's save in flight: wait for it once from any thread (:meth:`wait`)."""

    def __init__(
        self,
        future: Future[Any],
        folder: Folder,
        started: float,
        redact: Callable[[str], str] = str,
    ) -> None:
        self.future = future
        self.folder = folder
        self.started = started
        self.redact = redact  # a text as a message may show it (no credentials)
        self.seconds: float | None = None  # how long the whole save took, once done
        self._lock = threading.Lock()
        future.add_done_callback(self._done)

    def _done(self, future: Future[Any]) -> None:
        self._time()

    def _time(self) -> None:
        with self._lock:
            if self.seconds is None:
                self.seconds = time.monotonic() - self.started

    def wait(self) -> None:
        """Until this rank's files are written (and the save timed); a failure is a
        CheckpointError.

        A future wakes its waiters before it runs its done-callbacks, so the time is taken
        here too, whichever of the two comes first.
        """
        try:
            self.future.result()
        except BaseException as exc:  # torch's CheckpointException is a BaseException
            raise CheckpointError(
                f"saving {self.folder.path} in the background failed: "
                f"{self.redact(failure_text(exc))[:400]}. The checkpoint in force is still the "
                "one latest.json names."
            ) from None
        finally:
            self._time()
            with self._lock:
                self.folder.close()


def failure_text(exc: BaseException) -> str:
    """What a save's error says: for torch's ``CheckpointException``, each failed rank's own
    error (not the frames it carries)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        parts = []
        for rank, failure in sorted(failures.items(), key=lambda item: str(item[0])):
            error = failure[0] if isinstance(failure, tuple) and failure else failure
            parts.append(f"rank {rank}: {error!r}")
        return "; ".join(parts)
    return repr(exc)
