"""What one node's launcher writes to the rendezvous store for the others, and how the others
read it (see :mod:`unidist.launch.supervise.relay`, which carries them).

Every value is plain JSON or ASCII, size-limited and checked for shape and consistency before it
is believed (the rank belongs to the node that reports it, every text is printable); nothing is
unpickled. The records: a failed rank (:class:`Failure`, :func:`encode`, :func:`decode`; a lost
node's is :func:`lost`), one node's ranks' facts when a hang is called (:func:`facts`), and the
node that raised the hang flag (:func:`flag_node`).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

from unidist.hangs.verdict import RankFacts
from unidist.launch.supervise.outcome import Status

__all__ = [
    "FAULTS",
    "MAX_FACTS",
    "WAITS",
    "Failure",
    "decode",
    "encode",
    "facts",
    "flag_node",
    "lost",
]

#: Kinds of failure a record may carry: the rank's own fault (or its node's: a lost node; unlike
#: :data:`unidist.launch.supervise.outcome.OWN`, no hang, which every node calls itself) ...
FAULTS = (Status.RAISED, Status.CRASHED, Status.LOST)
#: ... and the waits another rank caused.
WAITS = (Status.TIMEOUT, Status.COLLATERAL)
_MAX_RECORD = 8192
_MAX_TEXT = 600
_MAX_PATH = 4096
#: The most a node's published facts may hold (characters of JSON).
MAX_FACTS = 256 * 1024


@dataclass(frozen=True)
class Failure:
    """One failed rank, as its node's launcher saw it."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    kind: str  # raised | crashed | timeout | collateral
    detail: str  # "raised ValueError: ..." as the report words it
    exit_code: int | None
    time_ns: int
    stdout: str  # the rank's log files, on its own host
    stderr: str

    @property
    def own(self) -> bool:
        """Whether the rank failed by its own fault (not waiting for another)."""
        return self.kind in FAULTS


def encode(failure: Failure) -> str:
    """The record as the store holds it: JSON, ASCII."""
    return json.dumps(asdict(failure), sort_keys=True)


def _text(value: Any, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit and value.isprintable()


def decode(raw: bytes | str, world_size: int, nproc: int) -> Failure | None:
    """The record back, or None unless it has the exact shape one of this job's launchers writes.

    Args:
        raw: the store's value.
        world_size: ranks in the job (this round).
        nproc: ranks per node.
    """
    if len(raw) > _MAX_RECORD:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    fields = set(Failure.__dataclass_fields__)
    if not isinstance(data, dict) or set(data) != fields:
        return None
    ints = ("rank", "local_rank", "node_rank", "time_ns")
    if not all(type(data[name]) is int for name in ints):
        return None
    code = data["exit_code"]
    rank, local, node = data["rank"], data["local_rank"], data["node_rank"]
    checks = (
        0 <= rank < world_size,
        0 <= local < nproc,
        rank == node * nproc + local,  # torch's agent numbers each node's ranks contiguously
        data["time_ns"] > 0,
        data["kind"] in FAULTS + WAITS,
        code is None or (type(code) is int and 0 <= code < 256),
        _text(data["host"], 255) and bool(data["host"]),
        _text(data["detail"], _MAX_TEXT),
        _text(data["stdout"], _MAX_PATH),
        _text(data["stderr"], _MAX_PATH),
    )
    return Failure(**data) if all(checks) else None


def facts(raw: bytes | str, node: int, current: tuple[str, int, int]) -> list[RankFacts] | None:
    """Another node's facts as its launcher published them, or None unless well formed: only
    that node's ranks, plain numbers and printable, bounded texts (never unpickled)."""
    try:
        data = raw.decode() if isinstance(raw, bytes) else raw
        if len(data) > MAX_FACTS:
            return None
        items = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(items, list):
        return None
    nproc = current[2]
    found = []
    for item in items[:nproc]:
        one = fact(item)
        if one is None or one.node != node or not node * nproc <= one.rank < (node + 1) * nproc:
            return None
        found.append(one)
    return found


def fact(item: Any) -> RankFacts | None:
    """One rank's facts from another node, or None unless well formed and printable."""
    fact = RankFacts.from_json(item, _MAX_PATH)
    if fact is None:
        return None
    short = (fact.host, fact.status, fact.state, fact.op)
    if any(len(text) > _MAX_TEXT for text in short):
        return None
    texts = (*short, fact.frame, fact.where)
    return fact if all(text.isprintable() for text in texts) else None


def flag_node(raw: Any, current: tuple[str, int, int]) -> int | None:
    """The node a hang flag names (its launcher writes its node rank), or None for anything
    else: a value some other writer of the store put there."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw or "")
    nodes = max(1, current[1] // current[2])
    return int(text) if text.isdigit() and len(text) < 8 and int(text) < nodes else None


def lost(node: int, nproc: int, silent: float, watcher: int) -> Failure:
    """The record of node ``node``, whose beat node ``watcher`` saw stand still ``silent`` s."""
    return Failure(
        rank=node * nproc,
        local_rank=0,
        node_rank=node,
        host=f"node {node}",
        kind="lost",
        detail=(
            f"node {node} went away: its launcher stopped answering (no beat on the rendezvous "
            f"store for {silent:.0f} s, seen by the launcher of node {watcher} on "
            f"{socket.gethostname()[:100]}); its host went down or its launcher was killed"
        )[:_MAX_TEXT],
        exit_code=None,
        time_ns=time.time_ns(),
        stdout="",
        stderr="",
    )
