"""unidist: one API for distributed PyTorch, whatever framework or launcher runs the script.

Importing unidist imports neither the frameworks nor torch itself and changes no environment
variable; everything starts on first use. Only the version and the error classes are imported
with the package: every other public name (``_MODULES``) and every submodule is imported on
first access, so a rank of ``unidist launch``, which imports ``unidist.launch.rank.bootstrap``,
pays for what it uses and no more.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from unidist._base.migration import missing as _missing
from unidist._base.version import __version__
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

#: module -> the public names it gives; each is imported on first access (see __getattr__).
_MODULES: dict[str, tuple[str, ...]] = {
    "unidist.environments.variables": ("Topology",),
    "unidist._microbatch.memory": ("is_oom",),
    "unidist.collectives": (
        "all_gather",
        "all_gather_object",
        "all_gather_uneven",
        "all_reduce",
        "broadcast",
        "broadcast_object",
    ),
    "unidist.data": ("StatefulDataLoader", "auto_dataloader", "gather_in_order"),
    "unidist.session.devices": ("available_backends", "default_backend", "device"),
    "unidist.cli.diagnostics": ("probe", "show_config"),
    "unidist.collectives.groups": ("Group", "new_group"),
    "unidist.launch.spawn": ("spawn",),
    "unidist.session.lifecycle": (
        "available_adapters",
        "backend",
        "current_adapter",
        "finalize",
        "initialize",
        "is_initialized",
        "use",
    ),
    "unidist.logs": ("progress", "setup_logging"),
    "unidist.microbatch": ("MicroBatcher", "SizePolicy"),
    "unidist.parallel.models": ("auto_model", "auto_optim", "unwrap_model"),
    "unidist.parallel": ("DDPConfig", "FSDP2Config", "FSDPConfig", "ParallelismConfig", "TPConfig"),
    "unidist.ranks": (
        "get_local_rank",
        "get_local_world_size",
        "get_node_rank",
        "get_num_nodes",
        "get_rank",
        "get_world_size",
        "is_main_process",
        "one_rank_first",
        "one_rank_only",
        "rank_zero_only",
        "topology",
    ),
    "unidist.resume": ("ResumableState",),
    "unidist.samplers": (
        "BatchSampler",
        "DistributedSampler",
        "DistributedSamplerWrapper",
        "get_sampler",
    ),
    "unidist.data.streams": ("ShardedIterable", "shard_iterable"),
    "unidist.collectives.sync": ("barrier",),
}
#: Public name -> its module.
_LAZY: dict[str, str] = {name: module for module, names in _MODULES.items() for name in names}

if TYPE_CHECKING:  # let type checkers and IDEs see the lazy names
    from unidist._microbatch.memory import is_oom
    from unidist.cli.diagnostics import probe, show_config
    from unidist.collectives import (
        all_gather,
        all_gather_object,
        all_gather_uneven,
        all_reduce,
        broadcast,
        broadcast_object,
    )
    from unidist.collectives.groups import Group, new_group
    from unidist.collectives.sync import barrier
    from unidist.data import StatefulDataLoader, auto_dataloader, gather_in_order
    from unidist.data.streams import ShardedIterable, shard_iterable
    from unidist.environments.variables import Topology
    from unidist.launch.spawn import spawn
    from unidist.logs import progress, setup_logging
    from unidist.microbatch import MicroBatcher, SizePolicy
    from unidist.parallel import (
        DDPConfig,
        FSDP2Config,
        FSDPConfig,
        ParallelismConfig,
        TPConfig,
    )
    from unidist.parallel.models import auto_model, auto_optim, unwrap_model
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
    from unidist.resume import ResumableState
    from unidist.samplers import (
        BatchSampler,
        DistributedSampler,
        DistributedSamplerWrapper,
        get_sampler,
    )
    from unidist.session.devices import available_backends, default_backend, device
    from unidist.session.lifecycle import (
        available_adapters,
        backend,
        current_adapter,
        finalize,
        initialize,
        is_initialized,
        use,
    )

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
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("__") and importlib.util.find_spec(f"unidist.{name}") is not None:
        value = importlib.import_module(
            f"unidist.{name}"
        )  # unidist.collectives.sync, unidist.testing, ...
    else:  # Ignite's and Composer's names get a pointer to unidist's
        raise _missing(name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
