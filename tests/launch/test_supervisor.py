"""The supervisor's loop driven by events, one at a time, on this test's thread: each event's
transitions (ranks' states, signals sent, reports kept), with processes of the test's own.

The supervisor is the only owner of what the launcher knows of its ranks; these tests call its
``handle`` directly (no thread), as its loop does with what the exit clock, the relay and the
main thread post.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._waiting import wait_for
from unidist.launch import records
from unidist.launch.plan import rundir
from unidist.launch.plan.job import LaunchPlan
from unidist.launch.supervise.events import Culprit, Exited, Finish, Forward, HangFlag, Tick
from unidist.launch.supervise.hang import HangWatch
from unidist.launch.supervise.notices import Failure
from unidist.launch.supervise.procs import Proc, Processes
from unidist.launch.supervise.runner import Run
from unidist.launch.supervise.supervisor import Supervisor
from unidist.launch.supervise.watch import RankState

PIDS = {0: 4_000_001, 1: 4_000_002}  # no such processes: the test's fakes stand for them


class FakeProcesses(Processes):
    """Processes as the test says they are; every signal is recorded, none is sent."""

    def __init__(self) -> None:
        self.exits: dict[int, int] = {}  # pid -> exit status, once it exited
        self.sent: list[tuple[int, str]] = []
        self.stacks: list[int] = []

    def verify(self, pid: int) -> Proc | None:
        return Proc(pid, 1) if pid in PIDS.values() else None

    def status(self, proc: Proc) -> tuple[bool, int | None]:
        return (False, self.exits[proc.pid]) if proc.pid in self.exits else (True, None)

    def frozen(self, proc: Proc) -> bool:
        return False

    def signal_group(self, proc: Proc, sig: int) -> None:
        self.sent.append((proc.pid, signal.Signals(sig).name))

    def ask_for_stack(self, proc: Proc) -> None:
        self.stacks.append(proc.pid)


def _job(tmp_path: Path, **plan: Any) -> tuple[Run, Supervisor, FakeProcesses]:
    folder = rundir.create_run_folder(tmp_path)
    run = Run(LaunchPlan(target="job.py", nproc=2, log_root=tmp_path, **plan), folder)
    (run.io_folder / ".events").mkdir(mode=0o700)
    env = {"WORLD_SIZE": "2", "GROUP_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    run.begin({local: {"RANK": str(local), **env} for local in (0, 1)})
    for rank, pid in PIDS.items():
        _record(run, "start", rank, pid=pid, host="node-a")
    fake = FakeProcesses()
    return run, Supervisor(run, None, processes=fake), fake


def _record(run: Run, what: str, rank: int, **values: object) -> None:
    body = {"rank": rank, "pid": PIDS[rank], "time_ns": time.time_ns(), "start": 0, **values}
    (run.events / f"{what}-s0-r{rank}.json").write_text(json.dumps(body))


def _raised(run: Run, rank: int) -> None:
    """Rank ``rank``'s error file, as its bootstrap writes it (torch's format)."""
    ours = {"rank": rank, "pid": PIDS[rank], "kind": "raised", "type": "ValueError"}
    ours["time_ns"] = time.time_ns()
    extra = {"py_callstack": "", "timestamp": str(time.time_ns() // 10**9), "unidist": ours}
    body = {"message": {"message": "ValueError: broken", "extraInfo": extra}}
    records.error_file(run.events, 0, rank).write_text(json.dumps(body))


def _states(supervisor: Supervisor) -> dict[int, RankState]:
    return {rank: watch.state for rank, watch in sorted(supervisor.seen.ranks.items())}


def test_a_rank_that_fails_stops_the_survivor_and_the_finish_sweeps_both(tmp_path: Path) -> None:
    run, supervisor, fake = _job(tmp_path)
    assert supervisor.handle(Tick())
    assert _states(supervisor) == {0: RankState.RUNNING, 1: RankState.RUNNING}
    assert fake.sent == []
    # Rank 1 raises: its error record, its exit status, and the exit clock's stamp.
    _raised(run, 1)
    fake.exits[PIDS[1]] = 1
    stamp = time.time_ns()  # the clock's stamp comes before the supervisor sees the exit
    assert supervisor.handle(Exited((0, 1), stamp))
    assert _states(supervisor) == {0: RankState.STOPPING, 1: RankState.FAILED}
    assert supervisor.seen.ranks[1].gone_at == stamp  # when it died, not when it was seen
    assert fake.sent == [(PIDS[0], "SIGTERM"), (PIDS[0], "SIGCONT")]
    fake.exits[PIDS[0]] = -signal.SIGTERM
    assert supervisor.handle(Tick())
    assert _states(supervisor) == {0: RankState.STOPPED, 1: RankState.FAILED}
    assert not supervisor.handle(Finish())  # the loop ends there
    assert sorted(fake.sent[2:]) == [(PIDS[0], "SIGKILL"), (PIDS[1], "SIGKILL")]  # the sweep


def test_another_nodes_culprit_stops_this_nodes_ranks_and_an_old_rounds_is_ignored(
    tmp_path: Path,
) -> None:
    run, supervisor, fake = _job(tmp_path)
    supervisor.handle(Tick())
    elsewhere = Failure(3, 1, 1, "node-b", "raised", "raised ValueError: x", 1, 1, "/o", "/e")
    supervisor.handle(Culprit("an earlier round", elsewhere))
    assert supervisor.seen.remote is None
    assert fake.sent == []
    supervisor.handle(Culprit(run.rounds[0], elsewhere))
    assert supervisor.seen.remote is not None
    assert (supervisor.seen.remote.rank, supervisor.seen.remote.remote) == (3, True)
    assert sorted(fake.sent) == sorted(
        [(p, s) for p in PIDS.values() for s in ("SIGTERM", "SIGCONT")]
    )
    # This node's own word, which replaced a wait published elsewhere, is not another's.
    mine = Failure(1, 1, 0, "node-a", "raised", "raised ValueError: y", 1, 2, "/o", "/e")
    supervisor.handle(Culprit(run.rounds[0], mine))
    assert supervisor.seen.remote is None


def test_a_silence_as_long_as_the_hang_timeout_calls_a_hang_once(tmp_path: Path) -> None:
    run, supervisor, fake = _job(tmp_path, hang_timeout=5.0)
    now = [100.0]
    supervisor.hang = HangWatch(run.events, 5.0, clock=lambda: now[0])
    supervisor.handle(Tick())
    assert run.hangs == {}
    now[0] += 6.0  # nothing moved: no progress record changed, no rank came or went
    supervisor.handle(Tick())
    report = run.hangs[0]
    assert report.called_by is None
    assert report.headline().startswith("unidist launch: no rank made progress for 6 s")
    assert sorted(fake.stacks) == sorted(PIDS.values())  # no sampler answered: the signal
    assert json.loads((run.io_folder / "hang.json").read_text())["verdict"] == report.verdict
    assert _states(supervisor) == {0: RankState.STOPPING, 1: RankState.STOPPING}
    supervisor.handle(Tick())
    assert len([s for s in fake.sent if s[1] == "SIGTERM"]) == 2  # stopped once


def test_a_hang_flag_from_another_node_is_reported_as_that_nodes_call(tmp_path: Path) -> None:
    # The flag stops the job (anyone who can write the store can), but the report says who
    # called it, never that this node's ranks were silent for the timeout.
    run, supervisor, _ = _job(tmp_path, hang_timeout=30.0)
    supervisor.handle(Tick())
    supervisor.handle(HangFlag("an earlier round", 1))
    assert run.hangs == {}
    supervisor.handle(HangFlag(run.rounds[0], 1))
    report = run.hangs[0]
    assert report.called_by == "1"
    headline = report.headline()
    assert headline.startswith("unidist launch: the hang was called by node 1's launcher, as its")
    assert "no rank made progress" not in headline
    supervisor.handle(HangFlag(run.rounds[0], None))  # a second flag changes nothing
    assert run.hangs[0] is report
    forged = _job(tmp_path / "forged", hang_timeout=30.0)
    forged[1].handle(Tick())
    forged[1].handle(HangFlag(forged[0].rounds[0], None))
    assert "no launcher of this job" in forged[0].hangs[0].headline()
    unread = _job(tmp_path / "unread", hang_timeout=30.0)
    unread[1].handle(Tick())
    unread[1].handle(HangFlag(unread[0].rounds[0], None, read=False))
    assert "its flag's value could not be read" in unread[0].hangs[0].headline()


def test_a_forwarded_signal_reaches_every_live_rank_and_is_remembered(tmp_path: Path) -> None:
    _, supervisor, fake = _job(tmp_path)
    supervisor.handle(Tick())
    fake.exits[PIDS[1]] = 0
    supervisor.handle(Tick())
    supervisor.handle(Forward(signal.SIGUSR1))
    assert fake.sent == [(PIDS[0], "SIGUSR1")]  # rank 1 is gone
    assert supervisor.forwarded == "SIGUSR1"


def test_a_restart_keeps_the_earlier_starts_report(tmp_path: Path) -> None:
    run, supervisor, fake = _job(tmp_path)
    _raised(run, 1)
    fake.exits[PIDS[1]] = 1
    supervisor.handle(Tick())
    env = {"WORLD_SIZE": "2", "GROUP_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "1"}
    run.begin({local: {"RANK": str(local), **env} for local in (0, 1)})
    supervisor.handle(Tick())
    assert len(run.earlier) == 1
    assert run.earlier[0].culprit is not None
    assert run.earlier[0].culprit.rank == 1
    assert supervisor.seen.ranks == {}  # the new start's ranks have not recorded a start yet


@pytest.mark.multiprocess
def test_a_pid_that_only_a_record_names_is_never_signalled(tmp_path: Path) -> None:
    # A process that leads its own session, as a rank does, but is not the launcher's child:
    # a record could name any such PID.
    stranger = subprocess.Popen(
        [sys.executable, "-c", _STRANGER], stdout=subprocess.PIPE, text=True
    )
    assert stranger.stdout is not None
    pid = int(stranger.stdout.readline())
    stranger.stdout.close()
    stranger.wait(timeout=30)  # its parent is gone: it is nobody's child here
    assert os.getpgid(pid) == pid
    try:
        folder = rundir.create_run_folder(tmp_path)
        run = Run(LaunchPlan(target="job.py", nproc=1, log_root=tmp_path, grace=0.0), folder)
        (run.io_folder / ".events").mkdir(mode=0o700)
        run.begin({0: {"RANK": "0", "WORLD_SIZE": "1", "GROUP_RANK": "0"}})
        body = {"rank": 0, "pid": pid, "time_ns": time.time_ns(), "start": 0, "host": "h"}
        (run.events / "start-s0-r0.json").write_text(json.dumps(body))
        (run.events / "error-s0-r0.json").write_text(json.dumps(body))
        supervisor = Supervisor(run, None)
        for _ in range(3):
            supervisor.handle(Tick())
        assert not supervisor.handle(Finish())
        assert supervisor.procs == {}
        assert _alive(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _alive(pid), 30, "the stranger's end")


_STRANGER = """
import os, time
if os.fork():
    os._exit(0)
os.setsid()
print(os.getpid(), flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    state = records.process_start_time(pid)
    if state is None:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return stat not in ("Z", "X")


def test_a_rank_reaped_before_the_first_look_is_still_seen_failed(tmp_path: Path) -> None:
    # Rank 1 wrote its start record, raised and was reaped by torch's agent before the
    # supervisor looked: its PID is no child any more. Its records still say it failed.
    run, supervisor, fake = _job(tmp_path)
    _raised(run, 1)
    verify = fake.verify
    fake.verify = lambda pid: None if pid == PIDS[1] else verify(pid)  # type: ignore[method-assign]
    supervisor.handle(Tick())
    assert _states(supervisor) == {0: RankState.STOPPING, 1: RankState.FAILED}
    assert fake.sent == [(PIDS[0], "SIGTERM"), (PIDS[0], "SIGCONT")]  # never rank 1's PID
