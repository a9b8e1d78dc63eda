"""Who failed, who was only collateral damage, and the one summary the launcher prints.

torchrun blames the failure with the earliest timestamp, which can be a rank that merely timed
out waiting for the real culprit; Composer's launcher reports the first non-zero exit code in rank
order, often the SIGTERM of a healthy rank it stopped itself. Here each rank's own record says
*why* it failed: its own exception, a crash, or a consequence of another rank (a collective whose
peer went away, or a timeout waiting for one). The culprit is the earliest rank that failed on
its own; if every failure was a wait, it is the rank the others were waiting for, the one the
launcher found still running.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unidist.launch.plan import LaunchPlan

__all__ = ["RankOutcome", "Report", "analyse", "exit_code_of"]

_TAIL_LINES = 15
_OWN = ("raised", "crashed", "hung")
_WAITED = ("collateral", "timeout")


@dataclass
class RankOutcome:
    """How one rank of this node ended."""

    rank: int
    local_rank: int
    host: str
    status: str  # ok | raised | crashed | hung | collateral | timeout | stopped
    detail: str
    exit_code: int | None
    time_ns: int | None
    stdout: Path
    stderr: Path


@dataclass
class Report:
    """The outcome of a run on this node."""

    outcomes: list[RankOutcome]
    culprit: RankOutcome | None
    exit_code: int
    interrupted: str | None = None

    @property
    def failed(self) -> bool:
        """Whether the job failed (or was interrupted)."""
        return self.exit_code != 0

    def format(self) -> str:
        """The summary printed at the end of a failed run."""
        if not self.failed:
            return ""
        lines = [f"unidist launch: the job failed (exit code {self.exit_code})."]
        if self.interrupted:
            lines[0] = f"unidist launch: interrupted by {self.interrupted}; every rank was stopped."
        if self.culprit is not None:
            lines.append(f"  culprit: {_describe(self.culprit)}")
            lines.extend(_excerpt(self.culprit))
        others = [o for o in self.outcomes if o is not self.culprit and o.status != "ok"]
        for title, kinds in (
            ("failed because of another rank", _WAITED + _OWN),
            ("stopped by the launcher", ("stopped",)),
        ):
            group = [o for o in others if o.status in kinds]
            if group:
                lines.append(f"  {title}:")
                for outcome in group:
                    lines.append(f"    {_describe(outcome)}")
                    lines.extend("  " + line for line in _excerpt(outcome, 6))
        return "\n".join(lines) + "\n"


def _describe(o: RankOutcome) -> str:
    code = "" if o.exit_code is None else f", exit code {o.exit_code}"
    return f"rank {o.rank} (local rank {o.local_rank}) on {o.host}: {o.detail}{code}"


def _excerpt(o: RankOutcome, lines: int = _TAIL_LINES) -> list[str]:
    tail = _tail(o.stderr, lines)
    shown = [f"      | {line}" for line in tail] if tail else ["      | (stderr is empty)"]
    return [*shown, f"      full logs: {o.stderr}", f"                 {o.stdout}"]


def _tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.rstrip().splitlines() if line.strip()][-lines:]


def exit_code_of(code: int) -> int:
    """A process's exit status as a shell reports it (a signal N becomes 128 + N)."""
    return 128 - code if code < 0 else code


def _records(plan: LaunchPlan) -> dict[tuple[str, int], dict[str, Any]]:
    """(kind, rank) -> the latest attempt's record."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    if not plan.events.is_dir():
        return found
    for path in plan.events.glob("*.json"):
        data = json.loads(path.read_text())
        key = (path.name.split("-", 1)[0], int(data["rank"]))
        if key not in found or data["attempt"] >= found[key]["attempt"]:
            found[key] = data
    return found


def analyse(
    plan: LaunchPlan,
    exit_codes: dict[int, int],
    stopped: dict[int, int],
    died: dict[int, int],
    interrupted: str | None = None,
    hung: dict[int, int] | None = None,
) -> Report:
    """Classify every rank of this node and find the culprit.

    Args:
        plan: the run.
        exit_codes: local rank -> exit code, for the ranks torch's agent saw fail.
        stopped: global rank -> when the launcher sent it SIGTERM (ns).
        died: global rank -> when the launcher saw it die without finishing (ns).
        interrupted: the signal that interrupted the launcher, if any.
        hung: global rank -> when it was killed for not finishing after the others (ns).
    """
    records = _records(plan)
    outcomes = [
        _outcome(plan, local, records, exit_codes.get(local), stopped, died)
        for local in range(plan.nproc)
    ]
    for outcome in outcomes:
        if hung and outcome.rank in hung and outcome.status in ("ok", "crashed", "stopped"):
            outcome.status, outcome.exit_code, outcome.time_ns = "hung", 124, hung[outcome.rank]
            outcome.detail = (
                f"had not finished {plan.exit_timeout:g} s after another rank did; "
                "killed (its stack is below; a gloo process-group destructor "
                "deadlock in torch < 2.8 looks like a frozen line at exit)"
            )
    if interrupted:
        code = 128 + signal.Signals[interrupted].value
        return Report(outcomes, None, code, interrupted)
    failures = [o for o in outcomes if o.status != "ok"]
    if not failures:
        return Report(outcomes, None, 0)
    culprit = _culprit(outcomes)
    first_code = next((o.exit_code for o in sorted(failures, key=_when) if o.exit_code), 1)
    code = (
        culprit.exit_code
        if culprit and culprit.status in _OWN and culprit.exit_code
        else (first_code)
    )
    return Report(outcomes, culprit, code or 1)


def _when(o: RankOutcome) -> int:
    return o.time_ns if o.time_ns is not None else 2**63


def _culprit(outcomes: list[RankOutcome]) -> RankOutcome | None:
    own = sorted((o for o in outcomes if o.status in _OWN), key=_when)
    if own:
        return own[0]
    waited = sorted((o for o in outcomes if o.status in _WAITED), key=_when)
    still_running = [o for o in outcomes if o.status == "stopped"]
    if waited and still_running:
        suspect = still_running[0]
        suspect.detail = (
            f"still running when rank {waited[0].rank} gave up waiting for it "
            f"({waited[0].detail}); stopped by the launcher, its stack is below"
        )
        return suspect
    return waited[0] if waited else None


_ERROR_WORDS = {
    "raised": "raised",
    "collateral": "failed after another rank went away:",
    "timeout": "timed out waiting for another rank:",
}


def _outcome(
    plan: LaunchPlan,
    local: int,
    records: dict[tuple[str, int], dict[str, Any]],
    exit_code: int | None,
    stopped: dict[int, int],
    died: dict[int, int],
) -> RankOutcome:
    rank = plan.node_rank * plan.nproc + local
    start = records.get(("start", rank), {})
    error = records.get(("error", rank))
    stdout, stderr = plan.log_paths(rank, local, int(start.get("attempt", 0)))
    code = None if exit_code is None else exit_code_of(exit_code)

    def outcome(status: str, detail: str, when: int | None) -> RankOutcome:
        host = str(start.get("host", "?"))
        return RankOutcome(rank, local, host, status, detail, code, when, stdout, stderr)

    if error is not None:
        kind = str(error["kind"])
        first_line = str(error["message"]).splitlines()[0] if error["message"] else ""
        detail = f"{_ERROR_WORDS[kind]} {error['type']}: {first_line[:300]}"
        return outcome(kind, detail.strip(), int(error["time_ns"]))
    if rank in stopped and (rank not in died or stopped[rank] <= died[rank]):
        return outcome("stopped", "stopped while still running", stopped[rank])
    if exit_code is not None and exit_code != 0:
        if exit_code < 0:
            how = f"killed by {signal.Signals(-exit_code).name} (not by the launcher)"
        else:
            how = f"exited with code {exit_code} without a Python exception"
        return outcome("crashed", how, died.get(rank))
    if ("done", rank) not in records and rank in died:
        # Torch's agent did not see it fail on its own (it would have an exit code), so the agent
        # stopped it, after another rank failed, before the watchdog got to it.
        return outcome("stopped", "stopped while still running", died[rank])
    return outcome("ok", "finished", None)
