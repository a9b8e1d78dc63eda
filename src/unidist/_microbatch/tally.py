"""The microbatch vote: what each rank reports after an attempt, and the tally every rank gets.

Each rank sends a :class:`Vote` as plain JSON; one rank (the last to arrive at the control store)
runs :func:`combine` over all of them, and every rank reads the same :class:`Tally`. The tally
is small whatever the world size: counts, extremes, the parameters missing everywhere, every
failing rank's number, and the details of the first few failures only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

__all__ = ["Tally", "Vote", "combine"]

Status = Literal["ok", "oom", "aborted", "error"]
_STATUSES: tuple[str, ...] = get_args(Status)
#: Failures of each kind (error, OOM) whose details the tally keeps; the rest are named by rank.
DETAILED_FAILURES = 8
_DETAIL_CHARS = 4000
#: No model has this many parameter tensors; a run beyond it is garbage.
_MAX_INDEX = 2**24


@dataclass(frozen=True)
class Vote:
    """What one rank reports after an attempt (sent to every rank as JSON, so small)."""

    status: Status
    #: Microbatch size this rank used (its batch may be smaller than the common size).
    size: int
    #: Samples in this rank's batch.
    total: int
    #: Why (the OOM reason or the error) and where.
    detail: str = ""
    #: Parameters without a gradient on this rank (for gradient averaging).
    missing: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The vote as JSON data (missing parameters as runs ``[start, stop)``)."""
        return {
            "status": self.status,
            "size": self.size,
            "total": self.total,
            "detail": self.detail[:_DETAIL_CHARS],
            "missing": _runs(self.missing),
        }

    @classmethod
    def from_json(cls, data: object) -> Vote:
        """The vote in ``data``, checked field by field.

        Raises:
            ValueError: ``data`` is not a vote.
        """
        if not isinstance(data, dict) or set(data) != {
            "status",
            "size",
            "total",
            "detail",
            "missing",
        }:
            raise ValueError(f"not a vote: {data!r:.200}")
        status, detail = data["status"], data["detail"]
        if status not in _STATUSES or not isinstance(detail, str):
            raise ValueError(f"not a vote: {data!r:.200}")
        return cls(
            status,
            _count(data["size"]),
            _count(data["total"]),
            detail[:_DETAIL_CHARS],
            _expand(data["missing"]),
        )


def combine(values: Mapping[int, object]) -> dict[str, Any]:
    """Every rank's vote (JSON, by rank) reduced to a tally (JSON); run by one rank.

    Raises:
        ValueError: some value is not a vote (then every rank hears of it).
    """
    # Ranks that voted the same share one decoded value: check and keep each one once.
    distinct: dict[int, Vote] = {}
    votes: dict[int, Vote] = {}
    for rank, value in sorted(values.items()):
        vote = distinct.get(id(value))
        if vote is None:
            vote = distinct[id(value)] = Vote.from_json(value)
        votes[rank] = vote
    kinds = set(distinct.values())
    ooms = [rank for rank, vote in votes.items() if vote.status == "oom"]
    errors = [rank for rank, vote in votes.items() if vote.status == "error"]
    used = [vote.size for vote in kinds if vote.total > 0]
    detailed = errors[:DETAILED_FAILURES] + ooms[:DETAILED_FAILURES]
    counts = dict.fromkeys(_STATUSES, 0)
    for vote in votes.values():
        counts[vote.status] += 1
    return {
        "counts": counts,
        "size": max(vote.size for vote in kinds),
        "used_size": max(used) if used else None,
        "ceiling": max(vote.total for vote in kinds),
        "missing": _runs(set.intersection(*(set(vote.missing) for vote in kinds))),
        "oom_ranks": ooms,
        "error_ranks": errors,
        "oom_basis": min(votes[rank].size for rank in ooms) if ooms else None,
        "details": {str(rank): votes[rank].to_json() for rank in sorted(detailed)},
    }


@dataclass(frozen=True)
class Tally:
    """The outcome of a vote, the same on every rank."""

    counts: dict[str, int]
    #: The largest microbatch size any rank used.
    size: int
    #: The largest size among ranks with samples (None: no rank had any).
    used_size: int | None
    #: The largest batch any rank had.
    ceiling: int
    #: Parameters without a gradient on every rank.
    missing: frozenset[int]
    oom_ranks: tuple[int, ...]
    error_ranks: tuple[int, ...]
    #: The smallest size at which some rank ran out of memory (None: none did).
    oom_basis: int | None
    #: The votes of the first few failing ranks, with their details.
    details: dict[int, Vote] = field(default_factory=dict)

    @classmethod
    def of(cls, votes: Mapping[int, Vote]) -> Tally:
        """The tally of ``votes`` computed here (a single process needs no agreement)."""
        return cls.from_json(combine({rank: vote.to_json() for rank, vote in votes.items()}))

    @classmethod
    def from_json(cls, data: Any) -> Tally:
        """The tally that :func:`combine` produced (after its trip through the control store)."""
        try:
            return cls(
                counts={status: _count(data["counts"][status]) for status in _STATUSES},
                size=_count(data["size"]),
                used_size=None if data["used_size"] is None else _count(data["used_size"]),
                ceiling=_count(data["ceiling"]),
                missing=frozenset(_expand(data["missing"])),
                oom_ranks=tuple(_count(rank) for rank in data["oom_ranks"]),
                error_ranks=tuple(_count(rank) for rank in data["error_ranks"]),
                oom_basis=None if data["oom_basis"] is None else _count(data["oom_basis"]),
                details={int(r): Vote.from_json(v) for r, v in data["details"].items()},
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a microbatch tally: {data!r:.300}") from exc

    @property
    def all_ok(self) -> bool:
        """Whether every rank finished its attempt."""
        return sum(self.counts.values()) == self.counts["ok"]

    def describe(self, ranks: Iterable[int]) -> str:
        """``rank 1: detail; rank 4: detail`` for ``ranks``, and how many more there were."""
        ranks = list(ranks)
        shown = [f"rank {r}: {self.details[r].detail}" for r in ranks if r in self.details]
        hidden = [r for r in ranks if r not in self.details]
        if hidden:
            shown.append(f"and {len(hidden)} more rank(s) ({_short(hidden)})")
        return "; ".join(shown)


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a count (an int >= 0), got {value!r:.50}")
    return value


def _runs(indices: Iterable[int]) -> list[list[int]]:
    """Sorted indices as runs ``[start, stop)``: parameters unused together are contiguous."""
    runs: list[list[int]] = []
    for index in sorted(indices):
        if runs and runs[-1][1] == index:
            runs[-1][1] = index + 1
        else:
            runs.append([index, index + 1])
    return runs


def _expand(runs: object) -> tuple[int, ...]:
    if not isinstance(runs, list):
        raise ValueError(f"expected runs of indices, got {runs!r:.50}")
    out: list[int] = []
    for run in runs:
        if not isinstance(run, list) or len(run) != 2:
            raise ValueError(f"expected a run [start, stop), got {run!r:.50}")
        start, stop = _count(run[0]), _count(run[1])
        if not start < stop <= _MAX_INDEX:
            raise ValueError(f"not a run of parameter indices: [{start}, {stop})")
        out.extend(range(start, stop))
    return tuple(out)


def _short(ranks: list[int], shown: int = 16) -> str:
    text = ", ".join(map(str, ranks[:shown]))
    return text + (", ..." if len(ranks) > shown else "")
