"""One run per checkpoint folder: a second run (same job or another) is refused before it writes
anything, a dead run's lock never blocks a restart, and a restart of the same elastic run waits
for its previous incarnation to let go."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from torch import nn

import unidist
from unidist.errors import CheckpointError
from unidist.testing import DistributedTestError, run_distributed

ROOT = Path(__file__).resolve().parents[2]

#: A run that holds the folder: it restores, says so, and waits for its stdin to close.
HOLDER = """
import sys
import torch, unidist
state = unidist.ResumableState(sys.argv[1], job=sys.argv[2], model=torch.nn.Linear(2, 1))
state.restore()
state.save()
print("holding", flush=True)
sys.stdin.read()
state.close()
"""


def _hold(folder: Path, job: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), job],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "holding"
    return holder


def _state(folder: Path, job: str, **kw: Any) -> unidist.ResumableState:
    return unidist.ResumableState(folder, job=job, model=nn.Linear(2, 1), stop_signals=(), **kw)


def _listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize("job", ["run-a", "run-b"])
def test_a_second_run_is_refused_by_name_before_it_writes_anything(
    tmp_path: Path, job: str
) -> None:
    holder = _hold(tmp_path, "run-a")
    try:
        before = _listing(tmp_path)
        state = _state(tmp_path, job)
        with pytest.raises(CheckpointError) as refused:
            state.restore()
        assert _listing(tmp_path) == before  # nothing written, nothing removed
    finally:
        holder.communicate("", timeout=60)
    message = str(refused.value)
    assert f"in use by job 'run-a' (pid {holder.pid} on host {socket.gethostname()!r})" in message
    assert f"this is job {job!r}" in message
    assert "give this run a folder of its own" in message
    assert _state(tmp_path, "run-a").restore()  # the holder ended: the folder is free again


def test_a_dead_runs_lock_never_blocks_a_restart(tmp_path: Path) -> None:
    holder = _hold(tmp_path, "run-a")
    holder.send_signal(signal.SIGKILL)  # no close(), no cleanup: the kernel drops the lock
    holder.communicate(timeout=60)
    state = _state(tmp_path, "run-a")
    assert state.restore()
    state.close()


def test_a_restart_of_the_same_elastic_run_waits_for_its_earlier_start(tmp_path: Path) -> None:
    # torch's agent restarts a run under the same TORCHELASTIC_RUN_ID; rank 0 may move to a node
    # whose earlier rank 0 is still letting go. Waited for, not refused.
    holder = _hold(tmp_path, "run-a", env={"TORCHELASTIC_RUN_ID": "rdzv-7"})
    done: list[object] = []

    def restore() -> None:
        os.environ["TORCHELASTIC_RUN_ID"] = "rdzv-7"
        try:
            state = _state(tmp_path, "run-a", timeout=120)
            done.append(state.restore())
            state.close()
        except Exception as exc:  # shown by the assertion below
            done.append(exc)
        finally:
            del os.environ["TORCHELASTIC_RUN_ID"]

    waiting = threading.Thread(target=restore)
    waiting.start()
    holder.communicate("", timeout=60)  # the earlier start lets go
    waiting.join(timeout=120)
    assert done == [True]


def test_a_restart_of_another_run_id_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = _hold(tmp_path, "run-a", env={"TORCHELASTIC_RUN_ID": "rdzv-7"})
    try:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "rdzv-8")
        with pytest.raises(CheckpointError, match="in use by job 'run-a'"):
            _state(tmp_path, "run-a", timeout=300).restore()
    finally:
        holder.communicate("", timeout=60)


def test_states_of_one_process_share_the_lock(tmp_path: Path) -> None:
    first = _state(tmp_path, "run-a")
    first.restore()
    first.save()
    second = _state(tmp_path, "run-a")  # a state rebuilt in the same process: not a second run
    assert second.restore()
    second.close()
    first.close()


def _restore_on_two(folder: str) -> bool:
    return _state(Path(folder), "run-a").restore()  # the same job, a second time


@pytest.mark.multiprocess
def test_every_rank_of_a_second_run_is_refused(tmp_path: Path) -> None:
    holder = _hold(tmp_path, "run-a")
    try:
        with pytest.raises(DistributedTestError) as failed:
            run_distributed(_restore_on_two, str(tmp_path), timeout=120)
    finally:
        holder.communicate("", timeout=60)
    assert "in use by job 'run-a'" in failed.value.failures[0]
    assert "rank 0 could not use the checkpoint folder" in failed.value.failures[1]
