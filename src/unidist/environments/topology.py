"""The values the environment is parsed into, and the checks every launcher's values pass.

:class:`Topology` is what users get; :class:`EnvReading` is what one launcher's variables say
(local values may be unknown until :func:`unidist.initialize` asks the other ranks).
:func:`finish` checks ranges and cross-field consistency and derives what the values imply; every
parser in :mod:`unidist.environments.variables` and :mod:`unidist.environments.schedulers`
ends with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from unidist.errors import TopologyError

__all__ = ["EnvReading", "Topology", "finish", "int_var", "port_var"]


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

    Attributes:
        launcher: what started the process (``"torchrun"``, ``"unidist"``, ``"slurm"``, an
            environment's name; ``"none"`` for one process).
        rank, world_size: this process's global rank and the number of processes.
        local_rank, local_world_size: its rank on its node and the processes on the node.
        node_rank, num_nodes: its node's index and the number of nodes.
        master_addr, master_port: where rank 0's store listens, when the launcher says.
        agent_store: whether the launcher's agent hosts the rendezvous store and the ranks
            share it (torchrun's ``TORCHELASTIC_USE_AGENT_STORE``); another launcher's
            environment leaves it False.
        notes: how each value was found, in order.
        sources: which variable gave each field, for error messages.
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

    def require(self, name: str) -> int:
        """The local field ``name`` (``local_rank``, ...), or :class:`TopologyError` if unknown."""
        value: int | None = getattr(self, name)
        if value is None:
            raise TopologyError(
                f"{name} is unknown: the {self.launcher!r} environment does not set it and "
                "unidist.initialize() has not worked it out yet. HINT: call unidist.initialize() "
                "on every rank first, or set LOCAL_RANK, LOCAL_WORLD_SIZE and NODE_RANK."
            )
        return value

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


def int_var(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
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


def port_var(env: Mapping[str, str]) -> int | None:
    port = int_var(env, "MASTER_PORT")
    if port is not None and not 0 < port < 65536:
        raise TopologyError(
            f"MASTER_PORT={env['MASTER_PORT']!r} is not a TCP port (1-65535). HINT: pick a free "
            "port, or unset it and let the launcher choose."
        )
    return port


def finish(
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
