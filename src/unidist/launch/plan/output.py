"""Which ranks' output reaches the launcher's console, from the options that say so.

``--local-ranks-filter``, ``--console-ranks``, ``--tee``/``-t`` and ``--redirects``/``-r``
become a :class:`ConsoleSpec` here, while the plan is made; the launcher's
:class:`~unidist.launch.supervise.console.Console` copies what the spec lets through.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field

from unidist.errors import ConfigurationError

__all__ = ["ConsoleSpec", "RankSet", "parse_ranks", "parse_std"]

_STREAM_BITS = {"stdout": 1, "stderr": 2}


@dataclass(frozen=True)
class ConsoleSpec:
    """What reaches the console.

    Attributes:
        enabled: any rank output at all (``--no-console`` turns it off).
        ranks: global ranks shown (``--console-ranks``); None: all.
        local_ranks: local ranks shown (torchrun's ``--local-ranks-filter``); None: all.
        hidden: local rank -> streams kept off the console (1 stdout, 2 stderr, 3 both), from
            torchrun's ``--redirects`` minus ``--tee``; key -1 applies to every local rank.
        prefix: ``string.Template`` of each line's prefix (``${rank}``, ``${local_rank}``,
            ``${role_name}``, ``${hostname}``).
    """

    enabled: bool = True
    ranks: RankSet | None = None
    local_ranks: RankSet | None = None
    hidden: Mapping[int, int] = field(default_factory=dict)
    prefix: str = "[rank${rank}]: "

    def shows(self, rank: int, local_rank: int, stream: str) -> bool:
        """Whether this stream of this rank reaches the console."""
        if not self.enabled:
            return False
        if self.ranks is not None and rank not in self.ranks:
            return False
        if self.local_ranks is not None and local_rank not in self.local_ranks:
            return False
        hidden = self.hidden.get(local_rank, self.hidden.get(-1, 0))
        return not hidden & _STREAM_BITS[stream]

    def prefix_for(self, rank: int, local_rank: int, role: str, host: str) -> str:
        """The prefix of this rank's lines."""
        return string.Template(self.prefix).safe_substitute(
            rank=rank, local_rank=local_rank, role_name=role, hostname=host
        )


@dataclass(frozen=True, eq=False)
class RankSet:
    """Ranks as sorted, disjoint ranges (``0-999999`` is one pair, never a million numbers).

    ``rank in ranks`` tests membership; a RankSet equals a set of the same ranks.
    """

    spans: tuple[tuple[int, int], ...] = ()  # inclusive (low, high), sorted, disjoint

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int) and any(low <= rank <= high for low, high in self.spans)

    def __len__(self) -> int:
        return sum(high - low + 1 for low, high in self.spans)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankSet):
            return self.spans == other.spans
        if isinstance(other, (set, frozenset)):
            return len(other) == len(self) and all(rank in self for rank in other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.spans)


def parse_ranks(
    text: str | None, option: str, limit: int | None = None, what: str = "the job"
) -> RankSet | None:
    """``"0,2-3"`` -> ranks {0, 2, 3}; ``"all"`` or None -> None; ``"none"`` -> no rank.

    Ranges stay ranges: nothing is expanded, whatever their size.

    Args:
        limit: ranks go from 0 to ``limit - 1`` (None: unbounded); a rank beyond is an error.
        what: whose ranks they are, for the message (``"the job"``).

    Raises:
        ConfigurationError: not a list of ranks and ranges, or a rank the job does not have.
    """
    if text is None or text.strip().lower() == "all":
        return None
    if text.strip().lower() == "none":
        return RankSet()
    spans: list[tuple[int, int]] = []
    try:
        for part in text.split(","):
            low_text, dash, high_text = part.strip().partition("-")
            if not low_text.strip().isdigit() or (dash and not high_text.strip().isdigit()):
                raise ValueError(part)
            low = int(low_text)
            high = int(high_text) if dash else low
            spans.append((low, high))
    except ValueError:
        raise ConfigurationError(
            f"{option} {text!r} is not a list of ranks. HINT: e.g. {option} 0 or {option} "
            "0,2-3 ('all' or 'none' also work)."
        ) from None
    for low, high in spans:
        if high < low:
            raise ConfigurationError(
                f"{option} {text!r}: the range {low}-{high} goes backwards. HINT: write it "
                f"low-high, e.g. {option} {high}-{low}."
            )
    if not spans:
        raise ConfigurationError(f"{option} {text!r} names no rank. HINT: e.g. {option} 0.")
    highest = max(high for _, high in spans)
    if limit is not None and highest >= limit:
        raise ConfigurationError(
            f"{option} {text!r} names rank {highest}, but {what} has ranks 0..{limit - 1}. "
            f"HINT: name ranks below {limit}, or 'all'."
        )
    merged: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return RankSet(tuple(merged))


def parse_std(text: str | None, option: str) -> dict[int, int]:
    """torchrun's stream selection: ``"3"`` (every local rank) or ``"0:1,1:2"`` (per local rank).

    Returns:
        local rank -> bits (1 stdout, 2 stderr); key -1 for every local rank.
    """
    if not text:
        return {}
    try:
        if ":" not in text:
            values = {-1: int(text)}
        else:
            values = {}
            for part in text.split(","):
                local, _, bits = part.partition(":")
                values[int(local)] = int(bits)
    except ValueError:
        values = {-1: -1}
    if any(not 0 <= bits <= 3 for bits in values.values()):
        raise ConfigurationError(
            f"{option} {text!r}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), for every "
            f"local rank (e.g. {option} 3) or per local rank (e.g. {option} 0:3,1:2)."
        )
    return values
