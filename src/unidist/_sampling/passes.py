"""Epochs, passes and resumable state shared by unidist's samplers.

A *pass* is one iteration of the sampler: it reads this rank's
:class:`~unidist._sampling.permute.Share` of one epoch, from the epoch's start or from where a
resumed run stopped. The state that survives a restart is ``(seed, epoch, consumed)``, where
``consumed`` counts *global* positions of the epoch's order, so it means the same thing on any
number of ranks.

How many samples the training loop has taken (as opposed to how many the sampler has handed to
a prefetching DataLoader) is known, in order of preference, from ``state_dict(consumed=...)``,
from :class:`unidist.StatefulDataLoader` (which reports each delivered batch), or from what the
sampler has yielded (exact only with ``num_workers=0``).
"""

from __future__ import annotations

import itertools
import operator
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import DistributedSampler as _TorchDistributedSampler

from unidist import ranks
from unidist._base.checks import INT64_LIMIT, check_flag, check_int
from unidist._sampling.permute import Share
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "LIMIT",
    "MODES",
    "STATE_FORMAT",
    "PassSampler",
    "composer_eval_running",
]

MODES = ("train", "eval")
STATE_FORMAT = "unidist.sampler/1"
#: Lengths and epochs stay below this: indices and epochs are signed 64-bit integers in torch and
#: numpy, and a larger length would wrap around into negative indices.
LIMIT = INT64_LIMIT


def composer_eval_running() -> bool:
    """Whether this thread is inside Composer's ``Trainer`` evaluation loop.

    Cheap when Composer's trainer was never imported; otherwise a walk up this thread's stack
    (the sampler is asked once per pass and once per ``len()``).
    """
    trainer = "composer.trainer.trainer"
    if trainer not in sys.modules:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_eval_loop" and frame.f_globals.get("__name__") == trainer:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class _Pass:
    """Bookkeeping of one iteration: what was handed out and what the loop consumed."""

    __slots__ = (
        "base",
        "chunk",
        "epoch",
        "exhausted",
        "it",
        "loader_consumed",
        "loader_done",
        "share",
        "unit",
    )

    def __init__(self, epoch: int, share: Share) -> None:
        self.epoch = epoch
        self.share = share
        self.base = 0  # reads handed out before the current chunk
        self.chunk = 0  # length of the current chunk
        self.it: Iterator[Any] | None = None  # the current chunk's list iterator
        self.unit = 1  # reads per item of that list: 1 for indices, the batch size for batches
        self.exhausted = False
        self.loader_consumed: int | None = None  # reported by StatefulDataLoader
        self.loader_done = False

    def yielded(self) -> int:
        if self.exhausted:
            return self.share.count
        left = operator.length_hint(self.it) if self.it is not None else 0
        return self.base + (self.chunk - left) * self.unit

    def follow(self, items: list[Any], unit: int) -> Iterator[Any]:
        """Hand out ``items`` next, ``unit`` reads each; kept so :meth:`yielded` can count."""
        self.base += self.chunk * self.unit
        self.chunk, self.unit = len(items), unit
        self.it = iter(items)
        return self.it


class PassSampler(_TorchDistributedSampler[int]):
    """Base of unidist's distributed samplers: epochs, passes, state, torch-compatible fields.

    It subclasses ``torch.utils.data.DistributedSampler`` so that frameworks which test for one
    (Composer's ``DataSpec`` and Trainer, Ignite's ``auto_dataloader``, Lightning) accept it and
    call its ``set_epoch``. Subclasses provide :meth:`_chunks` and :meth:`_identity`.
    """

    def __init__(
        self,
        length: int,
        *,
        dataset: Any,
        seed: int,
        drop_last: bool,
        mode: str,
        rank: int | None,
        world_size: int | None,
        auto_epoch: bool = False,
    ) -> None:
        # torch's __init__ is not called: it needs a process group and computes a padded length.
        check_int(length, "the dataset's length", minimum=0, below=LIMIT)
        if mode not in MODES:
            raise ConfigurationError(f"mode={mode!r} is not one of {MODES}.")
        if mode == "eval" and drop_last:
            raise ConfigurationError(
                "mode='eval' reads every sample exactly once, so drop_last=True contradicts it. "
                "HINT: drop drop_last, or use mode='train' to make every rank read the same count."
            )
        world = ranks.get_world_size() if world_size is None else world_size
        world = check_int(world, "world_size", minimum=1)
        rank = check_int(ranks.get_rank() if rank is None else rank, "rank", minimum=0)
        if rank >= world:
            raise ConfigurationError(
                f"rank={rank} is not below world_size={world}. HINT: ranks count from 0."
            )
        self.dataset = dataset
        self.num_replicas = world
        self.rank = rank
        self.seed = self._check_seed(seed, "seed")
        self.drop_last = check_flag(drop_last, "drop_last")
        self.mode = mode
        self.auto_epoch = check_flag(auto_epoch, "auto_epoch")
        self._length = length
        self._epoch = 0
        self._start = 0  # global position where the next pass begins
        self._pending = False  # _start was restored by load_state_dict
        self._used = False  # a pass over _epoch has begun: the next one restarts (or advances)
        self._pass: _Pass | None = None

    # -- what subclasses provide -----------------------------------------------------------------

    def _chunks(self, epoch: int, share: Share) -> Iterator[list[Any]]:
        """This rank's reads of one pass, in order, as lists."""
        raise NotImplementedError

    def _array_chunks(self, epoch: int, share: Share) -> Iterator[npt.NDArray[np.int64]] | None:
        """This rank's reads as int64 arrays, where they are plain indices (else None)."""
        return None

    def _identity(self) -> dict[str, Any]:
        """Settings that define the global order; a state from other settings is refused."""
        raise NotImplementedError

    def _check_seed(self, seed: object, name: str) -> int:
        """The seed as an int; a subclass narrows the range its order can use."""
        return check_int(seed, name)

    # -- torch-compatible surface ----------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) pass reads. Setting it is :meth:`set_epoch`."""
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.set_epoch(value)

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """Samples this rank reads in the current pass, or in the next one (``len(sampler)``)."""
        return self._upcoming().count

    @property
    def total_size(self) -> int:  # type: ignore[override]
        """Samples all ranks read together in that pass; equals the length in eval mode."""
        return self._upcoming().total

    @property
    def policy(self) -> str:
        if self.mode == "eval":
            # Composer's Trainer.eval() stops every rank as soon as one runs out of batches, so
            # shards of unequal length would lose the longer shards' last samples there. It
            # strips the padding of torch's sampler itself (the last sample of the last batch on
            # the last ranks), so inside its eval loop the shards are padded the way torch pads
            # them: every sample is still evaluated exactly once.
            uneven = self._length % self.num_replicas != 0
            return "pad" if uneven and composer_eval_running() else "exact"
        return "drop" if self.drop_last else "pad"

    def __len__(self) -> int:
        return self._upcoming().count

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` in the next pass, from its start.

        As in torch, it is the only way the epoch changes, unless the sampler was built with
        ``auto_epoch=True``: then an iteration that starts without it reads the epoch after the
        previous pass's. After :meth:`load_state_dict`, ``set_epoch`` of the restored epoch keeps
        the restored position, so a loop that calls ``set_epoch(epoch)`` first thing resumes.
        """
        epoch = check_int(epoch, "epoch", minimum=0, below=LIMIT)
        if self._pending and epoch == self._epoch:
            return
        self._epoch, self._start, self._used, self._pending = epoch, 0, False, False

    def __iter__(self) -> Iterator[int]:
        # Lazy: nothing happens until the first index is drawn. DataLoader creates and drops an
        # unused iterator when it starts workers, which must not advance the epoch. Indices flow
        # through C iterators (chain over list iterators); Python runs once per chunk.
        return itertools.chain.from_iterable(self._iterate())

    def batches(self, batch_size: int, drop_last: bool) -> Iterator[list[Any]]:
        """This pass as lists of ``batch_size`` indices: what ``BatchSampler(self, ...)`` yields.

        The same batches as torch's ``BatchSampler`` over this sampler, cut a chunk at a time:
        a chunk of plain indices becomes its rows of Python ints in one numpy call, and the
        batches flow through C iterators, so Python runs once per chunk, not once per batch.
        What was handed out is counted per batch, so :meth:`state_dict` between batches
        resumes at the next one.
        """
        # Lazy like __iter__: the pass begins when the first batch is drawn.
        return itertools.chain.from_iterable(self._batch_runs(batch_size, drop_last))

    def _batch_runs(self, size: int, drop_last: bool) -> Iterator[Iterator[list[Any]]]:
        record = self._begin()
        arrays = self._array_chunks(record.epoch, record.share)
        tail: list[Any]
        if arrays is not None:
            carry: npt.NDArray[np.int64] | None = None
            for chunk in arrays:
                if carry is not None and len(carry):
                    chunk = np.concatenate((carry, chunk))
                full = len(chunk) // size * size
                carry = chunk[full:]
                if full:
                    yield record.follow(chunk[:full].reshape(-1, size).tolist(), size)
            tail = [] if carry is None else carry.tolist()
        else:
            tail = []
            for items in self._chunks(record.epoch, record.share):
                if tail:
                    items = tail + items
                full = len(items) // size * size
                tail = items[full:]
                if full:
                    rows = [items[lo : lo + size] for lo in range(0, full, size)]
                    yield record.follow(rows, size)
        if tail and not drop_last:
            yield record.follow([tail], len(tail))
        record.exhausted = True

    def _iterate(self) -> Iterator[Iterator[Any]]:
        record = self._begin()
        for chunk in self._chunks(record.epoch, record.share):
            yield record.follow(chunk, 1)
        record.exhausted = True

    def _begin(self) -> _Pass:
        if self._used:  # a new iteration without set_epoch: repeat it, as torch does, or move on
            self._epoch += 1 if self.auto_epoch else 0
            self._start = 0
        self._used, self._pending = True, False
        record = _Pass(self._epoch, self._share(self._start))
        self._pass = record
        return record

    def _share(self, start: int) -> Share:
        return Share(self._length, self.num_replicas, self.rank, start, self.policy)

    def _live(self) -> _Pass | None:
        """The pass over the sampler's epoch that has begun, if any."""
        record = self._pass
        if record is None or not self._used or record.epoch != self._epoch:
            return None
        return record

    def _upcoming(self) -> Share:
        record = self._live()
        if record is not None and not (record.loader_done or record.exhausted):
            return record.share
        return self._share(0 if self._used else self._start)

    # -- state -----------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where this run is: seed, epoch and the global number of samples consumed.

        Resume is exact when the count is what the training loop consumed, not what a
        prefetching DataLoader drew: with :class:`unidist.StatefulDataLoader` (what
        :func:`unidist.auto_dataloader` returns) it is counted for you; with a plain
        ``DataLoader`` and ``num_workers=0`` the sampler's own count is exact; otherwise pass
        ``consumed``. Ranks consume in lockstep in data-parallel training, so any rank's state
        describes the whole job (in eval mode take rank 0's).

        Args:
            consumed: samples this rank's loop has taken in the current pass (since the
                iteration began, e.g. ``batches_done * batch_size``).
        """
        record = self._live()
        if record is None:
            if consumed:
                raise ConfigurationError(
                    f"consumed={consumed} but no iteration of epoch {self._epoch} has started. "
                    "HINT: pass consumed only while iterating."
                )
            return self._state(self._epoch, self._start)
        share = record.share
        if consumed is not None:
            reads = check_int(consumed, "consumed", minimum=0)
            if reads > share.count:
                raise ConfigurationError(
                    f"consumed={reads} is more than the {share.count} samples this rank reads "
                    f"in this pass of epoch {record.epoch}."
                )
            finished = False
        elif record.loader_consumed is not None:
            reads, finished = record.loader_consumed, record.loader_done
        else:
            reads, finished = record.yielded(), record.exhausted
        if finished:  # the loop is past the end of the epoch: the next one starts afresh
            return self._state(record.epoch + 1, 0)
        return self._state(record.epoch, share.consumed_after(reads))

    def _state(self, epoch: int, consumed: int) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            **self._identity(),
            "length": self._length,
            "seed": self.seed,
            "epoch": epoch,
            "consumed": consumed,
            "world_size": self.num_replicas,
        }

    @staticmethod
    def saved_epoch(state: object) -> object | None:
        """The ``"epoch"`` of ``state`` when it is what :meth:`state_dict` returns (recognised
        by its format tag), else None. The value is as saved: check it before use."""
        if isinstance(state, Mapping) and state.get("format") == STATE_FORMAT:
            return state.get("epoch")
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`, on this or any other number of ranks.

        The next pass reads the samples of the saved epoch that had not been consumed, sharded
        over the current ranks; no sample of that epoch is read twice or skipped (in train mode
        with padding, the usual wrap-around fills the last round). Restores the seed too.

        Raises:
            ConfigurationError: the state is not a sampler state, or it was saved for another
                dataset length or order (the remaining samples would not be the right ones).
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ConfigurationError(
                f"not a unidist sampler state: {state!r:.200}. HINT: pass what "
                "sampler.state_dict() (or loader.state_dict()['sampler']) returned."
            )
        expected = {**self._identity(), "length": self._length}
        differs = {k: (state.get(k), v) for k, v in expected.items() if state.get(k) != v}
        if differs:
            described = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in differs.items())
            raise ConfigurationError(
                f"the sampler state was saved with other settings ({described}), so the "
                "samples left in its epoch cannot be worked out. HINT: build the sampler over "
                "the same dataset with the same order settings as the run that saved it."
            )
        epoch = check_int(state.get("epoch"), "state['epoch']", minimum=0, below=LIMIT)
        consumed = check_int(state.get("consumed"), "state['consumed']", minimum=0)
        if consumed > self._length:
            raise ConfigurationError(
                f"state['consumed']={consumed} exceeds the dataset length {self._length}."
            )
        self.seed = self._check_seed(state.get("seed"), "state['seed']")
        self._epoch, self._start = epoch, consumed
        self._used, self._pending, self._pass = False, True, None

    def _loader_progress(self, delivered_samples: int, done: bool) -> None:
        """Called by StatefulDataLoader: the loop has received this many samples of the pass."""
        record = self._pass
        if record is not None:
            record.loader_consumed = min(delivered_samples, record.share.count)
            record.loader_done = done
