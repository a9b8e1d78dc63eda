"""Ignite's ``idist`` behaviours that unidist keeps under the same name, or refuses loudly.

The yardstick is Ignite's own ``tests/ignite/distributed`` (see docs/migration/ignite.md);
these are our tests of the same behaviours, checked against the installed Ignite where it
can run in this process.
"""

from __future__ import annotations

import inspect
import re
import socket
import warnings
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset, SequentialSampler, WeightedRandomSampler

import unidist
from unidist import ConfigurationError, auto_dataloader
from unidist.adapters import torch as torch_adapter
from unidist.session import state as _state
from unidist.testing import run_distributed


@pytest.fixture
def rank_zero_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process looks like rank 0 of a 2-rank job (no process group is needed here)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _state.reset()


class Stream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(6))


def _batches(loader: Any) -> list[list[int]]:
    return [[int(i) for i in batch] for batch in loader]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- auto_dataloader ---------------------------------------------------------------------------


def test_no_batch_size_means_one_sample_per_rank_as_in_dataloader_and_ignite() -> None:
    loader = auto_dataloader(range(4), shuffle=False, num_workers=0)
    assert loader.batch_size == 1
    assert _batches(loader) == [[0], [1], [2], [3]]


@pytest.mark.usefixtures("rank_zero_of_two")
def test_a_batch_sampler_is_used_as_given_with_ignites_warning() -> None:
    batches = BatchSampler(SequentialSampler(range(5)), batch_size=2, drop_last=False)
    with pytest.warns(UserWarning, match="Found batch_sampler in provided kwargs"):
        loader = auto_dataloader(range(5), batch_sampler=batches, num_workers=0)
    assert loader.batch_sampler is batches
    assert _batches(loader) == [[0, 1], [2, 3], [4]]


def test_a_batch_sampler_in_one_process_gives_no_warning() -> None:
    batches = BatchSampler(SequentialSampler(range(3)), batch_size=2, drop_last=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = auto_dataloader(range(3), batch_sampler=batches, num_workers=0)
    assert _batches(loader) == [[0, 1], [2]]


@pytest.mark.parametrize(
    "extra",
    [
        {"per_rank_batch_size": 2},
        {"global_batch_size": 2},
        {"shuffle": True},
        {"drop_last": True},
        {"sampler": [0, 1]},
    ],
)
def test_a_batch_sampler_with_batch_settings_is_refused(extra: dict[str, Any]) -> None:
    batches = BatchSampler(SequentialSampler(range(3)), batch_size=2, drop_last=False)
    with pytest.raises(ConfigurationError, match="the batch sampler decides the batches"):
        auto_dataloader(range(3), batch_sampler=batches, **extra)


@pytest.mark.usefixtures("rank_zero_of_two")
def test_shuffle_false_beside_a_sampler_is_accepted_as_by_dataloader() -> None:
    sampler = WeightedRandomSampler(torch.ones(8), 8)
    loader = auto_dataloader(range(8), sampler=sampler, shuffle=False, num_workers=0)
    assert isinstance(loader.sampler, unidist.DistributedSamplerWrapper)
    mine = torch.utils.data.DistributedSampler(range(8), num_replicas=2, rank=0)
    assert auto_dataloader(range(8), sampler=mine, shuffle=False).sampler is mine


@pytest.mark.usefixtures("rank_zero_of_two")
def test_an_unsharded_stream_on_several_ranks_is_read_whole_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="Found iterable dataset"):
        loader = auto_dataloader(Stream(), per_rank_batch_size=3, shuffle=False, num_workers=0)
    assert _batches(loader) == [[0, 1, 2], [3, 4, 5]]  # every rank reads all of it, as in Ignite


@pytest.mark.usefixtures("rank_zero_of_two")
def test_a_global_batch_below_the_world_size_names_ignites_result() -> None:
    with pytest.raises(ConfigurationError) as caught:
        auto_dataloader(range(8), global_batch_size=1)
    message = str(caught.value)
    assert "Ignite's batch_size=1 would give 1 per rank, a global batch of 2" in message
    assert "per_rank_batch_size=1 for Ignite's result" in message


def _ignite_and_ours(**kw: Any) -> tuple[list[list[int]], list[list[int]]]:
    """Batches of Ignite's auto_dataloader and of ours with native='ignite', same seed."""
    from ignite.distributed import auto_dataloader as ignite_loader

    dataset = list(range(12))
    sampler = kw.pop("sampler", None)
    extra = {"sampler": sampler} if sampler is not None else {}
    torch.manual_seed(5)
    theirs = _batches(ignite_loader(dataset, batch_size=4, **extra, **kw))
    torch.manual_seed(5)
    ours = _batches(
        auto_dataloader(
            dataset, per_rank_batch_size=4, native="ignite", num_workers=0, **extra, **kw
        )
    )
    return theirs, ours


@pytest.mark.ignite
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"shuffle": True},
        {"shuffle": False},
        {"sampler": WeightedRandomSampler(torch.ones(12), 12)},
    ],
    ids=["default", "shuffle", "no-shuffle", "sampler"],
)
def test_native_ignite_in_one_process_is_ignites_loader_batch_for_batch(
    kw: dict[str, Any],
) -> None:
    theirs, ours = _ignite_and_ours(**kw)
    assert ours == theirs


def test_the_default_in_one_process_shuffles_with_the_seeded_sampler() -> None:
    loader = auto_dataloader(range(12), per_rank_batch_size=4, num_workers=0, seed=3)
    assert isinstance(loader.sampler, unidist.DistributedSampler)
    assert loader.sampler.shuffle
    assert sorted(i for batch in _batches(loader) for i in batch) == list(range(12))


# -- collectives and groups --------------------------------------------------------------------


def test_all_reduce_of_a_string_is_a_type_error_as_in_ignite() -> None:
    with pytest.raises(TypeError, match="takes a tensor or a Python number, got str 'abc'"):
        unidist.all_reduce("abc")  # type: ignore[type-var]


@pytest.mark.parametrize(
    "call",
    [
        lambda: unidist.get_rank(group="abc"),  # type: ignore[arg-type]
        lambda: unidist.get_world_size(group="abc"),  # type: ignore[arg-type]
        lambda: unidist.all_reduce(torch.ones(1), group="abc"),  # type: ignore[arg-type]
        lambda: unidist.all_gather(torch.ones(1), group="abc"),  # type: ignore[arg-type]
    ],
    ids=["get_rank", "get_world_size", "all_reduce", "all_gather"],
)
def test_a_group_that_is_not_a_group_is_a_value_error_naming_the_fix(call: Any) -> None:
    with pytest.raises(ValueError, match=r"takes a unidist.Group, got str 'abc'.*new_group"):
        call()


def test_new_group_of_a_number_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"ranks=1\) needs a list .* new_group\(\[1\]\)"):
        unidist.new_group(1)  # type: ignore[arg-type]


def outsiders_get_their_own_value() -> dict[str, Any]:
    group = unidist.new_group([1])
    t = torch.tensor([unidist.get_rank() + 10])
    return {
        "all_gather": [x.tolist() for x in unidist.all_gather(t, group=group)],
        "all_gather_uneven": [x.tolist() for x in unidist.all_gather_uneven(t, group=group)],
        "all_gather_object": unidist.all_gather_object(unidist.get_rank(), group=group),
        "all_reduce": unidist.all_reduce(t.clone(), group=group).tolist(),
        "all_reduce_number": unidist.all_reduce(7, group=group),
    }


@pytest.mark.multiprocess
def test_ranks_outside_a_group_get_their_own_value_as_in_ignite() -> None:
    outside, inside = run_distributed(outsiders_get_their_own_value)
    assert outside == {
        "all_gather": [[10]],
        "all_gather_uneven": [[10]],
        "all_gather_object": [0],
        "all_reduce": [10],
        "all_reduce_number": 7,
    }
    assert inside == {
        "all_gather": [[11]],
        "all_gather_uneven": [[11]],
        "all_gather_object": [1],
        "all_reduce": [11],
        "all_reduce_number": 7,
    }


# -- ranks under a process group started by plain torch --------------------------------------


def local_values_under_plain_torch() -> tuple[int, int, int, int]:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    try:
        values = (
            unidist.get_local_world_size(),
            unidist.get_num_nodes(),
            unidist.get_local_rank(),
            unidist.get_node_rank(),
        )
        # The getters do not communicate after the adoption: without this, rank 0 could
        # leave before rank 1 has finished joining the session it adopted.
        unidist.barrier()
        return values
    finally:
        unidist.finalize()
        dist.destroy_process_group()


@pytest.mark.multiprocess
def test_local_getters_adopt_a_group_started_by_plain_torch() -> None:
    # No LOCAL_* or NODE_RANK: the group says rank and world size only, as under Ignite's tests.
    hidden = {"LOCAL_RANK": None, "LOCAL_WORLD_SIZE": None, "NODE_RANK": None}
    env = {**hidden, "UNIDIST_TIMEOUT": "20"}  # a stuck adoption fails inside the test's time
    results = run_distributed(local_values_under_plain_torch, init=False, env=env)
    assert results == [(2, 1, 0, 0), (2, 1, 1, 0)]


def local_first_under_plain_torch() -> list[int]:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    try:
        with unidist.one_rank_first(local=True):
            order = unidist.get_rank()
        return unidist.all_gather_object(order)
    finally:
        unidist.finalize()
        dist.destroy_process_group()


@pytest.mark.multiprocess
def test_one_rank_first_local_adopts_a_group_started_by_plain_torch() -> None:
    hidden = {"LOCAL_RANK": None, "LOCAL_WORLD_SIZE": None, "NODE_RANK": None}
    results = run_distributed(local_first_under_plain_torch, init=False, env=hidden)
    assert results == [[0, 1], [0, 1]]


# -- initialize without MASTER_ADDR/MASTER_PORT ----------------------------------------------


@pytest.mark.ignite
def test_the_default_rendezvous_address_is_ignites() -> None:
    from ignite.distributed.comp_models.native import _NativeDistModel

    source = inspect.getsource(_NativeDistModel.setup_env_vars)
    port = re.search(r'"MASTER_PORT", "(\d+)"', source)
    addr = re.search(r'"MASTER_ADDR", "([^"]+)"', source)
    assert port is not None, source
    assert addr is not None, source
    assert int(port.group(1)) == torch_adapter.DEFAULT_MASTER_PORT
    assert addr.group(1) == torch_adapter.DEFAULT_MASTER_ADDR


def initialize_without_master_variables(port: int) -> tuple[int, str]:
    # Ignite's default port, 15000, may be taken on a shared machine: the test moves it.
    torch_adapter.DEFAULT_MASTER_PORT = port
    unidist.initialize("gloo", adapter="torch")
    try:
        return unidist.all_reduce(1), str(unidist.backend())
    finally:
        unidist.finalize()


@pytest.mark.multiprocess
def test_initialize_without_master_variables_meets_at_ignites_default_address() -> None:
    hidden = {"MASTER_ADDR": None, "MASTER_PORT": None}
    results = run_distributed(
        initialize_without_master_variables, _free_port(), init=False, env=hidden
    )
    assert results == [(2, "gloo"), (2, "gloo")]


# -- spawn -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keyword", "spelling"),
    [
        ("nproc_per_node", "use nproc=N"),
        ("master_port", "unidist launch --nnodes N --node-rank R --master-addr HOST"),
        ("master_addr", "picks a free loopback port itself"),
        ("nnodes", "unidist launch --nnodes N"),
        ("node_rank", "--node-rank R"),
        ("init_method", "unidist launch"),
        ("kwargs_dict", "functools.partial(fn, **kwargs_dict)"),
        ("args", "unidist.spawn(fn, *args, nproc=N)"),
        ("join", "always waits for every rank"),
        ("daemon", "always waits for every rank"),
        ("start_method", "always waits for every rank"),
    ],
)
def test_spawn_refuses_ignites_keywords_naming_unidists_spelling(
    keyword: str, spelling: str
) -> None:
    with pytest.raises(TypeError) as caught:
        unidist.spawn(print, **{keyword: 2})
    message = str(caught.value)
    assert f"unidist.spawn() takes no keyword {keyword}=" in message
    assert spelling in message


@pytest.mark.ignite
def test_every_keyword_of_ignites_spawn_and_parallel_has_a_verdict() -> None:
    from ignite.distributed import Parallel
    from ignite.distributed.comp_models.native import _NativeDistModel

    theirs = set()
    for fn in (unidist_ignite_spawn(), _NativeDistModel.spawn, Parallel.__init__):
        theirs |= {
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind is not p.VAR_KEYWORD and p.name not in ("self", "fn")
        }
    # Their kwargs that start_processes and init_process_group read.
    theirs |= {"join", "daemon", "start_method", "timeout"}
    from unidist.launch.spawn import IGNITE_SPAWN_KEYWORDS

    ours = set(inspect.signature(unidist.spawn).parameters)
    same_meaning = {"backend", "timeout"}  # ours too: the backend; the ranks' timeout
    assert theirs - same_meaning == set(IGNITE_SPAWN_KEYWORDS)
    assert same_meaning <= ours


def unidist_ignite_spawn() -> Any:
    from ignite.distributed import spawn

    return spawn


def test_spawn_refuses_ignites_call_shape_before_starting_anything() -> None:
    with pytest.raises(ConfigurationError, match=r"Ignite's call shape.*unidist.spawn\(print"):
        unidist.spawn("gloo", print, (1,))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="must be the function to run, got int"):
        unidist.spawn(3)  # type: ignore[arg-type]


# -- one_rank_first: the argument before the topology -----------------------------------------


@pytest.mark.parametrize(("rank", "local"), [(100, False), (-1, False), (-1, True), ("0", False)])
def test_one_rank_first_names_a_bad_rank_before_reading_the_topology(
    monkeypatch: pytest.MonkeyPatch, rank: Any, local: bool
) -> None:
    # Rank 0 of 2 by the launcher's variables, without the local ones and without a process
    # group: the topology cannot be completed here, but a bad rank is named first (Ignite
    # checks the argument first too, with a ValueError).
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _state.reset()
    with (
        pytest.raises(ValueError, match=rf"rank={rank!r} is not"),
        unidist.one_rank_first(rank=rank, local=local),
    ):
        pass
