"""How one rank of a start ended: its :class:`Status` and the facts the report shows.

Below both the supervisor (:mod:`~unidist.launch.supervise.watch`, which keeps the culprit another
node's launcher named) and the report (:mod:`~unidist.launch.supervise.report`, which decides the
outcomes), so neither imports the other for it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OWN", "WAITED", "RankOutcome", "Status"]


class Status(str, enum.Enum):
    """How a rank ended. A ``str`` enum: its value is the word the report and the relay use."""

    OK = "ok"
    #: A Python exception of its own (the rank's error file says which).
    RAISED = "raised"
    #: Exited with a non-zero code or a signal, without a Python exception.
    CRASHED = "crashed"
    #: Killed by the launcher: no progress for --hang-timeout seconds, or not finished
    #: --exit-timeout seconds after another rank finished.
    HUNG = "hung"
    #: Failed because another rank went away (a peer's connection closed).
    COLLATERAL = "collateral"
    #: Timed out waiting for another rank.
    TIMEOUT = "timeout"
    #: Still running when another rank failed; stopped by the launcher or torch's agent.
    STOPPED = "stopped"
    #: Its script ended while other ranks still waited for it in a collective.
    RETURNED = "returned"
    #: A whole node, named by the launcher that watched it leave.
    LOST = "lost"
    #: Gone without an exit status or a record (torch's agent reaped it first).
    VANISHED = "vanished"

    def __str__(self) -> str:
        return self.value


#: A failure of the rank's own (not caused by another rank). A node's launcher relays a
#: different set (:data:`unidist.launch.supervise.notices.FAULTS`): a lost node is known only
#: through the relay, and a hang is called on every node, so it is never relayed.
OWN = (Status.RAISED, Status.CRASHED, Status.HUNG)
#: A failure while waiting for another rank.
WAITED = (Status.COLLATERAL, Status.TIMEOUT)


@dataclass
class RankOutcome:
    """How one rank of this node ended."""

    rank: int
    local_rank: int
    host: str
    status: Status
    detail: str
    exit_code: int | None
    time_ns: int | None
    stdout: Path
    stderr: Path
    remote: bool = False  # on another node: its launcher told this one (stdout, stderr: there)
    #: Why its log files could not be written (a full disk, an I/O error), if they could not.
    log_error: str | None = None
    #: The names the launcher reads its logs by (see :class:`unidist.launch.records.Slot`).
    read_stdout: Path | None = None
    read_stderr: Path | None = None
