"""An elastic job under ``unidist launch --nnodes 1:2``: a node joins mid-epoch, then one dies, and
every sample is still trained on exactly once per epoch (examples/elastic.py, ResumableState)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests._waiting import signal_pending, stop, wait_for
from tests.launch.helpers import assert_nothing_left, c10d, free_port, pids_of, start_launch
from unidist.launch.rank.runtime import STACK_SIGNAL

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "elastic.py")
SAMPLES, GLOBAL_BATCH, EPOCHS = 480, 8, 2
STEPS = SAMPLES // GLOBAL_BATCH * EPOCHS


def reads(folder: Path, pattern: str = "reads-*.jsonl") -> list[dict[str, Any]]:
    """Every line of every rank's reads log (a rank may be writing its last line: skipped)."""
    lines = []
    for path in folder.glob(pattern):
        for line in path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
    return lines


def steps_on(folder: Path, world: int) -> int:
    return len({line["step"] for line in reads(folder) if line["world"] == world})


def last_step(folder: Path, world: int) -> int:
    return max(line["step"] for line in reads(folder) if line["world"] == world)


def trainer(folder: Path, log_dir: Path, world: int) -> int:
    """The pid of the rank that the launcher logging to ``log_dir`` started in ``world``."""
    ours = set(pids_of(log_dir))
    pids = [
        pid
        for path in folder.glob("reads-*.jsonl")
        if (pid := int(path.stem.rsplit("-p", 1)[1])) in ours
        and any(line["world"] == world for line in reads(folder, path.name))
    ]
    assert len(pids) == 1, f"one rank of {log_dir.name} trains in a world of {world}: {pids}"
    return pids[0]


def resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def committed(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reads whose step a later start did not roll back.

    A start is known by (world size, the step it resumed from). A step it read counts if the
    next start resumed at or after it; the start that finished the job counts in full.
    """
    starts = sorted(
        {(line["world"], line["resumed_from"]) for line in lines},
        key=lambda key: (
            key[1],
            any(x["step"] == STEPS for x in lines if (x["world"], x["resumed_from"]) == key),
        ),
    )
    kept = []
    for i, key in enumerate(starts):
        upto = starts[i + 1][1] if i + 1 < len(starts) else STEPS
        kept += [x for x in lines if (x["world"], x["resumed_from"]) == key and x["step"] <= upto]
    return kept


def test_a_node_joins_and_one_dies_mid_epoch_and_every_sample_is_read_once(
    tmp_path: Path,
) -> None:
    record, checkpoint = tmp_path / "record", tmp_path / "checkpoint"
    record.mkdir()
    training = ["--samples", str(SAMPLES), "--global-batch-size", str(GLOBAL_BATCH)]
    training += ["--epochs", str(EPOCHS), "--save-every", "5"]
    job = [EXAMPLE, "--checkpoint", str(checkpoint), "--record", str(record), *training]
    job += ["--step-delay", "0.1"]  # long enough for a join and a kill mid-epoch
    job += ["--workers", "1"]  # the join's SIGTERM reaches the worker too: it must not end it
    port = free_port()
    elastic = ["--rdzv-conf", "last_call_timeout=1", "--max-restarts", "3", "-n", "1"]
    weights = ["--weights", str(tmp_path / "weights.json")]
    first = start_launch(*c10d(port, "1:2", tmp_path / "a", *elastic), *job, *weights)
    second, held = None, []
    try:
        wait_for(lambda: steps_on(record, 1) >= 15, 120, "node A to train 15 steps alone")
        # Node A's rank waits, stopped, until node B has joined: however long B takes to start,
        # A cannot train the epochs alone meanwhile. The join shows as the SIGTERM that torch's
        # agent sends it (pending while it is stopped); continued, it saves at that step.
        held.append(alone := trainer(record, tmp_path / "a", 1))
        stop(alone)
        second = start_launch(*c10d(port, "1:2", tmp_path / "b", *elastic), *job)
        wait_for(lambda: signal_pending(alone, signal.SIGTERM), 180, "node B's join to stop node A")
        resume(alone)
        wait_for(lambda: steps_on(record, 2) >= 15, 120, "nodes A and B to train 15 steps")
        # Node B dies mid-epoch, after a step that no save covers (saves come every 5th): A's
        # rank is held while B goes, and a collective needs both, so nothing moves meanwhile.
        held.append(joined := trainer(record, tmp_path / "a", 2))
        stop(joined)
        while (last := last_step(record, 2)) % 5 == 0:
            resume(joined)
            wait_for(lambda n=last: last_step(record, 2) > n, 120, f"the joined step {last + 1}")
            stop(joined)
        second.kill()  # node B dies: no signal, no checkpoint of its own
        second.communicate(timeout=30)
        resume(joined)
        try:
            out, err = first.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            first.kill()
            out, err = first.communicate(timeout=30)
            pytest.fail(f"node A did not finish within 300 s after node B died:\n{err[-5000:]}")
    finally:
        for pid in held:
            resume(pid)
        for launcher in (first, second):
            if launcher is not None:
                launcher.kill()
                launcher.communicate(timeout=30)
    assert first.returncode == 0, (out[-3000:], err[-3000:])
    lines = reads(record)
    # The starts (a world size and the step it resumed from) in the order they began. Not the
    # lines sorted by step: a step redone after the restart is read in two starts, and when node B
    # died after the last step, the last line by step was as likely the joined world's.
    began: dict[tuple[int, int], float] = {}
    for line in lines:
        key = (line["world"], line["resumed_from"])
        began[key] = min(began.get(key, line["t"]), line["t"])
    worlds = [world for world, _ in sorted(began, key=began.__getitem__)]
    assert (worlds[0], 2 in worlds, worlds[-1]) == (1, True, 1), "alone, joined, alone again"
    # The join stopped node A's rank mid-epoch with SIGTERM; it saved at that step and left.
    summary = err[err.find("unidist launch:") :]
    assert "stopped by torch's agent when the nodes changed (world size 1 -> 2)" in summary
    assert "went away" in summary  # node B's death broke the next collective: a restart

    kept = committed(lines)
    assert len(kept) < len(lines), "node B died after the last save: some reads were redone"
    for epoch in range(EPOCHS):
        counts = Counter(i for x in kept if x["epoch"] == epoch for i in x["ids"])
        assert sorted(counts) == list(range(SAMPLES)), f"epoch {epoch} missed samples"
        assert set(counts.values()) == {1}, f"epoch {epoch} read samples twice"
    assert sorted({x["step"] for x in kept}) == list(range(1, STEPS + 1))
    mid_epoch = [x["resumed_from"] % (SAMPLES // GLOBAL_BATCH) for x in kept]
    assert any(mid_epoch), "every restart began at an epoch boundary"

    # The same training in one process, uninterrupted: the same samples in every step. The
    # weights agree to rounding: two ranks average two half-batch gradients, one process
    # averages the whole batch, and float addition is not associative.
    alone = subprocess.run(
        [
            sys.executable,
            EXAMPLE,
            "--checkpoint",
            str(tmp_path / "alone"),
            *training,
            "--weights",
            str(tmp_path / "alone.json"),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    elastic_weights = json.loads((tmp_path / "weights.json").read_text())
    alone_weights = json.loads((tmp_path / "alone.json").read_text())
    pairs = zip(elastic_weights, alone_weights, strict=True)
    gap = max(abs(a - b) for p, q in pairs for a, b in zip(p, q, strict=True))
    print(f"largest weight difference from an uninterrupted single process: {gap:.2e}")
    assert gap < 1e-4
    for folder in (tmp_path / "a", tmp_path / "b"):
        assert_nothing_left(folder)


def _rank_logs(log_dir: Path) -> list[Path]:
    """The stderr logs of the last attempt of the run in ``log_dir``."""
    attempts = sorted(log_dir.glob("*/attempt*"), key=lambda p: int(p.name[len("attempt") :]))
    return sorted(attempts[-1].glob("rank*.stderr.log")) if attempts else []


def _outputs(
    nodes: list[subprocess.Popen[str]], log_dirs: list[Path], timeout: float = 240
) -> list[tuple[str, str]]:
    """Each launcher's (stdout, stderr) once all have exited. Past ``timeout`` (under
    pytest-timeout's 300 s, so that nothing is lost) every rank writes its threads' stacks to its
    log (faulthandler, on unidist's stack signal) and the test fails showing them and what each
    launcher printed."""
    try:
        return [node.communicate(timeout=timeout) for node in nodes]
    except subprocess.TimeoutExpired:
        pass
    logs = [log for log_dir in log_dirs for log in _rank_logs(log_dir)]
    sizes = {log: log.stat().st_size for log in logs}
    for pid in (pid for log_dir in log_dirs for pid in pids_of(log_dir)):
        # An earlier attempt's pid may be another process's by now: the signal kills by default.
        with contextlib.suppress(OSError):
            if b"unidist.launch.rank.bootstrap" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, STACK_SIGNAL)
    with contextlib.suppress(AssertionError):  # a rank already gone writes nothing: show the rest
        wait_for(
            lambda: all("most recent call first" in log.read_text()[sizes[log] :] for log in logs),
            30,
            "every rank's stacks",
        )
    for node in nodes:
        node.kill()
    printed = [node.communicate(timeout=30) for node in nodes]
    shown = [f"--- {log} (last 6000 chars)\n{log.read_text()[-6000:]}" for log in logs]
    shown += [f"--- launcher {i} stderr\n{err[-3000:]}" for i, (_, err) in enumerate(printed)]
    pytest.fail(f"the job did not end within {timeout} s:\n" + "\n".join(shown))


def test_a_third_node_joins_two_without_costing_a_restart(tmp_path: Path) -> None:
    # torch's agent SIGTERMs every rank when a node joins. Each node's launcher must leave that
    # to its agent: told as a failure, it stopped the other node's ranks before that node's
    # agent saw the join, and with --max-restarts 0 the job failed (torchrun's goes on).
    record, checkpoint = tmp_path / "record", tmp_path / "checkpoint"
    record.mkdir()
    job = [EXAMPLE, "--checkpoint", str(checkpoint), "--record", str(record)]
    job += ["--samples", "432", "--global-batch-size", "12", "--epochs", "4"]
    job += ["--save-every", "5", "--step-delay", "0.15"]
    port = free_port()
    elastic = ["--rdzv-conf", "last_call_timeout=1", "--max-restarts", "0", "-n", "1"]
    nodes = [start_launch(*c10d(port, "2:3", tmp_path / f"n{i}", *elastic), *job) for i in (0, 1)]
    try:
        wait_for(lambda: steps_on(record, 2) >= 10, 120, "two nodes to train 10 steps")
        nodes.append(start_launch(*c10d(port, "2:3", tmp_path / "n2", *elastic), *job))
        outputs = _outputs(nodes, [tmp_path / f"n{i}" for i in range(3)])
    finally:
        for node in nodes:
            node.kill()
            node.communicate(timeout=30)
    assert [node.returncode for node in nodes] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    lines = reads(record)
    assert {line["world"] for line in lines} == {2, 3}
    for epoch in range(4):  # 36 steps of 12 samples: each sample once, no rollback needed
        counts = Counter(i for x in lines if x["epoch"] == epoch for i in x["ids"])
        assert sorted(counts) == list(range(432)), f"epoch {epoch} missed samples"
        assert set(counts.values()) == {1}, f"epoch {epoch} read samples twice"


def _workers_of(log_dir: Path) -> list[int]:
    """The DataLoader workers of the ranks that the launcher in ``log_dir`` started."""
    import psutil

    found = []
    for pid in pids_of(log_dir):
        with contextlib.suppress(psutil.Error):
            found += [child.pid for child in psutil.Process(pid).children()]
    return found


def _start(record: Path, checkpoint: Path, log_dir: Path, *extra: str) -> subprocess.Popen[str]:
    job = [EXAMPLE, "--checkpoint", str(checkpoint), "--record", str(record), "--workers", "1"]
    job += ["--samples", "240", "--global-batch-size", "8", "--epochs", "2"]
    job += ["--save-every", "1000", "--step-delay", "0.05", *extra]
    return start_launch("-n", "2", "--log-dir", str(log_dir), *job)


def test_dataloader_workers_live_until_the_agreed_save(tmp_path: Path) -> None:
    # torch's agent (and SLURM) signal the rank's whole process group: its DataLoader workers
    # got the SIGTERM too, died first, and the rank failed on "DataLoader worker (pid N) is
    # killed by signal: Terminated" before it could save. Four starts of one job, with a
    # worker per rank: stopped by SIGTERM to the launcher, then (persistent workers) by SIGTERM
    # to one rank, then by SIGUSR1 to the launcher (SLURM's warning before a time limit), then
    # run to the end; every sample is read once per epoch.
    record, checkpoint = tmp_path / "record", tmp_path / "checkpoint"
    record.mkdir()
    saved: list[int] = []
    for i, how in enumerate(("launcher", "one rank", "slurm")):
        log_dir = tmp_path / f"start{i}"
        extra = ["--persistent-workers"] if how == "one rank" else []
        launcher = _start(record, checkpoint, log_dir, *extra)
        before = len(reads(record))
        try:
            wait_for(lambda n=before: len(reads(record)) >= n + 20, 120, "10 steps of this start")
            workers = _workers_of(log_dir)
            assert len(workers) == 2, workers  # one per rank
            if how == "launcher":
                launcher.send_signal(signal.SIGTERM)
            elif how == "one rank":
                os.kill(pids_of(log_dir)[0], signal.SIGTERM)
            else:  # SLURM's --signal=USR1@90 reaches the launcher under srun
                launcher.send_signal(signal.SIGUSR1)
            _, err = launcher.communicate(timeout=120)
        finally:
            launcher.kill()
            launcher.communicate(timeout=30)
        assert "DataLoader worker" not in err, err[-4000:]
        name = "SIGUSR1" if how == "slurm" else "SIGTERM"
        assert f"and stopping: {name}" in err, err[-4000:]
        if how == "slurm":
            assert "SIGUSR1 was passed on to every rank, and they stopped" in err, err[-3000:]
        step = json.loads((checkpoint / "latest.json").read_text())["step"]
        assert step > (saved[-1] if saved else 0)
        saved.append(step)
        assert_nothing_left(log_dir, *workers)
    launcher = _start(record, checkpoint, tmp_path / "start3")
    _, err = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, err[-4000:]
    lines = committed_to(reads(record), saved)
    for epoch in range(2):
        counts = Counter(i for x in lines if x["epoch"] == epoch for i in x["ids"])
        assert sorted(counts) == list(range(240)), f"epoch {epoch} missed samples"
        assert set(counts.values()) == {1}, f"epoch {epoch} read samples twice"


def committed_to(lines: list[dict[str, Any]], saves: list[int]) -> list[dict[str, Any]]:
    """The reads of each start up to the step its stop saved (the last start: all of them)."""
    kept = []
    for line in lines:
        start = sorted({x["resumed_from"] for x in lines}).index(line["resumed_from"])
        if start >= len(saves) or line["step"] <= saves[start]:
            kept.append(line)
    return kept
