"""Data loaders for distributed runs: explicit batch sizes, resumable state, sharded streams.

* :func:`auto_dataloader` builds a :class:`StatefulDataLoader` with the right sampler injected:
  a ``per_rank_batch_size`` or a ``global_batch_size`` (never a silent division; a bare
  ``batch_size``, which means the global batch to Ignite and the per-rank batch to DataLoader, is
  refused), a user sampler wrapped rather than replaced, per-rank defaults for ``num_workers``
  and ``pin_memory``, and the settings it chose logged once on the main rank.
* :class:`StatefulDataLoader` counts the batches the loop actually received, so its
  ``state_dict()`` resumes exactly, whatever the workers prefetched.
* Iterable datasets are split with :func:`unidist.shard_iterable` (:mod:`unidist.data.streams`).
* :func:`gather_in_order` collects per-sample eval results from every rank in dataset order.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, Literal, TypeVar, overload

import torch
from torch.utils.data import DataLoader, IterableDataset

from unidist import collectives, ranks
from unidist._base.checks import check_flag, check_int
from unidist._sampling.passes import PassSampler
from unidist.data import workers
from unidist.data.streams import ShardedIterable
from unidist.errors import ConfigurationError, TopologyError
from unidist.hangs import stacks
from unidist.samplers import DistributedSampler, get_sampler

__all__ = ["StatefulDataLoader", "auto_dataloader", "gather_in_order"]

T = TypeVar("T")
#: Most DataLoader workers a rank gets by default.
_MAX_DEFAULT_WORKERS = 8
#: The settings auto_dataloader chose, logged once per loader on the main rank.
logger = logging.getLogger("unidist.data")


# -- StatefulDataLoader ------------------------------------------------------------------------


class StatefulDataLoader(DataLoader[Any]):
    """A ``torch.utils.data.DataLoader`` that can be checkpointed and resumed mid-epoch.

    Over a unidist sampler (:class:`~unidist.DistributedSampler` or
    :class:`~unidist.DistributedSamplerWrapper`) it reports every batch handed to the loop, so
    :meth:`state_dict` records what the loop consumed, not what the workers prefetched, and
    :meth:`load_state_dict` (on this or another number of ranks) yields exactly the samples of
    the epoch not yet consumed.

    Its workers leave stop signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) sent to the whole process
    group to their rank, and die with it, so a rank told to stop can finish its step and save
    (:class:`unidist.ResumableState`) instead of failing on a worker killed by the same signal;
    the batches are the same. Everything else is torch's DataLoader.
    """

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a counting wrapper
        found = self._tracked()
        inner = super().__iter__()
        if found is None:
            return inner
        return _Counting(inner, *found)

    def _get_iterator(self) -> Any:
        with workers.starting_workers(self) as started:
            return started(super()._get_iterator())

    def _tracked(self) -> tuple[PassSampler, int] | None:
        """(unidist sampler, samples per full batch), when the loader draws from one."""
        if self.batch_sampler is None:  # no automatic batching: one sample per item
            return (self.sampler, 1) if isinstance(self.sampler, PassSampler) else None
        inner = getattr(self.batch_sampler, "sampler", None)
        size = getattr(self.batch_sampler, "batch_size", None)
        if isinstance(inner, PassSampler) and isinstance(size, int):
            return inner, size
        return None

    def _stateful(self) -> PassSampler:
        found = self._tracked()
        if found is None and isinstance(self.dataset, IterableDataset):
            raise ConfigurationError(
                f"this DataLoader reads a stream ({type(self.dataset).__name__}, an "
                "IterableDataset), whose position only the stream itself knows, so the loader "
                "has no state to save. HINT: save the stream's own position (e.g. the number "
                "of batches consumed, then skip that many on resume), or use a map-style "
                "dataset, whose sampler the loader can checkpoint."
            )
        if found is None:
            raise ConfigurationError(
                f"this DataLoader draws from {type(self.sampler).__name__}, which cannot record "
                "where an epoch stopped. HINT: build it with unidist.auto_dataloader over a "
                "map-style dataset, or pass sampler=unidist.DistributedSampler(dataset) (or "
                "DistributedSamplerWrapper)."
            )
        return found[0]

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: the sampler's seed, epoch and the samples consumed so far."""
        return {"sampler": self._stateful().state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next iteration yields the rest of that epoch."""
        if not isinstance(state, Mapping) or "sampler" not in state:
            raise ConfigurationError(
                f"not a StatefulDataLoader state: {state!r:.200}. HINT: pass what "
                "loader.state_dict() returned."
            )
        self._stateful().load_state_dict(state["sampler"])

    def set_epoch(self, epoch: int) -> None:
        """The sampler's ``set_epoch``: as in torch, the only way its epoch changes."""
        self._stateful().set_epoch(epoch)


class _Counting(Iterator[Any]):
    """Wraps DataLoader's iterator; tells the sampler how many samples the loop received."""

    def __init__(self, inner: Iterator[Any], sampler: PassSampler, per_batch: int) -> None:
        self._inner = inner
        self._sampler = sampler
        self._per_batch = per_batch
        self._delivered = 0

    def __next__(self) -> Any:
        try:
            batch = next(self._inner)
        except StopIteration:
            self._sampler._loader_progress(self._delivered * self._per_batch, True)
            raise
        self._delivered += 1
        self._sampler._loader_progress(self._delivered * self._per_batch, False)
        stacks.batch()
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]


# -- auto_dataloader ---------------------------------------------------------------------------


def auto_dataloader(
    dataset: Any,
    *,
    per_rank_batch_size: int | None = None,
    global_batch_size: int | None = None,
    sampler: Iterable[Any] | None = None,
    shuffle: bool | None = None,
    drop_last: bool = False,
    seed: int = 0,
    mode: Literal["train", "eval"] = "train",
    order: Literal["fast", "torch"] = "torch",
    auto_epoch: bool = False,
    native: bool | Literal["torch", "composer", "ignite"] = False,
    already_sharded: bool = False,
    **loader_kw: Any,
) -> StatefulDataLoader:
    """A DataLoader for this rank, with a distributed sampler injected.

    At most one batch size is given: ``per_rank_batch_size``, or ``global_batch_size`` across
    all ranks, which must divide by the world size (Ignite's ``auto_dataloader`` divides its
    ``batch_size`` silently and drops the remainder); neither means one sample per rank, the
    default of DataLoader and of Ignite's ``auto_dataloader``. A bare ``batch_size`` is
    refused: it is the global batch to Ignite's ``auto_dataloader`` and the per-rank batch to
    torch's ``DataLoader``, and a port that guessed wrong would silently train with another
    batch.
    The sampler is :func:`unidist.get_sampler`'s: a user ``sampler`` is wrapped
    (:class:`~unidist.DistributedSamplerWrapper`), a distributed one is kept (after checking
    its rank and world size). ``drop_last`` applies to the sampler (no padding duplicates) and
    to the last partial batch. Unlike DataLoader, ``shuffle`` defaults to True, in one process
    as well as several (Ignite's ``auto_dataloader`` shuffles by default only with several
    ranks). With several ranks the sampler is Ignite's (torch's ``DistributedSampler``) index
    for index, and its epoch changes only through ``set_epoch``; unidist's constant-memory
    order is ``order="fast"``, and epochs that advance without ``set_epoch`` are
    ``auto_epoch=True``. In one process unidist keeps its seeded, resumable sampler, where
    Ignite injects none; ``native="ignite"`` gives Ignite's loader there too (DataLoader's own
    sampler: sequential unless ``shuffle=True``, or the user's ``sampler`` unwrapped).

    Per-rank defaults, each overridable through ``loader_kw``: ``num_workers`` = this rank's
    share of the CPUs minus one for the training process (at most 8; CPUs divided by the
    processes on this node; Ignite's ``num_workers`` is per node, unidist's per rank like
    DataLoader's); ``pin_memory`` = whether CUDA is available. The settings chosen are logged
    once, on the main rank, to the logger ``unidist.data`` at INFO
    (:func:`unidist.setup_logging` shows them).

    Iterable datasets get no sampler; in a job of several ranks, one that is neither sharded
    (:func:`shard_iterable`) nor declared ``already_sharded=True`` is read whole by every rank,
    as in Ignite, with a warning. A ``batch_sampler`` is used as given, with no distributed
    sampler and no batch size, as in Ignite (which warns with several ranks, and so does this).
    ``shuffle=False`` beside a ``sampler`` is accepted, as by DataLoader.

    Args:
        dataset: a map-style dataset, or an iterable one (see above).
        per_rank_batch_size: samples per batch on each rank (DataLoader's ``batch_size``).
        global_batch_size: samples per batch across all ranks (Ignite's ``batch_size``).
        sampler: a sampler to wrap (or a distributed sampler to keep).
        shuffle: shuffle each epoch (default True; not with ``sampler``).
        drop_last: drop the tail instead of padding, and the last partial batch.
        seed: seed of the sampler.
        mode: ``"train"`` or ``"eval"`` (exact-once; see :class:`~unidist.DistributedSampler`).
        order: ``"torch"`` (default) or ``"fast"`` (see :class:`~unidist.DistributedSampler`).
        auto_epoch: advance the epoch when an iteration starts without ``set_epoch``.
        native: use a framework's own sampler (see :func:`unidist.get_sampler`).
        already_sharded: the iterable dataset already yields different data on each rank.
        **loader_kw: anything else ``DataLoader`` takes (not ``batch_size``), including
            ``batch_sampler`` (then no batch size, sampler, shuffle or drop_last).

    Raises:
        ConfigurationError: ``batch_size``, both batch sizes, an indivisible global batch
            size, a keyword DataLoader does not take, ``shuffle=True`` with a sampler, a
            sampler for another world size, or a batch sampler with a batch size.
    """
    world, rank = ranks.get_world_size(), ranks.get_rank()
    _check_loader_keywords(loader_kw, world)
    if "batch_sampler" in loader_kw:
        return _with_batch_sampler(
            dataset,
            per_rank_batch_size,
            global_batch_size,
            sampler,
            shuffle,
            drop_last,
            world,
            loader_kw,
        )
    per_rank = _per_rank_batch(per_rank_batch_size, global_batch_size, world)
    defaults = _apply_defaults(loader_kw)
    if isinstance(dataset, IterableDataset):
        _check_stream(dataset, sampler, shuffle, world, check_flag(already_sharded, "sharded"))
        loader = StatefulDataLoader(dataset, batch_size=per_rank, drop_last=drop_last, **loader_kw)
    else:
        if sampler is not None and shuffle is not None:
            if check_flag(shuffle, "shuffle"):
                raise ConfigurationError(
                    "shuffle=True cannot be combined with sampler=: the sampler decides the "
                    "order (torch's DataLoader refuses it too). HINT: drop shuffle, or shuffle "
                    "inside your sampler."
                )
            shuffle = None  # shuffle=False beside a sampler: the sampler decides, as in torch
        if native == "ignite" and world == 1:
            # Ignite's auto_dataloader injects nothing in one process: DataLoader's own
            # sampler (sequential unless shuffle=True, drawn from torch's global generator),
            # or the user's sampler unwrapped.
            loader = StatefulDataLoader(
                dataset,
                batch_size=per_rank,
                sampler=sampler,
                shuffle=bool(shuffle),
                drop_last=drop_last,
                **loader_kw,
            )
            if ranks.is_main_process():
                logger.info("%s", _describe(loader, dataset, per_rank, world, defaults))
            return loader
        chosen = _choose_sampler(
            dataset,
            sampler,
            shuffle=True if shuffle is None and sampler is None else shuffle,
            drop_last=drop_last,
            seed=seed,
            mode=mode,
            order=order,
            auto_epoch=auto_epoch,
            native=native,
            rank=rank,
            world=world,
        )
        loader = StatefulDataLoader(
            dataset, batch_size=per_rank, sampler=chosen, drop_last=drop_last, **loader_kw
        )
    if ranks.is_main_process():
        logger.info("%s", _describe(loader, dataset, per_rank, world, defaults))
    return loader


def _with_batch_sampler(
    dataset: Any,
    per_rank_batch_size: int | None,
    global_batch_size: int | None,
    sampler: Any,
    shuffle: bool | None,
    drop_last: bool,
    world: int,
    loader_kw: dict[str, Any],
) -> StatefulDataLoader:
    """Ignite's ``batch_sampler=`` case: the loader is built as given, with nothing injected."""
    given = {
        "per_rank_batch_size": per_rank_batch_size,
        "global_batch_size": global_batch_size,
        "sampler": sampler,
        "shuffle": shuffle,
    }
    clash = [f"{name}={value!r}" for name, value in given.items() if value is not None]
    if drop_last:
        clash.append("drop_last=True")
    if clash:
        raise ConfigurationError(
            f"auto_dataloader(batch_sampler=...) got {', '.join(clash)} too; the batch sampler "
            "decides the batches, their size and order (torch's DataLoader refuses the same "
            "mix). HINT: drop them, or drop batch_sampler=."
        )
    if world > 1:
        # Ignite's warning, word for word, then what unidist adds.
        warnings.warn(
            "Found batch_sampler in provided kwargs. Please, make sure that it is compatible "
            f"with distributed configuration. (unidist: the {world} ranks each read what "
            f"{type(loader_kw['batch_sampler']).__name__} yields; auto_dataloader injects no "
            "distributed sampler. HINT: pass sampler= and a batch size instead, to have it "
            "sharded.)",
            UserWarning,
            stacklevel=3,
        )
    _apply_defaults(loader_kw)
    loader = StatefulDataLoader(dataset, **loader_kw)
    if ranks.is_main_process():
        logger.info(
            "auto_dataloader: %s over %d rank(s): batch_sampler %s as given (no distributed "
            "sampler), num_workers=%d per rank, pin_memory=%s",
            type(dataset).__name__,
            world,
            type(loader.batch_sampler).__name__,
            loader.num_workers,
            loader.pin_memory,
        )
    return loader


#: Our own keywords, suggested for misspellings alongside DataLoader's.
_OWN_KEYWORDS = (
    "per_rank_batch_size",
    "global_batch_size",
    "sampler",
    "shuffle",
    "drop_last",
    "seed",
    "mode",
    "order",
    "auto_epoch",
    "native",
    "already_sharded",
)


def _check_loader_keywords(loader_kw: dict[str, Any], world: int) -> None:
    """Refuse ``batch_size``/``batch_sampler`` and keywords DataLoader does not take."""
    if "batch_size" in loader_kw:
        size = loader_kw["batch_size"]
        ignite = f"{size // world} per rank on these {world} ranks" if isinstance(size, int) else ""
        raise ConfigurationError(
            f"auto_dataloader(batch_size={size!r}) is ambiguous, so it is refused: Ignite's "
            f"idist.auto_dataloader reads batch_size as the batch of the whole job (divided by "
            f"the world size{', ' + ignite if ignite else ''}, the remainder dropped), torch's "
            "DataLoader and Composer as the batch of one rank. HINT: pass "
            f"global_batch_size={size!r} for Ignite's meaning, or per_rank_batch_size={size!r} "
            "for DataLoader's. Porting from Ignite? Its num_workers is per node (unidist's is "
            "per rank, like DataLoader's), and in one process it does not shuffle by default "
            "(unidist does; native='ignite' gives Ignite's one-process loader)."
        )
    accepted = set(inspect.signature(DataLoader.__init__).parameters) - {"self", "dataset"}
    unknown = sorted(set(loader_kw) - accepted)
    if unknown:
        known = sorted(accepted | set(_OWN_KEYWORDS))
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, [*known, "batch_size"], n=1)
            if close == ["batch_size"]:  # refused above: point at the two explicit ones
                hints.append(f"{name}= -> per_rank_batch_size= or global_batch_size=")
            elif close:
                hints.append(f"{name}= -> {close[0]}=")
        given = ", ".join(f"{name}={loader_kw[name]!r}" for name in unknown)
        hint = f" Did you mean: {'; '.join(hints)}?" if hints else ""
        raise ConfigurationError(
            f"auto_dataloader got {given}, which neither it nor torch's DataLoader takes.{hint} "
            "HINT: see help(unidist.auto_dataloader) for its keywords; the others go to "
            "DataLoader."
        )


def _per_rank_batch(per_rank: int | None, global_batch_size: int | None, world: int) -> int:
    if per_rank is None and global_batch_size is None:
        return 1  # DataLoader's default batch size, which Ignite's auto_dataloader keeps too
    if per_rank is not None and global_batch_size is not None:
        raise ConfigurationError(
            "give one of per_rank_batch_size and global_batch_size (across all "
            f"{world} ranks), got per_rank_batch_size={per_rank!r}, "
            f"global_batch_size={global_batch_size!r}."
        )
    if per_rank is not None:
        return check_int(per_rank, "per_rank_batch_size", minimum=1)
    total = check_int(global_batch_size, "global_batch_size", minimum=1)
    if total % world:
        lower, upper = total // world * world, -(-total // world) * world
        choices = f"{lower} or {upper}" if lower else f"{upper}"
        # What Ignite's batch_size=total would have given: floor division, or no division at
        # all below the world size.
        ignite = total // world if total >= world else total
        raise ConfigurationError(
            f"global_batch_size={total} does not divide by the world size {world}, so the ranks "
            f"cannot share it evenly (Ignite's batch_size={total} would give {ignite} per rank, "
            f"a global batch of {ignite * world}). HINT: use global_batch_size={choices}, or "
            f"per_rank_batch_size={ignite} for Ignite's result."
        )
    return total // world


def _describe(
    loader: StatefulDataLoader, dataset: Any, per_rank: int, world: int, defaults: list[str]
) -> str:
    """One line: what auto_dataloader chose, as Ignite logs its choices."""
    size = f" of {len(dataset)}" if isinstance(dataset, Sized) else ""
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        how = (
            f"DistributedSampler(mode={sampler.mode!r}, shuffle={sampler.shuffle}, "
            f"order={sampler.order!r}, seed={sampler.seed}, drop_last={sampler.drop_last})"
        )
    else:
        how = type(sampler).__name__
    chosen = f" (defaults: {', '.join(defaults)})" if defaults else ""
    return (
        f"auto_dataloader: {type(dataset).__name__}{size} over {world} rank(s): "
        f"{per_rank} per rank (global batch {per_rank * world}), sampler {how}, "
        f"num_workers={loader.num_workers} per rank, pin_memory={loader.pin_memory}, "
        f"drop_last={loader.drop_last}{chosen}"
    )


def _apply_defaults(loader_kw: dict[str, Any]) -> list[str]:
    """Fill in the per-rank defaults; returns the names of those it chose."""
    chosen = []
    if "num_workers" not in loader_kw:
        workers = default_num_workers()
        if loader_kw.get("persistent_workers") or loader_kw.get("prefetch_factor") is not None:
            workers = max(1, workers)  # both options need workers; asking for them means so
        loader_kw["num_workers"] = workers
        chosen.append("num_workers")
    if "pin_memory" not in loader_kw:
        loader_kw["pin_memory"] = torch.cuda.is_available()
        chosen.append("pin_memory")
    return chosen


def default_num_workers() -> int:
    """This rank's share of the usable CPUs, minus one for the training process (0..8)."""
    try:
        local = ranks.get_local_world_size()
    except TopologyError:  # local values unknown before initialize(): assume one node
        local = ranks.get_world_size()
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(0, min(_MAX_DEFAULT_WORKERS, cpus // max(1, local) - 1))


def _check_stream(
    dataset: IterableDataset[Any], sampler: Any, shuffle: bool | None, world: int, sharded: bool
) -> None:
    if sampler is not None or shuffle:
        raise ConfigurationError(
            f"{type(dataset).__name__} is an IterableDataset: it has no indices to sample or "
            "shuffle. HINT: drop sampler/shuffle, and shuffle inside the stream."
        )
    if world > 1 and not sharded and not isinstance(dataset, ShardedIterable):
        # Ignite builds the loader and says so (at INFO); a warning is harder to miss, since
        # every rank reading the whole stream trains on world-size copies of each sample.
        warnings.warn(
            "Found iterable dataset, dataloader will be created without any distributed "
            "sampling. Please, make sure that the dataset itself produces different data on "
            f"different ranks. (unidist: otherwise each of the {world} ranks reads all of "
            f"{type(dataset).__name__}. HINT: wrap it, auto_dataloader("
            "unidist.shard_iterable(dataset), ...), or pass already_sharded=True if it yields "
            "different data on each rank by itself.)",
            UserWarning,
            stacklevel=4,
        )


def _choose_sampler(
    dataset: Any,
    sampler: Iterable[Any] | None,
    *,
    shuffle: bool | None,
    drop_last: bool,
    seed: int,
    mode: Literal["train", "eval"],
    order: Literal["fast", "torch"],
    auto_epoch: bool,
    native: bool | Literal["torch", "composer", "ignite"],
    rank: int,
    world: int,
) -> Any:
    if isinstance(sampler, torch.utils.data.DistributedSampler):
        if shuffle is not None:
            raise ConfigurationError(
                "shuffle cannot be combined with a sampler; the sampler decides. HINT: drop it."
            )
        if (sampler.num_replicas, sampler.rank) != (world, rank):
            raise ConfigurationError(
                f"the {type(sampler).__name__} given was built for rank {sampler.rank} of "
                f"{sampler.num_replicas}, but this is rank {rank} of {world}. HINT: build it "
                "after unidist.initialize(), without explicit rank/num_replicas."
            )
        return sampler
    return get_sampler(
        dataset,
        shuffle=shuffle,
        drop_last=drop_last,
        seed=seed,
        mode=mode,
        order=order,
        auto_epoch=auto_epoch,
        sampler=sampler,
        native=native,
        rank=rank,
        world_size=world,
    )


# -- exact-once evaluation ---------------------------------------------------------------------


@overload
def gather_in_order(
    values: torch.Tensor,
    *,
    sampler: DistributedSampler | None = ...,
    indices: Any = ...,
    return_indices: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def gather_in_order(
    values: Sequence[T],
    *,
    sampler: DistributedSampler | None = ...,
    indices: Any = ...,
    return_indices: Literal[False] = ...,
) -> list[T]: ...


@overload
def gather_in_order(
    values: Any,
    *,
    sampler: DistributedSampler | None = ...,
    indices: Any = ...,
    return_indices: Literal[True],
) -> tuple[Any, list[int]]: ...


def gather_in_order(
    values: Any,
    *,
    sampler: DistributedSampler | None = None,
    indices: Any = None,
    return_indices: bool = False,
) -> Any:
    """Collect per-sample results from every rank, in dataset order, each sample once.

    Every rank calls it with the results of the samples it read, in the order it read them.
    The dataset index of each result comes from ``sampler`` (this rank's last pass: value
    ``k`` belongs to the ``k``-th index it yielded) or from ``indices``. Results are gathered
    with :func:`unidist.all_gather_uneven` (tensors) or :func:`unidist.all_gather_object`
    (anything else), sorted by dataset index, and duplicates (padding) are dropped.

    With ``DistributedSampler(dataset, mode="eval")`` the result has one entry per sample of
    the dataset, in dataset order.

    Args:
        values: a tensor whose first dimension is the sample, or a sequence of per-sample
            objects.
        sampler: the :class:`~unidist.DistributedSampler` that produced this rank's samples.
        indices: instead of ``sampler``: the dataset index of each value.
        return_indices: also return the dataset indices of the result.

    Returns:
        A tensor (same dtype and trailing shape) or a list, on every rank; with
        ``return_indices``, a pair (result, sorted list of dataset indices).

    Raises:
        ConfigurationError: both or neither of sampler/indices, or counts that do not match.
    """
    count = _count(values)
    own = _indices(count, sampler, indices)
    if isinstance(values, torch.Tensor):
        gathered = torch.cat(collectives.all_gather_uneven(values))
        every = torch.cat(collectives.all_gather_uneven(own)).cpu()
        order = torch.argsort(every, stable=True)
        ordered = every[order]
        first = torch.ones_like(ordered, dtype=torch.bool)
        first[1:] = ordered[1:] != ordered[:-1]
        result: Any = gathered[order[first].to(gathered.device)]
        kept = ordered[first].tolist()
    else:
        merged: dict[int, Any] = {}
        for ids, items in collectives.all_gather_object((own.tolist(), list(values))):
            for i, item in zip(ids, items, strict=True):
                merged.setdefault(i, item)
        kept = sorted(merged)
        result = [merged[i] for i in kept]
    return (result, kept) if return_indices else result


def _count(values: Any) -> int:
    if isinstance(values, torch.Tensor):
        if values.dim() == 0:
            raise ConfigurationError(
                "gather_in_order needs one value per sample; got a 0-d tensor. HINT: reshape(1)."
            )
        return int(values.shape[0])
    if isinstance(values, Sized) and isinstance(values, Iterable):
        return len(values)
    raise ConfigurationError(
        f"gather_in_order takes a tensor or a sequence of values, got {type(values).__name__}."
    )


def _indices(count: int, sampler: Any, indices: Any) -> torch.Tensor:
    if (sampler is None) == (indices is None):
        raise ConfigurationError(
            "gather_in_order needs exactly one of sampler= (the DistributedSampler that gave "
            "this rank its samples) and indices= (each value's dataset index)."
        )
    if sampler is not None:
        if not isinstance(sampler, DistributedSampler):
            raise ConfigurationError(
                f"sampler= must be a unidist.DistributedSampler, got {type(sampler).__name__}. "
                "HINT: pass indices= (each value's dataset index) instead."
            )
        return torch.from_numpy(sampler.pass_indices(count))
    own = torch.as_tensor(indices, dtype=torch.int64).reshape(-1).cpu()
    if own.numel() != count:
        raise ConfigurationError(
            f"{count} values but {own.numel()} indices; give one dataset index per value."
        )
    return own
