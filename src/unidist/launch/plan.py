"""``unidist launch`` options, checked and resolved into one frozen :class:`LaunchPlan`."""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from unidist import _env
from unidist.errors import ConfigurationError

__all__ = ["LaunchPlan", "add_arguments", "plan_from_args"]

_PLACEHOLDERS = {"rank": 0, "local_rank": 0, "node_rank": 0, "attempt": 0}


@dataclass(frozen=True)
class LaunchPlan:
    """Everything ``unidist launch`` will do, before it does it.

    Attributes:
        target: the script path or module name (``None`` for :func:`unidist.spawn`).
        module: run ``target`` as ``python -m``.
        args: arguments for the script.
        nproc: processes on this node.
        nnodes: number of nodes (one launcher each).
        node_rank: this node's index.
        master_addr: host of node 0 (the rendezvous); None picks localhost on one node.
        master_port: rendezvous port; 0 lets node 0 pick a free one (single node only).
        max_restarts: times the whole local group is restarted after a failure.
        log_dir: folder for per-rank logs and the event records.
        stdout: per-rank stdout file template ({rank}, {local_rank}, {node_rank}, {attempt}).
        stderr: per-rank stderr file template.
        console: copy every rank's output to this console, prefixed by its rank.
        timeout: collective timeout for unidist in the ranks (``UNIDIST_TIMEOUT``), or None.
        grace: seconds a stopped rank gets after SIGTERM before SIGKILL.
        exit_timeout: once a rank has finished, seconds the others get to finish too before
            they are reported as hung and killed (0: wait for ever).
        run_id: rendezvous identifier; every node of a job must use the same one.
        notes: where values came from (SLURM, defaults), for --dry-run.
    """

    target: str | None
    module: bool = False
    args: tuple[str, ...] = ()
    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 0
    max_restarts: int = 0
    log_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    stdout: str = ""
    stderr: str = ""
    console: bool = True
    timeout: float | None = None
    grace: float = 3.0
    exit_timeout: float = 600.0
    run_id: str = "unidist"
    notes: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        """Processes in the whole job."""
        return self.nproc * self.nnodes

    @property
    def events(self) -> Path:
        """Where ranks leave their start/error/done records (this node's)."""
        return self.log_dir / f".events-node{self.node_rank}"

    def log_paths(self, rank: int, local_rank: int, attempt: int = 0) -> tuple[Path, Path]:
        """The (stdout, stderr) files of one rank."""
        values = {
            "rank": rank,
            "local_rank": local_rank,
            "node_rank": self.node_rank,
            "attempt": attempt,
        }
        return Path(self.stdout.format(**values)), Path(self.stderr.format(**values))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``unidist launch`` options (torchrun's and Composer's spellings both work)."""
    add = parser.add_argument
    add(
        "-n",
        "--nproc",
        "--nproc-per-node",
        "--nproc_per_node",
        default="1",
        help="processes on this node: a number, or 'auto' (one per GPU, else 1). Default 1",
    )
    add("--nnodes", type=int, default=None, help="number of nodes (one launcher per node)")
    add("--node-rank", "--node_rank", type=int, default=None, help="this node's index")
    add(
        "--world-size",
        "--world_size",
        type=int,
        default=None,
        help="total processes, Composer style (= nnodes * nproc)",
    )
    add(
        "--base-rank",
        "--base_rank",
        type=int,
        default=None,
        help="global rank of this node's first process (must be node_rank * nproc)",
    )
    add(
        "--master-addr",
        "--master_addr",
        default=None,
        help="host of node 0; required with several nodes",
    )
    add(
        "--master-port",
        "--master_port",
        type=int,
        default=None,
        help="rendezvous port; 0 or unset picks a free one on a single node",
    )
    add(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=0,
        help="restart the local group this many times after a failure (default 0)",
    )
    add(
        "--log-dir",
        "--log_dir",
        default=None,
        help="folder for per-rank logs (default: a new folder under the temp dir)",
    )
    add("--stdout", default=None, help="per-rank stdout file template, e.g. out_{rank}.log")
    add("--stderr", default=None, help="per-rank stderr file template, e.g. err_{rank}.log")
    add(
        "--no-console",
        dest="console",
        action="store_false",
        help="do not copy the ranks' output to this console (files only)",
    )
    add(
        "--timeout",
        type=float,
        default=None,
        help="seconds a collective may wait in the ranks (sets UNIDIST_TIMEOUT)",
    )
    add(
        "--grace",
        type=float,
        default=3.0,
        help="seconds a stopped rank gets between SIGTERM and SIGKILL (default 3)",
    )
    add(
        "--exit-timeout",
        type=float,
        default=600.0,
        help="once a rank has finished, seconds the others get to finish before they are "
        "reported as hung and killed (default 600; 0 waits for ever)",
    )
    add(
        "--run-id",
        "--run_id",
        default="unidist",
        help="rendezvous id, the same on every node of a job (default 'unidist')",
    )
    add(
        "--dry-run",
        "--dry_run",
        action="store_true",
        help="print the resolved topology and equivalent commands, start nothing",
    )
    add(
        "-m",
        "--module",
        "--module_mode",
        dest="module",
        action="store_true",
        help="run the target as a module (python -m)",
    )
    add("target", help="the training script (or module, with -m)")
    add("args", nargs=argparse.REMAINDER, help="arguments for the script")


def _nproc(text: str) -> tuple[int, str | None]:
    if text == "auto":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return max(count, 1), f"--nproc auto: {count} CUDA device(s) -> {max(count, 1)}"
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError(
            f"--nproc {text!r} is not a number. HINT: give a count like 2, or 'auto'."
        ) from None
    if value < 1:
        raise ConfigurationError(
            f"--nproc {value} starts no process. HINT: use --nproc 1 or more (or 'auto')."
        )
    return value, None


def plan_from_args(args: argparse.Namespace) -> LaunchPlan:
    """Check the options against each other and the environment; resolve the topology.

    Raises:
        ConfigurationError: what is wrong and how to fix it.
    """
    nproc, note = _nproc(args.nproc)
    notes = [note] if note else []
    nnodes, node_rank, master_addr, master_port = _nodes(args, nproc, notes)
    _check_target(args.target, args.module)
    if master_port and (nnodes == 1 or node_rank == 0):
        _check_port_free(master_port)
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.gettempdir(), "unidist", stamp)
    default = "attempt{attempt}/" if args.max_restarts else ""
    stdout = args.stdout or str(log_dir / f"{default}rank{{rank}}.stdout.log")
    stderr = args.stderr or str(log_dir / f"{default}rank{{rank}}.stderr.log")
    _check_templates(stdout, stderr)
    if args.grace <= 0 or (args.timeout is not None and args.timeout <= 0):
        raise ConfigurationError("--grace and --timeout must be positive numbers of seconds.")
    if args.exit_timeout < 0:
        raise ConfigurationError("--exit-timeout must be 0 (wait for ever) or positive.")
    return LaunchPlan(
        target=args.target,
        module=args.module,
        args=tuple(args.args),
        nproc=nproc,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        max_restarts=args.max_restarts,
        log_dir=log_dir,
        stdout=stdout,
        stderr=stderr,
        console=args.console,
        timeout=args.timeout,
        grace=args.grace,
        exit_timeout=args.exit_timeout,
        run_id=args.run_id,
        notes=tuple(notes),
    )


def _nodes(
    args: argparse.Namespace, nproc: int, notes: list[str]
) -> tuple[int, int, str | None, int]:
    """(nnodes, node_rank, master_addr, master_port) from the options and the environment."""
    reading = _env.read()
    if reading.launcher not in ("none", "slurm"):
        raise ConfigurationError(
            f"unidist launch is running inside a job that {reading.launcher} already started "
            f"(rank {reading.rank} of {reading.world_size}). HINT: run the script directly, or "
            "start unidist launch outside the other launcher."
        )
    nnodes, node_rank = args.nnodes, args.node_rank
    master_addr, master_port = args.master_addr, args.master_port
    if reading.launcher == "slurm" and nnodes is None:
        if reading.local_world_size not in (None, 1):
            raise ConfigurationError(
                f"under srun, unidist launch starts the processes of a node itself, but this "
                f"step runs {reading.local_world_size} tasks per node. HINT: srun "
                "--ntasks-per-node=1 unidist launch -n <processes per node> train.py"
            )
        nnodes, node_rank = reading.num_nodes or reading.world_size, reading.node_rank
        master_addr = master_addr or reading.master_addr
        master_port = master_port if master_port is not None else reading.master_port
        notes.append(
            f"from SLURM: {nnodes} node(s), this is node {node_rank}, master "
            f"{master_addr}:{master_port}"
        )
    if args.world_size is not None:
        if args.world_size % nproc:
            raise ConfigurationError(
                f"--world-size {args.world_size} is not a multiple of --nproc {nproc}; torch's "
                "agent gives every node the same number of processes. HINT: pass --world-size "
                f"{(args.world_size // nproc + 1) * nproc} or change --nproc."
            )
        implied = args.world_size // nproc
        if nnodes is not None and nnodes != implied:
            raise ConfigurationError(
                f"--world-size {args.world_size} with --nproc {nproc} means {implied} node(s), "
                f"but --nnodes is {nnodes}. HINT: drop one of them."
            )
        nnodes = implied
    nnodes = 1 if nnodes is None else nnodes
    if nnodes < 1:
        raise ConfigurationError(f"--nnodes {nnodes} must be at least 1.")
    node_rank = _node_rank(args, nnodes, node_rank, nproc)
    if nnodes > 1 and not master_addr:
        raise ConfigurationError(
            f"--nnodes {nnodes} needs --master-addr: every node must know where node 0 is. "
            "HINT: pass --master-addr <host of node 0> (and the same --master-port) on every node."
        )
    if master_port is None or master_port == 0:
        if nnodes > 1:
            master_port = 29500
            notes.append("several nodes and no --master-port: using 29500 on every node")
        else:
            master_port = 0
    elif not 0 < master_port < 65536:
        raise ConfigurationError(f"--master-port {master_port} is not a TCP port (1-65535).")
    return nnodes, node_rank, master_addr, master_port


def _node_rank(args: argparse.Namespace, nnodes: int, node_rank: int | None, nproc: int) -> int:
    if args.base_rank is not None:
        if node_rank is None and args.base_rank % nproc == 0:
            node_rank = args.base_rank // nproc
        if node_rank is None or args.base_rank != node_rank * nproc:
            raise ConfigurationError(
                f"--base-rank {args.base_rank} cannot be honoured: torch's elastic agent gives "
                f"node k the ranks k*nproc .. k*nproc+{nproc - 1}, so node {node_rank} starts at "
                f"{(node_rank or 0) * nproc}. HINT: drop --base-rank and pass --node-rank."
            )
    if node_rank is None:
        if nnodes > 1:
            raise ConfigurationError(
                f"--nnodes {nnodes} needs --node-rank (0..{nnodes - 1}) on each node."
            )
        node_rank = 0
    if not 0 <= node_rank < nnodes:
        raise ConfigurationError(
            f"--node-rank {node_rank} is not a node of --nnodes {nnodes}: node ranks are "
            f"0..{nnodes - 1}. HINT: count nodes from 0."
        )
    return node_rank


def _check_target(target: str, module: bool) -> None:
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
    elif not Path(target).is_file():
        raise ConfigurationError(
            f"script {target!r} does not exist (looked in {os.getcwd()}). HINT: check the path, "
            "or pass -m for a module."
        )


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            raise ConfigurationError(
                f"--master-port {port} is already in use on this machine. HINT: pick another "
                "port, or omit --master-port and let unidist choose a free one."
            ) from None


def _check_templates(stdout: str, stderr: str) -> None:
    for name, template in (("--stdout", stdout), ("--stderr", stderr)):
        try:
            template.format(**_PLACEHOLDERS)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigurationError(
                f"{name} {template!r} has an unknown placeholder ({exc}). HINT: use {{rank}}, "
                "{local_rank}, {node_rank} or {attempt}."
            ) from None
    if stdout.format(**_PLACEHOLDERS) == stderr.format(**_PLACEHOLDERS):
        raise ConfigurationError(
            f"--stdout and --stderr both name {stdout!r}; two writers would overwrite each "
            "other. HINT: give stderr its own file."
        )
    for name, template in (("--stdout", stdout), ("--stderr", stderr)):
        if "{rank}" not in template and "{local_rank}" not in template:
            raise ConfigurationError(
                f"{name} {template!r} has no {{rank}} or {{local_rank}}: every rank would write "
                "the same file. HINT: add {rank}, e.g. out_{rank}.log."
            )
