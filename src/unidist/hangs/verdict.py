"""From what each rank's record says to one line that names the hang, and when to call it one.

Pure functions of the ranks' facts (no processes, no clocks of their own), shared by
``unidist launch`` and :func:`unidist.testing.run_distributed`, so both say the same thing; and
:func:`stopped`, the one fact both read from ``/proc``.

**When.** A job makes progress when any rank issues a collective (on any process group), counts
a step, or moves in its own code (the main thread's innermost frame changes while it is in user
code: a loop that iterates, a save that writes, a download that reads). CPU time alone is not
progress (a rank waiting for a CUDA sync can spin at 100 %), and neither is a rank waiting inside
a collective, whatever its stack does. The job is hung when nothing made progress for the
timeout: a fixed one (``--hang-timeout SECONDS``), or by default (:class:`Deadline`) ten times the
longest silence seen so far, never less than 2 minutes, and never less than 5 minutes during
the job's first 10 minutes (its warm-up: imports, downloads, compilation, the first checkpoint).

**Who.** The ranks that are not waiting in a collective are what the others wait for: a rank in
its own code, waiting for its DataLoader, frozen (SIGSTOP, a debugger), gone (exited), or silent
(its stack thread stopped: a host lost, or C code that holds the GIL). When every rank waits in
a collective, their sequence numbers (torch counts each collective issued on a group) say who is
behind; equal numbers with different collectives mean the ranks diverged.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from unidist.hangs.page import Snapshot, State

__all__ = ["Deadline", "RankFacts", "Straggler", "stopped", "stragglers", "verdict"]

#: The default rule's numbers (see the module docstring).
FACTOR = 10.0
FLOOR = 120.0
WARM_UP = 600.0
WARM_UP_FLOOR = 300.0


_UNSEEN = object()


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T: SIGSTOP, SIGTSTP) or by a tracer (t), as
    ``/proc`` says; False when it cannot be read."""
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    return False


class Deadline:
    """When silence becomes a hang: a fixed timeout, or the adaptive default (``fixed=None``).

    Times are seconds on one monotonic clock, given by the caller: the rule is testable without
    waiting for it.
    """

    def __init__(self, fixed: float | None, started: float) -> None:
        self.fixed = fixed
        self.started = started
        self.last = started  # the last progress
        self.longest = 0.0  # the longest silence between two progresses so far
        self._token: Hashable = _UNSEEN  # what the last look found (see observe)

    def progress(self, now: float) -> None:
        self.longest = max(self.longest, now - self.last)
        self.last = now

    def observe(self, token: Hashable, now: float) -> bool:
        """A look found the ranks in ``token`` (anything that changes when they move): True,
        and progress counted, when it differs from the last look's (the first look sets it)."""
        moved = self._token is not _UNSEEN and token != self._token
        if moved:
            self.progress(now)
        self._token = token
        return moved

    def timeout(self, now: float) -> float:
        """The silence that counts as a hang now (0: never)."""
        if self.fixed is not None:
            return self.fixed
        floor = WARM_UP_FLOOR if now - self.started < WARM_UP else FLOOR
        return max(floor, FACTOR * self.longest)

    def silence(self, now: float) -> float:
        return now - self.last

    def expired(self, now: float) -> bool:
        limit = self.timeout(now)
        return limit > 0 and self.silence(now) >= limit

    def describe(self) -> str:
        if self.fixed is not None:
            return f"--hang-timeout {self.fixed:g}"
        return f"the adaptive hang timeout ({FACTOR:g}x the longest silence, {FLOOR:g} s at least)"


@dataclass
class RankFacts:
    """What is known of one rank when a hang is called."""

    rank: int
    node: int
    host: str
    #: running | exited | frozen | silent (no beat: lost host, GIL held) | unknown (no record)
    status: str
    state: str = State.UNKNOWN.name.lower()  # user | collective | backward | data | done
    op: str = ""
    seq: int = 0  # the world group's sequence number (collectives issued)
    frame: str = ""  # innermost frame of the rank's own code: "path:line function"
    where: str = ""  # innermost frame of all
    steps: int = 0
    exit_code: int | None = None
    stuck_s: float | None = None  # seconds since its main thread last moved
    silent_s: float | None = None  # seconds since its last beat
    pid: int | None = None
    #: Phase samples (user, comm, data, backward) for the straggler report.
    samples: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        rank: int,
        node: int,
        host: str,
        snap: Snapshot | None,
        *,
        exited: int | bool | None = False,
        frozen: bool = False,
        now_ns: int,
        silent_after: float = 3.0,
    ) -> RankFacts:
        """A rank's facts from its last record and what its launcher sees of its process.

        ``exited``: False while it runs, else its exit code (None: unknown); ``frozen``: its
        process is stopped (state T); a beat older than ``silent_after`` s makes it silent.
        """
        fact = cls(rank, node, host, "unknown")
        if snap is not None:
            fact.state = snap.state.name.lower()
            fact.op, fact.seq = snap.op, snap.world_seq
            fact.frame, fact.where = snap.frame, snap.where
            fact.steps, fact.pid = snap.steps, snap.pid
            fact.samples = dict(snap.samples)
            fact.stuck_s = max(0.0, (now_ns - snap.state_at) / 1e9) if snap.state_at else None
            fact.silent_s = max(0.0, (now_ns - snap.beat) / 1e9) if snap.beat else None
        if exited is not False:
            fact.status = "exited"
            fact.exit_code = None if exited is None or exited is True else int(exited)
        elif frozen:
            fact.status = "frozen"
        elif snap is None:
            fact.status = "unknown"
        elif snap.state is State.DONE:
            fact.status = "running"
        elif fact.silent_s is not None and fact.silent_s > silent_after:
            fact.status = "silent"
        else:
            fact.status = "running"
        return fact

    def to_json(self) -> dict[str, Any]:
        value = asdict(self)
        value["frame"] = _frame_json(self.frame)
        value["where"] = _frame_json(self.where)
        return value

    @classmethod
    def from_json(cls, item: Any, max_text: int = 4096) -> RankFacts | None:
        """The facts :meth:`to_json` wrote, or None unless ``item`` has its shape: whole
        numbers, texts of at most ``max_text`` characters, frames as it writes them."""
        if not isinstance(item, dict):
            return None
        texts = ("host", "status", "state", "op")
        numbers = ("rank", "node", "seq", "steps")
        if not all(_is_text(item.get(name), max_text) for name in texts):
            return None
        if not all(_is_count(item.get(name)) for name in numbers):
            return None
        frame = _frame_text(item.get("frame"), max_text)
        where = _frame_text(item.get("where"), max_text)
        code, pid, samples = item.get("exit_code"), item.get("pid"), item.get("samples", {})
        if frame is None or where is None or not isinstance(samples, dict):
            return None
        if not (code is None or _is_int(code)) or not (pid is None or _is_int(pid)):
            return None
        if not all(k in _PHASES and _is_count(v) for k, v in samples.items()):
            return None
        seconds = {name: item.get(name) for name in ("stuck_s", "silent_s")}
        if not all(v is None or (_is_number(v) and v >= 0) for v in seconds.values()):
            return None
        return cls(
            rank=item["rank"],
            node=item["node"],
            host=item["host"],
            status=item["status"],
            state=item["state"],
            op=item["op"],
            seq=item["seq"],
            frame=frame,
            where=where,
            steps=item["steps"],
            exit_code=code,
            stuck_s=None if seconds["stuck_s"] is None else float(seconds["stuck_s"]),
            silent_s=None if seconds["silent_s"] is None else float(seconds["silent_s"]),
            pid=pid,
            samples=dict(samples),
        )


_PHASES = ("user", "comm", "data", "backward")


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_number(value: Any) -> bool:
    """A finite number that fits a float (JSON's integers may not)."""
    if type(value) not in (int, float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _is_text(value: Any, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit


def _frame_text(value: Any, limit: int) -> str | None:
    """A frame as :func:`_frame_json` wrote it, back as text ("" for none); None if malformed."""
    if value is None:
        return ""
    if not isinstance(value, dict):
        return None
    path, line, function = value.get("file"), value.get("line"), value.get("function")
    if not (_is_text(path, limit) and _is_text(function, limit)):
        return None
    if not (line is None or _is_count(line)):
        return None
    return f"{path}:{'' if line is None else line} {function}"


def _frame_json(text: str) -> dict[str, Any] | None:
    if not text:
        return None
    place, _, function = text.rpartition(" ")
    path, _, line = place.rpartition(":")
    return {"file": path, "line": int(line) if line.isdigit() else None, "function": function}


def short(frame: str) -> str:
    """``train.py:57 in slow_step`` from ``/path/to/train.py:57 slow_step``."""
    if not frame:
        return "an unknown place"
    place, _, function = frame.rpartition(" ")
    path, _, line = place.rpartition(":")
    return f"{os.path.basename(path)}:{line} in {function}"


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0, 2`` or ``ranks 0-3`` (runs of consecutive ranks)."""
    values = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{values[i]}-{values[j]}")
        else:
            parts.extend(str(v) for v in values[i : j + 1])
        i = j + 1
    return ("rank " if len(values) == 1 else "ranks ") + ", ".join(parts)


def _in(fact: RankFacts) -> str:
    if fact.state == "backward":
        return f"backward (its DDP/FSDP collectives, #{fact.seq} issued)"
    return f"{fact.op or 'a collective'} #{fact.seq}"


def _waiters(waiting: Sequence[RankFacts]) -> str:
    groups: dict[str, list[int]] = {}
    for fact in waiting:
        groups.setdefault(_in(fact), []).append(fact.rank)
    parts = []
    for where, ranks in sorted(groups.items(), key=lambda item: min(item[1])):
        verb = "waits" if len(ranks) == 1 else "wait"
        parts.append(f"{ranks_text(ranks)} {verb} in {where}")
    return "; ".join(parts)


def _doing(fact: RankFacts) -> str:
    """What a rank that is not waiting in a collective is doing, as the verdict words it."""
    at = f"at {short(fact.frame)}"
    if fact.status == "exited":
        code = "?" if fact.exit_code is None else fact.exit_code
        return f"exited with code {code} at step {fact.steps}"
    if fact.status == "silent" and not fact.frame:  # its launcher said nothing either
        return f"on {fact.host} stopped answering (host lost?)"
    if fact.status == "silent":
        ago = f" {fact.silent_s:.0f} s ago" if fact.silent_s is not None else ""
        return f"on {fact.host} stopped answering{ago} (host lost, or C code holding the GIL) {at}"
    if fact.status == "frozen":
        return f"is frozen (SIGSTOP or a debugger) {at}"
    if fact.status == "unknown":
        return "never reported where it is (it did not start, or not under unidist)"
    if fact.state == "data":
        return f"waits for its DataLoader {at}"
    if fact.state == "done":
        return "returned from its script"
    return f"is in user code {at}"


def verdict(facts: Sequence[RankFacts]) -> str:
    """One line: who is stuck where, and what the others wait in."""
    waiting = [f for f in facts if f.status == "running" and f.state in ("collective", "backward")]
    others = [f for f in facts if f not in waiting]
    if others:
        # With ranks waiting in a collective, one that left is the likeliest reason; without,
        # the ranks that left simply finished, and the ones still running are the story.
        order = (
            ("exited", "silent", "frozen", "running", "unknown")
            if waiting
            else ("silent", "frozen", "running", "unknown", "exited")
        )
        others.sort(key=lambda f: (order.index(f.status) if f.status in order else 9, f.rank))
        lead = others[0]
        same = [f for f in others if _doing(f) == _doing(lead)]
        text = f"{ranks_text(f.rank for f in same)} {_doing(lead)}"
        rest = [f for f in others if f not in same]
        if rest:
            text += "; " + "; ".join(f"{ranks_text([f.rank])} {_doing(f)}" for f in rest)
        return text + (f" while {_waiters(waiting)}" if waiting else "")
    if not waiting:
        return "no rank is running"
    seqs = {f.seq for f in waiting}
    if len(seqs) > 1:
        behind = min(seqs)
        late = [f for f in waiting if f.seq == behind]
        ahead = [f for f in waiting if f.seq != behind]
        return f"{_waiters(late)} while {_waiters(ahead)}"
    places = {_in(f) for f in waiting}
    if len(places) > 1:
        return "ranks diverged: " + ", ".join(f"rank {f.rank} in {_in(f)}" for f in waiting)
    return (
        f"every rank waits in {places.pop()}: the collective itself does not complete "
        "(a lost connection, a network or NCCL problem)"
    )


# -- stragglers --------------------------------------------------------------------------------

#: A rank is a straggler when its time outside collectives is at least this many times the
#: median of the others', by at least MARGIN of its time, over at least MIN_SAMPLES looks.
RATIO = 1.5
MARGIN = 0.10
MIN_SAMPLES = 50


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: int
    host: str
    ratio: float  # its time outside collectives over the others' median
    phase: str  # "compute" or "data loading"
    busy: float  # fraction of its time outside collectives
    median_busy: float
    phases: dict[str, float]  # its fractions: compute, data, communication

    def line(self) -> str:
        return (
            f"rank {self.rank} (node {self.node}, {self.host}) is {self.ratio:.1f}x slower than "
            f"the median rank, in {self.phase}: outside collectives {self.busy:.0%} of its time, "
            f"the others {self.median_busy:.0%} (compute {self.phases['compute']:.0%}, data "
            f"{self.phases['data']:.0%}, communication {self.phases['communication']:.0%})"
        )


def _fractions(samples: dict[str, int]) -> dict[str, float] | None:
    total = sum(samples.values())
    if total < MIN_SAMPLES:
        return None
    return {
        # backward holds DDP's wait for the others' gradients: neither compute nor data here
        "compute": samples.get("user", 0) / total,
        "data": samples.get("data", 0) / total,
        "communication": (samples.get("comm", 0) + samples.get("backward", 0)) / total,
    }


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def stragglers(facts: Sequence[RankFacts]) -> list[Straggler]:
    """The ranks consistently slower than the others, from their phase samples."""
    fractions = {f.rank: _fractions(f.samples) for f in facts}
    known = {rank: value for rank, value in fractions.items() if value is not None}
    if len(known) < 2:
        return []
    busy = {rank: value["compute"] + value["data"] for rank, value in known.items()}
    found = []
    for fact in facts:
        if fact.rank not in known:
            continue
        others = [b for rank, b in busy.items() if rank != fact.rank]
        median = _median(others)
        mine = busy[fact.rank]
        if mine - median < MARGIN or mine < RATIO * median:
            continue
        phases = known[fact.rank]
        median_data = _median([known[r]["data"] for r in known if r != fact.rank])
        median_compute = _median([known[r]["compute"] for r in known if r != fact.rank])
        phase = (
            "data loading"
            if phases["data"] - median_data > phases["compute"] - median_compute
            else "compute"
        )
        found.append(
            Straggler(
                fact.rank,
                fact.node,
                fact.host,
                mine / median if median > 0 else float("inf"),
                phase,
                mine,
                median,
                phases,
            )
        )
    return found
