"""Leaving a process at once, with its output flushed and without the interpreter's teardown.

Used where a process must end with a given status and tearing down could cost it: a failing rank
(the other ranks learn of the failure when its sockets close, and tearing down torch 2.7's gloo
groups can deadlock, pytorch PR #154976), a finished rank of the test harness, and the
``unidist`` command while a daemon thread may be inside torch's C++ code (finalization would end
the thread with ``pthread_exit`` and abort the process; CPython gh-87135).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

__all__ = ["leave_now"]


def leave_now(code: int) -> NoReturn:
    """End this process with ``code`` now: logs and streams flushed, no interpreter teardown.

    A stream the program closed or broke (a pipe whose reader left) must not stop the exit:
    a flush that raises is skipped, since nothing more can be done for that stream.
    """
    for step in (logging.shutdown, sys.stdout.flush, sys.stderr.flush):
        with contextlib.suppress(Exception):
            step()
    os._exit(code)
