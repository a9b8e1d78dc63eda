"""The launcher's supervisor: one loop, the only owner of what the launcher knows of its ranks.

As torch's elastic agent has one ``_invoke_run`` loop over one ``WorkerState``, the launcher has
one thread that reads and changes every fact it holds about this node's ranks: which processes
are its ranks (:mod:`.procs`: verified children, never a PID a file names), how each rank is
doing (:class:`~unidist.launch.supervise.watch.Observed`), the hang watch, the stop and exit
deadlines, what it told the relay, the reports of earlier starts. The other threads never touch
that state; they post an :mod:`event <unidist.launch.supervise.events>` to the supervisor's inbox:

* the exit clock posts :class:`~.events.Exited` the moment a rank's process ends;
* the relay posts :class:`~.events.Culprit` when the job's culprit is known (another node's, or
  this node's own word that replaced a wait) and :class:`~.events.HangFlag` when a node raised
  the hang flag;
* the main thread posts :class:`~.events.Forward` (from its signal handler) and
  :class:`~.events.Finish` when the job has ended, and reads the state only once
  :meth:`Supervisor.finish` has returned (the thread has ended: the state is then the caller's).

Each event is handled, then the supervisor looks at the ranks (:meth:`Supervisor.look`): it
reads this start's records, checks each rank's process and acts: a rank that failed stops the
survivors (SIGTERM, SIGKILL after ``grace``), a rank that finished starts the exit timeout, a
silence as long as the hang timeout calls a hang. With nothing posted it looks every interval
(:class:`~.events.Tick`), faster than torch's agent reaps exited ranks.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unidist.hangs.page import State
from unidist.launch import records
from unidist.launch.printing import escaped
from unidist.launch.records import Start
from unidist.launch.supervise import notices, relay
from unidist.launch.supervise.events import (
    Culprit,
    Event,
    Exited,
    Finish,
    Forward,
    HangFlag,
    Tick,
)
from unidist.launch.supervise.exits import ExitClock
from unidist.launch.supervise.hang import HangWatch, StragglerReport, write as write_report
from unidist.launch.supervise.outcome import RankOutcome, Status
from unidist.launch.supervise.procs import Proc, Processes
from unidist.launch.supervise.report import Report, analyse, outcome_of
from unidist.launch.supervise.watch import Observed, RankState, Sighting, advance

if TYPE_CHECKING:
    from unidist.launch.supervise.runner import Run

__all__ = ["FINISH_SECONDS", "Supervisor"]

#: Seconds the main thread waits for the supervisor's last look and sweep: its longest step is a
#: hang call (the relay's gather and the stack dumps, about 10 s).
FINISH_SECONDS = 30.0
#: Seconds a rank gets to dump its stacks at the exit timeout before it is killed.
STACK_WAIT = 0.5


class Supervisor(threading.Thread):
    """The loop (see the module's docstring).

    Args:
        run: the launcher's run (its plan, folder and starts; the supervisor appends the
            reports of earlier starts and the hangs it calls).
        messenger: the relay to the other nodes' launchers (None on one node).
        processes: how it acts on processes (a test gives its own).
    """

    def __init__(
        self,
        run: Run,
        messenger: relay.Relay | None = None,
        processes: Processes | None = None,
    ) -> None:
        super().__init__(name="unidist-launch-supervisor", daemon=True)
        self.run_ = run
        self.relay = messenger
        self.processes = processes or Processes()
        self.inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        # Look more often than torch's agent, which reaps exited ranks (their status with them).
        self.interval = min(0.05, run.plan.monitor_interval / 2)
        self.exit_clock = ExitClock(self._exited, self.interval)
        if messenger is not None:
            messenger.notify = self.post
        # -- the state: this thread's alone, the caller's once finish() has returned ----------
        self.seen = Observed()
        self.procs: dict[tuple[int, int], Proc] = {}  # (start, rank) -> its verified process
        self.hang = HangWatch(run.events, run.plan.hang_timeout)
        self.forwarded: str | None = None  # the first signal the launcher passed on
        self._start = -1
        self._told: RankOutcome | None = None  # what this node published to the relay
        self._left = -1  # the start whose relay round this node left (its ranks all finished)
        self._deadline: float | None = None  # SIGKILL the ranks still there (after a stop)
        self._exit_deadline: float | None = None  # kill the rest (after a rank finished)
        self._exits: dict[Hashable, int] = {}  # (start, rank) -> when its process ended
        self._flag: HangFlag | None = None  # a hang flag raised in this start's round
        self._hosts: dict[int, str] = {}
        every = run.plan.straggler_every
        self._stragglers_at = time.monotonic() + every if every else None
        self.ended = False

    # -- the other threads' side -----------------------------------------------------------------

    def post(self, event: Event) -> None:
        """Hand ``event`` to the supervisor (any thread)."""
        self.inbox.put(event)

    def forward(self, signum: int, frame: Any = None) -> None:
        """A signal handler: pass ``signum`` on to every rank of the latest start."""
        self.post(Forward(signum))

    def start(self) -> None:
        super().start()
        self.exit_clock.start()
        if self.relay is not None:
            self.relay.start()

    def finish(self, timeout: float = FINISH_SECONDS) -> bool:
        """The job ended: the supervisor's last look and sweep, then it stops. Returns whether
        it stopped within ``timeout``: only then is its state the caller's (else the caller
        must not touch it)."""
        self.post(Finish())
        if self.is_alive():
            self.join(timeout)
        if not self.is_alive() and not self.ended:  # never started, or died: sweep here
            self.handle(Finish())
        return not self.is_alive()

    def _exited(self, key: Hashable, at_ns: int) -> None:
        if isinstance(key, tuple) and len(key) == 2:
            self.post(Exited((int(key[0]), int(key[1])), at_ns))

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        said: set[str] = set()
        while True:
            try:
                event: Event = self.inbox.get(timeout=self.interval)
            except queue.Empty:
                event = Tick()
            try:
                if not self.handle(event):
                    return
            except Exception:  # the supervisor must outlive its own bugs: the job goes on
                text = traceback.format_exc()
                if text not in said:  # each error once, not every interval
                    said.add(text)
                    sys.stderr.write(
                        "unidist launch: the supervisor failed to handle "
                        f"{type(event).__name__} (said once):\n{text}"
                    )

    def handle(self, event: Event) -> bool:
        """Handle one event, then look at the ranks; False once :class:`Finish` was handled."""
        if isinstance(event, Finish):
            try:
                self._finish()
            finally:
                self.ended = True  # whatever the sweep met, the loop ends here
            return False
        if isinstance(event, Exited):
            self._exits.setdefault(event.key, event.at_ns)
        elif isinstance(event, Forward):
            self._forward(event.signum)
            return True
        elif isinstance(event, Culprit):
            self._culprit(event)
        elif isinstance(event, HangFlag) and event.round == self._current_round():
            self._flag = self._flag or event
        self.look()
        return True

    def look(self, final: bool = False) -> None:
        """Read the latest start's records and processes; act on what changed."""
        start = self.run_.current
        if start is None:
            return
        if start.index != self._start:
            self._new_start(start)
        found = records.read(self.run_.events, start.index)
        procs = self._procs_of(start, found)
        for rank, proc in procs.items():
            if not self.seen.watch(rank).gone:
                self._check(rank, proc, found, start.index)
        if final:
            return
        if self.relay is not None:
            self._relay(start, found)
        if (self.seen.failed_on_their_own or self.seen.remote) and self._deadline is None:
            self._stop_survivors(procs, found)
        self._look_for_hangs(start, procs, found)
        if self._deadline is not None and time.monotonic() > self._deadline:
            for rank, proc in procs.items():
                if not self.seen.watch(rank).gone:
                    self.processes.signal_group(proc, signal.SIGKILL)
        self._watch_exits(procs)

    # -- starts and processes --------------------------------------------------------------------

    def _new_start(self, start: Start) -> None:
        """A restart: what was seen belongs to the earlier start, whose report is kept."""
        starts = self.run_.started()
        earlier = [s for s in starts if self._start < s.index < start.index]
        if self._start >= 0:
            previous = next(s for s in starts if s.index == self._start)
            self._remember(previous, self.seen, start)
        for skipped in earlier:  # begun and replaced between two looks: nothing was seen
            self._remember(skipped, Observed(), start)
        self._start, self._deadline, self._exit_deadline = start.index, None, None
        self.seen, self._told, self._flag = Observed(), None, None
        if self.relay is not None:
            slot = next(iter(start.slots.values()))
            self.relay.round(
                self.run_.round_of(start.index) or "",
                slot.world_size,
                self.run_.plan.nproc,
                slot.node_rank,
            )

    def _remember(self, start: Start, seen: Observed, following: Start) -> None:
        """Keep how ``start`` ended, for the final summary."""
        try:
            report = analyse(start, self.run_.events, {}, seen, self.run_.plan)
        except Exception:  # a summary must never stop a restart
            report = Report([], None, 1)
        report.hang = self.run_.hangs.get(start.index)
        size = next(iter(start.slots.values())).world_size if start.slots else 0
        following_size = next(iter(following.slots.values())).world_size if following.slots else 0
        if start.slots and size != following_size:
            report.resized = (size, following_size)
        self.run_.earlier.append(report)

    def _procs_of(self, start: Start, found: dict[Any, Any]) -> dict[int, Proc]:
        """rank -> its process, for the ranks of ``start`` that recorded their start and are
        this launcher's children (checked once, by the launcher itself)."""
        procs: dict[int, Proc] = {}
        for slot in start.slots.values():
            key = (start.index, slot.rank)
            proc = self.procs.get(key)
            if proc is None:
                record = found.get(("start", slot.rank))
                if record is None:
                    continue
                proc = self.processes.verify(int(record["pid"]))
                if proc is None:
                    self._gone_before_seen(slot.rank, found)
                    continue
                self.procs[key] = proc
                self.exit_clock.watch(key, proc.pid)
            procs[slot.rank] = proc
        return procs

    def _gone_before_seen(self, rank: int, found: dict[Any, Any]) -> None:
        """A rank whose recorded PID is no child of this launcher's: it ended and torch's agent
        reaped it before the first look. Its records say how (its status is lost); its PID is
        never signalled."""
        watch = self.seen.watch(rank)
        if not watch.gone:
            failed, finished = ("error", rank) in found, ("done", rank) in found
            advance(watch, Sighting.EXITED, time.time_ns(), failed=failed, finished=finished)

    def _check(self, rank: int, proc: Proc, found: dict[Any, Any], start: int) -> None:
        before = time.time_ns()
        running, status = self.processes.status(proc)
        watch = self.seen.watch(rank)
        if running:
            advance(watch, Sighting.RUNNING, before)  # so if it ends, it ends after this
            return
        now = time.time_ns()
        stamp = self._exits.get((start, rank))  # the exit itself, if the clock saw it
        last_alive = watch.alive_at or 0
        at = stamp if stamp is not None and last_alive <= stamp <= now else now
        finished = ("done", rank) in found or status == 0
        failed = ("error", rank) in found or (status is not None and not finished)
        advance(watch, Sighting.EXITED, at, status=status, failed=failed, finished=finished)

    # -- acting on ranks -------------------------------------------------------------------------

    def _stop_survivors(self, procs: dict[int, Proc], found: dict[Any, Any]) -> None:
        """SIGTERM every rank still running (each dumps its stack); SIGKILL after ``grace``.

        A rank frozen by SIGSTOP (or a debugger) does not act on SIGTERM: it is noted as frozen
        for the report and sent SIGCONT right after, so that it dumps its stack and leaves; the
        SIGKILL after ``grace`` ends it in any case.
        """
        self._deadline = time.monotonic() + self.run_.plan.grace
        for rank, proc in procs.items():
            if self.seen.watch(rank).gone or ("error", rank) in found:
                continue  # gone, or already failing and on its way out (SIGKILL after grace)
            frozen = self.processes.frozen(proc)
            advance(self.seen.watch(rank), Sighting.STOP, time.time_ns(), frozen=frozen)
            self.processes.signal_group(proc, signal.SIGTERM)
            self.processes.signal_group(proc, signal.SIGCONT)

    def _watch_exits(self, procs: dict[int, Proc]) -> None:
        """After a rank finished, give the others ``exit_timeout`` to finish, then kill them."""
        if not self.run_.plan.exit_timeout or self._deadline is not None:
            return
        finished = [r for r, w in self.seen.ranks.items() if w.gone and not w.failed_exit]
        if finished and self._exit_deadline is None:
            self._exit_deadline = time.monotonic() + self.run_.plan.exit_timeout
        if self._exit_deadline is None or time.monotonic() < self._exit_deadline:
            return
        late = [rank for rank in procs if not self.seen.watch(rank).gone]
        for rank in late:
            watch = self.seen.watch(rank)
            if watch.state is not RankState.OVERDUE:
                advance(watch, Sighting.OVERDUE, time.time_ns())
                self.processes.ask_for_stack(procs[rank])  # every thread's stack to its log
        if late:
            time.sleep(STACK_WAIT)
        for rank in late:
            self.processes.signal_group(procs[rank], signal.SIGKILL)

    def _forward(self, signum: int) -> None:
        """Pass ``signum`` on to every rank of the latest start."""
        start = self.run_.current
        sent = 0
        if start is not None:
            for slot in start.slots.values():
                proc = self.procs.get((start.index, slot.rank))
                if proc is not None and not self.seen.get(slot.rank).gone:
                    self.processes.signal_group(proc, signum)
                    sent += 1
        name = signal.Signals(signum).name
        self.forwarded = self.forwarded or name
        sys.stderr.write(f"unidist launch: {name} passed on to {sent} rank(s) of this node\n")
        sys.stderr.flush()

    def _finish(self) -> None:
        """The job ended: the last look (records and exits only), then every rank's process
        group is killed (leftover DataLoader workers included), the exit clock and the relay
        stopped (the clock after the look, which may still hand it a process to watch)."""
        try:
            with contextlib.suppress(Exception):  # the sweep must happen whatever the look met
                self.look(final=True)
            for proc in self.procs.values():
                self.processes.signal_group(proc, signal.SIGKILL)
        finally:
            self.exit_clock.stop()
            if self.relay is not None:
                self.relay.stop()

    # -- hangs and stragglers --------------------------------------------------------------------

    def _look_for_hangs(self, start: Start, procs: dict[int, Proc], found: dict[Any, Any]) -> None:
        """Call a hang when no rank made progress for the hang timeout, or another node raised
        the hang flag; report stragglers."""
        for rank in procs:
            self._hosts.setdefault(rank, str(found.get(("start", rank), {}).get("host", "?")))
        if self._deadline is not None or not procs:
            return  # already stopping the job
        elsewhere = self.relay.progress(self.hang.progress_count()) if self.relay else 0
        hung = self.hang.look(start, self.seen, elsewhere)
        if hung:
            self._call_hang(start, procs, found, None)
        elif self._flag is not None and self.hang.enabled and self.hang.called is None:
            self._call_hang(start, procs, found, self._flag)
        if self._stragglers_at is not None and time.monotonic() >= self._stragglers_at:
            self._stragglers_at = time.monotonic() + (self.run_.plan.straggler_every or 0)
            report = self.stragglers(final=False)
            if report is not None and report.found:
                sys.stderr.write(report.format())
                sys.stderr.flush()

    def _call_hang(
        self,
        start: Start,
        procs: dict[int, Proc],
        found: dict[Any, Any],
        flag: HangFlag | None,
    ) -> None:
        live = {rank: proc for rank, proc in procs.items() if not self.seen.watch(rank).gone}
        facts = self.hang.facts(start, procs, self.seen, self._hosts, self.processes.frozen)
        missing: list[int] = []
        if self.relay is not None:
            facts, missing = self.relay.hang_facts(facts)
        for fact in facts:
            if fact.status == "frozen" and fact.rank in live:
                self.processes.signal_group(live[fact.rank], signal.SIGCONT)  # to dump stacks
        self.hang.ask_for_stacks(start, live, self.processes.ask_for_stack)
        called_by = None
        if flag is not None:
            called_by = str(flag.node) if flag.node is not None else "?" if flag.read else ""
        report = self.hang.call(facts, missing, called_by)
        self.run_.hangs[start.index] = report
        with contextlib.suppress(OSError):
            write_report(self.run_.io_folder, "hang.json", report.to_json())
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
        facts = self.hang.facts(start, {}, self.seen, self._hosts, lambda proc: False)
        report = self.hang.straggler_report(facts)
        if final or report.found:
            with contextlib.suppress(OSError):
                write_report(self.run_.io_folder, "stragglers.json", report.to_json())
        return report

    # -- the relay -------------------------------------------------------------------------------

    def _current_round(self) -> str | None:
        return self.run_.round_of(self._start) if self._start >= 0 else None

    def _culprit(self, event: Culprit) -> None:
        """The job's culprit, as the store says: another node's (its ranks' failure stops
        these), or this node's own word, which replaced a wait published elsewhere."""
        start = next((s for s in self.run_.started() if s.index == self._start), None)
        if start is None or event.round != self._current_round():
            return  # an earlier round's: a restart recovered from it
        remote = event.failure
        node = next(iter(start.slots.values())).node_rank  # in the start of that round
        if remote.node_rank == node:
            self.seen.remote = None
            return
        self.seen.remote = RankOutcome(
            remote.rank,
            remote.local_rank,
            remote.host,
            Status(remote.kind),  # one of notices.FAULTS + notices.WAITS: checked as it arrived
            remote.detail,
            remote.exit_code,
            remote.time_ns,
            Path(remote.stdout),
            Path(remote.stderr),
            remote=True,
        )

    def _relay(self, start: Start, found: dict[Any, Any]) -> None:
        """Publish this node's first failure (a rank's own over a wait); leave the round once
        every rank of this node finished."""
        assert self.relay is not None
        failed = [
            outcome_of(start.slots[slot], found, self.seen)
            for slot in sorted(start.slots)
            if start.slots[slot].rank in self.seen.failed_on_their_own
        ]
        failed = [o for o in failed if o.status in notices.FAULTS + notices.WAITS]
        failed.sort(key=lambda o: (o.status not in notices.FAULTS, o.time_ns or 0))
        node = next(iter(start.slots.values())).node_rank
        if failed:
            own = failed[0].status in notices.FAULTS
            if self._told is None or (own and self._told.status not in notices.FAULTS):
                self._told = failed[0]
                self.relay.publish(_failure(failed[0], node))
        if self._left != start.index and self._all_finished(start, found):
            self._left = start.index  # no more round trips: see relay.Relay.leave
            self.relay.leave(functools.partial(records.mark_left, self.run_.events, start.index))

    def _all_finished(self, start: Start, found: dict[Any, Any]) -> bool:
        """Whether every rank of ``start`` finished without error (recorded, or exited 0)."""
        for slot in start.slots.values():
            if ("error", slot.rank) in found:
                return False
            if ("done", slot.rank) not in found and self.seen.get(slot.rank).status != 0:
                return False
        return True


def _failure(outcome: RankOutcome, node_rank: int) -> notices.Failure:
    return notices.Failure(
        rank=outcome.rank,
        local_rank=outcome.local_rank,
        node_rank=node_rank,
        host=outcome.host,
        kind=outcome.status,
        detail="".join(c if c.isprintable() else " " for c in outcome.detail)[:500],
        exit_code=outcome.exit_code,
        time_ns=outcome.time_ns or time.time_ns(),
        stdout=escaped(str(outcome.stdout))[:4096],
        stderr=escaped(str(outcome.stderr))[:4096],
    )
