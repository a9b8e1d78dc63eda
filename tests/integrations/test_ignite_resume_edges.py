"""An Ignite Engine resumed by ``attach_resumable`` trains what the uninterrupted run trains next.

Each case is a real gloo job of two processes: an Engine trains with ``attach_resumable`` and
ends after a checkpoint (the save a stop makes, or a ``save_every`` save followed by a crash);
a fresh job resumes from it. The batches it trains, compared by sample index, must be exactly
those the uninterrupted run (same code, no interruption) trains after the checkpoint's step:
each epoch's own permutation, every sample once per epoch.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

import unidist
from unidist.testing import run_distributed

pytestmark = [pytest.mark.ignite, pytest.mark.multiprocess]

GLOBAL_BATCH = 8
EPOCHS = 3

Trained = list[tuple[int, int, list[int]]]


class _Crash(Exception):
    """The job dies here (after its checkpoint): no handler of the state runs."""


def _train(
    folder: str,
    samples: int,
    drop_last: bool,
    *,
    save_every: int | None = None,
    save_at: int | None = None,
    crash_at: int | None = None,
) -> Trained:
    """One start of the job: (epoch, iteration, sample ids) of each batch this rank trained.

    ``save_at``: save at that iteration and end there (what a stop does: every rank saves the
    step, then leaves). ``crash_at``: end at that iteration without saving.
    """
    from ignite.engine import Engine, Events
    from torch.utils.data import TensorDataset

    from unidist.integrations.ignite import attach_resumable

    data = TensorDataset(torch.arange(samples), torch.randn(samples, 3))
    loader = unidist.auto_dataloader(
        data, global_batch_size=GLOBAL_BATCH, drop_last=drop_last, num_workers=0
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = unidist.ResumableState(
        folder,
        job="edges",
        model=model,
        optimizer=optimizer,
        loader=loader,
        save_every=save_every,
        stop_signals=(),
    )
    trained: Trained = []

    def update(engine: Engine, batch: list[torch.Tensor]) -> None:
        ids, x = batch
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
        trained.append((engine.state.epoch - 1, engine.state.iteration, ids.tolist()))

    def interrupt(engine: Engine) -> None:
        if engine.state.iteration == save_at:
            state.save()
            raise _Crash
        if engine.state.iteration == crash_at:
            raise _Crash

    trainer = Engine(update)
    attach_resumable(trainer, state)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, interrupt)  # after state.step()
    with contextlib.suppress(_Crash):
        trainer.run(loader, max_epochs=EPOCHS)
    return trained


def _global_batches(per_rank: list[Trained]) -> dict[int, tuple[int, list[int]]]:
    """iteration -> (epoch, sorted sample ids of every rank's batch) of one job."""
    joined: dict[int, tuple[int, list[int]]] = {}
    for trained in per_rank:
        for epoch, iteration, ids in trained:
            seen = joined.setdefault(iteration, (epoch, []))
            assert seen[0] == epoch, f"the ranks trained iteration {iteration} in other epochs"
            seen[1].extend(ids)
    return {i: (e, sorted(ids)) for i, (e, ids) in sorted(joined.items())}


class Case(NamedTuple):
    samples: int
    drop_last: bool
    plan: dict[str, Any]
    resumed_from: int  # the step of the checkpoint the second job starts from
    resume_world: int = 2


# 48 samples: 6 iterations per epoch. 52 with drop_last: 6 too, and the 4 samples left after
# an epoch's last iteration (2 per rank) make no batch.
CASES = {
    "stopped-at-the-last-iteration-of-epoch-0": Case(48, False, {"save_at": 6}, 6),
    "save-every-divides-the-epoch-then-a-crash": Case(
        48, False, {"save_every": 3, "crash_at": 8}, 6
    ),
    "stopped-at-the-last-iteration-resumed-on-one-rank": Case(48, False, {"save_at": 6}, 6, 1),
    "stopped-at-the-last-iteration-tail-shorter-than-a-batch": Case(52, True, {"save_at": 12}, 12),
    "save-in-the-middle-of-an-epoch-then-a-crash": Case(
        48, False, {"save_every": 4, "crash_at": 10}, 8
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_a_resumed_engine_trains_the_batches_the_uninterrupted_run_trains_next(
    tmp_path: Path, case: Case
) -> None:
    per_epoch = case.samples // GLOBAL_BATCH
    read = per_epoch * GLOBAL_BATCH  # samples each epoch trains
    uninterrupted = _global_batches(
        run_distributed(_train, str(tmp_path / "reference"), case.samples, case.drop_last)
    )
    folder = str(tmp_path / "ckpt")
    first = run_distributed(
        _train, folder, case.samples, case.drop_last, kwargs=case.plan, timeout=120
    )
    resumed = _global_batches(
        run_distributed(
            _train,
            folder,
            case.samples,
            case.drop_last,
            kwargs={"save_every": case.plan.get("save_every")},
            world_size=case.resume_world,
            timeout=120,
        )
    )

    assert len(uninterrupted) == EPOCHS * per_epoch
    for epoch in range(EPOCHS):  # the reference: each epoch reads its samples once
        ids = Counter(i for e, batch in uninterrupted.values() if e == epoch for i in batch)
        assert len(ids) == read
        assert set(ids.values()) == {1}
    assert max(_global_batches(first)) == case.plan.get("save_at", case.plan.get("crash_at"))
    assert list(resumed) == list(range(case.resumed_from + 1, EPOCHS * per_epoch + 1))
    for iteration, (epoch, batch) in resumed.items():
        assert (epoch, batch) == uninterrupted[iteration], (
            f"iteration {iteration}: the resumed job trained epoch {epoch}'s {batch}, the "
            f"uninterrupted one epoch {uninterrupted[iteration][0]}'s "
            f"{uninterrupted[iteration][1]}"
        )
