"""A thread reads the main thread's stack while it churns; prints a JSON summary.

    python stack_churn.py SECONDS [faulthandler]

Everything that crashed a reader of another thread's stack goes on at once:

* native threads keep entering Python for the first time, each with a new thread state, as
  gloo's threads do when they finish a collective (CPython 3.11 puts a new state at the head
  of the interpreter's list before it fills it in);
* the main thread makes and pops frames (recursion, exceptions, generators, coroutines) and
  cyclic garbage whose finalizers run Python code, with the collector's threshold low, and the
  GIL changes hands every microsecond.

``faulthandler``: read the stack as unidist's sampler did up to 3992620 (faulthandler's dump of
every thread), for comparison: on CPython 3.11.7 that process died of SIGSEGV within a second.

The summary: ``looks`` (how many stacks were read), ``deepest`` (the most frames one had),
``found`` (whether a look saw the function ``deep`` at the right line) and ``error`` (what a
look raised, if one did: a reader that walked freed frames met "'Signals' object has no
attribute 'f_code'").
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import json
import sys
import tempfile
import threading
import time

from _native import Chains  # tests/scripts, this script's folder

from unidist.hangs.stacks import _StackReader

seconds = float(sys.argv[1])
old = sys.argv[2:] == ["faulthandler"]
sys.setswitchinterval(1e-6)
gc.set_threshold(50, 5, 5)

chains = Chains(2)
reader = _StackReader()  # made by the main thread: reads its stack
summary = {"looks": 0, "deepest": 0, "found": False}
LINE = 0  # the line of deep's call of Garbage(), set below


def look() -> None:
    if old:
        with tempfile.TemporaryFile(buffering=0) as dump:
            faulthandler.dump_traceback(dump, all_threads=True)
        return
    stack = reader.stack()
    summary["deepest"] = max(int(summary["deepest"]), len(stack))
    if any(entry[1:] == (LINE, "deep") for entry in stack):
        summary["found"] = True


def read() -> None:
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            look()
            summary["looks"] = int(summary["looks"]) + 1
    except Exception as exc:  # a frame that was not one: memory the walk should not have read
        summary["error"] = repr(exc)


class Garbage:
    def __init__(self) -> None:
        self.me = self  # a cycle: only a collection frees it

    def __del__(self) -> None:
        sum(range(20))  # Python code run by a collection, perhaps inside a look


def deep(n: int) -> int:
    if n == 0:
        Garbage()
        return 0
    try:
        if n % 7 == 0:
            raise KeyError(n)
        return deep(n - 1) + 1
    except KeyError:
        return deep(n - 1)


LINE = deep.__code__.co_firstlineno + 2


def generate(n: int):  # type: ignore[no-untyped-def]
    for i in range(n):
        yield deep(i % 25)


async def awaits(n: int) -> int:
    return await awaits(n - 1) if n else deep(10)


reading = threading.Thread(target=read)
reading.start()
rounds = 0
while reading.is_alive():
    list(generate(30))
    [Garbage() for _ in range(30)]
    rounds += 1
    if rounds % 50 == 0:
        asyncio.run(awaits(10))
if not chains.stop(60):  # none may enter Python while the interpreter ends
    summary["error"] = "a chain of native threads did not end within 60 s"
print(json.dumps(summary))
