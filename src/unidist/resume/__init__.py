"""Resume a training loop where it stopped, on whatever number of ranks the restart has.

:class:`ResumableState` joins what an elastic job needs to read every sample exactly once
while nodes come and go: the model and optimizer (saved with ``torch.distributed.checkpoint``,
which reshards on load), the data loader's position in its epoch (unidist's samplers resume on
any number of ranks), the epoch, the step and each rank's random states. It saves every
``save_every`` steps, and when the launcher stops the job (SIGTERM: torch's elastic agent sends
it before a membership change, schedulers before preemption) every rank finishes its step,
saves, and leaves::

    state = unidist.ResumableState("checkpoints", job="run-7", model=model,
                                   optimizer=optimizer, loader=loader, save_every=50)
    for epoch in state.epochs(10):      # from the saved epoch, with the loader's position
        for x, y in loader:             # the rest of that epoch, sharded over today's ranks
            train_step(x, y)
            state.step()                # counts, saves when due, stops when told to

Exactly once holds when every rank takes the same number of batches per step and the global
batch (``world size * per-rank batch``) stays the same across restarts; see
docs/guides/elastic.md for what the arithmetic can and cannot keep bit-identical.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from unidist import ranks
from unidist._base.checks import check_flag, check_int
from unidist.collectives import all_reduce
from unidist.collectives.sync import barrier
from unidist.environments import variables as _env
from unidist.errors import CheckpointError, ConfigurationError, DistributedTimeoutError
from unidist.hangs import stacks
from unidist.resume import (
    _at_exit,
    _dcp,
    _folder as files,
    _inputs,
    _manifest as records,
    _random,
    _storage as store,
)
from unidist.resume._handle import Dir
from unidist.resume._lock import RunLock
from unidist.resume._remote import Url, is_url, redact, secrets_of
from unidist.resume._staged import Staged
from unidist.resume._stopping import StopSignals, StopVote, default_stop_signals
from unidist.resume._storage import Folder

__all__ = ["ResumableState"]

log = logging.getLogger("unidist.resume")


class ResumableState:
    """A training loop's position, saved atomically and restored on any number of ranks.

    Args:
        folder: the checkpoint folder, shared by every node (as torch's distributed checkpoint
            needs). Created private (0700) if missing; one that another user owns or can
            write to is refused, because torch's checkpoint metadata is a pickle. Or an object
            store's URL (``s3://bucket/run``, ``gs://...``; any fsspec protocol, with its
            driver installed: ``pip install 'pytorch-unidist[s3]'``), the endpoint and
            credentials taken from the usual variables (``AWS_ENDPOINT_URL``, ...).
        job: the name of this training run. A folder holding another job's checkpoints is an
            error, not something to resume from (Composer's autoresume asks for ``run_name``
            for the same reason).
        model: saved and loaded with ``torch.distributed.checkpoint`` (DDP, FSDP and plain
            modules alike; ``get_state_dict``/``set_state_dict`` handle the wrappers).
        optimizer: saved with the model (needs ``model``).
        stateful: anything else with ``state_dict()``/``load_state_dict()`` to save with them,
            by name: ``{"scheduler": scheduler, "scaler": scaler, "metric": metric}``. Saved
            through ``torch.distributed.checkpoint`` as well (tensors resharded on load), and
            loaded back into the same objects.
        loader: what yields the data and knows its position: a :class:`unidist.StatefulDataLoader`
            (what :func:`unidist.auto_dataloader` returns) or a unidist sampler; anything with
            ``state_dict()`` (plain JSON) and ``load_state_dict()``.
        save_every: save after every this many steps (``None``: only on a stop signal or an
            explicit :meth:`save`).
        keep: complete checkpoints kept; older ones are removed after each save.
        stop_signals: signals that mean "save and stop at the next step" (handlers are set in
            :meth:`restore` and put back by :meth:`close`). Default: SIGTERM (torch's agent,
            Kubernetes, ``scancel``), and SIGUSR1 (SLURM's ``--signal=USR1@SECONDS``, sent
            before a job's time runs out) when no handler of the script's has it. ``()``
            leaves signals alone.
        async_save: the saves :meth:`step` makes return once the state is copied to host
            memory; torch's ``async_save`` writes it on a thread while training goes on, and
            rank 0 makes it count once every rank has written. :meth:`save` still returns once
            the checkpoint counts.
        grace: seconds the platform gives between its stop signal and SIGKILL (SLURM's
            ``@SECONDS``, Kubernetes' ``terminationGracePeriodSeconds``, torch's agent: 30).
            When a stop comes and a save (timed on the saves so far) would not end in time on
            every rank, no rank starts one: each says so and leaves, and the checkpoint in force
            stays so, rather than a save cut short by SIGKILL. ``None``: always save.
        stop_timeout: seconds a rank that agreed to stop (another rank got the signal) waits
            for its own launcher's signal before it raises instead.
        timeout: seconds each rank waits for the others while saving, and each operation on
            an object store may take (an endpoint that never answers costs this long, then a
            ``CheckpointError`` that says so).
        storage_options: options for fsspec's driver of an object store's URL (as
            ``fsspec.open(url, **storage_options)`` takes them).
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        job: str,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        stateful: Mapping[str, Any] | None = None,
        loader: Any = None,
        save_every: int | None = None,
        keep: int = 2,
        stop_signals: tuple[int, ...] | None = None,
        stop_timeout: float | timedelta = 60.0,
        grace: float | timedelta | None = None,
        timeout: float | timedelta = 300.0,
        async_save: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(job, str) or not job.strip():
            raise ConfigurationError(
                f"job={job!r}: ResumableState needs the name of the training run, so that it "
                "never resumes another run's checkpoint. HINT: job='my-run-1'."
            )
        if model is not None and not isinstance(model, torch.nn.Module):
            raise ConfigurationError(f"model={type(model).__name__} is not a torch.nn.Module.")
        if optimizer is not None and model is None:
            raise ConfigurationError(
                "optimizer= was given without model=: the optimizer's state is saved by "
                "parameter name, which comes from the model. HINT: pass model= too."
            )
        if loader is not None and not _inputs.has_state(loader):
            raise ConfigurationError(
                f"loader={type(loader).__name__} has no state_dict()/load_state_dict(), so "
                "its position in the epoch cannot be saved. HINT: use unidist.auto_dataloader "
                "or unidist.StatefulDataLoader, or pass the unidist sampler itself."
            )
        self._location = folder  # as given: a URL may hold credentials, never shown
        self.storage_options = dict(storage_options or {})
        self._secrets = secrets_of(self.storage_options, str(folder) if is_url(folder) else "")
        #: The checkpoint folder: a Path, or an object store's URL without its credentials.
        self.root: Path | Url = (
            Url(redact(str(folder), self._secrets)) if is_url(folder) else Path(folder)
        )
        self.job = job
        self.model = model
        self.optimizer = optimizer
        self.stateful = _inputs.check_stateful(stateful)
        self.loader = loader
        self.save_every = (
            None if save_every is None else check_int(save_every, "save_every", minimum=1)
        )
        self.keep = check_int(keep, "keep", minimum=1)
        self.stop_timeout = _env.timeout_seconds(stop_timeout, "stop_timeout")
        self.grace = None if grace is None else _env.timeout_seconds(grace, "grace")
        self._save_seconds = 0.0  # the longest save of this run so far
        self.async_save = check_flag(async_save, "async_save")
        self._staged: Staged | None = None  # this rank's async save in flight
        self._save_group: Any = None  # the gloo group of torch's async saves' collectives
        self.timeout = _env.timeout_seconds(timeout)
        self.epoch = 0
        self.extra: dict[str, Any] = {}
        self.resumed_from: int | None = None
        self._steps = 0
        self._restored: bool | None = None
        #: The step of the latest checkpoint saved or restored: it counts once rank 0's commit
        #: has replaced latest.json (a failed one gives way to the one before it).
        self._in_force: int | None = None
        self._counted_before: int | None = None  # the one in force before the latest save
        self._stops = StopSignals(default_stop_signals() if stop_signals is None else stop_signals)
        self._vote = StopVote()
        self._root: Folder | None = None
        self._lock: RunLock | None = None
        self._commit = files.Commit(self._redacted)

    @property
    def steps(self) -> int:
        """Steps done since the run began, across restarts."""
        return self._steps

    # -- restore -------------------------------------------------------------------------------

    def restore(self) -> bool:
        """Load the latest checkpoint if there is one (on every rank); True if one was loaded.

        :meth:`epochs` calls it; call it yourself to look at :attr:`steps` or :attr:`extra`
        first. Every rank must see the same checkpoint (a folder that is not shared is
        refused). Rank 0 takes the folder's lock here, for the run's life (until
        :meth:`close`): a second run on the same folder is refused before it writes anything.

        Raises:
            CheckpointError: the checkpoint is another job's, cannot be trusted (owner, mode,
                links, or a folder above it that others can write to), is damaged, does not fit
                the model, optimizer or loader given, or another run holds the folder.
        """
        if self._restored is not None:
            return self._restored
        problem: CheckpointError | None = None
        found = -1
        try:
            self._open()
            assert self._root is not None
            files.Commit.wait_for(self._root)  # another state of this process saving here
            found = files.latest(self._root, self.job)
            if ranks.get_rank() == 0:  # alone in the folder (locked, if it is local):
                files.drop_newer(self._root, found)  # saves that never counted
        except CheckpointError as exc:
            problem = exc
        world = ranks.get_world_size()
        # One reduction for three facts: the lowest rank that could not use the folder (as
        # world - rank, so that MAX finds it), and the highest and lowest step found.
        import torch

        facts = torch.tensor(
            [world - ranks.get_rank() if problem else 0, found, -found], dtype=torch.int64
        )
        bad, highest, lowest = (int(v) for v in all_reduce(facts, "max"))
        lowest = -lowest
        if bad:
            self._shut()
            raise problem or CheckpointError(
                f"rank {world - bad} could not use the checkpoint folder {self.root}; its error "
                "says why."
            )
        if highest != lowest:
            self._shut()
            raise CheckpointError(
                f"the ranks found different checkpoints in {self.root} (steps {lowest} to "
                f"{highest}; -1 is none): the folder must be one that every node shares. "
                "HINT: put it on a shared file system."
            )
        try:
            if found >= 0:
                self._load(found)
        except BaseException:
            self._shut()
            raise
        self._vote.start()
        self._start_save_group()
        self._stops.install()
        self._restored = found >= 0
        return self._restored

    def _start_save_group(self) -> None:
        """A gloo group for torch's async saves alone (collective: every rank calls it)."""
        if not self.async_save or self._save_group is not None or ranks.get_world_size() < 2:
            return
        import torch.distributed as dist

        from unidist.errors import translate_errors

        if dist.is_available() and dist.is_initialized():
            with translate_errors("creating the gloo group of ResumableState's async saves"):
                self._save_group = dist.new_group(
                    backend="gloo", timeout=timedelta(seconds=self.timeout)
                )

    def _finish_staged(self) -> None:
        """Wait for this rank's async save in flight (and time it for the grace)."""
        staged, self._staged = self._staged, None
        if staged is not None:
            staged.wait()
            if staged.seconds is not None:
                self._save_seconds = max(self._save_seconds, staged.seconds)

    def _open(self) -> None:
        """Open (or create) the folder through its checked handle; rank 0 takes the lock."""
        if self._root is None:
            self._root = store.open_root(
                self._location, self.storage_options, create=True, timeout=self.timeout
            )
        if self._lock is None and ranks.get_rank() == 0 and isinstance(self._root, Dir):
            self._lock = RunLock.acquire(
                self._root, job=self.job, run_id=_env.run_id(), timeout=self.timeout
            )

    def _shut(self) -> None:
        """Let go of the lock and the folder's handle (reopened by the next use)."""
        _at_exit.forget(self)
        try:
            self._finish_staged()
            self._commit.join()
        finally:
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()
            root, self._root = self._root, None
            if root is not None:
                root.close()

    def _load(self, step: int) -> None:
        assert self._root is not None
        where = self._root.path / files.step_name(step)
        problem: CheckpointError | None = None
        folder: Folder | None = None
        try:
            folder = self._root.open_dir(files.step_name(step))
            if ranks.get_rank() == 0:  # one rank, not W ranks, lists the W files
                folder.check_tree()
        except CheckpointError as exc:
            problem = exc
        if all_reduce(int(problem is not None), "max"):
            if folder is not None:
                folder.close()
            raise problem or CheckpointError(
                f"another rank refused the checkpoint {where}; its error says why."
            )
        assert folder is not None
        with folder:
            self._load_from(folder, step)

    def _load_from(self, folder: Folder, step: int) -> None:
        where = folder.path
        progress = files.read_record(folder, files.PROGRESS, "progress record")
        path = where / files.PROGRESS
        files.check_job(progress, path, self.job)
        if records.count(progress, "step", path) != step:
            raise CheckpointError(
                f'{path}: field "step" is {progress.get("step")!r}, not {step} as the folder\'s '
                "name says: the checkpoint is damaged. HINT: delete latest.json to fall back "
                "to starting afresh, or point it at another step-* folder."
            )
        epoch = records.count(progress, "epoch", path)
        saved_world = records.count(progress, "world_size", path, minimum=1)
        extra = records.mapping(progress, "extra", path)
        data = progress.get("loader")
        rank, same_world = ranks.get_rank(), saved_world == ranks.get_world_size()
        # With a model, each rank's random state is in torch's files (rng.r<rank>.*); without
        # one, in rng-r<rank>.json.
        in_torch = self._in_torch and not folder.exists(files.rng_name(rank))
        rng: dict[str, Any] | None = None
        if self._in_torch:
            rng = self._load_model(folder, rank if same_world and in_torch else None)
        if self.loader is not None:
            if data is None:
                raise CheckpointError(
                    f"the checkpoint {where} holds no data position (it was saved without "
                    "loader=), so the rest of its epoch is unknown. HINT: start a new folder, "
                    "or resume without loader= to restart the epoch on purpose."
                )
            try:
                self.loader.load_state_dict(data)
            except Exception as exc:  # a loader of the user's may raise anything on bad data
                raise CheckpointError(
                    f'{path}: field "loader" does not fit the loader: {exc!r:.400}'
                ) from exc
        self.epoch = _inputs.epoch_of(data, epoch, path)
        self._steps = step
        self.extra = dict(extra)
        if same_world and rng is not None:
            _random.set_random(
                _random.random_from_tensors(rng), where / f"rng.r{rank} (in torch's files)"
            )
        elif same_world:
            name = files.rng_name(rank)
            _random.set_random(files.read_record(folder, name, "random state"), where / name)
        else:  # rank r of another world size has no counterpart to take its random state from
            log.info(
                "random states not restored: saved on %s ranks, now %s",
                saved_world,
                ranks.get_world_size(),
            )
        self.resumed_from = self._in_force = self._steps
        log.info("resumed from %s (epoch %s, step %s)", where, self.epoch, self._steps)

    def _shown(self, exc: BaseException) -> str:
        """An error's text as a message may show it: no credentials of the storage's."""
        return redact(str(exc), self._secrets)[:2000]

    def _redacted(self, text: str) -> str:
        """``text`` as a message may show it: no credentials of the storage's."""
        return redact(text, self._secrets)

    @property
    def _in_torch(self) -> bool:
        """Whether this state saves through torch.distributed.checkpoint (a model or stateful)."""
        return self.model is not None or bool(self.stateful)

    def _load_model(self, folder: Folder, rng_rank: int | None) -> dict[str, Any] | None:
        """Load the model, optimizer and stateful objects (and rank ``rng_rank``'s random
        state: returned)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import set_state_dict

        where = folder.path
        state = self._model_state()
        if rng_rank is not None:
            state["rng"] = {f"r{rng_rank}": _random.rng_slots(folder, rng_rank)}
        try:
            with _dcp.quiet_checkpoint(ranks.get_world_size()):
                # Through the checked handle: torch reopens nothing by the folder's path.
                dcp.load(state, storage_reader=folder.reader())
        except (Exception, CheckpointException) as exc:  # torch's is a BaseException
            names = ", ".join(["model", *(["optimizer"] if self.optimizer else [])])
            names += "".join(f", {name!r}" for name in self.stateful)
            raise CheckpointError(
                f"the checkpoint {where} does not fit this model and optimizer ({names}): "
                f"{self._shown(exc)}. HINT: build the same model, optimizer and stateful objects "
                "as the run that saved it."
            ) from exc
        if self.model is not None:
            set_state_dict(
                self.model,
                self.optimizer if self.optimizer is not None else (),
                model_state_dict=state["model"],
                optim_state_dict=state.get("optim", {}),
            )
        for name, obj in self.stateful.items():
            try:
                obj.load_state_dict(state["stateful"][name])
            except Exception as exc:
                raise CheckpointError(
                    f"the checkpoint {where} holds a state for {name!r} that "
                    f"{type(obj).__name__}.load_state_dict refuses: {exc!r:.300}"
                ) from exc
        return None if rng_rank is None else state["rng"][f"r{rng_rank}"]

    def _model_state(self) -> dict[str, Any]:
        """What torch.distributed.checkpoint saves and loads: the model and optimizer (through
        ``get_state_dict``, which handles DDP and FSDP), and each stateful object's state."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        state: dict[str, Any] = {}
        if self.model is not None and self.optimizer is None:
            state["model"] = get_model_state_dict(self.model)
        elif self.model is not None and self.optimizer is not None:
            state["model"], state["optim"] = get_state_dict(self.model, self.optimizer)
        if self.stateful:
            state["stateful"] = {name: obj.state_dict() for name, obj in self.stateful.items()}
        return state

    # -- the loop ------------------------------------------------------------------------------

    def epochs(self, count: int) -> Iterator[int]:
        """The epochs left of ``count``: from the restored one, with the loader's epoch set.

        The loader keeps its restored position in the first of them (``set_epoch`` of the
        restored epoch does not rewind a unidist sampler).
        """
        count = check_int(count, "count", minimum=0)
        self.restore()
        try:
            while self.epoch < count:
                self.begin_epoch()
                yield self.epoch
                self.end_epoch()
        finally:
            self.close()

    def begin_epoch(self) -> None:
        """An epoch (:attr:`epoch`) begins: the loader's ``set_epoch`` (it keeps a restored
        position). :meth:`epochs` calls it; a framework's loop (an Ignite ``Engine``) too."""
        if self._restored is None:
            self.restore()
        _inputs.set_epoch(self.loader, self.epoch)

    def end_epoch(self) -> None:
        """The epoch is done, on every rank (a collective): count it, and stop now if any rank
        was told to since the last vote. :meth:`epochs` calls it; a framework's loop too."""
        self.epoch += 1
        self._settle()

    def step(self) -> None:
        """One step is done: count it, save when due, and stop if any rank was told to.

        With stop signals set, every rank takes part in a vote here about twice a second (at
        steps that every rank knows in advance), so call it on every rank after every step.
        The vote runs in the background on a CPU (gloo) group: a voting step sends this rank's
        flag and reads the verdict of the previous vote, so it never waits on the network or
        the GPU, and every rank stops at the same step, about a second after the signal. The
        steps between votes cost a counter.
        """
        if self._restored is None:
            self.restore()
        self._steps += 1
        stacks.step()
        stop = self._vote.cast(self._steps, self._stops.received) if self._stops.signums else 0
        if stop:
            self._stop(stop)
        if self.save_every and self._steps % self.save_every == 0:
            self._checkpoint(wait=False)  # training goes on while rank 0 makes it count

    def _settle(self) -> None:
        """At an epoch's end, which every rank reaches together: stop now if any rank was
        signalled since the last vote (a short epoch may end before the next one is due)."""
        if not self._stops.signums:
            return
        stop = self._vote.settle(self._steps, self._stops.received)
        if stop:
            self._stop(stop)

    def _stop(self, signum: int) -> None:
        """Every rank was told to stop at this step: save (if it fits in the grace), leave."""
        name = signal.Signals(signum).name
        saved = self._save_for_stop()
        own = self._stops.received or self._stops.wait(self.stop_timeout)
        what = f"saved step {self._steps}" if saved else f"kept step {self._in_force}"
        if own:
            log.warning("%s and stopping: %s", what, signal.Signals(own).name)
            self._stops.leave(own)
        raise DistributedTimeoutError(
            f"rank {ranks.get_rank()} {what} in {self.root} and stopped because another rank "
            f"got {name}, but no stop signal reached this rank within {self.stop_timeout:g} s "
            "(stop_timeout). The job resumes from that checkpoint when it is restarted."
        )

    def _save_for_stop(self) -> bool:
        """Save this step unless a rank has no time for it before its grace runs out (every
        rank decides the same: a save is a collective). True if saved."""
        fits = True
        if self.grace is not None:
            elapsed = self._stops.elapsed()
            needed = 1.25 * self._save_seconds
            fits = elapsed + needed <= self.grace
            if not fits:
                log.warning(
                    "no time to save step %s before the grace runs out (grace=%g s: the signal "
                    "came %.1f s ago and a save takes about %.1f s here); the checkpoint of "
                    "step %s stays in force",
                    self._steps,
                    self.grace,
                    elapsed,
                    self._save_seconds,
                    self._in_force,
                )
            every = self._vote.agree(int(fits))
            if fits and not every:
                log.warning(
                    "another rank has no time to save step %s before its grace runs out; the "
                    "checkpoint of step %s stays in force",
                    self._steps,
                    self._in_force,
                )
            fits = bool(every)
        if fits:
            self._checkpoint(wait=False)
        self._finish_staged()  # this rank's files are written ...
        self._commit.join()  # ... and the checkpoint counts, before this rank leaves
        return fits

    # -- save ----------------------------------------------------------------------------------

    def save(self) -> Path | Url:
        """Save now, on every rank (a collective); returns the checkpoint's folder.

        The checkpoint counts once rank 0 has replaced ``latest.json``, after every rank wrote
        its part: a crash mid-save leaves the previous checkpoint in force. A checkpoint of
        this very step that is already in force (restored or saved, no :meth:`step` since) is
        kept as it is. After :meth:`close`, the folder's lock is taken again for the save.

        It returns once the checkpoint counts. The saves that :meth:`step` makes (every
        ``save_every`` steps, and on a stop) return as soon as every rank's files are on disk:
        rank 0 writes the progress record and the pointer on a thread meanwhile, which the
        next save, a stop and :meth:`close` wait for.
        """
        return self._checkpoint(wait=True)

    def _checkpoint(self, *, wait: bool) -> Path | Url:
        if self._restored is None:
            self.restore()
        where = self.root / files.step_name(self._steps)
        if self._in_force == self._steps:
            # Saved or restored at this very step: rewriting it would unseat it. A save that
            # step() began here may still be on its way to counting: save() waits for it.
            if wait:
                self._counts()
            return where
        closed = self._root is None  # after close(): the lock is held for this save only
        started = time.monotonic()
        try:
            self._save(where)
            self._save_seconds = max(self._save_seconds, time.monotonic() - started)
            if wait:
                self._counts()
        finally:
            if closed:
                self._shut()
        return where

    def _counts(self) -> None:
        """Wait until the latest save counts (a collective)."""
        self._await_saves(counted_only=True)

    def _await_saves(self, *, counted_only: bool = False) -> None:
        """Wait for this rank's save in flight and rank 0's commit (``counted_only``: until the
        checkpoint counts, its removals may go on). Every rank learns whether any of them failed
        (a collective): then that save is no longer the one in force (a later save of the same
        step writes it again) and every rank raises, the failing ones their own error."""
        problem: CheckpointError | None = None
        try:
            self._finish_staged()
            if counted_only:
                self._commit.wait_counted()
            else:
                self._commit.join()
        except CheckpointError as exc:
            problem = exc
        failed = problem is not None
        if ranks.get_world_size() > 1:
            failed = bool(all_reduce(int(failed), "max"))
        if failed:
            self._in_force = self._counted_before
            raise problem or CheckpointError(
                f"the last save in {self.root} failed on another rank (its own write, or rank "
                "0's commit): that rank's error says why. The checkpoint in force is the one "
                "before it."
            )

    def _save(self, where: Path | Url) -> None:
        self._open()
        assert self._root is not None
        if self._lock is not None:
            self._lock.check()  # still this run's alone: nothing may be written otherwise
        rank, world = ranks.get_rank(), ranks.get_world_size()
        data = self.loader.state_dict() if self.loader is not None else None
        progress = {
            "job": self.job,
            "step": self._steps,
            "epoch": self.epoch,
            "world_size": world,
            "loader": data,
            "extra": self.extra,
            "stateful": sorted(self.stateful),
        }
        _inputs.check_json(progress)
        self._await_saves()  # the last save is written, and counts, before this one begins
        started = time.monotonic()
        # Every rank makes or opens the step's folder: no stale one can be there (restore()
        # removed those newer than the checkpoint in force), and a save of this step that
        # failed in this run left files of the same names, which this one overwrites.
        with self._root.open_dir(files.step_name(self._steps), create=True) as folder:
            if self._in_torch:
                import torch.distributed.checkpoint as dcp
                from torch.distributed.checkpoint.api import CheckpointException

                state = self._model_state()
                state["rng"] = {
                    f"r{rank}": _random.rng_tensors()
                }  # each rank's own, in torch's files
                try:
                    with _dcp.quiet_checkpoint(world):
                        if self.async_save:
                            handle = folder.dup()  # open until written
                            future = dcp.async_save(
                                state,
                                storage_writer=_dcp.progress_writer(handle.writer()),
                                process_group=self._save_group,
                            )
                            self._staged = Staged(future, handle, started, self._redacted)
                        else:
                            dcp.save(state, storage_writer=_dcp.progress_writer(folder.writer()))
                except CheckpointException as exc:  # a BaseException: user code would miss it
                    raise CheckpointError(
                        f"saving {where} failed on rank(s) {sorted(exc.failures)}: "
                        f"{self._shown(exc)}. The "
                        "checkpoint in force is still the one latest.json names."
                    ) from exc
            else:
                files.write_record(
                    folder, files.rng_name(rank), _random.random_state(), compact=True
                )
                barrier(self.timeout)  # every rank's part is on disk
            if rank == 0:  # the rest is rank 0's, on a thread: see files.Commit
                latest = {"job": self.job, "step": self._steps, "folder": where.name}
                own = folder.dup()
                self._commit.start(
                    self._root,
                    own,
                    progress,
                    latest,
                    self.keep,
                    self._staged,
                    then=functools.partial(_at_exit.forget, self),
                )
                _at_exit.await_at_exit(self)  # until its commit has counted
            elif self._staged is not None:
                _at_exit.await_at_exit(self)  # until its save is written
                self._staged.future.add_done_callback(
                    functools.partial(_at_exit.written, self, self._staged)
                )
        self._counted_before, self._in_force = self._in_force, self._steps
        log.info("saved %s", where)

    # -- the end -------------------------------------------------------------------------------

    def close(self) -> None:
        """Put back the signal handlers that were there before, let go of the folder's lock
        and handle (saving nothing). A later :meth:`save` takes them again.

        A stop signal that arrived after the last vote (a loop that does not use
        :meth:`epochs` and ended before the next vote) was acted on by nobody: ``close()``
        raises it again (``signal.raise_signal``) once the handlers it had are back, as if
        unidist had never caught it. With the default handlers SIGTERM then ends the process
        here, with SIGTERM's status, as it would have without unidist; a script that set its
        own handler gets that handler called. :meth:`epochs` and the ``with`` block call
        ``close()`` too.

        Raises:
            CheckpointError: a save in flight (``async_save``, or the commit of the last save)
                failed: the checkpoint in force is the one before it.
        """
        pending = self._stops.received
        self._stops.restore()
        self._vote.finish(self.timeout)
        self._shut()
        if pending:  # a signal no vote acted on (a loop without epochs()): as if never caught
            log.warning(
                "%s arrived after the last vote; passing it on unsaved",
                signal.Signals(pending).name,
            )
            self._stops.received = 0
            signal.raise_signal(pending)

    def __enter__(self) -> ResumableState:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
