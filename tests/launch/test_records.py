"""A rank's records on a full disk: its error file goes into the room it kept at start."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest

from unidist.launch import records
from unidist.launch.rank.runtime import record_done
from unidist.launch.supervise.excerpts import storage_problem

IDENTITY = {"rank": 1, "pid": 4242, "host": "here"}


@pytest.fixture
def events(tiny_disk: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A rank's variables, its records on the tiny disk (start 0, rank 1)."""
    folder = tiny_disk / ".events"
    folder.mkdir()
    monkeypatch.setenv(records.EVENTS, str(folder))
    monkeypatch.setenv(records.START, "0")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv(records.ERROR_FILE, str(records.error_file(folder, 0, 1)))
    return folder


def fill(disk: Path) -> None:
    """Write until the disk is full, as a flooding log does."""
    full = pytest.raises(OSError, match="No space left on device")
    with (disk / "flood.log").open("wb", buffering=0) as log, full:
        while True:
            log.write(b"x" * 4096)


def fail(message: str) -> None:
    try:
        raise OSError(errno.ENOSPC, message)
    except OSError as exc:
        records.write_error(IDENTITY, exc, "raised", "Traceback (most recent call last):\n" * 400)


def test_a_rank_that_filled_the_disk_still_says_why_it_failed(events: Path) -> None:
    records.reserve()
    fill(events.parent)
    fail("No space left on device")
    found = records.read(events, 0)
    error = found[("error", 1)]
    assert (error["kind"], error["type"]) == ("raised", "OSError")
    assert "No space left on device" in error["message"]
    assert error["traceback"].endswith("Traceback (most recent call last):\n")  # its tail
    assert not list(events.glob(".*")), "the room and no temporary file are left"
    # The room became the record: the disk is as full as before, its cause still visible.
    assert storage_problem(events) == "No space left on device (ENOSPC)"


def test_torchs_agent_reads_the_record_written_into_the_room(events: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    records.reserve()
    fill(events.parent)
    fail("No space left on device")
    failure = ProcessFailure(
        local_rank=1, pid=4242, exitcode=1, error_file=os.environ[records.ERROR_FILE]
    )
    assert failure.message["message"] == "OSError: [Errno 28] No space left on device"
    assert failure.timestamp > 0


def test_a_message_longer_than_the_room_is_cut_to_fit(events: Path) -> None:
    records.reserve()
    fill(events.parent)
    fail("é" * (4 * records.RESERVE_BYTES))  # escaped in JSON: six bytes a character
    path = Path(os.environ[records.ERROR_FILE])
    assert path.stat().st_size == records.RESERVE_BYTES
    loaded = json.loads(path.read_text())
    assert loaded["message"]["message"].startswith("OSError: [Errno 28] ééé")
    assert records.read(events, 0)[("error", 1)]["type"] == "OSError"


def test_without_room_a_full_disk_loses_the_record_and_raises_nothing(events: Path) -> None:
    fill(events.parent)
    fail("No space left on device")
    assert records.read(events, 0) == {}
    assert not list(events.iterdir()), "no temporary file is left"
    records.write("done", IDENTITY, {})  # nor does any other record raise
    assert records.read(events, 0) == {}


def test_a_rank_gives_its_room_back_when_it_finishes_or_fails_normally(events: Path) -> None:
    records.reserve()
    room = events / f".{Path(os.environ[records.ERROR_FILE]).name}.reserve"
    assert room.stat().st_size == records.RESERVE_BYTES
    record_done()
    assert not room.exists()
    assert ("done", 1) in records.read(events, 0)
    records.reserve()
    fail("a normal failure")
    assert not room.exists()
    assert "a normal failure" in records.read(events, 0)[("error", 1)]["message"]


def test_the_launcher_removes_the_rooms_its_killed_ranks_kept(events: Path) -> None:
    records.reserve()
    kept = [events / ".error-s0-r1.json.reserve", events / ".error-s0-r0.json.reserve"]
    kept[1].write_bytes(b" ")
    (events / "start-s0-r1.json").write_text("{}")
    records.release_left(events)
    assert [p.name for p in events.iterdir()] == ["start-s0-r1.json"]


@pytest.fixture
def relayed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Rank 1 of a node of two (start 3) in a job whose launchers talk through a relay."""
    monkeypatch.setenv(records.EVENTS, str(tmp_path))
    monkeypatch.setenv(records.START, "3")
    monkeypatch.setenv(records.AWAIT_LEAVE, "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(records, "AWAIT_LEAVE_SECONDS", 60.0)
    return tmp_path


def test_a_rank_that_finishes_before_the_others_of_its_node_leaves_at_once(
    relayed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (relayed / "done-s2-r0.json").write_text("{}")  # another start's record does not count
    record_done()  # waiting would mean 60 s for a launcher that never leaves, then a message
    assert ("done", 1) in records.read(relayed, 3)
    assert capsys.readouterr().err == ""


def test_the_last_rank_of_a_node_exits_only_after_its_launcher_left_the_round(
    relayed: Path,
) -> None:
    (relayed / "done-s3-r0.json").write_text("{}")
    marker = threading.Timer(0.3, records.mark_left, (relayed, 3))
    marker.start()
    try:
        record_done()
        assert records.left(relayed, 3).exists()  # returned because the launcher had left
    finally:
        marker.cancel()


def test_a_launcher_that_never_leaves_the_round_costs_the_rank_a_deadline(
    relayed: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(records, "AWAIT_LEAVE_SECONDS", 0.2)
    (relayed / "done-s3-r0.json").write_text("{}")
    record_done()
    said = capsys.readouterr().err
    assert "rank 1 waited 0.2 s for its launcher to leave the relay's round" in said
    assert str(records.left(relayed, 3)) in said


def test_without_a_relay_a_finished_rank_waits_for_nothing(
    relayed: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(records.AWAIT_LEAVE)
    (relayed / "done-s3-r0.json").write_text("{}")
    record_done()  # every rank of the node done, and no relay: no wait, no message
    assert capsys.readouterr().err == ""
