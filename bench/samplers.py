"""One rank's epoch of indices: unidist's samplers against torch's, Composer's and Ignite's.

    python bench/samplers.py --quick   # N = 10^5, one process: checks that it runs (test command)
    python bench/samplers.py           # N = 10^7 and 10^8 (the peers need ~5-9 GB and minutes)

For each dataset size N, rank 0 of world size 8 draws one full epoch of shuffled indices from
each sampler. Every measurement runs in a fresh subprocess, one at a time, so its peak memory is
its own: after imports and construction the process records its resident set as the baseline,
resets the kernel's peak-RSS counter (``/proc/self/clear_refs``; ``ru_maxrss`` elsewhere), then
times the first index and the whole epoch and reads the peak. The table shows time to first
index, epoch time (wall and CPU), peak memory above the baseline, and unidist's ratios against
torch's sampler (goal at N = 10^8: at least 10x faster and 50x less memory).

Contenders: torch ``DistributedSampler``; Composer ``dist.get_sampler(shuffle=True)``; Ignite
``DistributedProxySampler(RandomSampler)`` (what ``auto_dataloader`` builds around a user
sampler); unidist ``DistributedSampler`` with ``order="fast"`` and ``order="torch"``; unidist
``DistributedSamplerWrapper(RandomSampler)``.

Batch rows: what a ``DataLoader`` draws, batches of 256 indices. torch's ``BatchSampler`` over
torch's sampler (one Python step per index) against ``unidist.BatchSampler`` over unidist's
sampler in either order (goal: at least 20x faster at N = 10^8 with ``order="fast"``; first
batch under 10 ms at N = 10^9, a row that only unidist's constant-memory order runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's unidist

WORLD, RANK = 8, 0
CONTENDERS = {
    "torch DistributedSampler": "torch",
    "composer get_sampler": "composer",
    "ignite DistributedProxySampler": "ignite",
    "unidist DistributedSampler (fast)": "unidist",
    "unidist DistributedSampler (torch order)": "unidist-torch",
    "unidist DistributedSamplerWrapper": "unidist-wrapper",
    "torch DistributedSampler + BatchSampler(256)": "torch-batches",
    "unidist DistributedSampler (fast) + BatchSampler(256)": "unidist-batches",
    "unidist DistributedSampler (torch order) + BatchSampler(256)": "unidist-torch-batches",
}
#: Batches of the batch-sampler rows.
BATCH = 256
#: Which peer each unidist row is compared with.
REFERENCE = {
    "unidist": "torch",
    "unidist-torch": "torch",
    "unidist-wrapper": "ignite",
    "unidist-batches": "torch-batches",
    "unidist-torch-batches": "torch-batches",
}


def _build(kind: str, length: int) -> Any:
    import torch

    if kind.endswith("-batches"):
        import unidist

        inner = _build(kind.removesuffix("-batches"), length)
        make = torch.utils.data.BatchSampler if kind == "torch-batches" else unidist.BatchSampler
        return make(inner, BATCH, drop_last=False)
    from torch.utils.data import RandomSampler

    import unidist

    if kind == "torch":
        return torch.utils.data.DistributedSampler(range(length), num_replicas=WORLD, rank=RANK)
    if kind == "composer":
        from composer.utils import dist

        return dist.get_sampler(range(length), shuffle=True, num_replicas=WORLD, rank=RANK)
    if kind == "ignite":
        from ignite.distributed.auto import DistributedProxySampler

        return DistributedProxySampler(RandomSampler(range(length)), num_replicas=WORLD, rank=RANK)
    if kind == "unidist":
        return unidist.DistributedSampler(length, world_size=WORLD, rank=RANK, order="fast")
    if kind == "unidist-torch":
        return unidist.DistributedSampler(length, world_size=WORLD, rank=RANK, order="torch")
    if kind == "unidist-wrapper":
        return unidist.DistributedSamplerWrapper(
            RandomSampler(range(length)), world_size=WORLD, rank=RANK
        )
    raise SystemExit(f"unknown contender {kind!r}")


def _kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        return False
    return True


def _worker(kind: str, length: int) -> dict[str, Any]:
    import collections
    import gc
    import resource

    sampler = _build(kind, length)
    gc.collect()
    baseline = _kib("VmRSS")
    exact_peak = _reset_peak()
    started, cpu_started = time.perf_counter(), time.process_time()
    iterator = iter(sampler)
    first = next(iterator)
    first = first[0] if isinstance(first, list) else first  # a batch sampler's first batch
    first_at = time.perf_counter() - started
    collections.deque(iterator, maxlen=0)  # consume every index, as a DataLoader would
    epoch, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    peak = _kib("VmHWM") if exact_peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "first_index_s": first_at,
        "epoch_s": epoch,
        "cpu_s": cpu,
        "extra_mib": max(0, peak - baseline) / 1024,
        "indices": len(sampler),
        "first": int(first),
        "exact_peak": exact_peak,
    }


def _workers(kinds: list[str], length: int) -> dict[str, dict[str, Any]]:
    """``_worker`` of each kind in turn, in this process; a kind that fails gets its error."""
    results: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        try:
            results[kind] = _worker(kind, length)
        except Exception as exc:  # the row says it; the others still run
            results[kind] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


def _measure(kinds: list[str], length: int, timeout: float) -> dict[str, dict[str, Any]]:
    """Each kind's measurement, taken in one fresh subprocess (one kind each, for the figures)."""
    command = [sys.executable, __file__, "--worker", ",".join(kinds), str(length)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # same threads for every contender
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {kind: {"error": f"timed out after {timeout:.0f} s"} for kind in kinds}
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1]
        return {kind: {"error": error} for kind in kinds}
    results: dict[str, dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ratio(peer: dict[str, Any] | None, ours: dict[str, Any], key: str, floor: float) -> str:
    if peer is None or "error" in peer or "error" in ours:
        return "-"
    ratio = peer[key] / max(ours[key], floor)
    return f"{ratio:.1f}x" if ratio < 100 else f"{ratio:.0f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="N = 10^5 only, one process (a smoke run)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    parser.add_argument("--only", nargs="*", help="contender keys to run (default: all)")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_workers(args.worker[0].split(","), int(args.worker[1]))))
        return 0

    sizes = [10**5] if args.quick else [10**7, 10**8, 10**9]
    chosen = {n: k for n, k in CONTENDERS.items() if not args.only or k in args.only}
    #: At N = 10^9 only unidist's constant-memory batches run (torch's needs ~16 GB and minutes).
    huge = {"unidist-batches"}
    header = ["N", "sampler (rank 0 of 8)", "first index s", "epoch s", "cpu s", "peak MiB"]
    rows = [[*header, "faster", "faster (cpu)", "less memory"]]
    results: dict[str, Any] = {}
    for length in sizes:
        kinds = [kind for kind in chosen.values() if length < 10**9 or kind in huge]
        # A process of its own per contender, so that its peak memory is its own; a smoke run
        # runs every contender's code path in one (a fresh process costs a torch import, 2 s of
        # CPU, nine times), and its figures are not read.
        measured: dict[str, dict[str, Any]] = {}
        for group in [kinds] if args.quick else [[kind] for kind in kinds]:
            print(f"measuring {', '.join(group)} at N={length:.0e} ...", file=sys.stderr)
            measured.update(_measure(group, length, args.timeout))
        for name, kind in chosen.items():
            if kind not in measured:
                continue
            got = measured[kind]
            if "error" in got:
                rows.append(
                    [f"{length:.0e}", name, "-", "-", "-", "-", "-", "-", got["error"][:60]]
                )
                continue
            peer = measured.get(REFERENCE.get(kind, ""))
            rows.append(
                [
                    f"{length:.0e}",
                    name,
                    f"{got['first_index_s']:.4f}",
                    f"{got['epoch_s']:.2f}",
                    f"{got['cpu_s']:.2f}",
                    f"{got['extra_mib']:.1f}",
                    _ratio(peer, got, "epoch_s", 1e-9) if kind in REFERENCE else "",
                    _ratio(peer, got, "cpu_s", 1e-9) if kind in REFERENCE else "",
                    _ratio(peer, got, "extra_mib", 0.1) if kind in REFERENCE else "",
                ]
            )
        results[str(length)] = measured
    print(_table(rows))
    print(
        "\npeak MiB: peak resident memory above the baseline during the epoch. Ratios: unidist "
        "rows against torch's DistributedSampler (fast, torch order) or Ignite's "
        "DistributedProxySampler (wrapper), on wall time, on CPU time (steadier on a shared "
        "machine) and on peak memory (unidist floored at 0.1 MiB). Batch rows: batches of "
        f"{BATCH} against torch's BatchSampler over torch's sampler; 'first index' is the first "
        "batch."
    )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    name = "samplers-quick.json" if args.quick else "samplers.json"
    (out / name).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
