"""MicroBatcher against real CUDA out-of-memory errors; prints a pass/fail summary.

    python bench/gpu_microbatch.py              # one process on GPU 0
    python bench/gpu_microbatch.py --nproc 2    # two processes: NCCL on 2+ GPUs, else gloo on GPU 0

The memory of one process (rank 1 with ``--nproc 2``) is capped with
``torch.cuda.set_per_process_memory_fraction`` so that a batch of ``--batch`` samples needs about
five times what fits, after calibrating how much memory a sample takes. Then it checks:

* the capped rank really runs out of memory, the size settles after at most
  ``ceil(log2(batch))`` retries at a size that then runs without OOM, and every rank agrees;
* a real CUDA OOM is recognised by ``unidist.is_oom``;
* the gradient equals hand-written gradient accumulation at the settled size (DDP: ``no_sync``
  on all but the last microbatch);
* the step time is within 3% of hand-written accumulation (a goal, reported separately).

Without a GPU it says so and exits with status 0. ``--simulate`` runs the same flow on CPU with
``unidist.testing.OOMBudget`` instead of a memory cap (to test this script without a GPU);
``--quick`` is ``--simulate`` with two timed steps, which the test command runs.
Exit status: 0 when every check passes (goals do not count), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: Run from a checkout without installing: use its sources.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

WIDTH, FEATURES, CLASSES = 8192, 1024, 10
#: The cap lets this share of the batch fit (so sizes batch/8 fit, batch/4 do not).
FITS = 0.2


def make_model(device: torch.device, simulate: bool) -> nn.Module:
    torch.manual_seed(0)
    width = 64 if simulate else WIDTH
    return nn.Sequential(
        nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, CLASSES),
    ).to(device)  # fmt: skip


def make_batch(n: int, device: torch.device, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(n, FEATURES, generator=gen)
    return x.to(device), torch.randint(0, CLASSES, (n,), generator=gen).to(device)


def loss_of(model: nn.Module) -> Any:
    return lambda b: F.cross_entropy(model(b[0]), b[1])


def hand_written(model: nn.Module, batch: Any, size: int) -> None:
    """Gradient accumulation as people write it (DDP syncs on the last microbatch only)."""
    x, y = batch
    parts = list(zip(x.split(size), y.split(size), strict=True))
    for i, (xs, ys) in enumerate(parts):
        last = i == len(parts) - 1
        ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        with model.no_sync() if ddp and not last else contextlib.nullcontext():
            (F.cross_entropy(model(xs), ys) * (len(xs) / len(x))).backward()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def calibrate(model: nn.Module, device: torch.device, probe: int) -> tuple[int, float]:
    """(bytes held with gradients, bytes per sample at peak) from one step of ``probe`` samples."""
    batch = make_batch(probe, device, 0)
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    loss_of(model)(batch).backward()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    base = torch.cuda.memory_allocated(device)  # parameters, gradients and the batch
    return base, max(peak - base, 1) / probe


def cap_memory(model: nn.Module, device: torch.device, batch: int) -> dict[str, Any]:
    """Cap this process's CUDA memory so that FITS * batch samples fit, and check a real OOM."""
    base, per_sample = calibrate(model, device, probe=min(256, batch))
    batch_bytes = batch * (FEATURES * 4 + 8)  # the batch itself stays on the device
    limit = base + batch_bytes + per_sample * batch * FITS + 64 * 2**20  # + allocator slack
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(limit / total, 0.95)
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    reason = None
    try:
        torch.empty(int(limit * 2), dtype=torch.uint8, device=device)
    except Exception as exc:  # the point: see how a real CUDA OOM is classified
        import unidist

        reason = unidist.is_oom(exc) or f"NOT RECOGNISED: {type(exc).__name__}: {exc}"[:300]
    torch.cuda.empty_cache()
    return {
        "limit_gib": limit / 2**30,
        "fraction": fraction,
        "per_sample_kib": per_sample / 2**10,
        "real_oom": reason,
    }


def run_rank(rank: int, world: int, args: argparse.Namespace, out: str, port: int) -> None:
    """One rank's whole job; writes its findings to ``out``/rank{rank}.json."""
    found: dict[str, Any] = {"rank": rank}
    try:
        found.update(job(rank, world, args, port))
    except BaseException:
        found["crash"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(found))


def job(rank: int, world: int, args: argparse.Namespace, port: int) -> dict[str, Any]:
    import unidist
    from unidist.testing import OOMBudget

    logging.getLogger("unidist.microbatch").setLevel(logging.ERROR)  # the summary has it all
    device = torch.device("cpu")
    if args.simulate:
        torch.set_num_threads(1)
    else:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # exact comparisons below
        torch.backends.cudnn.allow_tf32 = False
    if world > 1:
        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        )  # fmt: skip
        backend = "gloo" if args.simulate or torch.cuda.device_count() < world else "nccl"
        unidist.initialize(backend, timeout=args.timeout)
    found: dict[str, Any] = {"device": str(device), "backend": unidist.backend()}
    inner = make_model(device, args.simulate)
    found["parameters_m"] = sum(p.numel() for p in inner.parameters()) / 1e6
    # Wrap first: DDP's gradient buckets must count in the calibration of the memory cap.
    model = nn.parallel.DistributedDataParallel(inner) if world > 1 else inner
    capped = rank == world - 1  # the last rank is short of memory, the others are not
    budget: Any = contextlib.nullcontext()
    if capped and args.simulate:
        budget = OOMBudget(int(args.batch * FITS)).attach(inner)
    elif capped:
        found.update(cap_memory(inner, device, args.batch))
    mb = unidist.MicroBatcher(model)
    batch = make_batch(args.batch, device, rank)
    with budget:
        found.update(settle_and_compare(mb, model, batch, device, args.steps))
    if world > 1:
        unidist.barrier()
        unidist.finalize()
    return found


def settle_and_compare(
    mb: Any, model: nn.Module, batch: Any, device: torch.device, steps: int
) -> dict[str, Any]:
    """Settle, then compare with hand-written accumulation at the settled size.

    The MicroBatcher runs first and hand-written accumulation second: DDP rebuilds its buckets
    (a collective, and an allocation) in the first forward after its first synced backward,
    which belongs to hand-written DDP, not inside a MicroBatcher attempt.
    """
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)
    start = [p.detach().to("cpu", copy=True) for p in params]
    mb.step(batch, loss_of(model))  # settles during this step
    size = mb.size
    found: dict[str, Any] = {
        "size": size,
        "retries": mb.retries,
        "history": [[c.old, c.new, c.reason] for c in mb.history],
    }
    mine = [p.grad.detach().to("cpu", copy=True) for p in params]
    found["unidist_ms"] = timed(lambda: mb.step(batch, loss_of(model)), opt, device, steps)
    found["retries_after"] = mb.retries
    with torch.no_grad():
        for p, value in zip(params, start, strict=True):
            p.copy_(value)
    opt.zero_grad(set_to_none=True)
    hand_written(model, batch, size)
    theirs = [p.grad.detach().to("cpu") for p in params]
    found["grad_rel"] = max(
        ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
        for a, b in zip(mine, theirs, strict=True)
    )
    found["hand_ms"] = timed(lambda: hand_written(model, batch, size), opt, device, steps)
    return found


def timed(step: Any, opt: torch.optim.Optimizer, device: torch.device, steps: int) -> float:
    """Median milliseconds of ``steps`` optimizer steps (after two warm-up steps)."""
    times = []
    for i in range(steps + 2):
        opt.zero_grad(set_to_none=True)
        sync(device)
        begin = time.perf_counter()
        step()
        opt.step()
        sync(device)
        if i >= 2:
            times.append(time.perf_counter() - begin)
    return 1e3 * statistics.median(times)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(world: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run every rank (in this process when alone) and collect what each found."""
    with tempfile.TemporaryDirectory(prefix="unidist-gpu-bench-") as out:
        return run_ranks(world, args, out)


def run_ranks(world: int, args: argparse.Namespace, out: str) -> list[dict[str, Any]]:
    """Run the ranks, each writing its findings under `out`, and read them back."""
    if world == 1:
        run_rank(0, 1, args, out, 0)
    else:
        import torch.multiprocessing as mp

        context = mp.start_processes(
            run_rank, args=(world, args, out, free_port()), nprocs=world, join=False,
            start_method="spawn",
        )  # fmt: skip
        deadline = time.monotonic() + args.timeout * 3
        try:
            while not context.join(timeout=5):
                if time.monotonic() > deadline:
                    print(f"the ranks did not finish within {args.timeout * 3:.0f} s; killed")
                    break
        except Exception as exc:  # a rank died without writing its findings
            print(f"a rank exited abnormally: {exc}")
        for process in context.processes:
            if process.is_alive():
                process.kill()
    found = []
    for rank in range(world):
        path = Path(out, f"rank{rank}.json")
        found.append(json.loads(path.read_text()) if path.exists() else {"rank": rank})
    return found


def summarise(found: list[dict[str, Any]], args: argparse.Namespace) -> bool:
    """Print what happened and the pass/fail lines; True when every check passed."""
    bound = math.ceil(math.log2(args.batch))
    checks: list[tuple[bool, str]] = []
    goals: list[tuple[bool, str]] = []
    for f in found:
        if "crash" in f or "size" not in f:
            checks.append((False, f"rank {f['rank']} finished: {f.get('crash', 'no result')}"))
            continue
        where = f"rank {f['rank']} ({f['device']}, {f['backend'] or 'no process group'})"
        print(f"{where}: model {f['parameters_m']:.1f} M parameters")
        if "limit_gib" in f:
            print(
                f"  memory cap {f['limit_gib']:.2f} GiB (fraction {f['fraction']:.4f}); "
                f"{f['per_sample_kib']:.0f} KiB per sample at peak; a real OOM: {f['real_oom']}"
            )
            ok = f["real_oom"] is not None and not f["real_oom"].startswith("NOT")
            checks.append((ok, f"rank {f['rank']}: a real CUDA OOM is recognised by is_oom"))
        steps = " -> ".join(str(h[1]) for h in f["history"])
        print(f"  sizes: {args.batch} -> {steps}  ({f['retries']} retries; bound {bound})")
        for old, new, reason in f["history"]:
            print(f"    {old} -> {new}: {reason[:160]}")
        print(
            f"  gradient vs hand-written at {f['size']}: max relative difference "
            f"{f['grad_rel']:.1e}; step {f['unidist_ms']:.1f} ms vs {f['hand_ms']:.1f} ms"
        )
        checks.append(
            (
                f["retries"] >= 1,
                f"rank {f['rank']}: the capped rank ran out of memory at least once (else the "
                "cap was too loose to test anything)",
            )
        )
        checks.append(
            (f["retries"] <= bound, f"rank {f['rank']}: {f['retries']} retries <= {bound}")
        )
        checks.append(
            (
                f["retries_after"] == f["retries"],
                f"rank {f['rank']}: the settled size {f['size']} ran {args.steps + 2} more steps "
                "without an OOM",
            )
        )
        checks.append((f["grad_rel"] <= 1e-5, f"rank {f['rank']}: gradient equal (<= 1e-5)"))
        ratio = f["unidist_ms"] / f["hand_ms"]
        goals.append((ratio <= 1.03, f"rank {f['rank']}: step time ratio {ratio:.3f} <= 1.03"))
    sizes = {f.get("size") for f in found}
    checks.append((len(sizes) == 1, f"every rank has the same size: {sorted(map(str, sizes))}"))
    print()
    for ok, text in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    for ok, text in goals:
        print(f"{'PASS' if ok else 'MISS'}  goal: {text}")
    passed = all(ok for ok, _ in checks)
    print(f"\nRESULT: {'PASS' if passed else 'FAIL'}")
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=1, choices=(1, 2))
    parser.add_argument("--batch", type=int, default=8192, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per contender")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per wait")
    parser.add_argument("--simulate", action="store_true", help="CPU dry run with OOMBudget")
    parser.add_argument("--quick", action="store_true", help="--simulate, 2 steps (smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.simulate, args.steps = True, 2
    if not args.simulate and not torch.cuda.is_available():
        print("No CUDA GPU is visible, so there is nothing to measure: run this on a GPU machine.")
        print("(`--simulate` runs the same flow on CPU with simulated OOMs.)")
        return 0
    if args.simulate:
        args.batch = min(args.batch, 256)
    name = "CPU (simulated OOM)" if args.simulate else torch.cuda.get_device_name(0)
    print(
        f"MicroBatcher with real OOM: {args.nproc} process(es) on {name}, torch {torch.__version__}"
    )
    return 0 if summarise(launch(args.nproc, args), args) else 1


if __name__ == "__main__":
    sys.exit(main())
