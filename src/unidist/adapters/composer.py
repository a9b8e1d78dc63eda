"""The MosaicML Composer adapter: delegates to ``composer.utils.dist``.

This file holds the adapter contract only. Turning unidist's device and parallelism settings into
Composer's objects is an integration: :mod:`unidist.integrations.composer`.

Quirks of Composer 0.32 that this adapter normalises, so it answers exactly like the others:

* ``get_node_rank`` raises ``MissingEnvironmentError`` under torchrun, which sets ``GROUP_RANK``
  but not ``NODE_RANK``. Before ``initialize_dist`` the adapter exports the torch variables
  that unidist has worked out and the launcher did not set (``NODE_RANK`` here, all of them under
  SLURM or MPI), and removes exactly those again at ``finalize``.
* ``all_gather`` sizes its output by the *global* world size even for a subgroup; for subgroups
  the adapter gathers with ``torch.distributed`` directly. Composer has no ``new_group``, so
  groups come from ``torch.distributed.new_group``.
* ``initialize_dist`` writes single-rank defaults into the environment; they are removed again at
  ``finalize``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from unidist.adapters._torchdist import gather, rank_zero_store_closes_first
from unidist.adapters.base import NamedAdapter
from unidist.environments import variables as _env
from unidist.environments.places import TorchVariables
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist.adapters.base import PrimitiveOp
    from unidist.environments.variables import EnvReading, Topology

__all__ = ["ComposerAdapter"]

#: Composer picks the process-group backend from a device name.
_DEVICE_FOR_BACKEND = {"gloo": "cpu", "nccl": "gpu", "hccl": "hpu", "xla": "tpu"}
_WRITTEN_BY_COMPOSER = ("NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK")


class ComposerAdapter(NamedAdapter):
    """Delegates to ``composer.utils.dist``."""

    name = "composer"
    #: ``composer -n`` sets the torch variables (``NODE_RANK``, ``LOCAL_WORLD_SIZE``, ...).
    environment = TorchVariables()

    def __init__(self) -> None:
        self._owns = False
        self._saved_env: dict[str, str | None] = {}
        self._env: EnvReading | None = None

    def detect(self, env: EnvReading) -> str | None:
        if env.launcher == "composer":
            return "started by Composer's launcher (composer -n)"
        return None

    def initialize(self, backend: str | None, *, timeout: timedelta, env: EnvReading) -> bool:
        import torch.distributed as tdist
        from composer.utils import dist

        if tdist.is_initialized():
            return False
        device = _DEVICE_FOR_BACKEND.get(backend or "")
        if device is None:
            choices = ", ".join(f"{b} (device {d!r})" for b, d in _DEVICE_FOR_BACKEND.items())
            raise ConfigurationError(
                f"the composer adapter cannot start backend {backend!r}: Composer derives the "
                f"backend from its device: {choices}. HINT: pick one of those backends, or use "
                "adapter='torch'."
            )
        self._env = env
        exports = _exports(env)
        self._saved_env = _env.snapshot((*_WRITTEN_BY_COMPOSER, *exports))
        _env.set_variables(exports)
        try:
            dist.initialize_dist(device, timeout=timeout.total_seconds())
        except BaseException:
            _env.restore(self._saved_env)
            raise
        self._owns = True
        return True

    def finalize(self) -> None:
        import torch.distributed as tdist

        if self._owns and tdist.is_initialized() and self._env is not None:
            from composer.utils import dist

            with rank_zero_store_closes_first(self._env, dist.barrier):
                tdist.destroy_process_group()
        if self._owns:
            _env.restore(self._saved_env)
        self._owns = False
        self._saved_env = {}

    def topology(self, env: Topology) -> Topology:
        from composer.utils import dist

        try:
            node_rank = dist.get_node_rank()
        except dist.MissingEnvironmentError:
            node_rank = env.node_rank  # torchrun: GROUP_RANK only (see module docstring)
        try:
            local_rank, local_world_size = dist.get_local_rank(), dist.get_local_world_size()
        except dist.MissingEnvironmentError:
            local_rank, local_world_size = env.local_rank, env.local_world_size
        return replace(
            env,
            rank=dist.get_global_rank(),
            world_size=dist.get_world_size(),
            local_rank=local_rank,
            local_world_size=local_world_size,
            node_rank=node_rank,
        )

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, group: Any) -> torch.Tensor:
        from composer.utils import dist

        dist.all_reduce(tensor, reduce_operation=op.upper(), group=group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        from composer.utils import dist

        if group is None:
            return list(dist.all_gather(tensor))
        # Composer sizes the output by the global world size, which is wrong for a subgroup.
        return gather(tensor, group)

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        from composer.utils import dist

        dist.broadcast(tensor, src=src, group=group)
        return tensor

    def barrier(self, group: Any) -> None:
        from composer.utils import dist

        dist.barrier(group=group)

    def new_group(self, ranks: Sequence[int]) -> Any:
        import torch.distributed as tdist

        return tdist.new_group(ranks=list(ranks))


def _exports(env: EnvReading) -> dict[str, str]:
    """The torch variables Composer reads that the launcher did not set."""
    known = {
        "RANK": env.rank,
        "WORLD_SIZE": env.world_size,
        "LOCAL_RANK": env.local_rank,
        "LOCAL_WORLD_SIZE": env.local_world_size,
        "NODE_RANK": env.node_rank,
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": env.master_port,
    }
    if env.world_size == 1:
        known = {"MASTER_ADDR": env.master_addr, "MASTER_PORT": env.master_port}
    return {
        name: str(value)
        for name, value in known.items()
        if value is not None and not _env.is_set(name)
    }
