"""Parallelism settings checked against the world size and the model, applied or handed on.

* :class:`ParallelismConfig` holds at most one data-parallel strategy (:class:`DDPConfig`,
  :class:`FSDPConfig` for FSDP v1, :class:`FSDP2Config`) plus :class:`TPConfig`; each strategy's
  settings live in :mod:`unidist.parallel.strategies`.
* :meth:`ParallelismConfig.validate` resolves the replicate / shard / tensor degrees (one may
  be -1) against the world size and checks the model; every error names the conflicting degree.
* :func:`apply` wraps a model for a plain loop (DDP, ``FullyShardedDataParallel``,
  ``fully_shard`` over a DeviceMesh, ``parallelize_module``); :meth:`ParallelismConfig.to_composer`
  builds Composer's ``ParallelismConfig`` for a Composer ``Trainer`` (through
  :mod:`unidist.integrations.composer`).

Importing this package imports no torch.
"""

from __future__ import annotations

from unidist.parallel._apply import apply
from unidist.parallel.config import ParallelismConfig
from unidist.parallel.strategies import (
    MESH_DIM_NAMES,
    DDPConfig,
    Degrees,
    FSDP2Config,
    FSDPConfig,
    TPConfig,
)

__all__ = [
    "DDPConfig",
    "Degrees",
    "FSDP2Config",
    "FSDPConfig",
    "MESH_DIM_NAMES",
    "ParallelismConfig",
    "TPConfig",
    "apply",
]
