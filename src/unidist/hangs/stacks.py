"""The rank's side of hang and straggler attribution: a thread that says where the rank is.

Started in every rank of ``unidist launch`` and :func:`unidist.testing.run_distributed` (no change
to the script), it wakes ten times a second and writes the rank's page (:mod:`unidist.hangs.page`):

* the sequence number of every process group (torch counts each collective a rank *issues* on a
  group: unidist's, torch's own, DDP's gradient buckets and FSDP's gathers alike, in C++, so the
  training thread pays nothing per collective);
* the steps the rank counted: :class:`unidist.ResumableState`'s steps (:func:`step`), or, in a
  script without one, the batches unidist's loaders hand out (:func:`batch`); a counter, tens
  of nanoseconds, never both (a loop with a loader and a state counts each step once);
* what the main thread is doing, from its Python stack (read in one C call): in its own code
  (and the innermost frame of it: file, line, function), in a collective (which one), in autograd's
  backward, or waiting for the DataLoader; and whether it moved since the last look: its
  innermost frame changed, or it ran its own Python code at all (:class:`_Nudge`: a loop that
  iterates, even on one line), or unidist's checkpoint writer wrote another chunk
  (:func:`moved`: a save that writes is progress, even while the main thread waits in an object
  store's client);
* how many looks found it in each of those phases, for the straggler report.

A look holds the groups for microseconds, and never while unidist destroys them (a group whose
last reference this thread dropped late would outlive its teardown: see
:class:`unidist.session.state.GroupGuard`). A script that calls
``dist.destroy_process_group`` itself and at once starts a new group on the same
``MASTER_PORT`` is not covered by that guard; a group that :func:`unidist.initialize` started
and :func:`unidist.finalize` ends is.

It also answers the launcher's request for a dump of every thread's stack (to stderr, the rank's
log). The thread needs the GIL for about 0.05 ms per look (40 frames deep; reading the stack,
11 us of it, see :class:`_StackReader`); a main thread stuck in C code that holds the GIL stops
the looks, which the launcher sees as a beat that stands still.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import itertools
import operator
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from unidist.hangs.page import State, Writer
from unidist.session import state as _state

__all__ = ["TICK", "PageWriter", "batch", "finish", "moved", "start", "step"]

#: Seconds between two looks.
TICK = 0.1
#: How long :meth:`PageWriter.stop` waits for the thread to end.
STOP_SECONDS = 30.0
_MAX_FRAMES = 256

_steps = 0
_step_at = 0
_batches = 0
_batch_at = 0
_moved = 0
_current: PageWriter | None = None


def step() -> None:
    """Count one step of this rank (:meth:`unidist.ResumableState.step`)."""
    global _steps, _step_at
    _steps += 1
    _step_at = time.monotonic_ns()


def batch() -> None:
    """Count one batch a unidist loader handed to the loop: the rank's steps, unless a
    :func:`step` counts them (from its first step on, batches are not steps)."""
    global _batches, _batch_at
    _batches += 1
    _batch_at = time.monotonic_ns()


def moved() -> None:
    """The rank did a piece of work that shows no collective and no step (a chunk of a
    checkpoint written): counted as motion at the next look."""
    global _moved
    _moved += 1


def _step_count() -> tuple[int, int]:
    """(steps, when the last was counted): the state's steps, or else the loaders' batches."""
    return (_steps, _step_at) if _steps else (_batches, _batch_at)


def start(path: str | os.PathLike[str]) -> PageWriter | None:
    """Start this process's sampler writing to ``path`` (once; None if it cannot)."""
    global _current
    if _current is not None:
        return _current
    try:
        sampler = PageWriter(Writer(path))
    except OSError:
        return None
    sampler.start()
    _current = sampler
    return sampler


def finish() -> None:
    """The script returned: say so in the record and stop the sampler."""
    global _current
    sampler, _current = _current, None
    if sampler is not None:
        sampler.stop(done=True)


def failed(exc: BaseException) -> None:
    """The script ended with ``exc``: record where it stood when it raised, and stop sampling.

    A rank whose collective fails the moment a peer's sockets close (gloo) may never have
    been sampled inside it; the exception's own frames say which collective it was in, so the
    launcher's report can name it ("rank 0 still waited for it in all_reduce #6").
    """
    global _current
    sampler, _current = _current, None
    if sampler is None or not sampler.stop():
        return  # a thread that did not end still writes the record: it stays its one writer
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return
    with contextlib.suppress(Exception):  # the record is best effort; the error file is not
        state, op, user, where, _ = classify(tb.tb_frame, sampler._places)
        if state is State.COLLECTIVE:
            world, total = _sequences() or (0, 0)
            sampler.writer.values.update(
                state=int(state),
                op=op,
                frame=user,
                where=where,
                beat=time.monotonic_ns(),
                world_seq=world or sampler.writer.values["world_seq"],
                all_seq=total or sampler.writer.values["all_seq"],
            )
            sampler.writer.flush()


class _Places:
    """Where code lives: torch's and unidist's folders, the standard library, site-packages."""

    def __init__(self) -> None:
        paths = sysconfig.get_paths()
        self.stdlib = tuple({paths["stdlib"], paths["platstdlib"]})
        # Folders as imported, not resolved: code objects carry the path their module was
        # imported by, so a virtual environment or a checkout reached through a symlink would
        # never match its resolved form.
        self.unidist = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        self.torch: str | None = None

    def torch_dir(self) -> str | None:
        if self.torch is None:
            module = sys.modules.get("torch")
            origin = getattr(module, "__file__", None)
            if origin:
                self.torch = os.path.dirname(os.path.abspath(origin)) + os.sep
        return self.torch

    def is_library(self, filename: str) -> bool:
        return (
            filename.startswith("<")
            or filename.startswith(self.unidist)
            or "site-packages" in filename
            or "dist-packages" in filename
            or filename.startswith(self.stdlib)
        )


_COMM_FILES = ("communicator.py", "control.py", "link.py", "listen.py", "transport.py", "wire.py")
#: unidist's files (under ``unidist/``) where a rank waits on the others: the public collectives
#: and barriers, and the session's communicator and control store beneath them.
_UNIDIST_WAITS = tuple(
    os.path.join(*parts)
    for parts in (
        ("collectives", "__init__.py"),
        ("collectives", "sync.py"),
        *(("session", name) for name in _COMM_FILES),
    )
)


#: One frame of a stack: (file, line, function).
Entry = tuple[str, int, str]


def entries_of(frame: FrameType | None) -> list[Entry]:
    """The stack from ``frame`` outwards, innermost first.

    Only for frames of the calling thread (a traceback's, a test's own): walking ``f_back`` of
    another running thread's frames can crash CPython 3.11 (see :class:`_StackReader`).
    """
    entries: list[Entry] = []
    while frame is not None and len(entries) < _MAX_FRAMES:
        entries.append((frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name))
        frame = frame.f_back
    return entries


def classify(frame: FrameType | None, places: _Places) -> tuple[State, str, str, str, Any]:
    """:func:`classify_stack` of the stack from ``frame`` (a frame of the calling thread)."""
    return classify_stack(entries_of(frame), places)


def classify_stack(stack: Sequence[Entry], places: _Places) -> tuple[State, str, str, str, Any]:
    """(state, collective, innermost user frame, innermost frame, a key of where it stands).

    ``stack``: the frames, innermost first.
    """
    if not stack:
        return State.UNKNOWN, "", "", "", None
    torch_dir = places.torch_dir()
    state, op = State.USER, ""
    for name, _, function in reversed(stack):  # outermost first: the function the script called
        if torch_dir is not None and name.startswith(torch_dir):
            rest = name[len(torch_dir) :]
            if rest.startswith(os.path.join("distributed", "distributed_c10d.py")):
                state, op = State.COLLECTIVE, function
                break
            if rest.startswith(os.path.join("utils", "data", "dataloader.py")):
                state = State.DATA
                break
            if rest.startswith("autograd" + os.sep) and function == "backward":
                state = State.BACKWARD
                break
        elif name.startswith(places.unidist) and name[len(places.unidist) :].startswith(
            _UNIDIST_WAITS
        ):
            state, op = State.COLLECTIVE, function
            break
    inner = stack[0]
    user = next((entry for entry in stack if not places.is_library(entry[0])), inner)
    key = (inner[0], inner[1], user[0], user[1])
    return state, op, _show(user), _show(inner), key


class _Nudge:
    """Whether the main thread has run Python code since the last look.

    A loop on one line keeps the frame's line, and the interpreter hands the GIL over at the
    same instruction of each turn, so the stack looks the same at every look. What tells a loop
    that iterates from a thread blocked in one call (a sleep, a lock, a C library spinning) is
    that the first runs bytecode: each look queues a pending call (``Py_AddPendingCall``, which
    needs no GIL and runs on the main thread only, between two instructions of Python code), and
    the next look sees whether it ran. One call is queued at a time; a thread in C code runs
    none until it comes back. Without ``ctypes.pythonapi`` (not CPython) it never answers.
    """

    def __init__(self) -> None:
        self.answered = 0
        self._waiting = False
        self._add: Any = None
        with contextlib.suppress(Exception):
            import ctypes

            add = ctypes.pythonapi.Py_AddPendingCall
            add.argtypes = [_PENDING, ctypes.c_void_p]
            add.restype = ctypes.c_int
            self._add = add
        _NUDGES.append(self)

    def ask(self) -> None:
        """Queue the next pending call, unless one is still waiting to run."""
        if self._add is not None and not self._waiting:
            self._waiting = True
            if self._add(_ANSWER, None) != 0:  # the queue is full (a blocked main thread)
                self._waiting = False

    def ran(self) -> None:
        """The pending call (on the main thread)."""
        self.answered += 1
        self._waiting = False


def _answer(_: Any) -> int:
    for nudge in _NUDGES:
        nudge.ran()
    return 0


#: The nudges of this process (one per sampler; a pending call answers them all).
_NUDGES: list[_Nudge] = []
_PENDING: Any = None
_ANSWER: Any = None
with contextlib.suppress(Exception):  # not CPython: nudges never answer
    import ctypes as _ctypes

    _PENDING = _ctypes.CFUNCTYPE(_ctypes.c_int, _ctypes.c_void_p)
    # Kept for the process's life: a pending call may run after every sampler stopped.
    _ANSWER = _PENDING(_answer)


class _StackReader:
    """The Python stack of the thread that made it, read from another thread in one C call.

    Three ways to read another thread's stack can each kill or hang a CPython 3.11 process:

    * walking ``f_back`` from Python, frame by frame, lets the owner run between two steps and
      pop the frames being walked (cpython#111363; the same crash in the sampling profilers of
      sentry-python, #2386 and #6119, and ddtrace, #13567);
    * ``faulthandler.dump_traceback(all_threads=True)`` walks the interpreter's list of thread
      states without its lock, and CPython 3.11 puts a new state at the head of that list
      before it fills it in: gloo's threads make and free one for each collective they
      finish, and the dump can read one half made (SIGSEGV);
    * ``sys._current_frames()`` holds that lock while it allocates, and a garbage collection
      that frees a thread-local inside it waits for the lock again (cpython#106883, a
      deadlock; not fixed in 3.11).

    So the thread to be read makes its reader (in the sampler's case the main thread, as it
    starts the sampler), which keeps that thread's state, and a look asks for its innermost
    frame (``PyThreadState_GetFrame``: no list, no lock) and walks outwards in one C call:
    ``list``, ``map``, ``itertools``, ``getattr``, ctypes' calls of the C API and the
    collector's switches run no Python code and raise no audit event (a Python audit hook
    would run), so the owner cannot take the GIL in between and every frame stays where it was.
    The collector is off during that call, and on again at its end if it was on: CPython 3.11
    collects inside an allocation (``f_back`` allocates the frame objects it hands out, the
    walk its tuples), and a collection whose finalizers run Python code lets the owner run
    mid-walk. A walk that reads ``f_code`` (an audit event's tuple per frame) or leaves the
    collector on lets the owner in: SIGSEGV in ``PyFrame_GetBack``, or a freed object handed out
    as a frame.
    Reading the switch, turning it off, walking and turning it back on happen in that same
    call, so a script that turns the collector off or on meanwhile is never overruled.
    A look costs about 11 us (40 frames deep) where faulthandler's dump cost 0.33 ms.

    The thread must outlive its reader's looks (the main thread outlives the sampler, which
    stops at the interpreter's exit hook). Without ``ctypes.pythonapi`` (not CPython), or while
    a free-threaded build runs without its GIL (nothing then keeps the owner out of the walk),
    every look finds no frames.
    """

    def __init__(self) -> None:
        self.ident = threading.get_ident()
        self.offset = -1  # the innermost frame's instruction at the last look (-1: none)
        self._frame_of: Any = None
        self._code_of: Any = None
        self._state: Any = None
        with contextlib.suppress(Exception):  # not CPython: no looks
            import ctypes

            # Functions of their own (pythonapi's stay untouched) that hold the GIL.
            api = ctypes.pythonapi
            this_state = ctypes.PYFUNCTYPE(ctypes.c_void_p)(("PyThreadState_Get", api))
            frame_of = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p)(
                ("PyThreadState_GetFrame", api)
            )
            # Not frame.f_code: reading it raises an audit event, and a Python audit hook
            # would run inside the walk.
            code_of = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(
                ("PyFrame_GetCode", api)
            )
            self._state, self._frame_of, self._code_of = this_state(), frame_of, code_of

    def stack(self) -> list[Entry]:
        """The thread's frames, innermost first (empty if it has none, or none can be read).

        Also sets :attr:`offset`: the innermost frame's instruction (``f_lasti``), which moves
        while a loop iterates on one line and stands while the thread waits in one call.
        """
        self.offset = -1
        if self._frame_of is None:
            return []
        enabled: list[bool] = []
        gil: list[bool] = []
        try:
            # The one C call (see the class's docstring). It yields None for each switch and
            # (code, line) for each frame: the collector's switch read, the collector off,
            # whether the GIL is on, the walk (only then), the collector on if it was.
            done = list(
                itertools.chain(
                    map(enabled.append, map(_CALL, (gc.isenabled,))),
                    map(_CALL, (gc.disable,)),
                    map(gil.append, map(_CALL, (_GIL_ENABLED,))),
                    itertools.chain.from_iterable(itertools.compress((self._walk(),), gil)),
                    map(_CALL, itertools.compress((gc.enable,), enabled)),  # read when reached
                )
            )
        except Exception as exc:
            if enabled == [True]:
                gc.enable()  # the call stopped between its switches
            if isinstance(exc, ValueError):  # no frame: the thread runs no Python code
                return []
            raise
        frames = list(filter(None, done))
        if frames:
            self.offset = frames[0][2]
        return [(code.co_filename, line or 0, code.co_name) for code, line, _ in frames]

    def _walk(self) -> Iterator[tuple[Any, int | None, int]]:
        """(code, line, instruction) of each frame, innermost first; nothing is read until
        it is iterated."""
        frames = itertools.takewhile(
            _IS_FRAME,
            itertools.accumulate(
                itertools.chain(
                    map(self._frame_of, (self._state,)),  # the innermost frame
                    itertools.repeat("f_back", _MAX_FRAMES - 1),
                ),
                getattr,  # each frame's caller, None past the outermost
            ),
        )
        codes, lines, offsets = itertools.tee(frames, 3)
        return zip(map(self._code_of, codes), map(_LINE, lines), map(_LASTI, offsets), strict=True)


#: A frame's line and its last instruction, read in C (neither raises an audit event).
_LINE = operator.attrgetter("f_lineno")
_LASTI = operator.attrgetter("f_lasti")
#: Whether a step of the walk found a frame (``f_back`` of the outermost one is None).
_IS_FRAME = functools.partial(operator.is_not, None)
#: Calls its argument, in C.
_CALL = operator.methodcaller("__call__")
#: Whether the GIL is on (always, but in a free-threaded build, 3.13 on, that turned it off);
#: a C callable either way (a lambda would run Python code inside the walk).
_GIL_ENABLED = getattr(sys, "_is_gil_enabled", functools.partial(bool, True))


def _show(entry: Entry) -> str:
    return f"{entry[0]}:{entry[1]} {entry[2]}"


def _sequences() -> tuple[int, int] | None:
    """(the world group's sequence number, the sum over every group): 0s before init.

    None when unidist is destroying the groups right now (see :data:`unidist.session.state.groups`):
    this thread must never hold the last reference to a group that is being destroyed.
    """
    dist = sys.modules.get("torch.distributed")
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if dist is None or c10d is None:
        return 0, 0
    if not _state.groups.try_hold():
        return None
    try:
        return _read_sequences(dist, c10d)  # its references go when it returns
    finally:
        _state.groups.release()


def _read_sequences(dist: Any, c10d: Any) -> tuple[int, int]:
    with contextlib.suppress(Exception):  # not available, not initialised, torn down meanwhile
        if not dist.is_available() or not dist.is_initialized():
            return 0, 0
        world = int(c10d._get_default_group()._get_sequence_number_for_group())
        total = 0
        for group in list(c10d._world.pg_map):
            with contextlib.suppress(Exception):
                total += int(group._get_sequence_number_for_group())
        return world, total
    return 0, 0


class PageWriter(threading.Thread):
    """The thread (see the module's docstring)."""

    def __init__(self, writer: Writer, tick: float = TICK) -> None:
        super().__init__(name="unidist-progress", daemon=True)
        self.writer = writer
        self.tick = tick
        self._reader = _StackReader()  # of the thread that makes the sampler: the main one
        self.main = self._reader.ident
        self._halt = threading.Event()
        self._places = _Places()
        self._key: Any = None
        self._moves = 0  # looks that found the main thread moved on in its own code
        self._nudge = _Nudge()
        self._answered = 0
        self._samples = {State.USER: 0, State.COLLECTIVE: 0, State.DATA: 0, State.BACKWARD: 0}
        self.writer.values["main_thread"] = self.main

    def start(self) -> None:
        super().start()
        # The interpreter's end must never find the thread running: inside torch's
        # _get_sequence_number_for_group (which releases the GIL) at finalization, CPython
        # ends it with pthread_exit, whose unwinding through pybind11's noexcept GIL guard
        # calls std::terminate (the rank dies of SIGABRT, "terminate called without an active
        # exception", after its work is done); and while the exit handlers run, it must not
        # hold a group that unidist's exit handler destroys. threading's own exit hook runs
        # first, once the main thread has returned, before any atexit handler; the record
        # stays as the last look left it (the launcher's bootstrap has recorded a normal end).
        with contextlib.suppress(AttributeError, RuntimeError):  # not CPython, or exiting
            threading._register_atexit(self.stop)  # type: ignore[attr-defined]

    def run(self) -> None:
        while not self._halt.is_set():
            with contextlib.suppress(Exception):  # a look must never end the rank
                self.look()
            self._halt.wait(self.tick)

    def look(self) -> None:
        values = self.writer.values
        now = time.monotonic_ns()
        state, op, user, where, place = classify_stack(self._reader.stack(), self._places)
        key = (place, self._reader.offset)
        # The innermost frame is the script's own (not a library's, not a C call's caller in
        # one: a loop that polls through a library's wait is not the script's loop).
        in_own_code = place is not None and not self._places.is_library(place[0])
        if state in self._samples:
            self._samples[state] += 1
        ran = self._nudge.answered != self._answered  # Python code ran since the last look
        self._answered = self._nudge.answered
        if key != self._key:
            values["state_at"] = now
            if state is State.USER and self._key is not None:
                self._moves += 1
            self._key = key
        elif ran and state is State.USER and in_own_code:
            self._moves += 1  # in the script's own frame, and it runs: a loop that iterates
            values["state_at"] = now
        self._nudge.ask()
        steps, step_at = _step_count()
        # Never into torch's GIL-releasing calls once asked to stop (see start()).
        sequences = None if self._halt.is_set() else _sequences()
        if sequences is not None:  # else the groups are being destroyed: keep the last numbers
            values.update(world_seq=sequences[0], all_seq=sequences[1])
        values.update(
            beat=now,
            ticks=int(values["ticks"]) + 1,
            motion=self._moves + _moved,
            steps=steps,
            step_at=step_at,
            state=int(state),
            op=op,
            frame=user,
            where=where,
            user_samples=self._samples[State.USER],
            comm_samples=self._samples[State.COLLECTIVE],
            data_samples=self._samples[State.DATA],
            backward_samples=self._samples[State.BACKWARD],
        )
        asked = self.writer.request()
        if asked > int(values["answered"]):
            dump_stacks("the launcher asked")
            values["answered"] = asked
        self.writer.flush()

    def stop(self, done: bool = False) -> bool:
        """Stop the thread; with ``done``, record that the script returned. Returns whether
        the thread has ended (only then may another thread write the record)."""
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            # A look takes a millisecond; the bound covers a thread starved of the GIL and
            # the CPU on a loaded machine, which must still be out of torch's calls before
            # the interpreter ends (see start()).
            self.join(timeout=STOP_SECONDS)
        ended = not self.is_alive() or threading.current_thread() is self
        if done and ended:
            with contextlib.suppress(Exception):
                self.writer.values.update(state=int(State.DONE), beat=time.monotonic_ns())
                steps, step_at = _step_count()
                self.writer.values.update(steps=steps, step_at=step_at)
                self.writer.flush()
        return ended


def dump_stacks(why: str) -> None:
    """Every thread's Python stack to stderr (the rank's log), as faulthandler writes them.

    faulthandler reads the stacks in C; a line before them names the threads. It walks the
    thread states without their lock (see :class:`_StackReader`), which a look ten times a
    second must not, and a dump the launcher asks for once may.
    """
    names = ", ".join(f'{t.ident:#018x} "{t.name}"' for t in threading.enumerate())
    with contextlib.suppress(Exception):
        sys.stderr.write(
            f"unidist: stacks of every thread of rank process {os.getpid()} ({why}); "
            f"threads: {names}\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
