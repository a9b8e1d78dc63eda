"""Saves still in flight when the script returns: awaited before the process exits.

A save that :meth:`ResumableState.step` started (an async save, or rank 0's commit) may still be
on its way when the script's main function returns. The states with one are held here (strongly:
a state only the script's function held must still be awaited) and awaited by one hook that runs
once the main thread has returned, before the atexit handlers (torch's process groups are still
there for the save's collectives). A save that failed then is said on stderr, and the process
exits 1 once the exit handlers ran.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from unidist.errors import CheckpointError

if TYPE_CHECKING:
    from unidist.resume import ResumableState
    from unidist.resume._staged import Staged

__all__ = ["await_at_exit", "forget", "written"]

#: The states of this process with a save on its way to counting, awaited at the
#: interpreter's exit (held strongly: a state only the script's function held must still be).
_in_flight: set[ResumableState] = set()
_exit_hook: list[bool] = []  # registered once
if hasattr(os, "register_at_fork"):  # a forked child has none of its parent's saves to await
    os.register_at_fork(after_in_child=_in_flight.clear)


def forget(state: ResumableState) -> None:
    """``state`` has nothing left to await at exit."""
    _in_flight.discard(state)


def written(state: ResumableState, staged: Staged, future: Any) -> None:
    """``state``'s save in flight ended: nothing to await at exit unless it failed."""
    if not future.cancelled() and future.exception() is None and state._staged in (staged, None):
        _in_flight.discard(state)


def await_at_exit(state: ResumableState) -> None:
    """Await ``state``'s save in flight when the main thread ends, unless it ends well before
    (it is then forgotten here: a state the script dropped is not kept alive)."""
    _in_flight.add(state)
    if _exit_hook:
        return
    with contextlib.suppress(AttributeError, RuntimeError):  # not CPython, or exiting already
        # threading's exit hooks run once the main thread has returned, before the atexit
        # handlers (torch's process groups are still there for the save's collectives).
        threading._register_atexit(_at_exit)  # type: ignore[attr-defined]
        _exit_hook.append(True)


def _at_exit() -> None:
    """The script ended with saves in flight: wait for them. One that failed is said on stderr
    (the script never learnt of it), and the process exits 1 once the exit handlers ran."""
    failed = []
    for state in list(_in_flight):
        try:
            state._finish_staged()
            state._commit.join()
        except CheckpointError as exc:
            kept = "none" if state._counted_before is None else f"step {state._counted_before}"
            failed.append(
                f"unidist: the last save of job {state.job!r} (step {state._in_force}) failed "
                f"after the script returned, so {kept} stays the checkpoint in force in "
                f"{state.root}: {exc} This process exits with status 1.\n"
            )
        except BaseException as exc:  # an exit hook must not raise
            failed.append(f"unidist: waiting for the last save failed: {exc!r:.300}\n")
    _in_flight.clear()
    if not failed:
        return
    with contextlib.suppress(Exception):
        sys.stderr.write("".join(failed))
        sys.stderr.flush()
    # What the interpreter's exit would still do (join the other threads, run the exit
    # handlers, flush the streams), then the status that says the save failed.
    here = (threading.current_thread(), threading.main_thread())
    for thread in threading.enumerate():
        if not thread.daemon and thread not in here:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(1)
