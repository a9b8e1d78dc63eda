"""The only package that reads (or writes) environment variables, and parses unidist's settings.

:func:`read` turns the variables of whatever started this process into one frozen
:class:`EnvReading`: torchrun/torchelastic, ``unidist launch``, Composer's launcher, Ignite's
``Parallel``/``spawn`` (which set the torch variables), SLURM's ``srun``, OpenMPI, MPICH/Intel MPI
(PMI) and MVAPICH, or nothing at all (one process). Malformed or contradictory values raise
:class:`~unidist.errors.TopologyError` naming the variables. Nothing here runs at import time.

Precedence: the torch variables (``RANK``/``WORLD_SIZE``/...) win over SLURM and MPI, because a
torch launcher started inside an allocation (``srun torchrun ...``) sets them for its workers.

:mod:`unidist.environments.parse` parses (:func:`read`, :func:`read_settings`,
:func:`timeout_seconds`); :mod:`unidist.environments.process` writes (:func:`patched`,
:func:`restore`, ...); :mod:`unidist.environments.topology` holds the values (:class:`Topology`,
:class:`EnvReading`) and the checks every launcher's values pass;
:mod:`unidist.environments.schedulers` parses SLURM's and MPI's variables. Only this package
touches ``os.environ`` (ruff's banned-API rule enforces it).
"""

from __future__ import annotations

from unidist.environments.parse import (
    HANG_PAGE,
    LAUNCHER_MARKER,
    OwnSettings,
    chosen,
    hang_page_file,
    read,
    read_settings,
    run_id,
    storage_secrets,
    timeout_seconds,
)
from unidist.environments.process import (
    environ_copy,
    is_set,
    patched,
    rendezvous_store_shared,
    replace_all,
    restore,
    set_variables,
    snapshot,
)
from unidist.environments.schedulers import expand_hostlist
from unidist.environments.topology import EnvReading, Topology

__all__ = [
    "EnvReading",
    "LAUNCHER_MARKER",
    "HANG_PAGE",
    "OwnSettings",
    "Topology",
    "chosen",
    "environ_copy",
    "expand_hostlist",
    "is_set",
    "rendezvous_store_shared",
    "patched",
    "hang_page_file",
    "read",
    "read_settings",
    "replace_all",
    "restore",
    "run_id",
    "set_variables",
    "snapshot",
    "storage_secrets",
    "timeout_seconds",
]
