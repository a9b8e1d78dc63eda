"""The only module that reads (or writes) environment variables.

:func:`read` turns the variables of whatever started this process into one frozen
:class:`EnvReading`: torchrun/torchelastic, ``unidist launch``, Composer's launcher, Ignite's
``Parallel``/``spawn`` (which set the torch variables), SLURM's ``srun``, OpenMPI, MPICH/Intel MPI
(PMI) and MVAPICH, or nothing at all (one process). Malformed or contradictory values raise
:class:`~unidist.errors.TopologyError` naming the variables. Nothing here runs at import time.

Precedence: the torch variables (``RANK``/``WORLD_SIZE``/...) win over SLURM and MPI, because a
torch launcher started inside an allocation (``srun torchrun ...``) sets them for its workers.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from unidist.errors import ConfigurationError, TopologyError

__all__ = [
    "EnvReading",
    "Settings",
    "Topology",
    "expand_hostlist",
    "patched",
    "read",
    "read_settings",
    "torch_variables",
]

#: Set by ``unidist launch`` and the test harness in every process they start.
LAUNCHER_MARKER = "UNIDIST_LAUNCHER"

_TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_NODE_VARS = ("NODE_RANK", "GROUP_RANK")


@dataclass(frozen=True)
class Topology:
    """Where this process sits in the job. Every field has its single-process value by default.

    Attributes:
        rank: global rank, 0 when not distributed.
        world_size: number of processes in the job, 1 when not distributed.
        local_rank: rank among the processes on this node, 0 when not distributed.
        local_world_size: number of processes on this node, 1 when not distributed.
        node_rank: index of this node, 0 when not distributed.
        num_nodes: number of nodes, 1 when not distributed.
        launcher: what started the process: ``none``, ``torchrun``, ``unidist``, ``composer``,
            ``ignite``, ``env`` (torch variables set by something else), ``slurm``, ``openmpi``,
            ``mpich`` or ``mvapich``.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    launcher: str = "none"

    @property
    def is_distributed(self) -> bool:
        """True when the job has more than one process."""
        return self.world_size > 1

    def as_dict(self) -> dict[str, int | str]:
        """The fields as a plain dict (for logs and JSON)."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "node_rank": self.node_rank,
            "num_nodes": self.num_nodes,
            "launcher": self.launcher,
        }


@dataclass(frozen=True)
class EnvReading:
    """What the environment says. Local fields are ``None`` where no variable gives or implies them.

    ``None`` fields are filled in by :func:`unidist.initialize`, which can ask the other ranks;
    until then the getters that need them raise :class:`TopologyError` instead of guessing.
    """

    launcher: str = "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int | None = 0
    local_world_size: int | None = 1
    node_rank: int | None = 0
    num_nodes: int | None = 1
    master_addr: str | None = None
    master_port: int | None = None
    #: torchrun's agent hosts the rendezvous store (``TORCHELASTIC_USE_AGENT_STORE``).
    agent_store: bool = False
    #: How each value was found, in order: "rank from RANK", "node_rank derived as ...".
    notes: tuple[str, ...] = ()
    #: Which variable gave each field, for error messages ("rank" -> "RANK").
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def missing(self) -> tuple[str, ...]:
        """Names of the fields the environment does not determine."""
        names = ("local_rank", "local_world_size", "node_rank", "num_nodes")
        return tuple(name for name in names if getattr(self, name) is None)

    def topology(self) -> Topology:
        """The complete :class:`Topology`, or :class:`TopologyError` naming what is unknown."""
        if self.missing:
            raise TopologyError(
                f"The {self.launcher!r} environment does not say {', '.join(self.missing)} "
                f"(world size {self.world_size}). HINT: call unidist.initialize() on every rank "
                "(it works them out from the other ranks), or set LOCAL_RANK, LOCAL_WORLD_SIZE "
                "and NODE_RANK."
            )
        return Topology(
            rank=self.rank,
            world_size=self.world_size,
            local_rank=self.local_rank,  # type: ignore[arg-type]
            local_world_size=self.local_world_size,  # type: ignore[arg-type]
            node_rank=self.node_rank,  # type: ignore[arg-type]
            num_nodes=self.num_nodes,  # type: ignore[arg-type]
            launcher=self.launcher,
        )

    def with_topology(self, topology: Topology, note: str) -> EnvReading:
        """A copy whose topology fields are replaced, with a note saying why."""
        return replace(
            self,
            launcher=topology.launcher,
            rank=topology.rank,
            world_size=topology.world_size,
            local_rank=topology.local_rank,
            local_world_size=topology.local_world_size,
            node_rank=topology.node_rank,
            num_nodes=topology.num_nodes,
            notes=(*self.notes, note),
        )


@dataclass(frozen=True)
class Settings:
    """unidist's own variables: ``UNIDIST_ADAPTER``, ``UNIDIST_TIMEOUT``, ``UNIDIST_LAUNCHER``."""

    adapter: str | None = None
    timeout: float | None = None
    launcher: str | None = None


# -- reading -----------------------------------------------------------------------------------


def read(environ: Mapping[str, str] | None = None) -> EnvReading:
    """Parse the launcher variables of ``environ`` (default: this process's environment).

    Raises:
        TopologyError: a value is not an integer, is out of range, or contradicts another.
    """
    env = os.environ if environ is None else environ
    if any(name in env for name in _TORCH_VARS):
        return _from_torch_variables(env)
    if _is_srun_step(env):
        return _from_slurm(env)
    for flavour in _MPI_FLAVOURS:
        if flavour.rank in env or flavour.size in env:
            return _from_mpi(env, flavour)
    stray = [name for name in _NODE_VARS if name in env]
    if stray:
        values = ", ".join(f"{name}={env[name]!r}" for name in stray)
        raise TopologyError(
            f"{values} is set but WORLD_SIZE and RANK are not, so this process looks like a single "
            "process that was told it is on another node. HINT: unset "
            f"{' and '.join(stray)}, or start the job with a launcher that sets all of them."
        )
    notes = ["no launcher variables found: one process"]
    if "SLURM_JOB_ID" in env:
        notes.append(
            f"SLURM_JOB_ID={env['SLURM_JOB_ID']} is set but this is not an srun step, so it "
            "runs as one process; start one process per task with srun to use the allocation"
        )
    return EnvReading(notes=tuple(notes))


def read_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse unidist's own variables.

    Raises:
        ConfigurationError: ``UNIDIST_TIMEOUT`` is not a positive number.
    """
    env = os.environ if environ is None else environ
    timeout: float | None = None
    raw = env.get("UNIDIST_TIMEOUT")
    if raw is not None:
        try:
            timeout = float(raw)
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise ConfigurationError(
                f"UNIDIST_TIMEOUT={raw!r} is not a positive number of seconds. "
                "HINT: set it to e.g. 300, or unset it for the default."
            )
    return Settings(
        adapter=env.get("UNIDIST_ADAPTER") or None,
        timeout=timeout,
        launcher=env.get(LAUNCHER_MARKER) or None,
    )


def _int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise TopologyError(
            f"{name}={raw!r} is not an integer; expected a whole number >= {minimum}. "
            f"HINT: fix or unset {name} (launchers set it for each process)."
        ) from None
    if value < minimum:
        raise TopologyError(
            f"{name}={raw!r} is below {minimum}. HINT: fix or unset {name} "
            "(launchers set it for each process)."
        )
    return value


def _launcher_of_torch_variables(env: Mapping[str, str]) -> tuple[str, str]:
    if env.get(LAUNCHER_MARKER):
        return "unidist", f"{LAUNCHER_MARKER}={env[LAUNCHER_MARKER]} (unidist launch)"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun", "TORCHELASTIC_RUN_ID is set (torchrun / torch.distributed.elastic)"
    if "NODE_RANK" in env and "LOCAL_WORLD_SIZE" in env:
        return (
            "composer",
            "NODE_RANK and LOCAL_WORLD_SIZE are set without TORCHELASTIC_RUN_ID "
            "(the variables of Composer's launcher, composer -n)",
        )
    return "env", "torch variables set without a known launcher (Ignite spawn, mp.spawn or by hand)"


def _from_torch_variables(env: Mapping[str, str]) -> EnvReading:
    launcher, why = _launcher_of_torch_variables(env)
    rank = _int(env, "RANK")
    world = _int(env, "WORLD_SIZE", minimum=1)
    local_rank = _int(env, "LOCAL_RANK")
    local_world = _int(env, "LOCAL_WORLD_SIZE", minimum=1)
    if world is None:
        given = [f"{n}={env[n]!r}" for n in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE") if n in env]
        if local_rank is not None or local_world is not None or (rank or 0) > 0:
            raise TopologyError(
                f"{', '.join(given)} is set but WORLD_SIZE is not, so the job size is unknown. "
                "HINT: set WORLD_SIZE too (every torch launcher does), or unset "
                f"{' and '.join(g.split('=')[0] for g in given)}."
            )
        world = 1
    if rank is None:
        if world > 1:
            raise TopologyError(
                f"WORLD_SIZE={env['WORLD_SIZE']!r} is set but RANK is not, so this process does "
                "not know which rank it is. HINT: set RANK for each process, or start the job "
                "with torchrun or unidist launch."
            )
        rank = 0
    node_rank = _node_rank_from_torch_variables(env)
    sources = {
        "rank": "RANK",
        "world_size": "WORLD_SIZE",
        "local_rank": "LOCAL_RANK",
        "local_world_size": "LOCAL_WORLD_SIZE",
        "node_rank": node_rank[1],
        "num_nodes": "GROUP_WORLD_SIZE",
    }
    return _finish(
        launcher=launcher,
        rank=rank,
        world=world,
        local_rank=local_rank,
        local_world=local_world,
        node_rank=node_rank[0],
        num_nodes=_int(env, "GROUP_WORLD_SIZE", minimum=1),
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=_port(env),
        notes=[f"launcher {launcher}: {why}"],
        sources=sources,
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("1", "true"),
    )


def _node_rank_from_torch_variables(env: Mapping[str, str]) -> tuple[int | None, str]:
    node = _int(env, "NODE_RANK")
    group = _int(env, "GROUP_RANK")
    if node is not None and group is not None and node != group:
        raise TopologyError(
            f"NODE_RANK={env['NODE_RANK']!r} and GROUP_RANK={env['GROUP_RANK']!r} disagree; both "
            "name this node's index. HINT: unset NODE_RANK (torchrun sets GROUP_RANK) or make "
            "them equal."
        )
    if node is not None:
        return node, "NODE_RANK"
    return group, "GROUP_RANK"


def _port(env: Mapping[str, str]) -> int | None:
    port = _int(env, "MASTER_PORT")
    if port is not None and not 0 < port < 65536:
        raise TopologyError(
            f"MASTER_PORT={env['MASTER_PORT']!r} is not a TCP port (1-65535). HINT: pick a free "
            "port, or unset it and let the launcher choose."
        )
    return port


def _finish(
    *,
    launcher: str,
    rank: int,
    world: int,
    local_rank: int | None,
    local_world: int | None,
    node_rank: int | None,
    num_nodes: int | None,
    master_addr: str | None,
    master_port: int | None,
    notes: list[str],
    sources: dict[str, str],
    blocks: bool = True,
    agent_store: bool = False,
) -> EnvReading:
    """Check ranges and cross-field consistency, then derive what the variables imply.

    ``blocks``: the launcher gives each node a contiguous block of ranks (torch launchers do), so
    node rank and count follow from the local world size. MPI may map ranks round-robin, so there
    they are left to unidist.initialize(), which asks every rank for its host.
    """
    _check_ranks(rank, world, local_rank, local_world, sources)
    if world == 1:
        local_rank, local_world, node_rank, num_nodes = 0, 1, 0, 1
    if blocks and local_world is not None and world % local_world == 0:
        if num_nodes is None:
            num_nodes = world // local_world
            notes.append(f"num_nodes derived as world_size // local_world_size = {num_nodes}")
        if node_rank is None:
            node_rank = rank // local_world
            notes.append(
                f"node_rank derived as rank // local_world_size = {node_rank} "
                "(ranks are assigned to nodes in blocks)"
            )
    _check_nodes(world, node_rank, num_nodes, sources)
    return EnvReading(
        launcher=launcher,
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=master_port,
        notes=tuple(notes),
        sources=sources,
        agent_store=agent_store,
    )


def _bad(message: str) -> TopologyError:
    return TopologyError(
        f"{message} HINT: fix the launcher settings, or unset the variables and "
        "start the job with torchrun or unidist launch."
    )


def _check_ranks(
    rank: int, world: int, local_rank: int | None, local_world: int | None, sources: dict[str, str]
) -> None:
    name = sources.get
    if rank >= world:
        raise _bad(
            f"{name('rank')}={rank} but {name('world_size')}={world}: the rank must be "
            f"below the world size (0..{world - 1})."
        )
    if local_world is not None and local_world > world:
        raise _bad(
            f"{name('local_world_size')}={local_world} is larger than {name('world_size')}={world}."
        )
    if local_rank is not None and local_world is not None and local_rank >= local_world:
        raise _bad(
            f"{name('local_rank')}={local_rank} but {name('local_world_size')}="
            f"{local_world}: the local rank must be below the local world size."
        )
    if local_rank is not None and local_rank > rank:
        raise _bad(
            f"{name('local_rank')}={local_rank} is larger than {name('rank')}={rank}; a "
            "process cannot be further into its node than into the whole job."
        )


def _check_nodes(
    world: int, node_rank: int | None, num_nodes: int | None, sources: dict[str, str]
) -> None:
    name = sources.get
    if num_nodes is None:
        return
    if num_nodes > world:
        raise _bad(f"{name('num_nodes')}={num_nodes} is larger than {name('world_size')}={world}.")
    if node_rank is not None and node_rank >= num_nodes:
        raise _bad(
            f"{name('node_rank')}={node_rank} but there are {num_nodes} nodes: the node "
            f"rank must be below {num_nodes}."
        )


# -- SLURM -------------------------------------------------------------------------------------


def _is_srun_step(env: Mapping[str, str]) -> bool:
    if "SLURM_PROCID" not in env:
        return False
    if "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:
        return False  # the batch script itself, not a task started by srun
    # `srun --pty bash` for an interactive shell: the shell is not one of N training tasks.
    return env.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def _from_slurm(env: Mapping[str, str]) -> EnvReading:
    world_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    nodes_var = next(
        (v for v in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") if v in env),
        "SLURM_NNODES",
    )
    rank = _int(env, "SLURM_PROCID")
    world = _int(env, world_var, minimum=1)
    if rank is None or world is None:
        raise TopologyError(
            f"SLURM_PROCID={env.get('SLURM_PROCID')!r} and {world_var}={env.get(world_var)!r}: "
            "an srun step must set both. HINT: start the job with srun --ntasks=N."
        )
    node_rank = _int(env, "SLURM_NODEID")
    num_nodes = _int(env, nodes_var, minimum=1)
    local_world = None
    per_node_var = next(
        (v for v in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if v in env), None
    )
    if per_node_var is not None and node_rank is not None:
        counts = _expand_tasks_per_node(env[per_node_var], per_node_var)
        if node_rank < len(counts):
            local_world = counts[node_rank]
    nodelist_var = next(
        (v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if v in env),
        None,
    )
    notes = [
        f"launcher slurm: srun step {env.get('SLURM_STEP_ID', env.get('SLURM_STEPID'))} "
        f"of job {env.get('SLURM_JOB_ID')}"
    ]
    master_addr = env.get("MASTER_ADDR") or None
    if master_addr is None and nodelist_var is not None:
        hosts = expand_hostlist(env[nodelist_var])
        master_addr = hosts[0] if hosts else None
        notes.append(f"master_addr is the first host of {nodelist_var}: {master_addr}")
    master_port = _port(env)
    if master_port is None and "SLURM_JOB_ID" in env:
        job = _int(env, "SLURM_JOB_ID") or 0
        master_port = 15000 + job % 10000
        notes.append(f"master_port derived from SLURM_JOB_ID: 15000 + {job} % 10000")
    return _finish(
        launcher="slurm",
        rank=rank,
        world=world,
        local_rank=_int(env, "SLURM_LOCALID"),
        local_world=local_world,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=master_port,
        notes=notes,
        sources={
            "rank": "SLURM_PROCID",
            "world_size": world_var,
            "local_rank": "SLURM_LOCALID",
            "local_world_size": per_node_var or "SLURM_TASKS_PER_NODE",
            "node_rank": "SLURM_NODEID",
            "num_nodes": nodes_var,
        },
    )


_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _expand_tasks_per_node(text: str, name: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]`` (SLURM's compressed tasks-per-node format)."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            raise TopologyError(
                f"{name}={text!r} is not in SLURM's tasks-per-node format (like '2(x3),1')."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def expand_hostlist(text: str) -> list[str]:
    """Expand a SLURM host list such as ``"gpu[01-03,7],cpu-a[1-2]-x"`` into host names.

    Written here because ``scontrol show hostnames`` is not always installed on compute nodes.
    Zero padding is kept (``n[08-10]`` -> ``n08, n09, n10``); several bracket groups in one name
    expand to every combination.

    Raises:
        TopologyError: unbalanced brackets or a malformed range.
    """
    hosts: list[str] = []
    for name in _split_top_level(text):
        hosts.extend(_expand_one_host(name, text))
    return hosts


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise TopologyError(f"host list {text!r} has an unmatched ']'.")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise TopologyError(f"host list {text!r} has an unmatched '['.")
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def _expand_one_host(name: str, text: str) -> list[str]:
    start = name.find("[")
    if start < 0:
        return [name]
    end = name.index("]", start)
    prefix, body, rest = name[:start], name[start + 1 : end], name[end + 1 :]
    values: list[str] = []
    for piece in body.split(","):
        low, _, high = piece.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise TopologyError(f"host list {text!r} has a malformed range {piece!r}.")
        if not high:
            values.append(low)
            continue
        if int(high) < int(low):
            raise TopologyError(f"host list {text!r} has a decreasing range {piece!r}.")
        width = len(low)
        values.extend(str(i).zfill(width) for i in range(int(low), int(high) + 1))
    return [prefix + value + tail for value in values for tail in _expand_one_host(rest, text)]


# -- MPI ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _MpiFlavour:
    launcher: str
    rank: str
    size: str
    local_rank: str
    local_size: str


_MPI_FLAVOURS = (
    _MpiFlavour(
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    _MpiFlavour(
        "mvapich",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
    _MpiFlavour("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def _from_mpi(env: Mapping[str, str], flavour: _MpiFlavour) -> EnvReading:
    rank = _int(env, flavour.rank)
    world = _int(env, flavour.size, minimum=1)
    if rank is None or world is None:
        present = flavour.rank if rank is not None else flavour.size
        missing = flavour.size if rank is not None else flavour.rank
        raise TopologyError(
            f"{present}={env[present]!r} is set but {missing} is not; {flavour.launcher} sets "
            f"both for every process. HINT: start the job with mpirun, or unset {present}."
        )
    return _finish(
        launcher=flavour.launcher,
        rank=rank,
        world=world,
        local_rank=_int(env, flavour.local_rank),
        local_world=_int(env, flavour.local_size, minimum=1),
        node_rank=None,
        num_nodes=None,
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=_port(env),
        notes=[f"launcher {flavour.launcher}: {flavour.rank} and {flavour.size} are set"],
        blocks=False,
        sources={
            "rank": flavour.rank,
            "world_size": flavour.size,
            "local_rank": flavour.local_rank,
            "local_world_size": flavour.local_size,
            "node_rank": "(host names)",
            "num_nodes": "(host names)",
        },
    )


# -- writing -----------------------------------------------------------------------------------


def torch_variables(
    topology: Topology, master_addr: str | None, master_port: int | None
) -> dict[str, str]:
    """The torch-launcher variables that describe ``topology`` (for frameworks that read them)."""
    values = {
        "RANK": str(topology.rank),
        "WORLD_SIZE": str(topology.world_size),
        "LOCAL_RANK": str(topology.local_rank),
        "LOCAL_WORLD_SIZE": str(topology.local_world_size),
        "NODE_RANK": str(topology.node_rank),
        "GROUP_RANK": str(topology.node_rank),
    }
    if master_addr is not None:
        values["MASTER_ADDR"] = master_addr
    if master_port is not None:
        values["MASTER_PORT"] = str(master_port)
    return values


@contextlib.contextmanager
def patched(updates: Mapping[str, str], *, only_missing: bool = True) -> Iterator[dict[str, str]]:
    """Set variables for the duration of the block, then restore exactly those (nothing else).

    Args:
        updates: the variables to set.
        only_missing: leave variables that are already set alone.

    Yields:
        The variables that were actually set.
    """
    applied = {k: v for k, v in updates.items() if not (only_missing and k in os.environ)}
    previous = {k: os.environ.get(k) for k in applied}
    os.environ.update(applied)
    try:
        yield applied
    finally:
        restore(previous)


def is_set(name: str) -> bool:
    """Whether the variable ``name`` is set in this process."""
    return name in os.environ


def set_variables(updates: Mapping[str, str]) -> None:
    """Set variables for a framework that only reads the environment (undo with :func:`restore`)."""
    os.environ.update(updates)


def snapshot(names: tuple[str, ...]) -> dict[str, str | None]:
    """The current values of ``names`` (``None`` for unset), for :func:`restore`."""
    return {name: os.environ.get(name) for name in names}


def restore(previous: Mapping[str, str | None]) -> None:
    """Put back the values recorded by :func:`snapshot`."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
