"""Ranks and topology, and helpers that run code on one rank.

Every getter works without a process group and states its single-process value. None of them
communicates: they read the environment (parsed once) or the running session.
"""

from __future__ import annotations

import contextlib
import functools
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from unidist._base.migration import foreign_keywords
from unidist.collectives import sync
from unidist.errors import ConfigurationError, RemoteError
from unidist.session import state as _state

if TYPE_CHECKING:
    from unidist.collectives.groups import Group
    from unidist.environments.variables import EnvReading, Topology

__all__ = [
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
]

P = ParamSpec("P")
R = TypeVar("R")


def topology() -> Topology:
    """This process's :class:`~unidist.Topology` (all single-process values when not distributed).

    Raises:
        TopologyError: the environment is malformed, or does not say the local values and
            :func:`unidist.initialize` has not worked them out yet.
    """
    return _reading_adopting_the_group().topology()


def get_rank(group: Group | None = None) -> int:
    """Global rank of this process, or its rank within ``group``. 0 when not distributed."""
    rank = _state.effective_reading().rank
    if group is None:
        return rank
    inside = _group(group, "get_rank").rank_of(rank)
    if inside is None:
        raise ConfigurationError(f"rank {rank} is not in the group of ranks {list(group.ranks)}.")
    return inside


def get_world_size(group: Group | None = None) -> int:
    """Number of processes in the job, or in ``group``. 1 when not distributed."""
    if group is None:
        return _state.effective_reading().world_size
    return _group(group, "get_world_size").size


def _group(group: object, what: str) -> Group:
    """``group`` if it is a :class:`~unidist.Group`, else the error every collective gives."""
    from unidist.collectives.groups import Group, refuse_group

    if not isinstance(group, Group):
        raise refuse_group(group, what)
    return group


def get_local_rank() -> int:
    """Rank of this process among those on its node. 0 when not distributed.

    Under a process group started without launcher variables (plain
    ``torch.distributed.init_process_group``), the first call adopts the group, as
    :func:`unidist.initialize` would, and so must be made on every rank.
    """
    return _local("local_rank")


def get_local_world_size() -> int:
    """Number of processes on this node. 1 when not distributed (see :func:`get_local_rank`)."""
    return _local("local_world_size")


def get_node_rank() -> int:
    """Index of this node. 0 when not distributed (also under torchrun, via ``GROUP_RANK``).

    See :func:`get_local_rank` for a process group started without launcher variables.
    """
    return _local("node_rank")


def get_num_nodes() -> int:
    """Number of nodes in the job. 1 when not distributed (see :func:`get_local_rank`)."""
    return _local("num_nodes")


def _local(name: str) -> int:
    """A per-node value (see :func:`_reading_adopting_the_group`)."""
    return _reading_adopting_the_group().require(name)


def _reading_adopting_the_group() -> EnvReading:
    """What the getters report; adopts a live process group when only the ranks can say it.

    Ignite's getters do the same (their first call syncs with the live group, which
    communicates): a process group made by plain torch, without the launcher's LOCAL_* and
    NODE_RANK variables, says only rank and world size, and the hosts of the other ranks are
    needed for the rest. Every rank calls the same getter, so the adoption lines up.
    """
    reading = _state.effective_reading()
    if reading.missing and _state.published() is None and _state.torch_group_is_live():
        from unidist.session import lifecycle

        lifecycle.initialize()
        reading = _state.effective_reading()
    return reading


def is_main_process() -> bool:
    """True on global rank 0 (and in a single process)."""
    return _state.effective_reading().rank == 0


def rank_zero_only(fn: Callable[P, R]) -> Callable[P, R | None]:
    """Decorator: run ``fn`` on global rank 0 only; other ranks get ``None``. No communication."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        return fn(*args, **kwargs) if _state.effective_reading().rank == 0 else None

    return wrapper


@foreign_keywords({"with_barrier": ("ignite.distributed.one_rank_only", "use barrier=")})
def one_rank_only(
    rank: int = 0, barrier: bool = False, *, timeout: float | timedelta | None = None
) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """Decorator: run the function on global ``rank`` only; other ranks get ``None``.

    Ignite's semantics: with ``barrier=True`` every rank waits for the chosen rank to finish.
    Unlike Ignite's, if the function raises on the chosen rank, the other ranks raise
    :class:`~unidist.RemoteError` instead of waiting for ever, and they give up after ``timeout``.

    Args:
        rank: the global rank that runs the function.
        barrier: make every rank wait until the chosen rank has finished.
        timeout: seconds the other ranks wait (default: the session's timeout).
    """

    def decorator(fn: Callable[P, R]) -> Callable[P, R | None]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            me = _state.effective_reading()
            _check_rank(rank, me.world_size, "one_rank_only(rank=...)")
            if not barrier or me.world_size == 1:
                return fn(*args, **kwargs) if me.rank == rank else None
            what = f"one_rank_only(rank={rank}, barrier=True)"
            if me.rank != rank:
                _wait_for(rank, what, timeout)
                return None
            with _report_to_waiters(rank, what, timeout):
                return fn(*args, **kwargs)

        return wrapper

    return decorator


@contextlib.contextmanager
def one_rank_first(
    rank: int = 0, local: bool = False, *, timeout: float | timedelta | None = None
) -> Iterator[None]:
    """Context manager: ``rank`` runs the block first, then all the others (e.g. a download).

    With ``local=True``, local rank ``rank`` of every node goes first and the others on that node
    follow. If a first rank raises inside the block, the ranks waiting for it raise
    :class:`~unidist.RemoteError` (with its traceback) instead of hanging, and skip the block;
    they also give up after ``timeout`` with :class:`~unidist.DistributedTimeoutError`.

    Args:
        rank: the global rank (or local rank, with ``local=True``) that goes first.
        local: choose the first rank per node instead of globally.
        timeout: seconds the others wait for it (default: the session's timeout).
    """
    what = f"one_rank_first(rank={rank}, local={local})"
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        # The argument before the topology (as Ignite): a bad rank is named even where the
        # topology cannot be read yet.
        raise ConfigurationError(f"{what}: rank={rank!r} is not a rank (0 or more).")
    me = _reading_adopting_the_group()
    if not local:
        _check_rank(rank, me.world_size, what)
    if me.world_size == 1:
        _check_rank(rank, 1, what)
        yield
        return
    topo = me.topology()
    _check_rank(rank, topo.local_world_size if local else topo.world_size, what)
    # The global rank this process waits for (itself, if it goes first).
    first = topo.rank - topo.local_rank + rank if local else rank
    if topo.rank == first:
        with _report_to_waiters(first, what, timeout):
            yield
        return
    _wait_for(first, what, timeout)
    yield


def _check_rank(rank: int, size: int, what: str) -> None:
    if not isinstance(rank, int) or not 0 <= rank < size:
        raise ConfigurationError(f"{what}: rank={rank!r} is not in 0..{size - 1}.")


@contextlib.contextmanager
def _report_to_waiters(me: int, what: str, timeout: float | timedelta | None) -> Iterator[None]:
    """On a first rank: run the block, then tell the waiting ranks how it went."""
    try:
        yield
    except BaseException as exc:
        report = "".join(traceback.format_exception(exc))[-4000:]
        with contextlib.suppress(Exception):  # the waiters time out if this fails too
            sync.exchange(report, publish=True, wait_for=[me], timeout=timeout, what=what)
        raise
    sync.exchange(None, publish=True, wait_for=[me], timeout=timeout, what=what)


def _wait_for(first: int, what: str, timeout: float | timedelta | None) -> None:
    """On a waiting rank: wait (bounded) for ``first``, and raise if it failed."""
    waiting = f"waiting for rank {first} to finish {what}"
    reports = sync.exchange(None, publish=False, wait_for=[first], timeout=timeout, what=waiting)
    if reports[first] is not None:
        me = _state.effective_reading().rank
        raise RemoteError(
            f"rank {first} raised inside {what}, so rank {me} did not run the block. Its "
            f"error:\n{reports[first]}"
        )
