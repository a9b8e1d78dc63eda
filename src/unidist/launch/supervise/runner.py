"""Run a :class:`LaunchPlan` on torch's elastic agent, stop fast on failure, leave nothing behind.

torch's ``elastic_launch`` does the rendezvous (c10d, static, etcd; elastic membership), starts each
rank in its own session, and restarts the group after a failure or a change of membership. unidist
adds: a new private folder per run (:mod:`~unidist.launch.plan.rundir`) with per-rank log files from
templates (a ``LogsSpecs``), a console that copies the chosen ranks' files
(:mod:`~unidist.launch.supervise.console`), a watchdog that stops the surviving ranks a moment after
one fails (SIGTERM, then SIGKILL after ``grace``: torch waits 30 s), a final SIGKILL of every rank's
process group so DataLoader workers of a crashed rank cannot linger, and the culprit report. On
several nodes a relay (:mod:`~unidist.launch.supervise.relay`) tells every launcher of a rank that
failed on another node, within about a second, and each stops its ranks and names that same culprit.

A rank counts as failed only on evidence: its own error record, or a non-zero exit status. A rank
that leaves with ``os._exit(0)`` while the others still work is not a failure (torchrun agrees). A
rank ended by a SIGTERM the launcher did not send is left to torch's agent: the agent stops every
rank that way when a node joins or leaves, and restarts them with the new nodes. PIDs are signalled
only if they belong to this run's ranks: the records are this run's own, and each PID's start time
is checked, so a reused PID is left alone.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from unidist import _env
from unidist._progress import record as progress_record
from unidist._progress.record import State
from unidist.errors import ConfigurationError, LaunchError
from unidist.launch import onenode, records
from unidist.launch.plan import rundir
from unidist.launch.plan.job import LaunchPlan, probe_templates
from unidist.launch.rank.runtime import STACK_SIGNAL
from unidist.launch.records import Slot, Start
from unidist.launch.rendezvous import NODE_TIMEOUT
from unidist.launch.supervise import relay
from unidist.launch.supervise.console import Console
from unidist.launch.supervise.exits import ExitClock
from unidist.launch.supervise.hang import HANG_EXIT_CODE, HangReport, HangWatch, StragglerReport
from unidist.launch.supervise.hang import write as write_report
from unidist.launch.supervise.outcome import RankOutcome, Status
from unidist.launch.supervise.report import Report, analyse, check_logs, outcome_of
from unidist.launch.supervise.watch import Event, Observed, RankState, advance

__all__ = ["Run", "launch_config", "run", "script_command"]


class Run:
    """One launcher run: its private folder, the starts of this node's ranks, the console."""

    def __init__(
        self,
        plan: LaunchPlan,
        folder: Path,
        console: Console | None = None,
        hand_over: bool = False,
    ) -> None:
        self.plan = plan
        self.folder = folder
        self.events = folder / ".events"
        self.console = console
        self.host = socket.gethostname()
        self.starts: list[Start] = []
        #: start index -> its rendezvous round, the same string on every node (see relay).
        self.rounds: dict[int, str] = {}
        #: Reports of the starts before the latest one (restarts), oldest first.
        self.earlier: list[Report] = []
        #: What the watchdog saw of the latest start (set by :func:`run`).
        self.observed: Callable[[], Observed] | None = None
        #: start index -> the hang the watchdog called in it.
        self.hangs: dict[int, HangReport] = {}
        #: Hand torch's agent the log files unidist opened (``/proc/self/fd/N``) instead of
        #: their paths where another user could replace a path between unidist's checks and
        #: torch's open (a folder others may write to, without the sticky bit); torch's agent
        #: opens the files in this process for a script's ranks.
        self.hand_over = hand_over and Path("/proc/self/fd").is_dir()
        self._held: dict[int, tuple[int, int]] = {}  # local rank -> descriptors of this start
        self._lock = threading.Lock()

    @property
    def current(self) -> Start | None:
        """The latest start, or None before the first."""
        with self._lock:
            return self.starts[-1] if self.starts else None

    def begin(self, envs: dict[int, dict[str, str]], given: Any = None) -> Start:
        """A new start of this node's ranks (torch's agent is about to start them).

        Creates each rank's log files (0600), tells each rank where its records go and which
        start it is, and points the console at the new files. ``given``: the ``LogsDest`` of a
        ``--logs-specs`` class, whose files (torch's agent opens them) replace unidist's.
        """
        plan = self.plan
        with self._lock:
            index = len(self.starts)
            previous = self.starts[-1] if self.starts else None
        shared = next(iter(envs.values()), {})  # what every rank of the start has alike
        if previous is not None:
            self._remember(previous, int(shared.get("WORLD_SIZE", "0")))
            records.release_left(self.events)  # the rooms its killed ranks kept
        self.release()
        slots: dict[int, Slot] = {}
        for local, env in sorted(envs.items()):
            rank, node = int(env["RANK"]), int(env.get("GROUP_RANK", "0"))
            env[records.EVENTS], env[records.START] = str(self.events), str(index)
            env[records.ERROR_FILE] = str(records.error_file(self.events, index, rank))
            env[_env.PROGRESS] = str(progress_record.path_for(self.events, rank, index))
            if _relayed(plan):
                env[records.AWAIT_LEAVE] = "1"
            if given is not None:  # "": the launcher's own stream, not a file
                out = Path(given.stdouts.get(local) or os.devnull)
                err = Path(given.stderrs.get(local) or os.devnull)
                slots[local] = Slot(rank, local, node, int(env["WORLD_SIZE"]), out, err)
                continue
            out, err = plan.log_paths(
                self.folder,
                rank=rank,
                local_rank=local,
                node_rank=node,
                attempt=index,
                world_size=int(env["WORLD_SIZE"]),
                local_world_size=plan.nproc,
            )
            self._held[local] = (rundir.open_private(out), rundir.open_private(err))
            if not (
                self.hand_over and (rundir.swappable(out.parent) or rundir.swappable(err.parent))
            ):
                self._close(self._held.pop(local))
            slots[local] = Slot(rank, local, node, int(env["WORLD_SIZE"]), out, err)
        start = Start(index, slots)
        if self.console is not None:
            self.console.retire()
            for slot in slots.values():
                prefix = plan.console.prefix_for(slot.rank, slot.local_rank, plan.role, self.host)
                for stream, path in (("stdout", slot.stdout), ("stderr", slot.stderr)):
                    if path == Path(os.devnull):
                        continue  # --logs-specs sent it to this console directly
                    if plan.console.shows(slot.rank, slot.local_rank, stream):
                        self.console.follow(path, stream, prefix)
        generation = "{}-{}:{}".format(
            shared.get("TORCHELASTIC_RESTART_COUNT", "0"),
            shared.get("MASTER_ADDR", ""),
            shared.get("MASTER_PORT", ""),
        )
        with self._lock:
            self.rounds[index] = generation
            self.starts.append(start)
        return start

    def log_dest(self, slot: Slot) -> tuple[str, str]:
        """The (stdout, stderr) names torch's agent opens for ``slot``: the files unidist
        created and holds open (``/proc/self/fd/N``), or their paths."""
        held = self._held.get(slot.local_rank)
        if held is None:
            return str(slot.stdout), str(slot.stderr)
        return f"/proc/self/fd/{held[0]}", f"/proc/self/fd/{held[1]}"

    def release(self) -> None:
        """Close the log files unidist held for torch's agent (it has its own by now)."""
        held, self._held = self._held, {}
        for fds in held.values():
            self._close(fds)

    @staticmethod
    def _close(fds: tuple[int, int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _remember(self, start: Start, next_world_size: int) -> None:
        """A restart: keep how the previous start ended, for the final summary."""
        seen = self.observed() if self.observed is not None else Observed()
        try:
            report = analyse(start, self.events, {}, seen, self.plan)
        except Exception:  # a summary must never stop a restart
            report = Report([], None, 1)
        report.hang = self.hangs.get(start.index)
        world_size = next(iter(start.slots.values())).world_size if start.slots else 0
        if start.slots and world_size != next_world_size:
            report.resized = (world_size, next_world_size)
        self.earlier.append(report)


def _logs_specs(run: Run) -> Any:
    from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs

    custom = run.plan.logs_specs.load() if run.plan.logs_specs is not None else None

    class RunLogsSpecs(LogsSpecs):
        """Each start's files, named by the plan's templates inside the run's folder (or by the
        ``--logs-specs`` class); the ranks' error files in the run's record folder."""

        def __init__(self) -> None:
            super().__init__(log_dir=str(run.folder))

        @property
        def root_log_dir(self) -> str:
            return str(run.folder)

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            given = custom.reify(envs) if custom is not None else None
            start = run.begin(envs, given)
            dest = given if given is not None else LogsDest()
            for local, slot in start.slots.items():
                if given is None:
                    dest.stdouts[local], dest.stderrs[local] = run.log_dest(slot)
                dest.error_files[local] = str(
                    records.error_file(run.events, start.index, slot.rank)
                )
            return dest

    return RunLogsSpecs()


def launch_config(run: Run) -> Any:
    """torch's ``LaunchConfig`` for the run."""
    from torch.distributed.launcher.api import LaunchConfig

    plan, rdzv = run.plan, run.plan.rdzv
    configs: dict[str, Any] = dict(rdzv.configs)
    if rdzv.backend == "static":
        configs["rank"] = rdzv.node_rank
    return LaunchConfig(
        min_nodes=rdzv.min_nodes,
        max_nodes=rdzv.max_nodes,
        nproc_per_node=plan.nproc,
        run_id=rdzv.run_id,
        role=plan.role,
        rdzv_backend=rdzv.backend,
        rdzv_endpoint=rdzv.endpoint,
        rdzv_configs=configs,
        max_restarts=plan.max_restarts,
        monitor_interval=plan.monitor_interval,
        start_method="spawn",
        local_addr=rdzv.local_addr,
        logs_specs=_logs_specs(run),
        **plan.torch_options,
    )


class _Watchdog(threading.Thread):
    """Stops the survivors soon after a rank fails; records what it saw of the latest start."""

    def __init__(self, run: Run, messenger: relay.Relay | None = None) -> None:
        super().__init__(name="unidist-launch-watchdog", daemon=True)
        self.run_ = run
        self.relay = messenger
        self._told: RankOutcome | None = None  # what this node published to the relay
        self.seen = Observed()
        self.procs: dict[tuple[int, int], tuple[int, int | None]] = {}  # (start, rank) -> pid
        self._start = -1
        self._left = -1  # the start whose relay round this node left (its ranks all finished)
        self._halt = threading.Event()
        self._deadline: float | None = None
        self._exit_deadline: float | None = None
        # Look more often than torch's agent, which reaps exited ranks (their status with them).
        self._interval = min(0.05, run.plan.monitor_interval / 2)
        self.clock = ExitClock(self._interval)  # when each rank exited, to the millisecond
        self.hang = HangWatch(run.events, run.plan.hang_timeout)
        self.forwarded: str | None = None  # the first signal the launcher passed on
        self._hosts: dict[int, str] = {}
        every = run.plan.straggler_every
        self._stragglers_at = time.monotonic() + every if every else None

    def run(self) -> None:
        while not self._halt.wait(self._interval):
            self.scan()

    def start(self) -> None:
        super().start()
        self.clock.start()
        if self.relay is not None:
            self.relay.start()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.clock.stop()

    def close(self) -> None:
        """Stop the relay (after the last :meth:`scan`)."""
        if self.relay is not None:
            self.relay.stop()

    def scan(self) -> None:
        start = self.run_.current
        if start is None:
            return
        if start.index != self._start:  # a restart: what was seen belongs to the old start
            self._start, self._deadline, self._exit_deadline = start.index, None, None
            self.seen, self._told = Observed(), None
            if self.relay is not None:
                slot = next(iter(start.slots.values()))
                self.relay.round(
                    self.run_.rounds[start.index],
                    slot.world_size,
                    self.run_.plan.nproc,
                    slot.node_rank,
                )
        found = records.read(self.run_.events, start.index)
        procs: dict[int, tuple[int, int | None]] = {}
        for slot in start.slots.values():
            record = found.get(("start", slot.rank))
            if record is None:
                continue
            procs[slot.rank] = self.procs[(start.index, slot.rank)] = (
                int(record["pid"]),
                record.get("pid_start"),
            )
            self.clock.watch((start.index, slot.rank), procs[slot.rank][0])
            if not self.seen.watch(slot.rank).gone:
                self._check(slot.rank, procs[slot.rank], found, start.index)
        if self.relay is not None:
            self._relay(start, found)
        if (self.seen.failed_on_their_own or self.seen.remote) and self._deadline is None:
            self._stop_survivors(procs, found)
        self._look_for_hangs(start, procs, found)
        if self._deadline is not None and time.monotonic() > self._deadline:
            for rank, proc in procs.items():
                if not self.seen.watch(rank).gone:
                    _signal(proc, signal.SIGKILL)
        self._watch_exits(procs)

    def _look_for_hangs(
        self, start: Start, procs: dict[int, tuple[int, int | None]], found: dict[Any, Any]
    ) -> None:
        """Call a hang when no rank made progress for the hang timeout; report stragglers."""
        for rank in procs:
            self._hosts.setdefault(rank, str(found.get(("start", rank), {}).get("host", "?")))
        if self._deadline is not None or not procs:
            return  # already stopping the job
        elsewhere = self.relay.progress(self.hang.progress_count()) if self.relay else 0
        hung = self.hang.look(start, self.seen, elsewhere)
        if hung or (self.relay is not None and self.hang.enabled and self.relay.hang_called()):
            self._call_hang(start, procs, found)
        if self._stragglers_at is not None and time.monotonic() >= self._stragglers_at:
            self._stragglers_at = time.monotonic() + (self.run_.plan.straggler_every or 0)
            report = self.stragglers(final=False)
            if report is not None and report.found:
                sys.stderr.write(report.format())
                sys.stderr.flush()

    def _call_hang(
        self, start: Start, procs: dict[int, tuple[int, int | None]], found: dict[Any, Any]
    ) -> None:
        live = {rank: proc for rank, proc in procs.items() if not self.seen.watch(rank).gone}
        facts = self.hang.facts(start, procs, self.seen, self._hosts, _frozen)
        missing: list[int] = []
        if self.relay is not None:
            facts, missing = self.relay.hang_facts(facts, self.run_.plan.rdzv.max_nodes)
        for fact in facts:
            if fact.status == "frozen" and fact.rank in live:
                _signal(live[fact.rank], signal.SIGCONT)  # so that it can dump its stacks
        self.hang.ask_for_stacks(start, live)
        report = self.hang.call(facts, missing)
        self.run_.hangs[start.index] = report
        with contextlib.suppress(OSError):
            write_report(self.run_.folder, "hang.json", report.to_json())
        self._stop_survivors(procs, found)

    def progress(self) -> dict[int, tuple[int, str, int]]:
        """Each rank's last progress: (steps, the collective it was in, its sequence number)."""
        if self.run_.current is not None:
            self.hang.refresh(self.run_.current)
        return {
            rank: (snap.steps, snap.op if snap.state is State.COLLECTIVE else "", snap.world_seq)
            for rank, snap in self.hang.snapshots.items()
        }

    def stragglers(self, final: bool) -> StragglerReport | None:
        """The straggler report of the latest start so far (written to stragglers.json)."""
        start = self.run_.current
        if start is None or self.run_.plan.straggler_every == 0:
            return None
        facts = self.hang.facts(start, {}, self.seen, self._hosts, lambda pid: False)
        report = self.hang.straggler_report(facts)
        if final or report.found:
            with contextlib.suppress(OSError):
                write_report(self.run_.folder, "stragglers.json", report.to_json())
        return report

    def _check(
        self, rank: int, proc: tuple[int, int | None], found: dict[Any, Any], start: int
    ) -> None:
        before = time.time_ns()
        running, status = _exit_status(*proc)
        watch = self.seen.watch(rank)
        if running:
            advance(watch, Event.RUNNING, before)  # so if it ends, it ends after this
            return
        now = time.time_ns()
        stamp = self.clock.when((start, rank))  # the exit itself, if the clock saw it
        last_alive = watch.alive_at or 0
        at = stamp if stamp is not None and last_alive <= stamp <= now else now
        finished = ("done", rank) in found or status == 0
        failed = ("error", rank) in found or (status is not None and not finished)
        advance(watch, Event.EXITED, at, status=status, failed=failed, finished=finished)

    def _all_finished(self, start: Start, found: dict[Any, Any]) -> bool:
        """Whether every rank of ``start`` finished without error (recorded, or exited 0)."""
        for slot in start.slots.values():
            if ("error", slot.rank) in found:
                return False
            if ("done", slot.rank) not in found and self.seen.get(slot.rank).status != 0:
                return False
        return True

    def _relay(self, start: Start, found: dict[Any, Any]) -> None:
        """Publish this node's first failure (a rank's own over a wait); take another node's."""
        assert self.relay is not None
        failed = [
            outcome_of(start.slots[slot], found, self.seen)
            for slot in sorted(start.slots)
            if start.slots[slot].rank in self.seen.failed_on_their_own
        ]
        failed = [o for o in failed if o.status in relay.OWN + relay.WAITED]
        failed.sort(key=lambda o: (o.status not in relay.OWN, o.time_ns or 0))
        node = next(iter(start.slots.values())).node_rank
        if failed:
            own = failed[0].status in relay.OWN
            if self._told is None or (own and self._told.status not in relay.OWN):
                self._told = failed[0]
                self.relay.publish(_failure(failed[0], node))
        if self._left != start.index and self._all_finished(start, found):
            self._left = start.index  # no more round trips: see relay.Relay.leave
            self.relay.leave(functools.partial(records.mark_left, self.run_.events, start.index))
        remote = self.relay.received()
        if remote is None or remote.node_rank == node:
            self.seen.remote = None  # this node's own word replaced a wait published elsewhere
        else:
            self.seen.remote = RankOutcome(
                remote.rank,
                remote.local_rank,
                remote.host,
                Status(remote.kind),  # one of OWN + WAITED, or LOST: checked as it arrived
                remote.detail,
                remote.exit_code,
                remote.time_ns,
                Path(remote.stdout),
                Path(remote.stderr),
                remote=True,
            )

    def _stop_survivors(
        self, procs: dict[int, tuple[int, int | None]], found: dict[Any, Any]
    ) -> None:
        """SIGTERM every rank still running (each dumps its stack); SIGKILL after ``grace``.

        A rank frozen by SIGSTOP (or a debugger) does not act on SIGTERM: it is noted as frozen
        for the report and sent SIGCONT right after, so that it dumps its stack and leaves; the
        SIGKILL after ``grace`` ends it in any case.
        """
        self._deadline = time.monotonic() + self.run_.plan.grace
        for rank, proc in procs.items():
            if self.seen.watch(rank).gone or ("error", rank) in found:
                continue  # gone, or already failing and on its way out (SIGKILL after grace)
            advance(self.seen.watch(rank), Event.STOP, time.time_ns(), frozen=_frozen(proc[0]))
            _signal(proc, signal.SIGTERM)
            _signal(proc, signal.SIGCONT)

    def _watch_exits(self, procs: dict[int, tuple[int, int | None]]) -> None:
        """After a rank finished, give the others ``exit_timeout`` to finish, then kill them."""
        if not self.run_.plan.exit_timeout or self._deadline is not None:
            return
        finished = [r for r, w in self.seen.ranks.items() if w.gone and not w.failed_exit]
        if finished and self._exit_deadline is None:
            self._exit_deadline = time.monotonic() + self.run_.plan.exit_timeout
        if self._exit_deadline is None or time.monotonic() < self._exit_deadline:
            return
        hung = [rank for rank in procs if not self.seen.watch(rank).gone]
        for rank in hung:
            watch = self.seen.watch(rank)
            if watch.state is not RankState.HUNG:
                advance(watch, Event.HANG, time.time_ns())
                _ask_for_stack(procs[rank])  # every thread's stack into its stderr log
        if hung:
            time.sleep(0.5)
        for rank in hung:
            _signal(procs[rank], signal.SIGKILL)

    def forward(self, signum: int, frame: Any = None) -> None:
        """A signal handler: pass ``signum`` on to every rank of the latest start."""
        start = self.run_.current
        ranks = [] if start is None else list(start.slots.values())
        sent = 0
        for slot in ranks:
            proc = self.procs.get((start.index, slot.rank)) if start is not None else None
            if proc is not None and not self.seen.get(slot.rank).gone:
                _signal(proc, signal.Signals(signum))
                sent += 1
        name = signal.Signals(signum).name
        self.forwarded = self.forwarded or name
        sys.stderr.write(f"unidist launch: {name} passed on to {sent} rank(s) of this node\n")
        sys.stderr.flush()

    def sweep(self) -> None:
        """SIGKILL every rank's process group (leftover DataLoader workers included)."""
        for proc in self.procs.values():
            _signal(proc, signal.SIGKILL)


def _failure(outcome: RankOutcome, node_rank: int) -> relay.Failure:
    return relay.Failure(
        rank=outcome.rank,
        local_rank=outcome.local_rank,
        node_rank=node_rank,
        host=outcome.host,
        kind=outcome.status,
        detail="".join(c if c.isprintable() else " " for c in outcome.detail)[:500],
        exit_code=outcome.exit_code,
        time_ns=outcome.time_ns or time.time_ns(),
        stdout=str(outcome.stdout),
        stderr=str(outcome.stderr),
    )


def _frozen(pid: int) -> bool:
    """Whether ``pid`` is stopped (state T: SIGSTOP, SIGTSTP) or stopped by a tracer (t)."""
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    return False


def _exit_status(pid: int, pid_start: int | None) -> tuple[bool, int | None]:
    """(still running, exit status if known: -N for signal N).

    Ranks are this process's children: ``waitid(WNOWAIT)`` reads an exited rank's status
    without reaping it, so torch's agent still sees it. Once torch has reaped it, the status
    is unknown here (torch's agent acts on it then).
    """
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError, AttributeError):
        return _alive(pid, pid_start), None
    if info is None:
        return True, None
    exited = info.si_code == os.CLD_EXITED
    return False, info.si_status if exited else -info.si_status


def _alive(pid: int, pid_start: int | None) -> bool:
    started = records.process_start_time(pid)
    if started is not None:
        stat = Path(f"/proc/{pid}/stat")
        with contextlib.suppress(OSError, IndexError):
            zombie = stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
            return not zombie and (pid_start is None or started == pid_start)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ask_for_stack(proc: tuple[int, int | None]) -> None:
    """The rank dumps every thread's stack into its stderr log (faulthandler, from any C code)."""
    pid, pid_start = proc
    started = records.process_start_time(pid)
    if started is not None and pid_start is not None and started != pid_start:
        return  # the PID was reused by a process that is not this run's
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, STACK_SIGNAL)  # the rank alone: its workers would die of it


def _signal(proc: tuple[int, int | None], sig: signal.Signals) -> None:
    """Signal a rank's process group, unless its PID now belongs to another process."""
    pid, pid_start = proc
    started = records.process_start_time(pid)
    if started is not None and pid_start is not None and started != pid_start:
        return  # the PID was reused by a process that is not this run's
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # every rank leads its own session (torch starts it that way)


def run(
    plan: LaunchPlan,
    entrypoint: str | Callable[..., Any],
    args: list[Any],
    verbose: bool = False,
) -> tuple[Report, dict[int, Any], Path]:
    """Run the job; returns this node's report, a function entrypoint's results, the run folder.

    Raises:
        ConfigurationError: the log files cannot be written (checked before anything starts).
        LaunchError: the rendezvous failed (no rank ran), or its store was lost afterwards.
    """
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    folder = rundir.create_run_folder(plan.log_root)
    try:
        probe_templates(plan, folder)
        (folder / ".events").mkdir(mode=0o700)
    except Exception:
        rundir.remove(folder)
        raise
    if not verbose:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    console = Console(sys.stdout, sys.stderr) if plan.console.enabled else None
    job = Run(plan, folder, console, hand_over=isinstance(entrypoint, str))
    messenger = _relay_for(plan)
    watchdog = _Watchdog(job, messenger)
    job.observed = lambda: watchdog.seen
    watchdog.start()
    if console is not None:
        console.start()
    exit_codes: dict[int, int] = {}
    interrupted = None
    results: dict[int, Any] = {}
    forwarding = _forward_user_signals(watchdog)
    try:
        with _env.patched(_exports(plan), only_missing=False):
            results = _launch(job, entrypoint, args, messenger)
    except ChildFailedError as exc:
        exit_codes = {f.local_rank: f.exitcode for f in exc.failures.values()}
    except SignalException as exc:
        interrupted = signal.Signals(exc.sigval).name
    except KeyboardInterrupt:
        interrupted = "SIGINT"
    except ConfigurationError:
        raise  # a log file that must not be written (checked again as it is created)
    except Exception as exc:
        _raise_rendezvous_error(job, exc)
        raise
    finally:
        for signum, previous in forwarding.items():
            signal.signal(signum, previous)
        watchdog.stop()
        watchdog.scan()
        watchdog.sweep()
        watchdog.close()
        job.release()
        if console is not None:
            console.close()
    if interrupted is None and watchdog.forwarded and exit_codes:
        interrupted = watchdog.forwarded  # the ranks ended by the signal passed on to them
    report = _final_report(job, watchdog, exit_codes, interrupted)
    records.release_left(job.events)  # the rooms of ranks that never finished (killed)
    return report, results, folder


def _final_report(
    job: Run, watchdog: _Watchdog, exit_codes: dict[int, int], interrupted: str | None
) -> Report:
    """How the latest start ended: its culprit, or its hang; earlier starts; stragglers."""
    plan = job.plan
    report = analyse(
        job.current, job.events, exit_codes, watchdog.seen, plan, interrupted, watchdog.progress()
    )
    report.earlier, report.several_nodes = job.earlier, plan.rdzv.max_nodes > 1
    if job.current is not None and job.current.index in job.hangs and not interrupted:
        report.hang = job.hangs[job.current.index]
        report.exit_code = HANG_EXIT_CODE
    else:  # after a hang, the hung rank's silence is no straggler's slowness
        report.stragglers = watchdog.stragglers(final=True)
    if report.failed:
        check_logs(report)  # a full disk or an I/O error, named as the cause
    return report


#: Signals the launcher passes on to every rank: a scheduler's warning before preemption
#: (SLURM's ``--signal=USR1@90`` reaches the launcher under ``srun unidist launch``).
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)


def _forward_user_signals(watchdog: _Watchdog) -> dict[int, Any]:
    """While the job runs, SIGUSR1 and SIGUSR2 to the launcher go on to every rank's process
    group (their default action would end the launcher and, with it, every rank): a
    ``unidist.ResumableState`` in the ranks saves and stops on them. A handler the program
    already set (``unidist.spawn`` in a script of the user's) is left alone. Returns the
    handlers to put back."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for signum in FORWARDED:
        if signal.getsignal(signum) is signal.SIG_DFL:
            previous[signum] = signal.signal(signum, watchdog.forward)
    return previous


def _relay_for(plan: LaunchPlan) -> relay.Relay | None:
    """The relay between the launchers of a job of several nodes, where the store allows one."""
    rdzv = plan.rdzv
    if not _relayed(plan):
        return None
    return relay.Relay(rdzv.host.strip("[]"), rdzv.port, rdzv.run_id, _keep_alive(rdzv.configs))


def _relayed(plan: LaunchPlan) -> bool:
    """Whether the launchers of the job talk through a relay: one node has nothing to tell;
    etcd and plugins have no TCPStore to share."""
    return plan.rdzv.max_nodes > 1 and plan.rdzv.backend in ("static", "c10d")


def _keep_alive(configs: Mapping[str, str]) -> float:
    """Seconds after which torch's c10d rendezvous takes a silent node for dead (its
    ``keep_alive_interval`` x ``keep_alive_max_attempt``): the relay's measure of a lost node."""
    try:
        seconds = float(configs.get("keep_alive_interval", NODE_TIMEOUT / 3))
        seconds *= int(configs.get("keep_alive_max_attempt", 3))
    except ValueError:
        return relay.LOST  # torch refuses the value itself, with its own message
    return seconds if seconds > 0 else relay.LOST


def _launch(
    job: Run, entrypoint: str | Callable[..., Any], args: list[Any], messenger: relay.Relay | None
) -> dict[int, Any]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    if job.plan.rdzv.backend == onenode.BACKEND:
        onenode.register()
    try:
        results: dict[int, Any] = elastic_launch(launch_config(job), entrypoint)(*args)
    except ChildFailedError:
        if messenger is not None:
            # Still handling the exception: its traceback keeps torch's agent, its rendezvous
            # and the store this node may host alive while the other nodes read the culprit.
            messenger.linger()
        raise
    return results


def _rendezvous_failed(plan: LaunchPlan, exc: BaseException) -> str:
    rdzv = plan.rdzv
    return (
        f"unidist launch: the {rdzv.backend} rendezvous at {rdzv.endpoint} (id {rdzv.run_id!r}, "
        f"{rdzv.nnodes} node(s)) did not complete: {type(exc).__name__}: {exc}\n"
        "HINT: every node must run unidist launch with the same --rdzv-endpoint, --rdzv-id and "
        "--nnodes, and HOST:PORT must be reachable from every node; the rendezvous waits "
        "join_timeout seconds (--rdzv-conf join_timeout=600) for the others.\n"
    )


def _from_rendezvous(exc: BaseException) -> bool:
    """Whether ``exc`` is the rendezvous's (torch's rendezvous and store errors, timeouts)."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    rendezvous = (RendezvousError, dist.DistError, TimeoutError, ConnectionError)
    return isinstance(exc, rendezvous) or isinstance(exc.__cause__, rendezvous)


def _agent_failed(plan: LaunchPlan, exc: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    return (
        f"unidist launch: torch's elastic agent raised {type(exc).__name__}: {exc}{where} "
        f"before starting any rank (after the {plan.rdzv.backend} rendezvous began at "
        f"{plan.rdzv.endpoint}; not a rendezvous error).\n"
        "HINT: the traceback's last frame says which part of the agent failed; a rendezvous "
        "or agent plugin (--rdzv-backend, --logs-specs) is the usual cause.\n"
    )


def _raise_rendezvous_error(job: Run, exc: BaseException) -> None:
    """A LaunchError in place of ``exc`` when the rendezvous is what failed (else nothing)."""
    if job.current is None or _store_lost(exc):
        # The message says what ``exc`` said; its frames would keep torch's agent and the
        # rendezvous store it hosts (a TCPStore and its server thread) alive for as long as
        # a caller in Python keeps the LaunchError, and a process forked meanwhile would
        # abort when it collects them ("terminate called ... std::system_error").
        import traceback

        traceback.clear_frames(exc.__traceback__)
    if job.current is None:
        # Nothing started: the rendezvous failed, or something else in torch's agent's set-up
        # (a plugin, a file, a bug) did; say which, where and why.
        if _from_rendezvous(exc):
            raise LaunchError(
                _rendezvous_failed(job.plan, exc), exit_code=1, culprit=None
            ) from None
        # The agent's own exception stays the cause (its frames cleared above), so that code
        # that drives the launcher from Python (unidist.compat.torchrun) can raise it as
        # torchrun does.
        raise LaunchError(_agent_failed(job.plan, exc), exit_code=1, culprit=None) from exc
    if _store_lost(exc):
        # The ranks ran; then the rendezvous store went away (its host left): torch's agent
        # stopped this node's ranks and raised from its next look at the store.
        raise LaunchError(_rendezvous_lost(job, exc), exit_code=1, culprit=None) from None


def _store_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (from torch's agent, after the ranks started) says the rendezvous store
    cannot be reached: torch wraps the store's network error in RendezvousConnectionError."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    return isinstance(exc, RendezvousConnectionError | dist.DistNetworkError)


def _rendezvous_lost(job: Run, exc: BaseException) -> str:
    rdzv = job.plan.rdzv
    starts = len(job.starts)
    cause = exc.__cause__ or exc.__context__
    first = str(exc).split("\n", 1)[0].replace(" See inner exception for details.", "")
    if cause is not None:
        first += f" ({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})"
    first = first[:400]
    return (
        f"unidist launch: lost the {rdzv.backend} rendezvous store at {rdzv.endpoint} (id "
        f"{rdzv.run_id!r}) after {starts} start(s) of this node's ranks: "
        f"{type(exc).__name__}: {first} The store lives in the launcher that hosts it (the one "
        "on the --rdzv-endpoint host): it left or stopped answering, and torch's agents cannot "
        "go on without it, so this node's ranks were stopped.\n"
        "HINT: keep the node that hosts the store for the whole job, or host the store on a "
        "machine that stays (see 'Limits' in the elastic training guide); then start this "
        "launcher again: with unidist.ResumableState the job resumes from its last "
        "checkpoint.\n"
    )


def _exports(plan: LaunchPlan) -> dict[str, str]:
    """Variables every rank inherits (set in this process only while the job runs)."""
    values = {_env.LAUNCHER_MARKER: "launch", "PYTHONUNBUFFERED": "1"}
    # torch's dynamic rendezvous lends the ranks one store for the whole run, restarts included,
    # with no per-attempt prefix ("we create a new TCPStore for every retry", says
    # torch.distributed.rendezvous, but the handler caches it): after a restart gloo reads the
    # previous attempt's addresses and fails with "connectFullMesh failed" (torch 2.7 to 2.14,
    # torchrun too). torch's opt-out gives every rendezvous round a fresh store on rank 0; it is
    # needed only where a second round can happen, elsewhere the ranks get the agent's store at
    # MASTER_ADDR:MASTER_PORT with TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun.
    if plan.restarts_possible:
        values["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if plan.nproc > 1 and not _env.is_set("OMP_NUM_THREADS"):
        values["OMP_NUM_THREADS"] = "1"  # as torchrun does
    if plan.timeout is not None:
        values["UNIDIST_TIMEOUT"] = str(plan.timeout)
    return values


def script_command(plan: LaunchPlan) -> tuple[str, list[str]]:
    """The program and arguments each rank runs for a script, module or program target."""
    if plan.no_python:
        target = ["--exec", str(plan.target)]
    else:
        target = ["-m", str(plan.target)] if plan.module else [str(plan.target)]
    return sys.executable, ["-u", "-m", "unidist.launch.rank.bootstrap", *target, *plan.args]
