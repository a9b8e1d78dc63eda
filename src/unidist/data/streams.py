"""Iterable datasets split across ranks *and* DataLoader workers, so no element is read twice.

Samplers index map-style datasets; a stream has no indices, so it is split instead: by element
(element ``i`` to rank ``i % world_size``, then round-robin over that rank's workers) or by shard
(each shard opened by exactly one worker of one rank). See :func:`shard_iterable`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

from torch.utils.data import IterableDataset, get_worker_info

from unidist import ranks
from unidist._base.checks import check_flag, check_int
from unidist.errors import ConfigurationError

__all__ = ["ShardedIterable", "shard_iterable"]

T = TypeVar("T")


class ShardedIterable(IterableDataset[T]):
    """An iterable dataset split over ranks and DataLoader workers; see :func:`shard_iterable`."""

    def __init__(
        self,
        source: Iterable[T] | Callable[[], Iterable[T]] | Sequence[Any],
        *,
        open_shard: Callable[[Any], Iterable[T]] | None,
        drop_last: bool,
        rank: int,
        world_size: int,
    ) -> None:
        self.source = source
        self.open_shard = open_shard
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[T]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # Element (or shard) i belongs to rank i % W, and the rank's t-th one to worker
        # t % workers: ranks may run different numbers of workers without overlapping.
        first, step = self.rank + self.world_size * worker, self.world_size * workers
        if self.open_shard is not None:
            for shard in itertools.islice(self.source, first, None, step):  # type: ignore[arg-type]
                yield from self.open_shard(shard)
            return
        stream = iter(self._fresh())
        if not self.drop_last:
            yield from itertools.islice(stream, first, None, step)
            return
        for t in itertools.count():  # only complete rounds of W, so every rank gets as many
            round_ = list(itertools.islice(stream, self.world_size))
            if len(round_) < self.world_size:
                return
            if t % workers == worker:
                yield round_[self.rank]

    def _fresh(self) -> Iterable[T]:
        source = self.source
        if not isinstance(source, Iterable) and callable(source):
            return source()
        return source


@overload
def shard_iterable(
    source: Iterable[T] | Callable[[], Iterable[T]],
    *,
    drop_last: bool = ...,
    rank: int | None = ...,
    world_size: int | None = ...,
) -> ShardedIterable[T]: ...


@overload
def shard_iterable(
    source: Sequence[Any],
    *,
    open_shard: Callable[[Any], Iterable[T]],
    rank: int | None = ...,
    world_size: int | None = ...,
) -> ShardedIterable[T]: ...


def shard_iterable(
    source: Any,
    *,
    open_shard: Callable[[Any], Iterable[T]] | None = None,
    drop_last: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
) -> ShardedIterable[T]:
    """Split a stream across ranks and DataLoader workers: each element goes to one of them.

    Two ways to split:

    * By element: ``source`` is an iterable dataset (or anything iterable more than once, or a
      function returning a new iterator). Element ``i`` goes to rank ``i % world_size`` and,
      within the rank, round-robin to a worker. Every worker walks the stream (skipping in C),
      so reading it must be cheap; ``drop_last=True`` keeps only complete rounds, so every rank
      yields the same number of elements (needed when ranks must take equal steps).
    * By shard: ``source`` is a sequence of shards (file names, URLs) and ``open_shard(shard)``
      yields a shard's elements. Each shard is opened by exactly one worker of one rank, so
      nothing is read twice; counts per rank follow the shard sizes.

    Args:
        source: the stream, or the shards.
        open_shard: turns a shard into its elements (selects splitting by shard).
        drop_last: by element only: drop the last incomplete round.
        rank: this rank (default: :func:`unidist.get_rank`, read now, in the main process).
        world_size: number of ranks (default: :func:`unidist.get_world_size`).

    Raises:
        ConfigurationError: a one-shot iterator, fewer shards than ranks, or conflicting options.
    """
    world = check_int(ranks.get_world_size() if world_size is None else world_size, "world_size")
    me = check_int(ranks.get_rank() if rank is None else rank, "rank", minimum=0)
    if world < 1 or me >= world:
        raise ConfigurationError(f"rank={me} and world_size={world} do not fit: 0 <= rank < W.")
    check_flag(drop_last, "drop_last")
    if open_shard is not None:
        if drop_last:
            raise ConfigurationError(
                "drop_last needs splitting by element; shards have unknown sizes. HINT: give "
                "each rank the same number of equal shards instead."
            )
        if not isinstance(source, Sequence) or isinstance(source, str | bytes):
            raise ConfigurationError(
                f"open_shard needs a sequence of shards, got {type(source).__name__}."
            )
        if len(source) < world:
            raise ConfigurationError(
                f"{len(source)} shards cannot feed {world} ranks: some ranks would get nothing "
                "and wait for ever in the first collective. HINT: split the data into at least "
                "as many shards as ranks, or split by element (no open_shard)."
            )
    elif isinstance(source, Iterator):
        raise ConfigurationError(
            f"{type(source).__name__} is an iterator, which can be read only once; every epoch "
            "and every worker needs its own pass. HINT: pass the iterable itself, or a "
            "function that returns a new iterator (lambda: open_stream())."
        )
    elif not isinstance(source, Iterable) and not callable(source):
        raise ConfigurationError(
            f"shard_iterable needs an iterable or a function, got {type(source).__name__}."
        )
    return ShardedIterable(
        source, open_shard=open_shard, drop_last=drop_last, rank=me, world_size=world
    )
