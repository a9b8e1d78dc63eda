"""unidist: one API for distributed PyTorch, whatever framework or launcher runs the script.

Importing unidist imports neither the frameworks nor torch itself and changes no environment
variable; everything starts on first use. Only the version and the error classes are imported
with the package; every other public name is imported on first access, so a rank of
``unidist launch``, which imports ``unidist.launch.rank.bootstrap``, pays for what it uses and
no more.

The public names are listed once, here: :data:`_ERRORS` and :data:`_MODULES`. ``__init__.pyi``,
which type checkers read, is generated from them (``scripts/init_stub.py``; a test keeps it so).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from unidist import errors as _errors
from unidist._base.migration import missing as _missing
from unidist._base.version import __version__ as __version__

#: The error classes the package gives (imported with it).
_ERRORS = (
    "AdapterNotFoundError",
    "AdapterUnavailableError",
    "CheckpointError",
    "ConfigurationError",
    "DeviceUnavailableError",
    "DistributedTimeoutError",
    "LaunchError",
    "MicrobatchOOMError",
    "NotInitializedError",
    "RemoteError",
    "TopologyError",
    "UnidistError",
)
#: Module -> the public names it gives; each is imported on first access (see __getattr__).
_MODULES: dict[str, tuple[str, ...]] = {
    "unidist._microbatch.memory": ("is_oom",),
    "unidist.cli.diagnostics": ("probe", "show_config"),
    "unidist.collectives": (
        "all_gather",
        "all_gather_object",
        "all_gather_uneven",
        "all_reduce",
        "broadcast",
        "broadcast_object",
    ),
    "unidist.collectives.groups": ("Group", "new_group"),
    "unidist.collectives.sync": ("barrier",),
    "unidist.data": ("StatefulDataLoader", "auto_dataloader", "gather_in_order"),
    "unidist.data.streams": ("ShardedIterable", "shard_iterable"),
    "unidist.environments.topology": ("Topology",),
    "unidist.launch.spawn": ("spawn",),
    "unidist.logs": ("progress", "setup_logging"),
    "unidist.microbatch": ("MicroBatcher", "SizePolicy"),
    "unidist.parallel": ("DDPConfig", "FSDP2Config", "FSDPConfig", "ParallelismConfig", "TPConfig"),
    "unidist.parallel.models": ("auto_model", "auto_optim", "unwrap_model"),
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
    "unidist.session.devices": ("available_backends", "default_backend", "device"),
    "unidist.session.lifecycle": (
        "available_adapters",
        "backend",
        "current_adapter",
        "finalize",
        "initialize",
        "is_initialized",
        "use",
    ),
}
#: Public name -> its module.
_LAZY: dict[str, str] = {name: module for module, names in _MODULES.items() for name in names}

globals().update({name: getattr(_errors, name) for name in _ERRORS})
__all__ = sorted(("__version__", *_ERRORS, *_LAZY))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("__") and importlib.util.find_spec(f"unidist.{name}") is not None:
        value = importlib.import_module(f"unidist.{name}")  # unidist.testing, unidist.compat, ...
    else:  # Ignite's and Composer's names get a pointer to unidist's
        raise _missing(name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
