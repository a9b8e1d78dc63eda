"""``python -m unidist.launch.rank.bootstrap (SCRIPT | -m MODULE | --exec PROGRAM) [ARGS...]``.

One rank's entry point. Runs the user's script (a file, or a folder or zip with ``__main__.py``)
or module as ``__main__``, as ``python SCRIPT`` or ``python -m MODULE`` would, after
:func:`unidist.launch.rank.runtime.prepare_rank`, and records how it ended. An uncaught exception is
printed without this file's and runpy's frames (and without the ``[rankN]:`` prefix torch's
excepthook would add: the launcher's console prefixes every line already); the exit status is
1, as for any uncaught exception. A failing rank exits at once
(:func:`unidist.launch.leaving.leave_now`). With
``--exec`` (``unidist launch --no-python``) the rank is prepared and then replaced by PROGRAM.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from pathlib import Path
from types import TracebackType

from unidist.launch.leaving import leave_now
from unidist.launch.rank.runtime import prepare_rank, record_done, record_error

_USAGE = (
    "usage: python -m unidist.launch.rank.bootstrap (SCRIPT | -m MODULE | --exec PROGRAM) [ARGS]"
)


def main(argv: list[str]) -> int:
    if not argv or argv in (["-m"], ["--exec"]):
        print(_USAGE, file=sys.stderr)
        return 2
    if argv[0] == "--exec":
        prepare_rank(python=False)
        os.execvp(argv[1], argv[1:])  # the records of its end come from its exit status
    prepare_rank()
    module = argv[0] == "-m"
    target = argv[1] if module else argv[0]
    sys.argv = [target, *argv[2 if module else 1 :]]
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            path = Path(target)
            # As `python SCRIPT`: the script's folder first on sys.path; for a folder or zip
            # with __main__.py, the folder or zip itself.
            sys.path[0] = str(path.resolve().parent if path.is_file() else path)
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code in (None, 0):
            record_done()
            raise
        record_error(exc)
        if not isinstance(exc.code, int):
            with contextlib.suppress(Exception):  # as Python does for sys.exit("message")
                print(exc.code, file=sys.stderr)
        leave_now(exc.code if isinstance(exc.code, int) else 1)
    except BaseException as exc:
        record_error(exc)
        with contextlib.suppress(Exception):  # the script may have closed stderr
            traceback.print_exception(type(exc), exc, _user_frames(exc.__traceback__))
        leave_now(1)
    record_done()
    return 0


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
