"""The rank's sampler: where the main thread is, read from its stack, and what moved."""

from __future__ import annotations

import functools
import itertools
import linecache
import sys
import threading
import time
import types
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch.utils.data import DataLoader

import unidist
from unidist.hangs import page as record, stacks as sampler
from unidist.hangs.page import State, Writer
from unidist.hangs.stacks import (
    Entry,
    PageWriter,
    _Places,
    _StackReader,
    classify,
    classify_stack,
)


class _Read(threading.Thread):
    """A thread that makes its own stack reader first, as the sampler's main thread does."""

    def __init__(self, target, args=()) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.work, self.args = target, args
        self.reader: _StackReader | None = None
        self.ready = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        self.reader = _StackReader()
        self.ready.set()
        try:
            self.work(*self.args)
        finally:
            # The reader keeps this thread's state: the thread must outlive every look, so
            # it ends only when the test says so (finish()), however its work ended.
            self.done.wait(3600)

    def finish(self) -> None:
        self.done.set()
        self.join(30)


def _stack_of(thread: _Read) -> list[Entry]:
    """``thread``'s stack as the sampler reads it (never through another thread's frames)."""
    assert thread.ready.wait(30)
    assert thread.reader is not None
    assert not thread.done.is_set()
    return thread.reader.stack()


def _blocks(top: Entry) -> bool:
    """Whether the innermost frame stands at a line marked ``# blocks`` (the call that blocks)."""
    return "# blocks" in linecache.getline(top[0], top[1])


def _classify_while(target, blocks=_blocks) -> tuple[State, str, str]:  # type: ignore[no-untyped-def]
    """Run ``target`` in a thread; classify its stack once it stands in the call that blocks.

    ``target(started, held)`` blocks in ``held.acquire`` (a C call, so its own line is the
    innermost Python frame) until this function releases the lock: no sleep to outlast.
    """
    started, held = threading.Event(), threading.Lock()
    held.acquire()
    thread = _Read(target, (started, held))
    thread.start()
    try:
        assert started.wait(30)
        deadline = time.monotonic() + 30
        while True:
            stack = _stack_of(thread)
            if stack and blocks(stack[0]):
                break
            assert time.monotonic() < deadline, "the thread never reached its blocking call"
            time.sleep(0.01)
    finally:
        held.release()
        thread.finish()
    state, op, user, _, _ = classify_stack(stack, _Places())
    return state, op, user


def _waits(started: threading.Event, held: threading.Lock) -> None:
    started.set()
    held.acquire(timeout=60)  # blocks


def _loads(started: threading.Event, held: threading.Lock) -> None:
    class Slow(torch.utils.data.Dataset[int]):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> int:
            started.set()
            held.acquire(timeout=60)  # blocks
            return i

    next(iter(DataLoader(Slow())))


def test_user_code_and_the_dataloader_are_told_apart() -> None:
    state, op, user = _classify_while(_waits)
    assert (state, op) == (State.USER, "")
    assert user.endswith(f"test_stacks.py:{_waits.__code__.co_firstlineno + 2} _waits")
    state, _, user = _classify_while(_loads)
    assert state is State.DATA
    assert "__getitem__" in user


def test_a_collective_is_named_by_the_public_function_called(tmp_path: Path) -> None:
    # A stack that passes through unidist's collectives module, as a waiting rank's does.
    code = compile(
        "def all_reduce(started, held):\n    started.set()\n    held.acquire(timeout=60)\n",
        str(Path(unidist.__file__).parent / "collectives" / "__init__.py"),
        "exec",
    )
    scope: dict[str, object] = {}
    exec(code, scope)
    state, op, _ = _classify_while(
        scope["all_reduce"], lambda top: (top[2], top[1]) == ("all_reduce", 3)
    )
    assert (state, op) == (State.COLLECTIVE, "all_reduce")


def test_places_reached_through_a_symlink_are_still_recognised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A virtual environment or checkout reached through a symlink: code objects carry the
    # path as imported, so torch's folder must not be compared in its resolved form.
    real = tmp_path / "real" / "torch"
    (real / "autograd").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    fake = types.ModuleType("torch")
    fake.__file__ = str(link / "torch" / "__init__.py")
    monkeypatch.setitem(sys.modules, "torch", fake)
    code = compile(
        "import sys\ndef backward():\n    return sys._getframe()\n",
        str(link / "torch" / "autograd" / "__init__.py"),
        "exec",
    )
    scope: dict[str, object] = {}
    exec(code, scope)
    frame = scope["backward"]()  # type: ignore[operator]
    state, _, _, _, _ = classify(frame, _Places())
    assert state is State.BACKWARD


def test_the_thread_writes_steps_motion_and_answers_for_stacks(
    tmp_path: Path, capfd: object
) -> None:
    path = tmp_path / "r.bin"
    thread = PageWriter(Writer(path), tick=0.01)
    thread.start()
    try:
        for _ in range(5):
            sampler.step()
        deadline = time.monotonic() + 30
        snap = record.read(path)
        while (snap is None or snap.steps < 5) and time.monotonic() < deadline:
            time.sleep(0.01)
            snap = record.read(path)
        assert snap is not None
        assert snap.steps >= 5
        assert snap.main_thread == threading.main_thread().ident
        number = record.ask_for_stacks(path)
        while record.read(path).answered < number and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.01)
        assert record.read(path).answered == number  # type: ignore[union-attr]
    finally:
        thread.stop(done=True)
    assert record.read(path).state is State.DONE  # type: ignore[union-attr]
    err = capfd.readouterr().err  # type: ignore[attr-defined]
    assert "stacks of every thread" in err
    assert "MainThread" in err


def test_the_sampler_stands_back_while_unidist_destroys_the_groups() -> None:
    from unidist.session import state as _state

    guard = _state.GroupGuard()
    assert guard.try_hold()
    guard.release()
    reader_holds = threading.Event()
    let_go = threading.Event()

    def reader() -> None:
        assert guard.try_hold()
        reader_holds.set()
        let_go.wait(30)
        guard.release()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert reader_holds.wait(30)
    inside = threading.Event()

    def teardown() -> None:
        with guard.closing(seconds=30):
            inside.set()
            assert not guard.try_hold()  # a reader that comes now stands back

    closer = threading.Thread(target=teardown, daemon=True)
    closer.start()
    assert not inside.wait(0.2)  # the teardown waits for the reader that holds the groups
    let_go.set()
    assert inside.wait(30)
    closer.join(30)
    assert guard.try_hold()  # and readers come back once it is done
    guard.release()


def test_the_sampler_skips_a_look_while_the_groups_are_destroyed() -> None:
    from unidist.session import state as _state

    with _state.groups.closing(seconds=1):
        assert sampler._sequences() is None
    assert sampler._sequences() == (0, 0)  # no process group in this process


def test_another_threads_stack_is_read_in_c_innermost_first() -> None:
    started, release = threading.Event(), threading.Event()

    def waits_here() -> None:
        started.set()
        release.wait(30)  # blocks

    thread = _Read(waits_here)
    thread.start()
    assert started.wait(30)
    try:
        deadline = time.monotonic() + 30
        while not any(function == "waits_here" for _, _, function in _stack_of(thread)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stack = _stack_of(thread)
        mine = next(i for i, entry in enumerate(stack) if entry[2] == "waits_here")
        assert stack[mine][0] == __file__
        assert "# blocks" in linecache.getline(stack[mine][0], stack[mine][1])
        assert stack[-1][2] == "_bootstrap"  # the thread's outermost frame comes last
    finally:
        release.set()
        thread.finish()


def test_the_sampler_has_stopped_before_the_exit_handlers_run(tmp_path: Path) -> None:
    # A process whose sampler nobody stopped (no finish(), no failed()): at finalization the
    # running thread could be inside torch's GIL-releasing _get_sequence_number_for_group, and
    # CPython's pthread_exit through pybind11's noexcept guard aborted the rank (torch 2.14,
    # "terminate called without an active exception"). The atexit handlers (unidist's exit
    # destroy of the groups among them) and finalization must find it stopped.
    import subprocess

    code = (
        "import atexit, sys, threading, time\n"
        "import torch.distributed as dist\n"
        "from unidist.hangs import stacks as sampler\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'init'}',"
        " rank=0, world_size=1)\n"
        "groups = [dist.new_group([0]) for _ in range(20)]\n"
        f"running = sampler.start({str(tmp_path / 'progress')!r})\n"
        "deadline = time.monotonic() + 60\n"
        "while running.writer.values['ticks'] < 3 and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)  # until it has looked (and read every group's number) 3 times\n"
        "atexit.register(lambda: print('at exit, sampler alive:', running.is_alive()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "at exit, sampler alive: False" in done.stdout, done.stdout + done.stderr


def test_reading_a_stack_survives_the_churn_that_killed_earlier_readers() -> None:
    # tests/scripts/stack_churn.py: native threads keep making thread states, the main thread
    # makes and pops frames and garbage whose finalizers run Python code, the GIL changes
    # hands every microsecond. faulthandler's dump of every thread died there of SIGSEGV
    # within a second; a first version of the one-call walk (reading f_code, the collector
    # on) within 0.4-2.5 s, by SIGSEGV or by handing out freed memory as a frame.
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "tests" / "scripts" / "stack_churn.py"), "6"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])},
    )
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-3000:]}"
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in summary, summary
    assert summary["looks"] > 0, summary
    assert summary["found"], summary
    assert summary["deepest"] >= 25, summary  # deep(25) and its callers, outermost included


def test_a_look_leaves_the_collector_as_the_script_set_it() -> None:
    # The look turns the collector off and back on within one C call: the thread it reads,
    # switching the collector itself, never finds it other than it left it.
    import gc

    was = gc.isenabled()
    stop = threading.Event()
    wrong: list[str] = []

    def switches() -> None:
        while not stop.is_set():
            gc.disable()
            if gc.isenabled():
                wrong.append("on after the script turned it off")
            gc.enable()
            if not gc.isenabled():
                wrong.append("off after the script turned it on")

    thread = _Read(switches)
    thread.start()
    try:
        looks = 0
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline or looks < 1000:
            _stack_of(thread)
            looks += 1
            assert looks < 10**7
    finally:
        stop.set()
        thread.finish()
        (gc.enable if was else gc.disable)()
    assert wrong == []
    for state in (False, True):  # a look between two of the script's switches changes none
        (gc.enable if state else gc.disable)()
        _StackReader().stack()
        assert gc.isenabled() is state
    (gc.enable if was else gc.disable)()


def test_a_look_that_fails_switches_the_collector_back_on() -> None:
    import gc

    was = gc.isenabled()
    gc.enable()
    try:
        reader = _StackReader()
        reader._frame_of, reader._state = int, "no state"  # int("no state"): a ValueError in C
        assert reader.stack() == []
        assert gc.isenabled()
        reader._state = None  # int(None): a TypeError, raised
        with pytest.raises(TypeError):
            reader.stack()
        assert gc.isenabled()
        gc.disable()  # and a collector the script turned off stays off
        reader._state = "no state"
        assert reader.stack() == []
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_without_ctypes_a_look_finds_no_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ctypes", None)  # import ctypes: ImportError
    assert _StackReader().stack() == []


def test_without_the_gil_a_look_finds_no_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    # A free-threaded build (3.13t) running without its GIL: nothing keeps the owner out of
    # the walk, so the reader reads nothing rather than frames being freed under it.
    reader = _StackReader()
    assert reader.stack()  # this thread's own frames
    monkeypatch.setattr(sampler, "_GIL_ENABLED", functools.partial(bool, False))
    assert reader.stack() == []


def test_a_look_raises_no_audit_event() -> None:
    # An audit hook written in Python would run inside the walk, where the thread being read
    # must not get the GIL (reading frame.f_code raises "object.__getattr__").
    import os
    import subprocess

    code = (
        "import sys, threading\n"
        "from unidist.hangs.stacks import _StackReader\n"
        "reader = _StackReader()\n"
        "mine, seen = set(), []\n"
        "sys.addaudithook(lambda event, args: seen.append(event)"
        " if threading.get_ident() in mine else None)\n"
        "def look():\n"
        "    mine.add(threading.get_ident())\n"
        "    stack = reader.stack()\n"
        "    mine.clear()\n"
        "    assert any(function == 'look' for _, _, function in stack) is False\n"
        "    assert stack[-1][0] == '<string>', stack\n"
        "t = threading.Thread(target=look)\n"
        "t.start(); t.join()\n"
        "print(seen)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _looks(thread: PageWriter, count: int) -> None:
    """Wait (in the main thread, blocked in C) until ``thread`` has looked ``count`` times more."""
    target = int(thread.writer.values["ticks"]) + count
    deadline = time.monotonic() + 60
    while int(thread.writer.values["ticks"]) < target:
        assert time.monotonic() < deadline, "the sampler stopped looking"
        time.sleep(0.01)


def _blocked_for_looks(thread: PageWriter, count: int) -> None:
    """Block the main thread in one call (a lock's wait, in C) until ``thread`` has looked
    ``count`` times more: a helper thread watches the looks and lets it go."""
    target = int(thread.writer.values["ticks"]) + count
    enough = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while int(thread.writer.values["ticks"]) < target and time.monotonic() < deadline:
            time.sleep(0.01)
        enough.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert enough.wait(120)
    watcher.join(60)
    assert int(thread.writer.values["ticks"]) >= target, "the sampler stopped looking"


def test_a_loop_that_iterates_on_one_line_is_motion_a_wait_on_one_line_is_not(
    tmp_path: Path,
) -> None:
    # hangs.md: a loop that iterates is progress. A loop whose whole body sits on one line
    # never changes the innermost frame's line; its instructions do.
    thread = PageWriter(Writer(tmp_path / "r.bin"), tick=0.005)
    thread.start()
    try:
        _looks(thread, 3)
        values, n = thread.writer.values, 0
        before = int(values["motion"])
        # Until the sampler has seen it move three times (a loaded machine may starve the loop
        # between two looks), or the deadline: a loop that never counts as moving fails here.
        deadline = time.monotonic() + 60
        while int(values["motion"]) - before < 3 and time.monotonic() < deadline: n += 1  # fmt: skip  # noqa: E701, E501
        assert n > 0
        assert int(values["motion"]) - before >= 3
        before = int(values["motion"])
        _blocked_for_looks(thread, 40)  # the main thread in one call that waits, in C
        assert int(values["motion"]) - before <= 2  # into the wait and out of it, at most
    finally:
        thread.stop(done=True)


def test_a_rank_whose_sampler_will_not_stop_keeps_one_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # failed() writes where the rank raised; if the sampler thread did not end within its
    # bound, it still writes the record, and two writers on a seqlock tear it.
    inside, leave = threading.Event(), threading.Event()
    thread = PageWriter(Writer(tmp_path / "r.bin"), tick=0.01)
    original = thread.look

    def stuck_look() -> None:
        original()
        inside.set()
        leave.wait(60)  # a look that takes longer than stop() waits

    thread.look = stuck_look  # type: ignore[method-assign]
    monkeypatch.setattr(sampler, "STOP_SECONDS", 0.05)
    monkeypatch.setattr(sampler, "_current", thread)
    flushes: list[str] = []
    flush = thread.writer.flush

    def counted() -> None:
        flushes.append(threading.current_thread().name)
        flush()

    thread.writer.flush = counted  # type: ignore[method-assign]
    thread.start()
    try:
        assert inside.wait(60)
        try:
            torch.distributed.all_reduce(torch.ones(1))  # raises: no process group
        except Exception as exc:  # any error a collective raises
            sampler.failed(exc)
        assert threading.current_thread().name not in flushes, flushes
    finally:
        leave.set()
        thread.join(60)


@pytest.fixture
def no_steps_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process has counted no step and no batch (other tests of it may have)."""
    for name in ("_steps", "_step_at", "_batches", "_batch_at"):
        monkeypatch.setattr(sampler, name, 0)


@pytest.mark.usefixtures("no_steps_yet")
def test_a_loop_with_a_loader_and_a_resumable_state_counts_each_step_once(
    tmp_path: Path,
) -> None:
    # The elastic guide's loop: a unidist loader and ResumableState.step() in one loop.
    loader = unidist.auto_dataloader(list(range(12)), per_rank_batch_size=2)
    state = unidist.ResumableState(tmp_path / "ck", job="j", loader=loader, stop_signals=())
    thread = PageWriter(Writer(tmp_path / "r.bin"), tick=0.01)
    thread.start()
    try:
        for _ in state.epochs(1):
            for _ in loader:
                state.step()
        _looks(thread, 2)
        assert record.read(tmp_path / "r.bin").steps == 6  # type: ignore[union-attr]
    finally:
        thread.stop(done=True)
    assert record.read(tmp_path / "r.bin").steps == 6  # type: ignore[union-attr]


@pytest.mark.usefixtures("no_steps_yet")
def test_a_loop_with_a_loader_alone_counts_its_batches(tmp_path: Path) -> None:
    loader = unidist.auto_dataloader(list(range(12)), per_rank_batch_size=4)
    thread = PageWriter(Writer(tmp_path / "r.bin"), tick=0.01)
    thread.start()
    try:
        assert len(list(loader)) == 3
        _looks(thread, 2)
        assert record.read(tmp_path / "r.bin").steps == 3  # type: ignore[union-attr]
    finally:
        thread.stop(done=True)


class _SlowStream:
    """A file whose every write waits as an object store's upload does: the whole write in one
    call (s3fs uploads a buffer's parts inside one flush), 50 ms a MiB."""

    moves_seen: ClassVar[list[int]] = []  # the rank's count of moves at each write

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def write(self, data: object) -> int:
        size = memoryview(data).nbytes  # type: ignore[arg-type]
        _SlowStream.moves_seen.append(sampler._moved)
        time.sleep(0.05 * size / (1 << 20))
        return self.inner.write(data)  # type: ignore[attr-defined, no-any-return]


def test_a_save_that_writes_for_long_is_motion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hangs.md: a save that writes is progress, though the main thread waits in one call.
    import contextlib

    from torch.distributed.checkpoint import filesystem

    original = filesystem.FileSystem.create_stream

    @contextlib.contextmanager
    def slow(self, path, mode):  # type: ignore[no-untyped-def]
        with original(self, path, mode) as stream:
            yield _SlowStream(stream) if "w" in mode else stream

    monkeypatch.setattr(filesystem.FileSystem, "create_stream", slow)
    model = torch.nn.Linear(1024, 2048)  # 8 MiB of weights
    state = unidist.ResumableState(tmp_path / "ck", job="j", model=model, stop_signals=())
    thread = PageWriter(Writer(tmp_path / "r.bin"), tick=0.01)
    thread.start()
    _SlowStream.moves_seen.clear()
    try:
        _looks(thread, 2)
        before = int(thread.writer.values["motion"])
        state.save()
        _looks(thread, 2)
        # The 8 MiB went out a MiB at a time, each MiB counted as a move once written ...
        seen = _SlowStream.moves_seen
        assert sum(b > a for a, b in itertools.pairwise(seen)) >= 7, seen
        # ... and each reached the record, beside the moves of the main thread's own frames.
        assert int(thread.writer.values["motion"]) - before >= 8
    finally:
        state.close()
        thread.stop(done=True)
