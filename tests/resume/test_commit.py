"""A save's last part: rank 0's commit thread and a save in flight, with the waits they promise.

``save()`` returns once the checkpoint counts, even when ``step()`` began that same save a moment
before; a save in flight is timed before anyone reads its time; a commit whose save failed lets
go of the folder it was handed.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch

import unidist
from unidist.errors import CheckpointError
from unidist.resume import _folder as files
from unidist.resume._staged import Staged


class _Folder:
    """What a commit and a save in flight do with their folder: its name, and closing it."""

    def __init__(self) -> None:
        self.path = Path("/nowhere/step-000000004")
        self.key = ("test", 1)
        self.closed = 0

    def close(self) -> None:
        self.closed += 1

    def __enter__(self) -> _Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_a_save_in_flight_is_timed_before_its_waiter_wakes() -> None:
    # Future.set_result wakes result() waiters before it runs the done-callbacks; one that
    # was added first (torch adds its own) and takes a while keeps the timing from arriving.
    future: Future[Any] = Future()
    gate = threading.Event()
    future.add_done_callback(lambda _: gate.wait(60))
    staged = Staged(future, _Folder(), started=0.0)  # type: ignore[arg-type]
    finisher = threading.Thread(target=future.set_result, args=(None,))
    finisher.start()
    try:
        staged.wait()
        assert staged.seconds is not None
        assert staged.seconds > 0
    finally:
        gate.set()
        finisher.join(60)


def test_a_commit_whose_save_failed_closes_the_folder_it_was_handed() -> None:
    future: Future[Any] = Future()
    future.set_exception(OSError(28, "No space left on device"))
    handed = _Folder()
    staged = Staged(future, _Folder(), started=0.0)  # type: ignore[arg-type]
    commit = files.Commit()
    commit.start(_Folder(), handed, {}, {}, keep=2, after=staged)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="No space left on device"):
        commit.join()
    assert handed.closed == 1


def _model() -> torch.nn.Linear:
    return torch.nn.Linear(2, 1)


def test_save_right_after_a_due_step_save_waits_until_it_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    write = files.write_record

    def slow_pointer(folder: Any, name: str, value: dict[str, Any], **kw: Any) -> None:
        if name == files.LATEST:
            entered.set()
            release.wait(60)  # the pointer is being written: the checkpoint does not count yet
        write(folder, name, value, **kw)

    monkeypatch.setattr(files, "write_record", slow_pointer)
    state = unidist.ResumableState(tmp_path, job="j", model=_model(), save_every=2)
    state.restore()
    state.step()
    state.step()  # due: saved, and rank 0's commit goes on in the background
    assert entered.wait(60)
    returned = threading.Event()
    saver = threading.Thread(target=lambda: (state.save(), returned.set()))
    saver.start()
    try:
        assert not returned.wait(0.5)  # "returns once the checkpoint counts": not before
        assert files.latest(state._root, "j") == -1  # type: ignore[arg-type]
        release.set()
        assert returned.wait(60)
        assert files.latest(state._root, "j") == 2  # type: ignore[arg-type]
    finally:
        release.set()
        saver.join(60)
        state.close()


def test_save_right_after_a_due_step_save_raises_what_its_commit_failed_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = files.write_record

    def full_disk(folder: Any, name: str, value: dict[str, Any], **kw: Any) -> None:
        if name == files.LATEST:
            raise OSError(28, "No space left on device")
        write(folder, name, value, **kw)

    monkeypatch.setattr(files, "write_record", full_disk)
    state = unidist.ResumableState(tmp_path, job="j", model=_model(), save_every=2)
    state.restore()
    state.step()
    state.step()  # due: saved; its commit fails in the background
    try:
        with pytest.raises(CheckpointError, match="No space left on device"):
            state.save()
        monkeypatch.setattr(files, "write_record", write)
        assert state.save() == state.root / files.step_name(2)  # saved again, and it counts
        assert files.latest(state._root, "j") == 2  # type: ignore[arg-type]
    finally:
        state.close()


def _commit_fails_then_saves_again(folder: str) -> list[str]:
    """Rank 0's commit of the step-2 save fails; save() then raises on every rank (a
    collective), and a second save() of the same step writes it on every rank again."""
    import unidist
    from unidist.resume import _folder as files

    write = files.write_record
    broken = [True]

    def full_disk(where: Any, name: str, value: dict[str, Any], **kw: Any) -> None:
        if name == files.LATEST and broken[0]:
            raise OSError(28, "No space left on device")
        write(where, name, value, **kw)

    files.write_record = full_disk  # type: ignore[assignment]
    said = []
    state = unidist.ResumableState(folder, job="j", model=torch.nn.Linear(2, 1), save_every=2)
    state.restore()
    state.step()
    state.step()  # due: every rank's files are written; rank 0's commit fails behind them
    try:
        state.save()
    except CheckpointError as exc:
        said.append(str(exc))
    broken[0] = False
    said.append(str(state.save()))
    state.close()
    return said


@pytest.mark.multiprocess
def test_a_failed_commit_is_every_ranks_error_and_the_step_is_saved_again(
    tmp_path: Path,
) -> None:
    from unidist.testing import run_distributed

    said = run_distributed(_commit_fails_then_saves_again, str(tmp_path), timeout=120)
    assert "No space left on device" in said[0][0]
    assert "failed on another rank" in said[1][0]
    assert [s[1] for s in said] == [str(tmp_path / files.step_name(2))] * 2
    assert json.loads((tmp_path / files.LATEST).read_text())["step"] == 2
