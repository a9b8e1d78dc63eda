"""What ResumableState costs a training loop, 2 gloo ranks: per step, and per save.

    python bench/resume.py [--rounds 15]
    python bench/resume.py --quick    # 3 rounds: checks that it runs (the test command)

Per step: a small DDP step alone, the same step followed by ``state.step()`` (the stop vote,
cast about twice a second at steps every rank knows; no save due), and the step alone once more
(A/A: the noise of the machine), in alternating blocks in the same processes. The cost is the
median over rounds of (with - mean of the two alone blocks); the noise, the median of |alone -
again|. ``state.step()`` alone, without training, is timed too: its own cost in microseconds.

Per save, alternating in the same processes, against ``torch.distributed.checkpoint.save`` of
the same state dicts alone: ``state.save()`` (returns once the checkpoint counts: every rank's
random state, torch's files, then rank 0's progress record and pointer, each fsynced) and a
``state.step()`` that saves (``save_every``; it returns once every rank's files are on disk, and
rank 0 makes the checkpoint count on a thread while training goes on). Each table shows the
slower rank's medians.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import median, no_framework_preload, table

STEPS_PER_BLOCK = 50
WIDTH = 512  # two 512x512 layers: about 2 MiB of weights, 4 MiB with SGD's momentum
BARE_STEPS = 20_000


def measure(rounds: int, folder: str) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import unidist

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.utils.data.TensorDataset(torch.randn(4096, WIDTH))
    loader = unidist.auto_dataloader(data, global_batch_size=64, num_workers=0)
    root = Path(folder)
    state = unidist.ResumableState(
        root / "state", job="bench", model=model, optimizer=optimizer, loader=loader
    )
    state.restore()
    batches = iter(loader)

    def train_step() -> None:
        nonlocal batches
        try:
            (x,) = next(batches)
        except StopIteration:
            batches = iter(loader)
            (x,) = next(batches)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def with_state() -> None:
        train_step()
        state.step()

    def block(step) -> float:  # type: ignore[no-untyped-def]
        dist.barrier()
        started = time.perf_counter()
        for _ in range(STEPS_PER_BLOCK):
            step()
        return (time.perf_counter() - started) / STEPS_PER_BLOCK

    def timed(call) -> float:  # type: ignore[no-untyped-def]
        dist.barrier()
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    saves = 0

    def raw_save() -> None:
        nonlocal saves
        saves += 1
        msd, osd = get_state_dict(model, optimizer)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(root / f"raw-{saves}"))

    def our_save() -> None:
        state.step()  # a new step, so the save is not the checkpoint already in force
        state.save()

    def saving_step() -> None:
        state.save_every = state.steps + 1  # this step is due
        state.step()
        state.save_every = None

    out: dict[str, list[float]] = {
        key: [] for key in ("alone", "state", "again", "bare", "raw", "save", "saving_step", "raw2")
    }
    block(train_step), block(with_state)  # warm-up
    timed(raw_save), timed(our_save), timed(saving_step)
    for _ in range(rounds):
        out["alone"].append(block(train_step))
        out["state"].append(block(with_state))
        out["again"].append(block(train_step))  # the same loop twice: the noise
        dist.barrier()
        started = time.perf_counter()
        for _ in range(BARE_STEPS):
            state.step()
        out["bare"].append((time.perf_counter() - started) / BARE_STEPS)
        out["raw"].append(timed(raw_save))
        out["save"].append(timed(our_save))
        out["saving_step"].append(timed(saving_step))
        out["raw2"].append(timed(raw_save))  # dcp.save twice: the noise of a save
    state.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="3 rounds (a smoke run)")
    args = parser.parse_args()
    no_framework_preload()
    if args.quick:
        args.rounds = 3
    from unidist.testing import run_distributed

    with tempfile.TemporaryDirectory(prefix="unidist-bench-resume-") as folder:
        per_rank = run_distributed(measure, args.rounds, folder, world_size=2, timeout=900)
    print("2 gloo ranks on one machine, a 2-layer 512-wide DDP model, 32 samples per rank")
    print(f"per step (median of {args.rounds} rounds of {STEPS_PER_BLOCK}-step blocks)")

    def rank_median(key: str) -> float:
        return max(median(r[key]) for r in per_rank) * 1e6

    def paired(name: str) -> list[float]:  # per round, on the slower rank's figures
        return [
            max(r[name][i] - (r["alone"][i] + r["again"][i]) / 2 for r in per_rank) * 1e6
            for i in range(args.rounds)
        ]

    alone = rank_median("alone")
    cost = median(paired("state"))
    noise = median(
        [
            max(abs(r["again"][i] - r["alone"][i]) for r in per_rank) * 1e6
            for i in range(args.rounds)
        ]
    )
    rows = [
        ("training step alone", alone, 1.0),
        ("with state.step()", rank_median("state"), rank_median("state") / alone),
        ("alone again (noise)", rank_median("again"), rank_median("again") / alone),
    ]
    print(table(["loop", "us per step", "ratio"], rows))
    print(
        f"state.step() costs {cost:.0f} us a step here ({cost / alone * 100:.2f} % of the step); "
        f"the same loop twice differs by {noise:.0f} us ({noise / alone * 100:.2f} %)"
    )
    print(f"state.step() alone, no training: {rank_median('bare'):.2f} us a call")
    raw = max(median(r["raw"]) for r in per_rank) * 1e3
    rows = [("dcp.save alone", raw, 1.0)]
    for key, name in (
        ("raw2", "dcp.save alone again (noise)"),
        ("save", "state.save()"),
        ("saving_step", "state.step() that saves"),
    ):
        ours = max(median(r[key]) for r in per_rank) * 1e3
        rows.append((name, ours, ours / raw))
    print(f"\nper save (median of {args.rounds})")
    print(table(["save", "ms", "ratio"], rows))


if __name__ == "__main__":
    main()
