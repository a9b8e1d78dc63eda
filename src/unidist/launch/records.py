"""The records ranks leave for their launcher, and who a PID really is.

Each rank writes small JSON files into its run's event folder (``UNIDIST_EVENTS``): ``start``
(pid, process start time, rank, host), then ``done`` or ``error`` (the exception, and whether it
was the rank's own fault). Files are named ``<kind>-s<start>-r<rank>.json``, where ``start``
counts the starts of this node's ranks in this run (restarts after a failure and after a change
of membership alike), so a record is never mistaken for another start's. The folder is private
and new for every run (:mod:`unidist.launch.rundir`); records are plain JSON, checked on reading.
:class:`Start` and :class:`Slot` are the launcher's side: where torch's agent put each rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EVENTS", "START", "Slot", "Start", "process_start_time", "read", "write"]

#: The variables that tell a rank where its records go and which start it belongs to.
EVENTS = "UNIDIST_EVENTS"
START = "UNIDIST_START"
_KINDS = ("start", "error", "done")


@dataclass(frozen=True)
class Slot:
    """One rank of one start of this node, as torch's agent placed it."""

    rank: int
    local_rank: int
    node_rank: int
    world_size: int
    stdout: Path
    stderr: Path


@dataclass(frozen=True)
class Start:
    """One start of this node's ranks: its index in the run, and local rank -> :class:`Slot`."""

    index: int
    slots: dict[int, Slot]


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, Linux), to tell it from a reused PID."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    return None


def write(kind: str, identity: dict[str, Any], payload: dict[str, Any]) -> None:
    """Write one record atomically (inside a rank)."""
    folder = os.environ.get(EVENTS)
    if not folder:
        return
    start = os.environ.get(START, identity.get("attempt", 0))
    path = Path(folder, f"{kind}-s{start}-r{identity['rank']}.json")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    record = {**identity, **payload, "start": int(start), "time_ns": time.time_ns()}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # tracebacks: private
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(record))
    tmp.replace(path)


def read(events: Path, start: int) -> dict[tuple[str, int], dict[str, Any]]:
    """(kind, rank) -> record, for one start. Malformed files are skipped."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    with contextlib.suppress(OSError):
        for path in events.glob(f"*-s{start}-r*.json"):
            kind = path.name.split("-", 1)[0]
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())
                if kind in _KINDS and isinstance(data, dict) and _valid(data):
                    found[(kind, int(data["rank"]))] = data
    return found


def _valid(data: dict[str, Any]) -> bool:
    ints = ("rank", "pid", "time_ns")
    return all(isinstance(data.get(name), int) for name in ints)
