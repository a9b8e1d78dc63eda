"""The launcher's ranks as processes: which PIDs are its own, and how it acts on them.

A rank's start record names its PID, but a record is only a file: the launcher signals a PID
only after it has checked, itself, that the process is one of its own children (torch's agent
starts every rank from the launcher's process, and a rank that replaces itself with
``--no-python``'s program keeps its PID), and it remembers the start time it read then from
``/proc``, so a PID that a later process reuses is left alone. Nothing a file says decides which
process gets a signal.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from unidist.hangs.verdict import stopped
from unidist.launch import records
from unidist.launch.rank.runtime import STACK_SIGNAL

__all__ = ["Proc", "Processes"]


@dataclass(frozen=True)
class Proc:
    """A rank's process, as the launcher verified it."""

    pid: int
    started: int | None  # its start time in /proc when verified (None: no /proc here)


class Processes:
    """What the supervisor does to processes; a test gives its own (same methods)."""

    def verify(self, pid: int) -> Proc | None:
        """``pid`` as a rank of this launcher: a child of this process (alive, or exited and not
        yet reaped), or None: not a child, or gone already.

        Where ``os.waitid`` is missing (not Linux), a live process of its own process group
        (every rank leads one) stands for the child, its start time unknown.
        """
        if pid <= 0:
            return None
        if not hasattr(os, "waitid"):
            with contextlib.suppress(OSError):
                return Proc(pid, None) if os.getpgid(pid) == pid else None
            return None
        try:  # raises for any PID that is not this process's child (alive or a zombie)
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (ChildProcessError, OSError):
            return None
        return Proc(pid, records.process_start_time(pid))

    def status(self, proc: Proc) -> tuple[bool, int | None]:
        """(still running, exit status if known: -N for signal N).

        ``waitid(WNOWAIT)`` reads an exited rank's status without reaping it, so torch's agent
        still sees it. Once torch has reaped it, the status is unknown here (torch's agent acts
        on it then).
        """
        if not hasattr(os, "waitid"):
            try:
                os.kill(proc.pid, 0)
            except ProcessLookupError:
                return False, None
            except PermissionError:
                pass
            return True, None
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (ChildProcessError, OSError):
            return False, None  # reaped by torch's agent: gone
        if info is None:
            return True, None
        exited = info.si_code == os.CLD_EXITED
        return False, info.si_status if exited else -info.si_status

    def frozen(self, proc: Proc) -> bool:
        """Whether the process is stopped (state T: SIGSTOP, SIGTSTP) or by a tracer (t)."""
        return self._same(proc) and stopped(proc.pid)

    def signal_group(self, proc: Proc, sig: int) -> None:
        """``sig`` to the rank's process group (every rank leads its own session, as torch
        starts it): its DataLoader workers with it, even once the rank itself is gone."""
        if self._same(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

    def ask_for_stack(self, proc: Proc) -> None:
        """The rank alone dumps every thread's stack into its stderr log (faulthandler, from
        any C code); its workers would die of the signal."""
        if self._same(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, STACK_SIGNAL)

    @staticmethod
    def _same(proc: Proc) -> bool:
        """Whether ``proc.pid`` still is the verified process, or is gone (its group may
        remain): never a later process that reuses the PID."""
        now = records.process_start_time(proc.pid)
        return now is None or proc.started is None or now == proc.started
