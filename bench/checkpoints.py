"""Checkpoints of a 100 MB and a 1 GB model: how long a save stalls training, how long a restore
takes, side by side with torch.distributed.checkpoint alone and Composer's checkpointing.

    python bench/checkpoints.py           # 100 MB and 1 GB (weights; SGD momentum doubles it)
    python bench/checkpoints.py --quick   # 4 MB and 16 MB (the test command)

One process, the model's weights and SGD's momentum, into a fresh folder each time:

* **stall**: how long the training loop waits. ``dcp.save`` and a ``state.step()`` that saves
  (``save_every``) wait for the files; ``dcp.async_save`` and ``ResumableState(async_save=True)``
  only for a copy to host memory, then write on a thread (``done`` is when the checkpoint is
  written, and for unidist, when ``latest.json`` names it). Composer's ``Trainer.save_checkpoint``
  writes one file with ``torch.save``.
* **restore**: into a new model and optimizer: ``dcp.load``, ``ResumableState.restore()`` (the
  folder checked, the pointer read, the same ``dcp.load``), Composer's ``load_checkpoint``.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import median, table

warnings.filterwarnings("ignore")


def _model(megabytes: float) -> tuple[Any, Any]:
    import torch

    side = int(math.sqrt(megabytes * 2**20 / 4))
    model = torch.nn.Linear(side, side, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, side)).sum().backward()
    optimizer.step()  # momentum buffers exist: the optimizer's state is as large as the model
    return model, optimizer


def _timed(call: Any) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure(megabytes: float, rounds: int, folder: Path) -> list[tuple[object, ...]]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import unidist

    model, optimizer = _model(megabytes)
    rows: list[tuple[object, ...]] = []
    n = 0

    def fresh() -> Path:
        nonlocal n
        n += 1
        return folder / f"c{n}"

    def state_dict() -> dict[str, Any]:
        msd, osd = get_state_dict(model, optimizer)
        return {"model": msd, "optim": osd}

    # torch.distributed.checkpoint alone, then its async save
    sync = [
        _timed(lambda: dcp.save(state_dict(), checkpoint_id=str(fresh()))) for _ in range(rounds)
    ]
    stalls, dones = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        future = dcp.async_save(state_dict(), checkpoint_id=str(fresh()))
        stalls.append(time.perf_counter() - started)
        future.result()
        dones.append(time.perf_counter() - started)
    rows += [
        ("dcp.save", median(sync), median(sync)),
        ("dcp.async_save", median(stalls), median(dones)),
    ]
    last = folder / f"c{n}"
    restore_dcp = []
    for _ in range(rounds):
        other, other_opt = _model(megabytes)
        msd, osd = get_state_dict(other, other_opt)
        started = time.perf_counter()
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(last))
        restore_dcp.append(time.perf_counter() - started)

    # unidist: a step that saves, synchronous and asynchronous
    for kind in ("sync", "async"):
        stalls, dones = [], []
        for _ in range(rounds):
            where = fresh()
            state = unidist.ResumableState(
                where,
                job="bench",
                model=model,
                optimizer=optimizer,
                save_every=1,
                stop_signals=(),
                async_save=kind == "async",
            )
            state.restore()
            started = time.perf_counter()
            state.step()  # due: saves
            stalls.append(time.perf_counter() - started)
            state.close()  # the save is written and counts
            dones.append(time.perf_counter() - started)
        name = "ResumableState step()" + (" async_save" if kind == "async" else "")
        rows.append((name, median(stalls), median(dones)))
    restore_ours = []
    for _ in range(rounds):
        other, other_opt = _model(megabytes)
        state = unidist.ResumableState(
            where, job="bench", model=other, optimizer=other_opt, stop_signals=()
        )
        restore_ours.append(_timed(state.restore))
        state.close()

    # Composer's Trainer.save_checkpoint / load_checkpoint, where Composer is installed
    restore_composer: list[float] = []
    if importlib.util.find_spec("composer") is not None:
        saves, restore_composer = _composer(model, optimizer, rounds, fresh)
        rows.append(("Composer save_checkpoint", median(saves), median(saves)))
    else:
        rows.append(("Composer save_checkpoint", float("nan"), float("nan")))
    base = rows[0][1]
    out = [(name, stall, done, stall / base) for name, stall, done in rows]  # type: ignore[operator]
    restores = [
        ("dcp.load", median(restore_dcp)),
        ("ResumableState.restore()", median(restore_ours)),
    ]
    restores.append(
        ("Composer load_checkpoint", median(restore_composer) if restore_composer else float("nan"))
    )
    base_restore = restores[0][1]
    return [out, [(name, s, s / base_restore) for name, s in restores]]  # type: ignore[list-item]


def _composer(
    model: Any, optimizer: Any, rounds: int, fresh: Any
) -> tuple[list[float], list[float]]:
    import torch
    from composer import Trainer
    from composer.models import ComposerModel
    from composer.utils import checkpoint

    class Wrapped(ComposerModel):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, batch: Any) -> Any:
            return self.inner(batch[0])

        def loss(self, outputs: Any, batch: Any) -> Any:
            return outputs.sum()

    side = model.weight.shape[0]
    data = torch.utils.data.TensorDataset(torch.ones(2, side))
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    wrapped = Wrapped(model)
    trainer = Trainer(
        model=wrapped,
        train_dataloader=loader,
        max_duration="1ba",
        optimizers=optimizer,
        device="cpu",
        progress_bar=False,
        log_to_console=False,
        loggers=[],
    )
    saves, paths = [], []
    for _ in range(rounds):
        path = fresh() / "composer.pt"
        path.parent.mkdir()
        started = time.perf_counter()
        trainer.save_checkpoint(str(path))
        saves.append(time.perf_counter() - started)
        paths.append(path)
    restores = []
    for _ in range(rounds):
        restores.append(
            _timed(
                lambda: checkpoint.load_checkpoint(str(paths[-1]), trainer.state, trainer.logger)
            )
        )
    trainer.close()

    return saves, restores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models (a smoke run)")
    args = parser.parse_args()
    sizes, rounds = ((4, 16), 2) if args.quick else ((100, 1024), 3)
    for megabytes in sizes:
        folder = Path(tempfile.mkdtemp(prefix="unidist-bench-checkpoints-"))
        try:
            saves, restores = measure(megabytes, rounds, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(
            f"\n{megabytes} MB of weights (+ as much of SGD momentum); median of {rounds}; seconds"
        )
        print(table(["save", "stall s", "done s", "stall x dcp.save"], saves))
        print(table(["restore", "s", "x dcp.load"], restores))


if __name__ == "__main__":
    main()
