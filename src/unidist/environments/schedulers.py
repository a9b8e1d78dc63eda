"""Parsers for the variables of schedulers and MPI launchers: SLURM, OpenMPI, MPICH, MVAPICH.

They take the environment as a mapping (reading it is :mod:`unidist.environments.variables`'s
job) and return an :class:`~unidist.environments.topology.EnvReading`. SLURM host lists are
expanded here because ``scontrol show hostnames`` is not always installed on compute nodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from unidist.environments.topology import EnvReading, finish, int_var, port_var
from unidist.errors import TopologyError

__all__ = [
    "MPI_FLAVOURS",
    "MpiFlavour",
    "expand_hostlist",
    "from_mpi",
    "from_slurm",
    "is_srun_step",
]


def is_srun_step(env: Mapping[str, str]) -> bool:
    if "SLURM_PROCID" not in env:
        return False
    if "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:
        return False  # the batch script itself, not a task started by srun
    # `srun --pty bash` for an interactive shell: the shell is not one of N training tasks.
    return env.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def from_slurm(env: Mapping[str, str]) -> EnvReading:
    world_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    nodes_var = next(
        (v for v in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") if v in env),
        "SLURM_NNODES",
    )
    rank = int_var(env, "SLURM_PROCID")
    world = int_var(env, world_var, minimum=1)
    if rank is None or world is None:
        raise TopologyError(
            f"SLURM_PROCID={env.get('SLURM_PROCID')!r} and {world_var}={env.get(world_var)!r}: "
            "an srun step must set both. HINT: start the job with srun --ntasks=N."
        )
    node_rank = int_var(env, "SLURM_NODEID")
    num_nodes = int_var(env, nodes_var, minimum=1)
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
    master_port = port_var(env)
    if master_port is None and "SLURM_JOB_ID" in env:
        job = int_var(env, "SLURM_JOB_ID") or 0
        master_port = 15000 + job % 10000
        notes.append(f"master_port derived from SLURM_JOB_ID: 15000 + {job} % 10000")
    return finish(
        launcher="slurm",
        rank=rank,
        world=world,
        local_rank=int_var(env, "SLURM_LOCALID"),
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
class MpiFlavour:
    launcher: str
    rank: str
    size: str
    local_rank: str
    local_size: str


MPI_FLAVOURS = (
    MpiFlavour(
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    MpiFlavour(
        "mvapich",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
    MpiFlavour("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def from_mpi(env: Mapping[str, str], flavour: MpiFlavour) -> EnvReading:
    rank = int_var(env, flavour.rank)
    world = int_var(env, flavour.size, minimum=1)
    if rank is None or world is None:
        present = flavour.rank if rank is not None else flavour.size
        missing = flavour.size if rank is not None else flavour.rank
        raise TopologyError(
            f"{present}={env[present]!r} is set but {missing} is not; {flavour.launcher} sets "
            f"both for every process. HINT: start the job with mpirun, or unset {present}."
        )
    return finish(
        launcher=flavour.launcher,
        rank=rank,
        world=world,
        local_rank=int_var(env, flavour.local_rank),
        local_world=int_var(env, flavour.local_size, minimum=1),
        node_rank=None,
        num_nodes=None,
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=port_var(env),
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
