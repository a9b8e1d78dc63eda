"""How the nodes of a job find each other: torchrun's rendezvous options, resolved and checked.

The forms torchrun takes, with torchrun's meaning:

* one node (the default): a c10d store on a free local port (``--standalone`` says it too);
* static: ``--nnodes N --node-rank K --master-addr HOST [--master-port P]`` on each node;
* dynamic: ``--rdzv-backend c10d --rdzv-endpoint HOST:PORT --nnodes N`` with no node rank (the
  rendezvous assigns them), or ``--nnodes MIN:MAX`` for an elastic job that starts with MIN nodes
  and restarts with the new membership when more join (torch's agent does it); ``etcd`` and
  ``etcd-v2`` where python-etcd is installed, and any ``torchrun.handlers`` plugin;
* under ``srun`` (one launcher per node) the nodes, this node's rank and the endpoint come from
  SLURM, for the static form or a dynamic backend.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import errno
import importlib.metadata
import importlib.util
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from unidist.environments import variables as _env
from unidist.errors import ConfigurationError
from unidist.launch import onenode

__all__ = ["Rendezvous", "check_port_free", "keep_alive", "parse_conf", "resolve"]

_BUILTIN_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
_DEFAULT_PORT = 29500
#: Keys torch's c10d (dynamic) and static rendezvous read from --rdzv-conf, across versions.
_KNOWN_KEYS = {
    "c10d": (
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
        "read_timeout",
        "is_host",
        "store_type",
        "timeout",
        "use_libuv",
    ),
    "static": ("timeout",),
}
#: How torch reads each of those keys: whole seconds and counts (``int(value)``; the timeouts
#: must be positive), booleans (``1/true/t/yes/y`` or ``0/false/f/no/n``), a store type.
_BOOLEANS = ("is_host", "use_libuv")
_WHOLE_NUMBERS = tuple(k for k in _KNOWN_KEYS["c10d"] if k not in (*_BOOLEANS, "store_type"))
_TRUE_FALSE = ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")
_STORE_TYPES = ("tcp", "file")


def _conf_value_problem(key: str, value: str) -> str | None:
    if key in _WHOLE_NUMBERS:
        try:
            number = int(value)
        except ValueError:
            return "is not a whole number (torch reads it with int())"
        return None if number >= 1 else "must be 1 or more"
    if key in _BOOLEANS and value.lower() not in _TRUE_FALSE:
        return "is not a boolean (1, true, yes or 0, false, no)"
    if key == "store_type" and value.strip().lower() not in _STORE_TYPES:
        return f"is not a store type torch has ({', '.join(_STORE_TYPES)})"
    return None


@dataclass(frozen=True)
class Rendezvous:
    """Where and how this node meets the others.

    Attributes:
        backend: ``c10d``, ``static``, ``etcd``, ``etcd-v2`` or a plugin's name.
        endpoint: ``HOST:PORT`` of the rendezvous (port 0: a free one, single node only).
        run_id: the job's id, the same on every node.
        min_nodes: nodes needed to start.
        max_nodes: nodes the job can grow to (``min_nodes`` unless elastic).
        node_rank: this node's index (static); ``None`` when the rendezvous assigns it.
        configs: the backend's settings (``--rdzv-conf``).
        local_addr: this node's address as the others reach it, or None.
    """

    backend: str = "c10d"
    endpoint: str = "localhost:0"
    run_id: str = "unidist"
    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int | None = 0
    configs: Mapping[str, str] = field(default_factory=dict)
    local_addr: str | None = None

    @property
    def elastic(self) -> bool:
        """Whether the number of nodes may change while the job runs."""
        return self.min_nodes != self.max_nodes

    @property
    def nnodes(self) -> str:
        """``--nnodes`` as torchrun writes it: ``2`` or ``1:4``."""
        return str(self.min_nodes) if not self.elastic else f"{self.min_nodes}:{self.max_nodes}"

    @property
    def host(self) -> str:
        """The endpoint's host."""
        return self.endpoint.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        """The endpoint's port (0: chosen when the store starts)."""
        return int(self.endpoint.rsplit(":", 1)[1])

    def describe(self) -> str:
        """One line for ``--dry-run``."""
        if self.backend == "static":
            return f"static at {self.endpoint} (this is node {self.node_rank} of {self.nnodes})"
        where = "a free local port" if self.endpoint.endswith(":0") else self.endpoint
        if self.max_nodes == 1:
            return f"{self.backend} at {where} (one node)"
        nodes = f"{self.nnodes} node(s)" + (", elastic" if self.elastic else "")
        return f"{self.backend} at {where}, id {self.run_id!r}, {nodes}, node ranks assigned"


def _nnodes(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        low, high = 0, -1
    if not 0 < low <= high:
        raise ConfigurationError(
            f"--nnodes {text!r} is not a number of nodes or a MIN:MAX range with 1 <= MIN <= MAX. "
            "HINT: --nnodes 2, or --nnodes 1:4 for an elastic job."
        )
    return low, high


def parse_conf(text: str | None, backend: str) -> dict[str, str]:
    """``--rdzv-conf`` ``KEY=VALUE,...`` -> a dict, with unknown keys refused for c10d and static.

    torch ignores a key it does not read, so a typo (``last_cal_timeout``) would silently keep
    the default; for the built-in backends an unknown key is an error with a suggestion. Quotes
    around the whole value that reached the program literally (``"'a=1,b=2'"``, quoted twice)
    are dropped: torch would read a key ``'a`` and ignore it, unidist would refuse it.
    """
    configs: dict[str, str] = {}
    body = (text or "").strip()
    if len(body) > 1 and body[0] == body[-1] and body[0] in "'\"":
        body = body[1:-1]
    for item in body.split(","):
        if not item.strip():
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        if not key or not sep or not value:
            raise ConfigurationError(
                f"--rdzv-conf {text!r}: {item.strip()!r} is not KEY=VALUE. HINT: "
                "--rdzv-conf last_call_timeout=5,join_timeout=600"
            )
        configs[key] = value
    known = _KNOWN_KEYS.get(backend)
    if known is not None:
        if "rank" in configs:
            raise ConfigurationError(
                "--rdzv-conf rank=... is not used: torchrun sets it from --node-rank. "
                "HINT: pass --node-rank instead."
            )
        for key in configs:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {close[0]}? " if close else ""
                raise ConfigurationError(
                    f"--rdzv-conf key {key!r} is not read by the {backend} rendezvous (torch "
                    f"would ignore it). HINT: {hint}known keys: {', '.join(known)}."
                )
            problem = _conf_value_problem(key, configs[key])
            if problem is not None:
                raise ConfigurationError(
                    f"--rdzv-conf {key}={configs[key]!r} {problem}. HINT: e.g. "
                    "--rdzv-conf join_timeout=600,last_call_timeout=5,is_host=false."
                )
    return configs


def resolve(args: argparse.Namespace, nproc: int, notes: list[str]) -> Rendezvous:
    """The rendezvous the options (and SLURM, under ``srun``) describe.

    Raises:
        ConfigurationError: contradictory or incomplete options, with the fix.
    """
    reading = _env.read()
    if reading.launcher not in ("none", "slurm"):
        raise ConfigurationError(
            f"unidist launch is running inside a job that {reading.launcher} already started "
            f"(rank {reading.rank} of {reading.world_size}). HINT: run the script directly, or "
            "start unidist launch outside the other launcher."
        )
    nodes = _nnodes(args.nnodes)
    nodes = _composer_world_size(args, nproc, nodes)
    backend = args.rdzv_backend
    if args.standalone:
        return _standalone(args, nodes, notes)
    node_rank, master_addr, master_port = args.node_rank, args.master_addr, args.master_port
    if reading.launcher == "slurm" and nodes is None:
        nodes, node_rank, master_addr, master_port = _from_slurm(
            reading, master_addr, master_port, backend, notes
        )
    nodes = nodes or (1, 1)
    node_rank = _base_rank(args, node_rank, nproc)
    if backend is None:
        if nodes == (1, 1) and args.rdzv_endpoint is None:
            return _single_node(args, master_addr, master_port, node_rank)
        fixed_several = nodes[0] == nodes[1] > 1
        backend = "static?" if node_rank is None and fixed_several else "static"
    if backend == "static?":
        raise ConfigurationError(
            f"--nnodes {nodes[0]} needs --node-rank ({_range(nodes[0])}) on each node, with "
            "--master-addr <host of node 0> (the static rendezvous), or --rdzv-backend c10d "
            "--rdzv-endpoint HOST:PORT on every node (node ranks assigned by the rendezvous)."
        )
    if backend == "static":
        found = _static(args, nodes, node_rank, master_addr, master_port, notes)
    else:
        found = _dynamic(args, backend, nodes, node_rank, master_addr, master_port, notes)
    return _with_node_timeout(found, args.node_timeout, notes)


#: unidist launch's default ``--node-timeout``: seconds a silent node is waited for.
NODE_TIMEOUT = 6.0


def keep_alive(seconds: float) -> tuple[int, int]:
    """(keep_alive_interval, keep_alive_max_attempt) for a node timeout of ``seconds``.

    torch reads both as whole numbers (``int("3.3")`` fails the rendezvous), so the timeout is
    rounded: three beats where it is 3 s or more (6 -> 2 x 3, 10 -> 3 x 3), 1 s beats below.
    """
    interval = max(1, round(seconds / 3))
    return interval, max(1, round(seconds / interval))


def _with_node_timeout(rdzv: Rendezvous, seconds: float | None, notes: list[str]) -> Rendezvous:
    """The keep-alive of a dynamic rendezvous from ``--node-timeout``, unless ``--rdzv-conf``
    sets it: a node silent that long is dropped from the round, which is what a restart after
    a node's loss waits for (torch's own default: 5 s x 3)."""
    if rdzv.backend not in ("c10d", "etcd", "etcd-v2", "static") or rdzv.max_nodes < 2:
        return rdzv  # (static: torch has no keep-alive; the launchers' relay reads it)
    if {"keep_alive_interval", "keep_alive_max_attempt"} & set(rdzv.configs):
        return rdzv  # the user's own keep-alive, as torch reads it
    seconds = NODE_TIMEOUT if seconds is None else seconds
    interval, attempts = keep_alive(seconds)
    configs = {
        **rdzv.configs,
        "keep_alive_interval": str(interval),
        "keep_alive_max_attempt": str(attempts),
    }
    notes.append(
        f"--node-timeout {seconds:g}: a node silent for {interval * attempts} s is dropped from "
        f"the rendezvous (keep_alive_interval={interval}, keep_alive_max_attempt={attempts}; "
        "torch's default is 5 x 3)"
    )
    return dataclasses.replace(rdzv, configs=configs)


def _composer_world_size(
    args: argparse.Namespace, nproc: int, nodes: tuple[int, int] | None
) -> tuple[int, int] | None:
    if args.world_size is None:
        return nodes
    if args.world_size % nproc:
        raise ConfigurationError(
            f"--world-size {args.world_size} is not a multiple of --nproc {nproc}; torch's "
            "agent gives every node the same number of processes. HINT: pass --world-size "
            f"{(args.world_size // nproc + 1) * nproc} or change --nproc."
        )
    implied = args.world_size // nproc
    if nodes is not None and nodes != (implied, implied):
        raise ConfigurationError(
            f"--world-size {args.world_size} with --nproc {nproc} means {implied} node(s), "
            f"but --nnodes is {args.nnodes}. HINT: drop one of them."
        )
    return implied, implied


def _base_rank(args: argparse.Namespace, node_rank: int | None, nproc: int) -> int | None:
    if args.base_rank is None:
        return node_rank
    if node_rank is None and args.base_rank % nproc == 0:
        node_rank = args.base_rank // nproc
    if node_rank is None or args.base_rank != node_rank * nproc:
        raise ConfigurationError(
            f"--base-rank {args.base_rank} cannot be honoured: torch's elastic agent gives "
            f"node k the ranks k*nproc .. k*nproc+{nproc - 1}, so node {node_rank} starts at "
            f"{(node_rank or 0) * nproc}. HINT: drop --base-rank and pass --node-rank."
        )
    return node_rank


def _standalone(
    args: argparse.Namespace, nodes: tuple[int, int] | None, notes: list[str]
) -> Rendezvous:
    given = [
        name
        for name, value in (
            ("--rdzv-backend", args.rdzv_backend),
            ("--rdzv-endpoint", args.rdzv_endpoint),
            ("--node-rank", args.node_rank),
            ("--master-addr", args.master_addr),
            ("--master-port", args.master_port),
        )
        if value is not None
    ]
    if given or (nodes is not None and nodes != (1, 1)):
        what = ", ".join(given) or f"--nnodes {args.nnodes or nodes}"
        raise ConfigurationError(
            f"--standalone is a single-node job on a free local port, but {what} was given too "
            "(torchrun would silently ignore it). HINT: drop --standalone for a multi-node job, "
            f"or drop {what}."
        )
    notes.append("--standalone: c10d rendezvous on a free local port")
    return Rendezvous(
        run_id=args.rdzv_id or uuid.uuid4().hex[:12],
        configs=parse_conf(args.rdzv_conf, "c10d"),
        local_addr=args.local_addr,
    )


def _single_node(
    args: argparse.Namespace,
    master_addr: str | None,
    master_port: int | None,
    node_rank: int | None,
) -> Rendezvous:
    if node_rank not in (None, 0):
        raise ConfigurationError(
            f"--node-rank {node_rank} is not a node of --nnodes 1: node ranks are 0..0. "
            "HINT: count nodes from 0."
        )
    port = _port(master_port, "--master-port") if master_port else 0
    if port:
        check_port_free(port, "--master-port")
        # As torchrun: the agent hosts its store at MASTER_ADDR:MASTER_PORT and lends it to the
        # ranks (TORCHELASTIC_USE_AGENT_STORE=True), so init_method="tcp://ADDR:PORT" and
        # env:// reach that store instead of trying to listen on the same port.
        return Rendezvous(
            backend="static",
            endpoint=f"{master_addr or '127.0.0.1'}:{port}",
            run_id=args.rdzv_id or uuid.uuid4().hex[:12],
            configs=parse_conf(args.rdzv_conf, "static"),
            local_addr=args.local_addr,
        )
    # One node on a port the system picks: unidist's own handler (launch.onenode), which does
    # not sleep before the first round as c10d's does. --rdzv-conf takes c10d's keys; of
    # them, only join_timeout means something for one node.
    return Rendezvous(
        backend=onenode.BACKEND,
        endpoint=f"{master_addr or 'localhost'}:{port}",
        # A fresh id per run, so that two jobs on one host never share a rendezvous.
        run_id=args.rdzv_id or uuid.uuid4().hex[:12],
        configs=parse_conf(args.rdzv_conf, "c10d"),
        local_addr=args.local_addr,
    )


def _static(
    args: argparse.Namespace,
    nodes: tuple[int, int],
    node_rank: int | None,
    master_addr: str | None,
    master_port: int | None,
    notes: list[str],
) -> Rendezvous:
    if nodes[0] != nodes[1]:
        raise ConfigurationError(
            f"--nnodes {args.nnodes} is elastic, but the static rendezvous has a fixed number "
            "of nodes. HINT: add --rdzv-backend c10d --rdzv-endpoint HOST:PORT."
        )
    count = nodes[0]
    if node_rank is None:
        if count > 1:
            raise ConfigurationError(
                f"--nnodes {count} needs --node-rank ({_range(count)}) on each node, or "
                "--rdzv-backend c10d --rdzv-endpoint HOST:PORT to have node ranks assigned."
            )
        node_rank = 0
    if not 0 <= node_rank < count:
        raise ConfigurationError(
            f"--node-rank {node_rank} is not a node of --nnodes {count}: node ranks are "
            f"0..{count - 1}. HINT: count nodes from 0."
        )
    endpoint = args.rdzv_endpoint
    if endpoint is None:
        if count > 1 and not master_addr:
            raise ConfigurationError(
                f"--nnodes {count} needs --master-addr: every node must know where node 0 is. "
                "HINT: pass --master-addr <host of node 0> (and the same --master-port) on "
                "every node."
            )
        if master_port is None:
            master_port = _DEFAULT_PORT
            notes.append(f"static rendezvous and no --master-port: using {_DEFAULT_PORT}")
        endpoint = f"{master_addr or '127.0.0.1'}:{_port(master_port, '--master-port')}"
    port = _endpoint_port(endpoint)
    if node_rank == 0:
        check_port_free(port, "--master-port" if args.rdzv_endpoint is None else "--rdzv-endpoint")
    return Rendezvous(
        backend="static",
        endpoint=endpoint,
        run_id=args.rdzv_id or "unidist",
        min_nodes=count,
        max_nodes=count,
        node_rank=node_rank,
        configs=parse_conf(args.rdzv_conf, "static"),
        local_addr=args.local_addr,
    )


def _dynamic(
    args: argparse.Namespace,
    backend: str,
    nodes: tuple[int, int],
    node_rank: int | None,
    master_addr: str | None,
    master_port: int | None,
    notes: list[str],
) -> Rendezvous:
    _check_backend(backend)
    if node_rank is not None:
        notes.append(
            f"--node-rank {node_rank} is ignored: the {backend} rendezvous assigns node ranks "
            "(as torchrun does)"
        )
    endpoint = args.rdzv_endpoint
    if endpoint is None and master_addr is not None:
        endpoint = f"{master_addr}:{master_port or _DEFAULT_PORT}"
        notes.append(f"rendezvous endpoint from the master address: {endpoint}")
    if endpoint is None:
        if nodes[1] > 1:
            raise ConfigurationError(
                f"--rdzv-backend {backend} with --nnodes {args.nnodes or nodes[0]} needs "
                "--rdzv-endpoint HOST:PORT, the same on every node (HOST runs the rendezvous "
                "store). HINT: --rdzv-endpoint node0:29400."
            )
        endpoint = "localhost:0"
    elif ":" not in endpoint and backend == "c10d":
        endpoint = f"{endpoint}:29400"  # torch's c10d default port
        notes.append(f"--rdzv-endpoint has no port: torch's c10d default 29400 ({endpoint})")
    if endpoint.endswith(":0") and nodes[1] > 1:
        raise ConfigurationError(
            f"--rdzv-endpoint {endpoint}: port 0 (a free port) only works on a single node; "
            "the other nodes must know the port in advance. HINT: give a fixed port."
        )
    if ":" in endpoint:
        _endpoint_port(endpoint)
    return Rendezvous(
        backend=backend,
        endpoint=endpoint,
        run_id=args.rdzv_id or ("unidist" if nodes[1] > 1 else uuid.uuid4().hex[:12]),
        min_nodes=nodes[0],
        max_nodes=nodes[1],
        node_rank=None,
        configs=parse_conf(args.rdzv_conf, backend),
        local_addr=args.local_addr,
    )


def _from_slurm(
    reading: _env.EnvReading,
    master_addr: str | None,
    master_port: int | None,
    backend: str | None,
    notes: list[str],
) -> tuple[tuple[int, int], int | None, str | None, int | None]:
    if reading.local_world_size not in (None, 1):
        raise ConfigurationError(
            f"under srun, unidist launch starts the processes of a node itself, but this "
            f"step runs {reading.local_world_size} tasks per node. HINT: srun "
            "--ntasks-per-node=1 unidist launch -n <processes per node> train.py"
        )
    count = reading.num_nodes or reading.world_size
    master_addr = master_addr or reading.master_addr
    master_port = master_port if master_port is not None else reading.master_port
    static = backend in (None, "static")
    notes.append(
        f"from SLURM: {count} node(s), this is node {reading.node_rank}, "
        f"{'master' if static else 'rendezvous'} {master_addr}:{master_port}"
    )
    return (count, count), reading.node_rank if static else None, master_addr, master_port


def _check_backend(backend: str) -> None:
    plugins = {entry.name for entry in importlib.metadata.entry_points(group="torchrun.handlers")}
    known = (*_BUILTIN_BACKENDS, *sorted(plugins))
    if backend not in known:
        close = difflib.get_close_matches(backend, known, n=1)
        raise ConfigurationError(
            f"--rdzv-backend {backend!r} is not a rendezvous backend torch knows here. HINT: "
            f"{'did you mean ' + close[0] + '? ' if close else ''}use one of {', '.join(known)}."
        )
    if backend.startswith("etcd") and importlib.util.find_spec("etcd") is None:
        raise ConfigurationError(
            f"--rdzv-backend {backend} needs the etcd client package, which is not installed. "
            "HINT: pip install python-etcd (and run an etcd server), or use --rdzv-backend c10d, "
            "which needs no server."
        )


def _range(count: int) -> str:
    return f"0..{count - 1}"


def _port(port: int, option: str) -> int:
    if not 0 < port < 65536:
        raise ConfigurationError(f"{option} {port} is not a TCP port (1-65535).")
    return port


def _endpoint_port(endpoint: str) -> int:
    host, _, text = endpoint.rpartition(":")
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not host or not 0 <= port < 65536:
        raise ConfigurationError(
            f"--rdzv-endpoint {endpoint!r} is not HOST:PORT. HINT: --rdzv-endpoint node0:29400."
        )
    return port


def check_port_free(port: int, option: str) -> None:
    """Refuse a port this node would have to listen on but cannot, saying why.

    Raises:
        ConfigurationError: the port is taken, or binding it is not permitted (below 1024 as a
            user without CAP_NET_BIND_SERVICE).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except PermissionError:
            raise ConfigurationError(
                f"{option} {port}: this user may not listen on port {port} (ports below 1024 "
                "need root or CAP_NET_BIND_SERVICE). HINT: pick a port from 1024 to 65535, or "
                "omit it on a single node and let unidist choose a free one."
            ) from None
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise ConfigurationError(
                    f"{option} {port}: cannot listen on it ({exc.strerror}). HINT: pick another "
                    "port."
                ) from None
            raise ConfigurationError(
                f"{option} {port} is already in use on this machine. HINT: pick another "
                "port, or omit it on a single node and let unidist choose a free one."
            ) from None
