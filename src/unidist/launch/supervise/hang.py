"""The launcher's side of hang and straggler attribution: read the ranks' records, call the hang.

Every rank keeps a progress record (``unidist.hangs``). The supervisor hands this module its
view of the latest start a few times a second; :class:`HangWatch` reads the records of this
node's ranks (O(local ranks) reads of one page each), notes when anything moved, and says when
the silence has lasted the timeout (``--hang-timeout``, or the adaptive default of
``unidist.hangs.verdict.Deadline``). Across nodes, the relay adds every node's progress to
one counter in the rendezvous store, so a node whose own ranks wait while another node's work is
not silent, and publishes each node's facts when the hang is called, so every node prints the
same report.

When it is called, :meth:`HangWatch.call` asks each rank for a dump of every thread's stack (its
stack thread answers within a tick; a rank that cannot, because it is frozen or in C code
holding the GIL, gets the launcher's stack signal, which faulthandler answers from inside any C
code), then builds
each rank's facts (running, exited with its code, frozen, silent) and the verdict. The report
goes to ``hang.json`` in the run folder and to the console; the supervisor then stops the job.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unidist.hangs import page
from unidist.hangs.page import Snapshot, State
from unidist.hangs.verdict import Deadline, RankFacts, Straggler, stragglers, verdict
from unidist.launch.printing import escaped, shown
from unidist.launch.records import Start
from unidist.launch.supervise.procs import Proc
from unidist.launch.supervise.watch import Observed

__all__ = ["HANG_EXIT_CODE", "HangReport", "HangWatch", "StragglerReport", "render"]

#: ``unidist launch``'s exit code when it stopped a hung job.
HANG_EXIT_CODE = 125
#: A beat older than this (seconds) means the rank's stack thread cannot run.
SILENT_AFTER = 3.0
#: Seconds a rank gets to dump its stacks before the report is written.
DUMP_WAIT = 1.0


@dataclass
class HangReport:
    """A hang, as the launcher called it."""

    verdict: str
    silence: float
    timeout: float
    rule: str
    facts: list[RankFacts]
    nodes_missing: list[int] = field(default_factory=list)
    #: Who called it, when not this node's own watch: the node a hang flag on the rendezvous
    #: store names ("?": a value no launcher of the job writes; "": a flag whose value the
    #: store did not hand over).
    called_by: str | None = None

    def headline(self) -> str:
        if self.called_by is not None:
            if self.called_by == "?":
                who = "a writer of the rendezvous store that is no launcher of this job"
            elif not self.called_by:
                who = "another node's launcher (its flag's value could not be read)"
            else:
                who = f"node {self.called_by}'s launcher, as its flag says"
            return (
                f"unidist launch: the hang was called by {who} (the hang flag on the rendezvous "
                f"store); here the last progress was {self.silence:.0f} s ago ({self.rule}): "
                f"{self.verdict}"
            )
        return (
            f"unidist launch: no rank made progress for {self.silence:.0f} s ({self.rule}): "
            f"{self.verdict}"
        )

    def format(self, logs: Mapping[int, Path] | None = None) -> str:
        lines = [self.headline()]
        for fact in sorted(self.facts, key=lambda f: f.rank):
            lines.append(f"  {_describe(fact)}")
            if logs is not None and fact.rank in logs:
                lines.append(f"      every thread's stack: {shown(logs[fact.rank])}")
        # A frame, a host or an operation is the ranks' text: never a terminal's command.
        return "".join(escaped(line) + "\n" for line in lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "hang",
            "verdict": self.verdict,
            "silence_s": round(self.silence, 3),
            "timeout_s": round(self.timeout, 3),
            "rule": self.rule,
            "called_by": self.called_by,
            "nodes_missing": self.nodes_missing,
            "ranks": [fact.to_json() for fact in sorted(self.facts, key=lambda f: f.rank)],
        }


@dataclass
class StragglerReport:
    """The ranks consistently slower than the others, over the job so far."""

    found: list[Straggler]
    ranks: int
    seconds: float

    def format(self) -> str:
        if not self.found:
            return ""
        lines = [f"unidist launch: stragglers over {self.seconds:.0f} s of {self.ranks} ranks:"]
        lines.extend(f"  {s.line()}" for s in self.found)
        return "".join(escaped(line) + "\n" for line in lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "stragglers",
            "seconds": round(self.seconds, 3),
            "ranks": self.ranks,
            "stragglers": [s.__dict__ for s in self.found],
        }


def _describe(fact: RankFacts) -> str:
    where = f"{fact.frame}" if fact.frame else "(no frame)"
    if fact.status == "exited":
        how = f"exited with code {fact.exit_code} after {fact.steps} step(s)"
    elif fact.status == "frozen":
        how = f"frozen (SIGSTOP or a debugger), last at {where}"
    elif fact.status == "silent":
        how = (
            f"silent for {fact.silent_s or 0:.0f} s (host lost, or C code holding the GIL), "
            f"last at {where}"
        )
    elif fact.status == "unknown":
        how = "no progress record"
    elif fact.state in ("collective", "backward"):
        what = f"{fact.op} #{fact.seq}" if fact.state == "collective" else f"backward #{fact.seq}"
        how = f"waiting in {what}, called from {where}"
    elif fact.state == "data":
        how = f"waiting for its DataLoader at {where}"
    else:
        stuck = f" for {fact.stuck_s:.0f} s" if fact.stuck_s else ""
        how = f"in user code at {where}{stuck}"
    pid = f", pid {fact.pid}" if fact.pid else ""
    return f"rank {fact.rank} (node {fact.node}, {fact.host}{pid}): {how}; step {fact.steps}"


class HangWatch:
    """One node's view of its ranks' progress; calls the hang (see the module docstring).

    Args:
        events: the run's record folder (the ranks' progress records are there).
        fixed: ``--hang-timeout``: None for the adaptive default, 0 for never.
        clock: monotonic seconds (a test passes its own).
    """

    def __init__(
        self, events: Path, fixed: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.events = events
        self.fixed = fixed
        self.clock = clock
        self.deadline = Deadline(fixed, clock())
        self._start = -1
        self._own: Any = None  # this node's part of the last look's token
        self.snapshots: dict[int, Snapshot] = {}
        self._moves = 0  # looks that found this node's ranks moved (for the relay)
        self.called: HangReport | None = None
        self.started = clock()

    @property
    def enabled(self) -> bool:
        return self.fixed != 0

    def path(self, start: int, rank: int) -> Path:
        return page.path_for(self.events, rank, start)

    def look(self, start: Start, seen: Observed, elsewhere: int = 0) -> bool:
        """Read this node's records; True when the silence has become a hang.

        ``elsewhere``: the other nodes' progress count (relayed), which counts as progress too.
        """
        now = self.clock()
        if start.index != self._start:  # a restart: a new job, as far as progress goes
            self._start, self._own, self.snapshots = start.index, None, {}
            self.deadline = Deadline(self.fixed, now)
            self.called = None
        for slot in start.slots.values():
            snap = page.read(self.path(start.index, slot.rank))
            if snap is not None:
                self.snapshots[slot.rank] = snap
        gone = tuple(sorted(rank for rank, w in seen.ranks.items() if w.gone))
        own = (tuple((rank, s.progress) for rank, s in sorted(self.snapshots.items())), gone)
        # Only this node's own moves go to the relay's count: counting the others' (which
        # that count holds) would make two waiting nodes move each other.
        if self.deadline.observe((own, elsewhere), now):
            self._moves += own != self._own
        self._own = own
        if not self.enabled or self.called is not None:
            return False
        every_rank_done = start.slots and all(
            seen.get(slot.rank).gone
            or (slot.rank in self.snapshots and self.snapshots[slot.rank].state is State.DONE)
            for slot in start.slots.values()
        )
        return not every_rank_done and self.deadline.expired(now)

    def refresh(self, start: Start) -> None:
        """Read this node's records again (their last word, once the ranks have ended)."""
        for slot in start.slots.values():
            snap = page.read(self.path(start.index, slot.rank))
            if snap is not None:
                self.snapshots[slot.rank] = snap

    def progress_count(self) -> int:
        """This node's progress as one number that only grows (for the relay): the looks that
        found anything moved. (The records' own counts may go down: a rank's steps are its
        loader's batches until a ResumableState counts them.)"""
        return self._moves

    def ask_for_stacks(
        self, start: Start, procs: Mapping[int, Proc], signal: Callable[[Proc], None]
    ) -> None:
        """Every live rank dumps every thread's stack into its stderr log: through its sampler
        thread, or, for a rank that cannot answer within :data:`DUMP_WAIT`, through ``signal``
        (the stack signal, which faulthandler answers: the rank's bootstrap registers it)."""
        asked = {}
        for rank in procs:
            asked[rank] = page.ask_for_stacks(self.path(start.index, rank))
        deadline = time.monotonic() + DUMP_WAIT
        waiting = dict(asked)
        while waiting and time.monotonic() < deadline:
            for rank, number in list(waiting.items()):
                snap = page.read(self.path(start.index, rank))
                if snap is not None and snap.answered >= number:
                    del waiting[rank]
            if waiting:
                time.sleep(0.05)
        for rank in waiting:
            signal(procs[rank])

    def facts(
        self,
        start: Start,
        procs: Mapping[int, Proc],
        seen: Observed,
        hosts: Mapping[int, str],
        frozen: Callable[[Proc], bool],
    ) -> list[RankFacts]:
        """This node's ranks as the verdict needs them (``procs``: their verified processes)."""
        now_ns = time.monotonic_ns()
        found = []
        for slot in sorted(start.slots.values(), key=lambda s: s.rank):
            snap = self.snapshots.get(slot.rank)
            watch = seen.get(slot.rank)
            proc = procs.get(slot.rank)
            exited: int | bool | None = False
            if watch.gone:
                exited = None if watch.status is None else _code(watch.status)
            found.append(
                RankFacts.of(
                    slot.rank,
                    slot.node_rank,
                    hosts.get(slot.rank, "?"),
                    snap,
                    exited=exited,
                    frozen=proc is not None and not watch.gone and frozen(proc),
                    now_ns=now_ns,
                    silent_after=SILENT_AFTER,
                )
            )
        return found

    def call(
        self,
        facts: list[RankFacts],
        nodes_missing: list[int] | None = None,
        called_by: str | None = None,
    ) -> HangReport:
        """The hang, as this node reports it (``called_by``: the node whose flag called it)."""
        now = self.clock()
        self.called = HangReport(
            verdict(facts),
            self.deadline.silence(now),
            self.deadline.timeout(now),
            self.deadline.describe(),
            facts,
            sorted(nodes_missing or []),
            called_by,
        )
        return self.called

    def straggler_report(self, facts: list[RankFacts]) -> StragglerReport:
        return StragglerReport(stragglers(facts), len(facts), self.clock() - self.started)


def _code(status: int) -> int:
    return 128 - status if status < 0 else status


def write(folder: Path, name: str, value: dict[str, Any]) -> Path:
    """``value`` as JSON in the run folder (private, replaced atomically)."""
    path = folder / name
    tmp = folder / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as stream:
        json.dump(value, stream, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def render(folder: Path) -> str:
    """``unidist report RUN_DIR``: the hang and straggler reports of a run, again; a file that
    is not one of them is named in one line."""
    parts = []
    for name in ("hang.json", "stragglers.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as exc:
            parts.append(f"{shown(path)}: cannot be read ({escaped(str(exc))[:200]})\n")
            continue
        try:
            parts.append(_render_one(value))
        except _NotAReport as exc:
            parts.append(f"{shown(path)}: not a unidist report ({exc})\n")
    return "".join(parts)


class _NotAReport(ValueError):
    """A field of the report that is not as unidist writes it."""


def _render_one(value: Any) -> str:
    if not isinstance(value, dict):
        raise _NotAReport("not a JSON object")
    if value.get("kind") == "hang":
        items = value.get("ranks", [])
        if not isinstance(items, list):
            raise _NotAReport('"ranks" is not a list')
        facts = []
        for index, item in enumerate(items):
            fact = RankFacts.from_json(item)
            if fact is None:
                raise _NotAReport(f'"ranks"[{index}] is not one rank\'s facts')
            facts.append(fact)
        missing = value.get("nodes_missing", [])
        called_by = value.get("called_by")
        if not isinstance(missing, list) or not all(type(n) is int for n in missing):
            raise _NotAReport('"nodes_missing" is not a list of node numbers')
        if not (called_by is None or isinstance(called_by, str)):
            raise _NotAReport('"called_by" is not a text')
        report = HangReport(
            _text(value, "verdict"),
            _seconds(value, "silence_s"),
            _seconds(value, "timeout_s"),
            _text(value, "rule"),
            facts,
            missing,
            called_by,
        )
        return report.format()
    if value.get("kind") == "stragglers":
        return _render_stragglers(value)
    raise _NotAReport('its "kind" is neither "hang" nor "stragglers"')


def _render_stragglers(value: dict[str, Any]) -> str:
    found = value.get("stragglers", [])
    if not isinstance(found, list):
        raise _NotAReport('"stragglers" is not a list')
    lines = [f"unidist launch: stragglers over {_seconds(value, 'seconds'):.0f} s:"]
    for item in found:
        try:
            lines.append(f"  {Straggler(**item).line()}")
        except (TypeError, KeyError, ValueError, ArithmeticError) as exc:
            raise _NotAReport(f"a straggler is not as unidist writes one ({exc})") from None
    if not found:
        lines.append("  none: every rank kept pace with the others")
    return "".join(escaped(line) + "\n" for line in lines)


def _text(value: dict[str, Any], name: str) -> str:
    found = value.get(name, "")
    if not isinstance(found, str):
        raise _NotAReport(f'"{name}" is not a text')
    return found


def _seconds(value: dict[str, Any], name: str) -> float:
    found = value.get(name, 0)
    try:
        seconds = float(found) if type(found) in (int, float) else -1.0
    except OverflowError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise _NotAReport(f'"{name}" is not a number of seconds')
    return seconds
