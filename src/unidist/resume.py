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

import contextlib
import json
import logging
import os
import random
import signal
import warnings
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch

from unidist import _env, ranks
from unidist._resume import folder as files
from unidist._resume.stopping import StopSignals, StopVote
from unidist._sampling.passes import STATE_FORMAT as SAMPLER_FORMAT
from unidist._sampling.passes import check_int
from unidist.collectives import all_reduce
from unidist.errors import CheckpointError, ConfigurationError, DistributedTimeoutError
from unidist.sync import barrier

__all__ = ["ResumableState"]

log = logging.getLogger("unidist.resume")


class ResumableState:
    """A training loop's position, saved atomically and restored on any number of ranks.

    Args:
        folder: the checkpoint folder, shared by every node (as torch's distributed checkpoint
            needs). Created private (0700) if missing; one that another user owns or can
            write to is refused, because torch's checkpoint metadata is a pickle.
        job: the name of this training run. A folder holding another job's checkpoints is an
            error, not something to resume from (Composer's autoresume asks for ``run_name``
            for the same reason).
        model: saved and loaded with ``torch.distributed.checkpoint`` (DDP, FSDP and plain
            modules alike; ``get_state_dict``/``set_state_dict`` handle the wrappers).
        optimizer: saved with the model (needs ``model``).
        loader: what yields the data and knows its position: a :class:`unidist.StatefulDataLoader`
            (what :func:`unidist.auto_dataloader` returns) or a unidist sampler; anything with
            ``state_dict()`` (plain JSON) and ``load_state_dict()``.
        save_every: save after every this many steps (``None``: only on a stop signal or an
            explicit :meth:`save`).
        keep: complete checkpoints kept; older ones are removed after each save.
        stop_signals: signals that mean "save and stop at the next step" (handlers are set in
            :meth:`restore` and put back by :meth:`close`). ``()`` leaves signals alone.
        stop_timeout: seconds a rank that agreed to stop (another rank got the signal) waits
            for its own launcher's signal before it raises instead.
        timeout: seconds each rank waits for the others while saving.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        job: str,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        loader: Any = None,
        save_every: int | None = None,
        keep: int = 2,
        stop_signals: tuple[int, ...] = (signal.SIGTERM,),
        stop_timeout: float | timedelta = 60.0,
        timeout: float | timedelta = 300.0,
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
        if loader is not None and not (
            callable(getattr(loader, "state_dict", None))
            and callable(getattr(loader, "load_state_dict", None))
        ):
            raise ConfigurationError(
                f"loader={type(loader).__name__} has no state_dict()/load_state_dict(), so "
                "its position in the epoch cannot be saved. HINT: use unidist.auto_dataloader "
                "or unidist.StatefulDataLoader, or pass the unidist sampler itself."
            )
        self.root = Path(folder)
        self.job = job
        self.model = model
        self.optimizer = optimizer
        self.loader = loader
        self.save_every = (
            None if save_every is None else check_int(save_every, "save_every", minimum=1)
        )
        self.keep = check_int(keep, "keep", minimum=1)
        self.stop_timeout = _env.timeout_seconds(stop_timeout, "stop_timeout")
        self.timeout = _env.timeout_seconds(timeout)
        self.epoch = 0
        self.extra: dict[str, Any] = {}
        self.resumed_from: int | None = None
        self._steps = 0
        self._restored: bool | None = None
        self._in_force: int | None = None  # the step of the checkpoint latest.json names
        self._stops = StopSignals(stop_signals)
        self._vote = StopVote()

    @property
    def steps(self) -> int:
        """Steps done since the run began, across restarts."""
        return self._steps

    # -- restore -------------------------------------------------------------------------------

    def restore(self) -> bool:
        """Load the latest checkpoint if there is one (on every rank); True if one was loaded.

        :meth:`epochs` calls it; call it yourself to look at :attr:`steps` or :attr:`extra`
        first. Every rank must see the same checkpoint (a folder that is not shared is
        refused).

        Raises:
            CheckpointError: the checkpoint is another job's, cannot be trusted (owner, mode,
                links), or does not fit the model, optimizer or loader given.
        """
        if self._restored is not None:
            return self._restored
        files.prepare(self.root)
        found = self._latest_step()
        highest, lowest = all_reduce(found, "max"), -all_reduce(-found, "max")
        if highest != lowest:
            raise CheckpointError(
                f"the ranks found different checkpoints in {self.root} (steps {lowest} to "
                f"{highest}; -1 is none): the folder must be one that every node shares. "
                "HINT: put it on a shared file system."
            )
        if found >= 0:
            self._load(files.step_folder(self.root, found))
        self._vote.start()
        self._stops.install()
        self._restored = found >= 0
        return self._restored

    def _latest_step(self) -> int:
        path = self.root / files.LATEST
        if not os.path.lexists(path):
            return -1
        latest = files.read_json(path, "pointer to the latest checkpoint")
        self._check_job(latest, path)
        step = latest.get("step")
        if (
            not isinstance(step, int)
            or step < 0
            or latest.get("folder") != files.step_folder(self.root, step).name
        ):
            raise CheckpointError(f"{path} names no checkpoint of this folder: {latest!r:.300}")
        return step

    def _check_job(self, record: Mapping[str, Any], path: Path) -> None:
        if record.get("job") != self.job:
            raise CheckpointError(
                f"{path} was written by job {record.get('job')!r}, and this is job "
                f"{self.job!r}: unidist does not resume another run's checkpoint. HINT: pass "
                f"job={record.get('job')!r} to continue that run, or give this one a folder "
                "of its own."
            )

    def _load(self, where: Path) -> None:
        self._check_trusted(where)
        progress = files.read_json(where / files.PROGRESS, "progress record")
        self._check_job(progress, where / files.PROGRESS)
        step = progress.get("step")
        if step != int(where.name.partition("-")[2]):
            raise CheckpointError(f"{where / files.PROGRESS} is of step {step!r}, not {where}.")
        if self.model is not None:
            self._load_model(where)
        data = progress.get("loader")
        if self.loader is not None:
            if data is None:
                raise CheckpointError(
                    f"the checkpoint {where} holds no data position (it was saved without "
                    "loader=), so the rest of its epoch is unknown. HINT: start a new folder, "
                    "or resume without loader= to restart the epoch on purpose."
                )
            try:
                self.loader.load_state_dict(data)
            except ConfigurationError as exc:
                raise CheckpointError(
                    f"the checkpoint {where} does not fit the loader: {exc}"
                ) from exc
        self.epoch = _epoch_of(data, progress)
        self._steps = check_int(step, "step", minimum=0)
        self.extra = dict(progress.get("extra") or {})
        saved_world = progress.get("world_size")
        if saved_world == ranks.get_world_size():
            _set_random(files.read_json(files.rng_file(where, ranks.get_rank()), "random state"))
        else:  # rank r of another world size has no counterpart to take its random state from
            log.info(
                "random states not restored: saved on %s ranks, now %s",
                saved_world,
                ranks.get_world_size(),
            )
        self.resumed_from = self._in_force = self._steps
        log.info("resumed from %s (epoch %s, step %s)", where, self.epoch, self._steps)

    def _check_trusted(self, where: Path) -> None:
        """Rank 0 checks every file (one rank, not W ranks, lists the W files); all agree."""
        problem: CheckpointError | None = None
        if ranks.get_rank() == 0:
            try:
                files.check_tree(where)
            except CheckpointError as exc:
                problem = exc
        if all_reduce(int(problem is not None), "max"):
            raise problem or CheckpointError(
                f"rank 0 refused the checkpoint {where}; its error says why."
            )

    def _load_model(self, where: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._model_state()
        try:
            with _quiet_checkpoint(ranks.get_world_size()):
                dcp.load(state, checkpoint_id=str(where))
        except (Exception, CheckpointException) as exc:  # torch's is a BaseException
            raise CheckpointError(
                f"the checkpoint {where} does not fit this model and optimizer: {exc}. HINT: "
                "build the same model (and optimizer) as the run that saved it."
            ) from exc
        assert self.model is not None
        set_state_dict(
            self.model,
            self.optimizer if self.optimizer is not None else (),
            model_state_dict=state["model"],
            optim_state_dict=state.get("optim", {}),
        )

    def _model_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        assert self.model is not None
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

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
                _set_epoch(self.loader, self.epoch)
                yield self.epoch
                self.epoch += 1
        finally:
            self.close()

    def step(self) -> None:
        """One step is done: count it, save when due, and stop if any rank was told to.

        With stop signals set, every rank takes part in a one-integer vote here, so call it on
        every rank after every step. The vote runs in the background on a CPU (gloo) group: a
        step sends this rank's flag and reads the verdict of the previous step's vote, so it
        never waits on the network or the GPU, and every rank stops at the same step, one
        step after the signal was seen.
        """
        if self._restored is None:
            self.restore()
        self._steps += 1
        stop = self._vote.cast(self._stops.received) if self._stops.signums else 0
        if stop or (self.save_every and self._steps % self.save_every == 0):
            self.save()
        if stop:
            self._stop(stop)

    def _stop(self, signum: int) -> None:
        name = signal.Signals(signum).name
        own = self._stops.received or self._stops.wait(self.stop_timeout)
        if own:
            log.warning("saved step %s and stopping: %s", self._steps, signal.Signals(own).name)
            self._stops.leave(own)
        raise DistributedTimeoutError(
            f"rank {ranks.get_rank()} saved step {self._steps} in {self.root} and stopped "
            f"because another rank got {name}, but no stop signal reached this rank within "
            f"{self.stop_timeout:g} s (stop_timeout). The job resumes from that checkpoint "
            "when it is restarted."
        )

    # -- save ----------------------------------------------------------------------------------

    def save(self) -> Path:
        """Save now, on every rank (a collective); returns the checkpoint's folder.

        The checkpoint counts once rank 0 has replaced ``latest.json``, after every rank wrote
        its part: a crash mid-save leaves the previous checkpoint in force. A checkpoint of
        this very step that is already in force (restored or saved, no :meth:`step` since) is
        kept as it is.
        """
        if self._restored is None:
            self.restore()
        where = files.step_folder(self.root, self._steps)
        if self._in_force == self._steps:
            return where  # saved or restored at this very step: rewriting it would unseat it
        rank, world = ranks.get_rank(), ranks.get_world_size()
        data = self.loader.state_dict() if self.loader is not None else None
        progress = {
            "job": self.job,
            "step": self._steps,
            "epoch": self.epoch,
            "world_size": world,
            "loader": data,
            "extra": self.extra,
        }
        _check_json(progress)
        if rank == 0:
            files.fresh_folder(where)
        # The folder is empty and private before any rank touches it: torch's writer creates
        # it on every rank as it is built, which would race with rank 0 clearing a stale one.
        barrier(self.timeout)
        if self.model is not None:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.api import CheckpointException

            try:
                with _quiet_checkpoint(world):
                    dcp.save(self._model_state(), checkpoint_id=str(where))
            except CheckpointException as exc:  # a BaseException: user code would miss it
                raise CheckpointError(
                    f"saving {where} failed on rank(s) {sorted(exc.failures)}: {exc}. The "
                    "checkpoint in force is still the one latest.json names."
                ) from exc
        files.write_json(files.rng_file(where, rank), _random_state())
        barrier(self.timeout)  # every rank's part is on disk
        if rank == 0:
            files.seal(where)
            files.write_json(where / files.PROGRESS, progress)
            latest = {"job": self.job, "step": self._steps, "folder": where.name}
            files.write_json(self.root / files.LATEST, latest)
            files.prune(self.root, self.keep, where)
        self._in_force = self._steps
        log.info("saved %s", where)
        return where

    # -- the end -------------------------------------------------------------------------------

    def close(self) -> None:
        """Put back the signal handlers that were there before (saving nothing)."""
        self._stops.restore()
        self._vote.finish(self.timeout)

    def __enter__(self) -> ResumableState:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _check_json(progress: dict[str, Any]) -> None:
    try:
        json.dumps(progress)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"ResumableState saves the loader's state_dict() and state.extra as JSON, and "
            f"one of them cannot be ({exc}). HINT: keep state.extra to numbers, strings, lists "
            "and dicts."
        ) from exc


def _epoch_of(data: Any, progress: Mapping[str, Any]) -> int:
    """The epoch to go on with: the data position's own when it is a unidist sampler's."""
    sampler = data.get("sampler", data) if isinstance(data, Mapping) else None
    if isinstance(sampler, Mapping) and sampler.get("format") == SAMPLER_FORMAT:
        return check_int(sampler.get("epoch"), "the saved sampler's epoch", minimum=0)
    return check_int(progress.get("epoch"), "the saved epoch", minimum=0)


def _set_epoch(loader: Any, epoch: int) -> None:
    for candidate in (loader, getattr(loader, "sampler", None)):
        set_epoch = getattr(candidate, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return


@contextlib.contextmanager
def _quiet_checkpoint(world: int) -> Iterator[None]:
    """Without two warnings torch's distributed checkpoint raises inside itself, about nothing
    the user can change (each filter matches one message, raised in that package only):

    * "TypedStorage is deprecated", once per process at its first save: torch 2.7's writer
      (``filesystem.py``) calls ``tensor.storage()`` (pytorch#148498). torch 2.14's calls
      ``untyped_storage()``: there the filter has nothing to hide.
    * "torch.distributed is ... uninitialized, assuming the intent is to save (load) in a single
      process", at every save and load of a one-process run (torch 2.7 and 2.14 alike, even
      with ``no_dist=True``). Hidden only when the world is one process, which unidist knows:
      with more, the barrier before the save has already checked the process group.
    """
    with warnings.catch_warnings():
        package = r"torch\.distributed\.checkpoint\."
        warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning, module=package)
        if world == 1:
            warnings.filterwarnings(
                "ignore", r"torch\.distributed is .*single process", UserWarning, module=package
            )
        yield


def _random_state() -> dict[str, Any]:
    version, keys, gauss = random.getstate()
    name, table, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(keys), gauss],
        "numpy": [name, np.asarray(table).tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def _set_random(state: Mapping[str, Any]) -> None:
    try:
        version, keys, gauss = state["python"]
        random.setstate((version, tuple(keys), gauss))
        name, table, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(table, dtype=np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(
                [torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]]
            )
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"a saved random state cannot be restored: {exc!r:.300}") from exc
