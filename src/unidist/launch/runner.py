"""Run a :class:`LaunchPlan` on torch's elastic agent, stop fast on failure, leave nothing behind.

torch's ``elastic_launch`` does the rendezvous (c10d with a free port on one node, static with
``--node-rank`` across nodes), starts each rank in its own session, and restarts the group on
failure. unidist adds: per-rank log files from templates (a ``LogsSpecs``), a console copy
prefixed by rank, a watchdog that stops the surviving ranks a moment after one fails (SIGTERM,
then SIGKILL after ``grace``: torch waits 30 s), a final SIGKILL of every rank's process group so
DataLoader workers of a crashed rank cannot linger, and the culprit report.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unidist import _env
from unidist.launch.plan import LaunchPlan
from unidist.launch.report import Report, analyse

__all__ = ["launch_config", "run"]


def _logs_specs(plan: LaunchPlan) -> Any:
    from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs

    class TemplateLogsSpecs(LogsSpecs):
        """Per-rank files named by the plan's templates, copied to the console if asked."""

        def __init__(self) -> None:
            super().__init__(log_dir=str(plan.log_dir))

        @property
        def root_log_dir(self) -> str:
            return str(plan.log_dir)

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            dest = LogsDest()
            for local, env in envs.items():
                attempt = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
                out, err = plan.log_paths(int(env["RANK"]), local, attempt)
                for path in (out, err):
                    path.parent.mkdir(parents=True, exist_ok=True)
                dest.stdouts[local], dest.stderrs[local] = str(out), str(err)
                if plan.console:
                    dest.tee_stdouts[local], dest.tee_stderrs[local] = str(out), str(err)
                error_file = plan.log_dir / f"attempt{attempt}" / f"rank{env['RANK']}.error.json"
                error_file.parent.mkdir(parents=True, exist_ok=True)
                dest.error_files[local] = str(error_file)
            return dest

    return TemplateLogsSpecs()


def launch_config(plan: LaunchPlan) -> Any:
    """torch's ``LaunchConfig`` for the plan."""
    from torch.distributed.launcher.api import LaunchConfig

    host = plan.master_addr or "localhost"
    if plan.nnodes == 1:  # c10d: node 0 binds the port itself, so port 0 is race-free
        backend, configs = "c10d", {}
    else:
        backend, configs = "static", {"rank": plan.node_rank}
    where = f"{socket.gethostname()} " if plan.nnodes > 1 else ""
    return LaunchConfig(
        min_nodes=plan.nnodes,
        max_nodes=plan.nnodes,
        nproc_per_node=plan.nproc,
        run_id=plan.run_id,
        rdzv_backend=backend,
        rdzv_endpoint=f"{host}:{plan.master_port}",
        rdzv_configs=configs,
        max_restarts=plan.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        log_line_prefix_template=f"[{where}rank${{rank}}]: ",
        logs_specs=_logs_specs(plan),
    )


class _Watchdog(threading.Thread):
    """Stops the survivors soon after a rank dies without finishing; records who and when."""

    def __init__(self, plan: LaunchPlan) -> None:
        super().__init__(name="unidist-launch-watchdog", daemon=True)
        self.plan = plan
        self.stopped: dict[int, int] = {}
        self.died: dict[int, int] = {}
        self.hung: dict[int, int] = {}
        self.pids: dict[tuple[int, int], int] = {}  # (attempt, rank) -> pid
        self._attempt = 0
        self._halt = threading.Event()
        self._deadline: float | None = None
        self._exit_deadline: float | None = None

    def run(self) -> None:
        while not self._halt.wait(0.05):
            self.scan()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def scan(self) -> None:
        events = self.plan.events
        current = self._current_ranks(events)
        if not current:
            return
        for rank, pid in current.items():
            if rank in self.died or _alive(pid):
                continue
            if not (events / f"done-a{self._attempt}-r{rank}.json").exists():
                self.died[rank] = time.time_ns()
        if self.died and self._deadline is None:
            self._stop_survivors(events, current)
        if self._deadline is not None and time.monotonic() > self._deadline:
            for pid in current.values():
                _signal_group(pid, signal.SIGKILL)
        self._watch_exits(events, self._attempt, current)

    def _current_ranks(self, events: Path) -> dict[int, int]:
        """rank -> pid of the latest attempt (a new attempt resets what was seen)."""
        import json

        if not events.is_dir():
            return {}
        for path in events.glob("start-*.json"):
            data = json.loads(path.read_text())
            self.pids.setdefault((data["attempt"], data["rank"]), data["pid"])
        if not self.pids:
            return {}
        attempt = max(a for a, _ in self.pids)
        if attempt != self._attempt:  # torch's agent restarted the group: a fresh start
            self._attempt, self._deadline, self._exit_deadline = attempt, None, None
            self.died.clear()
            self.stopped.clear()
            self.hung.clear()
        return {rank: pid for (a, rank), pid in self.pids.items() if a == attempt}

    def _stop_survivors(self, events: Path, current: dict[int, int]) -> None:
        """SIGTERM every rank still running (each dumps its stack); SIGKILL after ``grace``."""
        self._deadline = time.monotonic() + self.plan.grace
        for rank, pid in current.items():
            if rank in self.died or not _alive(pid):
                continue
            if (events / f"error-a{self._attempt}-r{rank}.json").exists():
                continue  # already failing and on its way out; SIGKILL after grace if not
            self.stopped[rank] = time.time_ns()
            _signal_group(pid, signal.SIGTERM)

    def _watch_exits(self, events: Path, attempt: int, current: dict[int, int]) -> None:
        """After a rank finished, give the others ``exit_timeout`` to finish, then kill them."""
        if not self.plan.exit_timeout or self._deadline is not None:
            return
        finished = [
            rank
            for rank, pid in current.items()
            if (events / f"done-a{attempt}-r{rank}.json").exists() and not _alive(pid)
        ]
        if finished and self._exit_deadline is None:
            self._exit_deadline = time.monotonic() + self.plan.exit_timeout
        if self._exit_deadline is None or time.monotonic() < self._exit_deadline:
            return
        for rank, pid in current.items():
            if _alive(pid) and rank not in self.hung:
                self.hung[rank] = time.time_ns()
                _signal_group(pid, signal.SIGUSR1)  # every thread's stack into its stderr log
        time.sleep(0.5)
        for rank in self.hung:
            _signal_group(current[rank], signal.SIGKILL)

    def sweep(self) -> None:
        """SIGKILL every rank's process group (leftover DataLoader workers included)."""
        for pid in self.pids.values():
            _signal_group(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        with contextlib.suppress(OSError, IndexError):
            return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # every rank leads its own session (torch starts it that way)


def run(
    plan: LaunchPlan, entrypoint: str | Callable[..., Any], args: list[Any], verbose: bool = False
) -> tuple[Report, dict[int, Any]]:
    """Run the job; returns this node's report and, for a function entrypoint, its results."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    plan.events.mkdir(parents=True, exist_ok=True)
    if not verbose:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    watchdog = _Watchdog(plan)
    watchdog.start()
    exit_codes: dict[int, int] = {}
    interrupted = None
    results: dict[int, Any] = {}
    try:
        with _env.patched(_exports(plan), only_missing=False):
            results = elastic_launch(launch_config(plan), entrypoint)(*args)
    except ChildFailedError as exc:
        exit_codes = {f.local_rank: f.exitcode for f in exc.failures.values()}
    except SignalException as exc:
        interrupted = signal.Signals(exc.sigval).name
    except KeyboardInterrupt:
        interrupted = "SIGINT"
    finally:
        watchdog.stop()
        watchdog.scan()
        watchdog.sweep()
    report = analyse(plan, exit_codes, watchdog.stopped, watchdog.died, interrupted, watchdog.hung)
    return report, results


def _exports(plan: LaunchPlan) -> dict[str, str]:
    """Variables every rank inherits (set in this process only while the job runs)."""
    values = {
        "UNIDIST_LAUNCHER": "launch",
        "UNIDIST_EVENTS": str(plan.events),
        "PYTHONUNBUFFERED": "1",
    }
    if plan.nproc > 1 and not _env.is_set("OMP_NUM_THREADS"):
        values["OMP_NUM_THREADS"] = "1"  # as torchrun does
    if plan.timeout is not None:
        values["UNIDIST_TIMEOUT"] = str(plan.timeout)
    return values


def script_command(plan: LaunchPlan) -> tuple[str, list[str]]:
    """The program and arguments each rank runs for a script or module target."""
    target = ["-m", plan.target] if plan.module else [str(plan.target)]
    return sys.executable, ["-u", "-m", "unidist.launch._bootstrap", *target, *plan.args]
