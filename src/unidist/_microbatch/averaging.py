"""Averaging gradients by hand, in buckets, once every rank voted success.

Why gradients are reduced by hand: DDP all-reduces inside ``backward``. If one rank runs out of
memory in its backward while another is already inside that all-reduce, the healthy rank waits in
a collective that never completes (Composer's known deadlock, mosaicml/composer PR #2117). So every
microbatch runs under ``no_sync()``, the ranks vote, and only when every rank has finished the
whole batch are the gradients averaged here, in buckets, over DDP's own process group. DDP's
reducer cannot be triggered after the fact, and re-running the last microbatch with sync enabled
would cost a forward and backward (and replay dropout); an explicit all-reduce costs what DDP's
costs, minus its overlap with the last backward. DDP communication hooks are not applied.

Everything the reduction allocates (its staging buffers) is allocated before the vote, inside
the attempt, so an OOM there is voted on like any other; the collectives then allocate nothing
except the gradients of parameters that this rank did not use but another rank did.

Hiding the vote: once a vote has gone well (so every rank holds its staging buffers), every rank
starts the all-reduce of the first bucket right after its attempt, whatever the attempt's
outcome, and votes while it runs (:meth:`GradientAverager.start`). An all-``ok`` vote keeps its
result; any other discards it once it has completed (every rank started it, so it completes).
The vote's store round trips then cost what the first bucket's all-reduce does not already
take, and no memory is added: the first bucket uses the staging buffer the others reuse after
it. If the vote itself fails (a rank never came), the started all-reduce is left to the process
group's own timeout.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

__all__ = ["GradientAverager", "by_kind", "unflatten_into"]

T = TypeVar("T", bound="torch.Tensor")

#: All-reduces left running when a vote failed, with their tensors: kept referenced so that
#: gloo's worker never drops the last reference to a Python-owned tensor, which needs the GIL
#: that torch < 2.8 holds while it destroys the group (pytorch PR #154976).
_ABANDONED: list[tuple[Any, Any]] = []
_KEEP_ABANDONED = 8


def by_kind(tensors: Sequence[T]) -> list[list[T]]:
    """Tensors grouped by (device, dtype), groups in first-seen order."""
    groups: dict[tuple[Any, Any], list[T]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


class GradientAverager:
    """Averages gradients over a process group in buckets, after every rank voted success.

    Args:
        params: the parameters to average, in the same order on every rank.
        group: a ``torch.distributed`` process group (DDP's), or None for the unidist world.
        world_size: number of ranks in that group.
        bucket_bytes: largest staging buffer per (device, dtype).
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        group: Any,
        world_size: int,
        bucket_bytes: int,
    ) -> None:
        self.params = list(params)
        self.group = group
        self.world_size = world_size
        self._buckets: list[list[int]] = []
        for same in by_kind(self.params):
            self._buckets.extend(_buckets(same, self.params, bucket_bytes))
        self._staging: dict[tuple[Any, Any], torch.Tensor] = {}
        #: The first bucket's staged gradients and its running all-reduce (see start).
        self._started: tuple[torch.Tensor, Any] | None = None

    def missing(self) -> tuple[int, ...]:
        """Indices of the parameters without a gradient on this rank (voted on)."""
        return tuple(i for i, p in enumerate(self.params) if p.grad is None)

    def prepare(self) -> None:
        """Allocate the staging buffers (once); called inside the attempt, before the vote."""
        import torch

        for bucket in self._buckets:
            first = self.params[bucket[0]]
            key = (first.device, first.dtype)
            numel = sum(self.params[i].numel() for i in bucket)
            held = self._staging.get(key)
            if held is None or held.numel() < numel:
                self._staging[key] = torch.empty(numel, dtype=first.dtype, device=first.device)

    @property
    def can_start(self) -> bool:
        """Whether :meth:`start` can run: the group is a torch process group (DDP's)."""
        return self.group is not None and bool(self._buckets)

    def start(self) -> BaseException | None:
        """Stage the first bucket and start its all-reduce without waiting for it.

        Every rank calls it after each attempt once a vote went well, whatever the attempt
        did: a rank that leaves it out would leave the others' all-reduce without a peer.

        Returns:
            The error that staging this rank's gradients raised (the all-reduce started on
            the buffer as it was: its result is discarded, since this rank votes ``error``).
        """
        import torch
        import torch.distributed as dist

        bucket = self._buckets[0]
        failure: BaseException | None = None
        with torch.no_grad():
            try:
                flat = self._stage(bucket)
            except Exception as exc:  # a broken device; the vote says so
                failure = exc
                flat = self._flat(bucket)
            self._started = (flat, dist.all_reduce(flat, group=self.group, async_op=True))
        return failure

    def settle(self, seconds: float) -> None:
        """Wait for a started all-reduce and drop its result (the vote did not go well)."""
        if self._started is not None:
            self._wait(seconds)

    def abandon(self) -> None:
        """Forget a started all-reduce without waiting (a rank never came to the vote)."""
        if self._started is not None:
            _ABANDONED.append(self._started)  # see _ABANDONED
            del _ABANDONED[:-_KEEP_ABANDONED]
            self._started = None

    def reduce(self, missing_everywhere: set[int], seconds: float) -> None:
        """Average every gradient over the group (in place); parameters unused on every rank
        keep ``grad=None``, as with DDP. A started first bucket is waited for (``seconds``)."""
        import torch

        with torch.no_grad():
            for index, bucket in enumerate(self._buckets):
                if index == 0 and self._started is not None:
                    flat = self._wait(seconds)
                else:
                    flat = self._stage(bucket)
                    self._all_reduce(flat)
                self._unstage(bucket, flat, missing_everywhere)

    def _wait(self, seconds: float) -> torch.Tensor:
        from datetime import timedelta

        from unidist.errors import DistributedTimeoutError, translate_errors

        assert self._started is not None
        flat, work = self._started
        what = f"the first gradient bucket's all-reduce over {self.world_size} ranks"
        try:
            with translate_errors(what):
                work.wait(timedelta(seconds=max(seconds, 0.001)))
        except Exception as exc:
            self.abandon()
            if isinstance(exc, DistributedTimeoutError):  # translate_errors classified it
                raise DistributedTimeoutError(
                    f"{what} did not complete within {seconds:g} s although every rank voted. "
                    "HINT: a rank stopped between its vote and the all-reduce; look at its log."
                ) from exc
            raise
        self._started = None
        return flat

    def _flat(self, bucket: list[int]) -> torch.Tensor:
        first = self.params[bucket[0]]
        staging = self._staging[(first.device, first.dtype)]
        return staging[: sum(self.params[i].numel() for i in bucket)]

    def _stage(self, bucket: list[int]) -> torch.Tensor:
        """Copy the bucket's gradients (zeros where there are none) into its staging view,
        divided by the world size (first, like DDP: no overflow in half precision)."""
        flat = self._flat(bucket)
        offset = 0
        for i in bucket:
            p = self.params[i]
            n = p.numel()
            if p.grad is None:
                flat[offset : offset + n].zero_()
            else:
                flat[offset : offset + n].view_as(p.grad).copy_(p.grad)
            offset += n
        flat.div_(self.world_size)
        return flat

    def _unstage(self, bucket: list[int], flat: torch.Tensor, missing_everywhere: set[int]) -> None:
        offset = 0
        for i in bucket:
            p = self.params[i]
            n = p.numel()
            part = flat[offset : offset + n].view_as(p)
            offset += n
            if p.grad is not None:
                p.grad.copy_(part)
            elif i not in missing_everywhere:
                p.grad = part.clone()

    def _all_reduce(self, flat: torch.Tensor) -> None:
        if self.group is None:
            from unidist import collectives

            collectives.all_reduce(flat, "sum")
            return
        import torch.distributed as dist

        from unidist.errors import translate_errors

        with translate_errors(f"averaging gradients over {self.world_size} ranks"):
            dist.all_reduce(flat, group=self.group)


def _buckets(
    same: Sequence[torch.nn.Parameter], everything: Sequence[torch.nn.Parameter], cap: int
) -> Iterator[list[int]]:
    """Consecutive runs of parameter indices whose gradients fit in ``cap`` bytes (or one)."""
    index = {id(p): i for i, p in enumerate(everything)}
    bucket: list[int] = []
    size = 0
    for p in same:
        nbytes = p.numel() * p.element_size()
        if bucket and size + nbytes > cap:
            yield bucket
            bucket, size = [], 0
        bucket.append(index[id(p)])
        size += nbytes
    if bucket:
        yield bucket
