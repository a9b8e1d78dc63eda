"""unidist: one API for distributed PyTorch, whatever framework or launcher runs the script.

Importing unidist imports neither the frameworks nor torch itself and changes no environment
variable; everything starts on first use. Only the version and the error classes are imported
with the package; every other public name is imported on first access, so a rank of
``unidist launch``, which imports ``unidist.launch.rank.bootstrap``, pays for what it uses and
no more.

The public names are listed once, as the imports below (``name as name``: what type checkers
read as this package's exports). The lazy ones sit under ``if TYPE_CHECKING:``; at import,
:func:`_exports` reads that block from this file to know which module gives each name.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from unidist._base.migration import missing as _missing
from unidist._base.version import __version__ as __version__
from unidist.errors import (
    AdapterNotFoundError as AdapterNotFoundError,
    AdapterUnavailableError as AdapterUnavailableError,
    CheckpointError as CheckpointError,
    ConfigurationError as ConfigurationError,
    DeviceUnavailableError as DeviceUnavailableError,
    DistributedTimeoutError as DistributedTimeoutError,
    LaunchError as LaunchError,
    MicrobatchOOMError as MicrobatchOOMError,
    NotInitializedError as NotInitializedError,
    RemoteError as RemoteError,
    TopologyError as TopologyError,
    UnidistError as UnidistError,
)

if TYPE_CHECKING:  # the lazy names, imported on first access (see __getattr__)
    from unidist._microbatch.memory import is_oom as is_oom
    from unidist.cli.diagnostics import probe as probe, show_config as show_config
    from unidist.collectives import (
        all_gather as all_gather,
        all_gather_object as all_gather_object,
        all_gather_uneven as all_gather_uneven,
        all_reduce as all_reduce,
        broadcast as broadcast,
        broadcast_object as broadcast_object,
    )
    from unidist.collectives.groups import Group as Group, new_group as new_group
    from unidist.collectives.sync import barrier as barrier
    from unidist.data import (
        StatefulDataLoader as StatefulDataLoader,
        auto_dataloader as auto_dataloader,
        gather_in_order as gather_in_order,
    )
    from unidist.data.streams import (
        ShardedIterable as ShardedIterable,
        shard_iterable as shard_iterable,
    )
    from unidist.environments.variables import Topology as Topology
    from unidist.launch.spawn import spawn as spawn
    from unidist.logs import progress as progress, setup_logging as setup_logging
    from unidist.microbatch import MicroBatcher as MicroBatcher, SizePolicy as SizePolicy
    from unidist.parallel import (
        DDPConfig as DDPConfig,
        FSDP2Config as FSDP2Config,
        FSDPConfig as FSDPConfig,
        ParallelismConfig as ParallelismConfig,
        TPConfig as TPConfig,
    )
    from unidist.parallel.models import (
        auto_model as auto_model,
        auto_optim as auto_optim,
        unwrap_model as unwrap_model,
    )
    from unidist.ranks import (
        get_local_rank as get_local_rank,
        get_local_world_size as get_local_world_size,
        get_node_rank as get_node_rank,
        get_num_nodes as get_num_nodes,
        get_rank as get_rank,
        get_world_size as get_world_size,
        is_main_process as is_main_process,
        one_rank_first as one_rank_first,
        one_rank_only as one_rank_only,
        rank_zero_only as rank_zero_only,
        topology as topology,
    )
    from unidist.resume import ResumableState as ResumableState
    from unidist.samplers import (
        BatchSampler as BatchSampler,
        DistributedSampler as DistributedSampler,
        DistributedSamplerWrapper as DistributedSamplerWrapper,
        get_sampler as get_sampler,
    )
    from unidist.session.devices import (
        available_backends as available_backends,
        default_backend as default_backend,
        device as device,
    )
    from unidist.session.lifecycle import (
        available_adapters as available_adapters,
        backend as backend,
        current_adapter as current_adapter,
        finalize as finalize,
        initialize as initialize,
        is_initialized as is_initialized,
        use as use,
    )


def _exports() -> tuple[dict[str, str], list[str]]:
    """Each lazy name's module, and every public name: read from the imports of this file."""
    source = __spec__.loader.get_source(__name__)  # type: ignore[union-attr]
    lazy: dict[str, str] = {}
    public = ["__version__"]
    for node in ast.parse(source or "").body:
        lazily = isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for statement in node.body if lazily else [node]:  # type: ignore[attr-defined]
            if isinstance(statement, ast.ImportFrom) and statement.module is not None:
                for alias in statement.names:
                    if alias.asname == alias.name and not alias.name.startswith("_"):
                        public.append(alias.name)
                        if lazily:
                            lazy[alias.name] = statement.module
    return lazy, sorted(public)


#: Public name -> the module that gives it (imported on first access).
_LAZY, __all__ = _exports()
#: Module -> the public names it gives.
_MODULES: dict[str, tuple[str, ...]] = {}
for _name, _module in _LAZY.items():
    _MODULES[_module] = (*_MODULES.get(_module, ()), _name)
del _name, _module


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
