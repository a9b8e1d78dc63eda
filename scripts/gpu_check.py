"""Every check that needs a GPU, in one run with one summary table (``scripts/gpu-check``).

    scripts/gpu-check               # on a machine with a CUDA GPU: about 5 minutes on one GPU
    scripts/gpu-check --simulate    # no GPU: the same steps on the CPU (the test command runs it)

Steps, each in its own process with its own time limit:

1. ``probe``: ``unidist probe --json`` and ``unidist.device()`` (CUDA device 0, made current).
2. ``nccl-1``: NCCL in a world of one: initialize, all_reduce on CUDA and CPU tensors, gathers.
3. ``cuda-gloo-2``: collectives on CUDA tensors over 2 processes sharing the GPU (gloo).
4. ``gpu-tests``: every test marked ``gpu`` (``pytest -m gpu``).
5. ``microbatch-oom``: ``MicroBatcher`` recovering from a real CUDA OOM (a memory cap with
   ``torch.cuda.set_per_process_memory_fraction``): settled size, retries, gradient equal to
   accumulation at the settled size (``bench/gpu_microbatch.py``, one process).
6. ``composer-auto``: the same model and cap under Composer's ``Trainer`` with
   ``device_train_microbatch_size="auto"``: its settled size and time per step, beside unidist's.
7. ``bench-gpu-2``: ``bench/gpu_microbatch.py --nproc 2`` (two ranks, one of them capped).
8. ``hang-2``: ``unidist launch -n 2 --hang-timeout 10`` on a job where rank 1 stops while
   rank 0 waits in an all_reduce: over NCCL when the machine has two GPUs; with one (NCCL
   refuses two ranks on one device), rank 1 is stuck in a CUDA kernel it synchronises on (a GPU
   hang) while rank 0 waits over gloo. The report must name rank 1 and its frame, exit 125.

With ``--simulate`` the steps run on the CPU (gloo instead of NCCL, ``OOMBudget`` instead of a
memory cap, Composer with a fixed microbatch since its "auto" needs a GPU, and ``gpu-tests``
only collected), so this script cannot rot on machines without a GPU. Without ``--simulate`` and
without a GPU it says so and exits 2. Exit status 0 when every step passed or was skipped with
a reason (a missing package), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Step:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    seconds: float


def run(command: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``command`` from the repository root; (exit code, stdout then stderr). 124: timeout."""
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return 124, f"{out}\n(killed after {timeout:.0f} s)"
    return done.returncode, done.stdout + done.stderr


def python(code: str, timeout: float) -> tuple[int, str]:
    return run([sys.executable, "-c", code], timeout)


def last_lines(text: str, count: int = 3) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:])[:300]


def step_probe(simulate: bool) -> tuple[str, str]:
    code, out = run([sys.executable, "-m", "unidist", "probe", "--json"], 120)
    if code != 0:
        return "FAIL", last_lines(out)
    info = json.loads(out[out.index("{") :])
    want = "cpu" if simulate else "cuda"
    picked = info["pick"]["device"]
    code, chosen = python(
        "import torch, unidist; d = unidist.device(); "
        "print(d, torch.cuda.current_device() if d.type == 'cuda' else '-')",
        120,
    )
    detail = (
        f"pick {picked} ({info['pick']['reason']}); device() -> {chosen.strip()}; "
        f"torch {info['torch']['version']}, {len(info['cuda']['devices'])} CUDA device(s)"
    )
    ok = code == 0 and picked.startswith(want) and chosen.startswith(want)
    return ("PASS" if ok else "FAIL"), detail


NCCL_WORLD_OF_ONE = """
import torch, unidist
backend, where = {backend!r}, {where!r}
unidist.initialize(backend)
x = torch.arange(4.0, device=where)
assert unidist.all_reduce(x, "mean").tolist() == [0.0, 1.0, 2.0, 3.0]
assert unidist.all_reduce(torch.ones(2)).tolist() == [1.0, 1.0]
assert [t.tolist() for t in unidist.all_gather_uneven(x[:3])] == [[0.0, 1.0, 2.0]]
assert unidist.broadcast_object({{"lr": 0.1}}) == {{"lr": 0.1}}
print("backend", unidist.backend(), "device", x.device)
unidist.finalize()
"""


def step_nccl(simulate: bool) -> tuple[str, str]:
    backend, where = ("gloo", "cpu") if simulate else ("nccl", "cuda")
    code, out = python(NCCL_WORLD_OF_ONE.format(backend=backend, where=where), 180)
    return ("PASS" if code == 0 else "FAIL"), last_lines(out, 1 if code == 0 else 4)


CUDA_GLOO = """
import torch, unidist
from unidist.testing import run_distributed

def job(where):
    rank = unidist.get_rank()
    total = unidist.all_reduce(torch.full((2,), rank + 1.0, device=where))
    rows = unidist.all_gather_uneven(torch.full((rank + 1,), float(rank), device=where))
    sent = unidist.broadcast(torch.arange(3, device=where) * (rank + 1), src=1)
    return total.tolist(), [r.tolist() for r in rows], sent.tolist(), str(total.device)

if __name__ == "__main__":
    for total, rows, sent, device in run_distributed(job, {where!r}, backend="gloo", timeout=120):
        assert (total, rows, sent) == ([3.0, 3.0], [[0.0], [1.0, 1.0]], [0, 2, 4]), (total, rows)
    print("2 ranks, gloo, tensors on", device)
"""


def step_cuda_gloo(simulate: bool) -> tuple[str, str]:
    script = Path(os.environ.get("TMPDIR", "/tmp"), f"unidist-gpu-check-{os.getpid()}.py")
    script.write_text(CUDA_GLOO.format(where="cpu" if simulate else "cuda:0"))
    try:
        # Its ranks use no framework: the fork server need not import Composer and Ignite.
        preload = {"UNIDIST_TESTING_PRELOAD": os.environ.get("UNIDIST_TESTING_PRELOAD", "")}
        code, out = run([sys.executable, str(script)], 240, preload)
    finally:
        script.unlink(missing_ok=True)
    return ("PASS" if code == 0 else "FAIL"), last_lines(out, 1 if code == 0 else 4)


def step_gpu_tests(simulate: bool) -> tuple[str, str]:
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    if simulate:  # nothing to run them on: check that they are collected
        code, out = run([*command, "--collect-only", "tests"], 240)
        found = re.search(r"(\d+)(?:/\d+)? tests? collected", out)
        count = int(found[1]) if found else 0
        ok = code == 0 and count > 0
        return ("PASS" if ok else "FAIL"), f"{count} gpu tests collected (not run: no GPU)"
    code, out = run([*command, "tests"], 300)
    return ("PASS" if code == 0 else "FAIL"), last_lines(out, 1)


def _bench(args: list[str], simulate: bool, timeout: float) -> tuple[str, str]:
    command = [sys.executable, "bench/gpu_microbatch.py", *args]
    if simulate:
        command += ["--simulate", "--steps", "2"]
    code, out = run(command, timeout)
    sizes = [line.strip() for line in out.splitlines() if "sizes:" in line]
    result = "PASS" if code == 0 and "RESULT: PASS" in out else "FAIL"
    return result, ("; ".join(sizes) or last_lines(out, 4))[:300]


def step_microbatch(simulate: bool) -> tuple[str, str]:
    return _bench(["--nproc", "1"], simulate, 300)


def step_bench_two(simulate: bool) -> tuple[str, str]:
    return _bench(["--nproc", "2"], simulate, 400)


def step_composer(simulate: bool) -> tuple[str, str]:
    from importlib.util import find_spec

    if find_spec("composer") is None:
        return "SKIP", "mosaicml is not installed here (it needs torch < 2.7.1)"
    command = [sys.executable, "scripts/gpu_composer.py", *(["--simulate"] if simulate else [])]
    code, out = run(command, 400)
    if code == 0:  # the comparison table, not the frameworks' warnings on stderr
        out = "\n".join(line for line in out.splitlines() if line.startswith(("unidist", "Comp")))
    return ("PASS" if code == 0 else "FAIL"), last_lines(out, 3 if code == 0 else 4)


HANG_JOB = """
import sys, time
import torch, unidist
backend, where = sys.argv[1], sys.argv[2]
unidist.initialize(backend)
rank = unidist.get_rank()
device = torch.device(where if where == "cpu" else f"cuda:{unidist.get_local_rank()}")

def stuck_on_the_gpu():
    if device.type == "cuda":
        torch.cuda._sleep(2**62)  # a kernel that does not end
        torch.cuda.synchronize()
    else:
        time.sleep(3600)

for step in range(1000):
    if rank == 1 and step == 10:
        stuck_on_the_gpu()
    total = unidist.all_reduce(torch.ones(4, device=device))
    total.sum().item()
"""


def step_hang(simulate: bool) -> tuple[str, str]:
    import torch

    if simulate:
        backend, where = "gloo", "cpu"
    elif torch.cuda.device_count() >= 2:
        backend, where = "nccl", "cuda"
    else:
        backend, where = "gloo", "cuda"
    script = Path(os.environ.get("TMPDIR", "/tmp"), f"unidist-gpu-hang-{os.getpid()}.py")
    script.write_text(HANG_JOB)
    try:
        # Simulated: 5 s, as tests/launch/test_hang.py (the test command runs this every time).
        timeout = "5" if simulate else "10"
        command = [sys.executable, "-m", "unidist", "launch", "-n", "2", "--hang-timeout", timeout]
        started = time.monotonic()
        code, out = run([*command, str(script), backend, where], 300)
        took = time.monotonic() - started
    finally:
        script.unlink(missing_ok=True)
    line = next((x for x in out.splitlines() if "no rank made progress" in x), "")
    ok = code == 125 and "rank 1 is" in line and "stuck_on_the_gpu" in line
    detail = f"{backend} on {where}, {took:.0f} s: {line[line.find(': ') + 2 :]}" if line else ""
    return ("PASS" if ok else "FAIL"), (detail or last_lines(out, 4))[:300]


STEPS: list[tuple[str, Callable[[bool], tuple[str, str]]]] = [
    ("probe", step_probe),
    ("nccl-1", step_nccl),
    ("cuda-gloo-2", step_cuda_gloo),
    ("gpu-tests", step_gpu_tests),
    ("microbatch-oom", step_microbatch),
    ("composer-auto", step_composer),
    ("bench-gpu-2", step_bench_two),
    ("hang-2", step_hang),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="run every step on the CPU")
    parser.add_argument("--only", nargs="*", help="step names to run (default: all)")
    args = parser.parse_args()
    import torch

    if not args.simulate and not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU is visible here. HINT: run it on a GPU machine, or add "
              "--simulate to run the same steps on the CPU.")  # fmt: skip
        return 2
    mode = "simulated on the CPU" if args.simulate else torch.cuda.get_device_name(0)
    print(f"gpu-check: {mode}, torch {torch.__version__}, python {sys.version.split()[0]}")
    steps: list[Step] = []
    for name, fn in STEPS:
        if args.only and name not in args.only:
            continue
        started = time.monotonic()
        try:
            status, detail = fn(args.simulate)
        except Exception as exc:  # a broken step is a failed step, and the others still run
            status, detail = "FAIL", f"{type(exc).__name__}: {exc}"[:300]
        steps.append(Step(name, status, detail, time.monotonic() - started))
        print(f"  {name}: {status} ({steps[-1].seconds:.0f} s)", flush=True)
    width = max(len(s.name) for s in steps)
    print("\n== gpu-check summary ==")
    for s in steps:
        print(f"{s.name.ljust(width)}  {s.status}  {s.seconds:5.0f} s  {s.detail}")
    failed = [s.name for s in steps if s.status == "FAIL"]
    print(f"gpu-check: {'FAILED: ' + ', '.join(failed) if failed else 'every step passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
