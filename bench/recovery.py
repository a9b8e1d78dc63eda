"""Recovery time: from a node leaving to the first step the survivors train, and where it goes.

    python bench/recovery.py [--runs 3]
    python bench/recovery.py --quick     # one run (the test command)

Two launchers of ``examples/elastic.py`` meet at a c10d rendezvous on this machine (``--nnodes
1:2``, one rank each). Once both train, node B is killed whole (SIGKILL to its launcher and its
rank: a host that goes down). The survivor's rank fails in its next collective, torch's agent
restarts it in a new rendezvous round, and it resumes from the last checkpoint. Times, from
the kill (medians over the runs):

* detection: until the survivor's rank is known to have failed (its error record);
* rendezvous: until the new start of its rank (its start record), through torch's rendezvous;
* restore: until its first step of the new start (the example's record of each step).

The rendezvous, the largest part, waits until the dead node's keep-alive runs out
(``keep_alive_interval`` times ``keep_alive_max_attempt``): 5 s x 3 with torch's defaults
(torchrun's), 2 s x 3 with ``unidist launch``'s ``--node-timeout 6``. Both tables run
``unidist launch``; the first sets torch's keep-alive through ``--rdzv-conf``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import contextlib

from _util import free_port, median, table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "elastic.py")


def _lines(record: Path) -> list[dict[str, object]]:
    found = []
    for path in record.glob("reads-*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def _wait(condition, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {seconds:g} s waiting for {what}")
        time.sleep(0.05)


def one_run(folder: Path, conf: str) -> dict[str, float]:
    record, checkpoint = folder / "record", folder / "ckpt"
    record.mkdir(parents=True)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def launcher(name: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "unidist", "launch", "--nnodes", "1:2"]
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        command += ["--rdzv-id", "bench", "--rdzv-conf", conf, "--max-restarts", "3", "-n", "1"]
        command += ["--log-dir", str(folder / name), EXAMPLE, "--checkpoint", str(checkpoint)]
        command += ["--record", str(record), "--epochs", "50", "--save-every", "5"]
        command += ["--step-delay", "0.05", "--workers", "0"]
        return subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    a = launcher("a")
    b = None
    try:
        _wait(lambda: any(x["world"] == 1 for x in _lines(record)), 180, "node A alone")
        b = launcher("b")
        _wait(lambda: sum(x["world"] == 2 for x in _lines(record)) >= 40, 180, "both nodes")
        killed = time.time()
        os.killpg(b.pid, signal.SIGKILL)  # node B's host goes down
        b.wait(timeout=30)
        _wait(
            lambda: any(x["world"] == 1 and float(x["t"]) > killed for x in _lines(record)),  # type: ignore[arg-type]
            300,
            "the survivor's first step",
        )
        first = min(
            float(x["t"])  # type: ignore[arg-type]
            for x in _lines(record)
            if x["world"] == 1 and float(x["t"]) > killed  # type: ignore[arg-type]
        )
        events = next((folder / "a").iterdir()) / ".events"
        errors = [p.stat().st_mtime for p in events.glob("error-*.json")]
        starts = [
            p.stat().st_mtime for p in events.glob("start-*.json") if p.stat().st_mtime > killed
        ]
        failed = min((t for t in errors if t > killed), default=min(starts))
        restarted = min(starts)
        return {
            "detection": failed - killed,
            "rendezvous": restarted - failed,
            "restore": first - restarted,
            "total": first - killed,
        }
    finally:
        for proc in (a, b):
            if proc is not None:
                with_suppress_kill(proc)


def with_suppress_kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run (a smoke run)")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    settings = {
        "torch's keep-alive (5 s x 3, torchrun's)": (
            "last_call_timeout=1,keep_alive_interval=5,keep_alive_max_attempt=3"
        ),
        "unidist launch's default (--node-timeout 6: 2 s x 3)": "last_call_timeout=1",
    }
    if args.quick:  # one code path: the two settings differ only in a number
        settings.pop(next(iter(settings)))
    print("2 nodes (launchers) on one machine, one rank each; node B killed whole; seconds")
    for title, conf in settings.items():
        results = []
        for i in range(runs):
            with tempfile.TemporaryDirectory(prefix="unidist-bench-recovery-") as folder:
                results.append(one_run(Path(folder) / f"run{i}", conf))
        parts = ("detection", "rendezvous", "restore", "total")
        rows = [(part, median([r[part] for r in results])) for part in parts]
        print(f"\n{title} (median of {runs})")
        print(table(["from the kill to", "s"], rows))


if __name__ == "__main__":
    main()
