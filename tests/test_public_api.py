"""The public surface is explicit: unidist.__all__ is sorted, complete and importable."""

from __future__ import annotations

import importlib
import inspect
import traceback
from pathlib import Path

import pytest

import unidist
from unidist._base.migration import POINTERS

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
    "unwrap_model",
    # samplers and data loading
    "DistributedSampler",
    "DistributedSamplerWrapper",
    "BatchSampler",
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


def test_each_lazy_name_is_its_modules_own_and_all_is_the_lazy_names_and_the_errors() -> None:
    # unidist/__init__.py lists each module's names to import them on first use; a list that
    # drifts from the module would hand out a different object, or none.
    for module, names in unidist._MODULES.items():
        owner = importlib.import_module(module)
        for name in names:
            assert name in getattr(owner, "__all__", [name]), (module, name)
            assert getattr(unidist, name) is getattr(owner, name), (module, name)
    errors = set(importlib.import_module("unidist.errors").__all__) & set(unidist.__all__)
    assert set(unidist.__all__) == {*unidist._LAZY, *errors, "__version__"}


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
        "collectives.groups",
        "collectives.sync",
        "session.lifecycle",
        "errors",
        "cli.diagnostics",
        "testing",
        "adapters",
        "session.devices",
        "parallel.models",
        "parallel",
        "parallel.config",
        "parallel.strategies",
        "samplers",
        "data",
        "environments",
        "resume",
        "data.streams",
        "microbatch",
        "logs",
        "testing.oom",
        "integrations.ignite",
        "integrations.composer",
    ):
        module = importlib.import_module(f"unidist.{name}")
        assert module.__all__ == sorted(module.__all__), name


@pytest.mark.parametrize(
    ("name", "pointer"),
    [
        ("Parallel", "unidist launch -n N script.py"),
        ("Parallel", "unidist.spawn(fn, *args, nproc=N)"),
        ("get_nproc_per_node", "unidist.get_local_world_size()"),
        ("get_nnodes", "unidist.get_num_nodes()"),
        ("hostname", "socket.gethostname()"),
        ("model_name", "unidist.current_adapter().name"),
        ("set_local_rank", "unidist.get_local_rank() reads it"),
        ("get_global_rank", "unidist.get_rank()"),
        ("broadcast_object_list", "unidist.broadcast_object(obj, src)"),
    ],
)
def test_ignite_and_composer_names_point_at_unidists(name: str, pointer: str) -> None:
    with pytest.raises(AttributeError) as info:
        getattr(unidist, name)
    assert pointer in str(info.value)
    assert info.value.name == name
    # Python's own guess ("Did you mean: 'parallel'?", the ParallelismConfig module) is not added.
    shown = "".join(traceback.format_exception_only(info.value))
    assert "Did you mean" not in shown, shown


def test_ignites_sync_points_at_initialize() -> None:
    with pytest.raises(
        AttributeError, match=r"no attribute 'sync' \(ignite\.distributed\.sync\)"
    ) as info:
        unidist.sync  # type: ignore[attr-defined]  # noqa: B018
    assert "call unidist.initialize() to adopt it" in str(info.value)


def test_pointers_never_shadow_a_real_name_and_unknown_names_still_fail() -> None:
    assert not set(POINTERS) & set(unidist.__all__)
    with pytest.raises(AttributeError, match=r"no attribute .nonsense.$"):
        unidist.nonsense  # noqa: B018


def test_adapters_print_their_name() -> None:
    assert repr(unidist.current_adapter()) == "<SerialAdapter 'serial'>"
    from unidist.adapters import registry

    assert repr(registry.get("torch")) == "<TorchAdapter 'torch'>"


def test_the_type_stub_gives_exactly_the_listed_names() -> None:
    """``__init__.pyi`` (what type checkers read) is generated from the package's one list of
    public names; a name added to the list and not to the stub, or the other way, fails here."""
    import ast

    stub = ast.parse((Path(unidist.__file__).parent / "__init__.pyi").read_text())
    imported = {
        (node.module, alias.name)
        for node in stub.body
        if isinstance(node, ast.ImportFrom) and node.module != "typing"
        for alias in node.names
        if alias.asname == alias.name  # re-exported
    }
    listed = {("unidist.errors", name) for name in unidist._ERRORS}
    listed |= {(module, name) for module, names in unidist._MODULES.items() for name in names}
    listed.add(("unidist._base.version", "__version__"))
    stub_all = next(
        ast.literal_eval(node.value)
        for node in stub.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__"
    )
    hint = "HINT: run .venv/bin/python scripts/init_stub.py"
    assert imported == listed, hint
    assert stub_all == unidist.__all__, hint
