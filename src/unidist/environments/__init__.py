"""Environments: where a job runs, for packages that teach unidist a new launcher or scheduler.

unidist knows torchrun, ``unidist launch``, Composer's launcher, Ignite's ``Parallel``, SLURM's
``srun`` and OpenMPI, MVAPICH and MPICH. A cluster that starts its processes with variables of its
own gets an :class:`Environment`: a small class that says whether this process runs under it and
reads its variables into an :class:`EnvReading` (build it with :func:`reading`, which checks it as
unidist's own are checked). Register it in your package's ``pyproject.toml``::

    [project.entry-points."unidist.environments"]
    mycluster = "my_package.env:MyCluster"

or at run time with :func:`register`. unidist asks it after the torch variables (a torch launcher
inside your allocation sets them for its workers) and before SLURM and MPI. Check it with
:func:`unidist.testing.check_environment`. How ranks then talk is an adapter's business
(:mod:`unidist.adapters`); an environment only says where the process stands.

Example::

    from unidist.environments import reading

    class MyCluster:
        name = "mycluster"
        creates_processes = True

        def detect(self, env):
            return "MYCLUSTER_TASK" in env

        def read(self, env):
            return reading(
                launcher="mycluster",
                rank=int(env["MYCLUSTER_TASK"]),
                world_size=int(env["MYCLUSTER_TASKS"]),
                master_addr=env.get("MYCLUSTER_HEAD"),
                sources={"rank": "MYCLUSTER_TASK", "world_size": "MYCLUSTER_TASKS"},
            )
"""

from __future__ import annotations

from collections.abc import Mapping

from unidist.environments.places import (
    ENTRY_POINT_GROUP,
    Environment,
    choose,
    environments,
    register,
    unregister,
)
from unidist.environments.topology import EnvReading, finish

__all__ = [
    "ENTRY_POINT_GROUP",
    "EnvReading",
    "Environment",
    "choose",
    "environments",
    "reading",
    "register",
    "unregister",
]


def reading(
    *,
    launcher: str,
    rank: int,
    world_size: int,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    node_rank: int | None = None,
    num_nodes: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    notes: tuple[str, ...] = (),
    sources: Mapping[str, str] | None = None,
    ranks_in_blocks: bool = True,
) -> EnvReading:
    """What an environment read, checked as unidist's own environments' readings are.

    Fields left ``None`` are unknown: :func:`unidist.initialize` works them out from the other
    ranks' host names. With ``ranks_in_blocks`` (each node holds a contiguous block of ranks, as
    torch launchers and most schedulers assign them) the node fields follow from
    ``local_world_size``.

    Args:
        launcher: the environment's name, as :func:`unidist.topology` reports it.
        sources: field -> the variable that gave it, for error messages.

    Raises:
        TopologyError: ranks out of range or contradicting each other (the message names the
            variables of ``sources``).
    """
    return finish(
        launcher=launcher,
        rank=rank,
        world=world_size,
        local_rank=local_rank,
        local_world=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=master_port,
        notes=[*notes] or [f"launcher {launcher}"],
        sources=dict(sources or {}),
        blocks=ranks_in_blocks,
    )
