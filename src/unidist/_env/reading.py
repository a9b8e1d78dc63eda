"""Reading the environment: the launcher variables into one frozen :class:`EnvReading`.

:func:`read` recognises torchrun/torchelastic, ``unidist launch``, Composer's launcher, Ignite's
``Parallel``/``spawn`` (the torch variables), SLURM's ``srun`` and MPI
(:mod:`unidist._env.schedulers`); :func:`read_settings` parses unidist's own variables, and
:func:`timeout_seconds` every ``timeout=`` argument.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from unidist._checks import check_seconds
from unidist._env.schedulers import MPI_FLAVOURS, from_mpi, from_slurm, is_srun_step
from unidist._env.topology import EnvReading, finish, int_var, port_var
from unidist.errors import ConfigurationError, TopologyError

__all__ = [
    "LAUNCHER_MARKER",
    "PROGRESS",
    "Settings",
    "chosen",
    "progress_file",
    "read",
    "read_settings",
    "run_id",
    "storage_secrets",
    "timeout_seconds",
]

#: Set by ``unidist launch`` and the test harness in each rank: where it keeps its progress
#: record (see ``unidist._progress``).
PROGRESS = "UNIDIST_PROGRESS"

#: Set by ``unidist launch`` and the test harness in every process they start.
LAUNCHER_MARKER = "UNIDIST_LAUNCHER"

_TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_NODE_VARS = ("NODE_RANK", "GROUP_RANK")


@dataclass(frozen=True)
class Settings:
    """unidist's own variables: ``UNIDIST_ADAPTER``, ``UNIDIST_TIMEOUT``, ``UNIDIST_LAUNCHER``."""

    adapter: str | None = None
    timeout: float | None = None
    launcher: str | None = None
    #: ``UNIDIST_TESTING_PRELOAD``: modules the test harness's fork server imports.
    testing_preload: tuple[str, ...] | None = None
    #: ``UNIDIST_HANG_TIMEOUT``: ``unidist launch``'s ``--hang-timeout`` (parsed by the launcher).
    hang_timeout: str | None = None


def read(environ: Mapping[str, str] | None = None) -> EnvReading:
    """Parse the launcher variables of ``environ`` (default: this process's environment).

    Raises:
        TopologyError: a value is not an integer, is out of range, or contradicts another.
    """
    env = os.environ if environ is None else environ
    if any(name in env for name in _TORCH_VARS):
        return _from_torch_variables(env)
    if is_srun_step(env):
        return from_slurm(env)
    for flavour in MPI_FLAVOURS:
        if flavour.rank in env or flavour.size in env:
            return from_mpi(env, flavour)
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


def chosen(names: tuple[str, ...], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables among ``names`` that are set (name -> value), for checks of other tools'
    variables (torch's agent reads its ``TORCHELASTIC_`` ones itself)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in names if name in env}


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
    preload = env.get("UNIDIST_TESTING_PRELOAD")
    return Settings(
        adapter=env.get("UNIDIST_ADAPTER") or None,
        timeout=timeout,
        launcher=env.get(LAUNCHER_MARKER) or None,
        testing_preload=None
        if preload is None
        else tuple(name.strip() for name in preload.split(",") if name.strip()),
        hang_timeout=env.get("UNIDIST_HANG_TIMEOUT") or None,
    )


def progress_file(environ: Mapping[str, str] | None = None) -> str | None:
    """Where this rank keeps its progress record (``UNIDIST_PROGRESS``), if its launcher asked."""
    env = os.environ if environ is None else environ
    return env.get(PROGRESS) or None


#: Variables whose values are credentials for object stores: never shown in a message.
_SECRETS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
)


def storage_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The object-store credentials set in the environment (to keep out of every message)."""
    env = os.environ if environ is None else environ
    return [env[name] for name in _SECRETS if env.get(name)]


def run_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The elastic run's id (``TORCHELASTIC_RUN_ID``), the same in every restart of the run.

    torchrun and ``unidist launch`` set it from ``--rdzv-id`` (or a fresh one per launch); None
    outside torch's elastic agent.
    """
    env = os.environ if environ is None else environ
    return env.get("TORCHELASTIC_RUN_ID") or None


def timeout_seconds(timeout: float | timedelta, name: str = "timeout") -> float:
    """Seconds in a ``timeout=`` argument: a positive number of seconds or a timedelta.

    The one converter for every ``timeout=`` unidist takes (``UNIDIST_TIMEOUT`` is read above);
    the check itself is :func:`unidist._checks.check_seconds`.

    Args:
        timeout: the value given.
        name: the keyword it was given as, for the message (``stop_timeout``, say).

    Raises:
        ConfigurationError: zero, a negative or infinite value, or not a number.
    """
    return check_seconds(timeout, name)


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
    rank = int_var(env, "RANK")
    world = int_var(env, "WORLD_SIZE", minimum=1)
    local_rank = int_var(env, "LOCAL_RANK")
    local_world = int_var(env, "LOCAL_WORLD_SIZE", minimum=1)
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
