"""A rank's progress record: written whole by its sampler, read whole by its launcher."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from unidist.hangs import page as record
from unidist.hangs.page import State, Writer


def test_what_is_written_is_read_back(tmp_path: Path) -> None:
    path = record.path_for(tmp_path, 3, start=1)
    assert path.name == "progress-s1-r3.bin"
    writer = Writer(path)
    writer.values.update(steps=7, world_seq=12, all_seq=20, motion=2, state=int(State.USER))
    writer.values.update(op="all_reduce", frame="/x/train.py:57 slow_step", where="w")
    writer.flush()
    snap = record.read(path)
    assert snap is not None
    assert (snap.pid, snap.steps, snap.world_seq, snap.state) == (os.getpid(), 7, 12, State.USER)
    assert (snap.op, snap.frame, snap.where) == ("all_reduce", "/x/train.py:57 slow_step", "w")
    assert snap.progress == (20, 7, 2)
    assert path.stat().st_mode & 0o777 == 0o600
    writer.close()


def test_texts_are_bounded_and_garbage_is_no_record(tmp_path: Path) -> None:
    writer = Writer(tmp_path / "r.bin")
    writer.values["frame"] = "x" * 10_000
    writer.flush()
    snap = record.read(tmp_path / "r.bin")
    assert snap is not None
    assert len(snap.frame) == 256
    (tmp_path / "junk.bin").write_bytes(os.urandom(8192))
    assert record.read(tmp_path / "junk.bin") is None  # no magic: not a record
    assert record.read(tmp_path / "missing.bin") is None
    (tmp_path / "short.bin").write_bytes(b"\0" * 10)
    assert record.read(tmp_path / "short.bin") is None


def test_a_reader_never_sees_half_a_write(tmp_path: Path) -> None:
    writer = Writer(tmp_path / "r.bin")
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            writer.values.update(steps=n, world_seq=n, all_seq=n, motion=n)
            writer.flush()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        seen = 0
        while seen < 300:
            snap = record.read(tmp_path / "r.bin")
            if snap is not None and snap.steps:
                assert snap.steps == snap.world_seq == snap.all_seq == snap.motion
                seen += 1
    finally:
        stop.set()
        thread.join()


def test_the_launcher_asks_and_the_writer_sees_it(tmp_path: Path) -> None:
    writer = Writer(tmp_path / "r.bin")
    writer.flush()
    assert writer.request() == 0
    assert record.ask_for_stacks(tmp_path / "r.bin") == 1
    assert record.ask_for_stacks(tmp_path / "r.bin") == 2
    writer.values["answered"] = 2
    writer.flush()  # the request field is the launcher's: a flush leaves it alone
    snap = record.read(tmp_path / "r.bin")
    assert snap is not None
    assert (snap.request, snap.answered) == (2, 2)
