"""Automatic microbatching in any training loop, agreed by all ranks.

:class:`MicroBatcher` takes the whole per-rank batch and a function that computes the loss of one
microbatch. It splits the batch, runs forward and backward per microbatch with the loss scaled
so that the accumulated gradient is the full-batch gradient, and returns the batch loss; the
optimizer step stays yours. When any rank runs out of memory, every rank drops the batch's
partial gradients, frees cached memory, shrinks the microbatch and retries the same batch.

How the ranks agree (one vote per attempt, at a point every rank reaches):

1. Every microbatch runs under DDP's ``no_sync()``: nothing inside an attempt is a collective,
   so a rank that fails anywhere (forward or backward) cannot leave another stuck in one.
2. A rank that fails raises a flag on unidist's control store; the others look at it between
   microbatches (one store round trip, at most every ``abort_check_interval`` seconds) and
   abandon their attempt early. Nothing waits there.
3. At the end of the attempt every rank votes ``ok``/``oom``/``aborted``/``error`` through the
   session's communicator (unidist's control store, not the device or NCCL; without a store,
   over the gloo control group): one rank tallies the votes and every rank reads the same tally
   (a few store operations per rank, whatever the world size). The same tally gives the same
   decision everywhere.
4. All ``ok``: gradients are averaged by hand over DDP's group (see
   :mod:`unidist._microbatch.averaging`; after the first good vote, the first bucket's
   all-reduce starts before each vote and runs while the ranks vote).
   Any ``error``: that rank re-raises its error, the others raise :class:`~unidist.RemoteError`
   naming it. Otherwise: shrink (or raise :class:`~unidist.MicrobatchOOMError` at the minimum
   size) and retry the same batch; buffers (BatchNorm statistics) are restored first, so no
   sample is counted twice.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from unidist._microbatch import tally
from unidist._microbatch.averaging import GradientAverager
from unidist._microbatch.memory import free_memory, is_oom
from unidist._microbatch.model import inspect_model
from unidist._microbatch.policy import SizeChange, SizePolicy, SizeTracker
from unidist._microbatch.split import batch_size, detached, split_batch, unpack_loss
from unidist._microbatch.tally import Tally, Vote
from unidist.collectives import sync
from unidist.environments import variables as _env
from unidist.errors import ConfigurationError, RemoteError
from unidist.session import lifecycle

if TYPE_CHECKING:
    import torch

    from unidist.session.state import Session

__all__ = ["MicroBatcher", "SizeChange", "SizePolicy", "batch_size", "is_oom", "split_batch"]

logger = logging.getLogger("unidist.microbatch")

#: Distinguishes the flags of several microbatchers (created in the same order on every rank).
_instances = itertools.count()
#: Longest error text sent to the other ranks.
_DETAIL_CHARS = 2000
#: Seconds ranks wait for each other after a fatal vote, so rank 0's store outlives the reads.
_ACK_SECONDS = 30.0


class _PeerFailed(Exception):
    """Another rank raised the abort flag of this attempt."""


@dataclass
class _Attempt:
    vote: Vote
    loss: torch.Tensor | None = None
    error: BaseException | None = None
    #: The abort flag this rank raised (lowered once every rank has voted).
    flagged: sync.Flag | None = None


class MicroBatcher:
    """Runs a batch as microbatches that fit in memory; all ranks agree on the size.

    Args:
        model: the module ``loss_fn`` calls (the ``DistributedDataParallel`` wrapper if any).
        policy: start, minimum, shrinking and growing of the size (default: :class:`SizePolicy`,
            which starts at the batch size and halves).
        split_fn: ``split_fn(batch, size) -> microbatches``; default :func:`split_batch`
            (tensors, and tuples, lists and dicts of them, along dim 0).
        size_fn: samples in a batch or microbatch; default :func:`batch_size` (dim 0).
        reduction: ``"mean"`` when ``loss_fn`` returns the mean over its microbatch (each loss
            is weighted by its share of the batch), ``"sum"`` when it returns a sum.
        zero_grad: start every step from no gradients (like ``optimizer.zero_grad()``). With
            False the existing gradients are set aside and the batch's are added on success,
            for accumulation across steps.
        sync_gradients: average gradients over the ranks after a successful batch. None: for a
            DDP model (whose own synchronisation is switched off) and not for a plain module.
        restore_buffers: undo what a failed attempt did to the module's buffers.
        scaler: a ``torch.amp.GradScaler``; backward runs on ``scaler.scale(loss)``.
        bucket_cap_mb: size of the gradient-averaging buckets.
        timeout: seconds a vote waits for the other ranks (default: the session's timeout).
        abort_check_interval: seconds between looks (one store lookup, between microbatches) at
            whether another rank failed, so that healthy ranks abandon the attempt early; 0
            looks before every microbatch, None never looks (ranks finish the attempt, then
            vote).

    Example:
        >>> mb = unidist.MicroBatcher(model)            # doctest: +SKIP
        >>> for x, y in loader:                         # doctest: +SKIP
        ...     loss = mb.step((x, y), lambda b: F.cross_entropy(model(b[0]), b[1]))
        ...     optimizer.step()
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        policy: SizePolicy | None = None,
        split_fn: Callable[[Any, int], Sequence[Any]] | None = None,
        size_fn: Callable[[Any], int] | None = None,
        reduction: Literal["mean", "sum"] = "mean",
        zero_grad: bool = True,
        sync_gradients: bool | None = None,
        restore_buffers: bool = True,
        scaler: Any = None,
        bucket_cap_mb: float = 25.0,
        timeout: float | timedelta | None = None,
        abort_check_interval: float | None = 0.05,
    ) -> None:
        self._view = inspect_model(model)
        if reduction not in ("mean", "sum"):
            raise ConfigurationError(f"reduction={reduction!r}; expected 'mean' or 'sum'.")
        if abort_check_interval is not None and not abort_check_interval >= 0:
            raise ConfigurationError(
                f"abort_check_interval={abort_check_interval!r} must be None or seconds >= 0."
            )
        if not bucket_cap_mb > 0:
            raise ConfigurationError(f"bucket_cap_mb={bucket_cap_mb!r} must be positive.")
        if sync_gradients is False and self._view.ddp is not None:
            logger.warning(
                "sync_gradients=False with a DistributedDataParallel model: gradients will not "
                "be averaged over the ranks; average them yourself before optimizer.step()."
            )
        self.tracker = SizeTracker(policy or SizePolicy(), logger)
        #: What every rank votes when nothing changed since the last vote (agreed by it).
        self._expected: sync.ExpectedValues | None = None
        self._split_fn = split_fn or split_batch
        self._size_fn = size_fn or batch_size
        self._reduction = reduction
        self._zero_grad = zero_grad
        self._sync = self._view.ddp is not None if sync_gradients is None else sync_gradients
        self._restore_buffers = restore_buffers
        self._scaler = scaler
        self._bucket_bytes = int(bucket_cap_mb * 2**20)
        self._timeout = timeout
        self._check_interval = abort_check_interval
        self._last_check = 0.0
        self._averager: GradientAverager | None = None
        #: Whether a vote went well with gradients to average: every rank holds its staging
        #: buffers, so each attempt starts the first bucket's all-reduce before voting.
        self._averaged_once = False
        self._id = next(_instances)
        self._attempts = 0
        self._where = ""
        #: Outputs of the last successful step, one per microbatch, when ``loss_fn`` returned
        #: ``(loss, output)`` pairs (detached).
        self.outputs: list[Any] = []

    @property
    def size(self) -> int | None:
        """The current microbatch size; None before the first step (without a start size)."""
        return self.tracker.size

    @property
    def scaler(self) -> Any:
        """The GradScaler the backward goes through (None without one)."""
        return self._scaler

    @property
    def zero_grad(self) -> bool:
        """Whether each step starts from no gradients."""
        return self._zero_grad

    @property
    def history(self) -> list[SizeChange]:
        """Every change of the size, with its step and reason."""
        return self.tracker.history

    @property
    def retries(self) -> int:
        """Batches re-run after an out-of-memory error, in all."""
        return self.tracker.retries

    def state_dict(self) -> dict[str, Any]:
        """The size search state, to save with a checkpoint (a resumed run need not search)."""
        return self.tracker.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.tracker.load_state_dict(state)

    def step(self, batch: Any, loss_fn: Callable[[Any], Any]) -> torch.Tensor:
        """Forward and backward over ``batch`` in microbatches; every rank calls it.

        Args:
            batch: this rank's whole batch. Microbatches are views of it: ``loss_fn`` must not
                modify them in place (a retry reuses the batch).
            loss_fn: ``loss_fn(microbatch)`` returns the loss of the microbatch (a scalar
                tensor), or a ``(loss, output)`` pair whose outputs land in :attr:`outputs`.

        Returns:
            This rank's batch loss (detached; the mean over the batch with
            ``reduction="mean"``). The gradients are in ``.grad``, averaged over the ranks.

        Raises:
            MicrobatchOOMError: some rank is out of memory at the minimum size (on every rank).
            RemoteError: another rank failed with a different error.
            DistributedTimeoutError: another rank did not reach the vote within the timeout.
        """
        session = self._session()
        self._view.broadcast_buffers()
        snapshot = self._view.snapshot_buffers() if self._restore_buffers else []
        stashed = self._view.take_grads(keep=not self._zero_grad)
        try:
            with self._view.buffer_sync_off():
                votes, attempt = self._agree(batch, loss_fn, session, snapshot)
            if self._averager is not None:
                self._averager.reduce(set(votes.missing), self._seconds(session))
        except BaseException:  # leave gradients and buffers as they were before the step
            self._recover(snapshot, free=False)
            self._view.give_back_grads(stashed)
            raise
        self._view.give_back_grads(stashed)
        self.tracker.succeeded(votes)
        if attempt.loss is None:
            import torch

            return torch.zeros(())
        return attempt.loss

    def _agree(
        self,
        batch: Any,
        loss_fn: Callable[[Any], Any],
        session: Session,
        snapshot: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[Tally, _Attempt]:
        """Attempt and vote until every rank has run the whole batch (or raise everywhere)."""
        failures = 0
        while True:
            attempt = self._start_averaging(self._attempt(batch, loss_fn, session))
            try:
                votes = self._vote(attempt, session)
            except BaseException:
                if self._averager is not None:
                    self._averager.abandon()  # a rank may never start it; the group times out
                raise
            if votes.all_ok:
                return votes, attempt
            if self._averager is not None:
                if votes.error_ranks:  # every rank raises now: nobody needs the result
                    self._averager.abandon()
                else:  # every rank started it (none failed to): it completes; then retry
                    self._averager.settle(self._seconds(session))
            failures += 1
            self._recover(snapshot, free=bool(votes.oom_ranks))
            self._shrink_or_raise(votes, attempt, failures, session)

    # -- one attempt -----------------------------------------------------------------------

    def _attempt(self, batch: Any, loss_fn: Callable[[Any], Any], session: Session) -> _Attempt:
        self._attempts += 1
        flag = sync.Flag(session, "microbatch", self._id, self._attempts)
        self._last_check = time.monotonic()
        self.outputs = []
        self._where = "counting the samples of the batch"
        size = total = 0
        try:
            total = self._size_fn(batch)
            size = self.tracker.effective(total)
            self._where = "splitting the batch"
            loss = self._run(batch, loss_fn, size, total, flag)
            missing: tuple[int, ...] = ()
            if self._averager is not None:
                self._where = "allocating the gradient-averaging buffers"
                self._averager.prepare()
                missing = self._averager.missing()
            return _Attempt(Vote("ok", size, total, missing=missing), loss)
        except _PeerFailed:
            return _Attempt(Vote("aborted", size, total, self._where))
        except BaseException as exc:  # the vote must happen whatever failed; re-raised below
            reason = is_oom(exc)
            flagged = self._raise_flag(flag)
            if reason is not None:  # drop the exception: its frames hold the activations
                oom = Vote("oom", size, total, f"{reason}, in {self._where}")
                return _Attempt(oom, flagged=flagged)
            detail = f"{type(exc).__name__}: {exc} (in {self._where})"[:_DETAIL_CHARS]
            return _Attempt(Vote("error", size, total, detail), None, exc, flagged)

    def _run(
        self,
        batch: Any,
        loss_fn: Callable[[Any], Any],
        size: int,
        total: int,
        flag: sync.Flag,
    ) -> torch.Tensor | None:
        parts = list(self._split_fn(batch, size)) if total else []
        weights = self._weights(parts, total)
        losses = []  # weighted and detached; summed once at the end (fewer tiny kernels)
        for index, (part, weight) in enumerate(zip(parts, weights, strict=True)):
            if index and self._peer_failed(flag):
                raise _PeerFailed
            where = f"microbatch {index + 1}/{len(parts)} (size {size})"
            self._where = f"the forward of {where}"
            with self._view.no_sync():
                loss, output = unpack_loss(loss_fn(part))
                self._where = f"the backward of {where}"
                weighted = loss * weight if weight != 1.0 else loss
                scaled = self._scaler.scale(weighted) if self._scaler is not None else weighted
                scaled.backward()
            losses.append(weighted.detach())
            if output is not None:
                self.outputs.append(detached(output))
        if not losses:
            return None
        import torch

        return losses[0] if len(losses) == 1 else torch.stack(losses).sum()

    def _weights(self, parts: list[Any], total: int) -> list[float]:
        sizes = [self._size_fn(part) for part in parts]
        if sum(sizes) != total:
            raise ConfigurationError(
                f"the microbatches hold {sum(sizes)} samples ({sizes}) but the batch has {total}: "
                "samples would be lost or counted twice. HINT: split_fn must cut the batch into "
                "parts whose size_fn values add up to size_fn(batch)."
            )
        if self._reduction == "sum":
            return [1.0] * len(parts)
        return [n / total for n in sizes]

    def _peer_failed(self, flag: sync.Flag) -> bool:
        if self._check_interval is None or not flag.usable:
            return False
        now = time.monotonic()
        if now - self._last_check < self._check_interval:
            return False  # a store round trip per short microbatch would cost more than it saves
        self._last_check = now
        return flag.is_raised()

    def _raise_flag(self, flag: sync.Flag) -> sync.Flag | None:
        """Tell the other ranks to abandon this attempt; the flag if it was raised."""
        if not flag.usable:
            return None
        with contextlib.suppress(Exception):  # a dead store shows up in the vote instead
            flag.raise_flag()
            return flag
        return None

    def _start_averaging(self, attempt: _Attempt) -> _Attempt:
        """Start the first bucket's all-reduce before the vote, on every rank alike.

        Only once a vote went well (the same on every rank, and every rank then holds its
        staging buffers); see :mod:`unidist._microbatch.averaging`.
        """
        averager = self._averager
        if not self._averaged_once or averager is None or not averager.can_start:
            return attempt
        try:
            failure = averager.start()
        except Exception as exc:  # the process group itself failed: vote so
            failure = exc
        if failure is None or attempt.vote.status == "error":
            return attempt
        vote = attempt.vote
        detail = f"{type(failure).__name__}: {failure} (in starting the gradient all-reduce)"
        error = Vote("error", vote.size, vote.total, detail[:_DETAIL_CHARS])
        return _Attempt(error, None, failure, attempt.flagged)

    def _seconds(self, session: Session) -> float:
        """The vote's timeout in seconds (the session's by default)."""
        return _env.timeout_seconds(self._timeout if self._timeout is not None else session.timeout)

    # -- agreement -------------------------------------------------------------------------

    def _vote(self, attempt: _Attempt, session: Session) -> Tally:
        if session.topology.world_size == 1:
            return Tally.of({0: attempt.vote})
        what = f"the MicroBatcher vote after attempt {self._attempts} (step {self.tracker.steps})"
        try:
            value = attempt.vote.to_json()
            votes = sync.agree(value, tally.combine, self._timeout, what, self._expected)
        except BaseException:
            if attempt.error is not None:
                raise attempt.error from None  # this rank's own failure is the real news
            raise
        finally:
            if attempt.flagged is not None:
                with contextlib.suppress(Exception):  # everyone has voted: nobody looks any more
                    attempt.flagged.lower()
        result = Tally.from_json(votes)
        if result.all_ok:  # the next vote, when nothing changes, is this one again on every rank
            self._averaged_once = self._averager is not None
            same = Vote("ok", result.size, result.ceiling, missing=tuple(sorted(result.missing)))
            self._expected = sync.ExpectedValues(same.to_json())
        return result

    def _shrink_or_raise(
        self, votes: Tally, attempt: _Attempt, failures: int, session: Session
    ) -> None:
        """Shrink for the retry, or raise on every rank (after they all read the votes)."""
        terminal: BaseException
        if votes.error_ranks:
            rank = votes.error_ranks[0]
            terminal = attempt.error or RemoteError(
                f"rank {rank} failed during MicroBatcher.step: {votes.details[rank].detail}. "
                f"Rank {session.topology.rank} stops too (failing ranks: "
                f"{list(votes.error_ranks)}). HINT: the cause is in rank {rank}'s traceback; "
                "this rank is collateral damage."
            )
        else:
            try:
                self.tracker.failed(votes, failures)  # shrinks, or says why it cannot
                return
            except BaseException as exc:
                terminal = exc
        self._acknowledge(session)
        raise terminal

    def _acknowledge(self, session: Session) -> None:
        """Wait (briefly) until every rank has read the fatal votes.

        Rank 0 hosts the store: if it raised and exited at once, a rank still reading the
        votes would see the store vanish instead of the reason.
        """
        if session.topology.world_size == 1:
            return
        seconds = _ACK_SECONDS
        if self._timeout is not None:
            seconds = min(seconds, _env.timeout_seconds(self._timeout))
        with contextlib.suppress(Exception):
            sync.timed_barrier(session, None, seconds, "MicroBatcher: acknowledging")

    # -- gradients and memory --------------------------------------------------------------

    def _session(self) -> Session:
        session = lifecycle.session_for("MicroBatcher.step")
        if self._averager is None and self._sync:
            self._averager = self._make_averager(session)
        return session

    def _make_averager(self, session: Session) -> GradientAverager | None:
        ddp = self._view.ddp
        if ddp is not None:
            import torch.distributed as dist

            group, world = ddp.process_group, dist.get_world_size(ddp.process_group)
        else:
            group, world = None, session.topology.world_size
        if world == 1:
            self._sync = False
            return None
        return GradientAverager(self._view.reduced_params(), group, world, self._bucket_bytes)

    def _recover(self, snapshot: list[tuple[torch.Tensor, torch.Tensor]], free: bool) -> None:
        """Drop the partial gradients and outputs, restore buffers; after an OOM, also collect
        garbage and return cached device memory (a full collection takes a fraction of a
        second with large frameworks imported, so not for other failures)."""
        self.outputs = []
        self._view.drop_grads()
        self._view.restore_buffers(snapshot)
        if free:
            free_memory(self._view.device_types)
