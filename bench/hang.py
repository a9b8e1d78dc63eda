"""Hang attribution: how soon a hang is reported, and what tracking progress costs.

    python bench/hang.py            # full: 3 runs of each launcher, 20-round overhead, W to 1000
    python bench/hang.py --quick    # a smoke run (the test command)

1. **Time to the report.** 2 gloo ranks; at step 20 rank 1 sleeps in user code while rank 0
   waits in all_reduce. Seconds from that moment (rank 1 writes it down) until the launcher
   exits, side by side: ``unidist launch --hang-timeout T``, torchrun (it waits for the
   collective's timeout, C seconds, set in the script: torch's defaults are 30 minutes for gloo,
   10 for NCCL), and torchrun with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (which checks collectives'
   fingerprints, not hangs). Goal: T + 5 s at most; and whether the exit names rank 1.
2. **What tracking costs.** In one 2-rank job (``run_distributed``, whose ranks run the progress
   sampler as ``unidist launch``'s do): tiny steps (a 1-element all_reduce and a counted step)
   with the sampler running, stopped, and running again (A/A), alternating blocks. Goal: within
   the A/A noise, under 1 % of the step.
3. **At scale** (simulated): the launcher's work per look is reading its local ranks' records
   (8 per node); across nodes, one counter ``add`` per node per poll on the rendezvous store,
   and one gather of every node's facts per hang: timed against a real TCPStore with one
   client thread per node, for 1,000 ranks (125 nodes of 8).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import free_port, median, no_framework_preload, table

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
import datetime, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(sys.argv[2])))
rank = dist.get_rank()
for step in range(100000):
    if rank == 1 and step == 20:
        with open(sys.argv[1], "w") as mark:
            mark.write(repr(time.time()))
        time.sleep(3600)  # slow_step: the stuck rank
    dist.all_reduce(torch.ones(4))
"""


def _launchers(collective: float, hang: float) -> dict[str, tuple[list[str], dict[str, str]]]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    return {
        f"unidist launch --hang-timeout {hang:g}": (
            [sys.executable, "-m", "unidist", "launch", "-n", "2", "--hang-timeout", f"{hang:g}"],
            {},
        ),
        "torchrun": ([*torchrun, "2"], {}),
        "torchrun + DETAIL": ([*torchrun, "2"], {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
    }


def time_to_report(
    runs: int, collective: float, hang: float, quick: bool
) -> list[tuple[object, ...]]:
    rows = []
    launchers = _launchers(collective, hang)
    if quick:  # each code path once: DETAIL runs torchrun's path again
        launchers.pop("torchrun + DETAIL")
    with tempfile.TemporaryDirectory(prefix="unidist-bench-hang-") as folder:
        script = Path(folder, "job.py")
        script.write_text(SCRIPT)
        for name, (command, extra) in launchers.items():
            delays, named, codes = [], 0, []
            for i in range(runs):
                mark = Path(folder, f"mark-{len(rows)}-{i}")
                env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **extra}
                env["MASTER_PORT"] = str(free_port())
                done = subprocess.run(
                    [*command, str(script), str(mark), str(collective)],
                    capture_output=True,
                    text=True,
                    timeout=collective + hang + 300,
                    env=env,
                    check=False,
                )
                ended = time.time()
                if mark.exists():
                    delays.append(ended - float(mark.read_text()))
                named += "rank 1 is in user code" in done.stderr
                codes.append(done.returncode)
            rows.append(
                (
                    name,
                    median(delays) if delays else float("nan"),
                    f"{named}/{runs}",
                    ",".join(str(c) for c in sorted(set(codes))),
                )
            )
    return rows


def overhead(blocks: int, steps: int) -> dict[str, list[float]]:
    """Per-rank: seconds per tiny step with the sampler on, off, and on again (A/A)."""
    import torch

    import unidist
    from unidist.hangs import stacks as sampler

    path = os.environ["UNIDIST_PROGRESS"]
    tensor = torch.ones(1)

    def block() -> float:
        unidist.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            unidist.all_reduce(tensor)
            sampler.step()
        return (time.perf_counter() - started) / steps

    out: dict[str, list[float]] = {"on": [], "off": [], "again": [], "look": []}
    current = sampler._current
    if current is not None:
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(200):
                current.look()  # what the thread does ten times a second
            out["look"].append((time.perf_counter() - started) / 200)
    for _ in range(blocks):
        out["on"].append(block())
        sampler.finish()  # the sampler thread stops
        out["off"].append(block())
        sampler._current = None
        sampler.start(path)
        out["again"].append(block())
    return out


def at_scale(nodes: int, local: int, polls: int) -> list[tuple[object, ...]]:
    import torch.distributed as dist

    from unidist.hangs import page as record
    from unidist.hangs.page import Writer
    from unidist.hangs.verdict import RankFacts

    rows: list[tuple[object, ...]] = []
    with tempfile.TemporaryDirectory(prefix="unidist-bench-hang-") as folder:
        writers = [Writer(record.path_for(Path(folder), r)) for r in range(local)]
        for w in writers:
            w.flush()
        started = time.perf_counter()
        for _ in range(polls):
            for r in range(local):
                record.read(record.path_for(Path(folder), r))
        per_look = (time.perf_counter() - started) / polls
        rows.append((f"read {local} local records (one look)", per_look * 1e6, "us"))
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = server.port
    clients = [dist.TCPStore("127.0.0.1", port, is_master=False) for _ in range(nodes)]
    latencies: list[float] = []
    lock = threading.Lock()

    def node(i: int) -> None:
        mine = []
        for _ in range(polls):
            t = time.perf_counter()
            clients[i].add("progress", 1)
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(nodes)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    rows.append((f"{nodes} nodes x {polls} polls: one add each", median(latencies) * 1e6, "us"))
    rows.append(("  store load", nodes * polls / wall, "adds/s"))
    facts = json.dumps(
        [
            RankFacts(r, 0, "host", "running", "collective", "all_reduce", 9).to_json()
            for r in range(local)
        ]
    )
    for i in range(nodes):
        clients[i].set(f"hang/{i}", facts)
    started = time.perf_counter()
    for i in range(nodes):
        if clients[0].check([f"hang/{i}"]):
            clients[0].get(f"hang/{i}")
    rows.append(
        (
            f"gather {nodes} nodes' facts ({nodes * local} ranks)",
            (time.perf_counter() - started) * 1e3,
            "ms",
        )
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (the test command)")
    args = parser.parse_args()
    no_framework_preload()
    runs, collective, hang = (1, 10.0, 3.0) if args.quick else (3, 60.0, 10.0)
    blocks, steps = (3, 200) if args.quick else (20, 500)
    nodes, polls = (16, 20) if args.quick else (125, 200)

    print(f"1. time to the report: rank 1 stuck in user code, collective timeout {collective:g} s")
    rows = time_to_report(runs, collective, hang, args.quick)
    print(table(["launcher", "s to exit", "names rank 1", "exit code"], rows))
    ours = rows[0][1]
    print(f"goal: --hang-timeout + 5 s = {hang + 5:g} s; unidist launch took {ours:.1f} s")

    from unidist.testing import run_distributed

    per_rank = run_distributed(overhead, blocks, steps, timeout=900, hang_timeout=0)
    on = max(median(r["on"]) for r in per_rank) * 1e6
    off = max(median(r["off"]) for r in per_rank) * 1e6
    again = max(median(r["again"]) for r in per_rank) * 1e6
    print(f"\n2. what tracking costs: 2 gloo ranks, tiny steps (median of {blocks} blocks)")
    rows2 = [
        ("sampler off", off, 1.0),
        ("sampler on", on, on / off),
        ("sampler on again (A/A)", again, again / off),
    ]
    print(table(["step", "us", "ratio"], rows2))
    print(
        f"tracking costs {on - off:+.1f} us a step ({(on - off) / off:+.2%}); the same loop "
        f"twice differs by {again - on:+.1f} us ({(again - on) / off:+.2%})"
    )
    look = max(median(r["look"]) for r in per_rank) * 1e6
    print(
        f"one look of the sampler (its stack, sequence numbers, the record): {look:.0f} us; ten "
        f"a second: {look * 10 / 1e4:.3f} % of one core; the training thread pays nothing per "
        "collective or step but a counter"
    )

    print(f"\n3. at scale: {nodes * 8} ranks simulated ({nodes} nodes of 8, one thread each)")
    print(table(["what", "median", "unit"], at_scale(nodes, 8, polls)))


if __name__ == "__main__":
    main()
