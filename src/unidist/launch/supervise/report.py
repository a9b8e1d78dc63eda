"""Who failed, who was only collateral damage, and the one summary the launcher prints.

torchrun blames the failure with the earliest timestamp, which can be a rank that merely timed
out waiting for the real culprit; Composer's launcher reports the first non-zero exit code in rank
order, often the SIGTERM of a healthy rank it stopped itself. Here each rank's own record says
*why* it failed: its own exception, a crash, or a consequence of another rank (a collective whose
peer went away, or a timeout waiting for one). The culprit is the earliest rank that failed on
its own; if every failure was a wait, it is the rank the others were waiting for, the one the
launcher found still running (a rank frozen by SIGSTOP first). When a rank failed on another
node, its launcher's word (relayed through the rendezvous store,
:mod:`unidist.launch.supervise.relay`) names the culprit on every node. Only the last start of
the ranks counts: a failure that a restart (``--max-restarts``) recovered from is history, not
the outcome.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unidist.launch import records
from unidist.launch.printing import escaped, shown
from unidist.launch.records import Slot, Start
from unidist.launch.supervise import excerpts
from unidist.launch.supervise.outcome import OWN, WAITED, RankOutcome, Status
from unidist.launch.supervise.watch import Observed, RankState

if TYPE_CHECKING:
    from unidist.launch.plan.job import LaunchPlan
    from unidist.launch.supervise.hang import HangReport, StragglerReport

__all__ = [
    "Observed",  # defined in unidist.launch.supervise.watch
    "RankOutcome",
    "Report",
    "analyse",
    "exit_code_of",
    "outcome_of",
]


@dataclass
class Report:
    """The outcome of a run on this node."""

    outcomes: list[RankOutcome]
    culprit: RankOutcome | None
    exit_code: int
    interrupted: str | None = None
    #: The reports of the starts a restart replaced (``--max-restarts``), oldest first.
    earlier: list[Report] = field(default_factory=list)
    #: Whether the job spans several nodes (the summary then counts this node's ranks).
    several_nodes: bool = False
    #: (world size of this start, of the start that replaced it) when the two differ.
    resized: tuple[int, int] | None = None
    #: The hang the launcher called in this start (it then stopped every rank).
    hang: HangReport | None = None
    #: The ranks consistently slower than the others (printed when there are any).
    stragglers: StragglerReport | None = None
    #: The run folder's handle (``runner.FolderHandle``), open while the report reads the logs
    #: through it.
    handle: Any = None

    @property
    def failed(self) -> bool:
        """Whether the job failed (or was interrupted)."""
        return self.exit_code != 0

    def format(self) -> str:
        """The summary printed at the end of a run: what failed, or, for a job that succeeded
        after restarts, one line saying so and what each replaced attempt died of. Empty for a
        job that succeeded at once. Non-printable characters (a frame's, a log's) are shown
        escaped: nothing in it reaches the terminal as a control sequence."""
        text = self._format()
        return "".join(escaped(line) + "\n" for line in text.splitlines())

    def _format(self) -> str:
        if not self.failed:
            if not self.earlier:
                return self._straggler_text()
            where = " on this node" if self.several_nodes else ""
            return (
                f"unidist launch: all {len(self.outcomes)} ranks{where} succeeded after "
                f"{len(self.earlier)} restart(s); {self._history()}.\n"
            ) + self._straggler_text()
        lines = [f"unidist launch: the job failed (exit code {self.exit_code})."]
        if self.interrupted in ("SIGUSR1", "SIGUSR2"):
            lines[0] = (
                f"unidist launch: {self.interrupted} was passed on to every rank, and they "
                f"stopped (exit code {self.exit_code})."
            )
        elif self.interrupted:
            lines[0] = f"unidist launch: interrupted by {self.interrupted}; every rank was stopped."
        if self.hang is not None:
            logs = {o.rank: o.stderr for o in self.outcomes if not o.remote}
            return (
                self.hang.format(logs)
                + f"  every rank was stopped (exit code {self.exit_code}); hang.json in the run "
                "folder has the same facts (unidist report RUN_DIR shows them again)\n"
                + self._straggler_text()
            )
        if self.earlier:
            lines.append(f"  after {len(self.earlier)} restart(s): {self._history()}")
        if self.culprit is not None:
            lines.append(f"  culprit: {_describe(self.culprit)}")
            lines.extend(_log_error(self.culprit))
            lines.extend(excerpts.excerpt(self.culprit))
        others = [o for o in self.outcomes if o is not self.culprit and o.status != Status.OK]
        for title, kinds in (
            ("failed because of another rank", WAITED + OWN),
            ("stopped by the launcher", (Status.STOPPED,)),
        ):
            group = [o for o in others if o.status in kinds]
            if group:
                lines.append(f"  {title}:")
                for outcome in group:
                    lines.append(f"    {_describe(outcome)}")
                    lines.extend("  " + line for line in _log_error(outcome))
                    lines.extend("  " + line for line in excerpts.excerpt(outcome, 6))
        return "\n".join(lines) + "\n"

    def _straggler_text(self) -> str:
        return self.stragglers.format() if self.stragglers is not None else ""

    def _history(self) -> str:
        """``attempt 0 failed: rank 1 ... (logs: ...); attempt 1 ...`` for the earlier starts."""
        parts = []
        for attempt, report in enumerate(self.earlier):
            if report.hang is not None:
                parts.append(f"attempt {attempt} hung: {report.hang.verdict}")
                continue
            culprit = report.culprit
            if culprit is None:
                failed = [o for o in report.outcomes if o.status not in (Status.OK, Status.STOPPED)]
                culprit = failed[0] if failed else None
            sigterm = 128 + signal.SIGTERM  # "crashed": the launcher's own SIGTERM is "stopped"
            if report.resized and (
                culprit is None or (culprit.status, culprit.exit_code) == (Status.CRASHED, sigterm)
            ):
                # No failure, or a SIGTERM the launcher did not send, and the next start has
                # another world size: torch's agent stops every rank with SIGTERM when a node
                # joins or leaves (and reaps them, so their exit status may be unseen).
                before, after = report.resized
                parts.append(
                    f"attempt {attempt} was stopped by torch's agent when the nodes changed "
                    f"(world size {before} -> {after})"
                )
                continue
            if culprit is None:
                parts.append(
                    f"attempt {attempt} was restarted without a failure of this node's ranks "
                    "(another node failed, or the nodes changed)"
                )
                continue
            log = (
                "" if culprit.status == Status.LOST else f" (log: {shown(culprit.stderr)})"
            )  # not here
            parts.append(
                f"attempt {attempt} failed: {_describe(culprit)}{log}"
                + (f"; {culprit.log_error}" if culprit.log_error else "")
            )
        return "; ".join(parts)


def _describe(o: RankOutcome) -> str:
    if o.status == Status.LOST:  # a whole node, named by the launcher that watched it
        return f"rank {o.rank} and the other ranks of {o.host}: {o.detail}"
    code = "" if o.exit_code is None else f", exit code {o.exit_code}"
    told = f" (reported by the launcher on {o.host})" if o.remote else ""
    return f"rank {o.rank} (local rank {o.local_rank}) on {o.host}: {o.detail}{code}{told}"


def _log_error(o: RankOutcome) -> list[str]:
    return [f"      {o.log_error}"] if o.log_error else []


def exit_code_of(code: int) -> int:
    """A process's exit status as a shell reports it (a signal N becomes 128 + N)."""
    return 128 - code if code < 0 else code


def analyse(
    start: Start | None,
    events: Path,
    exit_codes: dict[int, int],
    seen: Observed,
    plan: LaunchPlan,
    interrupted: str | None = None,
    progress: dict[int, tuple[int, str, int]] | None = None,
) -> Report:
    """Classify every rank of this node's last start and find the culprit.

    Args:
        start: the last start of this node's ranks (None: none started).
        events: the run's record folder.
        exit_codes: local rank -> exit code, for the ranks torch's agent saw fail.
        seen: what the supervisor saw of that start.
        plan: the run's plan.
        interrupted: the signal that interrupted the launcher, if any.
        progress: rank -> (steps, the collective it was in or "", its sequence number), from
            the ranks' progress records (the last look).
    """
    found = records.read(events, start.index) if start is not None else {}
    slots = start.slots.values() if start is not None else []
    outcomes = [_outcome(slot, found, exit_codes.get(slot.local_rank), seen) for slot in slots]
    _decide_unrecorded(outcomes, seen, plan)
    if interrupted:
        return Report(outcomes, None, 128 + signal.Signals[interrupted].value, interrupted)
    failures = [o for o in outcomes if o.status != Status.OK]
    if seen.remote is not None:  # the whole job's culprit, the same on every node
        # Its exit code, not this node's: these ranks were stopped because of it.
        return Report(outcomes, seen.remote, seen.remote.exit_code or 1)
    if not failures:
        if exit_codes:  # torch saw a failure the records cannot place: never report success
            return Report(outcomes, None, exit_code_of(next(iter(exit_codes.values()))) or 1)
        return Report(outcomes, None, 0)
    culprit = _returned_early(outcomes, found, progress or {}) or _culprit(outcomes, seen)
    code: int | None = next((o.exit_code for o in sorted(failures, key=_when) if o.exit_code), None)
    if culprit is not None and culprit.status in OWN and culprit.exit_code:
        code = culprit.exit_code
    return Report(outcomes, culprit, code or 1)


def _decide_unrecorded(outcomes: list[RankOutcome], seen: Observed, plan: LaunchPlan) -> None:
    """Decide the ranks the records alone could not: hung, vanished, stopped by torch's agent."""
    for o in outcomes:
        watch = seen.get(o.rank)
        if watch.state is RankState.OVERDUE and o.status in (
            Status.OK,
            Status.CRASHED,
            Status.STOPPED,
            Status.VANISHED,
        ):
            o.status, o.exit_code, o.time_ns = Status.HUNG, 124, watch.overdue_at
            o.detail = (
                f"had not finished {plan.exit_timeout:g} s after another rank did; "
                "killed (its stack is below; a gloo process-group destructor "
                "deadlock in torch < 2.8 looks like a frozen line at exit)"
            )
    failed = [o for o in outcomes if o.status not in (Status.OK, Status.VANISHED)]
    # The earliest a failure other than a SIGTERM can have happened. A crash is only seen by
    # the supervisor's next look, so it happened after the sweep that last saw that rank
    # running: two ranks found gone in one sweep could have died in either order, and a
    # SIGTERM'd rank is then torch's agent stopping the group, not a second culprit.
    first = min(
        (
            _earliest(seen, o) if o.status == Status.CRASHED else _when(o)
            for o in failed
            if o.status != Status.CRASHED or not _terminated(o)
        ),
        default=None,
    )
    for o in outcomes:
        if o.status == Status.VANISHED:
            # Gone without a record and torch reaped it before its status could be read: if
            # nothing failed it finished; otherwise torch's agent stopped it with the group.
            o.status, o.detail = (
                (Status.STOPPED, "stopped while still running")
                if failed
                else (Status.OK, "finished")
            )
        elif (
            o.status == Status.CRASHED and _terminated(o) and first is not None and first < _when(o)
        ):
            o.status, o.detail = (
                Status.STOPPED,
                "stopped by torch's agent after another rank failed",
            )


def _earliest(seen: Observed, o: RankOutcome) -> int:
    """The earliest a crash can have happened: when the sweep that last saw it running began.

    A rank no sweep saw running (it ended within one sweep of its start: ``sh -c "exit 3"``)
    can have died at any moment since its start, before a rank SIGTERMed by torch's agent.
    """
    alive = seen.get(o.rank).alive_at
    return alive if alive is not None else 0


def _terminated(o: RankOutcome) -> bool:
    return o.exit_code == 128 + signal.SIGTERM


def _when(o: RankOutcome) -> int:
    return o.time_ns if o.time_ns is not None else 2**63


def _returned_early(
    outcomes: list[RankOutcome],
    found: dict[tuple[str, int], dict[str, Any]],
    progress: dict[int, tuple[int, str, int]],
) -> RankOutcome | None:
    """A rank that returned from its script while another still waited for it in a collective
    (uneven data): the others fail when its sockets close (gloo) and would blame one another."""
    waited = sorted((o for o in outcomes if o.status in WAITED), key=_when)
    if not waited or any(o.status in OWN for o in outcomes):
        return None
    early = [
        o for o in outcomes if ("done", o.rank) in found and o.status in (Status.OK, Status.STOPPED)
    ]
    if not early:
        return None
    culprit, waiter = early[0], waited[0]
    steps = progress.get(culprit.rank, (0, "", 0))[0]
    _, op, seq = progress.get(waiter.rank, (0, "", 0))
    where = f"{op} #{seq}" if op else "a collective"
    culprit.status, culprit.exit_code = Status.RETURNED, None
    culprit.detail = (
        f"returned from its script (exit code 0) after {steps} step(s) while rank "
        f"{waiter.rank} still waited for it in {where}: every rank must run the same "
        "collectives (uneven data? give every rank the same number of batches)"
    )
    return culprit


def _culprit(outcomes: list[RankOutcome], seen: Observed) -> RankOutcome | None:
    own = sorted((o for o in outcomes if o.status in OWN), key=_when)
    if own:
        return own[0]
    waited = sorted((o for o in outcomes if o.status in WAITED), key=_when)
    still_running = [o for o in outcomes if o.status == Status.STOPPED]
    still_running.sort(key=lambda o: not seen.get(o.rank).frozen)  # a frozen rank first
    if waited and still_running:
        suspect = still_running[0]
        frozen = seen.get(suspect.rank).frozen
        how = "frozen (stopped by SIGSTOP or a debugger)" if frozen else ""
        suspect.detail = (
            f"{how or 'still running'} when rank {waited[0].rank} gave up waiting for it "
            f"({waited[0].detail}); stopped by the launcher, its stack is below"
        )
        return suspect
    return waited[0] if waited else None


_ERROR_WORDS = {
    "raised": "raised",
    "collateral": "failed after another rank went away:",
    "timeout": "timed out waiting for another rank:",
}


def outcome_of(
    slot: Slot, found: dict[tuple[str, int], dict[str, Any]], seen: Observed
) -> RankOutcome:
    """How one rank ended, from its records and what the supervisor saw so far."""
    return _outcome(slot, found, None, seen)


def _outcome(
    slot: Slot, found: dict[tuple[str, int], dict[str, Any]], torch_code: int | None, seen: Observed
) -> RankOutcome:
    rank = slot.rank
    watch = seen.get(rank)
    status = watch.status
    raw = torch_code if torch_code is not None else status
    code = None if raw is None or raw == 0 else exit_code_of(raw)
    error = found.get(("error", rank))

    def outcome(kind: Status, detail: str, when: int | None) -> RankOutcome:
        host = str(found.get(("start", rank), {}).get("host", "?"))
        return RankOutcome(
            rank,
            slot.local_rank,
            host,
            kind,
            detail,
            code,
            when,
            slot.stdout,
            slot.stderr,
            read_stdout=slot.read_stdout,
            read_stderr=slot.read_stderr,
        )

    if error is not None and error.get("kind") in _ERROR_WORDS:
        message = str(error.get("message") or "")
        first_line = message.splitlines()[0] if message else ""
        detail = f"{_ERROR_WORDS[error['kind']]} {error.get('type')}: {first_line[:300]}"
        return outcome(Status(error["kind"]), detail.strip(), int(error["time_ns"]))
    gone, stopped = watch.gone_at, watch.stopped_at
    if stopped is not None:  # the launcher stops only ranks it has not seen gone
        if watch.frozen:
            frozen = "frozen (process state T: SIGSTOP or a debugger) when another rank failed"
            return outcome(Status.STOPPED, f"{frozen}; woken and stopped by the launcher", stopped)
        return outcome(Status.STOPPED, "stopped while still running", stopped)
    if raw is not None and raw != 0:
        if raw < 0:
            how = f"killed by {signal.Signals(-raw).name} (not by the launcher)"
        else:
            how = f"exited with code {raw} without a Python exception"
        return outcome(Status.CRASHED, how, gone)
    if ("done", rank) in found or status == 0:
        return outcome(Status.OK, "finished", None)
    if gone is not None:
        return outcome(Status.VANISHED, "", gone)
    return outcome(Status.OK, "finished", None)
