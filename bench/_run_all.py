"""Run every benchmark under bench/ and write bench/RESULTS.md (``bench/run_all`` calls this).

    bench/run_all                    # every benchmark in full mode (tens of minutes)
    bench/run_all --quick            # every benchmark's --quick mode (a smoke run)
    bench/run_all --only samplers    # a subset

Benchmarks are discovered as bench/*.py not starting with "_", so one added later is included.
Each runs in its own process with this interpreter; its table is copied verbatim. Every figure
in those tables is a ratio against the peer measured in the same run (torch.distributed,
torchrun, Composer, Ignite, hand-written accumulation), interleaved so that drift on a shared
machine hits both sides alike. The report starts with the machine, the versions and the date.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
#: What each benchmark compares, for the report's index.
AGAINST = {
    "checkpoints": "torch.distributed.checkpoint save/async_save/load, Composer's checkpoints",
    "collectives": "raw torch.distributed calls (same processes, alternating blocks)",
    "control_scale": "the all-to-all control protocol it replaced, and bare store traffic",
    "gpu_microbatch": "hand-written gradient accumulation on a real GPU (needs CUDA)",
    "hang": "torchrun (the collective's timeout), TORCH_DISTRIBUTED_DEBUG=DETAIL; no sampler",
    "harness": "torch.multiprocessing.spawn and Ignite's Parallel, per 2-rank test call",
    "import_time": "import torch, Composer's dist and ignite.distributed",
    "launch": "torchrun, composer -n and Ignite's Parallel",
    "microbatch": "hand-written gradient accumulation with DDP no_sync",
    "recovery": "torch's default keep-alive (torchrun's) beside unidist launch's --node-timeout",
    "resume": "the same training step without it, and torch.distributed.checkpoint.save alone",
    "samplers": "torch's DistributedSampler, Composer's get_sampler, Ignite's proxy sampler",
}


def discover() -> list[str]:
    return sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_"))


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "unknown"


def header(quick: bool) -> str:
    import torch

    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = ", ".join(
        f"{name} {_version(dist)}"
        for name, dist in [
            ("unidist", "pytorch-unidist"),
            ("torch", "torch"),
            ("mosaicml", "mosaicml"),
            ("pytorch-ignite", "pytorch-ignite"),
            ("numpy", "numpy"),
        ]
    )
    mode = "quick (smoke run: the figures mean little)" if quick else "full"
    return "\n".join(
        [
            "# Benchmark results",
            "",
            "Written by `bench/run_all`; every figure is measured against a peer in the same run",
            "(see each table's ratio column). Rerun with `bench/run_all` (full mode) on the",
            "machine you care about.",
            "",
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
            f"- machine: {_cpu()}, {cpus} CPUs usable, {_memory_gib()} memory, GPU: {cuda}",
            f"- system: {platform.platform()}, Python {platform.python_version()}",
            f"- versions: {versions}",
            f"- mode: {mode}",
            "",
        ]
    )


def run(name: str, quick: bool, timeout: float) -> tuple[str, float, int]:
    """(output, seconds, exit code) of one benchmark."""
    command = [sys.executable, str(BENCH / f"{name}.py"), *(["--quick"] if quick else [])]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return out + f"\n(killed after {timeout:.0f} s)", time.monotonic() - started, 124
    output = done.stdout if done.returncode == 0 else done.stdout + done.stderr[-3000:]
    return output, time.monotonic() - started, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's --quick mode")
    parser.add_argument("--only", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--output", default=str(BENCH / "RESULTS.md"), help="the report")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    args = parser.parse_args()
    names = discover()
    unknown = sorted(set(args.only or []) - set(names))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; found {names}")
    chosen = [n for n in names if not args.only or n in args.only]
    sections, failed = [header(args.quick)], []
    sections.append("| benchmark | measured against | wall s | status |\n| --- | --- | --- | --- |")
    bodies = []
    for name in chosen:
        print(f"bench/run_all: {name} ...", file=sys.stderr, flush=True)
        output, seconds, code = run(name, args.quick, args.timeout)
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        if code:
            failed.append(name)
        against = AGAINST.get(name, "see its table")
        sections.append(f"| [{name}](#{name}) | {against} | {seconds:.0f} | {status} |")
        mode = " --quick" if args.quick else ""
        bodies.append(
            f"## {name}\n\n`python bench/{name}.py{mode}` ({seconds:.0f} s, {status})\n\n"
            f"```text\n{output.rstrip()}\n```\n"
        )
    report = "\n".join(sections) + "\n\n" + "\n".join(bodies)
    Path(args.output).write_text(report)
    print(f"bench/run_all: wrote {args.output}", file=sys.stderr)
    if failed:
        print(f"bench/run_all: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
