"""Run a :class:`LaunchPlan` on torch's elastic agent, stop fast on failure, leave nothing behind.

torch's ``elastic_launch`` does the rendezvous (c10d, static, etcd; elastic membership), starts each
rank in its own session, and restarts the group after a failure or a change of membership. unidist
adds: a new private folder per run (:mod:`~unidist.launch.plan.rundir`) with per-rank log files from
templates (a ``LogsSpecs``), a console that copies the chosen ranks' files
(:mod:`~unidist.launch.supervise.console`), a supervisor
(:mod:`~unidist.launch.supervise.supervisor`) that stops the surviving ranks a moment after one
fails (SIGTERM, then SIGKILL after ``grace``: torch waits 30 s), a final SIGKILL of every rank's
process group so DataLoader workers of a crashed rank cannot linger, and the culprit report. On
several nodes a relay (:mod:`~unidist.launch.supervise.relay`) tells every launcher of a rank
that failed on another node, within about a second, and each stops its ranks and names that same
culprit.

A rank counts as failed only on evidence: its own error record, or a non-zero exit status. A rank
that leaves with ``os._exit(0)`` while the others still work is not a failure (torchrun agrees). A
rank ended by a SIGTERM the launcher did not send is left to torch's agent: the agent stops every
rank that way when a node joins or leaves, and restarts them with the new nodes.

The run folder is trusted by its handle, as the checkpoint folder is: the launcher opens it once
and from then on reaches every file in it through ``/proc/<launcher pid>/fd/<handle>``, which
names the opened folder whatever happens to its path. The ranks write their records, and torch's
agent opens the logs, through that name too, so another user who can rename entries of
``--log-dir`` (a team folder without the sticky bit) cannot swap the run folder for one whose
records or logs would decide the report. A PID is signalled only once the launcher has checked it
is its own child (:mod:`~unidist.launch.supervise.procs`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import stat
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from unidist.environments import variables as _env
from unidist.errors import ConfigurationError
from unidist.hangs import page
from unidist.launch import onenode, records
from unidist.launch.plan import rundir
from unidist.launch.plan.job import LaunchPlan, probe_templates
from unidist.launch.plan.rendezvous import NODE_TIMEOUT
from unidist.launch.records import Slot, Start
from unidist.launch.supervise import relay
from unidist.launch.supervise.console import Console
from unidist.launch.supervise.excerpts import check_logs
from unidist.launch.supervise.failures import raise_rendezvous_error
from unidist.launch.supervise.hang import HANG_EXIT_CODE, HangReport
from unidist.launch.supervise.report import Report, analyse
from unidist.launch.supervise.supervisor import FINISH_SECONDS, Supervisor
from unidist.launch.supervise.watch import Observed

__all__ = ["Run", "launch_config", "run", "script_command"]

#: Flags of the run folder's handle.
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Run:
    """One launcher run: its private folder, the starts of this node's ranks, the console.

    Args:
        plan: what to run.
        folder: the run folder, as made by :func:`~unidist.launch.plan.rundir.create_run_folder`
            (shown in messages; every file in it is reached through its handle).
        console: follows the ranks' logs, if shown.
        hand_over: hand torch's agent the log files unidist opened (``/proc/self/fd/N``) where a
            log outside the run folder lies in a folder another user may change.
    """

    def __init__(
        self,
        plan: LaunchPlan,
        folder: Path,
        console: Console | None = None,
        hand_over: bool = False,
    ) -> None:
        self.plan = plan
        self.folder = folder
        #: The run folder's handle: open while this run or its report is in use.
        self.handle = FolderHandle(open_run_folder(folder))
        #: The run folder as the launcher, its ranks and torch's agent reach it: its handle.
        self.io_folder = _through(self.handle.fd, folder)
        self.events = self.io_folder / ".events"
        self.console = console
        self.host = socket.gethostname()
        self.starts: list[Start] = []
        #: start index -> its rendezvous round, the same string on every node (see relay).
        self.rounds: dict[int, str] = {}
        #: Reports of the starts before the latest one (restarts), oldest first (the
        #: supervisor's, read once it finished).
        self.earlier: list[Report] = []
        #: start index -> the hang the supervisor called in it.
        self.hangs: dict[int, HangReport] = {}
        #: Hand torch's agent the log files unidist opened (``/proc/self/fd/N``) instead of
        #: their paths where another user could replace a path between unidist's checks and
        #: torch's open (a folder others may write to, without the sticky bit); torch's agent
        #: opens the files in this process for a script's ranks.
        self.hand_over = hand_over and Path("/proc/self/fd").is_dir()
        self._held: dict[int, tuple[int, int]] = {}  # local rank -> descriptors of this start
        self._lock = threading.Lock()

    @property
    def current(self) -> Start | None:
        """The latest start, or None before the first."""
        with self._lock:
            return self.starts[-1] if self.starts else None

    def round_of(self, index: int) -> str | None:
        """The rendezvous round of start ``index`` (the same string on every node)."""
        with self._lock:
            return self.rounds.get(index)

    def started(self) -> list[Start]:
        """Every start so far, oldest first (a copy: torch's agent adds to it meanwhile)."""
        with self._lock:
            return list(self.starts)

    def io(self, path: Path) -> Path:
        """``path`` as the launcher reaches it: through the run folder's handle when inside it."""
        try:
            return self.io_folder / path.relative_to(self.folder)
        except ValueError:
            return path

    def begin(self, envs: dict[int, dict[str, str]], given: Any = None) -> Start:
        """A new start of this node's ranks (torch's agent is about to start them).

        Creates each rank's log files (0600), tells each rank where its records go and which
        start it is, and points the console at the new files. ``given``: the ``LogsDest`` of a
        ``--logs-specs`` class, whose files (torch's agent opens them) replace unidist's.
        """
        plan = self.plan
        with self._lock:
            index = len(self.starts)
        shared = next(iter(envs.values()), {})  # what every rank of the start has alike
        if index:
            records.release_left(self.events)  # the rooms its killed ranks kept
        self.release()
        slots: dict[int, Slot] = {}
        for local, env in sorted(envs.items()):
            rank, node = int(env["RANK"]), int(env.get("GROUP_RANK", "0"))
            env[records.EVENTS], env[records.START] = str(self.events), str(index)
            env[records.ERROR_FILE] = str(records.error_file(self.events, index, rank))
            env[_env.HANG_PAGE] = str(page.path_for(self.events, rank, index))
            if _relayed(plan):
                env[records.AWAIT_LEAVE] = "1"
            if given is not None:  # "": the launcher's own stream, not a file
                out = Path(given.stdouts.get(local) or os.devnull)
                err = Path(given.stderrs.get(local) or os.devnull)
                slots[local] = Slot(rank, local, node, int(env["WORLD_SIZE"]), out, err)
                continue
            out, err = plan.log_paths(
                self.folder,
                rank=rank,
                local_rank=local,
                node_rank=node,
                attempt=index,
                world_size=int(env["WORLD_SIZE"]),
                local_world_size=plan.nproc,
            )
            self._held[local] = (
                rundir.open_private(self.io(out), shown=out),
                rundir.open_private(self.io(err), shown=err),
            )
            if not (self.hand_over and (self._swappable(out) or self._swappable(err))):
                self._close(self._held.pop(local))
            slots[local] = Slot(
                rank, local, node, int(env["WORLD_SIZE"]), out, err, self.io(out), self.io(err)
            )
        start = Start(index, slots)
        if self.console is not None:
            self.console.retire()
            for slot in slots.values():
                prefix = plan.console.prefix_for(slot.rank, slot.local_rank, plan.role, self.host)
                for stream, path in (("stdout", slot.read_stdout), ("stderr", slot.read_stderr)):
                    if path == Path(os.devnull):
                        continue  # --logs-specs sent it to this console directly
                    if plan.console.shows(slot.rank, slot.local_rank, stream):
                        self.console.follow(path, stream, prefix)
        generation = "{}-{}:{}".format(
            shared.get("TORCHELASTIC_RESTART_COUNT", "0"),
            shared.get("MASTER_ADDR", ""),
            shared.get("MASTER_PORT", ""),
        )
        with self._lock:
            self.rounds[index] = generation
            self.starts.append(start)
        return start

    def _swappable(self, path: Path) -> bool:
        """Whether another user could replace ``path`` (a log outside the run folder)."""
        return self.io(path) == path and rundir.swappable(path.parent)

    def log_dest(self, slot: Slot) -> tuple[str, str]:
        """The (stdout, stderr) names torch's agent opens for ``slot``: the files unidist
        created and holds open (``/proc/self/fd/N``), or their names through the run folder's
        handle (or their paths, outside it)."""
        held = self._held.get(slot.local_rank)
        if held is None:
            return str(slot.read_stdout), str(slot.read_stderr)
        return f"/proc/self/fd/{held[0]}", f"/proc/self/fd/{held[1]}"

    def release(self) -> None:
        """Close the log files unidist held for torch's agent (it has its own by now)."""
        held, self._held = self._held, {}
        for fds in held.values():
            self._close(fds)

    @staticmethod
    def _close(fds: tuple[int, int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


class FolderHandle:
    """An open folder, closed once nothing refers to it (the run, and the report that reads
    the logs through it after the run)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        weakref.finalize(self, _close_quietly, fd)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def open_run_folder(folder: Path) -> int:
    """A handle of the run folder just made: a real folder of this user's, private (0700).

    Raises:
        ConfigurationError: ``folder`` is no longer the folder unidist made (another user
            renamed or replaced it in ``--log-dir``).
    """
    try:
        fd = os.open(folder, _DIR)
    except OSError as exc:
        raise ConfigurationError(
            f"the run folder {str(folder)!r} cannot be opened ({exc.strerror or exc}): it was "
            "moved or replaced right after unidist made it. HINT: use a --log-dir that only you "
            "can change (chmod go-w, or chmod +t as /tmp is)."
        ) from None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        os.close(fd)
        raise ConfigurationError(
            f"the run folder {str(folder)!r} is not the one unidist made (it belongs to user id "
            f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}): another user replaced it in "
            "--log-dir. HINT: use a --log-dir that only you can change (chmod go-w, or chmod "
            "+t as /tmp is)."
        )
    return fd


def _through(fd: int, folder: Path) -> Path:
    """The name that reaches the folder of handle ``fd`` from this process and its children
    (``/proc/<pid>/fd/<fd>``, Linux), or ``folder`` where there is none, or where the children
    could not use it (this process is not dumpable: a setuid or setgid program, file
    capabilities; its ``/proc/<pid>/fd`` is then root's alone)."""
    name = Path(f"/proc/{os.getpid()}/fd/{fd}")
    try:
        same = os.path.samestat(os.stat(name), os.fstat(fd))
    except OSError:
        same = False
    return name if same and _dumpable() else folder


def _dumpable() -> bool:
    """Whether other processes of this user may reach this one's ``/proc/<pid>/fd``."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(3, 0, 0, 0, 0) == 1)  # PR_GET_DUMPABLE: 1 is "this user's"
    except (OSError, AttributeError):
        return True  # no prctl here: nothing says otherwise


def _logs_specs(run: Run) -> Any:
    from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs

    custom = run.plan.logs_specs.load() if run.plan.logs_specs is not None else None

    class RunLogsSpecs(LogsSpecs):
        """Each start's files, named by the plan's templates inside the run's folder (or by the
        ``--logs-specs`` class); the ranks' error files in the run's record folder."""

        def __init__(self) -> None:
            super().__init__(log_dir=str(run.folder))

        @property
        def root_log_dir(self) -> str:
            return str(run.folder)

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            given = custom.reify(envs) if custom is not None else None
            start = run.begin(envs, given)
            dest = given if given is not None else LogsDest()
            for local, slot in start.slots.items():
                if given is None:
                    dest.stdouts[local], dest.stderrs[local] = run.log_dest(slot)
                dest.error_files[local] = str(
                    records.error_file(run.events, start.index, slot.rank)
                )
            return dest

    return RunLogsSpecs()


def launch_config(run: Run) -> Any:
    """torch's ``LaunchConfig`` for the run."""
    from torch.distributed.launcher.api import LaunchConfig

    plan, rdzv = run.plan, run.plan.rdzv
    configs: dict[str, Any] = dict(rdzv.configs)
    if rdzv.backend == "static":
        configs["rank"] = rdzv.node_rank
    return LaunchConfig(
        min_nodes=rdzv.min_nodes,
        max_nodes=rdzv.max_nodes,
        nproc_per_node=plan.nproc,
        run_id=rdzv.run_id,
        role=plan.role,
        rdzv_backend=rdzv.backend,
        rdzv_endpoint=rdzv.endpoint,
        rdzv_configs=configs,
        max_restarts=plan.max_restarts,
        monitor_interval=plan.monitor_interval,
        start_method="spawn",
        local_addr=rdzv.local_addr,
        logs_specs=_logs_specs(run),
        **plan.torch_options,
    )


def run(
    plan: LaunchPlan,
    entrypoint: str | Callable[..., Any],
    args: list[Any],
    verbose: bool = False,
) -> tuple[Report, dict[int, Any], Path]:
    """Run the job; returns this node's report, a function entrypoint's results, the run folder.

    Raises:
        ConfigurationError: the log files cannot be written (checked before anything starts).
        LaunchError: the rendezvous failed (no rank ran), or its store was lost afterwards.
    """
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    folder = rundir.create_run_folder(plan.log_root)
    # Refused if the folder was replaced before it could be opened: then it is not removed
    # either (by its name, it is no longer the folder this run made).
    job = Run(plan, folder, None, hand_over=isinstance(entrypoint, str))
    try:
        probe_templates(plan, folder, job.io)
        os.mkdir(job.io_folder / ".events", mode=0o700)
    except Exception:
        rundir.remove_through(job.handle.fd, folder)
        raise
    if not verbose:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    console = Console(sys.stdout, sys.stderr) if plan.console.enabled else None
    job.console = console
    messenger = _relay_for(plan)
    supervisor = Supervisor(job, messenger)
    supervisor.start()
    if console is not None:
        console.start()
    exit_codes: dict[int, int] = {}
    interrupted = None
    results: dict[int, Any] = {}
    forwarding = _forward_user_signals(supervisor)
    try:
        with _env.patched(_exports(plan), only_missing=False):
            results = _launch(job, entrypoint, args, messenger)
    except ChildFailedError as exc:
        exit_codes = {f.local_rank: f.exitcode for f in exc.failures.values()}
    except SignalException as exc:
        interrupted = signal.Signals(exc.sigval).name
    except KeyboardInterrupt:
        interrupted = "SIGINT"
    except ConfigurationError:
        raise  # a log file that must not be written (checked again as it is created)
    except Exception as exc:
        raise_rendezvous_error(job, exc)
        raise
    finally:
        ended = _wind_down(job, supervisor, forwarding)
    if ended and interrupted is None and supervisor.forwarded and exit_codes:
        interrupted = supervisor.forwarded  # the ranks ended by the signal passed on to them
    report = _final_report(job, supervisor if ended else None, exit_codes, interrupted)
    records.release_left(job.events)  # the rooms of ranks that never finished (killed)
    report.handle = job.handle  # the report reads the logs through it
    return report, results, folder


def _wind_down(job: Run, supervisor: Supervisor, forwarding: dict[int, Any]) -> bool:
    """The job ended: signals back as they were, the supervisor's last look and sweep, the
    logs closed and copied to the console. Returns whether the supervisor finished (only then
    is its state this thread's)."""
    for signum, previous in forwarding.items():
        signal.signal(signum, previous)
    ended = supervisor.finish()
    if not ended:
        sys.stderr.write(
            f"unidist launch: the launcher's supervisor did not finish within {FINISH_SECONDS:g} "
            "s; the report below is built from the ranks' records and exit codes alone\n"
        )
    job.release()
    if job.console is not None:
        job.console.close()
    return ended


def _final_report(
    job: Run, supervisor: Supervisor | None, exit_codes: dict[int, int], interrupted: str | None
) -> Report:
    """How the latest start ended: its culprit, or its hang; earlier starts; stragglers. From
    the supervisor's state once it has finished (None: it did not, and is not touched)."""
    plan = job.plan
    if supervisor is None:
        report = analyse(job.current, job.events, exit_codes, Observed(), plan, interrupted)
        report.several_nodes = plan.rdzv.max_nodes > 1
        return report
    report = analyse(
        job.current,
        job.events,
        exit_codes,
        supervisor.seen,
        plan,
        interrupted,
        supervisor.progress(),
    )
    report.earlier, report.several_nodes = job.earlier, plan.rdzv.max_nodes > 1
    if job.current is not None and job.current.index in job.hangs and not interrupted:
        report.hang = job.hangs[job.current.index]
        report.exit_code = HANG_EXIT_CODE
    else:  # after a hang, the hung rank's silence is no straggler's slowness
        report.stragglers = supervisor.stragglers(final=True)
    if report.failed:
        check_logs(report.outcomes)  # a full disk or an I/O error, named as the cause
    return report


#: Signals the launcher passes on to every rank: a scheduler's warning before preemption
#: (SLURM's ``--signal=USR1@90`` reaches the launcher under ``srun unidist launch``).
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)


def _forward_user_signals(supervisor: Supervisor) -> dict[int, Any]:
    """While the job runs, SIGUSR1 and SIGUSR2 to the launcher go on to every rank's process
    group (their default action would end the launcher and, with it, every rank): a
    ``unidist.ResumableState`` in the ranks saves and stops on them. A handler the program
    already set (``unidist.spawn`` in a script of the user's) is left alone. Returns the
    handlers to put back."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for signum in FORWARDED:
        if signal.getsignal(signum) is signal.SIG_DFL:
            previous[signum] = signal.signal(signum, supervisor.forward)
    return previous


def _relay_for(plan: LaunchPlan) -> relay.Relay | None:
    """The relay between the launchers of a job of several nodes, where the store allows one."""
    rdzv = plan.rdzv
    if not _relayed(plan):
        return None
    return relay.Relay(rdzv.host.strip("[]"), rdzv.port, rdzv.run_id, _keep_alive(rdzv.configs))


def _relayed(plan: LaunchPlan) -> bool:
    """Whether the launchers of the job talk through a relay: one node has nothing to tell;
    etcd and plugins have no TCPStore to share."""
    return plan.rdzv.max_nodes > 1 and plan.rdzv.backend in ("static", "c10d")


def _keep_alive(configs: Mapping[str, str]) -> float:
    """Seconds after which torch's c10d rendezvous takes a silent node for dead (its
    ``keep_alive_interval`` x ``keep_alive_max_attempt``): the relay's measure of a lost node."""
    try:
        seconds = float(configs.get("keep_alive_interval", NODE_TIMEOUT / 3))
        seconds *= int(configs.get("keep_alive_max_attempt", 3))
    except ValueError:
        return relay.LOST_AFTER  # torch refuses the value itself, with its own message
    return seconds if seconds > 0 else relay.LOST_AFTER


def _launch(
    job: Run, entrypoint: str | Callable[..., Any], args: list[Any], messenger: relay.Relay | None
) -> dict[int, Any]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    if job.plan.rdzv.backend == onenode.BACKEND:
        onenode.register()
    try:
        results: dict[int, Any] = elastic_launch(launch_config(job), entrypoint)(*args)
    except ChildFailedError:
        if messenger is not None:
            # Still handling the exception: its traceback keeps torch's agent, its rendezvous
            # and the store this node may host alive while the other nodes read the culprit.
            messenger.linger()
        raise
    return results


def _exports(plan: LaunchPlan) -> dict[str, str]:
    """Variables every rank inherits (set in this process only while the job runs)."""
    values = {_env.LAUNCHER_MARKER: "launch", "PYTHONUNBUFFERED": "1"}
    # torch's dynamic rendezvous lends the ranks one store for the whole run, restarts included,
    # with no per-attempt prefix ("we create a new TCPStore for every retry", says
    # torch.distributed.rendezvous, but the handler caches it): after a restart gloo reads the
    # previous attempt's addresses and fails with "connectFullMesh failed" (torch 2.7 to 2.14,
    # torchrun too). torch's opt-out gives every rendezvous round a fresh store on rank 0; it is
    # needed only where a second round can happen, elsewhere the ranks get the agent's store at
    # MASTER_ADDR:MASTER_PORT with TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun.
    if plan.restarts_possible:
        values["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if plan.nproc > 1 and not _env.is_set("OMP_NUM_THREADS"):
        values["OMP_NUM_THREADS"] = "1"  # as torchrun does
    if plan.timeout is not None:
        values["UNIDIST_TIMEOUT"] = str(plan.timeout)
    return values


def script_command(plan: LaunchPlan) -> tuple[str, list[str]]:
    """The program and arguments each rank runs for a script, module or program target."""
    if plan.no_python:
        target = ["--exec", str(plan.target)]
    else:
        target = ["-m", str(plan.target)] if plan.module else [str(plan.target)]
    return sys.executable, ["-u", "-m", "unidist.launch.rank.bootstrap", *target, *plan.args]
