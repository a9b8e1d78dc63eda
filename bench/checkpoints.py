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


def measure(megabytes: float, rounds: int, folder: Path) -> list[list[tuple[object, ...]]]:
    """(the save table's rows, the restore table's rows); every variant once per round, in
    turn, so that the disk's writeback of one falls on all alike."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import unidist

    model, optimizer = _model(megabytes)
    n = 0

    def fresh() -> Path:
        nonlocal n
        n += 1
        return folder / f"c{n}"

    def state_dict(of: Any = model, opt: Any = optimizer) -> dict[str, Any]:
        msd, osd = get_state_dict(of, opt)
        return {"model": msd, "optim": osd}

    stalls: dict[str, list[float]] = {}
    dones: dict[str, list[float]] = {}
    restores: dict[str, list[float]] = {}

    def note(name: str, stall: float, done: float) -> None:
        stalls.setdefault(name, []).append(stall)
        dones.setdefault(name, []).append(done)

    composer = _Composer(model, optimizer) if importlib.util.find_spec("composer") else None
    for _ in range(rounds):
        where = fresh()
        took = _timed(lambda: dcp.save(state_dict(), checkpoint_id=str(where)))  # noqa: B023
        note("dcp.save", took, took)
        started = time.perf_counter()
        future = dcp.async_save(state_dict(), checkpoint_id=str(fresh()))
        stall = time.perf_counter() - started
        future.result()
        note("dcp.async_save", stall, time.perf_counter() - started)
        for kind in ("sync", "async"):
            ours = fresh()
            state = unidist.ResumableState(
                ours,
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
            stall = time.perf_counter() - started
            state.close()  # the save is written and counts
            note("ResumableState step()" + (" async_save" if kind == "async" else ""), stall,
                 time.perf_counter() - started)  # fmt: skip
        if composer is not None:
            took = composer.save(fresh())
            note("Composer save_checkpoint", took, took)
        other, other_opt = _model(megabytes)
        into = state_dict(other, other_opt)
        restores.setdefault("dcp.load", []).append(
            _timed(lambda: dcp.load(into, checkpoint_id=str(where)))  # noqa: B023
        )
        state = unidist.ResumableState(
            ours, job="bench", model=other, optimizer=other_opt, stop_signals=()
        )
        restores.setdefault("ResumableState.restore()", []).append(_timed(state.restore))
        state.close()
        if composer is not None:
            restores.setdefault("Composer load_checkpoint", []).append(composer.load())
    if composer is not None:
        composer.close()
    names = ["dcp.save", "dcp.async_save", "ResumableState step()"]
    names += ["ResumableState step() async_save", "Composer save_checkpoint"]
    base = median(stalls["dcp.save"])
    nan = float("nan")
    saves: list[tuple[object, ...]] = []
    for name in names:
        stall = median(stalls[name]) if name in stalls else nan
        saves.append((name, stall, median(dones[name]) if name in dones else nan, stall / base))
    base_restore = median(restores["dcp.load"])
    loads: list[tuple[object, ...]] = []
    for name in ("dcp.load", "ResumableState.restore()", "Composer load_checkpoint"):
        took = median(restores[name]) if name in restores else nan
        loads.append((name, took, took / base_restore))
    return [saves, loads]


class _Composer:
    """Composer's Trainer.save_checkpoint / load_checkpoint of the same model and optimizer."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        import torch
        from composer import Trainer
        from composer.models import ComposerModel

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
        self.trainer = Trainer(
            model=Wrapped(model),
            train_dataloader=torch.utils.data.DataLoader(data, batch_size=1),
            max_duration="1ba",
            optimizers=optimizer,
            device="cpu",
            progress_bar=False,
            log_to_console=False,
            loggers=[],
        )
        self.last: Path | None = None

    def save(self, folder: Path) -> float:
        folder.mkdir()
        self.last = folder / "composer.pt"
        return _timed(lambda: self.trainer.save_checkpoint(str(self.last)))

    def load(self) -> float:
        from composer.utils import checkpoint

        trainer = self.trainer
        return _timed(
            lambda: checkpoint.load_checkpoint(str(self.last), trainer.state, trainer.logger)
        )

    def close(self) -> None:
        self.trainer.close()


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
