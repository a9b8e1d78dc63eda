"""unidist: one API for distributed PyTorch, whatever framework or launcher runs the script.

Importing unidist imports neither torch's frameworks nor torch itself and changes no
environment variable; everything starts on first use.
"""

from __future__ import annotations

from unidist._env import Topology
from unidist._version import __version__
from unidist.collectives import (
    Group,
    all_gather,
    all_gather_object,
    all_gather_uneven,
    all_reduce,
    barrier,
    broadcast,
    broadcast_object,
    new_group,
)
from unidist.config import show_config
from unidist.errors import (
    AdapterNotFoundError,
    AdapterUnavailableError,
    ConfigurationError,
    DistributedTimeoutError,
    NotInitializedError,
    RemoteError,
    TopologyError,
    UnidistError,
)
from unidist.lifecycle import (
    available_adapters,
    available_backends,
    backend,
    current_adapter,
    finalize,
    initialize,
    is_initialized,
    use,
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

__all__ = [
    "AdapterNotFoundError",
    "AdapterUnavailableError",
    "ConfigurationError",
    "DistributedTimeoutError",
    "Group",
    "NotInitializedError",
    "RemoteError",
    "Topology",
    "TopologyError",
    "UnidistError",
    "__version__",
    "all_gather",
    "all_gather_object",
    "all_gather_uneven",
    "all_reduce",
    "available_adapters",
    "available_backends",
    "backend",
    "barrier",
    "broadcast",
    "broadcast_object",
    "current_adapter",
    "finalize",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_num_nodes",
    "get_rank",
    "get_world_size",
    "initialize",
    "is_initialized",
    "is_main_process",
    "new_group",
    "one_rank_first",
    "one_rank_only",
    "rank_zero_only",
    "show_config",
    "topology",
    "use",
]
