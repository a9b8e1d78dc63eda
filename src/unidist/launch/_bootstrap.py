"""``python -m unidist.launch._bootstrap (SCRIPT | -m MODULE) [ARGS...]``: one rank's entry point.

Runs the user's script or module as ``__main__`` (as ``python SCRIPT`` or ``python -m MODULE``
would), after :func:`unidist.launch._rank.prepare_rank`, and records how it ended. An uncaught
exception is printed without this file's and runpy's frames (and without the ``[rankN]:`` prefix
torch's excepthook would add: the launcher's console prefixes every line already); the exit
status is 1, as for any uncaught exception. A failing rank exits at once (see ``_exit_now``).
"""

from __future__ import annotations

import runpy
import sys
import traceback
from pathlib import Path
from types import TracebackType

from unidist.launch._rank import prepare_rank, record_done, record_error


def main(argv: list[str]) -> int:
    if not argv or argv == ["-m"]:
        print(
            "usage: python -m unidist.launch._bootstrap (SCRIPT | -m MODULE) [ARGS...]",
            file=sys.stderr,
        )
        return 2
    prepare_rank()
    module = argv[0] == "-m"
    target = argv[1] if module else argv[0]
    sys.argv = [target, *argv[2 if module else 1 :]]
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = str(Path(target).resolve().parent)  # as `python SCRIPT` would
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code in (None, 0):
            record_done()
            raise
        record_error(exc)
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # as Python does for sys.exit("message")
        _exit_now(exc.code if isinstance(exc.code, int) else 1)
    except BaseException as exc:
        record_error(exc)
        traceback.print_exception(type(exc), exc, _user_frames(exc.__traceback__))
        _exit_now(1)
    record_done()
    return 0


def _exit_now(code: int) -> None:
    """Leave at once after a failure: flush output and logs, skip the interpreter's teardown.

    The other ranks learn of the failure when this process's sockets close, so every moment
    spent tearing down delays them; and tearing down torch 2.7's gloo groups can deadlock.
    """
    import logging
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Skip the frames of this bootstrap and of runpy at the top of a traceback."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name != __file__ and "runpy" not in name:
            break
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
