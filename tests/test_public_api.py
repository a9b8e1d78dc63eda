"""The public surface is explicit: unidist.__all__ is sorted, complete and importable."""

from __future__ import annotations

import importlib
import inspect

import unidist

EXPECTED = {
    # topology and ranks
    "Topology",
    "topology",
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_num_nodes",
    "is_main_process",
    # lifecycle
    "initialize",
    "finalize",
    "is_initialized",
    "backend",
    "available_backends",
    "available_adapters",
    "current_adapter",
    "use",
    "show_config",
    # collectives
    "Group",
    "all_reduce",
    "all_gather",
    "all_gather_uneven",
    "all_gather_object",
    "broadcast",
    "broadcast_object",
    "barrier",
    "new_group",
    # rank helpers
    "rank_zero_only",
    "one_rank_only",
    "one_rank_first",
    # devices, parallelism, model placement
    "device",
    "default_backend",
    "probe",
    "ParallelismConfig",
    "DDPConfig",
    "FSDPConfig",
    "FSDP2Config",
    "TPConfig",
    "auto_model",
    "auto_optim",
    # samplers and data loading
    "DistributedSampler",
    "DistributedSamplerWrapper",
    "get_sampler",
    "auto_dataloader",
    "StatefulDataLoader",
    "shard_iterable",
    "ShardedIterable",
    "gather_in_order",
    # microbatching
    "MicroBatcher",
    "SizePolicy",
    "is_oom",
    # errors
    "UnidistError",
    "ConfigurationError",
    "DeviceUnavailableError",
    "TopologyError",
    "AdapterNotFoundError",
    "AdapterUnavailableError",
    "LaunchError",
    "spawn",
    "NotInitializedError",
    "DistributedTimeoutError",
    "RemoteError",
    "MicrobatchOOMError",
    "__version__",
}


def test_all_is_sorted_and_complete() -> None:
    assert unidist.__all__ == sorted(unidist.__all__)
    assert set(unidist.__all__) >= EXPECTED, sorted(EXPECTED - set(unidist.__all__))


def test_every_public_name_resolves() -> None:
    for name in unidist.__all__:
        assert getattr(unidist, name) is not None, name


def test_no_undeclared_public_names() -> None:
    public = {n for n in vars(unidist) if not n.startswith("_")}
    modules = {n for n, v in vars(unidist).items() if inspect.ismodule(v)}
    assert public - modules - {"annotations", "importlib", "TYPE_CHECKING", "Any"} <= set(
        unidist.__all__
    )


def test_public_modules_declare_all() -> None:
    for name in (
        "ranks",
        "collectives",
        "groups",
        "sync",
        "lifecycle",
        "errors",
        "diagnostics",
        "testing",
        "adapters",
        "devices",
        "placement",
        "parallel",
        "parallel.config",
        "parallel.strategies",
        "samplers",
        "data",
        "streams",
        "microbatch",
        "testing.oom",
        "integrations.ignite",
        "integrations.composer",
    ):
        module = importlib.import_module(f"unidist.{name}")
        assert module.__all__ == sorted(module.__all__), name
