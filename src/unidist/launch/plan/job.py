"""``unidist launch`` options, checked and resolved into one frozen :class:`LaunchPlan`."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unidist.environments import variables as _env
from unidist.errors import ConfigurationError
from unidist.launch import torchfacts
from unidist.launch.plan import checks, rundir
from unidist.launch.plan.options import InvalidVariable, add_arguments, from_variable
from unidist.launch.plan.output import ConsoleSpec, parse_ranks, parse_std
from unidist.launch.plan.rendezvous import Rendezvous, resolve

__all__ = ["LaunchPlan", "add_arguments", "plan_from_args", "probe_templates"]

_PLACEHOLDERS = {
    "rank": 0,
    "local_rank": 0,
    "node_rank": 0,
    "attempt": 0,
    "world_size": 1,
    "local_world_size": 1,
}


#: The entry-point group of torchrun's ``--logs-specs``.
LOGS_SPECS_GROUP = "torchrun.logs_specs"


@dataclass(frozen=True)
class ChosenLogsSpecs:
    """``--logs-specs NAME`` and the options torchrun builds that ``LogsSpecs`` class from."""

    name: str
    log_dir: str | None = None
    redirects: str = "0"
    tee: str = "0"
    local_ranks_filter: str | None = None

    def load(self) -> Any:
        """The ``LogsSpecs`` object, built as torchrun builds it.

        Raises:
            ConfigurationError: no entry point of that name, or it cannot be loaded.
        """
        found = [
            ep
            for ep in importlib.metadata.entry_points(group=LOGS_SPECS_GROUP)
            if ep.name == self.name
        ]
        if not found:
            names = sorted(
                ep.name for ep in importlib.metadata.entry_points(group=LOGS_SPECS_GROUP)
            )
            raise ConfigurationError(
                f"--logs-specs {self.name!r}: no entry point of that name in the group "
                f"{LOGS_SPECS_GROUP!r} (installed: {', '.join(names) or 'none'}). HINT: install "
                "the package that provides it, or drop --logs-specs."
            )
        try:
            cls = found[0].load()
        except Exception as exc:
            raise ConfigurationError(
                f"--logs-specs {self.name!r}: loading {found[0].value} failed: "
                f"{type(exc).__name__}: {exc}. HINT: fix or reinstall the package that provides it."
            ) from None
        ranks = self.local_ranks_filter
        chosen = {int(r) for r in ranks.split(",")} if ranks else None
        return torchfacts.logs_specs(cls, self.log_dir, self.redirects, self.tee, chosen)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything ``unidist launch`` will do, before it does it.

    Attributes:
        target: the script path, module name or program (``None`` for :func:`unidist.spawn`).
        module: run ``target`` as ``python -m``.
        no_python: run ``target`` as a program (``--no-python``).
        args: arguments for the script.
        nproc: processes on this node.
        rdzv: how the nodes meet (:class:`~unidist.launch.plan.rendezvous.Rendezvous`).
        max_restarts: times the whole local group is restarted after a failure.
        monitor_interval: seconds between torch's agent's checks of the ranks.
        role: the ranks' role name (``ROLE_NAME``).
        log_root: each run creates a new private folder in it; None: the per-user temp folder.
        stdout: per-rank stdout file template ({rank}, {local_rank}, {node_rank}, {attempt},
            {world_size}, {local_world_size}); None: ``rank{rank}.stdout.log`` in the run folder.
        stderr: the same for stderr.
        console: which ranks' output reaches the console, and how it is prefixed.
        timeout: collective timeout for unidist in the ranks (``UNIDIST_TIMEOUT``), or None.
        grace: seconds a stopped rank gets after SIGTERM before SIGKILL.
        exit_timeout: once a rank has finished, seconds the others get to finish too before
            they are reported as hung and killed (0: wait for ever).
        hang_timeout: seconds without progress before the job is called hung and stopped
            (``--hang-timeout``): None for the adaptive default, 0 for never.
        straggler_every: seconds between straggler reports while the job runs (None: at the
            end only; 0: never).
        torch_options: ``LaunchConfig`` fields only newer torch releases have, as given.
        notes: where values came from (SLURM, defaults), for --dry-run.
        logs_specs: a ``torchrun.logs_specs`` entry point that places the ranks' output
            (``--logs-specs``), or None: unidist's files from the templates.
    """

    target: str | None
    module: bool = False
    no_python: bool = False
    args: tuple[str, ...] = ()
    nproc: int = 1
    rdzv: Rendezvous = field(default_factory=Rendezvous)
    max_restarts: int = 0
    monitor_interval: float = 0.1
    role: str = "default"
    log_root: Path | None = None
    stdout: str | None = None
    stderr: str | None = None
    console: ConsoleSpec = field(default_factory=ConsoleSpec)
    timeout: float | None = None
    grace: float = 3.0
    exit_timeout: float = 600.0
    hang_timeout: float | None = None
    straggler_every: float | None = None
    torch_options: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    logs_specs: ChosenLogsSpecs | None = None

    @property
    def restarts_possible(self) -> bool:
        """Whether this node's ranks may start more than once (restarts, elastic membership)."""
        return self.max_restarts > 0 or self.rdzv.elastic

    def templates(self, folder: Path | str) -> tuple[str, str]:
        """The (stdout, stderr) file templates of a run whose folder is ``folder``."""
        sub = "attempt{attempt}/" if self.restarts_possible else ""
        return (
            self.stdout or f"{folder}/{sub}rank{{rank}}.stdout.log",
            self.stderr or f"{folder}/{sub}rank{{rank}}.stderr.log",
        )

    def log_paths(self, folder: Path, **values: int) -> tuple[Path, Path]:
        """The (stdout, stderr) files of one rank (``values``: the template placeholders)."""
        out, err = self.templates(folder)
        return Path(out.format(**values)), Path(err.format(**values))


def _check_pet(args: argparse.Namespace) -> None:
    """Refuse torchrun's PET_ variables that cannot be read (torchrun fails on them too)."""
    invalid = [str(v) for v in vars(args).values() if isinstance(v, InvalidVariable)]
    if invalid:
        raise ConfigurationError(
            f"{'; '.join(invalid)}. HINT: correct the variable, or unset it (an option on the "
            "command line also wins over it)."
        )


def _source(args: argparse.Namespace, dest: str) -> str:
    """How an error names an option: its PET_ variable where the value came from one."""
    option = "--" + dest.replace("_", "-")
    return f"PET_{dest.upper()}" if from_variable(args, dest) else option


def _nproc(args: argparse.Namespace) -> tuple[int, str | None]:
    if args.nproc is not None and "nproc_per_node" in getattr(args, "pet", ()):
        # -n on the command line wins over PET_NPROC_PER_NODE, as a torchrun option would.
        args.nproc_per_node = None
    if args.nproc is not None and args.nproc_per_node is not None:
        raise ConfigurationError(
            f"-n/--nproc {args.nproc} and --nproc-per-node {args.nproc_per_node} both set the "
            "processes on this node. HINT: keep one."
        )
    torchrun = args.nproc_per_node is not None
    text = args.nproc_per_node if torchrun else (args.nproc or "1")
    if text in ("auto", "gpu", "cpu", "xpu") and not torchrun:
        return _device_count(text)
    try:
        value = int(text)
    except ValueError:
        if torchrun:  # any name torchrun counts (auto, cpu, gpu, xpu, a private backend)
            return _torchrun_count(text)
        raise ConfigurationError(
            f"--nproc {text!r} is not a number. HINT: give a count like 2, or 'auto', 'gpu', 'cpu'."
        ) from None
    if value < 1:
        raise ConfigurationError(
            f"--nproc {value} starts no process. HINT: use --nproc 1 or more (or 'auto')."
        )
    return value, None


def _torchrun_count(kind: str) -> tuple[int, str]:
    """``--nproc-per-node NAME``: the count torchrun of the installed torch gives.

    torch's own ``determine_local_world_size``: ``auto`` is every device of the current
    accelerator on torch >= 2.8 (CUDA, XPU, ...), CUDA only before, else one per CPU core.
    """
    try:
        count = torchfacts.torchrun_count(kind)
    except ValueError as exc:
        raise ConfigurationError(
            f"--nproc-per-node {kind!r}: {exc} (torchrun's check). HINT: give a number of "
            "processes, or 'cpu' for one per CPU core."
        ) from None
    return count, f"{kind}: {count} process(es), as torchrun counts them"


def _device_count(kind: str) -> tuple[int, str]:
    """unidist's ``-n auto|gpu|cpu|xpu`` -> a count; ``auto`` is one per GPU, else 1 process."""
    if kind == "cpu":
        count = torchfacts.cpu_count()
        return count, f"{kind}: {count} CPU core(s) -> {count} process(es)"
    count = torchfacts.device_count(kind)
    if kind in ("gpu", "xpu") and not count:
        raise ConfigurationError(
            f"--nproc {kind}: no {kind.upper()} device is visible. HINT: give a number of "
            "processes, or 'cpu' for one per CPU core."
        )
    return max(count, 1), f"{kind}: {count} device(s) -> {max(count, 1)} process(es)"


def plan_from_args(args: argparse.Namespace) -> LaunchPlan:
    """Check the options against each other and the environment; resolve the topology.

    Raises:
        ConfigurationError: what is wrong and how to fix it.
    """
    _check_pet(args)
    checks.check_numbers(args)
    checks.check_endpoint(args.rdzv_endpoint, "--rdzv-endpoint")
    checks.check_host(args.master_addr, "--master-addr")
    checks.check_host(args.local_addr, "--local-addr")
    checks.check_name(args.rdzv_id, _source(args, "rdzv_id"), longest=checks.MAX_ID_LENGTH)
    checks.check_name(args.role, _source(args, "role"))
    checks.check_signals(args.signals_to_handle, _source(args, "signals_to_handle"))
    checks.check_agent_variables(_env.chosen(checks.AGENT_VARIABLES))
    nproc, note = _nproc(args)
    option = "--nproc-per-node" if args.nproc_per_node is not None else "-n"
    templates = args.stdout is not None or args.stderr is not None
    notes = [note] if note else []
    rdzv = resolve(args, nproc, notes)
    checks.check_capacity(nproc, rdzv.max_nodes, args.console, templates, option)
    checks.check_endpoint(rdzv.endpoint, "the rendezvous endpoint")
    _check_target(args.target, args.module, args.no_python)
    if args.module and args.no_python:
        raise ConfigurationError("-m and --no-python contradict each other. HINT: keep one.")
    _check_templates(args.stdout, args.stderr)
    torch_options = _torch_options(args, notes)  # may drop a variable this torch does not read
    grace = args.grace if args.grace is not None else args.shutdown_timeout
    grace = 3.0 if grace is None else grace
    if args.start_method is not None:
        notes.append(
            f"--start-method {args.start_method}: a script starts as a new process "
            "(torchrun ignores the start method for scripts too)"
        )
    plan = LaunchPlan(
        target=args.target,
        module=args.module,
        no_python=args.no_python,
        args=tuple(args.args),
        nproc=nproc,
        rdzv=rdzv,
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
        role=args.role,
        log_root=Path(args.log_dir) if args.log_dir else None,
        stdout=args.stdout,
        stderr=args.stderr,
        console=_console(args, rdzv, nproc),
        timeout=args.timeout,
        grace=grace,
        exit_timeout=args.exit_timeout,
        hang_timeout=_hang_timeout(args),
        straggler_every=checks.straggler_every(args.straggler_report),
        torch_options=torch_options,
        notes=tuple(notes),
        logs_specs=_logs_specs(args),
    )
    check_log_places(plan)
    return plan


def _hang_timeout(args: argparse.Namespace) -> float | None:
    if args.hang_timeout is not None:
        return checks.hang_timeout(args.hang_timeout, "--hang-timeout")
    return checks.hang_timeout(_env.read_settings().hang_timeout, "UNIDIST_HANG_TIMEOUT")


def _console(args: argparse.Namespace, rdzv: Rendezvous, nproc: int) -> ConsoleSpec:
    redirects = parse_std(args.redirects, "--redirects")
    tee = parse_std(args.tee, "--tee")
    hidden = {
        local: redirects.get(local, redirects.get(-1, 0)) & ~tee.get(local, tee.get(-1, 0))
        for local in {*redirects, *tee}
    }
    several = rdzv.max_nodes > 1
    prefix = args.log_line_prefix_template or (
        "[${hostname} rank${rank}]: " if several else "[rank${rank}]: "
    )
    world = rdzv.max_nodes * nproc
    nodes = f"{rdzv.max_nodes} node(s)" if rdzv.max_nodes > 1 else "one node"
    return ConsoleSpec(
        enabled=args.console,
        ranks=parse_ranks(
            args.console_ranks, "--console-ranks", world, f"the job ({nproc} per node, {nodes})"
        ),
        local_ranks=parse_ranks(
            args.local_ranks_filter, "--local-ranks-filter", nproc, f"a node ({nproc} per node)"
        ),
        hidden=hidden,
        prefix=prefix,
    )


def _logs_specs(args: argparse.Namespace) -> ChosenLogsSpecs | None:
    name = getattr(args, "logs_specs", None)
    if name is None:
        return None
    if args.stdout is not None or args.stderr is not None:
        raise ConfigurationError(
            f"--logs-specs {name} decides where the ranks' output goes, and so do --stdout and "
            "--stderr. HINT: keep one of them."
        )
    chosen = ChosenLogsSpecs(
        name, args.log_dir, args.redirects or "0", args.tee or "0", args.local_ranks_filter
    )
    chosen.load()  # a missing or broken entry point fails before anything starts
    return chosen


def _torch_options(args: argparse.Namespace, notes: list[str]) -> dict[str, Any]:
    """torchrun options that map to ``LaunchConfig`` fields of newer torch releases only."""
    wanted: dict[str, tuple[str, Any]] = {}
    if args.signals_to_handle is not None:
        wanted["signals_to_handle"] = ("--signals-to-handle", args.signals_to_handle)
    if args.event_log_handler is not None:
        wanted["event_log_handler"] = ("--event-log-handler", args.event_log_handler)
    if args.virtual_local_rank:
        wanted["virtual_local_rank"] = ("--virtual-local-rank", True)
    if args.numa_binding is not None:
        wanted["numa_options"] = ("--numa-binding", args.numa_binding)
    if args.shutdown_timeout is not None:
        wanted["shutdown_timeout"] = ("--shutdown-timeout", int(args.shutdown_timeout))
    if not wanted:
        return {}
    fields = torchfacts.agent_settings()
    for name, (option, _) in list(wanted.items()):
        dest = option[2:].replace("-", "_")
        if name not in fields and from_variable(args, dest):
            # This torch's torchrun does not read the variable either: ignored, and said.
            notes.append(f"PET_{dest.upper()} is not read by this torch's torchrun: ignored")
            del wanted[name]
            setattr(args, dest, None if dest != "virtual_local_rank" else False)
        elif name not in fields and option != "--shutdown-timeout":
            raise ConfigurationError(
                f"{option} needs a newer torch: torch {torchfacts.torch_version()}'s elastic "
                f"agent has no {name!r} setting. HINT: upgrade torch, or drop {option}."
            )
    options = {name: value for name, (_, value) in wanted.items() if name in fields}
    if "numa_options" in options:
        options["numa_options"] = torchfacts.numa_options(options["numa_options"])
    return options


def _check_target(target: str, module: bool, no_python: bool) -> None:
    if no_python:
        return  # a program on PATH or a path; exec reports a missing one in the rank's log
    if module:
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigurationError(
                f"no module named {target!r} to run with -m. HINT: run from the folder that "
                "contains the package, or install it (pip install -e .)."
            )
        return
    path = Path(target)
    if path.is_dir() and not (path / "__main__.py").is_file():
        raise ConfigurationError(
            f"{target!r} is a folder without a __main__.py, so python cannot run it. HINT: give "
            "the script inside it, or add __main__.py."
        )
    if not path.exists():
        raise ConfigurationError(
            f"script {target!r} does not exist (looked in {os.getcwd()}). HINT: check the path, "
            "or pass -m for a module."
        )


def _check_templates(stdout: str | None, stderr: str | None) -> None:
    for name, template in (("--stdout", stdout), ("--stderr", stderr)):
        if template is None:
            continue
        try:
            template.format(**_PLACEHOLDERS)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigurationError(
                f"{name} {template!r} has an unknown placeholder ({exc}). HINT: use {{rank}}, "
                "{local_rank}, {node_rank}, {attempt}, {world_size} or {local_world_size}."
            ) from None
        if "{rank}" not in template and "{local_rank}" not in template:
            raise ConfigurationError(
                f"{name} {template!r} has no {{rank}} or {{local_rank}}: every rank would write "
                "the same file. HINT: add {rank}, e.g. out_{rank}.log."
            )
    if stdout and stderr and stdout.format(**_PLACEHOLDERS) == stderr.format(**_PLACEHOLDERS):
        raise ConfigurationError(
            f"--stdout and --stderr both name {stdout!r}; two writers would overwrite each "
            "other. HINT: give stderr its own file."
        )


def _values(plan: LaunchPlan, local: int) -> dict[str, int]:
    """The template placeholders of this node's local rank ``local`` in the first start."""
    node = plan.rdzv.node_rank or 0
    return {
        **_PLACEHOLDERS,
        "rank": node * plan.nproc + local,
        "local_rank": local,
        "node_rank": node,
        "world_size": plan.rdzv.min_nodes * plan.nproc,
        "local_world_size": plan.nproc,
    }


def check_log_places(plan: LaunchPlan) -> None:
    """Before anything is created: the log folder and every log file of the templates can be
    written, and no folder, link or other user's file stands where a log file would go.

    Raises:
        ConfigurationError: the place and the reason.
    """
    if plan.log_root is not None:
        checks.check_log_folder(plan.log_root, "cannot create a run folder in")
    if plan.stdout is None and plan.stderr is None:
        return  # every file goes into the new private run folder
    marker = Path("/nonexistent-unidist-run")  # the run folder: new, so nothing is there yet
    files: list[Path] = []
    for local in range(plan.nproc):
        files.extend(
            path
            for path in plan.log_paths(marker, **_values(plan, local))
            if marker not in path.parents
        )
    for folder in checks.unique(path.parent for path in files):
        checks.check_log_folder(folder, "cannot write log files to")
    for path in checks.unique(files):
        checks.check_log_file(path)


def probe_templates(
    plan: LaunchPlan, folder: Path, io: Callable[[Path], Path] = lambda path: path
) -> None:
    """Fail before anything starts if this node's log files cannot be written.

    ``io``: how a path is reached (the run folder's, through its handle); messages show the
    path itself.

    Raises:
        ConfigurationError: the folder a log file goes to cannot be created or written.
    """
    folders = checks.unique(
        path.parent
        for local in range(plan.nproc)
        for path in plan.log_paths(folder, **_values(plan, local))
    )
    for parent in folders:
        try:
            io(parent).mkdir(mode=0o700, parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=io(parent)).close()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write log files to {str(parent)!r} ({rundir.why(parent, exc)}). HINT: "
                "choose a writable place with --log-dir, --stdout or --stderr."
            ) from None
