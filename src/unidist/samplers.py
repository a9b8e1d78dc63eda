"""Distributed samplers: constant memory, resumable on any number of ranks, exact-once eval.

* :class:`DistributedSampler` indexes a map-style dataset. By default it is
  ``torch.utils.data.DistributedSampler`` index for index (``order="torch"``, the epoch changes
  only through ``set_epoch``), so a script ported by renaming reads the same samples;
  ``order="fast"`` computes a seeded permutation per position instead (memory independent of
  the dataset size, indices produced with numpy).
* :class:`DistributedSamplerWrapper` shards any other sampler (weighted, custom) across ranks.
* :func:`get_sampler` builds either, or a framework's own sampler with ``native=...``.

Both samplers subclass ``torch.utils.data.DistributedSampler``, keep torch's attributes
(``num_replicas``, ``rank``, ``epoch``, ``seed``, ``drop_last``, ``num_samples``, ``total_size``)
and add ``mode="eval"``, ``order="fast"``, ``auto_epoch=True`` and ``state_dict()`` /
``load_state_dict()``, each an explicit choice.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Sized
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch.utils.data import IterableDataset

from unidist import ranks
from unidist._base.checks import check_flag, check_int
from unidist._sampling.native import SamplerRequest, native_sampler
from unidist._sampling.passes import PassSampler
from unidist._sampling.permute import (
    MASK64,
    IdentityOrder,
    Order,
    Share,
    TableOrder,
    round_keys,
    shuffled_order,
)
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["BatchSampler", "DistributedSampler", "DistributedSamplerWrapper", "get_sampler"]

ORDERS = ("fast", "torch")
#: Indices computed per numpy call: small enough that the first index comes at once.
CHUNK = 1 << 14
#: Elements drawn from a wrapped sampler per switch to its private random state.
BLOCK = 1 << 14
#: Seeds order="torch" accepts: torch's generator takes seed + epoch in [-2**63, 2**64), and
#: epochs stay below 2**63, so a seed below 2**63 can never overflow, however long the run.
_TORCH_SEEDS = (-(1 << 63), (1 << 63) - 1)


def _world_size(num_replicas: int | None, world_size: int | None) -> int | None:
    """torch's ``num_replicas`` or unidist's ``world_size``: the same thing, given once."""
    if num_replicas is not None and world_size is not None:
        raise ConfigurationError(
            f"num_replicas={num_replicas!r} and world_size={world_size!r} name the same setting "
            "(torch's and unidist's spelling). HINT: pass only one of them."
        )
    return world_size if num_replicas is None else num_replicas


def _length_of(data: object, what: str) -> tuple[int, Any]:
    """(length, dataset) of a sized dataset or a length; refuses iterable datasets."""
    if not isinstance(data, Sized | bool) and hasattr(type(data), "__index__"):
        length = check_int(data, f"{what}'s length", minimum=0)
        return length, range(length)
    if isinstance(data, IterableDataset):
        raise ConfigurationError(
            f"{what} indexes map-style datasets, but {type(data).__name__} is an "
            "IterableDataset, which has no indices. HINT: shard it with "
            "unidist.shard_iterable(dataset) and give it to a DataLoader without a sampler "
            "(or to unidist.auto_dataloader)."
        )
    if not isinstance(data, Sized):
        raise ConfigurationError(
            f"{what} needs a dataset with len() or a length, got {type(data).__name__}. "
            "HINT: pass len(dataset) if you know it, or use unidist.shard_iterable for streams."
        )
    return check_int(len(data), "len(dataset)", minimum=0), data


class DistributedSampler(PassSampler):
    """Each rank's share of a shuffled dataset, with exact resume on any number of ranks.

    Its name, positional arguments and defaults are torch's, and so are its indices: a script
    ported from ``torch.utils.data.DistributedSampler`` by renaming reads exactly the same
    samples. Epochs: as in torch, the epoch changes only through :meth:`set_epoch`, and each
    iteration without it repeats the epoch's order. ``auto_epoch=True`` (unidist's) advances
    the epoch when an iteration starts without ``set_epoch`` instead; only drawing the first
    index starts an iteration, so DataLoader's spare iterators do not count.

    Resume: :meth:`state_dict` records ``(seed, epoch, consumed)`` with ``consumed`` counted in
    the epoch's global order, which does not depend on the world size; :meth:`load_state_dict`
    then yields exactly the samples of that epoch not yet consumed, sharded over the current
    ranks. See :meth:`state_dict` for counting what the loop consumed behind a prefetching
    DataLoader (:class:`unidist.StatefulDataLoader` does it for you).

    Args:
        data: a map-style dataset with ``len()``, or the length itself.
        num_replicas: number of ranks (torch's name; default: :func:`unidist.get_world_size`).
        rank: this rank (default: :func:`unidist.get_rank`).
        shuffle: shuffle each epoch (seeded by ``seed`` and the epoch, identical on all ranks).
        seed: the shuffle's seed; every rank must pass the same one.
        drop_last: train mode: drop the tail so every rank reads ``N // world_size`` samples,
            instead of padding with samples from the epoch's start (torch's default).
        mode: ``"train"``: every rank reads the same count (torch's behaviour). ``"eval"``:
            every sample exactly once across ranks, no padding (counts differ by at most one);
            pair it with :func:`unidist.gather_in_order`. Inside Composer's ``Trainer.eval()``,
            which stops every rank when one runs out of batches, the shards are padded the way
            torch pads them and Composer strips the padding, so each sample still counts once.
        order: ``"torch"`` (default): exactly the indices of
            ``torch.utils.data.DistributedSampler`` (and so of Composer's ``get_sampler`` and
            Ignite's ``auto_dataloader``) for the same seed, epoch and world size; it builds
            ``randperm(N)`` once per epoch (8 bytes per sample, not a Python list).
            ``"fast"`` (unidist's): a Feistel permutation computed per index; memory does not
            grow with the dataset and the first index comes at once (up to 65,536 samples, an
            exact stored shuffle instead, since Feistel networks on tiny domains are biased).
            Choose it for datasets of hundreds of millions of samples, where the per-epoch
            table costs gigabytes and seconds; its order differs from torch's.
        auto_epoch: advance the epoch when an iteration starts without :meth:`set_epoch`
            (unidist's); default False: repeat the epoch, as torch does.
        world_size: ``num_replicas`` under unidist's name (give one of the two).

    Raises:
        ConfigurationError: an iterable dataset, a bad setting, or ``drop_last`` in eval mode.
    """

    def __init__(
        self,
        data: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        mode: Literal["train", "eval"] = "train",
        order: Literal["fast", "torch"] = "torch",
        auto_epoch: bool = False,
        world_size: int | None = None,
    ) -> None:
        length, dataset = _length_of(data, "DistributedSampler")
        if order not in ORDERS:
            raise ConfigurationError(
                f"order={order!r} is not one of {ORDERS}. HINT: 'torch' (the default) is "
                "torch's shuffle; 'fast' is unidist's constant-memory one."
            )
        self.order = order  # before the seed is checked: the torch order narrows its range
        super().__init__(
            length,
            dataset=dataset,
            seed=seed,
            drop_last=drop_last,
            mode=mode,
            rank=rank,
            world_size=_world_size(num_replicas, world_size),
            auto_epoch=auto_epoch,
        )
        self.shuffle = check_flag(shuffle, "shuffle")
        self._table: tuple[tuple[int, int], npt.NDArray[np.int64]] | None = None

    def _check_seed(self, seed: object, name: str) -> int:
        value = check_int(seed, name)
        if self.order == "torch" and not _TORCH_SEEDS[0] <= value <= _TORCH_SEEDS[1]:
            raise ConfigurationError(
                f"order='torch' seeds torch's generator with {name} + epoch, which must stay "
                f"within 64 bits for every epoch; got {name}={value}. HINT: use a seed in "
                "[-2**63, 2**63), or order='fast', which takes any int."
            )
        return value

    def _identity(self) -> dict[str, Any]:
        # Unshuffled, both orders are the identity, so their states are interchangeable.
        return {"kind": "DistributedSampler", "order": self.order if self.shuffle else "sequential"}

    def _global_order(self, epoch: int) -> Order:
        """The epoch's order: a function from positions (uint64 array) to dataset indices."""
        if not self.shuffle:
            return IdentityOrder()
        if self.order == "fast":
            return shuffled_order(self._length, self.seed, epoch)
        key = (self.seed, epoch)
        if self._table is None or self._table[0] != key:
            self._table = None  # free the previous epoch's table before building this one
            generator = torch.Generator()
            generator.manual_seed(self.seed + epoch)  # what torch's DistributedSampler does
            self._table = (key, torch.randperm(self._length, generator=generator).numpy())
        return TableOrder(self._table[1])

    def _chunks(self, epoch: int, share: Share) -> Iterator[list[Any]]:
        for chunk in self._array_chunks(epoch, share):
            yield chunk.tolist()

    def _array_chunks(self, epoch: int, share: Share) -> Iterator[npt.NDArray[np.int64]]:
        order, count = self._global_order(epoch), share.count
        for lo in range(0, count, CHUNK):
            yield order(share.positions(lo, min(count, lo + CHUNK)))

    def pass_indices(self, limit: int | None = None) -> npt.NDArray[np.int64]:
        """Dataset indices of this rank's current (or last) pass, as a numpy array.

        Args:
            limit: only the first ``limit`` of them.

        Raises:
            ConfigurationError: the sampler has not been iterated, or ``limit`` is too large.
        """
        record = self._pass
        if record is None:
            raise ConfigurationError(
                "the sampler has not been iterated yet, so it has no pass to describe. "
                "HINT: iterate the DataLoader over it first."
            )
        share = record.share
        count = share.count if limit is None else check_int(limit, "limit", minimum=0)
        if count > share.count:
            raise ConfigurationError(
                f"{count} values, but this rank read only {share.count} samples in its last "
                f"pass (epoch {record.epoch}). HINT: pass one value per sample the sampler gave."
            )
        return self._global_order(record.epoch)(share.positions(0, count))


class _PrivateRandom:
    """A private state for torch's, Python's and numpy's global generators, swapped in and out.

    A wrapped sampler that draws from a global generator (``RandomSampler`` without a
    ``generator`` does) then draws the same numbers on every rank, while the user's global
    generators are left exactly as they were.
    """

    def __init__(self, seed: int) -> None:
        self._torch = torch.Generator().manual_seed(seed).get_state()
        self._python = random.Random(seed).getstate()
        self._numpy = np.random.RandomState([seed & 0xFFFFFFFF, seed >> 32]).get_state()
        self._saved: tuple[Any, Any, Any] | None = None

    def __enter__(self) -> None:
        self._saved = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        torch.set_rng_state(self._torch)
        random.setstate(self._python)
        np.random.set_state(self._numpy)

    def __exit__(self, *exc: object) -> None:
        assert self._saved is not None
        self._torch, self._python, self._numpy = (
            torch.get_rng_state(),
            random.getstate(),
            np.random.get_state(),
        )
        torch.set_rng_state(self._saved[0])
        random.setstate(self._saved[1])
        np.random.set_state(self._saved[2])
        self._saved = None


class DistributedSamplerWrapper(PassSampler):
    """Shard any sampler's output across ranks (what Ignite's ``DistributedProxySampler`` does).

    Each epoch the wrapped sampler is iterated in full on every rank (its output is the epoch's
    global order) and rank ``r`` keeps positions ``r, r + W, ...``. Memory stays O(world size):
    the output is streamed, not listed. To make the output identical on every rank, the wrapped
    sampler runs with a private state of torch's, Python's and numpy's global generators, seeded
    by ``(seed, epoch)``; the global generators themselves are not touched (Ignite's proxy calls
    ``torch.manual_seed(epoch)``). A sampler with its own ``generator`` must be seeded the same
    on every rank, and then it is resumable only if it derives its state from the epoch. If the
    wrapped sampler has ``set_epoch``, it is called with the epoch first.

    Epochs (changed only by ``set_epoch`` unless ``auto_epoch=True``), modes and state work as
    in :class:`DistributedSampler`; resuming re-iterates the wrapped sampler up to the saved
    position without loading any data.

    Args:
        sampler: a sampler (any iterable with ``len()``), not already distributed.
        seed: seeds the private generators (with the epoch).
        drop_last: train mode: drop the tail instead of padding.
        mode: ``"train"`` or ``"eval"`` (every position exactly once).
        auto_epoch: advance the epoch when an iteration starts without ``set_epoch``.
        rank: this rank (default: :func:`unidist.get_rank`).
        world_size: number of ranks (default: :func:`unidist.get_world_size`).
    """

    def __init__(
        self,
        sampler: Iterable[Any],
        *,
        seed: int = 0,
        drop_last: bool = False,
        mode: Literal["train", "eval"] = "train",
        auto_epoch: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if isinstance(sampler, IterableDataset):
            raise ConfigurationError(
                f"{type(sampler).__name__} is an IterableDataset, not a sampler. HINT: split "
                "streams with unidist.shard_iterable(dataset)."
            )
        if isinstance(sampler, torch.utils.data.DistributedSampler):
            raise ConfigurationError(
                f"{type(sampler).__name__} already shards across ranks; wrapping it would shard "
                "twice. HINT: use it directly."
            )
        if not isinstance(sampler, Iterable) or not isinstance(sampler, Sized):
            raise ConfigurationError(
                f"DistributedSamplerWrapper needs a sampler with len(), got "
                f"{type(sampler).__name__}. HINT: give the sampler a __len__ (the number of "
                "indices it yields per epoch)."
            )
        length = check_int(len(sampler), "len(sampler)", minimum=0)
        super().__init__(
            length,
            dataset=sampler,
            seed=seed,
            drop_last=drop_last,
            mode=mode,
            rank=rank,
            world_size=world_size,
            auto_epoch=auto_epoch,
        )
        self.sampler = sampler
        self.shuffle = False  # the wrapped sampler decides the order

    def _identity(self) -> dict[str, Any]:
        return {"kind": "DistributedSamplerWrapper", "sampler": type(self.sampler).__qualname__}

    def _chunks(self, epoch: int, share: Share) -> Iterator[list[Any]]:
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        private = _PrivateRandom(int(round_keys(self.seed, epoch, salt=1)[0]) & MASK64)
        length, world = share.length, share.world_size
        keep_head = min(length, world) if share.policy == "pad" else 0
        head: list[Any] = []  # the epoch's first positions: padding wraps around to them
        wanted, left = share.start + share.rank, share.count
        with private:
            stream = iter(self.sampler)
        position = 0
        while position < length:
            with private:
                block = list(itertools.islice(stream, min(BLOCK, length - position)))
            if len(block) < min(BLOCK, length - position):
                self._broken(epoch, f"yielded only {position + len(block)}")
            if position < keep_head:
                head.extend(block[: keep_head - position])
            end = position + len(block)
            if left and wanted < end:
                picked = block[wanted - position :: world][:left]
                left -= len(picked)
                wanted += len(picked) * world
                yield picked
            position = end
        with private:
            extra = next(stream, _END)
        if extra is not _END:
            self._broken(epoch, "yielded more")
        if left:  # padding: positions past the end wrap to the start of the epoch
            yield [head[(wanted + j * world) % length] for j in range(left)]

    def _broken(self, epoch: int, what: str) -> None:
        raise ConfigurationError(
            f"{type(self.sampler).__name__} has len() = {self._length} but {what} in epoch "
            f"{epoch}. HINT: its __len__ must be the number of indices one iteration yields."
        )


_END = object()


def get_sampler(
    dataset: Sized | int | None,
    *,
    shuffle: bool | None = None,
    drop_last: bool = False,
    num_replicas: int | None = None,
    rank: int | None = None,
    seed: int = 0,
    mode: Literal["train", "eval"] = "train",
    order: Literal["fast", "torch"] = "torch",
    auto_epoch: bool = False,
    sampler: Iterable[Any] | None = None,
    native: bool | Literal["torch", "composer", "ignite"] = False,
    world_size: int | None = None,
) -> torch.utils.data.DistributedSampler[Any]:
    """A distributed sampler for ``dataset`` (Composer's ``dist.get_sampler``, with more).

    Composer's keywords keep Composer's meaning and defaults: ``shuffle`` defaults to False
    (torch's ``DistributedSampler`` and :func:`unidist.auto_dataloader` default to True), and
    the indices are exactly those of Composer's sampler (torch's), epoch by epoch, with the
    epoch changed only by ``set_epoch``. unidist's additions are explicit: ``order="fast"``,
    ``auto_epoch=True``, ``mode="eval"``, ``sampler=...``.

    Args:
        dataset: a map-style dataset or its length (ignored when ``sampler`` is given).
        shuffle: shuffle each epoch (default False, as in Composer). Not allowed with
            ``sampler``.
        drop_last: train mode: drop the tail instead of padding.
        num_replicas: number of ranks (Composer's and torch's name; default:
            :func:`unidist.get_world_size`).
        rank: this rank (default: :func:`unidist.get_rank`).
        seed: seed of the shuffle (or of the wrapped sampler's private generators).
        mode: ``"train"`` or ``"eval"`` (see :class:`DistributedSampler`).
        order: ``"torch"`` (default) or ``"fast"`` (see :class:`DistributedSampler`).
        auto_epoch: advance the epoch when an iteration starts without ``set_epoch``.
        sampler: shard this sampler's output instead (:class:`DistributedSamplerWrapper`).
        native: return the framework's own sampler instead: ``"torch"``
            (``torch.utils.data.DistributedSampler``), ``"composer"``
            (``composer.utils.dist.get_sampler``), ``"ignite"`` (what Ignite's
            ``auto_dataloader`` injects: torch's sampler, or ``DistributedProxySampler`` around
            ``sampler``), or True for the framework of the running adapter.
        world_size: ``num_replicas`` under unidist's name (give one of the two).

    Raises:
        ConfigurationError: conflicting arguments, or an option the native sampler lacks.
        AdapterUnavailableError: ``native`` names a framework that is not installed.
    """
    if sampler is not None and shuffle is not None:
        raise ConfigurationError(
            "shuffle cannot be combined with sampler: the wrapped sampler decides the order. "
            "HINT: drop shuffle, or shuffle inside your sampler."
        )
    world_size = _world_size(num_replicas, world_size)
    if native is not False:
        world = world_size if world_size is not None else ranks.get_world_size()
        me = rank if rank is not None else ranks.get_rank()
        if mode != "train":
            raise ConfigurationError(
                f"native samplers pad every rank to the same count; mode={mode!r} is unidist's. "
                "HINT: use native=False for exact-once evaluation."
            )
        if order != "torch" or auto_epoch:
            raise ConfigurationError(
                f"native={native!r} returns the framework's own sampler, which has torch's order "
                f"and epochs; order={order!r}, auto_epoch={auto_epoch!r} are unidist's. "
                "HINT: drop them, or use native=False."
            )
        shuffled = check_flag(False if shuffle is None else shuffle, "shuffle")
        request = SamplerRequest(dataset, sampler, shuffled, drop_last, seed, me, world)
        return native_sampler(native, request)
    if sampler is not None:
        return DistributedSamplerWrapper(
            sampler,
            seed=seed,
            drop_last=drop_last,
            mode=mode,
            auto_epoch=auto_epoch,
            rank=rank,
            world_size=world_size,
        )
    if dataset is None:
        raise ConfigurationError("get_sampler needs a dataset (or sampler=...), got None.")
    return DistributedSampler(
        dataset,
        shuffle=False if shuffle is None else shuffle,
        seed=seed,
        drop_last=drop_last,
        mode=mode,
        order=order,
        auto_epoch=auto_epoch,
        rank=rank,
        world_size=world_size,
    )


class BatchSampler(torch.utils.data.BatchSampler):
    """torch's ``BatchSampler``: the same arguments, checks and batches, a chunk at a time.

    Over a unidist sampler (:class:`DistributedSampler`, :class:`DistributedSamplerWrapper`)
    the batches are cut from the sampler's chunks of indices in C, instead of torch's Python
    loop over every index; over any other sampler it is torch's own iteration. Give it to a
    ``DataLoader`` as ``batch_sampler=`` (the loader then has ``batch_size=None``, as with any
    batch sampler)::

        sampler = unidist.DistributedSampler(dataset, order="fast")
        loader = DataLoader(dataset, batch_sampler=unidist.BatchSampler(sampler, 256, False))

    ``bench/samplers.py`` measures it against torch's ``DistributedSampler`` +
    ``BatchSampler``.
    """

    def __iter__(self) -> Iterator[list[int]]:
        if isinstance(self.sampler, PassSampler):
            return self.sampler.batches(self.batch_size, self.drop_last)
        return super().__iter__()
