"""The same calls made through an owner's module and through unidist.compat's, rank by rank.

Each case is ``name -> fn(module, rank, workdir)``; its name starts with the function of the
migration page's row it checks (``all_reduce/float``), so tests/test_docs.py can check that
every row has one. :func:`outcome` turns a result or an error into plain data that two runs
can compare: values with their types, tensors with dtype and shape, errors by type.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)
from torch.utils.data.distributed import DistributedSampler

from unidist.data.workers import starting_workers

Case = Callable[[Any, int, str], Any]

#: Warnings of the owner's code on a newer torch, not behaviour to keep: Ignite 0.5.5 indexes
#: with a list in all_gather_tensors_with_shapes, which torch >= 2.8 warns about.
_IGNORED = ("Using a non-tuple sequence for multidimensional indexing",)


def plain(value: Any) -> Any:
    """``value`` as comparable data (types kept: 7 is not 7.0, a tensor's dtype counts)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.tolist())
    if isinstance(value, bool | int | float | str | type(None)):
        return (type(value).__name__, value)
    if isinstance(value, Path):
        return ("path", str(value))
    if isinstance(value, torch.device):
        return ("device", str(value))
    if isinstance(value, list | tuple):
        return (type(value).__name__, [plain(v) for v in value])
    if isinstance(value, dict):
        return ("dict", sorted((str(k), plain(v)) for k, v in value.items()))
    return ("object", type(value).__name__)


def outcome(case: Case, module: Any, rank: int, workdir: str, *, bases: bool = False) -> Any:
    """("ok", value, warnings raised) or ("error", exception type name); with ``bases``, the
    error's outcome also names every class of its type (``__mro__``), so that an error of
    unidist's that is also the owner's type can be told apart from another type."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = case(module, rank, workdir)
        except Exception as exc:  # the error is the outcome compared
            if bases:
                return ("error", type(exc).__name__, [t.__name__ for t in type(exc).__mro__])
            return ("error", type(exc).__name__)
    shown = [
        w for w in caught if w.category is UserWarning and not str(w.message).startswith(_IGNORED)
    ]
    return ("ok", plain(value), len(shown))


def batches(loader: DataLoader[Any]) -> list[list[int]]:
    """One pass's batches as lists of ints.

    An owner's plain DataLoader with workers is read under the watch unidist's loaders keep on
    the workers they fork: Ignite's loader forks one per rank here, beside gloo's threads just
    after a barrier, and such a worker can wait forever before its first line (CPython gh-112275,
    Python <= 3.11.9; once in 95 forks just after initialize). The watch starts it again with the
    same arguments and queues: the batches are the loader's own.
    """
    passes: Iterable[Any] = loader
    if type(loader) is DataLoader and loader.num_workers and not loader.persistent_workers:
        with starting_workers(loader) as started:  # as unidist.StatefulDataLoader makes its own
            passes = started(loader._get_iterator())
    return [[int(i) for i in batch] for batch in passes]


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(state)


class Stream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(5))


# -- Ignite ------------------------------------------------------------------------------------


def _first(m: Any, rank: int, local: bool) -> Any:
    with m.one_rank_first(rank=rank, local=local):
        return "ran"


def _loader(m: Any, **kw: Any) -> Any:
    loader = m.auto_dataloader(list(range(10)), **kw)
    return batches(loader), loader.batch_size, loader.num_workers


def _proxy(m: Any, r: int) -> Any:
    with seeded(5):
        sampler = m.DistributedProxySampler(RandomSampler(range(10)), num_replicas=2, rank=r % 2)
        first = list(sampler)
        sampler.set_epoch(1)
        return first, list(sampler), len(sampler)


def _ddp(m: Any) -> Any:
    with seeded(0):
        model = m.auto_model(torch.nn.Linear(3, 2))
    return type(model).__name__, sum(float(p.detach().sum()) for p in model.parameters())


def _optim(m: Any) -> Any:
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    return m.auto_optim(optimizer) is optimizer


def _group_then_reduce(m: Any, r: int) -> Any:
    group = m.new_group([0, 1]) if m.get_world_size() > 1 else m.new_group([0])
    return m.all_reduce(torch.tensor([r + 1]), group=group)


def _only(m: Any, r: int) -> Any:
    return m.one_rank_only(rank=m.get_world_size() - 1)(lambda: f"rank {r}")()


IGNITE: dict[str, Case] = {
    "get_rank": lambda m, r, w: m.get_rank(),
    "get_world_size": lambda m, r, w: m.get_world_size(),
    "get_local_rank": lambda m, r, w: m.get_local_rank(),
    "get_node_rank": lambda m, r, w: m.get_node_rank(),
    "get_nproc_per_node": lambda m, r, w: m.get_nproc_per_node(),
    "get_nnodes": lambda m, r, w: m.get_nnodes(),
    "hostname": lambda m, r, w: m.hostname(),
    "device": lambda m, r, w: m.device(),
    "backend": lambda m, r, w: m.backend(),
    "model_name": lambda m, r, w: m.model_name(),
    "available_backends": lambda m, r, w: m.available_backends(),
    "sync": lambda m, r, w: m.sync(),
    "show_config": lambda m, r, w: m.show_config(),
    "set_local_rank": lambda m, r, w: m.set_local_rank(r),
    "initialize/unknown-backend": lambda m, r, w: m.initialize("smoke-signals"),
    "all_reduce/tensor": lambda m, r, w: m.all_reduce(torch.tensor([r + 1.0, 2.0])),
    "all_reduce/float": lambda m, r, w: m.all_reduce(r + 1.5),
    "all_reduce/int": lambda m, r, w: m.all_reduce(r + 1),
    "all_reduce/max": lambda m, r, w: m.all_reduce(torch.tensor([r, -r]), op="MAX"),
    "all_reduce/and": lambda m, r, w: m.all_reduce(torch.tensor([r + 2]), op="AND"),
    "all_reduce/lower-case-op": lambda m, r, w: m.all_reduce(torch.tensor([1.0]), op="sum"),
    "all_reduce/unknown-op": lambda m, r, w: m.all_reduce(torch.tensor([1.0]), op="AVG"),
    "all_reduce/list": lambda m, r, w: m.all_reduce([1, 2]),
    "all_reduce/group-list": lambda m, r, w: m.all_reduce(torch.tensor([r + 1]), group=[0, 1]),
    "all_reduce/outsider": lambda m, r, w: m.all_reduce(torch.tensor([r + 1]), group=[0]),
    "all_reduce/bad-group": lambda m, r, w: m.all_reduce(torch.tensor([1]), group="ranks"),
    "all_gather/1d": lambda m, r, w: m.all_gather(torch.tensor([r, r + 10])),
    "all_gather/0d": lambda m, r, w: m.all_gather(torch.tensor(r)),
    "all_gather/2d": lambda m, r, w: m.all_gather(torch.full((1, 2), r)),
    "all_gather/float": lambda m, r, w: m.all_gather(r + 0.5),
    "all_gather/int": lambda m, r, w: m.all_gather(r + 3),
    "all_gather/str": lambda m, r, w: m.all_gather("ab" * (r + 1)),
    "all_gather/object": lambda m, r, w: m.all_gather({"rank": r}),
    "all_gather/group-list": lambda m, r, w: m.all_gather(torch.tensor([r]), group=[0, 1]),
    "all_gather/outsider": lambda m, r, w: m.all_gather(torch.tensor([r]), group=[0]),
    "all_gather/bad-group": lambda m, r, w: m.all_gather(torch.tensor([r]), group=("x",)),
    "all_gather_tensors_with_shapes/uneven": lambda m, r, w: m.all_gather_tensors_with_shapes(
        torch.full((r + 1, r + 2), float(r)), [[1, 2], [2, 3]][: m.get_world_size()]
    ),
    "broadcast/tensor": lambda m, r, w: m.broadcast(torch.tensor([r * 3.0]), src=0),
    "broadcast/int-as-float32": lambda m, r, w: m.broadcast(123456789 if r == 0 else 0),
    "broadcast/float": lambda m, r, w: m.broadcast(0.1 if r == 0 else 0.0),
    "broadcast/str": lambda m, r, w: m.broadcast("hello" if r == 0 else ""),
    "broadcast/path": lambda m, r, w: m.broadcast(Path("/a/b") if r == 0 else Path("")),
    "broadcast/safe-tensor": lambda m, r, w: m.broadcast(
        torch.ones(2, 3, dtype=torch.int32) if r == 0 else None, safe_mode=True
    ),
    "broadcast/safe-str": lambda m, r, w: m.broadcast("s" if r == 0 else None, safe_mode=True),
    "broadcast/none-unsafe": lambda m, r, w: m.broadcast(None),
    "broadcast/list": lambda m, r, w: m.broadcast([1, 2]),
    "barrier": lambda m, r, w: m.barrier(),
    "new_group/then-all_reduce": lambda m, r, w: _group_then_reduce(m, r),
    "new_group/not-a-list": lambda m, r, w: m.new_group("0,1"),
    "one_rank_first/ok": lambda m, r, w: _first(m, 0, False),
    "one_rank_first/rank-100": lambda m, r, w: _first(m, 100, False),
    "one_rank_first/local-rank-100": lambda m, r, w: _first(m, 100, True),
    "one_rank_first/negative": lambda m, r, w: _first(m, -1, False),
    "one_rank_only/last-rank": lambda m, r, w: _only(m, r),
    "auto_dataloader/global-batch-1": lambda m, r, w: _loader(m, batch_size=1),
    "auto_dataloader/global-batch-3": lambda m, r, w: _loader(m, batch_size=3, num_workers=0),
    "auto_dataloader/no-shuffle": lambda m, r, w: _loader(m, batch_size=4, shuffle=False),
    "auto_dataloader/workers-per-node": lambda m, r, w: _loader(m, batch_size=2, num_workers=3)[1:],
    "auto_dataloader/user-sampler": lambda m, r, w: _loader(
        m, batch_size=2, sampler=SequentialSampler(range(10))
    ),
    "auto_dataloader/foreign-sampler": lambda m, r, w: _loader(
        m, batch_size=2, sampler=DistributedSampler(range(10), num_replicas=2, rank=0)
    ),
    "auto_dataloader/batch-sampler": lambda m, r, w: _loader(
        m, batch_sampler=BatchSampler(SequentialSampler(range(5)), 2, False)
    ),
    "auto_dataloader/iterable": lambda m, r, w: batches(m.auto_dataloader(Stream(), batch_size=2)),
    "auto_dataloader/one-process-shuffle": lambda m, r, w: _seeded_loader(m),
    "DistributedProxySampler/random": lambda m, r, w: _proxy(m, r),
    "DistributedProxySampler/not-a-sampler": lambda m, r, w: m.DistributedProxySampler([1, 2]),
    "DistributedProxySampler/distributed": lambda m, r, w: m.DistributedProxySampler(
        DistributedSampler(range(4), num_replicas=1, rank=0)
    ),
    "auto_model": lambda m, r, w: _ddp(m),
    "auto_optim": lambda m, r, w: _optim(m),
    # Refusals of unidist's, with Ignite's types (torch's RuntimeError for a src out of range
    # or a bitwise op on floats, pickle's error, TypeError for a dataset without len()). The
    # issue: calls "raise ConfigurationError (a ValueError) where the owner raises RuntimeError
    # [...], TypeError [...] or AttributeError"; "an error that is both unidist's and the
    # owner's type keeps ports' `except` clauses working".
    "broadcast/src-out-of-range": lambda m, r, w: m.broadcast(torch.tensor([r * 1.0]), src=2),
    "broadcast/str-src-out-of-range": lambda m, r, w: m.broadcast("hello", src=2),
    "broadcast/safe-src-out-of-range": lambda m, r, w: m.broadcast(
        torch.ones(2), src=2, safe_mode=True
    ),
    "broadcast/src-not-an-int": lambda m, r, w: m.broadcast(torch.tensor([1.0]), src="0"),
    "all_reduce/and-float": lambda m, r, w: m.all_reduce(torch.tensor([1.0]), op="AND"),
    "all_reduce/or-float-number": lambda m, r, w: m.all_reduce(1.5, op="OR"),
    "all_reduce/outsider-and-float": lambda m, r, w: m.all_reduce(
        torch.tensor([1.0]), op="AND", group=[0]
    ),
    "all_gather/unpicklable": lambda m, r, w: m.all_gather(_unpicklable()),
    "all_gather/unpicklable-lock": lambda m, r, w: m.all_gather(threading.Lock()),
    "auto_dataloader/none": lambda m, r, w: batches(m.auto_dataloader(None, batch_size=2)),
    "auto_dataloader/not-a-dataset": lambda m, r, w: batches(m.auto_dataloader(5, batch_size=2)),
    "auto_model/not-a-module": lambda m, r, w: m.auto_model("model"),
}

#: The rows above whose owner raises (on two ranks) where the shim raises a unidist error that
#: is also the owner's type.
IGNITE_BOTH_TYPES = [
    "broadcast/src-out-of-range",
    "broadcast/str-src-out-of-range",
    "broadcast/safe-src-out-of-range",
    "broadcast/src-not-an-int",
    "all_reduce/and-float",
    "all_reduce/or-float-number",
    "all_gather/unpicklable",
    "all_gather/unpicklable-lock",
    "auto_dataloader/none",
    "auto_dataloader/not-a-dataset",
    "auto_model/not-a-module",
]


def _unpicklable() -> Any:
    """A local function: pickle refuses it with an AttributeError (a lock: a TypeError)."""
    return lambda: None


def _seeded_loader(m: Any) -> Any:
    with seeded(3):
        return batches(m.auto_dataloader(list(range(6)), batch_size=4, shuffle=True))


#: Rows whose difference is deliberate and documented on the migration page: what the shim
#: gives instead ("ok", or the error's type).
IGNITE_DELIBERATE: dict[str, str] = {
    # Deprecated in Ignite; the launcher gives the local rank (docs/migration/ignite.md).
    "set_local_rank": "TypeError",
}


def deliberate(expected: str, shim: Any) -> bool:
    """Whether the shim's outcome is the documented one."""
    return shim[0] == "ok" if expected == "ok" else shim[:2] == ("error", expected)


def same(owner: Any, shim: Any) -> bool:
    """The same outcome; an error may also be of a unidist class that is the owner's type
    (``except RuntimeError`` and ``except unidist.ConfigurationError`` both catch it)."""
    if owner[0] == shim[0] == "error" and len(shim) > 2:
        return shim[1] == owner[1] or (owner[1] in shim[2] and "UnidistError" in shim[2])
    return bool(shim == owner)


def assert_same(per_rank: list[dict[str, Any]], name: str, chosen: dict[str, str]) -> None:
    """The shim did what the owner did on every rank, or what ``chosen`` documents."""
    for rank, results in enumerate(per_rank):
        owner, shim = results[name]
        if name in chosen:
            assert deliberate(chosen[name], shim), shim
            continue
        assert same(owner, shim), (
            f"rank {rank} of {len(per_rank)}: the owner gave {owner}, the shim {shim}"
        )


def assert_both_types(per_rank: list[dict[str, Any]], name: str) -> None:
    """The owner raised on every rank, and the shim an error of unidist's of the owner's type."""
    for rank, results in enumerate(per_rank):
        owner, shim = results[name]
        assert owner[0] == "error", f"rank {rank}: the owner gave {owner}"
        assert shim[0] == "error", f"rank {rank}: the shim gave {shim}"
        assert {owner[1], "ConfigurationError"} <= set(shim[2]), (
            f"rank {rank}: the owner raised {owner[1]}, the shim {shim[1]} ({shim[2]})"
        )


def _initialize_and_finalize(m: Any, r: int, w: str) -> Any:
    m.initialize("gloo")
    seen = (m.backend(), m.model_name(), m.get_world_size())
    m.finalize()
    return seen


#: Cases of one process only (they start and end the process group).
IGNITE_ONE_PROCESS: dict[str, Case] = {
    "initialize/gloo": _initialize_and_finalize,
    "finalize": lambda m, r, w: (m.finalize(), m.model_name()),
}


def run_ignite(workdir: str) -> dict[str, tuple[Any, Any]]:
    """On every rank: each case through Ignite and through the shim (a group of 2, or none)."""
    import ignite.distributed as owner
    import torch.distributed as dist

    import unidist.compat.ignite as shim

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    cases = dict(IGNITE)
    if world > 1:
        dist.init_process_group("gloo")
    else:
        cases.update(IGNITE_ONE_PROCESS)
    results = {
        name: (
            outcome(case, owner, rank, workdir, bases=True),
            outcome(case, shim, rank, workdir, bases=True),
        )
        for name, case in cases.items()
    }
    if dist.is_initialized():
        shim.finalize()
    return results


# -- Composer ----------------------------------------------------------------------------------


def _in_place(m: Any, r: int, **kw: Any) -> Any:
    tensor = torch.tensor([r + 1, 5 - r])
    returned = m.all_reduce(tensor, **kw)
    return returned, tensor


def _broadcast(m: Any, r: int) -> Any:
    tensor = torch.tensor([float(r)] * 3)
    return m.broadcast(tensor, src=1 if m.get_world_size() > 1 else 0), tensor


def _object_list(m: Any, r: int) -> Any:
    objects: list[Any] = [{"from": r}, f"rank {r}"]
    return m.broadcast_object_list(objects, src=0), objects


def _sampler(m: Any, **kw: Any) -> Any:
    sampler = m.get_sampler(list(range(11)), **kw)
    first = list(sampler)
    sampler.set_epoch(1)
    return first, list(sampler), len(sampler)


def _signal_name(m: Any) -> Any:
    return m.get_node_signal_file_name(random.Random(3))


def _here(w: str, m: Any) -> str:
    path = os.path.join(w, m.__name__.replace(".", "_"))
    os.makedirs(path, exist_ok=True)
    return path


def _signal_file(m: Any, r: int, w: str) -> Any:
    folder = os.path.join(_here(w, m), f"rank{r}")
    path = m.write_signal_file("._signal", folder)
    return os.path.basename(path), sorted(os.listdir(folder))


def _download(m: Any, r: int, w: str) -> Any:
    target = os.path.join(_here(w, m), "data.bin")
    with m.local_rank_zero_download_and_wait(target):
        if m.get_local_rank() == 0:  # whole or absent: a waiter that sees the name reads it all
            Path(target + ".part").write_text("downloaded")
            os.replace(target + ".part", target)
    return Path(target).read_text()


def _first_local(m: Any, r: int, w: str) -> Any:
    log = Path(_here(w, m), "order.txt")
    with m.run_local_rank_zero_first(), log.open("a") as f:
        f.write(str(m.get_local_rank()))
    m.barrier()
    return log.read_text()


def _busy_wait(m: Any, r: int, w: str) -> Any:
    folder = os.path.join(_here(w, m), "busy")
    os.makedirs(folder, exist_ok=True)
    m.barrier()
    with m.busy_wait_for_local_rank_zero(folder):
        pass
    m.barrier()
    return sorted(os.listdir(folder))


def _hpu(m: Any, r: int) -> Any:
    gathered: list[Any] = [None] * m.get_world_size()
    return m.all_gather_object_list_hpu(gathered, {"rank": r}), gathered


COMPOSER_UNINITIALIZED: dict[str, Case] = {
    "is_initialized/before": lambda m, r, w: m.is_initialized(),
    "get_world_size/before": lambda m, r, w: m.get_world_size(),
    "all_reduce/before": lambda m, r, w: _in_place(m, r),
    "broadcast/before": lambda m, r, w: _broadcast(m, r),
    "broadcast_object_list/before": lambda m, r, w: _object_list(m, r),
    "all_gather/before": lambda m, r, w: m.all_gather(torch.tensor([r])),
    "all_gather_object/before": lambda m, r, w: m.all_gather_object(r),
    "barrier/before": lambda m, r, w: m.barrier(),
    "run_local_rank_zero_first/before": lambda m, r, w: _first_local(m, r, w),
}

COMPOSER: dict[str, Case] = {
    "is_available": lambda m, r, w: m.is_available(),
    "is_initialized": lambda m, r, w: m.is_initialized(),
    "get_global_rank": lambda m, r, w: m.get_global_rank(),
    "get_world_size": lambda m, r, w: m.get_world_size(),
    "get_local_rank": lambda m, r, w: m.get_local_rank(),
    "get_local_world_size": lambda m, r, w: m.get_local_world_size(),
    "get_node_rank": lambda m, r, w: m.get_node_rank(),
    "initialize_dist/cpu": lambda m, r, w: m.initialize_dist("cpu"),
    "barrier": lambda m, r, w: m.barrier(),
    "all_reduce/sum": lambda m, r, w: _in_place(m, r),
    "all_reduce/lower-case-max": lambda m, r, w: _in_place(m, r, reduce_operation="max"),
    "all_reduce/product": lambda m, r, w: _in_place(m, r, reduce_operation="PRODUCT"),
    "all_reduce/unknown-op": lambda m, r, w: _in_place(m, r, reduce_operation="MEDIAN"),
    "broadcast": lambda m, r, w: _broadcast(m, r),
    "broadcast_object_list": lambda m, r, w: _object_list(m, r),
    "all_gather": lambda m, r, w: m.all_gather(torch.tensor([[r, r + 1]])),
    "all_gather_object": lambda m, r, w: m.all_gather_object({"rank": r}),
    "all_gather_object_list_hpu": lambda m, r, w: _hpu(m, r),
    "get_sampler/default": lambda m, r, w: _sampler(m),
    "get_sampler/shuffle": lambda m, r, w: _sampler(m, shuffle=True, seed=4),
    "get_sampler/drop-last": lambda m, r, w: _sampler(m, drop_last=True, shuffle=True),
    "get_node_signal_file_name": lambda m, r, w: _signal_name(m),
    "write_signal_file": _signal_file,
    "local_rank_zero_download_and_wait": _download,
    "run_local_rank_zero_first": _first_local,
    "busy_wait_for_local_rank_zero": _busy_wait,
    # Refusals of unidist's, with the types Composer's calls (torch's) raise; broadcast(5) and
    # get_sampler(5) were accepted ("Two accept bad input silently: Composer's
    # `broadcast(5, src=0)` returns None [...] and `get_sampler(5)` returns a sampler").
    "broadcast/src-out-of-range": lambda m, r, w: m.broadcast(torch.tensor([1.0]), src=2),
    "broadcast/src-not-an-int": lambda m, r, w: m.broadcast(torch.tensor([1.0]), src="0"),
    "broadcast/not-a-tensor": lambda m, r, w: m.broadcast(5, src=0),
    "broadcast_object_list/src-out-of-range": lambda m, r, w: m.broadcast_object_list([r], src=2),
    "all_reduce/not-a-tensor": lambda m, r, w: m.all_reduce(5),
    "all_reduce/band-float": lambda m, r, w: _in_place_float(m, "BAND"),
    "all_gather/list": lambda m, r, w: m.all_gather([torch.tensor([r])]),
    "all_gather_object/unpicklable": lambda m, r, w: m.all_gather_object(_unpicklable()),
    "all_gather_object/unpicklable-lock": lambda m, r, w: m.all_gather_object(threading.Lock()),
    "get_sampler/not-a-dataset": lambda m, r, w: m.get_sampler(5),
    "get_sampler/none": lambda m, r, w: m.get_sampler(None),
}

#: The rows above whose owner raises (on two ranks) where the shim raises a unidist error that
#: is also the owner's type.
COMPOSER_BOTH_TYPES = [
    "broadcast/src-out-of-range",
    "broadcast/src-not-an-int",
    "broadcast/not-a-tensor",
    "broadcast_object_list/src-out-of-range",
    "all_reduce/not-a-tensor",
    "all_reduce/band-float",
    "all_gather/list",
    "all_gather_object/unpicklable",
    "all_gather_object/unpicklable-lock",
    "get_sampler/not-a-dataset",
    "get_sampler/none",
]

#: Cases of one process with a process group of one (only the source pickles what
#: broadcast_object_list sends: with two ranks the other would wait for it).
COMPOSER_ONE_PROCESS: dict[str, Case] = {
    "broadcast_object_list/unpicklable": lambda m, r, w: m.broadcast_object_list(
        [_unpicklable()], src=0
    ),
}


def _in_place_float(m: Any, op: str) -> Any:
    tensor = torch.tensor([1.0, 2.0])
    return m.all_reduce(tensor, reduce_operation=op), tensor


COMPOSER_DELIBERATE: dict[str, str] = {
    # Composer's needs Habana's HPU; the shim gathers on every device.
    "all_gather_object_list_hpu": "ok",
}


def run_composer(workdir: str) -> dict[str, tuple[Any, Any]]:
    """On every rank: each case through Composer's dist and through the shim."""
    import torch.distributed as dist
    from composer.utils import dist as owner

    import unidist
    from unidist.compat import composer as shim

    rank = int(os.environ["RANK"])
    results: dict[str, tuple[Any, Any]] = {}
    for modules_cases in (COMPOSER_UNINITIALIZED, COMPOSER):
        if modules_cases is COMPOSER and int(os.environ["WORLD_SIZE"]) > 1:
            dist.init_process_group("gloo")
        for name, case in modules_cases.items():
            results[name] = (
                outcome(case, owner, rank, os.path.join(workdir, "owner"), bases=True),
                outcome(case, shim, rank, os.path.join(workdir, "shim"), bases=True),
            )
    if int(os.environ["WORLD_SIZE"]) == 1:
        if not dist.is_initialized():  # initialize_dist/cpu started it: a process group of one
            dist.init_process_group("gloo")
        for name, case in COMPOSER_ONE_PROCESS.items():
            results[name] = (
                outcome(case, owner, rank, os.path.join(workdir, "owner"), bases=True),
                outcome(case, shim, rank, os.path.join(workdir, "shim"), bases=True),
            )
    if dist.is_initialized():
        unidist.finalize()
    return results


def report_rank(local_rank: int, out: str, scale: int = 1) -> None:
    """What a function run by ``Parallel``/``spawn`` sees, written to ``out/<rank>.json``."""
    import json

    import ignite.distributed as owner

    import unidist.compat.ignite as shim

    module = shim if "shim" in out else owner
    rank = module.get_rank()
    seen = {
        "local_rank": local_rank,
        "rank": rank,
        "world": module.get_world_size(),
        "backend": module.backend(),
        "sum": module.all_reduce(scale * (rank + 1)),
    }
    Path(out, f"{rank}.json").write_text(json.dumps(seen))


# -- torch.distributed -------------------------------------------------------------------------
#
# unidist's functions are not torch's spellings (docs/migration/torch.md says how each differs):
# a case is a pair, torch's call and unidist's, on the same inputs; the two runs (one started
# by ``dist.init_process_group``, one by ``unidist.initialize``) must give the same outcomes.

TorchCase = tuple[Callable[[int, int], Any], Callable[[int, int], Any]]


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _unidist() -> Any:
    import unidist

    return unidist


def _torch_reduce(r: int, op: str) -> Any:
    dist = _dist()
    tensor = torch.tensor([float(r + 1), 5.0 - r])
    if op == "mean":  # gloo has no ReduceOp.AVG: torch's users divide a sum
        dist.all_reduce(tensor)
        return tensor / dist.get_world_size()
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op.upper()))
    return tensor


def _unidist_reduce(r: int, op: str) -> Any:
    tensor = torch.tensor([float(r + 1), 5.0 - r])
    returned = _unidist().all_reduce(tensor, op)
    assert returned is tensor  # in place and returned, as the row says
    return tensor


def _torch_gather(r: int, w: int) -> Any:
    tensor = torch.tensor([r, r * 10])
    gathered = [torch.empty_like(tensor) for _ in range(w)]
    _dist().all_gather(gathered, tensor)
    return gathered


def _torch_gather_objects(r: int, w: int) -> Any:
    gathered: list[Any] = [None] * w
    _dist().all_gather_object(gathered, {"rank": r, "name": f"r{r}"})
    return gathered


def _torch_object_list(r: int) -> Any:
    objects: list[Any] = [{"from": r, "items": [r] * 3}]
    _dist().broadcast_object_list(objects, src=0)
    return objects[0]


def _torch_broadcast(r: int, w: int) -> Any:
    tensor = torch.tensor([float(r)] * 3)
    _dist().broadcast(tensor, src=w - 1)
    return tensor


def _torch_group_reduce(r: int, w: int) -> Any:
    dist = _dist()
    group = dist.new_group(list(range(w)))
    tensor = torch.tensor([r + 1])
    dist.all_reduce(tensor, group=group)
    return tensor, dist.get_world_size(group)


def _unidist_group_reduce(r: int, w: int) -> Any:
    unidist = _unidist()
    group = unidist.new_group(list(range(w)))
    return unidist.all_reduce(torch.tensor([r + 1]), group=group), group.size


def _torch_number(r: int) -> Any:
    tensor = torch.tensor(r + 1)
    _dist().all_reduce(tensor)
    return int(tensor.item())


TORCH: dict[str, TorchCase] = {
    "is_available": (
        lambda r, w: _dist().is_available(),
        lambda r, w: "gloo" in _unidist().available_backends(),
    ),
    "is_initialized": (
        lambda r, w: _dist().is_initialized(),
        lambda r, w: _unidist().is_initialized(),
    ),
    "get_backend": (lambda r, w: _dist().get_backend(), lambda r, w: _unidist().backend()),
    "get_rank": (lambda r, w: _dist().get_rank(), lambda r, w: _unidist().get_rank()),
    "get_world_size": (
        lambda r, w: _dist().get_world_size(),
        lambda r, w: _unidist().get_world_size(),
    ),
    "barrier": (lambda r, w: _dist().barrier(), lambda r, w: _unidist().barrier()),
    "all_reduce/sum": (
        lambda r, w: _torch_reduce(r, "sum"),
        lambda r, w: _unidist_reduce(r, "sum"),
    ),
    "all_reduce/max": (
        lambda r, w: _torch_reduce(r, "max"),
        lambda r, w: _unidist_reduce(r, "MAX"),
    ),
    "all_reduce/product": (
        lambda r, w: _torch_reduce(r, "product"),
        lambda r, w: _unidist_reduce(r, "product"),
    ),
    "all_reduce/mean": (
        lambda r, w: _torch_reduce(r, "mean"),
        lambda r, w: _unidist_reduce(r, "mean"),
    ),
    "all_reduce/number": (lambda r, w: _torch_number(r), lambda r, w: _unidist().all_reduce(r + 1)),
    "broadcast": (
        _torch_broadcast,
        lambda r, w: _unidist().broadcast(torch.tensor([float(r)] * 3), src=w - 1),
    ),
    "all_gather": (_torch_gather, lambda r, w: _unidist().all_gather(torch.tensor([r, r * 10]))),
    "all_gather_object": (
        _torch_gather_objects,
        lambda r, w: _unidist().all_gather_object({"rank": r, "name": f"r{r}"}),
    ),
    "broadcast_object_list": (
        lambda r, w: _torch_object_list(r),
        lambda r, w: _unidist().broadcast_object({"from": r, "items": [r] * 3}, src=0),
    ),
    "new_group": (_torch_group_reduce, _unidist_group_reduce),
}

#: What unidist refuses where torch's spelling would be carried over by a rename (the rows say
#: so): the call, and the error's type.
TORCH_REFUSED: dict[str, tuple[Callable[[int, int], Any], str]] = {
    "init_process_group/init_method": (
        lambda r, w: _unidist().initialize("gloo", init_method="env://"),
        "TypeError",
    ),
    "init_process_group/world_size": (
        lambda r, w: _unidist().initialize("gloo", world_size=w),
        "TypeError",
    ),
    "all_reduce/reduce-op": (
        lambda r, w: _unidist().all_reduce(torch.ones(1), op=_dist().ReduceOp.SUM),
        "ConfigurationError",
    ),
    "all_gather/list-to-fill": (
        lambda r, w: _unidist().all_gather([torch.ones(1)] * w, torch.ones(1)),
        "TypeError",
    ),
    "barrier/group-first": (
        lambda r, w: _unidist().barrier(_unidist().new_group(list(range(w)))),
        "ConfigurationError",
    ),
    "new_group/no-ranks": (lambda r, w: _unidist().new_group(), "TypeError"),
}


def run_torch(workdir: str, starter: str) -> dict[str, Any]:
    """On every rank: start the world with ``starter``'s call (``"torch"``:
    ``dist.init_process_group``, ``"unidist"``: ``unidist.initialize``), run that side of every
    case, end with its call; the outcomes by case name."""
    from unidist._base.workarounds import GLOO_TEARDOWN_DEADLOCK

    dist = _dist()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    side = 0 if starter == "torch" else 1
    results: dict[str, Any] = {}
    if starter == "torch":
        dist.init_process_group("gloo")
    else:
        _unidist().initialize("gloo")
    results["init_process_group"] = (dist.get_rank(), dist.get_world_size(), dist.get_backend())
    for name, pair in TORCH.items():
        results[name] = outcome(
            lambda m, r, w, call=pair[side]: call(r, world), None, rank, workdir
        )
    if starter == "unidist":
        for name, (call, _) in TORCH_REFUSED.items():
            results[name] = outcome(lambda m, r, w, call=call: call(r, world), None, rank, workdir)
    if starter == "unidist":
        _unidist().finalize()
    elif GLOO_TEARDOWN_DEADLOCK.present():
        # torch < 2.8's own destroy can deadlock in gloo's teardown, one rank too (it hung
        # once in 17 runs beside a busy machine): not tried; the process ends with the group.
        return results
    else:
        dist.destroy_process_group()
    results["destroy_process_group"] = (dist.is_initialized(), _unidist().is_initialized())
    return results
