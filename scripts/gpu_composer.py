"""unidist's MicroBatcher and Composer's ``device_train_microbatch_size="auto"``, side by side.

Step ``composer-auto`` of ``scripts/gpu-check``: the model and the memory cap of
``bench/gpu_microbatch.py`` (one process on GPU 0), trained for a few steps by a
``MicroBatcher`` in a plain loop and by Composer's ``Trainer`` with ``"auto"``; prints each one's
settled microbatch size and median time per step. ``--simulate`` runs on the CPU, where Composer
refuses ``"auto"``: the ``MicroBatcher`` settles under an ``OOMBudget`` and Composer trains with
that size (``composer_microbatch_size(microbatcher)``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from gpu_microbatch import FITS, cap_memory, loss_of, make_batch, make_model, sync  # noqa: E402

import unidist  # noqa: E402
from unidist.integrations.composer import composer_microbatch_size  # noqa: E402
from unidist.testing import OOMBudget  # noqa: E402


def unidist_run(device: torch.device, batch: int, steps: int, simulate: bool) -> tuple[Any, float]:
    model = make_model(device, simulate)
    budget: Any = OOMBudget(int(batch * FITS)).attach(model) if simulate else nullcontext()
    if not simulate:
        cap_memory(model, device, batch)
    mb = unidist.MicroBatcher(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = make_batch(batch, device, 0)
    times = []
    with budget:
        for _ in range(steps + 1):  # the first step settles the size
            sync(device)
            begin = time.perf_counter()
            mb.step(data, loss_of(model))
            opt.step()
            sync(device)
            times.append(time.perf_counter() - begin)
    return mb, 1e3 * statistics.median(times[1:])


def step_timer(device: torch.device) -> tuple[Any, list[float]]:
    """A Composer callback that records the wall time of every batch, and its list of times."""
    from composer.core import Callback

    times: list[float] = []

    class StepTimes(Callback):  # type: ignore[misc]
        begin = 0.0

        def batch_start(self, state: Any, logger: Any) -> None:
            sync(device)
            self.begin = time.perf_counter()

        def batch_end(self, state: Any, logger: Any) -> None:
            sync(device)
            times.append(time.perf_counter() - self.begin)

    return StepTimes(), times


def composer_run(
    device: torch.device, batch: int, steps: int, simulate: bool, size: Any
) -> tuple[Any, float]:
    from composer import Trainer
    from composer.models import ComposerClassifier
    from torch.utils.data import DataLoader, TensorDataset

    inner = make_model(device, simulate)
    if not simulate:
        cap_memory(inner, device, batch)
    x, y = make_batch(batch * (steps + 1), torch.device("cpu"), 0)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    timer, times = step_timer(device)
    trainer = Trainer(
        model=ComposerClassifier(inner, num_classes=10, loss_fn=F.cross_entropy),
        optimizers=torch.optim.SGD(inner.parameters(), lr=1e-3),
        train_dataloader=loader,
        max_duration=f"{steps + 1}ba",
        device="cpu" if simulate else "gpu",
        device_train_microbatch_size=size,
        callbacks=[timer],
        progress_bar=False,
        log_to_console=False,
    )
    trainer.fit()
    settled = trainer.state.device_train_microbatch_size
    trainer.close()
    return settled, 1e3 * statistics.median(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="CPU, OOMBudget, fixed size")
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cpu") if args.simulate else torch.device("cuda", 0)
    batch = min(args.batch, 256) if args.simulate else args.batch
    if not args.simulate:
        torch.cuda.set_device(device)
    mb, ours = unidist_run(device, batch, args.steps, args.simulate)
    wanted = composer_microbatch_size(mb if args.simulate else "auto", device=device.type)
    if not args.simulate:
        torch.cuda.empty_cache()
    theirs_size, theirs = composer_run(device, batch, args.steps, args.simulate, wanted)
    print(f"batch {batch} on {device}; Composer asked for device_train_microbatch_size={wanted!r}")
    print(f"{'trainer':<24} {'settled size':>12} {'ms/step':>9}")
    print(f"{'unidist MicroBatcher':<24} {mb.size:>12} {ours:>9.1f}")
    print(f"{'Composer Trainer':<24} {theirs_size:>12} {theirs:>9.1f}")
    ok = mb.size is not None and mb.size < batch and theirs_size is not None
    print(f"unidist {mb.size} ({mb.retries} retries) vs Composer {theirs_size}: "
          f"{'PASS' if ok else 'FAIL'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
