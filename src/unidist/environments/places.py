"""Where a job can run: one small class per launcher or scheduler, asked in order.

An :class:`Environment` answers, from the variables alone (it imports no framework and never
communicates): whether this process runs under it (:meth:`~Environment.detect`), where the
process sits in the job (:meth:`~Environment.read`: its ranks, its node, the main address), and
whether something outside created every process (:attr:`~Environment.creates_processes`).
:func:`choose` asks them in order and the first that detects its variables reads them:

1. :class:`TorchVariables`: ``RANK``/``WORLD_SIZE``/... as torchrun, ``unidist launch``,
   Composer's launcher and Ignite's ``Parallel`` set them. First, because a torch launcher
   started inside an allocation (``srun torchrun ...``) sets them for its workers.
2. Third-party environments, from the entry-point group ``unidist.environments``, or
   :func:`register`\\ ed at run time (a scheduler unidist does not know).
3. :class:`Slurm` (an ``srun`` step), then :class:`Mpi` for OpenMPI, MVAPICH and MPICH/PMI.
4. :class:`SingleProcess`: nothing found, one process.

How ranks talk once they know where they are is the adapters' and the communicator's business
(:mod:`unidist.adapters`, :mod:`unidist.session.communicator`), not an environment's.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from unidist.environments.schedulers import (
    MPI_FLAVOURS,
    MpiFlavour,
    from_mpi,
    from_slurm,
    is_srun_step,
)
from unidist.environments.topology import EnvReading, finish, int_var, port_var
from unidist.errors import ConfigurationError, TopologyError

__all__ = [
    "BUILT_IN",
    "ENTRY_POINT_GROUP",
    "LAUNCHER_MARKER",
    "Environment",
    "Mpi",
    "SingleProcess",
    "Slurm",
    "TorchVariables",
    "choose",
    "environments",
    "register",
]

#: The entry-point group third-party environments register in.
ENTRY_POINT_GROUP = "unidist.environments"
#: Set by ``unidist launch`` and the test harness in every process they start.
LAUNCHER_MARKER = "UNIDIST_LAUNCHER"

_TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_NODE_VARS = ("NODE_RANK", "GROUP_RANK")


@runtime_checkable
class Environment(Protocol):
    """A place a job can run. Both methods read only the mapping they are given."""

    @property
    def name(self) -> str:
        """Short name, for messages and ``unidist config`` ("torch", "slurm", "mycluster")."""
        ...

    @property
    def creates_processes(self) -> bool:
        """True when something outside (a launcher, a scheduler) created every process."""
        ...

    def detect(self, env: Mapping[str, str]) -> bool:
        """Whether ``env`` holds this environment's variables (cheap; never raises for them)."""
        ...

    def read(self, env: Mapping[str, str]) -> EnvReading:
        """This process's place in the job, from ``env``: build it with
        :func:`unidist.environments.reading`, which checks it as unidist's own readings are.

        Raises:
            TopologyError: a value is not an integer, is out of range, or contradicts another.
        """
        ...


@dataclass(frozen=True)
class TorchVariables:
    """``RANK``, ``WORLD_SIZE``, ... (torchrun, unidist launch, Composer's and Ignite's)."""

    name: str = "torch"
    creates_processes: bool = True

    def detect(self, env: Mapping[str, str]) -> bool:
        return any(name in env for name in _TORCH_VARS)

    def read(self, env: Mapping[str, str]) -> EnvReading:
        launcher, why = _launcher_of_torch_variables(env)
        rank = int_var(env, "RANK")
        world = int_var(env, "WORLD_SIZE", minimum=1)
        local_rank = int_var(env, "LOCAL_RANK")
        local_world = int_var(env, "LOCAL_WORLD_SIZE", minimum=1)
        if world is None:
            given = [
                f"{n}={env[n]!r}" for n in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE") if n in env
            ]
            if local_rank is not None or local_world is not None or (rank or 0) > 0:
                raise TopologyError(
                    f"{', '.join(given)} is set but WORLD_SIZE is not, so the job size is "
                    "unknown. HINT: set WORLD_SIZE too (every torch launcher does), or unset "
                    f"{' and '.join(g.split('=')[0] for g in given)}."
                )
            world = 1
        if rank is None:
            if world > 1:
                raise TopologyError(
                    f"WORLD_SIZE={env['WORLD_SIZE']!r} is set but RANK is not, so this process "
                    "does not know which rank it is. HINT: set RANK for each process, or start "
                    "the job with torchrun or unidist launch."
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
        return finish(
            launcher=launcher,
            rank=rank,
            world=world,
            local_rank=local_rank,
            local_world=local_world,
            node_rank=node_rank[0],
            num_nodes=int_var(env, "GROUP_WORLD_SIZE", minimum=1),
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=port_var(env),
            notes=[f"launcher {launcher}: {why}"],
            sources=sources,
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("1", "true"),
        )


@dataclass(frozen=True)
class Slurm:
    """A task of an ``srun`` step (not the batch script, not an interactive shell)."""

    name: str = "slurm"
    creates_processes: bool = True

    def detect(self, env: Mapping[str, str]) -> bool:
        return is_srun_step(env)

    def read(self, env: Mapping[str, str]) -> EnvReading:
        return from_slurm(env)


@dataclass(frozen=True)
class Mpi:
    """A process started by ``mpirun``/``mpiexec`` of one MPI implementation."""

    flavour: MpiFlavour
    creates_processes: bool = True

    @property
    def name(self) -> str:
        return self.flavour.launcher

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.flavour.rank in env or self.flavour.size in env

    def read(self, env: Mapping[str, str]) -> EnvReading:
        return from_mpi(env, self.flavour)


@dataclass(frozen=True)
class SingleProcess:
    """Nothing found: one process (last in line, it detects every environment)."""

    name: str = "none"
    creates_processes: bool = False

    def detect(self, env: Mapping[str, str]) -> bool:
        return True

    def read(self, env: Mapping[str, str]) -> EnvReading:
        stray = [name for name in _NODE_VARS if name in env]
        if stray:
            values = ", ".join(f"{name}={env[name]!r}" for name in stray)
            raise TopologyError(
                f"{values} is set but WORLD_SIZE and RANK are not, so this process looks like a "
                "single process that was told it is on another node. HINT: unset "
                f"{' and '.join(stray)}, or start the job with a launcher that sets all of them."
            )
        notes = ["no launcher variables found: one process"]
        if "SLURM_JOB_ID" in env:
            notes.append(
                f"SLURM_JOB_ID={env['SLURM_JOB_ID']} is set but this is not an srun step, so it "
                "runs as one process; start one process per task with srun to use the allocation"
            )
        return EnvReading(notes=tuple(notes))


#: unidist's own environments (every chooser asks them).
BUILT_IN = (TorchVariables, Slurm, Mpi, SingleProcess)

_lock = threading.Lock()
_registered: list[Environment] = []
_from_entry_points: tuple[Environment, ...] | None = None


def register(environment: Environment) -> None:
    """Ask ``environment`` after the torch variables and before SLURM and MPI, from now on.

    Raises:
        ConfigurationError: it lacks ``name``, ``creates_processes``, ``detect`` or ``read``.
    """
    _check(environment, f"register({environment!r})")
    with _lock:
        _registered.append(environment)


def unregister(environment: Environment) -> None:
    """Stop asking an environment given to :func:`register` (tests)."""
    with _lock:
        _registered.remove(environment)


def environments() -> tuple[Environment, ...]:
    """Every environment, in the order :func:`choose` asks them."""
    with _lock:
        third_party = (*_entry_points(), *_registered)
    return (
        TorchVariables(),
        *third_party,
        Slurm(),
        *(Mpi(flavour) for flavour in MPI_FLAVOURS),
        SingleProcess(),
    )


def choose(env: Mapping[str, str]) -> Environment:
    """The first environment that detects its variables in ``env``."""
    first = TorchVariables()
    if first.detect(env):  # the usual case, before the entry points are scanned (~15 ms)
        return first
    for environment in environments()[1:]:
        if environment.detect(env):
            return environment
    raise AssertionError("SingleProcess detects every environment")  # pragma: no cover


def _entry_points() -> tuple[Environment, ...]:
    """Third-party environments, loaded once (called with the lock held)."""
    global _from_entry_points
    if _from_entry_points is None:
        import importlib.metadata  # lazily: it costs more than the rest of import unidist

        found = []
        for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            what = (
                f"the environment {point.name!r} ({point.value}, entry point group "
                f"{ENTRY_POINT_GROUP!r})"
            )
            try:
                loaded = point.load()
            except Exception as exc:
                raise ConfigurationError(
                    f"loading {what} failed: {type(exc).__name__}: {exc}. HINT: fix or "
                    "uninstall the package that provides it."
                ) from exc
            environment = loaded() if isinstance(loaded, type) else loaded
            _check(environment, what)
            found.append(environment)
        _from_entry_points = tuple(found)
    return _from_entry_points


def _check(environment: object, what: str) -> None:
    missing = [
        name
        for name in ("name", "creates_processes", "detect", "read")
        if not hasattr(environment, name)
    ]
    if missing:
        raise ConfigurationError(
            f"{what} is not an environment: it has no {', '.join(missing)}. HINT: see "
            "unidist.environments.Environment for what an environment provides."
        )


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


def _node_rank_from_torch_variables(env: Mapping[str, str]) -> tuple[int | None, str]:
    node = int_var(env, "NODE_RANK")
    group = int_var(env, "GROUP_RANK")
    if node is not None and group is not None and node != group:
        raise TopologyError(
            f"NODE_RANK={env['NODE_RANK']!r} and GROUP_RANK={env['GROUP_RANK']!r} disagree; both "
            "name this node's index. HINT: unset NODE_RANK (torchrun sets GROUP_RANK) or make "
            "them equal."
        )
    if node is not None:
        return node, "NODE_RANK"
    return group, "GROUP_RANK"
