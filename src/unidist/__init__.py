"""unidist: one API for distributed PyTorch, whatever framework or launcher runs the script.

Importing unidist imports neither the frameworks nor torch itself and changes no environment
variable; everything starts on first use. Names whose module needs torch at import time (a
``torch.utils.data.Sampler`` subclass, say) or costs more than it should at every start (the
diagnostics, the launcher) are listed in ``_LAZY`` and imported on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from unidist._env import Topology
from unidist._microbatch.memory import is_oom
from unidist._migration import missing as _missing
from unidist._migration import point_calls as _point_calls
from unidist._version import __version__
from unidist.collectives import (
    all_gather,
    all_gather_object,
    all_gather_uneven,
    all_reduce,
    broadcast,
    broadcast_object,
)
from unidist.errors import (
    AdapterNotFoundError,
    AdapterUnavailableError,
    CheckpointError,
    ConfigurationError,
    DeviceUnavailableError,
    DistributedTimeoutError,
    LaunchError,
    MicrobatchOOMError,
    NotInitializedError,
    RemoteError,
    TopologyError,
    UnidistError,
)
from unidist.groups import Group, new_group
from unidist.lifecycle import (
    available_adapters,
    backend,
    current_adapter,
    finalize,
    initialize,
    is_initialized,
    use,
)
from unidist.logs import progress, setup_logging
from unidist.microbatch import MicroBatcher, SizePolicy
from unidist.parallel import (
    DDPConfig,
    FSDP2Config,
    FSDPConfig,
    ParallelismConfig,
    TPConfig,
)
from unidist.ranks import (
    get_local_rank,
    get_local_world_size,
    get_node_rank,
    get_num_nodes,
    get_rank,
    get_world_size,
    is_main_process,
    one_rank_first,
    one_rank_only,
    rank_zero_only,
    topology,
)
from unidist.sync import barrier

_point_calls(importlib.import_module("unidist.sync"))  # Ignite's idist.sync() is not a module

#: Public names whose module is imported on first access: name -> module.
_LAZY: dict[str, str] = {
    "DistributedSampler": "unidist.samplers",
    "DistributedSamplerWrapper": "unidist.samplers",
    "BatchSampler": "unidist.samplers",
    "ResumableState": "unidist.resume",
    "ShardedIterable": "unidist.streams",
    "StatefulDataLoader": "unidist.data",
    "auto_dataloader": "unidist.data",
    "auto_model": "unidist.models",
    "auto_optim": "unidist.models",
    "available_backends": "unidist.devices",
    "default_backend": "unidist.devices",
    "device": "unidist.devices",
    "gather_in_order": "unidist.data",
    "get_sampler": "unidist.samplers",
    "probe": "unidist.diagnostics",
    "shard_iterable": "unidist.streams",
    "show_config": "unidist.diagnostics",
    "spawn": "unidist.launch.spawn",
    "unwrap_model": "unidist.models",
}

if TYPE_CHECKING:  # let type checkers and IDEs see the lazy names
    from unidist.data import StatefulDataLoader, auto_dataloader, gather_in_order
    from unidist.devices import available_backends, default_backend, device
    from unidist.diagnostics import probe, show_config
    from unidist.launch.spawn import spawn
    from unidist.models import auto_model, auto_optim, unwrap_model
    from unidist.resume import ResumableState
    from unidist.samplers import (
        BatchSampler,
        DistributedSampler,
        DistributedSamplerWrapper,
        get_sampler,
    )
    from unidist.streams import ShardedIterable, shard_iterable

__all__ = [
    "AdapterNotFoundError",
    "AdapterUnavailableError",
    "BatchSampler",
    "CheckpointError",
    "ConfigurationError",
    "DDPConfig",
    "DeviceUnavailableError",
    "DistributedSampler",
    "DistributedSamplerWrapper",
    "DistributedTimeoutError",
    "FSDP2Config",
    "FSDPConfig",
    "Group",
    "LaunchError",
    "MicroBatcher",
    "MicrobatchOOMError",
    "NotInitializedError",
    "ParallelismConfig",
    "RemoteError",
    "ResumableState",
    "ShardedIterable",
    "SizePolicy",
    "StatefulDataLoader",
    "TPConfig",
    "Topology",
    "TopologyError",
    "UnidistError",
    "__version__",
    "all_gather",
    "all_gather_object",
    "all_gather_uneven",
    "all_reduce",
    "auto_dataloader",
    "auto_model",
    "auto_optim",
    "available_adapters",
    "available_backends",
    "backend",
    "barrier",
    "broadcast",
    "broadcast_object",
    "current_adapter",
    "default_backend",
    "device",
    "finalize",
    "gather_in_order",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_num_nodes",
    "get_rank",
    "get_sampler",
    "get_world_size",
    "initialize",
    "is_initialized",
    "is_main_process",
    "is_oom",
    "new_group",
    "one_rank_first",
    "one_rank_only",
    "probe",
    "progress",
    "rank_zero_only",
    "setup_logging",
    "shard_iterable",
    "show_config",
    "spawn",
    "topology",
    "unwrap_model",
    "use",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:  # Ignite's and Composer's names get a pointer to unidist's
        raise _missing(name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
