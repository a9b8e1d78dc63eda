"""What ResumableState costs a training loop, 2 gloo ranks: per step, and per save.

    python bench/resume.py [--rounds 15]
    python bench/resume.py --quick    # 3 rounds: checks that it runs (the test command)

Per step: a small DDP step alone, against the same step followed by ``state.step()`` (the
one-integer vote that lets every rank agree on a stop signal; no save due), in alternating
blocks in the same processes, and the step alone once more as the noise floor. Per save:
``state.save()`` (torch's distributed checkpoint of the model and optimizer, plus the loader's
position, each rank's random states, a barrier and the atomic ``latest.json``, each fsynced)
against ``torch.distributed.checkpoint.save`` of the same state dicts alone, alternating. Each
table shows the slower rank's medians.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import median, table

STEPS_PER_BLOCK = 50
WIDTH = 512  # two 512x512 layers: about 2 MiB of weights, 4 MiB with SGD's momentum


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

    out: dict[str, list[float]] = {
        "alone": [],
        "state": [],
        "again": [],
        "raw_save": [],
        "our_save": [],
    }
    block(train_step), block(with_state)  # warm-up
    timed(raw_save), timed(our_save)
    for _ in range(rounds):
        out["alone"].append(block(train_step))
        out["state"].append(block(with_state))
        out["again"].append(block(train_step))  # the same loop twice: the noise
        out["raw_save"].append(timed(raw_save))
        out["our_save"].append(timed(our_save))
    state.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="3 rounds (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 3
    from unidist.testing import run_distributed

    with tempfile.TemporaryDirectory(prefix="unidist-bench-resume-") as folder:
        per_rank = run_distributed(measure, args.rounds, folder, world_size=2, timeout=900)
    slowest = {key: max(median(r[key]) for r in per_rank) for key in per_rank[0]}
    step_alone, step_state = slowest["alone"] * 1e6, slowest["state"] * 1e6
    print("2 gloo ranks on one machine, a 2-layer 512-wide DDP model, 32 samples per rank")
    print(f"per step (median of {args.rounds} blocks of {STEPS_PER_BLOCK} steps)")
    step_again = slowest["again"] * 1e6
    rows = [
        ("training step alone", step_alone, 1.0),
        ("with state.step()", step_state, step_state / step_alone),
        ("alone again (noise)", step_again, step_again / step_alone),
    ]
    print(table(["loop", "us per step", "ratio"], rows))
    print(
        f"state.step() costs {step_state - step_alone:.0f} us a step here; the same loop "
        f"twice differs by {step_again - step_alone:.0f} us"
    )
    raw, ours = slowest["raw_save"] * 1e3, slowest["our_save"] * 1e3
    print(f"\nper save (median of {args.rounds})")
    rows = [("dcp.save alone", raw, 1.0), ("state.save()", ours, ours / raw)]
    print(table(["save", "ms", "ratio"], rows))


if __name__ == "__main__":
    main()
